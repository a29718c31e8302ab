/* module/trace.c - tracing by need (DESIGN.md §3): capturing one module's
 * forward as a graph stored on the module, emitting the stored (possibly
 * edited) graph in its place when it is called, and re-tracing at new input
 * shapes with the recorded edits replayed.
 *
 * Shapes: forward functions bake batch, sequence and head counts into
 * attributes (GPT-2 attention's reshapes), so a stored graph is valid for
 * the input signature it was traced at only. Rather than giving attributes
 * shape expressions (every op's attributes would need a symbolic form), a
 * call at another signature re-traces the forward there and replays the
 * module's graph edits, which are kept as functions of the graph (they
 * re-find their pattern), not as node lists. Layer: module. */
#include <stdio.h>
#include <string.h>

#include "module/internal.h"

#define MAX_SIGS 4 /* cached signatures per module; entry 0 (example) stays */

/* An input signature: dtypes, shapes and the module's call ordinal within
 * one forward (the same struct the capture fills, module/internal.h). */
typedef struct trace_sig_pub trace_sig;

typedef struct trace_entry {
  trace_sig sig;
  slapo_graph *g;
} trace_entry;

typedef struct trace_edit {
  char *what;
  slapo_graph_edit_fn fn;
  void (*free_ud)(void *);
  void *ud;
} trace_edit;

struct slapo_trace_state {
  slapo_trace_opts opts; /* leaves owned */
  trace_entry cache[MAX_SIGS];
  int n_cache;
  trace_edit *edits;
  int n_edits;
  char **inlined; /* relative paths inlined by a flattened trace (owned) */
  int n_inlined;
  bool decode_sensitive; /* the forward asked slapo_decode_past */
};

/* ---- signatures ---- */

static void sig_of(trace_sig *s, int n_in, slapo_node *const *in, int call) {
  memset(s, 0, sizeof *s);
  s->n_in = n_in;
  s->call = call;
  for (int i = 0; i < n_in && i < 8; i++) {
    s->dt[i] = in[i]->dtype;
    s->ndim[i] = in[i]->ndim;
    memcpy(s->shape[i], in[i]->shape, sizeof s->shape[i]);
  }
}

static bool sig_eq(const trace_sig *a, const trace_sig *b) { return !memcmp(a, b, sizeof *a); }

static void sig_text(const trace_sig *s, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < s->n_in && used < cap; i++) {
    char sh[96];
    used += (size_t)snprintf(buf + used, cap - used, "%s%s%s", i ? ", " : "",
                             slapo_dtype_name(s->dt[i]),
                             slapo_shape_str(s->ndim[i], s->shape[i], sh, sizeof sh));
  }
}

/* ---- freeing ---- */

static void edits_free(trace_edit *e, int n) {
  for (int i = 0; i < n; i++) {
    if (e[i].free_ud) e[i].free_ud(e[i].ud);
    slapo_free(e[i].what);
  }
  slapo_free(e);
}

void slapo__trace_free(slapo_trace_state *t) {
  if (!t) return;
  for (int i = 0; i < t->n_cache; i++) slapo_graph_free(t->cache[i].g);
  edits_free(t->edits, t->n_edits);
  for (int i = 0; i < t->n_inlined; i++) slapo_free(t->inlined[i]);
  slapo_free(t->inlined);
  slapo_free((char *)t->opts.leaves);
  slapo_free(t);
}

/* ---- tracing one forward ---- */

/* p relative to prefix ("" = prefix itself), or NULL when outside it. */
static const char *rel_path(const char *p, const char *prefix) {
  size_t k = strlen(prefix);
  if (!k) return p;
  if (strncmp(p, prefix, k)) return NULL;
  if (!p[k]) return "";
  return p[k] == '.' ? p + k + 1 : NULL;
}

/* Index of `word` in the comma-separated list, or -1. */
static int list_index(const char *list, const char *word) {
  size_t n = strlen(word);
  int k = 0;
  for (const char *s = list; s && *s; k++) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    while (len && *s == ' ') s++, len--;
    while (len && s[len - 1] == ' ') len--;
    if (len == n && !strncmp(s, word, n)) return k;
    s = e ? e + 1 : s + strlen(s);
  }
  return -1;
}

static bool is_leaf(slapo__tracing *t, const slapo_module *child, const char *rel) {
  int a = list_index(t->opts->leaves, child->type->name), b = list_index(t->opts->leaves, rel);
  if (a >= 0 && a < 64) t->leaves_used |= 1ull << a;
  if (b >= 0 && b < 64) t->leaves_used |= 1ull << b;
  slapo_op_form f;
  if (child->type->op_form && child->type->op_form(child, &f)) return true;
  return a >= 0 || b >= 0;
}

