/* primitives/sync.c - the `sync` primitive: a collective at a module's
 * boundary, so sharded modules compute what the unsharded model computes
 * (Megatron-LM's f and g operators, Shoeybi et al. 2019). Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help sync` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"
#include "slapo/dist.h"

enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_SCATTER, OP_REDUCE_GRAD };
static const char *const k_ops[] = {"all_reduce", "all_gather", "reduce_scatter", "scatter",
                                    NULL};
static const char *const k_groups[] = {"world", "tp", "dp", NULL};

/* args: op, axis, reduce_grad, group */
static slapo_node *emit(slapo_ctx *ctx, slapo_node *x, const int64_t *a) {
  slapo_group g = (slapo_group)a[3];
  switch ((int)a[0]) {
  case OP_ALL_REDUCE: return slapo_dist_all_reduce(ctx, x, g);
  case OP_ALL_GATHER: return slapo_dist_all_gather(ctx, x, (int)a[1], a[2] != 0, g);
  case OP_REDUCE_SCATTER: return slapo_dist_reduce_scatter(ctx, x, (int)a[1], g);
  case OP_SCATTER: return slapo_dist_scatter(ctx, x, (int)a[1], g);
  default: return slapo_dist_reduce_grad(ctx, x, g);
  }
}

/* ---- SyncedLinear: x W^T, the collective, + b ---- */

static slapo_node *sl_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: SyncedLinear expects 1 input, got %d",
                   slapo_ctx_origin(ctx), n_in);
    return NULL;
  }
  slapo_node *y = slapo_linear(ctx, in[0], slapo_weight(ctx, self, "weight"), NULL);
  y = emit(ctx, y, self->config);
  return slapo_add(ctx, y, slapo_weight(ctx, self, "bias"));
}

static void sl_describe(const slapo_module *self, char *buf, size_t cap) {
  const slapo_parameter *w = slapo_module_param(self, "weight");
  const int64_t *a = self->config;
  snprintf(buf, cap, "in_features=%lld, out_features=%lld, bias=True, sync=%s",
           (long long)w->value->shape[1], (long long)w->value->shape[0], k_ops[a[0]]);
}

static const slapo_module_type k_synced = {"SyncedLinear", sl_forward, sl_describe, NULL, NULL};

/* ---- what a module's shards produce ---- */

/* OUT_WHOLE: a Linear or Embedding whose weight is not sharded computes
 * its whole output on every rank. */
typedef enum { OUT_UNKNOWN, OUT_SPLIT_LAST, OUT_PARTIAL, OUT_WHOLE } out_kind;

static bool is_linear(const slapo_module *m) {
  return !strcmp(m->type->name, "Linear") || !strcmp(m->type->name, "DecomposedLinear");
}

static out_kind output_kind(const slapo_module *m) {
  const slapo_parameter *w = slapo_module_param(m, "weight");
  /* From the shard's axis, whatever the group size: a schedule means the
   * same (and is refused the same) on one process as on many. */
  bool known = is_linear(m) || !strcmp(m->type->name, "Embedding");
  if (!w || !w->shard) return w && known ? OUT_WHOLE : OUT_UNKNOWN;
  if (is_linear(m)) return w->shard->axis == 0 ? OUT_SPLIT_LAST : OUT_PARTIAL;
  if (!strcmp(m->type->name, "Embedding"))
    return w->shard->axis == 0 ? OUT_PARTIAL : OUT_SPLIT_LAST;
  return OUT_UNKNOWN;
}

static int word_index(const char *const *words, const char *w) {
  for (int i = 0; words[i]; i++)
    if (!strcmp(words[i], w)) return i;
  return -1;
}

