/* pattern/match.c - the dataflow subgraph matcher behind `find`.
 *
 * A match maps every pattern node to a graph value so that use-def edges
 * correspond: a pattern op node maps to a graph node of the same op (or to
 * a call_module of a module whose op form is that op, or, for add/mul/sub
 * with a literal operand, to the scalar op holding that number), its inputs
 * map to that node's inputs in order (commutative ops: in either order), a
 * placeholder maps to one value wherever it is used, a literal to a `full`
 * constant of that value. The search starts at the pattern's first result,
 * tried at every graph node in graph order, and follows inputs backwards;
 * further results are anchored at any graph node. It backtracks fully: each
 * pending (pattern node, graph value) pair is a goal on a stack, and every
 * way of satisfying a goal is tried with the remaining goals, bindings
 * undone through a trail. So node order, interleaved unrelated nodes and
 * operand order never matter, and a diamond maps its shared node once.
 * Matches never overlap (a node taken by an accepted match is refused
 * later); a match whose inner value has a user outside it is kept but
 * marked not replaceable. Layer: pattern. */
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pattern/internal.h"

/* A graph value: a node, or a parameter of a leaf module (its op form). */
typedef struct gval {
  slapo_node *node;
  const slapo_parameter *param;
  const slapo_module *owner; /* the leaf that holds param */
  const char *leaf;          /* its call_module target    */
  const char *pname;         /* param's local name        */
} gval;

typedef struct goal {
  const slapo_node *t; /* pattern node */
  gval v;
  bool any;            /* anchor: any graph node */
} goal;

typedef struct trail_item {
  int pid;      /* pattern binding undone                       */
  int gid;      /* graph node marked (-1: none)                 */
  bool ph;      /* a placeholder's use of gid, else an op's map */
} trail_item;

typedef struct matcher {
  slapo_module *m;
  const slapo_pattern *p;
  slapo_node **gnodes; /* by id */
  int n_g, n_p;
  gval *bind;          /* [n_p] */
  bool *bound;         /* [n_p] */
  int *gmark;          /* [n_g]: pattern id of the op node mapped here, or -1 */
  int *gph;            /* [n_g]: placeholders bound to this node             */
  bool *taken;         /* [n_g]: in an accepted match                        */
  trail_item *trail;
  int n_trail, cap_trail;
  goal *goals;
  int cap_goals;
  regex_t *res;        /* [n_p] compiled module patterns */
  bool *has_re;
  char why[512];       /* the latest rejection (SLAPO_DEBUG >= 3)  */
  slapo_status status;
} matcher;

/* ---- bindings with undo ---- */

static bool push_trail(matcher *mt, int pid, int gid, bool ph) {
  if (mt->n_trail == mt->cap_trail) {
    int cap = mt->cap_trail ? 2 * mt->cap_trail : 64;
    trail_item *t = slapo_realloc(mt->trail, (size_t)cap * sizeof *t);
    if (!t) {
      mt->status = slapo_error(SLAPO_NOMEM, "find: out of memory");
      return false;
    }
    mt->trail = t, mt->cap_trail = cap;
  }
  mt->trail[mt->n_trail++] = (trail_item){pid, gid, ph};
  return true;
}

static void undo_to(matcher *mt, int mark) {
  while (mt->n_trail > mark) {
    trail_item it = mt->trail[--mt->n_trail];
    mt->bound[it.pid] = false;
    if (it.gid < 0) continue;
    if (it.ph) mt->gph[it.gid]--;
    else mt->gmark[it.gid] = -1;
  }
}

static bool bind_op(matcher *mt, const slapo_node *t, slapo_node *v) {
  if (!push_trail(mt, t->id, v->id, false)) return false;
  mt->bound[t->id] = true;
  mt->bind[t->id] = (gval){.node = v};
  mt->gmark[v->id] = t->id;
  return true;
}

static bool same_val(const gval *a, const gval *b) {
  return a->node ? a->node == b->node : !b->node && a->param == b->param;
}

/* Keeps the first reason a candidate failed for (the direct operand order
 * before the swapped one), for SLAPO_DEBUG=3. */
