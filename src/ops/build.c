/* ops/build.c - turning op calls into nodes: lookup, arity check, origin
 * stamping, RNG stream keys for random ops, shape inference, sticky errors;
 * plus the shape helpers op files share. Layer: ops. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "ops/internal.h"

/* Error message prefix: the module path when there is one. */
static slapo_node *fail(slapo_ctx *ctx, slapo_status s, const char *msg) {
  const char *o = slapo_ctx_origin(ctx);
  if (o[0]) slapo_ctx_fail(ctx, s, "%s: %s", o, msg);
  else slapo_ctx_fail(ctx, s, "%s", msg);
  return NULL;
}

static bool ready(slapo_ctx *ctx) { return slapo_ctx_status(ctx) == SLAPO_OK; }

/* Whether random op `op` built now takes its shard attributes from its
 * input's tensor-parallel layout (ops/layout.c): elementwise random ops of
 * one input (dropout), in the forward (re-emissions of stored graphs
 * included: the layout at hand decides, not the one at capture). In the
 * backward (recompute included) they copy the forward's, since a
 * gradient's layout is not the value's; pattern graphs have no layouts.
 * Random ops of several inputs (FlashAttention) carry their head range in
 * their own attributes, set by the attention module from its shards. */
static bool derives_shard(const slapo_ctx *ctx, const slapo_op *op) {
  return op->random && op->elementwise && op->n_inputs == 1 && !slapo_ctx_copy_rng(ctx) &&
         !slapo_ctx_shapeless(ctx);
}

/* A random op's attributes into local [24] (*n_use of them): the caller's,
 * plus its stream key, made now, once, from (origin path, call ordinal,
 * random-op index within the call) unless the caller passes one (backward
 * rules, recompute and re-emission copy the forward's; the key lives in the
 * node's "stream" attribute from then on), and, where derives_shard, the
 * shard attributes of x's layout in place of any passed. False (the ctx
 * failed) on a refusal. */
static bool random_attrs(slapo_ctx *ctx, const slapo_op *op, const slapo_node *x, int n_attrs,
                         const slapo_attr *attrs, slapo_attr *local, int *n_use) {
  if (n_attrs > 16) {
    fail(ctx, SLAPO_LIMIT, "random op with more than 16 attributes");
    return false;
  }
  /* A dropout with p = 0 draws nothing: no slice to find, nothing to refuse. */
  bool has = false, derive = derives_shard(ctx, op);
  for (int i = 0; i < n_attrs && derive; i++)
    if (!strcmp(attrs[i].key, "p") && attrs[i].kind == SLAPO_ATTR_FLOAT && attrs[i].f == 0)
      derive = false;
  int n = 0;
  for (int i = 0; i < n_attrs; i++) {
    has |= !strcmp(attrs[i].key, "stream");
    if (!derive || strncmp(attrs[i].key, "shard_", 6)) local[n++] = attrs[i];
  }
  if (!has) {
    int idx = slapo__ctx_next_random(ctx);
    if (idx < 0) {
      fail(ctx, SLAPO_NOMEM, "out of memory");
      return false;
    }
    uint64_t stream = slapo_rng_stream(slapo_ctx_origin(ctx), slapo_ctx_call(ctx), idx);
    local[n++] = slapo_attr_int("stream", (int64_t)stream);
  }
  if (derive) {
    int k;
    slapo_status rs = slapo__rng_shard_attrs(x, op->name, local + n, &k);
    if (rs != SLAPO_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      fail(ctx, rs, msg);
      return false;
    }
    n += k;
  }
  *n_use = n;
  return true;
}

slapo_node *slapo_op_call(slapo_ctx *ctx, const char *name, int n_inputs,
                          slapo_node *const *inputs, int n_attrs, const slapo_attr *attrs) {
  if (!ready(ctx)) return NULL;
  const slapo_op *op = slapo_op_find(name);
  if (!op) {
    char msg[1024];
    snprintf(msg, sizeof msg, "unknown op '%s'", name);
    return fail(ctx, SLAPO_NOT_FOUND, msg);
  }
  return slapo_op_apply(ctx, op, n_inputs, inputs, n_attrs, attrs);
}