/* The first entry of `leaves` that named no module the trace met. */
static slapo_status check_leaves(const slapo__tracing *t, const char *path) {
  const char *s = t->opts->leaves;
  for (int k = 0; s && *s; k++) {
    const char *e = strchr(s, ',');
    int len = e ? (int)(e - s) : (int)strlen(s);
    const char *w = s;
    int wl = len;
    while (wl && *w == ' ') w++, wl--;
    while (wl && w[wl - 1] == ' ') wl--;
    if (k < 64 && !(t->leaves_used >> k & 1))
      return slapo_error(SLAPO_INVALID_ARG, "trace: %s: leaves entry '%.*s' names no module "
                         "type or path (relative to it) that its forward calls",
                         path[0] ? path : ".", wl, w);
    s = e ? e + 1 : s + len;
  }
  return SLAPO_OK;
}

static slapo_status note_inlined(slapo__tracing *t, const char *rel) {
  for (int i = 0; i < t->n_inlined; i++)
    if (!strcmp(t->inlined[i], rel)) return SLAPO_OK;
  char **a = slapo_realloc(t->inlined, (size_t)(t->n_inlined + 1) * sizeof *a);
  if (!a) return slapo_error(SLAPO_NOMEM, "trace: out of memory");
  t->inlined = a;
  if (!(a[t->n_inlined] = slapo_strdup(rel))) return slapo_error(SLAPO_NOMEM, "trace: oom");
  t->n_inlined++;
  return SLAPO_OK;
}

/* A leaf returning a tuple: its call_module node is multi-result, with a
 * getitem node per value (DCE drops the ones nobody reads); the caller
 * gets a tuple of the getitems, so its own getitem reads one. */
static slapo_node *leaf_results(slapo_ctx *ctx, slapo_node *call, int k,
                                const slapo_value_meta *meta) {
  slapo_graph *g = slapo_ctx_graph(ctx);
  slapo_node *items[SLAPO_MAX_RESULTS];
  slapo_status s = slapo_node_set_n_results(call, k);
  for (int i = 0; s == SLAPO_OK && i < k; i++) {
    s = slapo_graph_add_getitem(g, call, i, &items[i]);
    if (s == SLAPO_OK) s = slapo_node_set_meta(items[i], meta[i].dtype, meta[i].ndim,
                                               meta[i].shape);
    if (s == SLAPO_OK) s = slapo_node_set_origin(items[i], call->origin, 0);
    if (s == SLAPO_OK) items[i]->recompute = call->recompute;
  }
  if (s != SLAPO_OK) {
    slapo_ctx_fail(ctx, s, "%s", slapo_last_error());
    return NULL;
  }
  return slapo_tuple(ctx, k, items);
}

int slapo_value_metas(const slapo_node *y, slapo_value_meta *out) {
  bool tuple = y->kind == SLAPO_NODE_TUPLE;
  int k = tuple ? y->n_inputs : 0;
  for (int i = 0; i < (tuple ? k : 1) && k <= SLAPO_MAX_RESULTS; i++) {
    const slapo_node *v = tuple ? y->inputs[i] : y;
    out[i].dtype = v->dtype;
    out[i].ndim = v->ndim;
    memcpy(out[i].shape, v->shape, sizeof out[i].shape);
  }
  return k;
}

/* slapo_value_metas, refusing (on ctx) a tuple larger than out holds. */
static bool metas_of(slapo_ctx *ctx, const slapo_node *y, const char *path, int *k,
                     slapo_value_meta *meta) {
  *k = slapo_value_metas(y, meta);
  if (*k <= SLAPO_MAX_RESULTS) return true;
  slapo_ctx_fail(ctx, SLAPO_LIMIT, "%s returns %d values; a module returns at most %d",
                 path[0] ? path : ".", *k, SLAPO_MAX_RESULTS);
  return false;
}

/* While tracing, a call of a leaf becomes one call_module node: the leaf's
 * forward is built once to learn the output's dtype and shape (each value's,
 * for a tuple), then its nodes are erased (its parameters stay until DCE). */
