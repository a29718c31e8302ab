/* ops/unary.c - neg, exp, log, tanh, sqrt, rsqrt on f32: shape inference,
 * reference kernels (double libm) and fast kernels (float libm in OpenMP
 * loops), backward rules and typed builders. Layer: ops.
 * Derivatives, written with the forward value y where that saves passes:
 * exp' = y, log' = 1/x, tanh' = 1 - y^2, sqrt' = 0.5/y, rsqrt' = -0.5 y^3. */
#include "ops/cc_expr.h"
#include "ops/elementwise.h"

EW_UNARY(neg, -x, -x)
EW_UNARY(exp, exp(x), expf(x))
EW_UNARY(log, log(x), logf(x))
EW_UNARY(tanh, tanh(x), tanhf(x))
EW_UNARY(sqrt, sqrt(x), sqrtf(x))
EW_UNARY(rsqrt, 1.0 / sqrt(x), 1.0f / sqrtf(x))
EW_KERNELS1(neg, 0)
EW_KERNELS1(exp, 0)
EW_KERNELS1(log, 0)
EW_KERNELS1(tanh, 0)
EW_KERNELS1(sqrt, 0)
EW_KERNELS1(rsqrt, 0)

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

/* ---- cc codegen: the reference's double libm call rounded once; the
 * gradients as the rules above build them, each node rounding to float
 * (mul_scalar and pow compute in double, like their references) ---- */

CC_EXPR_FIXED(neg, "(-a)", "(-g)", NULL)
CC_EXPR_FIXED(exp, "((float)exp((double)a))", "(g * y)", NULL)
CC_EXPR_FIXED(log, "((float)log((double)a))", "(g / a)", NULL)
CC_EXPR_FIXED(tanh, "((float)tanh((double)a))", "(g - g * (y * y))", NULL)
CC_EXPR_FIXED(sqrt, "((float)sqrt((double)a))", "((float)((double)(g / y) * 0.5))", NULL)
CC_EXPR_FIXED(rsqrt, "((float)(1.0 / sqrt((double)a)))",
              "((float)((double)(g * (float)pow((double)y, 3.0)) * (-0.5)))", NULL)

/* cc float forms: the fast kernels' float libm calls (vectorized in the
 * generated loops through libmvec); the gradients are cc_expr's. */
CC_EXPR_FIXED(neg_fast, "(-a)", NULL, NULL)
CC_EXPR_FIXED(exp_fast, "(expf(a))", NULL, NULL)
CC_EXPR_FIXED(log_fast, "(logf(a))", NULL, NULL)
CC_EXPR_FIXED(tanh_fast, "(tanhf(a))", NULL, NULL)
CC_EXPR_FIXED(sqrt_fast, "(sqrtf(a))", NULL, NULL)
CC_EXPR_FIXED(rsqrt_fast, "(1.0f / sqrtf(a))", NULL, NULL)

/* ---- test examples ---- */

static slapo_node *example_x(slapo_ctx *ctx) {
  static const int64_t s[] = {2, 3, 4};
  return slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
}
static slapo_node *neg_example(slapo_ctx *ctx) { return slapo_neg(ctx, example_x(ctx)); }
static slapo_node *exp_example(slapo_ctx *ctx) { return slapo_exp(ctx, example_x(ctx)); }
static slapo_node *log_example(slapo_ctx *ctx) { return slapo_log(ctx, example_x(ctx)); }
static slapo_node *tanh_example(slapo_ctx *ctx) { return slapo_tanh(ctx, example_x(ctx)); }
static slapo_node *sqrt_example(slapo_ctx *ctx) { return slapo_sqrt(ctx, example_x(ctx)); }
static slapo_node *rsqrt_example(slapo_ctx *ctx) { return slapo_rsqrt(ctx, example_x(ctx)); }

/* ---- descriptors ---- */

#define UNARY_DESCRIPTOR(NAME, DOC, ...)                                       \
  SLAPO_OP_DESCRIPTOR(NAME) = {                                                \
      .name = #NAME,                                                           \
      .n_inputs = 1,                                                           \
      .infer = ew_infer_unary,                                                 \
      .ref = NAME##_ref_k,                                                     \
      .fast = NAME##_fast_k,                                                   \
      .backward = NAME##_backward,                                             \
      .elementwise = true,                                                     \
      .cc_expr = NAME##_cc,                                                    \
      .cc_expr_fast = NAME##_fast_cc,                                          \
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

/* ---- typed builders ---- */

slapo_node *slapo_neg(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(neg), x, 0, NULL);
}
slapo_node *slapo_exp(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(exp), x, 0, NULL);
}
slapo_node *slapo_log(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(log), x, 0, NULL);
}
slapo_node *slapo_tanh(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(tanh), x, 0, NULL);
}
slapo_node *slapo_sqrt(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(sqrt), x, 0, NULL);
}
slapo_node *slapo_rsqrt(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(rsqrt), x, 0, NULL);
}
