/* ops/activation.c - relu, sigmoid, silu and gelu on f32, plus the fused
 * backward-only ops relu_backward, silu_backward and gelu_backward (x, dy).
 * Layer: ops. Math: GELU from Hendrycks & Gimpel 2016, "Gaussian Error
 * Linear Units": exact x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) as in
 * PyTorch F.gelu(approximate='none'), and the tanh form of eq. 2 used by
 * GPT-2, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). SiLU (Elfwing et
 * al. 2017) x * sigmoid(x). The math and derivatives: slapo/ops/math.h. */
#include <string.h>

#include "ops/elementwise.h"

/* ---- kernels, from the math in slapo/ops/math.h ---- */

EW_MATH1(relu)
EW_MATH1(sigmoid)
EW_MATH1(silu)
EW_UNARY(gelu_tanh, SLAPO_EW_gelu_tanh(D, x), SLAPO_EW_gelu_tanh(F, x))
EW_UNARY(gelu_erf, SLAPO_EW_gelu_erf(D, x), SLAPO_EW_gelu_erf(F, x))

/* Backward-only ops: x is input 0, dy input 1. */
EW_MATH2(relu_backward)
EW_MATH2(silu_backward)
EW_BINARY(gelu_tanh_backward, SLAPO_EW_gelu_tanh_backward(D, x, y),
          SLAPO_EW_gelu_tanh_backward(F, x, y))
EW_BINARY(gelu_erf_backward, SLAPO_EW_gelu_erf_backward(D, x, y),
          SLAPO_EW_gelu_erf_backward(F, x, y))

/* gelu and gelu_backward read attribute "approximate": "tanh" or "none"
 * (the default, as in PyTorch). Inference has validated it. */
static bool gelu_is_tanh(const slapo_node *node) {
  return !strcmp(slapo_node_attr_str(node, "approximate", "none"), "tanh");
}

static void gelu_ref_k(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  if (gelu_is_tanh(node)) gelu_tanh_ref(in[0], out, 0);
  else gelu_erf_ref(in[0], out, 0);
}
static void gelu_fast_k(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  if (gelu_is_tanh(node)) gelu_tanh_fast(in[0], out, 0);
  else gelu_erf_fast(in[0], out, 0);
}
static void gelu_backward_ref_k(const slapo_node *node, const slapo_tensor *const *in,
                                slapo_tensor *out, const slapo_kernel_env *env) {
  if (gelu_is_tanh(node)) gelu_tanh_backward_ref(in[0], in[1], out, 0);
  else gelu_erf_backward_ref(in[0], in[1], out, 0);
}
static void gelu_backward_fast_k(const slapo_node *node, const slapo_tensor *const *in,
                                 slapo_tensor *out, const slapo_kernel_env *env) {
  if (gelu_is_tanh(node)) gelu_tanh_backward_fast(in[0], in[1], out, 0);
  else gelu_erf_backward_fast(in[0], in[1], out, 0);
}

/* ---- inference ---- */

static slapo_status check_approximate(const slapo_node *node) {
  const slapo_attr *a = slapo_node_attr(node, "approximate");
  if (!a) return SLAPO_OK;
  if (a->kind != SLAPO_ATTR_STR || (strcmp(a->s, "tanh") && strcmp(a->s, "none")))
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: attribute 'approximate' must be the string \"tanh\" or \"none\"%s%s%s",
                       node->target, a->kind == SLAPO_ATTR_STR ? ", got \"" : "",
                       a->kind == SLAPO_ATTR_STR ? a->s : "",
                       a->kind == SLAPO_ATTR_STR ? "\"" : "");
  return SLAPO_OK;
}

static slapo_status infer_gelu(slapo_node *node) {
  SLAPO_TRY(check_approximate(node));
  return ew_infer_unary(node);
}

static slapo_status infer_gelu_backward(slapo_node *node) {
  SLAPO_TRY(check_approximate(node));
  return ew_infer_same(node);
}

