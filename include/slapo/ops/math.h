/* slapo/ops/math.h - the math of every elementwise op, written once.
 *
 * Each op's value is one type-generic macro SLAPO_EW_<op>(M, x[, y][, p])
 * and, for the code generators, its gradients SLAPO_EW_<op>_grad<i>(M, x,
 * y, o, g) w.r.t. input i (x, y: the inputs; o: the op's value; g: the
 * gradient w.r.t. it). M is the arithmetic the expansion computes in:
 *   D  double: the reference kernels (src/ops/, then rounded once to f32);
 *   F  float:  the fast kernels, operation for operation.
 * A generator turns the same macros into text by stringizing an expansion
 * (compiler/cc_ops.c), so a fused region computes what the kernels compute.
 * Where the double and float forms differ on purpose (GELU's tanh form: the
 * float one avoids tanh, see ops/vmath.h), the op defines SLAPO_EW_<op>_D and
 * _F and SLAPO_EW_<op> picks by M. Gradients are written as the backward
 * rules build them from f32 nodes (each rounding to f32), so generators
 * expand them in F.
 *
 * SLAPO_EW_OPS(X) lists the elementwise ops: a backend expands it to get
 * every op's forms without an edit per op (dropout, random, is an nn op
 * each backend renders itself).
 *
 * Public so that kernels (ops/) and generators (compiler/) share it;
 * expanding F forms that call slapo__* helpers needs slapo/ops/vmath.h.
 * Math sources: GELU, Hendrycks & Gimpel 2016 ("Gaussian Error Linear
 * Units": exact x Phi(x), and eq. 2's tanh form used by GPT-2); SiLU,
 * Elfwing et al. 2017. */
#ifndef SLAPO_OPS_MATH_H
#define SLAPO_OPS_MATH_H

/* ---- the two arithmetics ---- */

#define SLAPO_T(M) SLAPO_T_##M /* the C type of M */
#define SLAPO_T_D double
#define SLAPO_T_F float
#define SLAPO_K(M, v) SLAPO_K_##M(v) /* a constant in M */
#define SLAPO_K_D(v) ((double)(v))
#define SLAPO_K_F(v) ((float)(v))
#define SLAPO_FN(M, f) SLAPO_FN_##f##_##M /* libm's function f in M */
#define SLAPO_FN_exp_D exp
#define SLAPO_FN_exp_F expf
#define SLAPO_FN_log_D log
#define SLAPO_FN_log_F logf
#define SLAPO_FN_tanh_D tanh
#define SLAPO_FN_tanh_F tanhf
#define SLAPO_FN_sqrt_D sqrt
#define SLAPO_FN_sqrt_F sqrtf
#define SLAPO_FN_erf_D erf
#define SLAPO_FN_erf_F erff
#define SLAPO_FN_pow_D pow
#define SLAPO_FN_pow_F powf

#define SLAPO_GELU_K 0.7978845608028654       /* sqrt(2 / pi) */
#define SLAPO_GELU_C 0.044715
#define SLAPO_INV_SQRT2 0.7071067811865476    /* 1 / sqrt(2) */
#define SLAPO_INV_SQRT2PI 0.3989422804014327  /* 1 / sqrt(2 pi) */

/* ---- binary: add, sub, mul, div (one +, -, *, / of two floats is exact
 * in double, so the D form rounded equals the F form bitwise) ---- */

#define SLAPO_EW_add(M, x, y) ((x) + (y))
#define SLAPO_EW_sub(M, x, y) ((x) - (y))
#define SLAPO_EW_mul(M, x, y) ((x) * (y))
#define SLAPO_EW_div(M, x, y) ((x) / (y))
#define SLAPO_EW_add_grad0(M, x, y, o, g) (g)
#define SLAPO_EW_add_grad1(M, x, y, o, g) (g)
#define SLAPO_EW_sub_grad0(M, x, y, o, g) (g)
#define SLAPO_EW_sub_grad1(M, x, y, o, g) (-(g))
#define SLAPO_EW_mul_grad0(M, x, y, o, g) ((g) * (y))
#define SLAPO_EW_mul_grad1(M, x, y, o, g) ((g) * (x))
/* d/dy x / y = -x / y^2, written with o = x / y as -(g o) / y (no y^2). */
#define SLAPO_EW_div_grad0(M, x, y, o, g) ((g) / (y))
#define SLAPO_EW_div_grad1(M, x, y, o, g) (-(((g) * (o)) / (y)))

