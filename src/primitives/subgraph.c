/* primitives/subgraph.c - the subgraph forms of `replace` and `checkpoint`
 * and `find` on a schedule node: edits of a traced module's graph, kept as
 * replayable edit records (the pattern and what was decided: the children
 * made, the op function), so a re-trace at new shapes re-finds the pattern
 * and redoes the edit. Layer: primitives.
 *
 * replace, vertical   each match becomes one call of a new module (or the
 *                     ops of an op function); horizontal: all matches, which
 *                     must bind the same input nodes, become one call. A
 *                     match with several results (a pattern `(p, q)`), and
 *                     the matches of a horizontal replacement, are given
 *                     either a tuple with one value per result (read back
 *                     with getitem nodes of a multi-result call: the
 *                     original system's way) or one value holding them
 *                     concatenated along the last axis (split back with
 *                     slices). The new node's inputs are the input nodes bound
 *                     to the pattern's placeholders, in the pattern's order;
 *                     placeholders bound to a leaf's parameters are not
 *                     inputs (the factory ties those parameters).
 * checkpoint          each match becomes its own recompute region. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

/* ---- registry of subgraph factories ---- */

typedef struct sub_factory {
  const char *name, *summary;
  slapo_subgraph_factory f;
} sub_factory;

static sub_factory *g_facs; /* grows; registrations live until exit */
static int g_n_facs, g_cap_facs;

slapo_status slapo_subgraph_register(const char *name, const char *summary,
                                     slapo_subgraph_factory f) {
  for (int i = 0; i < g_n_facs; i++)
    if (!strcmp(g_facs[i].name, name))
      return g_facs[i].f == f ? SLAPO_OK
                              : slapo_error(SLAPO_INVALID_ARG,
                                            "a subgraph module named '%s' is already registered",
                                            name);
  if (g_n_facs == g_cap_facs) {
    int cap = g_cap_facs ? 2 * g_cap_facs : 8;
    sub_factory *f2 = slapo_realloc(g_facs, (size_t)cap * sizeof *f2);
    if (!f2) return slapo_error(SLAPO_NOMEM, "subgraph registry: out of memory");
    g_facs = f2, g_cap_facs = cap;
  }
  g_facs[g_n_facs++] = (sub_factory){name, summary, f};
  return SLAPO_OK;
}

slapo_subgraph_factory slapo_subgraph_factory_find(const char *name) {
  for (int i = 0; i < g_n_facs; i++)
    if (!strcmp(g_facs[i].name, name)) return g_facs[i].f;
  return NULL;
}

int slapo_subgraph_registered_count(void) { return g_n_facs; }
const char *slapo_subgraph_registered_name(int i) {
  return i >= 0 && i < g_n_facs ? g_facs[i].name : NULL;
}
const char *slapo_subgraph_registered_summary(int i) {
  return i >= 0 && i < g_n_facs ? g_facs[i].summary : NULL;
}

/* ---- edit records ---- */

typedef struct sub_edit {
  slapo_pattern *p; /* owned clone */
  bool horizontal, checkpoint;
  bool escaping_results; /* fuse: inner values used outside are results */
  bool exactly_one;   /* fuse without all: one replaceable match or error */
  bool regions;       /* fuse_all: maximal elementwise regions, no pattern */
  bool (*ends)(const slapo_op *op); /* ... which may end in such an op  */
  int n_skip;         /* matches the factory declined (unsupported), by   */
  unsigned char *skip; /*   index; replays skip them too                */
  int n_children;
  char **children;  /* module form: child per match (vertical) or one */
  slapo_pattern_fn fn;
  void *fn_ud;
  int fn_inputs;
  char path[512];   /* of the traced module, for messages */
} sub_edit;

static void edit_free(void *ud) {
  sub_edit *e = ud;
  if (!e) return;
  slapo_free(e->skip);
  slapo_pattern_free(e->p);
  for (int i = 0; i < e->n_children; i++) slapo_free(e->children[i]);
  slapo_free(e->children);
  slapo_free(e);
}

/* ---- checks shared by the primitive and the edit ---- */

static const char *label(const sub_edit *e) {
  return e->p ? slapo_pattern_name(e->p) : "elementwise regions";
}

static slapo_status find_for(const sub_edit *e, slapo_module *m, slapo_graph *g,
                             slapo_matches *ms) {
  return e->regions ? slapo_find_elementwise(m, g, e->ends, ms) : slapo_find_in(m, g, e->p, ms);
}

/* Drops the matches the factory declined when the edit was first made. */
static void drop_skipped(const sub_edit *e, slapo_matches *ms) {
  if (!e->skip) return;
  int k = 0;
  for (int i = 0; i < ms->n; i++)
    if (i >= e->n_skip || !e->skip[i]) ms->items[k++] = ms->items[i];
  ms->n = k;
}