/* ---- backward ---- */

static slapo_status relu_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                       const bool *need, slapo_node **dx) {
  if (need[0])
    dx[0] = slapo__call2(ctx, SLAPO_OP_DESC(relu_backward), node->inputs[0], dy, 0, NULL);
  return slapo_ctx_status(ctx);
}

static slapo_status sigmoid_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                          const bool *need, slapo_node **dx) {
  /* dy * y (1 - y) as t - t y with t = dy y: three passes. */
  if (need[0]) {
    slapo_node *t = slapo_mul(ctx, dy, node);
    dx[0] = slapo_sub(ctx, t, slapo_mul(ctx, t, node));
  }
  return slapo_ctx_status(ctx);
}

static slapo_status silu_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                       const bool *need, slapo_node **dx) {
  if (need[0])
    dx[0] = slapo__call2(ctx, SLAPO_OP_DESC(silu_backward), node->inputs[0], dy, 0, NULL);
  return slapo_ctx_status(ctx);
}

static slapo_status gelu_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                       const bool *need, slapo_node **dx) {
  if (need[0]) {
    slapo_attr a =
        slapo_attr_str("approximate", gelu_is_tanh(node) ? "tanh" : "none");
    dx[0] = slapo__call2(ctx, SLAPO_OP_DESC(gelu_backward), node->inputs[0], dy, 1, &a);
  }
  return slapo_ctx_status(ctx);
}

/* ---- test examples ---- */

static slapo_node *example_x(slapo_ctx *ctx) {
  static const int64_t s[] = {3, 5};
  return slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
}
static slapo_node *example_backward(slapo_ctx *ctx, const slapo_op *op, int n_attrs,
                                    const slapo_attr *attrs) {
  static const int64_t s[] = {3, 5};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, s);
  return slapo__call2(ctx, op, x, dy, n_attrs, attrs);
}
static slapo_node *relu_example(slapo_ctx *ctx) { return slapo_relu(ctx, example_x(ctx)); }
static slapo_node *sigmoid_example(slapo_ctx *ctx) { return slapo_sigmoid(ctx, example_x(ctx)); }
static slapo_node *silu_example(slapo_ctx *ctx) { return slapo_silu(ctx, example_x(ctx)); }
/* The table's gradcheck sees the GPT-2 (tanh) form; the fused backward's
 * example uses the exact form, so fast-vs-reference covers both loops. */
static slapo_node *gelu_example(slapo_ctx *ctx) { return slapo_gelu(ctx, example_x(ctx), true); }
static slapo_node *relu_backward_example(slapo_ctx *ctx) {
  return example_backward(ctx, SLAPO_OP_DESC(relu_backward), 0, NULL);
}
static slapo_node *silu_backward_example(slapo_ctx *ctx) {
  return example_backward(ctx, SLAPO_OP_DESC(silu_backward), 0, NULL);
}
static slapo_node *gelu_backward_example(slapo_ctx *ctx) {
  slapo_attr a = slapo_attr_str("approximate", "none");
  return example_backward(ctx, SLAPO_OP_DESC(gelu_backward), 1, &a);
}

/* ---- descriptors ---- */

SLAPO_OP_DESCRIPTOR(relu) = {
    .name = "relu",
    .n_inputs = 1,
    .infer = ew_infer_unary,
    .ref = relu_ref_k,
    .fast = relu_fast_k,
    .backward = relu_backward_rule,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "max(x, 0); gradient 0 at x = 0 (as PyTorch); backward via relu_backward",
    /* Piecewise linear: central differences are exact except within fd_eps
     * of the kink at 0, which a uniform [-1, 1] draw hits with probability
     * 2 * fd_eps / 2 = 1e-3 per element; hence the small step. */
    .test = {.example = relu_example, .fd_eps = 1e-3f, .atol = 1e-2f, .rtol = 1e-2f},
};