static bool reject(matcher *mt, const slapo_node *t, const gval *v, const char *why) {
  if (mt->why[0]) return false;
  snprintf(mt->why, sizeof mt->why, "pattern %%%s vs %s%s: %s", t->name, v->node ? "%" : "",
           v->node ? v->node->name : v->pname ? v->pname : "?", why);
  return false;
}

/* reject with a formatted reason, formatted only when it is the first: the
 * search fails at many nodes and keeps one reason a candidate. */
__attribute__((format(printf, 4, 5))) static bool rejectf(matcher *mt, const slapo_node *t,
                                                          slapo_node *v, const char *fmt, ...) {
  if (mt->why[0]) return false;
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return reject(mt, t, &(gval){.node = v}, why);
}

/* ---- attributes ---- */

/* Numbers compare at f32 precision: kernels compute in f32, and a value
 * printed with 9 significant digits (the graph printer) must match. */
static bool same_number(double x, double y) { return x == y || (float)x == (float)y; }

static bool attr_eq(const slapo_attr *a, const slapo_attr *b) {
  bool na = a->kind == SLAPO_ATTR_INT || a->kind == SLAPO_ATTR_FLOAT;
  bool nb = b->kind == SLAPO_ATTR_INT || b->kind == SLAPO_ATTR_FLOAT;
  if (na && nb) {
    double x = a->kind == SLAPO_ATTR_INT ? (double)a->i : a->f;
    double y = b->kind == SLAPO_ATTR_INT ? (double)b->i : b->f;
    return same_number(x, y);
  }
  if (a->kind != b->kind) return false;
  if (a->kind == SLAPO_ATTR_STR) return !strcmp(a->s, b->s);
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (a->ints[i] != b->ints[i]) return false;
  return true;
}

static void attr_text(const slapo_attr *a, char *buf, size_t cap) {
  switch (a->kind) {
  case SLAPO_ATTR_INT: snprintf(buf, cap, "%lld", (long long)a->i); break;
  case SLAPO_ATTR_FLOAT: snprintf(buf, cap, "%.9g", a->f); break;
  case SLAPO_ATTR_STR: snprintf(buf, cap, "%s", a->s); break;
  default: snprintf(buf, cap, "[%d ints]", a->n); break;
  }
}

/* Every attribute the pattern gives is present and equal in `have`. */
static const char *attrs_ok(const slapo_node *t, int n, const slapo_attr *have) {
  static _Thread_local char why[256];
  for (int i = 0; i < t->n_attrs; i++) {
    const slapo_attr *want = &t->attrs[i], *got = NULL;
    for (int j = 0; j < n && !got; j++)
      if (!strcmp(have[j].key, want->key)) got = &have[j];
    if (!got || !attr_eq(want, got)) {
      char w[64], g[64];
      attr_text(want, w, sizeof w);
      if (got) attr_text(got, g, sizeof g);
      snprintf(why, sizeof why, "attribute %s: the pattern wants %s, the node has %s", want->key,
               w, got ? g : "none");
      return why;
    }
  }
  return NULL;
}

/* ---- the goal stack ---- */

static bool solve(matcher *mt, int top);

static bool ensure_goals(matcher *mt, int n) {
  if (n <= mt->cap_goals) return true;
  int cap = mt->cap_goals ? 2 * mt->cap_goals : 64;
  while (cap < n) cap *= 2;
  goal *g = slapo_realloc(mt->goals, (size_t)cap * sizeof *g);
  if (!g) {
    mt->status = slapo_error(SLAPO_NOMEM, "find: out of memory");
    return false;
  }
  mt->goals = g, mt->cap_goals = cap;
  return true;
}

/* Tries: bind t -> v, then the goals (t->inputs[order[i]], ins[i]) and the
 * rest of the stack below `top`. Undoes everything on failure. */
static bool try_inputs(matcher *mt, int top, const slapo_node *t, slapo_node *v, int n,
                       const int *order, const gval *ins) {
  int mark = mt->n_trail;
  if (!bind_op(mt, t, v) || !ensure_goals(mt, top + n)) return false;
  for (int i = 0; i < n; i++) mt->goals[top + i] = (goal){t->inputs[order[n - 1 - i]], ins[n - 1 - i], false};
  if (solve(mt, top + n)) return true;
  undo_to(mt, mark);
  return false;
}

