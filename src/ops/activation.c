/* ops/activation.c - relu, sigmoid, silu and gelu on f32, plus the fused
 * backward-only ops relu_backward, silu_backward and gelu_backward (x, dy).
 * Layer: ops. Math: GELU from Hendrycks & Gimpel 2016, "Gaussian Error
 * Linear Units": exact x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) as in
 * PyTorch F.gelu(approximate='none'), and the tanh form of eq. 2 used by
 * GPT-2, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). SiLU (Elfwing et
 * al. 2017) x * sigmoid(x). Derivatives in the comments above each helper. */
#include <string.h>

#include "ops/cc_expr.h"
#include "ops/elementwise.h"

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_C 0.044715
#define INV_SQRT2 0.7071067811865476  /* 1 / sqrt(2) */
#define INV_SQRT2PI 0.3989422804014327 /* 1 / sqrt(2 pi) */

/* ---- per-element math, double (reference) and float (fast) ---- */

static inline double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* silu'(x) = s + x s (1 - s) = s (1 + x (1 - s)), s = sigmoid(x). */
static inline double silu_grad_d(double x) {
  double s = sigmoid_d(x);
  return s * (1.0 + x * (1.0 - s));
}
static inline float silu_grad_f(float x) {
  float s = sigmoid_f(x);
  return s * (1.0f + x * (1.0f - s));
}

static inline double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
}
/* The fast float form is slapo__gelu_tanh (ops/vmath.h): x sigmoid(2u),
 * the same function without tanh, vectorizable and free of the
 * cancellation in 1 + tanhf(u) for x < -4. */

/* With u = k (x + c x^3) and t = tanh(u):
 * d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2). */