static bool in_match(const slapo_match *x, const slapo_node *n) {
  for (int j = 0; j < x->n_nodes; j++)
    if (x->nodes[j] == n) return true;
  return false;
}

/* fuse: a match whose inner values are also read outside it is a region
 * with several outputs: those values become results after the pattern's
 * (graph order), so the fused module returns them all (a tuple) instead of
 * being refused. The widened result lists live in *buf (one block, owned:
 * slapo_free after the matches are done with; NULL when none). */
static slapo_status widen(const sub_edit *e, slapo_matches *ms, slapo_node ***buf) {
  *buf = NULL;
  if (!e->escaping_results) return SLAPO_OK;
  size_t total = 0;
  for (int i = 0; i < ms->n; i++)
    if (!ms->items[i].replaceable)
      total += (size_t)(ms->items[i].n_outputs + ms->items[i].n_nodes);
  if (!total) return SLAPO_OK;
  slapo_node **outs = *buf = slapo_calloc(total, sizeof *outs);
  if (!outs) return slapo_error(SLAPO_NOMEM, "subgraph: out of memory");
  for (int i = 0; i < ms->n; i++) {
    slapo_match *x = &ms->items[i];
    if (x->replaceable) continue;
    int k = 0, room = x->n_outputs + x->n_nodes;
    for (int o = 0; o < x->n_outputs; o++) outs[k++] = x->outputs[o];
    for (int j = 0; j < x->n_nodes; j++) {
      slapo_node *v = x->nodes[j];
      bool out = false, escapes = false;
      for (int o = 0; o < x->n_outputs; o++) out |= x->outputs[o] == v;
      for (int u = 0; u < v->n_users && !out; u++) escapes |= !in_match(x, v->users[u]);
      if (escapes) outs[k++] = v;
    }
    x->outputs = outs, x->n_outputs = k;
    x->replaceable = true, x->why = NULL;
    outs += room;
  }
  return SLAPO_OK;
}

static int node_inputs(const slapo_match *x, slapo_node **out) {
  int n = 0;
  for (int i = 0; i < x->n_inputs && n < 16; i++)
    if (x->inputs[i].node) out[n++] = x->inputs[i].node;
  return n;
}

static slapo_status check_matches(const sub_edit *e, const char *what, const slapo_matches *ms) {
  if (ms->n == 0)
    return e->p ? slapo_error(SLAPO_NO_MATCH, "%s: %s: pattern '%s' matches nothing in the "
                              "traced graph (list candidates with slapo find; SLAPO_DEBUG=3 "
                              "says why they fail)", what, e->path, label(e))
                : slapo_error(SLAPO_NO_MATCH, "%s: %s: the traced graph has no elementwise "
                              "region of two ops or more (trace with flatten=true to expose "
                              "the children's ops)", what, e->path);
  if (e->exactly_one && ms->n > 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s: pattern '%s' matches %d times; %s one "
                       "needs exactly one match (narrow the pattern, or all=true for each)",
                       what, e->path, label(e), ms->n, what);
  for (int i = 0; i < ms->n && !e->checkpoint; i++)
    if (!ms->items[i].replaceable)
      return slapo_error(SLAPO_STATE, "%s: %s: match %d of '%s' is not replaceable: %s", what,
                         e->path, i + 1, label(e), ms->items[i].why);
  if (!e->horizontal) return SLAPO_OK;
  slapo_node *a[16], *b[16];
  int na = node_inputs(&ms->items[0], a);
  for (int i = 1; i < ms->n; i++) {
    int nb = node_inputs(&ms->items[i], b);
    for (int k = 0; k < (na > nb ? na : nb); k++)
      if (na != nb || a[k] != b[k])
        return slapo_error(SLAPO_INVALID_ARG, "%s: %s: horizontal replacement needs matches "
                           "that share their inputs; match %d's input %d is %%%s, match 1's "
                           "is %%%s", what, e->path, i + 1, k + 1,
                           k < nb ? b[k]->name : "(none)", k < na ? a[k]->name : "(none)");
  }
  return SLAPO_OK;
}

/* Where a node replacing matches [first, first + n) goes: after its latest
 * input (else before the earliest matched node). Every user of a result
 * must come later, or the graph would read a value before it exists. */