/* ---- one input and a number p ---- */

#define SLAPO_EW_add_scalar(M, x, p) ((x) + (p))
#define SLAPO_EW_mul_scalar(M, x, p) ((x) * (p))
#define SLAPO_EW_pow(M, x, p) SLAPO_FN(M, pow)((x), (p))
#define SLAPO_EW_square(M, x) ((x) * (x)) /* pow's p = 2 fast path */

/* ---- unary; derivatives with the value o where that saves passes:
 * exp' = o, log' = 1/x, tanh' = 1 - o^2, sqrt' = 0.5/o, rsqrt' = -0.5 o^3 ---- */

#define SLAPO_EW_neg(M, x) (-(x))
#define SLAPO_EW_exp(M, x) SLAPO_FN(M, exp)(x)
#define SLAPO_EW_log(M, x) SLAPO_FN(M, log)(x)
#define SLAPO_EW_tanh(M, x) SLAPO_FN(M, tanh)(x)
#define SLAPO_EW_sqrt(M, x) SLAPO_FN(M, sqrt)(x)
#define SLAPO_EW_rsqrt(M, x) (SLAPO_K(M, 1) / SLAPO_FN(M, sqrt)(x))
#define SLAPO_EW_neg_grad0(M, x, y, o, g) (-(g))
#define SLAPO_EW_exp_grad0(M, x, y, o, g) ((g) * (o))
#define SLAPO_EW_log_grad0(M, x, y, o, g) ((g) / (x))
#define SLAPO_EW_tanh_grad0(M, x, y, o, g) ((g) - (g) * ((o) * (o)))
#define SLAPO_EW_sqrt_grad0(M, x, y, o, g) SLAPO_EW_mul_scalar(M, (g) / (o), SLAPO_K(M, 0.5))
#define SLAPO_EW_rsqrt_grad0(M, x, y, o, g)                                    \
  SLAPO_EW_mul_scalar(M, (g) * SLAPO_EW_pow(M, o, SLAPO_K(M, 3)), SLAPO_K(M, -0.5))

/* x rounded through bfloat16 (slapo__round_bf16, slapo/ops/vmath.h): exact
 * in either arithmetic, since x is a float; its gradient goes straight
 * through. */
#define SLAPO_EW_round_bf16(M, x) ((SLAPO_T(M))slapo__round_bf16((float)(x)))
#define SLAPO_EW_round_bf16_grad0(M, x, y, o, g) (g)

/* ---- activations ---- */

/* relu keeps NaN (x <= 0 is false for NaN), as torch.relu does. */
#define SLAPO_EW_relu(M, x) ((x) <= 0 ? SLAPO_K(M, 0) : (x))
#define SLAPO_EW_relu_grad0(M, x, y, o, g) SLAPO_EW_relu_backward(M, x, g)
#define SLAPO_EW_sigmoid(M, x) (SLAPO_K(M, 1) / (SLAPO_K(M, 1) + SLAPO_FN(M, exp)(-(x))))
/* g o (1 - o) as t - t o with t = g o: the rule's three nodes. */
#define SLAPO_EW_sigmoid_grad0(M, x, y, o, g) (((g) * (o)) - ((g) * (o)) * (o))
#define SLAPO_EW_silu(M, x) ((x) * SLAPO_EW_sigmoid(M, x))
#define SLAPO_EW_silu_grad0(M, x, y, o, g) SLAPO_EW_silu_backward(M, x, g)
/* GELU, tanh form: 0.5 x (1 + tanh(k (x + c x^3))); the float form is
 * slapo__gelu_tanh (ops/vmath.h: x sigmoid(2u), free of the cancellation in
 * 1 + tanhf(u) for x < -4, and vectorizable). */
#define SLAPO_EW_gelu_tanh(M, x) SLAPO_EW_gelu_tanh_##M(x)
#define SLAPO_EW_gelu_tanh_D(x)                                                \
  (0.5 * (x) * (1.0 + tanh(SLAPO_GELU_K * ((x) + SLAPO_GELU_C * (x) * (x) * (x)))))