static inline double gelu_tanh_grad_d(double x) {
  double t = tanh(GELU_K * (x + GELU_C * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
}
/* Fast: slapo__gelu_tanh_grad (ops/vmath.h), the same derivative in terms
 * of sigmoid(2u). */

static inline double gelu_erf_d(double x) { return 0.5 * x * (1.0 + erf(x * INV_SQRT2)); }
static inline float gelu_erf_f(float x) {
  return 0.5f * x * (1.0f + erff(x * (float)INV_SQRT2));
}

/* d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
static inline double gelu_erf_grad_d(double x) {
  return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * exp(-0.5 * x * x) * INV_SQRT2PI;
}
static inline float gelu_erf_grad_f(float x) {
  return 0.5f * (1.0f + erff(x * (float)INV_SQRT2)) + x * expf(-0.5f * x * x) * (float)INV_SQRT2PI;
}

/* ---- kernels ---- */

/* relu keeps nan (x <= 0 is false for nan), as torch.relu does. */
EW_UNARY(relu, x <= 0 ? 0.0 : x, x <= 0 ? 0.0f : x)
EW_UNARY(sigmoid, sigmoid_d(x), sigmoid_f(x))
EW_UNARY(silu, x * sigmoid_d(x), x * sigmoid_f(x))
EW_UNARY(gelu_tanh, gelu_tanh_d(x), slapo__gelu_tanh(x))
EW_UNARY(gelu_erf, gelu_erf_d(x), gelu_erf_f(x))
EW_KERNELS1(relu, 0)
EW_KERNELS1(sigmoid, 0)
EW_KERNELS1(silu, 0)

/* Backward-only ops: x is input 0, dy input 1. */
EW_BINARY(relu_backward, x > 0 ? y : 0.0, x > 0 ? y : 0.0f)
EW_BINARY(silu_backward, y * silu_grad_d(x), y * silu_grad_f(x))
EW_BINARY(gelu_tanh_backward, y * gelu_tanh_grad_d(x), y * slapo__gelu_tanh_grad(x))
EW_BINARY(gelu_erf_backward, y * gelu_erf_grad_d(x), y * gelu_erf_grad_f(x))
EW_KERNELS2(relu_backward, 0)
EW_KERNELS2(silu_backward, 0)

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

/* ---- cc codegen: the double forms above (the reference kernels), rounded
 * once; the gradients of relu, silu and gelu are their fused backward ops,
 * whose expressions are those ops' forward with (x, dy) = (a, g) ---- */

#define SIGMOID_CC(X) "(1.0 / (1.0 + exp(-" X ")))"

CC_EXPR_FIXED(relu, "(a <= 0 ? 0.0f : a)", "(a > 0 ? g : 0.0f)", NULL)
CC_EXPR_FIXED(relu_backward, "(a > 0 ? b : 0.0f)", NULL, NULL)
CC_EXPR_FIXED(sigmoid, "((float)" SIGMOID_CC("(double)a") ")", "((g * y) - (g * y) * y)", NULL)
/* dy * silu'(x) = dy * s * (1 + x * (1 - s)), as silu_backward. */
#define SILU_GRAD_CC(DY)                                                       \
  "((float)((double)" DY " * (" SIGMOID_CC("(double)a") " * (1.0 + (double)a * (1.0 - " \
  SIGMOID_CC("(double)a") ")))))"
CC_EXPR_FIXED(silu, "((float)((double)a * " SIGMOID_CC("(double)a") "))", SILU_GRAD_CC("g"), NULL)
CC_EXPR_FIXED(silu_backward, SILU_GRAD_CC("b"), NULL, NULL)

/* gelu (dy NULL) or dy * gelu'(a) (gelu_backward's forward, gelu's
 * gradient) for the node's "approximate"; false for an unknown value. */
static bool gelu_cc_write(const slapo_node *node, const char *dy, char *buf, size_t cap) {
  const slapo_attr *at = slapo_node_attr(node, "approximate");
  if (at && (at->kind != SLAPO_ATTR_STR || (strcmp(at->s, "tanh") && strcmp(at->s, "none"))))
    return false;
  char K[CC_LIT_CAP], C[CC_LIT_CAP], R2[CC_LIT_CAP], R2PI[CC_LIT_CAP];
  cc_lit(K, GELU_K), cc_lit(C, GELU_C), cc_lit(R2, INV_SQRT2), cc_lit(R2PI, INV_SQRT2PI);
  const char *x = "(double)a";
  if (at && !strcmp(at->s, "tanh")) {
    char t[160];
    if (!cc_put(t, sizeof t, "tanh(%s * (%s + %s * %s * %s * %s))", K, x, C, x, x, x))
      return false;
    if (!dy) return cc_put(buf, cap, "((float)(0.5 * %s * (1.0 + %s)))", x, t);
    return cc_put(buf, cap,
                  "((float)((double)%s * (0.5 * (1.0 + %s) + 0.5 * %s * (1.0 - %s * %s) * %s * "
                  "(1.0 + 3.0 * %s * %s * %s))))",
                  dy, t, x, t, t, K, C, x, x);
  }
  if (!dy) return cc_put(buf, cap, "((float)(0.5 * %s * (1.0 + erf(%s * %s))))", x, x, R2);
  return cc_put(buf, cap,
                "((float)((double)%s * (0.5 * (1.0 + erf(%s * %s)) + %s * exp(-0.5 * %s * %s) * "
                "%s)))",
                dy, x, R2, x, x, x, R2PI);
}

static bool gelu_cc(const slapo_node *node, int which, char *buf, size_t cap) {
  return (which == -1 || which == 0) && gelu_cc_write(node, which == 0 ? "g" : NULL, buf, cap);
}
static bool gelu_backward_cc(const slapo_node *node, int which, char *buf, size_t cap) {
  return which == -1 && gelu_cc_write(node, "b", buf, cap);
}

/* ---- cc float forms (cc_expr_fast): the fast kernels above, operation for
 * operation (sigmoid_f, silu_grad_f, gelu_erf_f, gelu_erf_grad_f; the tanh
 * GELU through vmath.h's helpers, which the generated source carries) ---- */

#define SIGMOID_F_CC(X) "(1.0f / (1.0f + expf(-" X ")))"
CC_EXPR_FIXED(sigmoid_fast, SIGMOID_F_CC("a"), NULL, NULL)
#define SILU_GRAD_F_CC(DY)                                                     \
  "(" DY " * (" SIGMOID_F_CC("a") " * (1.0f + a * (1.0f - " SIGMOID_F_CC("a") "))))"
CC_EXPR_FIXED(silu_fast, "(a * " SIGMOID_F_CC("a") ")", SILU_GRAD_F_CC("g"), NULL)
CC_EXPR_FIXED(silu_backward_fast, SILU_GRAD_F_CC("b"), NULL, NULL)

static bool gelu_cc_write_fast(const slapo_node *node, const char *dy, char *buf, size_t cap) {
  const slapo_attr *at = slapo_node_attr(node, "approximate");
  if (at && (at->kind != SLAPO_ATTR_STR || (strcmp(at->s, "tanh") && strcmp(at->s, "none"))))
    return false;
  if (at && !strcmp(at->s, "tanh")) {
    if (!dy) return cc_put(buf, cap, "(slapo__gelu_tanh(a))");
    return cc_put(buf, cap, "(%s * slapo__gelu_tanh_grad(a))", dy);
  }
  /* The float constants of gelu_erf_f / gelu_erf_grad_f, exactly. */
  char R2[CC_LIT_CAP], R2PI[CC_LIT_CAP];
  cc_lit(R2, (double)(float)INV_SQRT2), cc_lit(R2PI, (double)(float)INV_SQRT2PI);
  if (!dy) return cc_put(buf, cap, "(0.5f * a * (1.0f + erff(a * (float)%s)))", R2);
  return cc_put(buf, cap,
                "(%s * (0.5f * (1.0f + erff(a * (float)%s)) + a * expf(-0.5f * a * a) * "
                "(float)%s))",
                dy, R2, R2PI);
}

static bool gelu_fast_cc(const slapo_node *node, int which, char *buf, size_t cap) {
  return (which == -1 || which == 0) &&
         gelu_cc_write_fast(node, which == 0 ? "g" : NULL, buf, cap);
}
static bool gelu_backward_fast_cc(const slapo_node *node, int which, char *buf, size_t cap) {
  return which == -1 && gelu_cc_write_fast(node, "b", buf, cap);
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
    .cc_expr = relu_cc,
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
    .cc_expr = sigmoid_cc,
    .cc_expr_fast = sigmoid_fast_cc,
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
    .cc_expr = silu_cc,
    .cc_expr_fast = silu_fast_cc,
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
    .cc_expr = gelu_cc,
    .cc_expr_fast = gelu_fast_cc,
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
    .cc_expr = relu_backward_cc,
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
    .cc_expr = silu_backward_cc,
    .cc_expr_fast = silu_backward_fast_cc,
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
    .cc_expr = gelu_backward_cc,
    .cc_expr_fast = gelu_backward_fast_cc,
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

slapo_node *slapo_relu(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(relu), x, 0, NULL);
}
slapo_node *slapo_sigmoid(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(sigmoid), x, 0, NULL);
}
slapo_node *slapo_silu(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(silu), x, 0, NULL);
}
slapo_node *slapo_gelu(slapo_ctx *ctx, slapo_node *x, bool use_tanh) {
  slapo_attr a = slapo_attr_str("approximate", use_tanh ? "tanh" : "none");
  return slapo__call1(ctx, SLAPO_OP_DESC(gelu), x, 1, &a);
}