static slapo_status placement(const sub_edit *e, const slapo_match *ms, int n,
                              slapo_node *const *ins, int n_ins, slapo_node **after,
                              slapo_node **before) {
  *after = *before = NULL;
  for (int i = 0; i < n_ins; i++)
    if (!*after || ins[i]->id > (*after)->id) *after = ins[i];
  for (int k = 0; k < n; k++)
    for (int j = 0; j < ms[k].n_nodes; j++)
      if (!*before || ms[k].nodes[j]->id < (*before)->id) *before = ms[k].nodes[j];
  if (!*after) return SLAPO_OK;
  *before = NULL;
  for (int k = 0; k < n; k++)
    for (int o = 0; o < ms[k].n_outputs; o++) {
      const slapo_node *out = ms[k].outputs[o];
      for (int u = 0; u < out->n_users; u++)
        if (out->users[u]->id <= (*after)->id)
          return slapo_error(SLAPO_STATE, "replace: %s: %%%s uses the result %%%s before the "
                             "replacement's input %%%s is computed", e->path,
                             out->users[u]->name, out->name, (*after)->name);
    }
  return SLAPO_OK;
}

/* The results the new node stands for, concatenated along the last axis:
 * their total size there, or -1 when their other dims differ. */
static int64_t joined_last(const slapo_match *ms, int n, int *n_out) {
  int64_t total = 0;
  const slapo_node *ref = ms[0].outputs[0];
  *n_out = 0;
  for (int k = 0; k < n; k++)
    for (int o = 0; o < ms[k].n_outputs; o++) {
      const slapo_node *x = ms[k].outputs[o];
      if (x->ndim != ref->ndim || x->ndim == 0) return -1;
      for (int d = 0; d + 1 < x->ndim; d++)
        if (x->shape[d] != ref->shape[d]) return -1;
      total += x->shape[x->ndim - 1];
      (*n_out)++;
    }
  return total;
}

static slapo_status check_meta(const sub_edit *e, const slapo_match *ms, int n, slapo_dtype dt,
                               int ndim, const int64_t *shape) {
  int n_out;
  const slapo_node *ref = ms[0].outputs[0];
  int64_t last = joined_last(ms, n, &n_out);
  bool ok = dt == ref->dtype && ndim == ref->ndim &&
            (n_out == 1 ? slapo_shape_equal(ndim, shape, ref->ndim, ref->shape)
                        : last > 0 && ndim > 0 && shape[ndim - 1] == last);
  for (int d = 0; ok && n_out > 1 && d + 1 < ndim; d++) ok = shape[d] == ref->shape[d];
  if (ok) return SLAPO_OK;
  char a[96], b[96];
  return slapo_error(SLAPO_SHAPE, "replace: %s: the replacement returns %s%s where the match%s "
                     "give%s %s%s%s", e->path, slapo_dtype_name(dt),
                     slapo_shape_str(ndim, shape, a, sizeof a), n_out > 1 ? "es" : "",
                     n_out > 1 ? "" : "s", slapo_dtype_name(ref->dtype),
                     slapo_shape_str(ref->ndim, ref->shape, b, sizeof b),
                     n_out > 1 ? " (joined along the last axis)" : "");
}

/* The matches' results in order (each match's, match after match). */
static int results_of(const slapo_match *ms, int n, slapo_node **out) {
  int k = 0;
  for (int i = 0; i < n; i++)
    for (int o = 0; o < ms[i].n_outputs && k < SLAPO_MAX_RESULTS; o++) out[k++] = ms[i].outputs[o];
  return k;
}

/* What the replacement returns against what the matches give: one value
 * (n_res 0: the result, or the results joined along the last axis), or a
 * tuple with one value per result, each of the result's dtype and shape. */
static slapo_status check_results(const sub_edit *e, const slapo_match *ms, int n,
                                  const slapo_value_meta *res, int n_res) {
  int total = 0;
  for (int i = 0; i < n; i++) total += ms[i].n_outputs;
  if (total > SLAPO_MAX_RESULTS)
    return slapo_error(SLAPO_LIMIT, "replace: %s: the match%s give%s %d results; a replacement "
                       "stands for at most %d", e->path, n > 1 ? "es" : "", n > 1 ? "" : "s",
                       total, SLAPO_MAX_RESULTS);
  if (n_res == 0) return check_meta(e, ms, n, res[0].dtype, res[0].ndim, res[0].shape);
  slapo_node *outs[SLAPO_MAX_RESULTS];
  int n_out = results_of(ms, n, outs);
  if (n_res != n_out)
    return slapo_error(SLAPO_SHAPE, "replace: %s: the replacement returns a tuple of %d values "
                       "where the match%s give%s %d result%s", e->path, n_res,
                       n > 1 ? "es" : "", n > 1 ? "" : "s", n_out, n_out == 1 ? "" : "s");
  for (int i = 0; i < n_res; i++) {
    const slapo_node *r = outs[i];
    if (res[i].dtype == r->dtype && slapo_shape_equal(res[i].ndim, res[i].shape, r->ndim, r->shape))
      continue;
    char a[96], b[96];
    return slapo_error(SLAPO_SHAPE, "replace: %s: value %d of the replacement's tuple is %s%s "
                       "where result %d (%%%s) is %s%s", e->path, i, slapo_dtype_name(res[i].dtype),
                       slapo_shape_str(res[i].ndim, res[i].shape, a, sizeof a), i, r->name,
                       slapo_dtype_name(r->dtype), slapo_shape_str(r->ndim, r->shape, b, sizeof b));
  }
  return SLAPO_OK;
}