#define SLAPO_EW_gelu_tanh_F(x) slapo__gelu_tanh(x)
/* With t = tanh(k (x + c x^3)): d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2). */
#define SLAPO_EW_gelu_tanh_d(M, x) SLAPO_EW_gelu_tanh_d_##M(x)
#define SLAPO_EW_gelu_tanh_d_D(x)                                              \
  (0.5 * (1.0 + SLAPO_GELU_T_(x)) +                                            \
   0.5 * (x) * (1.0 - SLAPO_GELU_T_(x) * SLAPO_GELU_T_(x)) * SLAPO_GELU_K *    \
       (1.0 + 3.0 * SLAPO_GELU_C * (x) * (x)))
#define SLAPO_GELU_T_(x) tanh(SLAPO_GELU_K * ((x) + SLAPO_GELU_C * (x) * (x) * (x)))
#define SLAPO_EW_gelu_tanh_d_F(x) slapo__gelu_tanh_grad(x)
/* GELU, exact: x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); its derivative
 * Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
#define SLAPO_EW_gelu_erf(M, x)                                                \
  (SLAPO_K(M, 0.5) * (x) * (SLAPO_K(M, 1) + SLAPO_FN(M, erf)((x) * SLAPO_K(M, SLAPO_INV_SQRT2))))
#define SLAPO_EW_gelu_erf_d(M, x)                                              \
  (SLAPO_K(M, 0.5) * (SLAPO_K(M, 1) + SLAPO_FN(M, erf)((x) * SLAPO_K(M, SLAPO_INV_SQRT2))) + \
   (x) * SLAPO_FN(M, exp)(SLAPO_K(M, -0.5) * (x) * (x)) * SLAPO_K(M, SLAPO_INV_SQRT2PI))

/* The fused backward-only ops, (x, dy) -> dy * f'(x). */
#define SLAPO_EW_relu_backward(M, x, y) ((x) > 0 ? (y) : SLAPO_K(M, 0))
/* silu'(x) = s + x s (1 - s) = s (1 + x (1 - s)), s = sigmoid(x); the
 * float form is slapo__silu_grad (slapo/ops/vmath.h), which computes s once
 * (libm's expf sets errno, so the compiler may not merge two calls). */
#define SLAPO_EW_silu_d(M, x) SLAPO_EW_silu_d_##M(x)
#define SLAPO_EW_silu_d_D(x)                                                   \
  (SLAPO_EW_sigmoid(D, x) * (1.0 + (x) * (1.0 - SLAPO_EW_sigmoid(D, x))))
#define SLAPO_EW_silu_d_F(x) slapo__silu_grad(x)
#define SLAPO_EW_silu_backward(M, x, y) ((y) * SLAPO_EW_silu_d(M, x))
#define SLAPO_EW_gelu_tanh_backward(M, x, y) ((y) * SLAPO_EW_gelu_tanh_d(M, x))
#define SLAPO_EW_gelu_erf_backward(M, x, y) ((y) * SLAPO_EW_gelu_erf_d(M, x))

/* Every elementwise op, in registry order (slapo/ops/elementwise.def
 * registers them from this list): X(op, inputs, gradients, form), form
 * FIXED (no attributes: a backend expands SLAPO_EW_<op> and its gradients
 * as they are) or ATTR (reads attributes: each backend renders it by hand,
 * from the macros above). A new op without attributes is one line here,
 * its macros, and its kernels and descriptor in its ops/ file. */
#define SLAPO_EW_OPS(X)                                                        \
  X(add, 2, 2, FIXED)                                                          \
  X(sub, 2, 2, FIXED)                                                          \
  X(mul, 2, 2, FIXED)                                                          \
  X(div, 2, 2, FIXED)                                                          \
  X(add_scalar, 1, 1, ATTR)                                                    \
  X(mul_scalar, 1, 1, ATTR)                                                    \
  X(pow, 1, 1, ATTR)                                                           \
  X(neg, 1, 1, FIXED)                                                          \
  X(exp, 1, 1, FIXED)                                                          \
  X(log, 1, 1, FIXED)                                                          \
  X(tanh, 1, 1, FIXED)                                                         \
  X(sqrt, 1, 1, FIXED)                                                         \
  X(rsqrt, 1, 1, FIXED)                                                        \
  X(round_bf16, 1, 1, FIXED)                                                   \
  X(relu, 1, 1, FIXED)                                                         \
  X(sigmoid, 1, 1, FIXED)                                                      \
  X(silu, 1, 1, FIXED)                                                         \
  X(gelu, 1, 1, ATTR)                                                          \
  X(relu_backward, 2, 0, FIXED)                                                \
  X(silu_backward, 2, 0, FIXED)                                                \
  X(gelu_backward, 2, 0, ATTR)

#endif
