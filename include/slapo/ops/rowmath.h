/* slapo/ops/rowmath.h - the row routines of LayerNorm, RMSNorm and softmax,
 * the ones their fast kernels run (ops/layernorm.c, rmsnorm.c, softmax.c)
 * and the ones the cc backend pastes into the kernels it generates for a
 * region holding one of them (compiler/cc_rows.c): the very same text
 * through SLAPO__LN_ROWS_SRC, SLAPO__RMS_ROWS_SRC and
 * SLAPO__SOFTMAX_ROWS_SRC, as SLAPO__VMATH_SRC does for
 * the elementwise helpers, so a fused region is bitwise equal to the
 * unfused fast kernels. Both are compiled without contraction (slapo in ISO
 * C, cc with -ffp-contract=off), so every ISA variant rounds the same.
 * Layer: ops. Public, not stable API (the compiler layer reads it).
 * Math (llm.c layernorm_forward/backward; docs/nn_backward.md):
 *   xhat = (x - mean) rstd, rstd = 1 / sqrt(var + eps), y = xhat w + b
 *   dx = rstd (dyw - mean(dyw) - xhat mean(dyw xhat)), dyw = dy w
 * Row sums use SLAPO__ROW_LANES interleaved partial sums (element c goes to
 * lane c % 16, the lanes added in order at the end): a fixed order, so
 * reproducible, and one the compiler vectorizes. */
#ifndef SLAPO_OPS_ROWMATH_H
#define SLAPO_OPS_ROWMATH_H

#include <math.h>
#include <stdint.h>

#include "slapo/ops/vmath.h"

/* The macro holds no directives; comments inside it vanish when it is
 * stringized (slapo__cc_rows_src). Each routine is inlined into its caller,
 * so it is compiled for the caller's ISA level (SLAPO__SIMD_PROC). */
#define SLAPO__ROW_INLINE static inline __attribute__((always_inline, unused))
#define SLAPO__LN_ROWS_SRC                                                                         \
enum { SLAPO__ROW_LANES = 16 };                                                                    \
                                                                                                   \
SLAPO__ROW_INLINE float slapo__lanes_total(const float *acc) {                                         \
  float t = 0.0f;                                                                                  \
  for (int l = 0; l < SLAPO__ROW_LANES; l++) t += acc[l];                                          \
  return t;                                                                                        \
}                                                                                                  \
                                                                                                   \
/* Mean and 1/std of one row x [C] in float, two passes (a one-pass                                \
 * E[x^2] - E[x]^2 loses precision when |mean| >> std). */                                         \
SLAPO__ROW_INLINE void slapo__ln_row_stats(const float *xr, int64_t C, float eps, float *mean,         \
                                       float *rstd) {                                              \
  float acc[SLAPO__ROW_LANES] = {0};                                                               \
  int64_t c = 0;                                                                                   \
  for (; c + SLAPO__ROW_LANES <= C; c += SLAPO__ROW_LANES)                                         \
    for (int l = 0; l < SLAPO__ROW_LANES; l++) acc[l] += xr[c + l];                                \
  for (int l = 0; c < C; c++, l++) acc[l] += xr[c];                                                \
  float m = slapo__lanes_total(acc) / (float)C;                                                    \
  float vacc[SLAPO__ROW_LANES] = {0};                                                              \
  for (c = 0; c + SLAPO__ROW_LANES <= C; c += SLAPO__ROW_LANES)                                    \
    for (int l = 0; l < SLAPO__ROW_LANES; l++) vacc[l] += (xr[c + l] - m) * (xr[c + l] - m);       \
  for (int l = 0; c < C; c++, l++) vacc[l] += (xr[c] - m) * (xr[c] - m);                           \
  float v = slapo__lanes_total(vacc) / (float)C;                                                   \
  *mean = m;                                                                                       \
  *rstd = 1.0f / sqrtf(v + eps);                                                                   \
}                                                                                                  \
                                                                                                   \
/* y = (x - mean) rstd [* w + b] for one row (w and b both or neither). */                         \
SLAPO__ROW_INLINE void slapo__ln_norm_row(const float *restrict xr, const float *restrict w,           \
                                      const float *restrict b, float *restrict yr, int64_t C,      \
                                      float mean, float rstd) {                                    \
  if (w) {                                                                                         \
    for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];                   \
  } else {                                                                                         \
    for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mean) * rstd;                                 \
  }                                                                                                \
}                                                                                                  \
                                                                                                   \
/* dx for one row, plus rr's row when rr is not NULL (the residual-stream                          \
 * gradient, added to the rounded dx as an `add` of the two would). */                             \