/* Refuses a fwd_post collective that does not fit the output. */
static slapo_status check_fit(const char *path, const slapo_module *m, int op, int axis) {
  out_kind k = output_kind(m);
  const char *split = "is split along its last axis (weight sharded on axis %d)";
  const char *partial = "holds partial sums (weight sharded on axis %d)";
  if (k == OUT_WHOLE && op != OP_SCATTER)
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's weight is not sharded, so every rank "
                       "computes its whole output; %s would %s the ranks' copies: shard the "
                       "weight first (a shard line before this one)", path, m->type->name,
                       k_ops[op], op == OP_ALL_GATHER ? "concatenate" : "add");
  int wa = k == OUT_SPLIT_LAST || k == OUT_PARTIAL ? slapo_module_param(m, "weight")->shard->axis
                                                   : 0;
  char what[128];
  snprintf(what, sizeof what, k == OUT_PARTIAL ? partial : split, wa);
  if (k == OUT_SPLIT_LAST && (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER))
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's output %s; %s would add different "
                       "features: use 'sync fwd_post all_gather axis=-1'", path, m->type->name,
                       what, k_ops[op]);
  if (k == OUT_SPLIT_LAST && op == OP_ALL_GATHER && axis != -1)
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's output %s: gather it with axis=-1, "
                       "not axis=%d", path, m->type->name, what, axis);
  if (k == OUT_PARTIAL && op == OP_ALL_GATHER)
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's output %s; all_gather would "
                       "concatenate them: use 'sync fwd_post all_reduce' (or reduce_scatter)",
                       path, m->type->name, what);
  if ((k == OUT_SPLIT_LAST || k == OUT_PARTIAL) && op == OP_SCATTER)
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's output %s already; scatter splits a "
                       "replicated value", path, m->type->name, what);
  return SLAPO_OK;
}

/* A row-parallel Linear with a bias becomes a SyncedLinear (same params). */
static slapo_status make_synced(slapo_module *m, const int64_t *args, slapo_module **out) {
  int64_t *cfg = slapo_malloc(sizeof(int64_t) * 4);
  if (!cfg) return slapo_error(SLAPO_NOMEM, "sync: out of memory");
  memcpy(cfg, args, sizeof(int64_t) * 4);
  SLAPO_TRY(slapo_module_new(&k_synced, cfg, out));
  slapo_status s = slapo_module_tie_param(*out, "weight", slapo_module_param(m, "weight"));
  if (s == SLAPO_OK) s = slapo_module_tie_param(*out, "bias", slapo_module_param(m, "bias"));
  if (s != SLAPO_OK) slapo_module_free(*out), *out = NULL;
  return s;
}

static slapo_status sync_pattern(slapo_sched *node, const slapo_pattern *p, int op, int axis,
                                 bool reduce, int group, const slapo_sched_arg *args, int na,
                                 const slapo_sched_entry *from);

static slapo_status sync_impl(slapo_sched *node, const char *mode, const char *op_name,
                              int axis, bool reduce, int group, const slapo_pattern *pat,
                              const slapo_sched_entry *from) {
  const char *path = slapo__prim_path(node);
  slapo_module *m = slapo_sched_module(node);
  int where = !strcmp(mode, "fwd_pre") ? 0 : !strcmp(mode, "fwd_post") ? 1
              : !strcmp(mode, "bwd_post") ? 2 : -1;
  int op = word_index(k_ops, op_name);
  if (where < 0)
    return slapo_error(SLAPO_INVALID_ARG, "sync: %s: unknown mode '%s' (known: fwd_pre, "
                       "fwd_post, bwd_post)", path, mode);
  if (op < 0)
    return slapo_error(SLAPO_INVALID_ARG, "sync: %s: unknown collective '%s' (known: "
                       "all_reduce, all_gather, reduce_scatter, scatter)", path, op_name);
  if (where == 2 && op != OP_ALL_REDUCE)
    return slapo_error(SLAPO_INVALID_ARG, "sync: %s: bwd_post takes all_reduce (the input's "
                       "gradient summed over the group), not %s", path, op_name);
  if (where == 0 && op != OP_ALL_GATHER && op != OP_SCATTER)
    return slapo_error(SLAPO_INVALID_ARG, "sync: %s: fwd_pre takes all_gather or scatter, not "
                       "%s (bwd_post all_reduce sums the input's gradient)", path, op_name);
  slapo_sched_arg args[6] = {slapo_sched_arg_word(NULL, mode), slapo_sched_arg_word(NULL, op_name)};
  int na = 2;
  if (op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER || op == OP_SCATTER)
    args[na++] = slapo_sched_arg_int("axis", axis);
  if (op == OP_ALL_GATHER && !reduce) args[na++] = slapo_sched_arg_bool("reduce", false);
  if (group != SLAPO_GROUP_TP) args[na++] = slapo_sched_arg_word("group", k_groups[group]);
  if (pat) {
    if (where != 1)
      return slapo_error(SLAPO_INVALID_ARG, "sync: %s: pattern= puts a collective after the "
                         "matched value: use fwd_post", path);
    return sync_pattern(node, pat, op, axis, reduce, group, args, na, from);
  }
  if (!slapo_sched_parent(node))
    return slapo_error(SLAPO_INVALID_ARG, "sync: the root's inputs and output are the batch; "
                       "sync a submodule");
  SLAPO_TRY(slapo__prim_not_inlined(node, "sync"));
  if (where == 1) SLAPO_TRY(check_fit(path, m, op, axis));
  if (where == 2 && output_kind(m) == OUT_WHOLE)
    return slapo_error(SLAPO_PRECOND, "sync: %s: the %s's weight is not sharded, so every rank "
                       "computes its input's whole gradient; bwd_post all_reduce would add the "
                       "ranks' copies: shard the weight first (a shard line before this one)",
                       path, m->type->name);
  SLAPO_TRY(slapo__prim_log_check(node, "sync", na, args));
  slapo_module_sync s = {where == 1 ? SLAPO_SYNC_OUTPUT : SLAPO_SYNC_INPUT, emit,
                         {where == 2 ? OP_REDUCE_GRAD : op, axis, reduce, group}};
  if (where == 1 && output_kind(m) == OUT_PARTIAL && is_linear(m) &&
      slapo_module_param(m, "bias")) {
    slapo_module *synced;
    SLAPO_TRY(make_synced(m, s.args, &synced));
    SLAPO_TRY(slapo__prim_swap(node, synced));
  } else {
    SLAPO_TRY(slapo_module_add_sync(m, &s));
    slapo_module_touch(m);
  }
  return slapo__prim_log(node, "sync", na, args, from, true);
}