SLAPO_OP_DESCRIPTOR(sigmoid) = {
    .name = "sigmoid",
    .n_inputs = 1,
    .infer = ew_infer_unary,
    .ref = sigmoid_ref_k,
    .fast = sigmoid_fast_k,
    .backward = sigmoid_backward_rule,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "1 / (1 + e^-x); gradient dy * y * (1 - y)",
    .test = {.example = sigmoid_example, .lo = -3.0f, .hi = 3.0f},
};

SLAPO_OP_DESCRIPTOR(silu) = {
    .name = "silu",
    .n_inputs = 1,
    .infer = ew_infer_unary,
    .ref = silu_ref_k,
    .fast = silu_fast_k,
    .backward = silu_backward_rule,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "x * sigmoid(x) (Elfwing et al. 2017); backward via silu_backward",
    .test = {.example = silu_example, .lo = -3.0f, .hi = 3.0f},
};

SLAPO_OP_DESCRIPTOR(gelu) = {
    .name = "gelu",
    .n_inputs = 1,
    .infer = infer_gelu,
    .ref = gelu_ref_k,
    .fast = gelu_fast_k,
    .backward = gelu_backward_rule,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "GELU (Hendrycks & Gimpel 2016); attribute approximate=\"none\" (default): "
           "0.5x(1+erf(x/sqrt2)) as PyTorch F.gelu; \"tanh\": GPT-2's "
           "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))); backward via gelu_backward",
    .test = {.example = gelu_example, .lo = -3.0f, .hi = 3.0f},
};

SLAPO_OP_DESCRIPTOR(relu_backward) = {
    .name = "relu_backward",
    .n_inputs = 2,
    .infer = ew_infer_same,
    .ref = relu_backward_ref_k,
    .fast = relu_backward_fast_k,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "(x, dy) -> dy where x > 0, else 0. Fused because a composite step "
           "function (e.g. dy * relu(x) / x) needs several nodes and memory passes "
           "and is nan at x = 0; this is one pass reading x and dy",
    .test = {.example = relu_backward_example, .checked_by = "relu"},
};

SLAPO_OP_DESCRIPTOR(silu_backward) = {
    .name = "silu_backward",
    .n_inputs = 2,
    .infer = ew_infer_same,
    .ref = silu_backward_ref_k,
    .fast = silu_backward_fast_k,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "(x, dy) -> dy * s * (1 + x * (1 - s)), s = sigmoid(x). Fused because the "
           "composite (sigmoid, sub, mul, add_scalar, mul, mul) needs six nodes, six "
           "passes over memory and keeps s alive",
    .test = {.example = silu_backward_example, .lo = -3.0f, .hi = 3.0f, .checked_by = "silu"},
};

SLAPO_OP_DESCRIPTOR(gelu_backward) = {
    .name = "gelu_backward",
    .n_inputs = 2,
    .infer = infer_gelu_backward,
    .ref = gelu_backward_ref_k,
    .fast = gelu_backward_fast_k,
    .elementwise = true,
    .contiguous_inputs = false,
    .doc = "(x, dy) -> dy * gelu'(x) for approximate=\"none\" (Phi(x) + x phi(x)) or "
           "\"tanh\" (0.5(1+t) + 0.5x(1-t^2)sqrt(2/pi)(1+3*0.044715x^2)). Fused because "
           "the composite needs about ten nodes (pow, tanh, mul, add_scalar ...) and as "
           "many passes over the [B, T, 4C] MLP activation",
    .test = {.example = gelu_backward_example,
             .lo = -3.0f,
             .hi = 3.0f,
             .checked_by = "gelu"},
};

/* ---- typed builders ---- */

EW_BUILDER1(relu)
EW_BUILDER1(sigmoid)
EW_BUILDER1(silu)
slapo_node *slapo_gelu(slapo_ctx *ctx, slapo_node *x, bool use_tanh) {
  slapo_attr a = slapo_attr_str("approximate", use_tanh ? "tanh" : "none");
  return slapo__call1(ctx, SLAPO_OP_DESC(gelu), x, 1, &a);
}