/* The value standing for each result, into repl [SLAPO_MAX_RESULTS]:
 * y's values one per result (a tuple: getitem nodes of a module call, the
 * values of an op function's tuple), slices of y (several results joined),
 * or y. */
static slapo_status new_values(slapo_graph *g, const slapo_match *ms, int n, slapo_node *y,
                               int n_res, slapo_node **repl) {
  slapo_node *outs[SLAPO_MAX_RESULTS];
  int n_out = results_of(ms, n, outs);
  if (n_res > 0 && y->kind == SLAPO_NODE_TUPLE) {
    for (int i = 0; i < n_out; i++) repl[i] = y->inputs[i];
    return SLAPO_OK;
  }
  slapo_status s = SLAPO_OK;
  slapo_graph_insert_after(g, y);
  if (n_res > 0) {
    s = slapo_node_set_n_results(y, n_res);
    for (int i = 0; s == SLAPO_OK && i < n_out; i++) {
      s = slapo_graph_add_getitem(g, y, i, &repl[i]);
      if (s == SLAPO_OK) s = slapo_node_set_meta(repl[i], outs[i]->dtype, outs[i]->ndim,
                                                 outs[i]->shape);
    }
  } else if (n_out > 1) {
    slapo_ctx *ctx = NULL;
    s = slapo_ctx_new(g, &ctx);
    int64_t start = 0;
    for (int i = 0; s == SLAPO_OK && i < n_out; i++) {
      int64_t w = outs[i]->shape[outs[i]->ndim - 1];
      repl[i] = slapo_slice(ctx, y, y->ndim - 1, start, start + w);
      start += w;
      s = slapo_ctx_status(ctx);
    }
    slapo_ctx_free(ctx);
  } else {
    repl[0] = y;
  }
  slapo_graph_insert_at_end(g);
  return s;
}

/* Points every user of the matches' results at its new value (repl) and
 * erases the matched nodes. */
static slapo_status splice(slapo_graph *g, const slapo_match *ms, int n, slapo_node *const *repl) {
  slapo_node *outs[SLAPO_MAX_RESULTS];
  int n_out = results_of(ms, n, outs);
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < n_out; i++) s = slapo_node_replace_all_uses(outs[i], repl[i]);
  for (int k = n - 1; s == SLAPO_OK && k >= 0; k--)
    for (int j = ms[k].n_nodes - 1; s == SLAPO_OK && j >= 0; j--)
      s = slapo_graph_erase(g, ms[k].nodes[j]);
  if (s == SLAPO_OK) slapo_graph_dce(g);
  return s;
}

/* ---- the edits ---- */

typedef struct group_plan {
  const slapo_match *ms;
  int n;             /* matches in the group */
  slapo_node *ins[16];
  int n_ins;
  slapo_node *after, *before;
  slapo_value_meta res[SLAPO_MAX_RESULTS]; /* what the replacement returns: */
  int n_res;                               /*   one value (0) or a tuple   */
} group_plan;

/* Runs the op function on placeholders shaped like the group's inputs in a
 * scratch graph, so a wrong result shape is found before anything changes. */
static slapo_status dry_run_fn(const sub_edit *e, group_plan *gp) {
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo_status s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  slapo_node *ph[16], *y = NULL;
  for (int i = 0; s == SLAPO_OK && i < gp->n_ins; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    ph[i] = slapo_input(ctx, name, gp->ins[i]->dtype, gp->ins[i]->ndim, gp->ins[i]->shape);
  }
  if (s == SLAPO_OK && slapo_ctx_status(ctx) == SLAPO_OK) y = e->fn(ctx, ph, e->fn_ud);
  if (s == SLAPO_OK) s = slapo_ctx_status(ctx);
  if (s == SLAPO_OK && !y)
    s = slapo_error(SLAPO_STATE, "replace: %s: the op function returned no value", e->path);
  if (s == SLAPO_OK) gp->n_res = slapo_value_metas(y, gp->res);
  if (s == SLAPO_OK) s = check_results(e, gp->ms, gp->n, gp->res, gp->n_res);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}

