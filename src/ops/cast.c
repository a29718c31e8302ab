/* ops/cast.c - the casts autocast inserts around GEMMs (slapo_ctx_set_autocast):
 * - to_bf16: x f32 -> bf16, rounded to nearest even (slapo_f32_to_bf16_n);
 *   its gradient is dy itself, in f32 (straight through: a bf16 value's
 *   gradient is f32, as autocast accumulates every gradient in f32).
 * - round_bf16_dy: the identity on x f32, whose gradient is dy rounded
 *   through bf16: where a bf16 GEMM's backward casts dy, the emulated
 *   (f32) form of the same GEMM rounds it here.
 * Plus the two helpers the GEMM ops share: which operand dtypes a GEMM
 * takes, and dy as the backward GEMMs read it. Layer: ops. */
#include <string.h>

#include "ops/internal.h"

static slapo_status to_bf16_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, SLAPO_DTYPE_BF16, x->ndim, x->shape);
}

static void to_bf16_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *x = slapo_tensor_data(in[0]);
  uint16_t *y = slapo_tensor_data(out);
  int64_t n = slapo_tensor_numel(out);
  for (int64_t i = 0; i < n; i++) y[i] = slapo_f32_to_bf16(x[i]);
}

/* Blocks of 16 Ki elements per thread: memory-bound, so only large casts
 * (weights, activations) are split. */
#define BLOCK 16384

static void to_bf16_fast(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *x = slapo_tensor_data(in[0]);
  uint16_t *y = slapo_tensor_data(out);
  int64_t n = slapo_tensor_numel(out), nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(slapo__threads_for(n)) schedule(static)
  for (int64_t b = 0; b < nb; b++) {
    int64_t lo = b * BLOCK, len = n - lo < BLOCK ? n - lo : BLOCK;
    slapo_f32_to_bf16_n(x + lo, y + lo, len);
  }
}

static slapo_status straight_through(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  (void)node;
  if (need[0]) dx[0] = dy;
  return slapo_ctx_status(ctx);
}

static slapo_node *example_x(slapo_ctx *ctx) {
  return slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
}

static slapo_node *to_bf16_example(slapo_ctx *ctx) { return slapo_to_bf16(ctx, example_x(ctx)); }

SLAPO_OP_DESCRIPTOR(to_bf16) = {
    .name = "to_bf16",
    .n_inputs = 1,
    .infer = to_bf16_infer,
    .ref = to_bf16_ref,
    .fast = to_bf16_fast,
    .backward = straight_through,
    .contiguous_inputs = true,
    .doc = "x f32 -> bf16, round to nearest even (x.to(torch.bfloat16)); gradient dy in f32 "
           "(straight through)",
    .test = {.example = to_bf16_example,
             .exempt = "piecewise constant with a bf16 output: central differences see 0 or "
                       "a jump; the rounding is checked over all 2^32 inputs by "
                       "tests/unit/test_bf16_convert.c and the gradient by "
                       "tests/unit/test_autocast.c"},
};

slapo_node *slapo_to_bf16(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(to_bf16), x, 0, NULL);
}

/* ---- round_bf16_dy ---- */

static slapo_status round_bf16_dy_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  return slapo__same_as_input(node, 0);
}

static void copy_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)node, (void)env;
  memcpy(slapo_tensor_data(out), slapo_tensor_data(in[0]),
         (size_t)slapo_tensor_numel(out) * sizeof(float));
}

static slapo_status round_bf16_dy_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                           const bool *need, slapo_node **dx) {
  (void)node;
  if (need[0]) dx[0] = slapo__call1(ctx, SLAPO_OP_DESC(round_bf16), dy, 0, NULL);
  return slapo_ctx_status(ctx);
}

static slapo_node *round_bf16_dy_example(slapo_ctx *ctx) {
  return slapo__call1(ctx, SLAPO_OP_DESC(round_bf16_dy), example_x(ctx), 0, NULL);
}

SLAPO_OP_DESCRIPTOR(round_bf16_dy) = {
    .name = "round_bf16_dy",
    .n_inputs = 1,
    .infer = round_bf16_dy_infer,
    .ref = copy_kernel,
    .backward = round_bf16_dy_backward,
    .contiguous_inputs = true,
    .doc = "x unchanged; its gradient is dy rounded through bf16 (the emulated form of a bf16 "
           "GEMM's backward reading dy in bf16)",
    .test = {.example = round_bf16_dy_example,
             .exempt = "its gradient rounds dy on purpose, which central differences cannot "
                       "see; checked by tests/unit/test_autocast.c"},
};

/* ---- shared by the GEMM ops ---- */

slapo_status slapo__want_gemm_operands(const slapo_node *node) {
  const slapo_node *a = node->inputs[0], *b = node->inputs[1];
  bool fa = a->dtype == SLAPO_DTYPE_F32, fb = b->dtype == SLAPO_DTYPE_F32;
  bool ha = a->dtype == SLAPO_DTYPE_BF16, hb = b->dtype == SLAPO_DTYPE_BF16;
  if ((fa && fb) || (ha && hb)) return SLAPO_OK;
  return slapo_error(SLAPO_DTYPE,
                     "%s: operands %s (%s) and %s (%s): a GEMM or convolution takes two f32 or two bf16 "
                     "operands (bf16 ones accumulate and write f32); cast with to_bf16, or "
                     "let autocast do it",
                     node->target, a->name, slapo_dtype_name(a->dtype), b->name,
                     slapo_dtype_name(b->dtype));
}

slapo_node *slapo__gemm_recast(slapo_ctx *ctx, slapo_node *x) {
  if (x->op != SLAPO_OP_DESC(to_bf16) || x->inputs[0]->kind != SLAPO_NODE_PARAM) return x;
  return slapo_to_bf16(ctx, x->inputs[0]);
}

slapo_node *slapo__gemm_grad_operand(slapo_ctx *ctx, const slapo_node *node, slapo_node *dy) {
  return node->inputs[0]->dtype == SLAPO_DTYPE_BF16 ? slapo_to_bf16(ctx, dy) : dy;
}

slapo_node *slapo__autocast_operand(slapo_ctx *ctx, slapo_node *x) {
  slapo_autocast ac = slapo_ctx_autocast(ctx);
  if (ac == SLAPO_AUTOCAST_OFF || !x || x->dtype != SLAPO_DTYPE_F32) return x;
  const slapo_op *op =
      ac == SLAPO_AUTOCAST_BF16 ? SLAPO_OP_DESC(to_bf16) : SLAPO_OP_DESC(round_bf16);
  /* A weight read by several GEMMs (tied, or q/k/v of one input) is cast
   * once; within one checkpoint region, so a region's recompute redoes its
   * own casts. */
  for (int i = 0; i < x->n_users; i++)
    if (x->users[i]->op == op && x->users[i]->recompute == slapo_ctx_region(ctx))
      return x->users[i];
  return slapo__call1(ctx, op, x, 0, NULL);
}

slapo_node *slapo__autocast_result(slapo_ctx *ctx, slapo_node *y) {
  if (slapo_ctx_autocast(ctx) != SLAPO_AUTOCAST_BF16_EMULATED || !y) return y;
  return slapo__call1(ctx, SLAPO_OP_DESC(round_bf16_dy), y, 0, NULL);
}
