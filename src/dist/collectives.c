/* dist/collectives.c - collectives as graph ops with gradient rules, so
 * autograd, checkpointing (a recompute copy of an all-reduce is one more
 * all-reduce, on every rank alike) and the planner treat them like any op.
 * Every rank builds the same graph and the executor runs nodes in graph
 * order, so collectives meet in the same order on every rank. The block
 * ops work on dim 0, where each rank's block is contiguous; the builders
 * move another axis there with permutes. Layer: dist. */
#include <stdio.h>
#include <string.h>

#include "dist/internal.h"

static slapo_status g_kernel_status = SLAPO_OK;
static char g_kernel_msg[1024];

void slapo__dist_kernel_failed(slapo_status s) {
  if (g_kernel_status != SLAPO_OK) return;
  snprintf(g_kernel_msg, sizeof g_kernel_msg, "%s", slapo_last_error());
  g_kernel_status = s;
}

bool slapo__dist_kernel_ok(void) { return g_kernel_status == SLAPO_OK; }

slapo_status slapo_dist_kernel_status(void) {
  slapo_status s = g_kernel_status;
  if (s == SLAPO_OK) return SLAPO_OK;
  g_kernel_status = SLAPO_OK;
  return slapo_error(s, "%s", g_kernel_msg);
}

int slapo__dist_group_of(const slapo_node *n) {
  return (int)slapo_node_attr_int(n, "group", SLAPO_GROUP_TP);
}

static int group_size(const slapo_node *n) {
  return slapo_dist_size((slapo_group)slapo__dist_group_of(n));
}

/* The communicator a kernel uses, or MPI_COMM_NULL when it must not call
 * MPI (one rank, or an earlier kernel or collective failed: then the
 * output is zeroed). */
static MPI_Comm kernel_comm(const slapo_node *n, slapo_tensor *out) {
  if (group_size(n) == 1) return MPI_COMM_NULL;
  slapo_status s = slapo__dist_usable();
  if (s != SLAPO_OK) slapo__dist_kernel_failed(s);
  if (!slapo__dist_kernel_ok()) {
    memset(slapo_tensor_data(out), 0, slapo_tensor_nbytes(out));
    return MPI_COMM_NULL;
  }
  return slapo__dist_comm(slapo__dist_group_of(n));
}

/* Starts nonblocking collective `call` (its last argument the request) of
 * node n's group and waits for it with the communication timeout; a
 * failure or timeout is recorded for slapo_dist_kernel_status. */
#define KERNEL_MPI(n, call, name)                                                   \
  do {                                                                              \
    MPI_Request req_;                                                               \
    int rc_ = (call);                                                               \
    slapo_status s_ = slapo__dist_wait(rc_, &req_, slapo__dist_group_of(n), name);  \
    if (s_ != SLAPO_OK) slapo__dist_kernel_failed(s_);                              \
  } while (0)

/* ---- shape inference ---- */

static slapo_status check_group(const slapo_node *node) {
  int g = slapo__dist_group_of(node);
  if (g < 0 || g >= SLAPO_GROUP_COUNT)
    return slapo_error(SLAPO_INVALID_ARG, "%s: group %d is not a process group (0 world, 1 "
                       "tensor parallel, 2 data parallel)", node->target, g);
  const slapo_node *x = node->inputs[0];
  if (x->dtype != SLAPO_DTYPE_F32)
    return slapo_error(SLAPO_DTYPE, "%s: x is %s; collectives carry f32", node->target,
                       slapo_dtype_name(x->dtype));
  return SLAPO_OK;
}

static slapo_status infer_same(slapo_node *node) {
  SLAPO_TRY(check_group(node));
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, x->dtype, x->ndim, x->shape);
}