static slapo_status plan_group(slapo_module *m, const sub_edit *e, group_plan *gp,
                               const char *child) {
  gp->n_ins = node_inputs(&gp->ms[0], gp->ins);
  SLAPO_TRY(placement(e, gp->ms, gp->n, gp->ins, gp->n_ins, &gp->after, &gp->before));
  if (e->fn) {
    if (e->fn_inputs != gp->n_ins)
      return slapo_error(SLAPO_INVALID_ARG, "replace: %s: the op function takes %d input%s, the "
                         "match binds %d input node%s", e->path, e->fn_inputs,
                         e->fn_inputs == 1 ? "" : "s", gp->n_ins, gp->n_ins == 1 ? "" : "s");
    return dry_run_fn(e, gp);
  }
  slapo_module *c = slapo_module_child(m, child);
  if (!c) return slapo_error(SLAPO_NOT_FOUND, "replace: %s has no child '%s'", e->path, child);
  char path[1024];
  snprintf(path, sizeof path, "%s.%s", e->path, child);
  SLAPO_TRY(slapo_module_infer(c, path, gp->n_ins, gp->ins, gp->res, &gp->n_res));
  return check_results(e, gp->ms, gp->n, gp->res, gp->n_res);
}

static void insert_point(slapo_graph *g, const group_plan *gp) {
  if (gp->after) slapo_graph_insert_after(g, gp->after);
  else slapo_graph_insert_before(g, gp->before);
}

/* Builds the replacement node of one group. */
static slapo_status emit_group(slapo_graph *g, const sub_edit *e, const group_plan *gp,
                               const char *child, slapo_node **y) {
  insert_point(g, gp);
  slapo_status s;
  if (e->fn) {
    slapo_ctx *ctx;
    s = slapo_ctx_new(g, &ctx);
    if (s == SLAPO_OK) {
      *y = e->fn(ctx, gp->ins, e->fn_ud);
      s = slapo_ctx_status(ctx);
      if (s == SLAPO_OK && !*y)
        s = slapo_error(SLAPO_STATE, "replace: %s: the op function returned no value", e->path);
      slapo_value_meta res[SLAPO_MAX_RESULTS];
      int n_res = s == SLAPO_OK ? slapo_value_metas(*y, res) : 0;
      if (s == SLAPO_OK) s = check_results(e, gp->ms, gp->n, res, n_res);
    }
    slapo_ctx_free(ctx);
  } else {
    s = slapo_graph_add_call_module(g, child, gp->n_ins, gp->ins, y);
    if (s == SLAPO_OK) s = slapo_node_set_meta(*y, gp->res[0].dtype, gp->res[0].ndim,
                                               gp->res[0].shape);
  }
  slapo_graph_insert_at_end(g);
  if (s != SLAPO_OK) slapo_graph_dce(g); /* drops what was built: g as before */
  return s;
}

/* A later group whose input was a result just replaced (a chain of
 * matches: one's result feeds the next) reads the result's new value. */
static void retarget(group_plan *rest, int n_rest, const slapo_match *ms, int n,
                     slapo_node *const *repl) {
  slapo_node *outs[SLAPO_MAX_RESULTS];
  int n_out = results_of(ms, n, outs);
  for (int o = 0; o < n_out; o++)
    for (int j = 0; j < n_rest; j++) {
      for (int i = 0; i < rest[j].n_ins; i++)
        if (rest[j].ins[i] == outs[o]) rest[j].ins[i] = repl[o];
      if (rest[j].after == outs[o]) rest[j].after = repl[o];
    }
}