static gval node_val(slapo_node *n) { return (gval){.node = n}; }

/* t (an op node) vs a call_op node v of the same op, both operand orders
 * when the op is commutative. */
static bool try_same_op(matcher *mt, int top, const slapo_node *t, slapo_node *v) {
  if (v->n_inputs != t->n_inputs) return reject(mt, t, &(gval){.node = v}, "input count differs");
  const char *bad = attrs_ok(t, v->n_attrs, v->attrs);
  if (bad) return reject(mt, t, &(gval){.node = v}, bad);
  gval ins[16];
  int order[16];
  if (t->n_inputs > 16) return false;
  for (int i = 0; i < t->n_inputs; i++) ins[i] = node_val(v->inputs[i]), order[i] = i;
  if (try_inputs(mt, top, t, v, t->n_inputs, order, ins)) return true;
  if (!(t->op->commutative && t->n_inputs == 2)) return false;
  int swapped[2] = {1, 0};
  return try_inputs(mt, top, t, v, 2, swapped, ins);
}

/* add(y, 1) / add(1, y) / mul / sub(y, 1) against add_scalar / mul_scalar
 * holding that number. */
static bool try_scalar_form(matcher *mt, int top, const slapo_node *t, slapo_node *v) {
  bool add = t->op == SLAPO_OP_DESC(add) || t->op == SLAPO_OP_DESC(sub);
  if (t->n_inputs != 2 || !(add ? v->op == SLAPO_OP_DESC(add_scalar) : t->op == SLAPO_OP_DESC(mul) && v->op == SLAPO_OP_DESC(mul_scalar)))
    return false;
  double have = slapo_node_attr_float(v, "value", 0), lit;
  for (int k = 0; k < 2; k++) {
    if (t->op == SLAPO_OP_DESC(sub) && k == 0) continue; /* only sub(y, literal) */
    if (!slapo__pattern_is_literal(t->inputs[k], &lit)) continue;
    if (!same_number(t->op == SLAPO_OP_DESC(sub) ? -lit : lit, have)) continue;
    int order[1] = {1 - k};
    gval in = node_val(v->inputs[0]);
    if (try_inputs(mt, top, t, v, 1, order, &in)) return true;
  }
  return false;
}

static const slapo_module *leaf_of(matcher *mt, const slapo_node *v) {
  slapo_module *c = NULL;
  return slapo_module_at(mt->m, v->target, &c) == SLAPO_OK ? c : NULL;
}

/* t (an op node) vs a call_module v whose module's op form is t's op. */
static bool try_module_form(matcher *mt, int top, const slapo_node *t, slapo_node *v) {
  const slapo_module *leaf = leaf_of(mt, v);
  slapo_op_form f;
  bool has_form = leaf && leaf->type->op_form && leaf->type->op_form(leaf, &f);
  if (!has_form || f.op != t->op)
    return rejectf(mt, t, v, "module %s (%s) %s%s, the pattern wants %s", v->target,
                   leaf ? leaf->type->name : "?", has_form ? "stands for op " : "has no op form",
                   has_form ? f.op->name : "", t->op->name);
  if (f.n_inputs != t->n_inputs)
    return reject(mt, t, &(gval){.node = v}, "the module form has another input count");
  const char *bad = attrs_ok(t, f.n_attrs, f.attrs);
  if (bad) return reject(mt, t, &(gval){.node = v}, bad);
  gval ins[4];
  int order[4];
  for (int i = 0; i < f.n_inputs; i++) {
    order[i] = i;
    const char *src = f.inputs[i];
    if (src[0] == '$') {
      int k = src[1] - '0';
      if (k < 0 || k >= v->n_inputs) return false;
      ins[i] = node_val(v->inputs[k]);
    } else {
      ins[i] = (gval){.param = slapo_module_param(leaf, src), .owner = leaf, .leaf = v->target,
                      .pname = src};
      if (!ins[i].param) return false;
    }
  }
  if (try_inputs(mt, top, t, v, f.n_inputs, order, ins)) return true;
  if (!(t->op->commutative && f.n_inputs == 2)) return false;
  int swapped[2] = {1, 0};
  return try_inputs(mt, top, t, v, 2, swapped, ins);
}