/* dim 0 times `mul` / divided by the group size. */
static slapo_status infer_blocks(slapo_node *node, bool gather) {
  SLAPO_TRY(check_group(node));
  const slapo_node *x = node->inputs[0];
  int n = group_size(node);
  if (x->ndim < 1)
    return slapo_error(SLAPO_SHAPE, "%s: x is a scalar; it needs a dim 0 to split", node->target);
  int64_t shape[SLAPO_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  if (gather) {
    shape[0] *= n;
  } else {
    if (shape[0] % n)
      return slapo_error(SLAPO_SHAPE, "%s: dim 0 of x (%lld) is not divisible by the group "
                         "size %d", node->target, (long long)shape[0], n);
    shape[0] /= n;
  }
  return slapo_node_set_meta(node, x->dtype, x->ndim, shape);
}

static slapo_status infer_gather(slapo_node *node) { return infer_blocks(node, true); }
static slapo_status infer_split(slapo_node *node) { return infer_blocks(node, false); }

/* ---- kernels ---- */

static void copy_in(const slapo_tensor *in, slapo_tensor *out) {
  memcpy(slapo_tensor_data(out), slapo_tensor_data(in), slapo_tensor_nbytes(out));
}

static int count_of(const slapo_tensor *t) { return (int)slapo_tensor_numel(t); }

static void all_reduce_kernel(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  copy_in(in[0], out);
  MPI_Comm c = kernel_comm(node, out);
  if (c != MPI_COMM_NULL)
    KERNEL_MPI(node, MPI_Iallreduce(MPI_IN_PLACE, slapo_tensor_data(out), count_of(out),
                                    MPI_FLOAT, MPI_SUM, c, &req_),
               "MPI_Iallreduce (all_reduce kernel)");
}

static void copy_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)node, (void)env;
  copy_in(in[0], out);
}

static void all_gather_kernel(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  MPI_Comm c = kernel_comm(node, out);
  if (group_size(node) == 1) copy_in(in[0], out);
  if (c != MPI_COMM_NULL)
    KERNEL_MPI(node, MPI_Iallgather(slapo_tensor_data(in[0]), count_of(in[0]), MPI_FLOAT,
                                    slapo_tensor_data(out), count_of(in[0]), MPI_FLOAT, c, &req_),
               "MPI_Iallgather (all_gather kernel)");
}

static void reduce_scatter_kernel(const slapo_node *node, const slapo_tensor *const *in,
                                  slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  MPI_Comm c = kernel_comm(node, out);
  if (group_size(node) == 1) copy_in(in[0], out);
  if (c != MPI_COMM_NULL)
    KERNEL_MPI(node, MPI_Ireduce_scatter_block(slapo_tensor_data(in[0]), slapo_tensor_data(out),
                                               count_of(out), MPI_FLOAT, MPI_SUM, c, &req_),
               "MPI_Ireduce_scatter_block (reduce_scatter kernel)");
}

static void scatter_kernel(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  int r = slapo_dist_rank((slapo_group)slapo__dist_group_of(node));
  const float *x = slapo_tensor_data(in[0]);
  memcpy(slapo_tensor_data(out), x + (size_t)r * (size_t)slapo_tensor_numel(out),
         slapo_tensor_nbytes(out));
}

/* ---- gradient rules ---- */

static slapo_node *collective(slapo_ctx *ctx, const slapo_op *op, slapo_node *x, int group,
                              int reduce) {
  slapo_attr a[2] = {slapo_attr_int("group", group), slapo_attr_int("reduce", reduce)};
  return slapo_op_apply(ctx, op, 1, &x, op == &slapo_dist_op_all_gather ? 2 : 1, a);
}

static slapo_status identity_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                      const bool *need, slapo_node **dx) {
  (void)node;
  if (need[0]) dx[0] = dy;
  return slapo_ctx_status(ctx);
}

static slapo_status reduce_grad_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                         const bool *need, slapo_node **dx) {
  if (need[0])
    dx[0] = collective(ctx, &slapo_dist_op_all_reduce, dy, slapo__dist_group_of(node), 0);
  return slapo_ctx_status(ctx);
}