slapo_node *slapo_op_apply(slapo_ctx *ctx, const slapo_op *op, int n_inputs,
                           slapo_node *const *inputs, int n_attrs, const slapo_attr *attrs) {
  if (!ready(ctx)) return NULL;
  if (!op) return fail(ctx, SLAPO_INVALID_ARG, "op_apply: no op descriptor");
  const char *name = op->name;
  char msg[1024];
  if (op->n_inputs >= 0 ? n_inputs != op->n_inputs : n_inputs < 1) {
    snprintf(msg, sizeof msg, "%s: expects %s%d inputs, got %d", name,
             op->n_inputs < 0 ? "at least " : "", op->n_inputs < 0 ? 1 : op->n_inputs, n_inputs);
    return fail(ctx, SLAPO_INVALID_ARG, msg);
  }
  for (int i = 0; i < n_inputs; i++) {
    if (!inputs[i]) {
      snprintf(msg, sizeof msg, "%s: input %d is NULL", name, i);
      return fail(ctx, SLAPO_INVALID_ARG, msg);
    }
    if (inputs[i]->kind == SLAPO_NODE_TUPLE) {
      slapo__tuple_misuse(inputs[i], name, i);
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      return fail(ctx, SLAPO_INVALID_ARG, msg);
    }
  }
  int seq = slapo__ctx_next_op_seq(ctx);
  if (seq < 0) return fail(ctx, SLAPO_NOMEM, "out of memory");

  slapo_attr local[24];
  const slapo_attr *use = attrs;
  int n_use = n_attrs;
  if (op->random && !random_attrs(ctx, op, inputs[0], n_attrs, attrs, local, &n_use)) return NULL;
  if (op->random) use = local;

  slapo_graph *g = slapo_ctx_graph(ctx);
  slapo_node *node;
  slapo_status s = slapo_graph_add_call_op(g, name, op, n_inputs, inputs, n_use, use, &node);
  if (s != SLAPO_OK) return fail(ctx, s, slapo_last_error());
  s = slapo_node_set_origin(node, slapo_ctx_origin(ctx), seq);
  node->recompute = slapo_ctx_region(ctx);
  if (s == SLAPO_OK && !slapo_ctx_shapeless(ctx)) s = op->infer(node);
  if (s == SLAPO_OK && !slapo_ctx_shapeless(ctx)) s = slapo_layout_infer(node);
  if (s != SLAPO_OK) {
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    /* The failed node has no users yet: remove it so the graph stays clean. */
    slapo_graph_erase(g, node);
    return fail(ctx, s, msg);
  }
  return node;
}

uint64_t slapo_rng_stream(const char *origin, int call, int index) {
  uint64_t h = slapo_hash_combine(slapo_hash_str(origin), (uint64_t)call);
  return slapo_hash_combine(h, (uint64_t)index) >> 1;
}

slapo_node *slapo_input(slapo_ctx *ctx, const char *name, slapo_dtype dt, int ndim,
                        const int64_t *shape) {
  if (!ready(ctx)) return NULL;
  slapo_node *n;
  slapo_status s = slapo_graph_add_placeholder(slapo_ctx_graph(ctx), name, dt, ndim, shape, &n);
  if (s != SLAPO_OK) return fail(ctx, s, slapo_last_error());
  return n;
}

slapo_node *slapo_param(slapo_ctx *ctx, const char *path, slapo_dtype dt, int ndim,
                        const int64_t *shape) {
  if (!ready(ctx)) return NULL;
  slapo_node *n;
  slapo_status s = slapo_graph_add_param(slapo_ctx_graph(ctx), path, dt, ndim, shape, &n);
  if (s == SLAPO_OK) s = slapo_node_set_origin(n, slapo_ctx_origin(ctx), 0);
  if (s != SLAPO_OK) return fail(ctx, s, slapo_last_error());
  return n;
}

