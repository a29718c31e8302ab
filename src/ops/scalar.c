/* ops/scalar.c - elementwise ops with one f32 input and a number attribute:
 * add_scalar and mul_scalar (attribute "value") and pow (attribute
 * "exponent", C's pow semantics: a negative base with a non-integer
 * exponent gives nan, as in torch.pow). Shape inference, reference and fast
 * kernels, backward rules (d/dx x^p = p x^(p-1)) and typed builders.
 * Layer: ops. */
#include "ops/elementwise.h"

EW_UNARY(add_scalar, SLAPO_EW_add_scalar(D, x, p), SLAPO_EW_add_scalar(F, x, pf))
EW_UNARY(mul_scalar, SLAPO_EW_mul_scalar(D, x, p), SLAPO_EW_mul_scalar(F, x, pf))
EW_UNARY(pow, SLAPO_EW_pow(D, x, p), SLAPO_EW_pow(F, x, pf))
/* x^2 (variance, squared error) is common: one multiply instead of powf. */
EW_UNARY(square, SLAPO_EW_square(D, x), SLAPO_EW_square(F, x))
EW_KERNELS1(add_scalar, ew_attr(node, "value"))
EW_KERNELS1(mul_scalar, ew_attr(node, "value"))

static void pow_ref_k(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                      const slapo_kernel_env *env) {
  pow_ref(in[0], out, ew_attr(node, "exponent"));
}

static void pow_fast_k(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  double p = ew_attr(node, "exponent");
  if (p == 2.0) square_fast(in[0], out, p);
  else pow_fast(in[0], out, p);
}

/* ---- inference ---- */

static slapo_status infer_value(slapo_node *node) {
  double v;
  SLAPO_TRY(ew_attr_number(node, "value", &v));
  return ew_infer_unary(node);
}

static slapo_status infer_pow(slapo_node *node) {
  double v;
  SLAPO_TRY(ew_attr_number(node, "exponent", &v));
  return ew_infer_unary(node);
}

/* ---- backward ---- */

static slapo_status add_scalar_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                        const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = dy;
  return slapo_ctx_status(ctx);
}

static slapo_status mul_scalar_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                        const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = slapo_mul_scalar(ctx, dy, ew_attr(node, "value"));
  return slapo_ctx_status(ctx);
}

static slapo_status pow_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (!need[0]) return slapo_ctx_status(ctx);
  slapo_node *x = node->inputs[0];
  double p = ew_attr(node, "exponent");
  if (p == 0.0) {
    /* x^0 is constant; p * x^-1 would give 0 * inf = nan at x = 0. */
    dx[0] = slapo_mul_scalar(ctx, dy, 0.0);
  } else if (p == 1.0) {
    dx[0] = dy;
  } else {
    slapo_node *base = p == 2.0 ? x : slapo_pow(ctx, x, p - 1.0); /* x^(p-1) */
    dx[0] = slapo_mul(ctx, dy, slapo_mul_scalar(ctx, base, p));
  }
  return slapo_ctx_status(ctx);
}

/* ---- test examples ---- */

static slapo_node *example_x(slapo_ctx *ctx) {
  static const int64_t s[] = {3, 5};
  return slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
}
static slapo_node *add_scalar_example(slapo_ctx *ctx) {
  return slapo_add_scalar(ctx, example_x(ctx), 0.75);
}
static slapo_node *mul_scalar_example(slapo_ctx *ctx) {
  return slapo_mul_scalar(ctx, example_x(ctx), -1.5);
}
static slapo_node *pow_example(slapo_ctx *ctx) { return slapo_pow(ctx, example_x(ctx), 2.5); }

/* ---- descriptors ---- */

SLAPO_OP_DESCRIPTOR(add_scalar) = {
    .name = "add_scalar",
    .n_inputs = 1,
    .infer = infer_value,
    .ref = add_scalar_ref_k,
    .fast = add_scalar_fast_k,
    .backward = add_scalar_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "x + value (attribute 'value', float)",
    .test = {.example = add_scalar_example},
};

SLAPO_OP_DESCRIPTOR(mul_scalar) = {
    .name = "mul_scalar",
    .n_inputs = 1,
    .infer = infer_value,
    .ref = mul_scalar_ref_k,
    .fast = mul_scalar_fast_k,
    .backward = mul_scalar_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "x * value (attribute 'value', float)",
    .test = {.example = mul_scalar_example},
};

SLAPO_OP_DESCRIPTOR(pow) = {
    .name = "pow",
    .n_inputs = 1,
    .infer = infer_pow,
    .ref = pow_ref_k,
    .fast = pow_fast_k,
    .backward = pow_backward,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "x ^ exponent (attribute 'exponent', float; C pow semantics)",
    /* A positive base keeps x^1.5 real and smooth. */
    .test = {.example = pow_example, .lo = 0.5f, .hi = 2.0f},
};

/* ---- typed builders ---- */

slapo_node *slapo_add_scalar(slapo_ctx *ctx, slapo_node *x, double v) {
  slapo_attr a = slapo_attr_float("value", v);
  return slapo__call1(ctx, SLAPO_OP_DESC(add_scalar), x, 1, &a);
}
slapo_node *slapo_mul_scalar(slapo_ctx *ctx, slapo_node *x, double v) {
  slapo_attr a = slapo_attr_float("value", v);
  return slapo__call1(ctx, SLAPO_OP_DESC(mul_scalar), x, 1, &a);
}
slapo_node *slapo_pow(slapo_ctx *ctx, slapo_node *x, double exponent) {
  slapo_attr a = slapo_attr_float("exponent", exponent);
  return slapo__call1(ctx, SLAPO_OP_DESC(pow), x, 1, &a);
}