static slapo_status all_gather_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                        const bool *need, slapo_node **dx) {
  if (!need[0]) return slapo_ctx_status(ctx);
  bool reduce = slapo_node_attr_int(node, "reduce", 1) != 0;
  dx[0] = collective(ctx, reduce ? &slapo_dist_op_reduce_scatter : &slapo_dist_op_scatter, dy,
                     slapo__dist_group_of(node), 0);
  return slapo_ctx_status(ctx);
}

static slapo_status gather_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  if (need[0])
    dx[0] = collective(ctx, &slapo_dist_op_all_gather, dy, slapo__dist_group_of(node), 0);
  return slapo_ctx_status(ctx);
}

/* ---- examples for the op tests (any group size: dim 0 is a multiple) ---- */

static slapo_node *example(slapo_ctx *ctx, const slapo_op *op) {
  int64_t s[2] = {2 * slapo_dist_size(SLAPO_GROUP_WORLD), 3};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  return collective(ctx, op, x, SLAPO_GROUP_WORLD, 1);
}
static slapo_node *ex_all_reduce(slapo_ctx *c) { return example(c, &slapo_dist_op_all_reduce); }
static slapo_node *ex_reduce_grad(slapo_ctx *c) { return example(c, &slapo_dist_op_reduce_grad); }
static slapo_node *ex_all_gather(slapo_ctx *c) { return example(c, &slapo_dist_op_all_gather); }
static slapo_node *ex_reduce_scatter(slapo_ctx *c) {
  return example(c, &slapo_dist_op_reduce_scatter);
}
static slapo_node *ex_scatter(slapo_ctx *c) { return example(c, &slapo_dist_op_scatter); }

/* Tensor-parallel layouts (ops/layout.c): a sum or a gather over the group
 * is the same on every rank; reduce_grad is the identity forward; a
 * rank's block of a scatter is not followed (UNKNOWN: no random op on it). */
static slapo_status layout_replicated(slapo_node *node) {
  node->layout = (slapo_layout){.kind = SLAPO_LAYOUT_REPLICATED};
  return SLAPO_OK;
}
static slapo_status layout_same(slapo_node *node) {
  node->layout = node->inputs[0]->layout;
  return SLAPO_OK;
}
static slapo_status layout_block(slapo_node *node) {
  node->layout = (slapo_layout){.kind = SLAPO_LAYOUT_UNKNOWN};
  return SLAPO_OK;
}

#define COLLECTIVE(id, infer_fn, kernel, rule, layout_fn, ex, text)             \
  const slapo_op slapo_dist_op_##id = {                                         \
      .name = #id, .n_inputs = 1, .infer = infer_fn, .ref = kernel,             \
      .backward = rule, .layout = layout_fn, .contiguous_inputs = true,         \
      .doc = text, .test = {.example = ex}}

COLLECTIVE(all_reduce, infer_same, all_reduce_kernel, identity_backward, layout_replicated,
           ex_all_reduce,
           "y = sum over the ranks of `group` of x (MPI_Allreduce); dx = dy, the sum being "
           "replicated (Megatron-LM's g)");
COLLECTIVE(reduce_grad, infer_same, copy_kernel, reduce_grad_backward, layout_same,
           ex_reduce_grad,
           "y = x; dx = sum over the ranks of `group` of dy (Megatron-LM's f: the input of a "
           "column-parallel region)");
COLLECTIVE(all_gather, infer_gather, all_gather_kernel, all_gather_backward, layout_replicated,
           ex_all_gather,
           "y = every rank's x concatenated along dim 0 in rank order (MPI_Allgather); dx = "
           "own block of the summed dy (reduce=1) or of dy (reduce=0)");
COLLECTIVE(reduce_scatter, infer_split, reduce_scatter_kernel, gather_backward, layout_block,
           ex_reduce_scatter,
           "y = this rank's dim-0 block of the sum over the ranks of x "
           "(MPI_Reduce_scatter_block); dx = all_gather(dy)");