static slapo_status replace_edit(slapo_module *m, slapo_graph *g, void *ud) {
  sub_edit *e = ud;
  slapo_matches ms;
  slapo_node **widened = NULL;
  SLAPO_TRY(find_for(e, m, g, &ms));
  slapo_status s = widen(e, &ms, &widened);
  if (s == SLAPO_OK) s = check_matches(e, "replace", &ms);
  drop_skipped(e, &ms);
  int n_groups = e->horizontal ? 1 : ms.n;
  if (s == SLAPO_OK && !e->fn && e->n_children != n_groups)
    s = slapo_error(SLAPO_STATE, "replace: %s: pattern '%s' now matches %d time%s; the schedule "
                    "replaced %d", e->path, label(e), ms.n, ms.n == 1 ? "" : "s",
                    e->n_children);
  group_plan *gp = s == SLAPO_OK ? slapo_calloc((size_t)n_groups, sizeof *gp) : NULL;
  if (s == SLAPO_OK && !gp) s = slapo_error(SLAPO_NOMEM, "replace: out of memory");
  for (int i = 0; s == SLAPO_OK && i < n_groups; i++) {
    gp[i].ms = &ms.items[e->horizontal ? 0 : i];
    gp[i].n = e->horizontal ? ms.n : 1;
    s = plan_group(m, e, &gp[i], e->fn ? NULL : e->children[i]);
  }
  /* Everything is checked; now mutate, group by group. */
  for (int i = 0; s == SLAPO_OK && i < n_groups; i++) {
    slapo_node *y = NULL, *repl[SLAPO_MAX_RESULTS];
    s = emit_group(g, e, &gp[i], e->fn ? NULL : e->children[i], &y);
    if (s == SLAPO_OK) s = slapo_node_set_origin(y, "", 0);
    int n_res = e->fn && s == SLAPO_OK && y->kind == SLAPO_NODE_TUPLE ? y->n_inputs : gp[i].n_res;
    if (s == SLAPO_OK) s = new_values(g, gp[i].ms, gp[i].n, y, n_res, repl);
    if (s == SLAPO_OK) s = splice(g, gp[i].ms, gp[i].n, repl);
    if (s == SLAPO_OK) retarget(gp + i + 1, n_groups - i - 1, gp[i].ms, gp[i].n, repl);
  }
  slapo_free(gp);
  slapo_free(widened);
  slapo_matches_deinit(&ms);
  return s;
}

static slapo_status checkpoint_edit(slapo_module *m, slapo_graph *g, void *ud) {
  sub_edit *e = ud;
  slapo_matches ms;
  SLAPO_TRY(slapo_find_in(m, g, e->p, &ms));
  slapo_status s = check_matches(e, "checkpoint", &ms);
  int top = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next)
    if (n->recompute > top) top = n->recompute;
  for (int i = 0; s == SLAPO_OK && i < ms.n; i++)
    for (int j = 0; s == SLAPO_OK && j < ms.items[i].n_nodes; j++)
      if (ms.items[i].nodes[j]->recompute > 0)
        s = slapo_error(SLAPO_STATE, "checkpoint: %s: %%%s of match %d is checkpointed already",
                        e->path, ms.items[i].nodes[j]->name, i + 1);
  /* Each match is its own region: its intermediates die in the forward. */
  for (int i = 0; s == SLAPO_OK && i < ms.n; i++)
    for (int j = 0; j < ms.items[i].n_nodes; j++) ms.items[i].nodes[j]->recompute = top + 1 + i;
  slapo_matches_deinit(&ms);
  return s;
}

/* ---- the primitives ---- */

/* The pattern as a .sched argument: a registered name, or the text. */
slapo_sched_arg slapo__pattern_arg(const slapo_pattern *p, bool *replayable) {
  const char *name = slapo_pattern_name(p);
  *replayable = true;
  if (slapo_pattern_lookup(name) == p) return slapo_sched_arg_word("pattern", name);
  if (slapo_pattern_is_text(p)) return slapo_sched_arg_string("pattern", name);
  *replayable = false; /* a C pattern function nobody registered */
  return slapo_sched_arg_word("pattern", name);
}

static slapo_status new_edit(slapo_sched *node, const slapo_pattern *p,
                             bool (*ends)(const slapo_op *op), sub_edit **out) {
  *out = slapo_calloc(1, sizeof **out);
  if (!*out) return slapo_error(SLAPO_NOMEM, "subgraph: out of memory");
  snprintf((*out)->path, sizeof (*out)->path, "%s", slapo__prim_path(node));
  (*out)->regions = !p;
  (*out)->ends = ends;
  slapo_status s = p ? slapo_pattern_clone(p, &(*out)->p) : SLAPO_OK;
  if (s != SLAPO_OK) {
    slapo_free(*out);
    *out = NULL;
  }
  return s;
}

static slapo_status traced_of(slapo_sched *node, const char *what) {
  slapo_module *m = slapo_sched_module(node);
  SLAPO_TRY(slapo__prim_graph_not_inlined(node, what));
  if (slapo_module_graph(m)) return SLAPO_OK;
  return slapo_error(SLAPO_PRECOND, "%s: %s is not traced; trace it first (%s trace)", what,
                     slapo__prim_path(node), slapo__prim_path(node));
}

slapo_status slapo_sched_find(slapo_sched *node, const slapo_pattern *p, slapo_matches *out) {
  return slapo_find(slapo_sched_module(node), p, out);
}

/* Makes the children the matches are replaced by (one, or one per match),
 * named "<name>_<k>". On error none is left behind. */