static slapo_node *trace_leaf(slapo_ctx *ctx, slapo__tracing *t, slapo_module *self,
                              const char *name, const char *rel, int n_in,
                              slapo_node *const *in) {
  slapo_graph *g = slapo_ctx_graph(ctx);
  slapo_node *mark = slapo_graph_last(g);
  t->leaf_depth++;
  slapo_node *out = slapo__call_module(ctx, self, name, n_in, in);
  t->leaf_depth--;
  int k;
  slapo_value_meta meta[SLAPO_MAX_RESULTS];
  if (!out || !metas_of(ctx, out, rel, &k, meta)) return NULL;
  for (slapo_node *n = slapo_graph_last(g), *prev; n && n != mark; n = prev) {
    prev = n->prev;
    if (n->kind != SLAPO_NODE_PARAM && n->n_users == 0) slapo_graph_erase(g, n);
  }
  slapo_node *call = NULL;
  slapo_status s = slapo_graph_add_call_module(g, rel, n_in, in, &call);
  if (s == SLAPO_OK) s = slapo_node_set_meta(call, meta[0].dtype, meta[0].ndim, meta[0].shape);
  if (s == SLAPO_OK) s = slapo_node_set_origin(call, slapo_ctx_origin(ctx), 0);
  if (s != SLAPO_OK) {
    slapo_ctx_fail(ctx, s, "%s", slapo_last_error());
    return NULL;
  }
  /* Inside a checkpointed region (an inlined child's checkpointed subgraph)
   * the call belongs to it, as its ops would. */
  call->recompute = slapo_ctx_region(ctx);
  return k ? leaf_results(ctx, call, k, meta) : call;
}

slapo_node *slapo__trace_call(slapo_ctx *ctx, slapo__tracing *t, slapo_module *self,
                              const char *name, slapo_module *child, const char *path,
                              int n_in, slapo_node *const *in) {
  const char *rel = rel_path(path, t->path);
  if (!rel) rel = path;
  if (!t->opts->flatten || is_leaf(t, child, rel))
    return trace_leaf(ctx, t, self, name, rel, n_in, in);
  if (child->checkpoint) {
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                   "trace: %s: cannot inline %s into the flattened trace: it is checkpointed "
                   "(keep it a leaf with leaves=\"%s\", or checkpoint a subgraph after "
                   "tracing)",
                   t->path[0] ? t->path : ".", path, rel);
    return NULL;
  }
  if (note_inlined(t, rel) != SLAPO_OK) {
    slapo_ctx_fail(ctx, SLAPO_NOMEM, "trace: out of memory");
    return NULL;
  }
  return slapo__call_module(ctx, self, name, n_in, in);
}

/* The path of p below m, found by walking m's subtree (first holder in
 * pre-order, as parameter visiting names tied weights). */
static bool param_rel(const slapo_module *m, const slapo_parameter *p, char *buf, size_t cap,
                      size_t used) {
  for (int i = 0; i < m->n_params; i++)
    if (m->params[i] == p) {
      snprintf(buf + used, cap - used, "%s%s", used ? "." : "", m->param_names[i]);
      return true;
    }
  for (int i = 0; i < m->n_children; i++) {
    int k = snprintf(buf + used, cap - used, "%s%s", used ? "." : "", m->children[i]->name);
    if (k > 0 && used + (size_t)k < cap && param_rel(m->children[i], p, buf, cap, used + (size_t)k))
      return true;
    buf[used] = '\0';
  }
  return false;
}

/* Params by path relative to m, origins relative to m's path. */
static slapo_status relativize(slapo_graph *g, slapo_module *m, const char *path,
                               slapo__build_state *bs) {
  for (slapo_node *n = slapo_graph_first(g), *next; n; n = next) {
    next = n->next;
    /* Placeholders carry no origin; everything else one below m. */
    const char *o = n->origin && n->origin[0] ? rel_path(n->origin, path) : "";
    if (!o)
      return slapo_error(SLAPO_UNSUPPORTED, "trace: %s: node %%%s comes from %s, outside the "
                         "traced module", path[0] ? path : ".", n->name, n->origin);
    SLAPO_TRY(slapo_node_set_origin(n, o, n->op_seq));
    if (n->kind != SLAPO_NODE_PARAM) continue;
    slapo_parameter *p = slapo_map_get(bs->param_objs, n->target);
    char rel[1024] = "";
    if (!p || !param_rel(m, p, rel, sizeof rel, 0))
      return slapo_error(SLAPO_UNSUPPORTED, "trace: %s: parameter %s is not held by a module "
                         "below it", path[0] ? path : ".", n->target);
    slapo_node *r;
    slapo_graph_insert_before(g, n);
    SLAPO_TRY(slapo_graph_add_param(g, rel, n->dtype, n->ndim, n->shape, &r));
    r->layout = n->layout;
    slapo_graph_insert_at_end(g);
    SLAPO_TRY(slapo_node_set_origin(r, o, 0));
    SLAPO_TRY(slapo_node_replace_all_uses(n, r));
    SLAPO_TRY(slapo_graph_erase(g, n));
  }
  return SLAPO_OK;
}

/* The stored graph's output: y, or the values of the tuple y with the
 * output marked as returning a tuple (a 1-tuple stays one). */