COLLECTIVE(scatter, infer_split, scatter_kernel, gather_backward, layout_block, ex_scatter,
           "y = this rank's dim-0 block of a replicated x; dx = all_gather(dy)");

slapo_status slapo_dist_register_ops(void) {
  const slapo_op *ops[] = {&slapo_dist_op_all_reduce,     &slapo_dist_op_reduce_grad,
                           &slapo_dist_op_all_gather,     &slapo_dist_op_reduce_scatter,
                           &slapo_dist_op_scatter,
                           &slapo_dist_op_vocab_parallel_cross_entropy,
                           &slapo_dist_op_vocab_parallel_cross_entropy_backward};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    if (slapo_op_find(ops[i]->name) == ops[i]) continue;
    SLAPO_TRY(slapo_op_register(ops[i]));
  }
  return SLAPO_OK;
}

/* ---- builders ---- */

slapo_node *slapo_dist_all_reduce(slapo_ctx *ctx, slapo_node *x, slapo_group g) {
  return collective(ctx, &slapo_dist_op_all_reduce, x, g, 0);
}

slapo_node *slapo_dist_reduce_grad(slapo_ctx *ctx, slapo_node *x, slapo_group g) {
  return collective(ctx, &slapo_dist_op_reduce_grad, x, g, 0);
}

/* Applies a dim-0 block op to x along `axis`: axis moved to the front (a
 * permute, unless every dim before it is 1 so the blocks are contiguous
 * already), the op, and back. */
static slapo_node *along(slapo_ctx *ctx, const slapo_op *op, slapo_node *x, int axis, int reduce,
                         slapo_group g) {
  if (!x || slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  int nd = x->ndim;
  if (axis < 0) axis += nd;
  if (axis < 0 || axis >= nd) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: axis %d is outside a %d-d value", op->name,
                   axis, nd);
    return NULL;
  }
  bool leading_ones = true;
  for (int i = 0; i < axis; i++) leading_ones &= x->shape[i] == 1;
  if (leading_ones) {
    int64_t s[SLAPO_MAX_DIMS];
    memcpy(s, x->shape + axis, sizeof(int64_t) * (size_t)(nd - axis));
    slapo_node *y = collective(ctx, op, slapo_reshape(ctx, x, nd - axis, s), g, reduce);
    if (!y) return NULL;
    int64_t out[SLAPO_MAX_DIMS];
    memcpy(out, x->shape, sizeof(int64_t) * (size_t)nd);
    out[axis] = y->shape[0];
    return slapo_reshape(ctx, y, nd, out);
  }
  int64_t perm[SLAPO_MAX_DIMS], inv[SLAPO_MAX_DIMS];
  perm[0] = axis;
  for (int i = 0, k = 1; i < nd; i++)
    if (i != axis) perm[k++] = i;
  for (int i = 0; i < nd; i++) inv[perm[i]] = i;
  slapo_node *y = collective(ctx, op, slapo_permute(ctx, x, nd, perm), g, reduce);
  return slapo_permute(ctx, y, nd, inv);
}

slapo_node *slapo_dist_all_gather(slapo_ctx *ctx, slapo_node *x, int axis, bool reduce_grad,
                                  slapo_group g) {
  return along(ctx, &slapo_dist_op_all_gather, x, axis, reduce_grad, g);
}

slapo_node *slapo_dist_reduce_scatter(slapo_ctx *ctx, slapo_node *x, int axis, slapo_group g) {
  return along(ctx, &slapo_dist_op_reduce_scatter, x, axis, 0, g);
}

slapo_node *slapo_dist_scatter(slapo_ctx *ctx, slapo_node *x, int axis, slapo_group g) {
  return along(ctx, &slapo_dist_op_scatter, x, axis, 0, g);
}