static slapo_status make_children(slapo_sched *node, sub_edit *e, const char *primitive,
                                  const char *name, const slapo__sub_factory *f,
                                  slapo_matches *ms, bool skip_unsupported) {
  slapo_module *m = slapo_sched_module(node);
  int n = e->horizontal ? 1 : ms->n;
  e->children = slapo_calloc((size_t)n + 1, sizeof *e->children);
  e->skip = skip_unsupported ? slapo_calloc((size_t)n + 1, 1) : NULL;
  if (!e->children || (skip_unsupported && !e->skip))
    return slapo_error(SLAPO_NOMEM, "replace: out of memory");
  e->n_skip = skip_unsupported ? n : 0;
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < n; i++) {
    slapo_module *c = NULL;
    s = f->fn(f->ud, m, e->horizontal ? ms->n : 1, &ms->items[i], &c);
    if (s == SLAPO_UNSUPPORTED && skip_unsupported) {
      slapo_logf(1, "%s: %s: region %d left unfused: %s", primitive, e->path, i + 1,
                 slapo_last_error());
      e->skip[i] = 1;
      s = SLAPO_OK;
      continue;
    }
    if (s != SLAPO_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      s = slapo_error(s, "%s: %s: %s: %s", primitive, e->path, name, msg);
      break;
    }
    /* Children are kept in order without holes: a replay drops the
     * skipped matches first, so its k-th match is the k-th child's. */
    char child[256];
    slapo_module_unique_name(m, name, child, sizeof child);
    int k = e->n_children;
    if (!(e->children[k] = slapo_strdup(child))) {
      slapo_module_free(c);
      s = slapo_error(SLAPO_NOMEM, "replace: out of memory");
      break;
    }
    s = slapo_module_add_child(m, child, c);
    if (s != SLAPO_OK) {
      slapo_free(e->children[k]);
      e->children[k] = NULL;
      break;
    }
    e->n_children++;
  }
  return s;
}

static void remove_children(slapo_module *m, sub_edit *e) {
  for (int i = 0; i < e->n_children; i++) slapo_module_remove_child(m, e->children[i]);
}

static slapo_status finish_edit(slapo_sched *node, const char *what, sub_edit *e,
                                slapo_graph_edit_fn fn, const char *primitive, int n_args,
                                const slapo_sched_arg *args, const slapo_sched_entry *from,
                                bool replayable) {
  slapo_module *m = slapo_sched_module(node);
  slapo_status s = slapo_module_edit_graph(m, what, fn, edit_free, e);
  if (s != SLAPO_OK) {
    remove_children(m, e);
    edit_free(e);
    return s;
  }
  /* The edit now belongs to the module (freed with it); new children get
   * schedule nodes. */
  s = slapo_sched_rebuild(node);
  if (s == SLAPO_OK) s = slapo__prim_log(node, primitive, n_args, args, from, replayable);
  return s;
}

slapo_status slapo__subgraph_apply(slapo_sched *node, const slapo_pattern *p,
                                   const slapo__subgraph_spec *sp) {
  /* The children are named <name>_<k>: paths a later line may spell. */
  if (sp->child && !slapo_sched_is_name(sp->child, false))
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s: name '%s' must be an identifier (letters, "
                       "digits and '_', not first a digit): it names the new children "
                       "<name>_<k>",
                       sp->primitive, slapo__prim_path(node), sp->child);
  SLAPO_TRY(traced_of(node, sp->primitive));
  SLAPO_TRY(slapo__prim_log_check(node, sp->primitive, sp->n_args, sp->args));
  sub_edit *e;
  SLAPO_TRY(new_edit(node, p, sp->region_ends, &e));
  e->horizontal = sp->horizontal;
  e->exactly_one = sp->exactly_one;
  e->escaping_results = sp->escaping_results;
  slapo_matches ms;
  slapo_node **widened = NULL;
  slapo_status s = find_for(e, slapo_sched_module(node), slapo_module_graph(slapo_sched_module(node)), &ms);
  if (s == SLAPO_OK) s = widen(e, &ms, &widened);
  if (s == SLAPO_OK) s = check_matches(e, sp->primitive, &ms);
  if (s == SLAPO_OK)
    s = make_children(node, e, sp->primitive, sp->child, &sp->factory, &ms, sp->skip_unsupported);
  if (s == SLAPO_OK && e->n_children == 0)
    s = slapo_error(SLAPO_UNSUPPORTED, "%s: %s: nothing could be fused (SLAPO_DEBUG=1 lists "
                    "why each region was left)", sp->primitive, e->path);
  slapo_free(widened);
  slapo_matches_deinit(&ms);
  if (s != SLAPO_OK) {
    remove_children(slapo_sched_module(node), e);
    edit_free(e);
    return s;
  }
  char what[256];
  snprintf(what, sizeof what, "%s %s pattern=%s", sp->primitive, sp->child, label(e));
  return finish_edit(node, what, e, replace_edit, sp->primitive, sp->n_args, sp->args, sp->from,
                     sp->replayable);
}

