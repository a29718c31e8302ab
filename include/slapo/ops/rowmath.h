/* slapo/ops/rowmath.h - LayerNorm's row routines, the ones its fast kernels
 * run (ops/layernorm.c) and the ones the cc backend pastes into the kernels
 * it generates for a region holding a LayerNorm (compiler/cc_rows.c): the
 * very same text through SLAPO__LN_ROWS_SRC, as SLAPO__VMATH_SRC does for
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

#endif