static slapo_status output_of(slapo_ctx *ctx, slapo_node *y) {
  bool tuple = y->kind == SLAPO_NODE_TUPLE;
  slapo_node *o = slapo_output(ctx, tuple ? y->n_inputs : 1, tuple ? y->inputs : &y);
  if (!o) return slapo_ctx_status(ctx);
  return tuple ? slapo_node_set_n_results(o, o->n_inputs) : SLAPO_OK;
}

/* Builds m's forward on placeholders of signature `sig` into *out. */
static slapo_status trace_at(slapo_module *m, const char *path, const trace_sig *sig,
                             const slapo_trace_opts *opts, slapo__tracing *t, slapo_graph **out) {
  int n_in = sig->n_in, call = sig->call;
  *out = NULL;
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo__build_state bs = {0};
  *t = (slapo__tracing){.m = m, .path = path, .opts = opts};
  slapo_status s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_nodes);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_objs);
  if (s != SLAPO_OK) goto done;
  bs.trace = t;
  slapo_ctx_set_user(ctx, &bs);
  /* The stored graph's random ops get their shard attributes when it is
   * emitted, from the layouts at hand then; here, on placeholders and
   * perhaps a half-applied schedule (a projection whose all-reduce a later
   * line adds), they do not judge layouts. */
  slapo_ctx_set_copy_rng(ctx, true);
  /* The precision its GEMMs are built in, as slapo__forward would set it
   * from m and its ancestors: the stored graph holds the casts. */
  slapo_ctx_set_autocast(ctx, slapo_module_autocast_of(m));
  /* The module's frame with its call ordinal, as slapo_call enters it, so
   * random ops draw the streams the untraced forward would. */
  if (path[0])
    for (int k = 0; k <= call && slapo_ctx_status(ctx) == SLAPO_OK; k++) {
      if (k) slapo_ctx_pop_origin(ctx);
      slapo_ctx_enter_call(ctx, path);
    }
  slapo_node *ph[8];
  for (int i = 0; i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    ph[i] = slapo_input(ctx, name, sig->dt[i], sig->ndim[i], sig->shape[i]);
  }
  slapo_node *y = slapo_ctx_status(ctx) == SLAPO_OK ? m->type->forward(ctx, m, n_in, ph) : NULL;
  if ((s = slapo_ctx_status(ctx)) == SLAPO_OK && !y)
    s = slapo_error(SLAPO_STATE, "trace: %s: the %s forward returned no value",
                    path[0] ? path : ".", m->type->name);
  if (s == SLAPO_OK) s = output_of(ctx, y);
  if (s == SLAPO_OK) s = relativize(g, m, path, &bs);
  if (s == SLAPO_OK) {
    slapo_graph_dce(g);
    slapo_graph_renumber(g);
    s = slapo_graph_lint(g);
  }
done:
  slapo_map_free(bs.param_nodes);
  slapo_map_free(bs.param_objs);
  slapo_ctx_free(ctx);
  if (s != SLAPO_OK) {
    slapo_graph_free(g);
    return s;
  }
  *out = g;
  return SLAPO_OK;
}

/* ---- the stored graph for a signature ---- */

static slapo_status replay(slapo_module *m, const char *path, slapo_graph *g, const trace_sig *sig) {
  slapo_trace_state *t = m->trace;
  for (int i = 0; i < t->n_edits; i++) {
    slapo_status s = t->edits[i].fn(m, g, t->edits[i].ud);
    if (s == SLAPO_OK) s = slapo_graph_lint(g);
    if (s != SLAPO_OK) {
      char msg[1024], sh[256];
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      sig_text(sig, sh, sizeof sh);
      return slapo_error(s, "trace: %s: re-traced at inputs (%s), edit %d (%s) does not apply: "
                         "%s", path[0] ? path : ".", sh, i + 1, t->edits[i].what, msg);
    }
  }
  slapo_graph_renumber(g);
  return SLAPO_OK;
}

/* A fresh trace at sig with every recorded edit replayed. */
static slapo_status retrace(slapo_module *m, const char *path, const trace_sig *sig,
                            slapo_graph **out) {
  slapo__tracing tr;
  slapo_graph *g;
  SLAPO_TRY(trace_at(m, path, sig, &m->trace->opts, &tr, &g));
  for (int i = 0; i < tr.n_inlined; i++) slapo_free(tr.inlined[i]);
  slapo_free(tr.inlined);
  slapo_status s = replay(m, path, g, sig);
  if (s != SLAPO_OK) {
    slapo_graph_free(g);
    return s;
  }
  *out = g;
  return SLAPO_OK;
}

