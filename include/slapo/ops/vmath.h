/* slapo/ops/vmath.h - float math for fast kernels, written so that GCC vectorizes
 * the loops that use it: no libm calls (glibc's vector libm needs
 * -ffast-math) and no float comparisons (without -fno-trapping-math GCC
 * will not if-convert them), only arithmetic and integer bit operations.
 * The loops that use it are compiled per ISA level with SLAPO__SIMD_FN /
 * SLAPO__SIMD_PROC (slapo/core/simd.h). Layer: ops. Public (not part of the stable
 * API) because the train layer's loops and the cc backend's generated
 * source (compiler/cc_ops.c) use it too.
 * exp: Cody & Waite range reduction with the degree-7 polynomial of Cephes'
 * expf (S. L. Moshier, Cephes Math Library, expf.c), ~1 ulp on [-ln2/2, ln2/2]. */
#ifndef SLAPO_OPS_VMATH_H
#define SLAPO_OPS_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "slapo/core.h"
#include "slapo/core/simd.h"

/* The scalar helpers below are defined through SLAPO__VMATH_SRC so that the
 * cc backend can paste the very same text into the kernels it generates
 * (slapo__cc_math_src, compiler/cc_ops.c): a fused region computes GELU with
 * the same operations, in the same order, as the fast kernels. The macro
 * holds no directives; comments inside it vanish when it is stringized. */
#define SLAPO__GELU_XMAX_BITS 0x41180000u /* 9.5f */
#define SLAPO__VMATH_SRC \
/* x with its magnitude limited to `lim_bits` (the bit pattern of a positive                      \
 * float), sign kept; NaN passes through. An unsigned compare of the bit                          \
 * patterns orders non-negative floats like the floats themselves. */                             \
static inline float slapo__clamp_abs(float x, uint32_t lim_bits) {                                \
  uint32_t b;                                                                                     \
  memcpy(&b, &x, sizeof b);                                                                       \
  uint32_t m = b & 0x7fffffffu;                                                                   \
  m = m > 0x7f800000u ? m : m < lim_bits ? m : lim_bits;                                          \
  b = (b & 0x80000000u) | m;                                                                      \
  memcpy(&x, &b, sizeof b);                                                                       \
  return x;                                                                                       \
}                                                                                                 \
                                                                                                  \
/* v if keep (0 or 1), else +0.0f, by masking the bits: a select no floating-point                         \
 * operation depends on, so GCC neither branches nor moves the multiply                           \
 * after it under the condition, and the loop vectorizes with and without                         \
 * AVX-512 masks (a dropout's keep test, in kernels and in the cc backend). */                                  \
static inline float slapo__keep(float v, int keep) {                                              \
  uint32_t b;                                                                                     \
  memcpy(&b, &v, sizeof b);                                                                       \
  b &= 0u - (uint32_t)keep;                                                                       \
  memcpy(&v, &b, sizeof b);                                                                       \
  return v;                                                                                       \
}                                                                                                 \
                                                                                                  \
/* x rounded to the nearest bfloat16, ties to even, as float: add 0x7fff                         \
 * and the lowest kept bit, clear the low 16 (a carry rounds up to inf, as                        \
 * it should); a NaN keeps its sign and top payload, quieted. The NaN test                        \
 * is an integer select, so the loop vectorizes. As slapo_f32_to_bf16. */                         \
static inline float slapo__round_bf16(float x) {                                                  \
  uint32_t b;                                                                                     \
  memcpy(&b, &x, sizeof b);                                                                       \
  uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;                                    \
  uint32_t q = (b | 0x00400000u) & 0xffff0000u;                                                   \
  b = (b & 0x7fffffffu) > 0x7f800000u ? q : r;                                                    \
  memcpy(&x, &b, sizeof b);                                                                       \
  return x;                                                                                       \
}                                                                                                 \
                                                                                                  \
