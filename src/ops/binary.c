/* ops/binary.c - add, sub, mul, div on f32 with NumPy broadcasting: shape
 * inference, reference kernels (strided, broadcast indexing), fast kernels
 * (flat loops for same-shape and scalar operands, a row loop for the
 * bias-add shape a [.., C] op b [C]), backward rules and typed builders.
 * Layer: ops. Gradients of broadcast operands are summed back to their
 * shape (slapo__grad_to); div: d/da = 1/b, d/db = -a/b^2 = -y/b. */
#include "ops/elementwise.h"

/* The reference computes in double and rounds once; for one +, -, * or / of
 * two floats that equals the float result exactly, so fast == ref bitwise. */
EW_MATH2(add)
EW_MATH2(sub)
EW_MATH2(mul)
EW_MATH2(div)

/* ---- backward ---- */

static slapo_status add_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo__grad_to(ctx, dy, node->inputs[0]);
  if (need[1]) dx[1] = slapo__grad_to(ctx, dy, node->inputs[1]);
  return slapo_ctx_status(ctx);
}

static slapo_status sub_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo__grad_to(ctx, dy, node->inputs[0]);
  /* Negate after reducing: the reduced tensor is never larger. */
  if (need[1]) dx[1] = slapo_neg(ctx, slapo__grad_to(ctx, dy, node->inputs[1]));
  return slapo_ctx_status(ctx);
}

static slapo_status mul_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  slapo_node *a = node->inputs[0], *b = node->inputs[1];
  if (need[0]) dx[0] = slapo__grad_to(ctx, slapo_mul(ctx, dy, b), a);
  if (need[1]) dx[1] = slapo__grad_to(ctx, slapo_mul(ctx, dy, a), b);
  return slapo_ctx_status(ctx);
}

static slapo_status div_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  slapo_node *a = node->inputs[0], *b = node->inputs[1];
  if (need[0]) dx[0] = slapo__grad_to(ctx, slapo_div(ctx, dy, b), a);
  /* -dy * a / b^2 written with the forward value y = a / b as -(dy * y) / b:
   * two passes instead of four, and no b^2 that could overflow. */
  if (need[1])
    dx[1] = slapo_neg(ctx, slapo__grad_to(ctx, slapo_div(ctx, slapo_mul(ctx, dy, node), b), b));
  return slapo_ctx_status(ctx);
}

/* ---- test examples: both operands broadcast ([2, 3, 4] with [3, 1]) ---- */

static slapo_node *example_binary(slapo_ctx *ctx, const slapo_op *op) {
  static const int64_t sa[] = {2, 3, 4}, sb[] = {3, 1};
  slapo_node *a = slapo_input(ctx, "a", SLAPO_DTYPE_F32, 3, sa);
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 2, sb);
  return slapo__call2(ctx, op, a, b, 0, NULL);
}
static slapo_node *add_example(slapo_ctx *ctx) { return example_binary(ctx, SLAPO_OP_DESC(add)); }
static slapo_node *sub_example(slapo_ctx *ctx) { return example_binary(ctx, SLAPO_OP_DESC(sub)); }
static slapo_node *mul_example(slapo_ctx *ctx) { return example_binary(ctx, SLAPO_OP_DESC(mul)); }
static slapo_node *div_example(slapo_ctx *ctx) { return example_binary(ctx, SLAPO_OP_DESC(div)); }

/* ---- descriptors ---- */

SLAPO_OP_DESCRIPTOR(add) = {
    .name = "add",
    .commutative = true,
    .n_inputs = 2,
    .infer = ew_infer_broadcast,
    .ref = add_ref_k,
    .fast = add_fast_k,
    .backward = add_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "a + b, NumPy broadcasting",
    .test = {.example = add_example},
};

SLAPO_OP_DESCRIPTOR(sub) = {
    .name = "sub",
    .n_inputs = 2,
    .infer = ew_infer_broadcast,
    .ref = sub_ref_k,
    .fast = sub_fast_k,
    .backward = sub_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "a - b, NumPy broadcasting",
    .test = {.example = sub_example},
};

SLAPO_OP_DESCRIPTOR(mul) = {
    .name = "mul",
    .commutative = true,
    .n_inputs = 2,
    .infer = ew_infer_broadcast,
    .ref = mul_ref_k,
    .fast = mul_fast_k,
    .backward = mul_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "a * b, NumPy broadcasting",
    .test = {.example = mul_example},
};

SLAPO_OP_DESCRIPTOR(div) = {
    .name = "div",
    .n_inputs = 2,
    .infer = ew_infer_broadcast,
    .ref = div_ref_k,
    .fast = div_fast_k,
    .backward = div_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "a / b, NumPy broadcasting; IEEE division (b = 0 gives inf or nan)",
    /* b away from 0 so that 1/b^2 stays moderate for the finite differences. */
    .test = {.example = div_example, .lo = 0.5f, .hi = 2.0f},
};

/* ---- typed builders ---- */

slapo_node *slapo_add(slapo_ctx *ctx, slapo_node *a, slapo_node *b) {
  return slapo__call2(ctx, SLAPO_OP_DESC(add), a, b, 0, NULL);
}
slapo_node *slapo_sub(slapo_ctx *ctx, slapo_node *a, slapo_node *b) {
  return slapo__call2(ctx, SLAPO_OP_DESC(sub), a, b, 0, NULL);
}
slapo_node *slapo_mul(slapo_ctx *ctx, slapo_node *a, slapo_node *b) {
  return slapo__call2(ctx, SLAPO_OP_DESC(mul), a, b, 0, NULL);
}
slapo_node *slapo_div(slapo_ctx *ctx, slapo_node *a, slapo_node *b) {
  return slapo__call2(ctx, SLAPO_OP_DESC(div), a, b, 0, NULL);
}