static slapo_status graph_for(slapo_module *m, const char *path, int n_in, slapo_node *const *in,
                              int call, slapo_graph **out) {
  slapo_trace_state *t = m->trace;
  trace_sig sig;
  sig_of(&sig, n_in, in, call);
  for (int i = 0; i < t->n_cache; i++)
    if (sig_eq(&t->cache[i].sig, &sig)) {
      *out = t->cache[i].g;
      return SLAPO_OK;
    }
  slapo_graph *g;
  SLAPO_TRY(retrace(m, path, &sig, &g));
  int at = t->n_cache < MAX_SIGS ? t->n_cache++ : MAX_SIGS - 1;
  if (at == MAX_SIGS - 1 && t->cache[at].g) slapo_graph_free(t->cache[at].g);
  t->cache[at] = (trace_entry){sig, g};
  slapo_logf(2, "trace: %s re-traced for a new input signature", path[0] ? path : ".");
  *out = g;
  return SLAPO_OK;
}

/* ---- emission ---- */

static char *join(const char *a, const char *b, char *buf, size_t cap) {
  snprintf(buf, cap, "%s%s%s", a, a[0] && b[0] ? "." : "", b);
  return buf;
}

static slapo_node *emit_param(slapo_ctx *ctx, slapo_module *m, const slapo_node *n) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", n->target);
  char *dot = strrchr(dir, '.');
  const char *local = dot ? dot + 1 : dir;
  slapo_module *owner = m;
  if (dot) {
    *dot = '\0';
    if (slapo_module_at(m, dir, &owner) != SLAPO_OK) {
      slapo_ctx_fail(ctx, SLAPO_NOT_FOUND, "%s: traced graph: %s", slapo_ctx_origin(ctx),
                     slapo_last_error());
      return NULL;
    }
  }
  return slapo_weight(ctx, owner, local);
}

typedef struct emit_state {
  slapo_node **val;   /* [n]: emitted value of each stored node */
  int *region;        /* [n + 1]: local region id -> ctx region */
} emit_state;

static slapo_node *emit_node(slapo_ctx *ctx, slapo_module *m, const char *path,
                             const slapo_node *n, slapo_node *const *in, int n_in,
                             emit_state *es, int *ph) {
  slapo_node *args[16];
  if (n->n_inputs > 16) {
    slapo_ctx_fail(ctx, SLAPO_LIMIT, "%s: traced node %%%s has %d inputs (at most 16)", path,
                   n->name, n->n_inputs);
    return NULL;
  }
  for (int i = 0; i < n->n_inputs; i++) args[i] = es->val[n->inputs[i]->id];
  switch (n->kind) {
  case SLAPO_NODE_PLACEHOLDER:
    if (*ph >= n_in) {
      slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: traced graph takes more than %d inputs",
                     path[0] ? path : ".", n_in);
      return NULL;
    }
    return in[(*ph)++];
  case SLAPO_NODE_PARAM: return emit_param(ctx, m, n);
  case SLAPO_NODE_CALL_MODULE: return slapo_call(ctx, m, n->target, n->n_inputs, args);
  case SLAPO_NODE_GETITEM: return slapo_getitem(ctx, args[0], n->item);
  case SLAPO_NODE_TUPLE: return slapo_tuple(ctx, n->n_inputs, args);
  case SLAPO_NODE_CALL_OP: {
    char full[1024];
    bool push = n->origin && n->origin[0];
    if (push && slapo_ctx_push_origin(ctx, join(path, n->origin, full, sizeof full)) != SLAPO_OK)
      return NULL;
    slapo_node *y = slapo_op_apply(ctx, n->op, n->n_inputs, args, n->n_attrs, n->attrs);
    if (push) slapo_ctx_pop_origin(ctx);
    return y;
  }
  default:
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED, "%s: traced graph holds a %s node (%%%s)",
                   path[0] ? path : ".", slapo_node_kind_name(n->kind), n->name);
    return NULL;
  }
}

/* The tuple a traced module returns: its output node's values. */
static slapo_node *emit_tuple(slapo_ctx *ctx, const slapo_node *out, const emit_state *es) {
  slapo_node *vals[SLAPO_MAX_RESULTS];
  int k = out->n_inputs < SLAPO_MAX_RESULTS ? out->n_inputs : SLAPO_MAX_RESULTS;
  for (int i = 0; i < k; i++) vals[i] = es->val[out->inputs[i]->id];
  return slapo_tuple(ctx, k, vals);
}