static bool re_full(const regex_t *re, const char *s) {
  regmatch_t m;
  return regexec(re, s, 1, &m, 0) == 0 && m.rm_so == 0 && s[m.rm_eo] == '\0';
}

static bool target_matches(const regex_t *re, const char *target) {
  const char *dot = strrchr(target, '.');
  return re_full(re, target) || (dot && re_full(re, dot + 1));
}

static bool try_module_pattern(matcher *mt, int top, const slapo_node *t, slapo_node *v) {
  if (v->kind != SLAPO_NODE_CALL_MODULE) return false;
  if (!target_matches(&mt->res[t->id], v->target))
    return reject(mt, t, &(gval){.node = v}, "the module path does not match");
  if (slapo_pattern_any_inputs(mt->p, t)) return try_inputs(mt, top, t, v, 0, NULL, NULL);
  if (v->n_inputs != t->n_inputs || t->n_inputs > 16)
    return reject(mt, t, &(gval){.node = v}, "input count differs");
  gval ins[16];
  int order[16];
  for (int i = 0; i < t->n_inputs; i++) ins[i] = node_val(v->inputs[i]), order[i] = i;
  return try_inputs(mt, top, t, v, t->n_inputs, order, ins);
}

/* Pattern op or module node t vs graph node v. */
static bool try_node(matcher *mt, int top, const slapo_node *t, slapo_node *v) {
  if (mt->gmark[v->id] >= 0 || mt->taken[v->id] || mt->gph[v->id] > 0)
    return reject(mt, t, &(gval){.node = v}, mt->taken[v->id] ? "in an earlier match"
                                                              : "already matched");
  if (t->kind == SLAPO_NODE_CALL_MODULE) return try_module_pattern(mt, top, t, v);
  if (v->kind == SLAPO_NODE_CALL_OP) {
    if (v->op == t->op && try_same_op(mt, top, t, v)) return true;
    if (try_scalar_form(mt, top, t, v)) return true;
    if (v->op == t->op) return false; /* try_same_op said why */
    return rejectf(mt, t, v, "op %s, the pattern wants %s", v->op->name, t->op->name);
  }
  if (v->kind == SLAPO_NODE_CALL_MODULE) return try_module_form(mt, top, t, v);
  return reject(mt, t, &(gval){.node = v}, "not an op or module call");
}

static bool solve_placeholder(matcher *mt, int top, const slapo_node *t, const gval *v) {
  if (mt->bound[t->id]) {
    if (same_val(&mt->bind[t->id], v)) return solve(mt, top);
    return reject(mt, t, v, "the wildcard is bound to another value");
  }
  if (v->node && mt->gmark[v->node->id] >= 0)
    return reject(mt, t, v, "a wildcard cannot stand for a node inside the match");
  int mark = mt->n_trail;
  if (!push_trail(mt, t->id, v->node ? v->node->id : -1, true)) return false;
  mt->bound[t->id] = true;
  mt->bind[t->id] = *v;
  if (v->node) mt->gph[v->node->id]++;
  if (solve(mt, top)) return true;
  undo_to(mt, mark);
  return false;
}

static bool solve_literal(matcher *mt, int top, const slapo_node *t, const gval *v) {
  double lit;
  slapo__pattern_is_literal(t, &lit);
  if (!v->node || v->node->op != SLAPO_OP_DESC(full) ||
      !same_number(slapo_node_attr_float(v->node, "value", lit + 1), lit))
    return reject(mt, t, v, "not a constant of that value");
  if (mt->gmark[v->node->id] >= 0 && mt->gmark[v->node->id] != t->id)
    return reject(mt, t, v, "already matched");
  if (mt->gmark[v->node->id] == t->id) return solve(mt, top);
  /* The constant belongs to the match (a replacement takes it along). */
  int mark = mt->n_trail;
  if (!bind_op(mt, t, v->node)) return false;
  if (solve(mt, top)) return true;
  undo_to(mt, mark);
  return false;
}