/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) = 1 / (1 + e^-x), in float                     \
 * with libm's expf: the fast kernels' and the cc backend's silu gradient. */                     \
static inline float slapo__silu_grad(float x) {                                                   \
  float s = 1.0f / (1.0f + expf(-x));                                                             \
  return s * (1.0f + x * (1.0f - s));                                                             \
}                                                                                                 \
                                                                                                  \
/* e^a for a float |a| <= 87 (callers clamp it; outside, the 2^n scale                            \
 * overflows), all in float: Cephes' expf reduction (n = round(a / ln 2) by                       \
 * the 1.5 * 2^23 shift, r = a - n ln2 with ln 2 split in two so                                  \
 * n * 0.693359375 is exact) and the degree-7 polynomial, each step one                           \
 * fused multiply-add (one rounding where a multiply and an add made two:                         \
 * ~2/3 of the instructions, and the GELU kernels built on it 0.8x the                            \
 * time): within 1 ulp of e^a for the float a given (8.3e-8 relative at                           \
 * most, tests/unit/test_ops_fastpaths.c). fmaf is one instruction at the                         \
 * AVX2 and AVX-512 levels and a libm call at the baseline one, which keeps                       \
 * the levels' bytes identical at the cost of speed on CPUs without FMA. */                       \
static inline float slapo__exp_bounded_f(float a) {                                               \
  float n = fmaf(a, 1.44269504088896341f, 12582912.0f) - 12582912.0f;                             \
  float r = fmaf(n, -0.693359375f, a);                                                            \
  r = fmaf(n, 2.12194440e-4f, r);                                                                 \
  float p = 1.9875691500e-4f;                                                                     \
  p = fmaf(p, r, 1.3981999507e-3f);                                                               \
  p = fmaf(p, r, 8.3334519073e-3f);                                                               \
  p = fmaf(p, r, 4.1665795894e-2f);                                                               \
  p = fmaf(p, r, 1.6666665459e-1f);                                                               \
  p = fmaf(p, r, 5.0000001201e-1f);                                                               \
  p = fmaf(p, r * r, r); /* e^r - 1 */                                                            \
  int32_t bits = ((int32_t)n + 127) << 23; /* 2^n as a float */                                   \
  float scale;                                                                                    \
  memcpy(&scale, &bits, sizeof scale);                                                            \
  return fmaf(p, scale, scale); /* (1 + p) 2^n, 2^n exact: one rounding */                        \
}                                                                                                 \
                                                                                                  \
/* GELU, tanh form (Hendrycks & Gimpel 2016 eq. 2; GPT-2), and its                                \
 * derivative, without tanh: with u = sqrt(2/pi) (x + 0.044715 x^3),                              \
 * E = e^(-2u) and s = 1 / (1 + E) = sigmoid(2u):                                                 \
 *   0.5 x (1 + tanh u) = x s                       (1 + tanh u = 2s)                             \
 *   d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'         (t = tanh u)                                 \
 *        = s + 2 x (E s) s sqrt(2/pi) (1 + 3 * 0.044715 x^2)                                     \
 * using 1 - t^2 = 4 s (1 - s) and 1 - s = E s, so 1 + tanhf(u), which                            \
 * loses every digit for x < -4, is never formed. All in float, at the full                       \
 * vector width: the error is within 2e-7 of max(|ref|, 1) on [-12, 12]                           \
 * for both (PyTorch 1.13's float kernels: 1.5e-7 and 1.0e-6), and                                \
 * relative to the value 1.2e-6 for GELU and 2.7e-6 for its derivative                            \
 * wherever they are >= 1e-3 away from the derivative's root x ~ -0.75,                           \
 * where its two terms cancel (PyTorch: 5e-5 and 2.4e-4). The float                               \
 * argument 2u carries ~|2u| 2^-23 into E. (Forming u and E in double                             \
 * gave ~1 ulp relative at half the vector width: the fused bias + GELU                           \
 * backward took 2x as long.) x is clamped to |x| <= 9.5 inside E only (|2u| <= 87):              \
 * beyond, GELU is x itself to float precision on the right, and below                            \
 * 4e-37 in magnitude on the left. */                                                             \
                                                                                                  \
static inline float slapo__gelu_tanh_E(float x) {                                                 \
  float xc = slapo__clamp_abs(x, SLAPO__GELU_XMAX_BITS);                                          \
  return slapo__exp_bounded_f(-1.5957691216057308f * fmaf(0.044715f * xc * xc, xc, xc));          \
}                                                                                                 \
                                                                                                  \
static inline float slapo__gelu_tanh(float x) { return x / (1.0f + slapo__gelu_tanh_E(x)); }      \
                                                                                                  \
static inline float slapo__gelu_tanh_grad(float x) {                                              \
  float E = slapo__gelu_tanh_E(x), s = 1.0f / (1.0f + E);                                         \
  return fmaf(2.0f * x * (E * s) * s * 0.7978845608028654f, fmaf(0.134145f * x, x, 1.0f), s);     \
}                                                                                                 \
  /* end of SLAPO__VMATH_SRC */

SLAPO__VMATH_SRC

/* Sum over i < n of x[i]^2 in double, in a fixed order of 64 chunks (the
 * same bits for every thread count); OpenMP-parallel above 65536 elements.
 * x [n] f32 contiguous. Defined in ops/sum_squares.c. */
double slapo__sum_squares(const float *x, int64_t n);

#endif
