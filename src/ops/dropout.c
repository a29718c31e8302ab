/* ops/dropout.c - inverted dropout (Srivastava et al. 2014; PyTorch
 * nn.functional.dropout: kept values scaled by 1/(1-p) at training time,
 * identity at eval). Layer: ops.
 * Element i of the contiguous tensor is kept iff
 *   slapo_rng_uniform(seed, stream, step, offset + i) >= p
 * (DESIGN.md §3): a pure function of the keys, so the mask is independent of
 * tiling, threads and the tensor's total size, and the backward (the same op
 * on dy with the same attributes) regenerates it instead of storing it. */
#include <string.h>

#include "ops/internal.h"

static slapo_status dropout_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  double p = slapo_node_attr_float(node, "p", 0.0);
  if (!(p >= 0 && p <= 1))
    return slapo_error(SLAPO_INVALID_ARG, "dropout: p = %g is outside [0, 1]", p);
  int64_t offset = slapo_node_attr_int(node, "offset", 0);
  if (offset < 0)
    return slapo_error(SLAPO_INVALID_ARG, "dropout: offset = %lld; it must be >= 0",
                       (long long)offset);
  return slapo__same_as_input(node, 0);
}

/* The keep decision and scale of one element are computed the same way in
 * both kernels, so they agree bitwise. */
static void dropout_run(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env, bool parallel) {
  const float *x = slapo_tensor_data(in[0]); /* x [N] (any shape, flattened) */
  float *y = slapo_tensor_data(out);         /* y [N] */
  int64_t N = slapo_tensor_numel(in[0]);
  double p = slapo_node_attr_float(node, "p", 0.0);
  if (!env || !env->training || p == 0) {
    memcpy(y, x, (size_t)N * sizeof(float));
    return;
  }
  uint64_t stream = (uint64_t)slapo_node_attr_int(node, "stream", 0);
  /* "offset" is the index of element 0 in the unsharded tensor: a shard that
   * holds elements [offset, offset + N) draws exactly that slice of the
   * unsharded mask (shards of a flattened contiguous tensor only). */
  uint64_t offset = (uint64_t)slapo_node_attr_int(node, "offset", 0);
  float scale = p < 1 ? (float)(1.0 / (1.0 - p)) : 0.0f;
  if (!parallel) {
    for (int64_t i = 0; i < N; i++) {
      float u = slapo_rng_uniform(env->seed, stream, env->step, offset + (uint64_t)i);
      y[i] = (double)u >= p ? x[i] * scale : 0.0f;
    }
    return;
  }
  /* Fast: hash the key once and use all four words of each Philox block
   * (elements 4b..4b+3 of the unsharded tensor), same decisions bit for bit. */
  uint64_t key = slapo_rng_key(env->seed, stream);
  int64_t b0 = (int64_t)(offset >> 2), b1 = (int64_t)((offset + (uint64_t)N - 1) >> 2);
#pragma omp parallel for num_threads(slapo__threads_for(N * 4)) schedule(static)
  for (int64_t b = b0; b <= b1; b++) {
    float u[4];
    slapo_rng_uniform4(key, env->step, (uint64_t)b, u);
    for (int j = 0; j < 4; j++) {
      int64_t i = 4 * b + j - (int64_t)offset;
      if (i >= 0 && i < N) y[i] = (double)u[j] >= p ? x[i] * scale : 0.0f;
    }
  }
}

static void dropout_ref(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  dropout_run(node, in, out, env, false);
}

/* Fast: the same per-element formula over OpenMP threads; each element costs
 * a Philox block, so it is parallel from a small size on (work counted x16). */
static void dropout_fast(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  dropout_run(node, in, out, env, true);
}

static slapo_status dropout_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  /* Same op, same attributes (p, stream, offset): the same mask and scale. */
  dx[0] = need[0] ? slapo__call_like(ctx, node, 1, &dy) : NULL;
  return slapo_ctx_status(ctx);
}

static slapo_node *dropout_example(slapo_ctx *ctx) {
  /* p = 0.3: the mask is a deterministic function of the keys, so finite
   * differences see a fixed linear map. */
  int64_t shape[2] = {3, 5};
  return slapo_dropout(ctx, slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, shape), 0.3);
}

SLAPO_OP_DESCRIPTOR(dropout) = {
    .name = "dropout",
    .n_inputs = 1,
    .infer = dropout_infer,
    .ref = dropout_ref,
    .fast = dropout_fast,
    .backward = dropout_backward,
    .contiguous_inputs = true,
    .random = true,
    .doc = "inverted dropout: element i kept iff uniform(seed, stream, step, offset + i) >= p, "
           "scaled by 1/(1-p); identity when not training or p == 0; attrs p, stream (set by "
           "slapo_op_call), offset (element index of x[0] in the unsharded tensor, default 0)",
    .test = {.example = dropout_example},
};

slapo_node *slapo_dropout(slapo_ctx *ctx, slapo_node *x, double p) {
  slapo_attr a = slapo_attr_float("p", p);
  return slapo__call1(ctx, "dropout", x, 1, &a);
}