static slapo_node *emit(slapo_ctx *ctx, slapo_module *m, const char *path, slapo_graph *g,
                        int n_in, slapo_node *const *in) {
  int count = slapo_graph_count(g), max_region = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next)
    if (n->recompute > max_region) max_region = n->recompute;
  emit_state es = {slapo_calloc((size_t)count, sizeof *es.val),
                   slapo_calloc((size_t)max_region + 1, sizeof *es.region)};
  slapo_node *result = NULL;
  if (!es.val || !es.region) {
    slapo_ctx_fail(ctx, SLAPO_NOMEM, "trace: out of memory");
    goto done;
  }
  int ph = 0, outer = slapo_ctx_region(ctx);
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (n->kind == SLAPO_NODE_OUTPUT) {
      result = es.val[n->inputs[0]->id];
      if (n->n_results > 0) result = emit_tuple(ctx, n, &es);
      break;
    }
    /* A checkpointed subgraph is a fresh region per emission, unless the
     * module is inside a checkpointed region already (nested folds). */
    int r = outer;
    if (n->recompute > 0 && outer == 0) {
      if (!es.region[n->recompute]) es.region[n->recompute] = slapo_ctx_new_region(ctx);
      r = es.region[n->recompute];
    }
    slapo_ctx_set_region(ctx, r);
    es.val[n->id] = emit_node(ctx, m, path, n, in, n_in, &es, &ph);
    slapo_ctx_set_region(ctx, outer);
    if (!es.val[n->id]) break;
  }
done:
  slapo_free(es.val);
  slapo_free(es.region);
  return slapo_ctx_status(ctx) == SLAPO_OK ? result : NULL;
}

slapo_node *slapo__trace_emit(slapo_ctx *ctx, slapo_module *m, int n_in, slapo_node *const *in) {
  const char *path = slapo_ctx_origin(ctx);
  slapo_trace_state *t = m->trace;
  if (t->decode_sensitive && slapo_decode_past(ctx) >= 0) {
    /* The trace was taken without a KV cache; the forward function is the
     * same computation when nothing was edited. */
    if (!t->n_edits) return m->type->forward(ctx, m, n_in, in);
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                   "%s: decoding with a KV cache cannot run the edited traced graph of this "
                   "module (traced without a cache); sample without the cache",
                   path[0] ? path : ".");
    return NULL;
  }
  if (n_in > 8) {
    slapo_ctx_fail(ctx, SLAPO_LIMIT, "%s: a traced module takes at most 8 inputs, got %d",
                   path[0] ? path : ".", n_in);
    return NULL;
  }
  slapo_graph *g;
  slapo_status s = graph_for(m, path, n_in, in, slapo_ctx_call(ctx), &g);
  if (s != SLAPO_OK) {
    slapo_ctx_fail(ctx, s, "%s", slapo_last_error());
    return NULL;
  }
  return emit(ctx, m, path, g, n_in, in);
}

/* ---- capture and the public API ---- */

slapo_node *slapo__trace_capture(slapo_ctx *ctx, slapo__capture *c, slapo_module *m, int n_in,
                                 slapo_node *const *in) {
  if (n_in > 8) {
    slapo_ctx_fail(ctx, SLAPO_LIMIT, "trace: a traced module takes at most 8 inputs, got %d",
                   n_in);
    return NULL;
  }
  const char *path = slapo_ctx_origin(ctx);
  sig_of(&c->sig_in, n_in, in, slapo_ctx_call(ctx));
  c->status = trace_at(m, path, &c->sig_in, c->opts, &c->tracing, &c->g);
  c->done = true;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", slapo_last_error());
  /* Stop building the rest of the model: everything needed is captured. */
  slapo_ctx_fail(ctx, SLAPO_STATE, "trace: captured");
  snprintf(c->message, sizeof c->message, "%s", msg);
  return NULL;
}

static slapo_module *root_of(slapo_module *m) {
  while (m->parent) m = m->parent;
  return m;
}

slapo_status slapo_module_set_example(slapo_module *m, int n, const slapo_tensor *const *in) {
  if (m->parent || n < 0 || n > 8)
    return slapo_error(SLAPO_INVALID_ARG, "set_example: needs a root module and 0..8 inputs");
  slapo_tensor **ex = n ? slapo_calloc((size_t)n, sizeof *ex) : NULL;
  if (n && !ex) return slapo_error(SLAPO_NOMEM, "set_example: out of memory");
  for (int i = 0; i < n; i++)
    if (slapo_tensor_new_meta(in[i]->dtype, in[i]->ndim, in[i]->shape, &ex[i]) != SLAPO_OK) {
      for (int j = 0; j < i; j++) slapo_tensor_free(ex[j]);
      slapo_free(ex);
      return slapo_error(SLAPO_NOMEM, "set_example: out of memory");
    }
  for (int i = 0; i < m->n_example; i++) slapo_tensor_free(m->example[i]);
  slapo_free(m->example);
  m->example = ex;
  m->n_example = n;
  return SLAPO_OK;
}