slapo_node *slapo_output(slapo_ctx *ctx, int n, slapo_node *const *values) {
  if (!ready(ctx)) return NULL;
  for (int i = 0; i < n; i++) {
    if (!values[i]) return fail(ctx, SLAPO_INVALID_ARG, "output: value is NULL");
    if (values[i]->kind == SLAPO_NODE_TUPLE) {
      char msg[1024];
      slapo__tuple_misuse(values[i], "output", i);
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      return fail(ctx, SLAPO_INVALID_ARG, msg);
    }
  }
  slapo_node *o;
  slapo_status s = slapo_graph_add_output(slapo_ctx_graph(ctx), n, values, &o);
  if (s != SLAPO_OK) return fail(ctx, s, slapo_last_error());
  return o;
}

slapo_node *slapo__call1(slapo_ctx *ctx, const slapo_op *op, slapo_node *x, int n_attrs,
                         const slapo_attr *attrs) {
  return slapo_op_apply(ctx, op, 1, &x, n_attrs, attrs);
}

slapo_node *slapo__call2(slapo_ctx *ctx, const slapo_op *op, slapo_node *a, slapo_node *b,
                         int n_attrs, const slapo_attr *attrs) {
  slapo_node *in[2] = {a, b};
  return slapo_op_apply(ctx, op, 2, in, n_attrs, attrs);
}

slapo_node *slapo__call_like(slapo_ctx *ctx, const slapo_node *like, int n_inputs,
                             slapo_node *const *inputs) {
  return slapo_op_apply(ctx, like->op, n_inputs, inputs, like->n_attrs, like->attrs);
}

slapo_node *slapo__grad_to(slapo_ctx *ctx, slapo_node *g, const slapo_node *input) {
  if (!g) return NULL;
  if (slapo_shape_equal(g->ndim, g->shape, input->ndim, input->shape)) return g;
  slapo_attr a = slapo_attr_ints("shape", input->ndim, input->shape);
  return slapo__call1(ctx, SLAPO_OP_DESC(sum_to), g, 1, &a);
}

/* ---- shape helpers ---- */

const char *slapo__shape_of(const slapo_node *n) {
  static _Thread_local char bufs[8][128];
  static _Thread_local int next;
  char *b = bufs[next++ & 7];
  return slapo_shape_str(n->ndim, n->shape, b, sizeof bufs[0]);
}

slapo_status slapo__broadcast_shapes(const char *op, int na, const int64_t *a, int nb,
                                     const int64_t *b, int *ndim, int64_t *shape) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - na ? 1 : a[i - (n - na)];
    int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      return slapo_error(SLAPO_SHAPE,
                         "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                         slapo_shape_str(na, a, sa, sizeof sa),
                         slapo_shape_str(nb, b, sb, sizeof sb), i, (long long)da,
                         (long long)db);
    }
    shape[i] = da == 1 ? db : da;
  }
  *ndim = n;
  return SLAPO_OK;
}

slapo_status slapo__want_dtype(const slapo_node *node, int i, slapo_dtype dt) {
  const slapo_node *x = node->inputs[i];
  if (x->dtype != dt)
    return slapo_error(SLAPO_DTYPE, "%s: input %d (%s) has dtype %s, expected %s",
                       node->target, i, x->name, slapo_dtype_name(x->dtype),
                       slapo_dtype_name(dt));
  return SLAPO_OK;
}

slapo_status slapo__want_index(const slapo_node *node, int i) {
  const slapo_node *x = node->inputs[i];
  if (x->dtype != SLAPO_DTYPE_I32 && x->dtype != SLAPO_DTYPE_I64)
    return slapo_error(SLAPO_DTYPE, "%s: input %d (%s) has dtype %s, expected i32 or i64",
                       node->target, i, x->name, slapo_dtype_name(x->dtype));
  return SLAPO_OK;
}

slapo_status slapo__same_as_input(slapo_node *node, int i) {
  const slapo_node *x = node->inputs[i];
  return slapo_node_set_meta(node, x->dtype, x->ndim, x->shape);
}

void slapo__broadcast_strides(int ndim, const int64_t *shape, const slapo_tensor *in,
                              int64_t *strides_out) {
  int off = ndim - in->ndim;
  for (int i = 0; i < ndim; i++) {
    int j = i - off;
    strides_out[i] = (j < 0 || in->shape[j] == 1) ? 0 : in->strides[j];
  }
  (void)shape;
}

int slapo__threads_for(int64_t work) {
  int t = omp_get_max_threads();
  if (work < 32768) return 1;
  return t;
}