/* ---- sync on a value inside a traced graph (pattern=) ---- */

/* What a matched value's shards produce: from the first sharded 2-d
 * parameter the match reads (a weight bound to a placeholder, or one the
 * region holds). */
static out_kind region_kind(const slapo_module *owner, const slapo_match *ms,
                            const slapo_module *region, int *axis) {
  const slapo_parameter *w = NULL;
  for (int i = 0; i < ms->n_inputs && !w; i++) {
    const slapo_match_value *v = &ms->inputs[i];
    const char *rel = v->node && v->node->kind == SLAPO_NODE_PARAM ? v->node->target : v->param;
    const slapo_parameter *p = rel ? slapo_module_param_at(owner, rel) : NULL;
    if (p && p->shard && p->value->ndim == 2) w = p;
  }
  for (int i = 0; i < region->n_params && !w; i++)
    if (region->params[i]->shard && region->params[i]->value->ndim == 2) w = region->params[i];
  if (!w) return OUT_UNKNOWN;
  *axis = w->shard->axis;
  return w->shard->axis == 0 ? OUT_SPLIT_LAST : OUT_PARTIAL;
}

typedef struct sync_req {
  slapo__fuse_req fuse; /* the region, re-emitted (compiler none) */
  slapo_module_sync sync;
  const char *path;
} sync_req;

/* Each match becomes a child re-emitting the matched ops (the `none`
 * compiler's Fused module), with the collective as its output sync. */
static slapo_status sync_factory(void *ud, slapo_module *owner, int n, const slapo_match *ms,
                                 slapo_module **out) {
  sync_req *rq = ud;
  SLAPO_TRY(slapo__fuse_factory(&rq->fuse, owner, n, ms, out));
  int wa = 0;
  out_kind k = region_kind(owner, &ms[0], *out, &wa);
  int op = (int)rq->sync.args[0];
  slapo_status s = SLAPO_OK;
  if (k == OUT_SPLIT_LAST && (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER))
    s = slapo_error(SLAPO_PRECOND, "sync: %s: the matched value is split along its last axis "
                    "(weight sharded on axis %d); %s would add different features: use "
                    "all_gather axis=-1", rq->path, wa, k_ops[op]);
  else if (k == OUT_PARTIAL && op == OP_ALL_GATHER)
    s = slapo_error(SLAPO_PRECOND, "sync: %s: the matched value holds partial sums (weight "
                    "sharded on axis %d); all_gather would concatenate them: use all_reduce",
                    rq->path, wa);
  if (s == SLAPO_OK) s = slapo_module_add_sync(*out, &rq->sync);
  if (s != SLAPO_OK) slapo_module_free(*out), *out = NULL;
  return s;
}