static bool solve(matcher *mt, int top) {
  if (mt->status != SLAPO_OK) return false;
  if (top == 0) return true;
  goal g = mt->goals[top - 1];
  const slapo_node *t = g.t;
  if (g.any) {
    if (mt->bound[t->id]) return solve(mt, top - 1);
    for (int i = 0; i < mt->n_g; i++)
      if (mt->gnodes[i] && try_node(mt, top - 1, t, mt->gnodes[i])) return true;
    return false;
  }
  if (t->kind == SLAPO_NODE_PLACEHOLDER) return solve_placeholder(mt, top - 1, t, &g.v);
  if (slapo__pattern_is_literal(t, NULL)) return solve_literal(mt, top - 1, t, &g.v);
  if (mt->bound[t->id]) {
    if (same_val(&mt->bind[t->id], &g.v)) return solve(mt, top - 1);
    return reject(mt, t, &g.v, "the pattern node is matched to another node already");
  }
  if (!g.v.node) return reject(mt, t, &g.v, "a parameter cannot match an op");
  return try_node(mt, top - 1, t, g.v.node);
}

/* ---- results ---- */

typedef struct match_store {
  slapo_arena *arena;
  slapo_match *items;
  int n, cap;
} match_store;

static void *arena_dup(slapo_arena *a, const void *src, size_t n) {
  void *d = slapo_arena_alloc(a, n ? n : 1, 16);
  if (d && n) memcpy(d, src, n);
  return d;
}

static slapo_match_value value_of(const gval *v) {
  slapo_match_value r = {.node = v->node};
  if (v->node) {
    r.dtype = v->node->dtype, r.ndim = v->node->ndim;
    memcpy(r.shape, v->node->shape, sizeof r.shape);
  } else if (v->param) {
    const slapo_tensor *x = v->param->value;
    r.dtype = x->dtype, r.ndim = x->ndim;
    memcpy(r.shape, x->shape, sizeof r.shape);
  }
  return r;
}

/* The first outside user of an inner matched node, as text, or NULL. */
static const char *outside_use(matcher *mt, slapo_arena *a, const bool *is_out) {
  for (int i = 0; i < mt->n_g; i++) {
    slapo_node *n = mt->gnodes[i];
    if (!n || mt->gmark[i] < 0 || is_out[i]) continue;
    for (int u = 0; u < n->n_users; u++)
      if (mt->gmark[n->users[u]->id] < 0) {
        char buf[512];
        snprintf(buf, sizeof buf, "%%%s is also used by %%%s outside the match", n->name,
                 n->users[u]->name);
        return arena_dup(a, buf, strlen(buf) + 1);
      }
  }
  return NULL;
}