SLAPO__ROW_INLINE void slapo__ln_backward_row(const float *restrict xr, const float *restrict w,       \
                                          const float *restrict dyr, const float *restrict rr,     \
                                          float *restrict dxr, int64_t C, float mean,              \
                                          float rstd) {                                            \
  float a1[SLAPO__ROW_LANES] = {0}, a2[SLAPO__ROW_LANES] = {0};                                    \
  int64_t c = 0;                                                                                   \
  for (; c + SLAPO__ROW_LANES <= C; c += SLAPO__ROW_LANES) {                                       \
    for (int l = 0; l < SLAPO__ROW_LANES; l++) {                                                   \
      float dyw = w ? dyr[c + l] * w[c + l] : dyr[c + l];                                          \
      a1[l] += dyw;                                                                                \
      a2[l] += dyw * (xr[c + l] - mean) * rstd;                                                    \
    }                                                                                              \
  }                                                                                                \
  for (int l = 0; c < C; c++, l++) {                                                               \
    float dyw = w ? dyr[c] * w[c] : dyr[c];                                                        \
    a1[l] += dyw;                                                                                  \
    a2[l] += dyw * (xr[c] - mean) * rstd;                                                          \
  }                                                                                                \
  float mean_dyw = slapo__lanes_total(a1) / (float)C;                                              \
  float mean_dyw_xhat = slapo__lanes_total(a2) / (float)C;                                         \
  for (c = 0; c < C; c++) {                                                                        \
    float dyw = w ? dyr[c] * w[c] : dyr[c];                                                        \
    float xhat = (xr[c] - mean) * rstd;                                                            \
    float d = rstd * (dyw - mean_dyw - xhat * mean_dyw_xhat);                                      \
    /* d itself without r: the sign of a zero kept */                                              \
    dxr[c] = rr ? d + rr[c] : d;                                                                   \
  }                                                                                                \
}                                                                                                  \
                                                                                                   \
/* The row's terms of dw and db, added to a row block's float partials. */                         \
SLAPO__ROW_INLINE void slapo__ln_affine_row(const float *restrict xr, const float *restrict dyr,       \
                                        float *restrict pw, float *restrict pb, int64_t C,         \
                                        float mean, float rstd) {                                  \
  for (int64_t c = 0; c < C; c++) {                                                                \
    float xhat = (xr[c] - mean) * rstd;                                                            \
    pw[c] += dyr[c] * xhat;                                                                        \
    pb[c] += dyr[c];                                                                               \
  }                                                                                                \
}                                                                                                  \
  /* end of SLAPO__LN_ROWS_SRC */

SLAPO__LN_ROWS_SRC

/* RMSNorm's (ops/rmsnorm.c; Zhang & Sennrich 2019), the same way:
 *   rstd = 1 / sqrt(mean(x^2) + eps), y = x rstd w
 *   dx = rstd (dyw - x k), k = mean(dyw x) rstd^2 = dot(dyw, x) rstd^2 / C
 *   dw[c] = sum over rows r, in order, in double, of dy[r, c] (x[r, c] rstd_r)
 * Its row sums are single running float sums (in element order). */
#define SLAPO__RMS_ROWS_SRC                                                                        \
/* 1 / sqrt(mean(x^2) + eps) of one row x [C]. */                                                  \
SLAPO__ROW_INLINE float slapo__rms_row_rstd(const float *xr, int64_t C, float eps) {               \
  float ss = 0.0f;                                                                                 \
  for (int64_t c = 0; c < C; c++) ss += xr[c] * xr[c];                                             \
  return 1.0f / sqrtf(ss / (float)C + eps);                                                        \
}                                                                                                  \
                                                                                                   \
/* y = x rstd [* w] for one row. */                                                                \
SLAPO__ROW_INLINE void slapo__rms_norm_row(const float *restrict xr, const float *restrict w,      \
                                           float *restrict yr, int64_t C, float rstd) {            \
  if (w) {                                                                                         \
    for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * rstd * w[c];                                   \
  } else {                                                                                         \
    for (int64_t c = 0; c < C; c++) yr[c] = xr[c] * rstd;                                          \
  }                                                                                                \
}                                                                                                  \
                                                                                                   \
/* dx for one row (its rstd recomputed with dot(dyw, x) in one pass), plus                         \
 * rr's row when rr is not NULL. */                                                                \
SLAPO__ROW_INLINE void slapo__rms_backward_row(const float *restrict xr, const float *restrict w,  \
                                               const float *restrict dyr,                          \
                                               const float *restrict rr, float *restrict dxr,      \
                                               int64_t C, float eps) {                             \
  float ss = 0.0f, dot = 0.0f;                                                                     \
  for (int64_t c = 0; c < C; c++) {                                                                \
    ss += xr[c] * xr[c];                                                                           \
    dot += (w ? dyr[c] * w[c] : dyr[c]) * xr[c];                                                   \
  }                                                                                                \
  float rstd = 1.0f / sqrtf(ss / (float)C + eps);                                                  \
  float k = dot * rstd * rstd / (float)C;                                                          \
  for (int64_t c = 0; c < C; c++) {                                                                \
    float dyw = w ? dyr[c] * w[c] : dyr[c];                                                        \
    float d = rstd * (dyw - xr[c] * k);                                                            \
    dxr[c] = rr ? d + rr[c] : d;                                                                   \
  }                                                                                                \
}                                                                                                  \
                                                                                                   \