/* Builds the root's forward on the example inputs until it calls m. */
static slapo_status capture(slapo_module *root, slapo_module *m, const char *path,
                            const slapo_trace_opts *opts, slapo__capture *c) {
  *c = (slapo__capture){.m = m, .opts = opts};
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo__build_state bs = {.capture = c};
  slapo_status s = slapo_module_name_params(root);
  if (s == SLAPO_OK) s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_nodes);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_objs);
  if (s == SLAPO_OK) {
    slapo_ctx_set_user(ctx, &bs);
    /* Only shapes are wanted, and a schedule may be half applied here (a
     * row-parallel projection whose all-reduce a later line adds): random
     * ops do not judge layouts in this build, which never runs. */
    slapo_ctx_set_copy_rng(ctx, true);
    slapo_node *ins[8];
    for (int i = 0; i < root->n_example; i++) {
      char name[16];
      snprintf(name, sizeof name, "in%d", i);
      const slapo_tensor *e = root->example[i];
      ins[i] = slapo_input(ctx, name, e->dtype, e->ndim, e->shape);
    }
    if (slapo_ctx_status(ctx) == SLAPO_OK) slapo__forward(ctx, root, root->n_example, ins);
    if (c->done && c->status != SLAPO_OK) s = slapo_error(c->status, "%s", c->message);
    else if (c->done) s = SLAPO_OK;
    else if (slapo_ctx_status(ctx) != SLAPO_OK)
      s = slapo_error(slapo_ctx_status(ctx), "trace: %s: building the model on its example "
                      "inputs failed before reaching it: %s", path, slapo_ctx_message(ctx));
    else
      s = !strcmp(m->type->name, "ModuleList")
              ? slapo_error(SLAPO_PRECOND, "trace: %s is a ModuleList, a container its parent "
                            "iterates over without calling it: trace its items ('%s.* trace')",
                            path, path)
              : slapo_error(SLAPO_PRECOND, "trace: %s: the model's forward never calls this "
                            "module on its example inputs", path);
  }
  slapo_map_free(bs.param_nodes);
  slapo_map_free(bs.param_objs);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}

static slapo_status new_trace(const slapo_trace_opts *opts, slapo_trace_state **out) {
  slapo_trace_state *t = slapo_calloc(1, sizeof *t);
  if (!t) return slapo_error(SLAPO_NOMEM, "trace: out of memory");
  t->opts.flatten = opts && opts->flatten;
  if (opts && opts->leaves && !(t->opts.leaves = slapo_strdup(opts->leaves))) {
    slapo_free(t);
    return slapo_error(SLAPO_NOMEM, "trace: out of memory");
  }
  *out = t;
  return SLAPO_OK;
}

slapo_status slapo_module_trace(slapo_module *m, const slapo_trace_opts *opts) {
  char *path = slapo_module_path(m);
  if (!path) return slapo_error(SLAPO_NOMEM, "trace: out of memory");
  const char *shown = path[0] ? path : ".";
  slapo_status s = SLAPO_OK;
  slapo_module *root = root_of(m), *owner = slapo_module_inlined_by(m);
  slapo_trace_state *t = NULL;
  if (m->trace) s = slapo_error(SLAPO_STATE, "trace: %s is already traced", shown);
  else if (owner) {
    char *op = slapo_module_path(owner);
    s = slapo_error(SLAPO_STATE, "trace: %s is inlined into the flattened trace of %s; edit "
                    "that graph instead", shown, op && op[0] ? op : ".");
    slapo_free(op);
  } else if (!root->n_example)
    s = slapo_error(SLAPO_PRECOND, "trace: %s: the model has no example inputs to trace with "
                    "(slapo_module_set_example on its root)", shown);
  else if (opts && opts->leaves && !opts->flatten)
    s = slapo_error(SLAPO_INVALID_ARG, "trace: %s: leaves= applies with flatten=true (without "
                    "it every child is a call_module node)", shown);
  if (s == SLAPO_OK) s = new_trace(opts, &t);
  slapo__capture c = {0};
  if (s == SLAPO_OK) s = capture(root, m, path, &t->opts, &c);
  if (s == SLAPO_OK) s = check_leaves(&c.tracing, path);
  if (s == SLAPO_OK) {
    t->cache[0] = (trace_entry){c.sig_in, c.g};
    t->n_cache = 1;
    t->inlined = c.tracing.inlined, t->n_inlined = c.tracing.n_inlined;
    t->decode_sensitive = c.tracing.decode_sensitive;
    m->trace = t;
    slapo_module_touch(m);
  } else {
    for (int i = 0; i < c.tracing.n_inlined; i++) slapo_free(c.tracing.inlined[i]);
    slapo_free(c.tracing.inlined);
    slapo_graph_free(c.g);
    slapo__trace_free(t);
  }
  slapo_free(path);
  return s;
}