static slapo_status record(matcher *mt, match_store *st) {
  if (st->n == st->cap) {
    int cap = st->cap ? 2 * st->cap : 8;
    slapo_match *m = slapo_realloc(st->items, (size_t)cap * sizeof *m);
    if (!m) return slapo_error(SLAPO_NOMEM, "find: out of memory");
    st->items = m, st->cap = cap;
  }
  slapo_arena *a = st->arena;
  slapo_match *m = &st->items[st->n];
  memset(m, 0, sizeof *m);
  int k = 0;
  for (int i = 0; i < mt->n_g; i++) k += mt->gmark[i] >= 0;
  bool *is_out = slapo_arena_alloc(a, (size_t)mt->n_g + 1, 16);
  m->nodes = slapo_arena_alloc(a, sizeof *m->nodes * (size_t)(k + 1), 16);
  m->paths = slapo_arena_alloc(a, sizeof *m->paths * (size_t)(k + 1), 16);
  m->outputs = slapo_arena_alloc(a, sizeof *m->outputs * (size_t)mt->p->n_outputs, 16);
  int n_extra = 0;
  for (int i = 0; i < mt->p->n_any; i++)
    if (mt->bound[mt->p->any[i]->id]) n_extra += mt->bind[mt->p->any[i]->id].node->n_inputs;
  m->inputs = slapo_arena_alloc(a, sizeof *m->inputs * (size_t)(mt->p->n_inputs + n_extra + 1), 16);
  if (!is_out || !m->nodes || !m->paths || !m->outputs || !m->inputs)
    return slapo_error(SLAPO_NOMEM, "find: out of memory");
  memset(is_out, 0, (size_t)mt->n_g + 1);
  for (int i = 0; i < mt->p->n_outputs; i++) {
    m->outputs[i] = mt->bind[mt->p->outputs[i]->id].node;
    is_out[m->outputs[i]->id] = true;
  }
  m->n_outputs = mt->p->n_outputs;
  for (int i = 0; i < mt->n_g; i++) {
    if (mt->gmark[i] < 0) continue;
    slapo_node *n = mt->gnodes[i];
    m->nodes[m->n_nodes] = n;
    m->paths[m->n_nodes++] = n->kind == SLAPO_NODE_CALL_MODULE ? n->target : n->origin;
  }
  for (int i = 0; i < mt->p->n_inputs; i++)
    m->inputs[m->n_inputs++] = value_of(&mt->bind[mt->p->inputs[i]->id]);
  for (int i = 0; i < mt->p->n_any; i++) {
    if (!mt->bound[mt->p->any[i]->id]) continue;
    slapo_node *c = mt->bind[mt->p->any[i]->id].node;
    for (int j = 0; j < c->n_inputs; j++) m->inputs[m->n_inputs++] = value_of(&(gval){.node = c->inputs[j]});
  }
  for (int i = 0; i < mt->p->n_inputs; i++) {
    const gval *v = &mt->bind[mt->p->inputs[i]->id];
    if (v->node) continue;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s.%s", v->leaf, v->pname);
    if (!(m->inputs[i].param = arena_dup(a, buf, strlen(buf) + 1)))
      return slapo_error(SLAPO_NOMEM, "find: out of memory");
  }
  m->why = outside_use(mt, a, is_out);
  m->replaceable = !m->why;
  for (int i = 0; i < mt->n_g; i++)
    if (mt->gmark[i] >= 0) mt->taken[i] = true;
  st->n++;
  return SLAPO_OK;
}

/* ---- set-up ---- */

static void matcher_free(matcher *mt) {
  for (int i = 0; i < mt->n_p; i++)
    if (mt->has_re && mt->has_re[i]) regfree(&mt->res[i]);
  slapo_free(mt->gnodes);
  slapo_free(mt->bind);
  slapo_free(mt->bound);
  slapo_free(mt->gmark);
  slapo_free(mt->gph);
  slapo_free(mt->taken);
  slapo_free(mt->trail);
  slapo_free(mt->goals);
  slapo_free(mt->res);
  slapo_free(mt->has_re);
}

static slapo_status matcher_init(matcher *mt, slapo_module *m, const slapo_pattern *p,
                                 slapo_graph *g) {
  memset(mt, 0, sizeof *mt);
  mt->m = m, mt->p = p;
  slapo_graph_renumber(g);
  mt->n_g = slapo_graph_count(g);
  mt->n_p = slapo_graph_count(p->g);
  size_t ng = (size_t)mt->n_g + 1, np = (size_t)mt->n_p + 1;
  mt->gnodes = slapo_calloc(ng, sizeof *mt->gnodes);
  mt->bind = slapo_calloc(np, sizeof *mt->bind);
  mt->bound = slapo_calloc(np, sizeof *mt->bound);
  mt->gmark = slapo_calloc(ng, sizeof *mt->gmark);
  mt->gph = slapo_calloc(ng, sizeof *mt->gph);
  mt->taken = slapo_calloc(ng, sizeof *mt->taken);
  mt->res = slapo_calloc(np, sizeof *mt->res);
  mt->has_re = slapo_calloc(np, sizeof *mt->has_re);
  if (!mt->gnodes || !mt->bind || !mt->bound || !mt->gmark || !mt->gph || !mt->taken ||
      !mt->res || !mt->has_re)
    return slapo_error(SLAPO_NOMEM, "find: out of memory");
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    mt->gnodes[n->id] = n->kind == SLAPO_NODE_CALL_OP || n->kind == SLAPO_NODE_CALL_MODULE ? n : NULL;
    mt->gmark[n->id] = -1;
  }
  for (slapo_node *t = slapo_graph_first(p->g); t; t = t->next) {
    if (t->kind != SLAPO_NODE_CALL_MODULE) continue;
    SLAPO_TRY(slapo__regex_compile(t->target, &mt->res[t->id], "find: module pattern"));
    mt->has_re[t->id] = true;
  }
  return SLAPO_OK;
}