/* Columns [c0, c0 + n) of dw, n <= 64: rows in order 0 .. R-1 in double,                         \
 * each row's rstd from rstd [R]: the same bits at any thread count. */                            \
SLAPO__ROW_INLINE void slapo__rms_weight_cols(const float *x, const float *dy, const float *rstd,  \
                                              int64_t R, int64_t C, int64_t c0, int64_t n,         \
                                              float *dw) {                                         \
  double acc[64] = {0};                                                                            \
  for (int64_t r = 0; r < R; r++) {                                                                \
    const float *xr = x + r * C + c0, *dyr = dy + r * C + c0;                                      \
    for (int64_t j = 0; j < n; j++) acc[j] += (double)(dyr[j] * (xr[j] * rstd[r]));                \
  }                                                                                                \
  for (int64_t j = 0; j < n; j++) dw[c0 + j] = (float)acc[j];                                      \
}                                                                                                  \
  /* end of SLAPO__RMS_ROWS_SRC */

SLAPO__RMS_ROWS_SRC

/* Softmax's (ops/softmax.c), the same way; they call slapo/ops/vmath.h's
 * helpers (the cc source pastes those first):
 *   y_s = e^(x_s - m) / sum_j e^(x_j - m), m = max_j x_j, over the first n
 *   of a row's S entries (the causal mask's visible ones), zeros after
 *   dx = y (dy - <dy, y>)
 * e^ is slapo__exp_bounded_f with arguments clamped to -87 (e^-87 ~ 1.6e-38,
 * nothing next to the row's maximum, which contributes 1); the sums use
 * interleaved lane partial sums. A row whose visible entries are all -inf
 * is zeros, not NaN. */
#define SLAPO__SOFTMAX_ROWS_SRC                                                                    \
SLAPO__ROW_INLINE void slapo__softmax_row(const float *restrict xr, float *restrict yr, int64_t n, \
                                          int64_t S) {                                             \
  float m = -INFINITY;                                                                             \
  for (int64_t s = 0; s < n; s++) m = fmaxf(m, xr[s]);                                             \
  if (m == -INFINITY) n = 0;                                                                       \
  float acc[SLAPO__ROW_LANES] = {0};                                                               \
  int64_t s = 0;                                                                                   \
  for (; s + SLAPO__ROW_LANES <= n; s += SLAPO__ROW_LANES) {                                       \
    for (int l = 0; l < SLAPO__ROW_LANES; l++) {                                                   \
      float e = slapo__exp_bounded_f(slapo__clamp_abs(xr[s + l] - m, 0x42ae0000u));                \
      yr[s + l] = e;                                                                               \
      acc[l] += e;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  for (int l = 0; s < n; s++, l++) {                                                               \
    float e = slapo__exp_bounded_f(slapo__clamp_abs(xr[s] - m, 0x42ae0000u));                      \
    yr[s] = e;                                                                                     \
    acc[l] += e;                                                                                   \
  }                                                                                                \
  float sum = 0.0f;                                                                                \
  for (int l = 0; l < SLAPO__ROW_LANES; l++) sum += acc[l];                                        \
  const float k = n ? 1.0f / sum : 0.0f;                                                           \
  for (s = 0; s < n; s++) yr[s] *= k;                                                              \
  for (s = n; s < S; s++) yr[s] = 0.0f;                                                            \
}                                                                                                  \
                                                                                                   \
SLAPO__ROW_INLINE void slapo__softmax_backward_row(const float *restrict y,                        \
                                                   const float *restrict dy, float *restrict dx,   \
                                                   int64_t S) {                                    \
  float acc[SLAPO__ROW_LANES] = {0};                                                               \
  int64_t s = 0;                                                                                   \
  for (; s + SLAPO__ROW_LANES <= S; s += SLAPO__ROW_LANES)                                         \
    for (int l = 0; l < SLAPO__ROW_LANES; l++) acc[l] += dy[s + l] * y[s + l];                     \
  for (int l = 0; s < S; s++, l++) acc[l] += dy[s] * y[s];                                         \
  float dot = 0.0f;                                                                                \
  for (int l = 0; l < SLAPO__ROW_LANES; l++) dot += acc[l];                                        \
  for (s = 0; s < S; s++) dx[s] = y[s] * (dy[s] - dot);                                            \
}                                                                                                  \
  /* end of SLAPO__SOFTMAX_ROWS_SRC */

SLAPO__SOFTMAX_ROWS_SRC

#endif