/* A registered factory called through the general form. */
static slapo_status call_registered(void *ud, slapo_module *owner, int n, const slapo_match *ms,
                                    slapo_module **out) {
  return ((slapo_subgraph_factory)(uintptr_t)ud)(owner, n, ms, out);
}

slapo_status slapo__replace_subgraph(slapo_sched *node, const slapo_pattern *p, const char *name,
                                     bool horizontal, const slapo_sched_entry *from) {
  SLAPO_TRY(traced_of(node, "replace"));
  slapo_subgraph_factory f = slapo_subgraph_factory_find(name);
  if (!f) {
    char known[512] = "";
    for (int i = 0; i < g_n_facs; i++) slapo_list_append(known, sizeof known, g_facs[i].name);
    return slapo_error(SLAPO_NOT_FOUND, "replace: %s: no subgraph module is registered as '%s' "
                       "(registered: %s)", slapo__prim_path(node), name, known[0] ? known : "none");
  }
  bool replayable;
  slapo_sched_arg args[3] = {slapo_sched_arg_word(NULL, name), slapo__pattern_arg(p, &replayable),
                             slapo_sched_arg_bool("horizontal", true)};
  slapo__subgraph_spec sp = {
      .primitive = "replace", .child = name, .factory = {call_registered, (void *)(uintptr_t)f},
      .horizontal = horizontal, .args = args, .n_args = horizontal ? 3 : 2,
      .replayable = replayable, .from = from};
  return slapo__subgraph_apply(node, p, &sp);
}

slapo_status slapo_replace_subgraph(slapo_sched *node, const slapo_pattern *p, const char *name,
                                    bool horizontal) {
  return slapo__replace_subgraph(node, p, name, horizontal, NULL);
}

slapo_status slapo_replace_subgraph_fn(slapo_sched *node, const slapo_pattern *p,
                                       const char *name, int n_inputs, slapo_pattern_fn fn,
                                       void *ud) {
  SLAPO_TRY(traced_of(node, "replace"));
  if (!fn || n_inputs < 0 || n_inputs > 16)
    return slapo_error(SLAPO_INVALID_ARG, "replace: %s: need an op function taking 0..16 inputs",
                       slapo__prim_path(node));
  bool replayable;
  slapo_sched_arg args[2] = {slapo_sched_arg_word(NULL, name), slapo__pattern_arg(p, &replayable)};
  SLAPO_TRY(slapo__prim_log_check(node, "replace", 2, args));
  sub_edit *e;
  SLAPO_TRY(new_edit(node, p, NULL, &e));
  e->fn = fn, e->fn_ud = ud, e->fn_inputs = n_inputs;
  char what[256];
  snprintf(what, sizeof what, "replace %s pattern=%s", name, slapo_pattern_name(p));
  /* An op function is C only: the line cannot be replayed from a file. */
  return finish_edit(node, what, e, replace_edit, "replace", 2, args, NULL, false);
}

slapo_status slapo__checkpoint_subgraph(slapo_sched *node, const slapo_pattern *p,
                                        const slapo_sched_entry *from) {
  SLAPO_TRY(traced_of(node, "checkpoint"));
  bool replayable;
  slapo_sched_arg arg = slapo__pattern_arg(p, &replayable);
  SLAPO_TRY(slapo__prim_log_check(node, "checkpoint", 1, &arg));
  sub_edit *e;
  SLAPO_TRY(new_edit(node, p, NULL, &e));
  e->checkpoint = true;
  char what[256];
  snprintf(what, sizeof what, "checkpoint pattern=%s", slapo_pattern_name(p));
  return finish_edit(node, what, e, checkpoint_edit, "checkpoint", 1, &arg, from, replayable);
}

slapo_status slapo_checkpoint_subgraph(slapo_sched *node, const slapo_pattern *p) {
  return slapo__checkpoint_subgraph(node, p, NULL);
}

slapo_status slapo__prim_pattern(const slapo_sched_entry *e, const char *primitive,
                                 const slapo_pattern **p, bool *owned) {
  const slapo_sched_arg *a = slapo_sched_entry_find(e, "pattern");
  *p = NULL, *owned = false;
  if (!a) return SLAPO_OK;
  if (a->kind != SLAPO_SCHED_ARG_WORD && a->kind != SLAPO_SCHED_ARG_STRING)
    return slapo_error(SLAPO_INVALID_ARG, "%s: pattern=%s: expected a registered pattern name or "
                       "a quoted text pattern", primitive, a->text);
  return slapo_pattern_resolve(a->text, a->kind == SLAPO_SCHED_ARG_STRING, p, owned);
}