static slapo_status traced_graph(slapo_module *m, slapo_graph **g) {
  *g = slapo_module_graph(m);
  if (*g) return SLAPO_OK;
  char *path = slapo_module_path(m), *by = NULL;
  const slapo_module *owner = slapo_module_inlined_by(m);
  const char *p = path && path[0] ? path : ".";
  slapo_status s;
  if (owner && (by = slapo_module_path(owner)))
    s = slapo_error(SLAPO_PRECOND, "find: %s is inlined into the flattened trace of %s; find in "
                    "%s, whose graph holds its ops", p, by[0] ? by : ".", by[0] ? by : ".");
  else s = slapo_error(SLAPO_PRECOND, "find: %s is not traced; trace it first (%s trace)", p, p);
  slapo_free(by);
  slapo_free(path);
  return s;
}

static slapo_status store_init(match_store *st) {
  memset(st, 0, sizeof *st);
  return slapo_arena_new(4096, &st->arena);
}

static void store_out(match_store *st, slapo_matches *out) {
  out->n = st->n;
  out->items = st->items;
  out->impl = st->arena;
}

void slapo_matches_deinit(slapo_matches *m) {
  if (!m) return;
  slapo_free(m->items);
  slapo_arena_free(m->impl);
  memset(m, 0, sizeof *m);
}

/* Whether v is the pattern's root op t (as an op, or as a module whose op
 * form it is), so that a failed search from it is a near miss worth a
 * SLAPO_DEBUG=3 line; other candidates fail at once and would only be
 * noise. */
static bool could_be_root(matcher *mt, const slapo_node *v, const slapo_node *t) {
  if (t->kind == SLAPO_NODE_CALL_MODULE) return v->kind == SLAPO_NODE_CALL_MODULE;
  if (v->kind == SLAPO_NODE_CALL_OP) return v->op == t->op;
  const slapo_module *leaf = v->kind == SLAPO_NODE_CALL_MODULE ? leaf_of(mt, v) : NULL;
  slapo_op_form f;
  return leaf && leaf->type->op_form && leaf->type->op_form(leaf, &f) && f.op == t->op;
}

/* One search from anchor v for the pattern's first result. */
static slapo_status search_at(matcher *mt, slapo_node *v, match_store *st) {
  const slapo_pattern *p = mt->p;
  if (!ensure_goals(mt, p->n_outputs)) return mt->status;
  for (int i = 1; i < p->n_outputs; i++)
    mt->goals[p->n_outputs - 1 - i] = (goal){.t = p->outputs[i], .any = true};
  mt->n_trail = 0;
  mt->why[0] = '\0';
  int top = p->n_outputs - 1;
  bool ok = try_node(mt, top, p->outputs[0], v);
  if (mt->status != SLAPO_OK) return mt->status;
  if (!ok) {
    if (mt->why[0] && could_be_root(mt, v, p->outputs[0]))
      slapo_logf(3, "find: candidate %%%s rejected: %s", v->name, mt->why);
    return SLAPO_OK;
  }
  slapo_status s = record(mt, st);
  undo_to(mt, 0);
  return s;
}

slapo_status slapo_find(slapo_module *m, const slapo_pattern *p, slapo_matches *out) {
  memset(out, 0, sizeof *out);
  slapo_graph *g;
  SLAPO_TRY(traced_graph(m, &g));
  return slapo_find_in(m, g, p, out);
}

