/* ops/unary.c - neg, exp, log, tanh, sqrt, rsqrt, round_bf16 on f32: shape inference,
 * reference kernels (double libm) and fast kernels (float libm in OpenMP
 * loops) from their math (slapo/ops/math.h, with the derivatives), backward
 * rules and typed builders. Layer: ops. */
#include "ops/elementwise.h"

EW_MATH1(neg)
EW_MATH1(exp)
EW_MATH1(log)
EW_MATH1(tanh)
EW_MATH1(sqrt)
EW_MATH1(rsqrt)
EW_MATH1(round_bf16)

/* ---- backward ---- */

static slapo_status neg_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo_neg(ctx, dy);
  return slapo_ctx_status(ctx);
}

static slapo_status exp_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo_mul(ctx, dy, node); /* dy * y */
  return slapo_ctx_status(ctx);
}

static slapo_status log_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo_div(ctx, dy, node->inputs[0]); /* dy / x */
  return slapo_ctx_status(ctx);
}

static slapo_status tanh_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                  const bool *need, slapo_node **dx) {
  /* dy * (1 - y^2) as dy - dy * y^2: three nodes instead of four. */
  if (need[0]) dx[0] = slapo_sub(ctx, dy, slapo_mul(ctx, dy, slapo_mul(ctx, node, node)));
  return slapo_ctx_status(ctx);
}

static slapo_status sqrt_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                  const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo_mul_scalar(ctx, slapo_div(ctx, dy, node), 0.5); /* dy * 0.5 / y */
  return slapo_ctx_status(ctx);
}

static slapo_status rsqrt_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                   const bool *need, slapo_node **dx) {
  /* d/dx x^(-1/2) = -0.5 x^(-3/2) = -0.5 y^3. */
  if (need[0])
    dx[0] = slapo_mul_scalar(ctx, slapo_mul(ctx, dy, slapo_pow(ctx, node, 3.0)), -0.5);
  return slapo_ctx_status(ctx);
}

/* The gradient of a cast that keeps the f32 result is the identity
 * (straight through): autocast writes f32 and accumulates in f32. */
static slapo_status round_bf16_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                        const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = dy;
  return slapo_ctx_status(ctx);
}

/* ---- test examples ---- */

static slapo_node *example_x(slapo_ctx *ctx) {
  static const int64_t s[] = {2, 3, 4};
  return slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
}

/* ---- descriptors ---- */

/* The descriptor of NAME, with its test example: NAME on x [2, 3, 4]. */
#define UNARY_DESCRIPTOR(NAME, DOC, ...)                                       \
  static slapo_node *NAME##_example(slapo_ctx *ctx) {                          \
    return slapo__call1(ctx, SLAPO_OP_DESC(NAME), example_x(ctx), 0, NULL);    \
  }                                                                            \
  SLAPO_OP_DESCRIPTOR(NAME) = {                                                \
      .name = #NAME,                                                           \
      .n_inputs = 1,                                                           \
      .infer = ew_infer_unary,                                                 \
      .ref = NAME##_ref_k,                                                     \
      .fast = NAME##_fast_k,                                                   \
      .backward = NAME##_backward,                                             \
      .elementwise = true,                                                     \
      .contiguous_inputs = false,                                              \
      .doc = DOC,                                                              \
      .test = {.example = NAME##_example, __VA_ARGS__},                        \
  };

UNARY_DESCRIPTOR(neg, "-x")
UNARY_DESCRIPTOR(exp, "e^x")
/* log, sqrt and rsqrt are only real (and smooth) for x > 0. */
UNARY_DESCRIPTOR(log, "natural logarithm ln x (nan for x < 0, -inf at 0)", .lo = 0.5f,
                 .hi = 2.0f)
UNARY_DESCRIPTOR(tanh, "hyperbolic tangent", .lo = -2.0f, .hi = 2.0f)
UNARY_DESCRIPTOR(sqrt, "square root (nan for x < 0)", .lo = 0.5f, .hi = 2.0f)
UNARY_DESCRIPTOR(rsqrt, "1 / sqrt(x) (inf at 0, nan for x < 0)", .lo = 0.5f, .hi = 2.0f)
UNARY_DESCRIPTOR(round_bf16,
                 "x rounded to the nearest bfloat16 (ties to even; NaN stays NaN, quieted), "
                 "as f32: emulates bf16 numerics on any CPU; gradient dy (straight through)",
                 .exempt = "piecewise constant: central differences see 0 or a jump; the "
                           "straight-through gradient is checked by tests/unit/test_round_bf16.c")

/* ---- typed builders ---- */

EW_BUILDER1(neg)
EW_BUILDER1(exp)
EW_BUILDER1(log)
EW_BUILDER1(tanh)
EW_BUILDER1(sqrt)
EW_BUILDER1(rsqrt)