static slapo_status sync_pattern(slapo_sched *node, const slapo_pattern *p, int op, int axis,
                                 bool reduce, int group, const slapo_sched_arg *args, int na,
                                 const slapo_sched_entry *from) {
  sync_req rq = {{slapo_compiler_find("none"), "Synced", NULL},
                 {SLAPO_SYNC_OUTPUT, emit, {op, axis, reduce, group}},
                 slapo__prim_path(node)};
  if (!rq.fuse.compiler) return slapo_error(SLAPO_STATE, "sync: the none compiler is missing");
  slapo_sched_arg all[8];
  int n = 0;
  bool replayable;
  for (int i = 0; i < na && n < 7; i++) all[n++] = args[i];
  all[n++] = slapo__pattern_arg(p, &replayable);
  slapo__subgraph_spec sp = {.primitive = "sync", .child = "Synced",
                             .factory = {sync_factory, &rq}, .args = all, .n_args = n,
                             .replayable = replayable, .from = from};
  return slapo__subgraph_apply(node, p, &sp);
}

slapo_status slapo_sync(slapo_sched *node, const char *mode, const char *op, int axis,
                        bool reduce_grad) {
  if (!mode || !op) return slapo_error(SLAPO_INVALID_ARG, "sync: mode and op must not be NULL");
  return sync_impl(node, mode, op, axis, reduce_grad, SLAPO_GROUP_TP, NULL, NULL);
}

slapo_status slapo_sync_pattern(slapo_sched *node, const slapo_pattern *p, const char *op,
                                int axis, bool reduce_grad) {
  if (!p || !op) return slapo_error(SLAPO_INVALID_ARG, "sync: pattern and op must not be NULL");
  return sync_impl(node, "fwd_post", op, axis, reduce_grad, SLAPO_GROUP_TP, p, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"axis", "reduce", "group",
                                                                   "pattern", NULL}, 2));
  const slapo_sched_arg *mode = slapo_sched_entry_positional(e, 0);
  const slapo_sched_arg *op = slapo_sched_entry_positional(e, 1);
  if (!mode || !op || mode->kind != SLAPO_SCHED_ARG_WORD || op->kind != SLAPO_SCHED_ARG_WORD)
    return slapo_error(SLAPO_INVALID_ARG, "sync: expected a mode and a collective, e.g. 'sync "
                       "fwd_post all_reduce'");
  int64_t axis = -1;
  bool reduce = true;
  const char *group = "tp";
  SLAPO_TRY(slapo_sched_entry_get_int(e, "axis", false, &axis));
  SLAPO_TRY(slapo_sched_entry_get_bool(e, "reduce", false, &reduce));
  SLAPO_TRY(slapo_sched_entry_get_string(e, "group", false, &group));
  int g = word_index(k_groups, group);
  if (g < 0)
    return slapo_error(SLAPO_INVALID_ARG, "sync: group=%s: expected tp, dp or world", group);
  const slapo_pattern *p;
  bool owned;
  SLAPO_TRY(slapo__prim_pattern(e, "sync", &p, &owned));
  slapo_status s = sync_impl(node, mode->text, op->text, (int)axis, reduce, g, p, e);
  if (owned) slapo_pattern_free((slapo_pattern *)p);
  return s;
}

SLAPO_PRIMITIVE_DESCRIPTOR(sync) = {
    .name = "sync",
    .summary = "insert a collective at a module's forward input/output or backward",
    .doc = "sync fwd_pre|fwd_post|bwd_post all_reduce|all_gather|reduce_scatter|scatter\n"
           "     [axis=A] [reduce=false] [group=tp|dp|world] [pattern=P]\n"
           "  C: slapo_sync(node, \"fwd_post\", \"all_reduce\", -1, true)\n"
           "  Applies to any module but the root that is not inlined into an\n"
           "  ancestor's flattened trace (a module call in it, such as a Linear, is fine).\n"
           "  Effect: fwd_post all_reduce sums a row-parallel Linear's partial outputs\n"
           "  (its bias is then added once: the module becomes a SyncedLinear); fwd_post\n"
           "  all_gather axis=-1 joins a column-parallel output; bwd_post all_reduce\n"
           "  sums the input's gradient (input of a column-parallel region); fwd_pre\n"
           "  all_gather / scatter for sequence parallelism. pattern=P (fwd_post, on a\n"
           "  traced module): the collective after each match's value inside the graph.\n"
           "  Fails: INVALID_ARG for an unknown mode or collective; PRECOND when the\n"
           "  collective does not fit what the shards produce (the message says which\n"
           "  one does); STATE when inlined into a flattened trace (sync before it).\n"
           "  Verified: across ranks, within tolerance.\n",
    .bitwise = false,
    .apply = apply,
};