slapo_status slapo_find_in(slapo_module *m, slapo_graph *g, const slapo_pattern *p,
                           slapo_matches *out) {
  memset(out, 0, sizeof *out);
  /* Zeroed here, not only in matcher_init: matcher_free below also runs
   * when store_init failed before matcher_init. */
  matcher mt = {0};
  match_store st;
  slapo_status s = store_init(&st);
  if (s == SLAPO_OK) s = matcher_init(&mt, m, p, g);
  for (int i = 0; s == SLAPO_OK && i < mt.n_g; i++)
    if (mt.gnodes[i] && !mt.taken[i]) s = search_at(&mt, mt.gnodes[i], &st);
  matcher_free(&mt);
  if (s != SLAPO_OK) {
    slapo_free(st.items);
    slapo_arena_free(st.arena);
    return s;
  }
  store_out(&st, out);
  slapo_logf(3, "find: %d match(es) of '%s'", out->n, p->name);
  return SLAPO_OK;
}

slapo_status slapo_find_regex(slapo_module *m, const char *regex, slapo_matches *out) {
  memset(out, 0, sizeof *out);
  slapo_graph *g;
  SLAPO_TRY(traced_graph(m, &g));
  regex_t re;
  SLAPO_TRY(slapo__regex_compile(regex, &re, "find: regex"));
  match_store st;
  slapo_status s = store_init(&st);
  for (slapo_node *n = slapo_graph_first(g); s == SLAPO_OK && n; n = n->next) {
    if (n->kind != SLAPO_NODE_CALL_MODULE || !target_matches(&re, n->target)) continue;
    if (st.n == st.cap) {
      int cap = st.cap ? 2 * st.cap : 8;
      slapo_match *it = slapo_realloc(st.items, (size_t)cap * sizeof *it);
      if (!it) {
        s = slapo_error(SLAPO_NOMEM, "find: out of memory");
        break;
      }
      st.items = it, st.cap = cap;
    }
    slapo_match *mm = &st.items[st.n++];
    memset(mm, 0, sizeof *mm);
    mm->n_nodes = 1, mm->n_outputs = 1, mm->replaceable = true;
    mm->nodes = arena_dup(st.arena, &n, sizeof n);
    mm->outputs = mm->nodes;
    mm->paths = arena_dup(st.arena, &n->target, sizeof n->target);
    mm->inputs = slapo_arena_alloc(st.arena, sizeof *mm->inputs * (size_t)(n->n_inputs + 1), 16);
    if (!mm->nodes || !mm->paths || !mm->inputs) {
      s = slapo_error(SLAPO_NOMEM, "find: out of memory");
      break;
    }
    for (int i = 0; i < n->n_inputs; i++) mm->inputs[mm->n_inputs++] = value_of(&(gval){.node = n->inputs[i]});
  }
  regfree(&re);
  if (s != SLAPO_OK) {
    slapo_free(st.items);
    slapo_arena_free(st.arena);
    return s;
  }
  store_out(&st, out);
  return SLAPO_OK;
}

void slapo_matches_print(const slapo_matches *m, const slapo_pattern *p, FILE *f) {
  for (int i = 0; i < m->n; i++) {
    const slapo_match *x = &m->items[i];
    fprintf(f, "match %d:", i + 1);
    for (int j = 0; j < x->n_nodes; j++)
      fprintf(f, "%s %%%s (%s)", j ? "," : "", x->nodes[j]->name,
              x->paths[j] && x->paths[j][0] ? x->paths[j] : ".");
    fputs("\n  inputs:", f);
    for (int j = 0; j < x->n_inputs; j++) {
      const slapo_match_value *v = &x->inputs[j];
      char sh[96];
      const char *name = p && j < slapo_pattern_n_inputs(p) ? slapo_pattern_input_name(p, j) : NULL;
      fprintf(f, "%s %s%s%s%s %s%s", j ? "," : "", name ? name : "", name ? "=" : "",
              v->node ? "%" : "", v->node ? v->node->name : v->param, slapo_dtype_name(v->dtype),
              slapo_shape_str(v->ndim, v->shape, sh, sizeof sh));
    }
    if (!x->n_inputs) fputs(" (none)", f);
    fputc('\n', f);
    if (!x->replaceable) fprintf(f, "  not replaceable: %s\n", x->why);
  }
}