slapo_graph *slapo_module_graph(const slapo_module *m) {
  return m->trace ? m->trace->cache[0].g : NULL;
}

const slapo_trace_opts *slapo_module_trace_options(const slapo_module *m) {
  return m->trace ? &m->trace->opts : NULL;
}

slapo_module *slapo_module_flattened_by(const slapo_module *m) {
  for (const slapo_module *a = m->parent; a; a = a->parent)
    if (a->trace && a->trace->opts.flatten) return (slapo_module *)a;
  return NULL;
}

slapo_module *slapo_module_inlined_by(const slapo_module *m) {
  char rel[1024];
  for (const slapo_module *a = m->parent; a; a = a->parent) {
    if (!a->trace || !a->trace->opts.flatten) continue;
    /* m's path relative to a */
    size_t used = 0;
    const slapo_module *chain[64];
    int k = 0;
    for (const slapo_module *x = m; x != a && k < 64; x = x->parent) chain[k++] = x;
    rel[0] = '\0';
    for (int i = k - 1; i >= 0 && used < sizeof rel; i--)
      used += (size_t)snprintf(rel + used, sizeof rel - used, "%s%s", used ? "." : "",
                               chain[i]->name);
    for (int i = 0; i < a->trace->n_inlined; i++)
      if (!strcmp(a->trace->inlined[i], rel)) return (slapo_module *)a;
  }
  return NULL;
}

slapo_status slapo_module_edit_graph(slapo_module *m, const char *what, slapo_graph_edit_fn fn,
                                     void (*free_ud)(void *), void *ud) {
  slapo_trace_state *t = m->trace;
  char *path = slapo_module_path(m);
  slapo_status s = SLAPO_OK;
  trace_edit *e = NULL;
  if (!path) s = slapo_error(SLAPO_NOMEM, "edit: out of memory");
  else if (!t) s = slapo_error(SLAPO_PRECOND, "%s is not traced; trace it first",
                               path[0] ? path : ".");
  if (s == SLAPO_OK && !(e = slapo_realloc(t->edits, (size_t)(t->n_edits + 1) * sizeof *e)))
    s = slapo_error(SLAPO_NOMEM, "edit: out of memory");
  if (e) t->edits = e;
  char *w = s == SLAPO_OK ? slapo_strdup(what) : NULL;
  if (s == SLAPO_OK && !w) s = slapo_error(SLAPO_NOMEM, "edit: out of memory");
  if (s == SLAPO_OK) s = fn(m, t->cache[0].g, ud);
  if (s == SLAPO_OK && (s = slapo_graph_lint(t->cache[0].g)) != SLAPO_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    /* An edit that broke the graph is undone by rebuilding it without it. */
    slapo_graph *fresh;
    if (retrace(m, path, &t->cache[0].sig, &fresh) == SLAPO_OK) {
      slapo_graph_free(t->cache[0].g);
      t->cache[0].g = fresh;
    }
    s = slapo_error(SLAPO_STATE, "edit %s of %s left a broken graph (undone): %s", what, path,
                    msg);
  }
  if (s != SLAPO_OK) {
    slapo_free(w);
    slapo_free(path);
    return s;
  }
  slapo_graph_renumber(t->cache[0].g);
  t->edits[t->n_edits++] = (trace_edit){w, fn, free_ud, ud};
  for (int i = 1; i < t->n_cache; i++) slapo_graph_free(t->cache[i].g);
  t->n_cache = 1;
  slapo_module_touch(m);
  slapo_free(path);
  return SLAPO_OK;
}

slapo_status slapo_module_infer(slapo_module *mod, const char *path, int n_in,
                                slapo_node *const *in, slapo_value_meta *out, int *n_results) {
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo_module *root = mod;
  while (root->parent) root = root->parent;
  slapo_status s = slapo_module_name_params(root);
  if (s == SLAPO_OK) s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  if (s == SLAPO_OK) s = slapo_ctx_enter_call(ctx, path);
  if (s == SLAPO_OK) {
    slapo_node *ph[16];
    for (int i = 0; i < n_in && i < 16; i++) {
      char name[16];
      snprintf(name, sizeof name, "in%d", i);
      ph[i] = slapo_input(ctx, name, in[i]->dtype, in[i]->ndim, in[i]->shape);
    }
    slapo_node *y = slapo_ctx_status(ctx) == SLAPO_OK
                        ? slapo__forward(ctx, mod, n_in < 16 ? n_in : 16, ph)
                        : NULL;
    s = slapo_ctx_status(ctx);
    if (s == SLAPO_OK && !y) s = slapo_error(SLAPO_STATE, "%s: forward returned no value", path);
    if (s == SLAPO_OK && !metas_of(ctx, y, path, n_results, out)) s = slapo_ctx_status(ctx);
  }
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}
