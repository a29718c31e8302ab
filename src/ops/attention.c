/* ops/attention.c - "flash_attention"(q, k, v) [B, NH, T, HS] = dropout(softmax(
 * scale q k^T, causal)) v computed in [32, 32] tiles without the [T, T] matrix
 * (Dao et al., "FlashAttention", NeurIPS 2022: Alg. 1 forward with the online
 * softmax, Alg. 2 dropout, Alg. 4 backward), and its backward-only op
 * "flash_attention_backward"(q, k, v, out, dout) -> [dq, dk, dv] packed as
 * [3, B, NH, T, HS]. Layer: ops. Derivation: docs/flash_attention_backward.md.
 * One output per node: the row log-sum-exp is recomputed in the backward
 * kernel, and the rule slices the packed gradients apart (design note below). */
#include <math.h>
#include <string.h>

#include "ops/internal.h"
#include "ops/vmath.h"

/* Design. The executor runs single-output nodes only, so:
 *  - the forward saves only its output. The paper also saves the row
 *    log-sum-exp L; here the backward kernel recomputes L for each query
 *    tile with one more pass of q k^T (about 1/6 of the backward's work)
 *    rather than adding a second forward result or a separate "lse" node,
 *    which would cost the same pass plus a graph value;
 *  - the backward is one op returning dq, dk, dv concatenated, so the scores
 *    are recomputed once instead of once per gradient (three backward ops);
 *    the rule takes slices 0, 1, 2 of dim 0 and reshapes them to q's shape;
 *  - dropout on P reproduces the unfused Dropout module exactly: P[b, h, t, s]
 *    is kept iff slapo_rng_uniform(seed, stream, step, offset + ((b NH + h) T
 *    + t) T + s) >= p (its flat index in the [B, NH, T, T] probabilities) and
 *    scaled by 1/(1-p); "stream" is the key of the dropout op it replaces
 *    (slapo_rng_stream), applied only when env->training and p > 0.
 * Nothing of size T x T is ever allocated: the fast kernels keep one or three
 * [32, 32] tiles per thread on the stack; the reference kernels recompute
 * each score where needed (they are O(T^2 HS) and single-threaded). */

/* Tile sizes of the fast kernels: a [BR, BC] score tile (4 KiB) plus the
 * touched rows of q, k, v (BR + 2 BC rows of HS floats) stay in L1/L2. */
#define BR 32
#define BC 32
_Static_assert(BR == BC, "transpose_tile needs square tiles");

/* ------------------------------------------------------------------------ */
/* Shared: shape checks, attributes, dropout keys                            */
/* ------------------------------------------------------------------------ */

static const char *const k_names[5] = {"q", "k", "v", "out", "dout"};

/* Every input f32 [B, NH, T, HS] with q's shape; attributes in range. */
static slapo_status check_inputs(const slapo_node *node) {
  const char *op = node->target;
  for (int i = 0; i < node->n_inputs; i++) SLAPO_TRY(slapo__want_dtype(node, i, SLAPO_DTYPE_F32));
  const slapo_node *q = node->inputs[0];
  if (q->ndim != 4)
    return slapo_error(SLAPO_SHAPE,
                       "%s: q %s must be 4-d [B, NH, T, HS]; split the heads with reshape and "
                       "permute first",
                       op, slapo__shape_of(q));
  for (int i = 1; i < node->n_inputs; i++) {
    const slapo_node *x = node->inputs[i];
    if (!slapo_shape_equal(x->ndim, x->shape, q->ndim, q->shape))
      return slapo_error(SLAPO_SHAPE,
                         "%s: %s %s differs from q %s; every input must be [B, NH, T, HS] with "
                         "the same shape (self-attention)",
                         op, k_names[i], slapo__shape_of(x), slapo__shape_of(q));
  }
  int64_t causal = slapo_node_attr_int(node, "causal", 0);
  if (causal != 0 && causal != 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute causal = %lld; use 0 or 1", op,
                       (long long)causal);
  double scale = slapo_node_attr_float(node, "scale", 1.0);
  if (!isfinite(scale))
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: attribute scale = %g is not finite; use e.g. 1/sqrt(HS) = %g", op,
                       scale, 1.0 / sqrt((double)(q->shape[3] > 0 ? q->shape[3] : 1)));
  double p = slapo_node_attr_float(node, "dropout_p", 0.0);
  if (!(p >= 0 && p <= 1))
    return slapo_error(SLAPO_INVALID_ARG, "%s: dropout_p = %g is outside [0, 1]", op, p);
  int64_t offset = slapo_node_attr_int(node, "offset", 0);
  if (offset < 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: offset = %lld; it must be >= 0", op,
                       (long long)offset);
  return SLAPO_OK;
}

/* Geometry, attributes and RNG keys of one kernel call. */
typedef struct fa_geom {
  int64_t BH, T, HS; /* B * NH heads of [T, HS] each               */
  bool causal;       /* query t sees keys s <= t                    */
  float scale;       /* on q k^T; default 1/sqrt(HS)                */
  bool dropout;      /* training and p > 0                          */
  double p;
  float keep_scale;  /* 1/(1-p), as the dropout op computes it      */
  uint64_t seed, stream, step, offset;
  uint64_t key;      /* slapo_rng_key(seed, stream), hashed once      */
  /* Fast kernels: the tensors, [BH, T, HS] each (dx: [3, BH, T, HS]). */
  const float *q, *k, *v, *dO;
  float *o, *dx;
} fa_geom;

static fa_geom geom_of(const slapo_node *node, const slapo_tensor *q,
                       const slapo_kernel_env *env) {
  fa_geom g = {0};
  g.BH = q->shape[0] * q->shape[1];
  g.T = q->shape[2];
  g.HS = q->shape[3];
  g.causal = slapo_node_attr_int(node, "causal", 0) != 0;
  g.scale = (float)slapo_node_attr_float(node, "scale", 1.0 / sqrt((double)(g.HS ? g.HS : 1)));
  g.p = slapo_node_attr_float(node, "dropout_p", 0.0);
  g.dropout = env && env->training && g.p > 0;
  g.keep_scale = g.p < 1 ? (float)(1.0 / (1.0 - g.p)) : 0.0f;
  g.seed = env ? env->seed : 0;
  g.step = env ? env->step : 0;
  g.stream = (uint64_t)slapo_node_attr_int(node, "stream", 0);
  g.offset = (uint64_t)slapo_node_attr_int(node, "offset", 0);
  g.key = slapo_rng_key(g.seed, g.stream);
  return g;
}

/* Dropout factor of P[bh, t, s]: keep_scale or 0, decided exactly as the
 * dropout op decides element ((bh T) + t) T + s of the [B, NH, T, T] tensor. */
static inline float drop_factor(const fa_geom *g, int64_t bh, int64_t t, int64_t s) {
  if (!g->dropout) return 1.0f;
  uint64_t i = g->offset + (uint64_t)((bh * g->T + t) * g->T + s);
  float u4[4];
  slapo_rng_uniform4(g->key, g->step, i >> 2, u4); /* key hashed once per kernel */
  float u = u4[i & 3];
  return (double)u >= g->p ? g->keep_scale : 0.0f;
}

/* Number of keys query t sees. */
static inline int64_t n_keys(const fa_geom *g, int64_t t) { return g->causal ? t + 1 : g->T; }

/* ------------------------------------------------------------------------ */
/* Reference kernels: one query row at a time, scores recomputed per pass    */
/* ------------------------------------------------------------------------ */

static double dot_d(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* Log-sum-exp of scale * q_t . k_s over the keys query t sees (max
 * subtracted first). */
static double row_lse(const fa_geom *g, const float *qt, const float *k, int64_t t) {
  int64_t n = n_keys(g, t);
  double m = -INFINITY, l = 0;
  for (int64_t s = 0; s < n; s++) {
    double x = g->scale * dot_d(qt, k + s * g->HS, g->HS);
    m = x > m ? x : m;
  }
  for (int64_t s = 0; s < n; s++) l += exp(g->scale * dot_d(qt, k + s * g->HS, g->HS) - m);
  return m + log(l);
}

/* Output columns are accumulated in double, DC at a time (scores recomputed
 * per chunk, so the kernel needs no heap). */
#define DC 64

static void fa_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                   const slapo_kernel_env *env) {
  fa_geom g = geom_of(node, in[0], env);
  const float *q = slapo_tensor_data(in[0]); /* q [BH, T, HS] */
  const float *k = slapo_tensor_data(in[1]); /* k [BH, T, HS] */
  const float *v = slapo_tensor_data(in[2]); /* v [BH, T, HS] */
  float *o = slapo_tensor_data(out);         /* o [BH, T, HS] */
  for (int64_t bh = 0; bh < g.BH; bh++) {
    const float *kb = k + bh * g.T * g.HS, *vb = v + bh * g.T * g.HS;
    for (int64_t t = 0; t < g.T; t++) {
      const float *qt = q + (bh * g.T + t) * g.HS;
      float *ot = o + (bh * g.T + t) * g.HS;
      double lse = row_lse(&g, qt, kb, t);
      for (int64_t d0 = 0; d0 < g.HS; d0 += DC) {
        int64_t nd = g.HS - d0 < DC ? g.HS - d0 : DC;
        double acc[DC] = {0}; /* acc [nd]: o_t[d0 : d0 + nd] */
        for (int64_t s = 0; s < n_keys(&g, t); s++) {
          double pr = exp(g.scale * dot_d(qt, kb + s * g.HS, g.HS) - lse);
          pr *= drop_factor(&g, bh, t, s);
          for (int64_t d = 0; d < nd; d++) acc[d] += pr * vb[s * g.HS + d0 + d];
        }
        for (int64_t d = 0; d < nd; d++) ot[d0 + d] = (float)acc[d];
      }
    }
  }
}

/* Backward, straight from the derivation (docs/flash_attention_backward.md):
 * P = exp(S - L), Pd = P z, dPd = dO v^T, dS = P (z dPd - D), D = rowsum(dO o),
 * dq = scale dS k, dk = scale dS^T q, dv = Pd^T dO; z = the dropout factor. */
static void fa_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                            slapo_tensor *out, const slapo_kernel_env *env) {
  fa_geom g = geom_of(node, in[0], env);
  const float *q = slapo_tensor_data(in[0]);  /* q  [BH, T, HS] */
  const float *k = slapo_tensor_data(in[1]);  /* k  [BH, T, HS] */
  const float *v = slapo_tensor_data(in[2]);  /* v  [BH, T, HS] */
  const float *o = slapo_tensor_data(in[3]);  /* o  [BH, T, HS] */
  const float *dO = slapo_tensor_data(in[4]); /* dO [BH, T, HS] */
  float *dq = slapo_tensor_data(out);         /* dq [BH, T, HS] = out[0] */
  int64_t N = g.BH * g.T * g.HS;
  float *dk = dq + N, *dv = dq + 2 * N;       /* dk, dv [BH, T, HS] = out[1], out[2] */
  memset(dq, 0, (size_t)(3 * N) * sizeof(float));
  for (int64_t bh = 0; bh < g.BH; bh++) {
    const float *kb = k + bh * g.T * g.HS, *vb = v + bh * g.T * g.HS;
    for (int64_t t = 0; t < g.T; t++) {
      int64_t row = (bh * g.T + t) * g.HS;
      const float *qt = q + row, *dOt = dO + row;
      double lse = row_lse(&g, qt, kb, t);
      double D = dot_d(dOt, o + row, g.HS);
      for (int64_t s = 0; s < n_keys(&g, t); s++) {
        const float *ks = kb + s * g.HS, *vs = vb + s * g.HS;
        int64_t col = (bh * g.T + s) * g.HS;
        double pr = exp(g.scale * dot_d(qt, ks, g.HS) - lse);
        double z = drop_factor(&g, bh, t, s);
        double ds = pr * (z * dot_d(dOt, vs, g.HS) - D) * g.scale;
        for (int64_t d = 0; d < g.HS; d++) {
          dq[row + d] += (float)(ds * ks[d]);
          dk[col + d] += (float)(ds * qt[d]);
          dv[col + d] += (float)(pr * z * dOt[d]);
        }
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Fast kernels: tiles of BR queries x BC keys                               */
/* ------------------------------------------------------------------------ */

/* The per-tile work is written with GCC vector extensions (16 floats a
 * vector: one AVX-512 register, two AVX2 or four SSE registers) and compiled
 * once per ISA level (SLAPO__SIMD_PROC, ops/vmath.h: picked per call at
 * run time, capped by SLAPO_MAX_ISA), and inside that once for the common head sizes 64 and 128 so the
 * HS loops have constant trip counts. Every variant performs the same float
 * operations in the same order (products accumulate through explicit fmaf;
 * ISO C mode contracts nothing else; sums run in a fixed order), so results
 * are bitwise identical across ISA variants, thread counts and alignment. */
#define FA_INLINE static inline __attribute__((always_inline))
#if defined(__GNUC__) && !defined(__clang__)
/* The vector helpers below are always inlined, so the (warned-about) ABI for
 * passing 64-byte vectors by value without AVX-512 is never used. */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define VL 16
_Static_assert(BC == 2 * VL, "tile rows are two vectors wide");

/* Columns of the transposed operand packed per pass of tile_abt. */
#define DCH 128

FA_INLINE v16f vld(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}
FA_INLINE void vst(float *p, v16f v) { memcpy(p, &v, sizeof v); }
FA_INLINE v16f vdup(float x) { return (v16f){0} + x; }
/* a * b + c lane by lane with one rounding (fmaf): FMA instructions in the
 * x86-64-v3/v4 variants, libm's correctly rounded fmaf in the baseline one,
 * so every variant gets the same bits. */
FA_INLINE v16f vfma(v16f a, v16f b, v16f c) {
  v16f r;
#pragma omp simd
  for (int j = 0; j < VL; j++) r[j] = fmaf(a[j], b[j], c[j]);
  return r;
}
/* mask ? a : b, lane by lane (mask lanes are 0 or -1). */
FA_INLINE v16f vsel(v16i mask, v16f a, v16f b) {
  return (v16f)((mask & (v16i)a) | (~mask & (v16i)b));
}

/* exp(x) lane by lane, as Cephes expf: x = n ln2 + r with |r| <= ln2/2,
 * exp(r) by a degree-6 polynomial, 2^n from exponent bits; x < -87 (also
 * -inf, i.e. masked scores) gives 0. Max relative error 8.1e-8 (< 1 ulp) on
 * [-87, 0.5], measured against exp() in double on every float there; the
 * arguments here are scores minus their row max or log-sum-exp, so <= 0 up to
 * rounding. libm's expf does not vectorize without -ffast-math. */
FA_INLINE v16f vexp(v16f x) {
  v16i tiny = x < vdup(-87.0f);
  v16f xc = vsel(tiny, vdup(-87.0f), x);
  v16f fx = xc * 1.44269504088896341f + 0.5f;
  v16i n = __builtin_convertvector(fx, v16i);
  n += __builtin_convertvector(n, v16f) > fx; /* truncation -> floor */
  v16f nf = __builtin_convertvector(n, v16f);
  v16f r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  v16f z = r * r;
  v16f y = vdup(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  v16f p2 = (v16f)((n + 127) << 23);
  return vsel(tiny, vdup(0.0f), y * p2);
}

/* Scalar exp with the same operations (lane 0 of vexp). */
FA_INLINE float fexp(float x) { return vexp(vdup(x))[0]; }

/* Max and sum of one BC-wide tile row, combining lanes in a fixed order (the
 * max is exact in any order). */
FA_INLINE float row_max(const float *x, float init) {
  v16f a = vld(x), b = vld(x + VL);
  v16f m = vsel(a > b, a, b);
  float r = init;
  for (int j = 0; j < VL; j++) r = m[j] > r ? m[j] : r;
  return r;
}

FA_INLINE float row_sum(const float *x) {
  v16f s = vld(x) + vld(x + VL);
  float r = 0.0f;
  for (int j = 0; j < VL; j++) r += s[j];
  return r;
}

/* a[n] . b[n] with 16 lanes of partial sums, combined in a fixed order. */
FA_INLINE float dot16(const float *a, const float *b, int64_t n) {
  v16f acc = vdup(0.0f);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) acc = vfma(vld(a + i), vld(b + i), acc);
  float s = 0.0f;
  for (int j = 0; j < VL; j++) s += acc[j];
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

/* S[r, c] = scale * sum_d A[r, d] B[c, d] for r < nr, c < BC, with A [nr, HS]
 * and B [nc, HS] row-major (columns c >= nc come out 0). B is packed
 * transposed (Bt [DCH, BC], zero-padded) so 4 rows x 32 columns of S stay
 * in registers while d runs in order 0, 1, ..., HS-1. */
FA_INLINE void tile_abt(const float *A, const float *B, int64_t HS, int64_t nr, int64_t nc,
                        float scale, float S[BR][BC]) {
  _Alignas(64) float Bt[DCH][BC]; /* Bt [nd, BC]: B[:, d0 : d0 + nd] transposed */
  for (int64_t d0 = 0; d0 < HS; d0 += DCH) {
    int64_t nd = HS - d0 < DCH ? HS - d0 : DCH;
    for (int64_t c = 0; c < nc; c++)
      for (int64_t d = 0; d < nd; d++) Bt[d][c] = B[c * HS + d0 + d];
    for (int64_t d = 0; d < nd; d++)
      for (int64_t c = nc; c < BC; c++) Bt[d][c] = 0.0f;
    for (int64_t r = 0; r < nr; r += 4) {
      const float *a[4]; /* rows past nr repeat the last row; not stored */
      for (int i = 0; i < 4; i++) a[i] = A + (r + i < nr ? r + i : nr - 1) * HS + d0;
      v16f acc[4][2];
      for (int i = 0; i < 4; i++) {
        bool fresh = d0 == 0 || r + i >= nr;
        acc[i][0] = fresh ? vdup(0.0f) : vld(S[r + i]);
        acc[i][1] = fresh ? vdup(0.0f) : vld(S[r + i] + VL);
      }
      for (int64_t d = 0; d < nd; d++) {
        v16f b0 = vld(Bt[d]), b1 = vld(Bt[d] + VL);
        for (int i = 0; i < 4; i++) {
          v16f x = vdup(a[i][d]);
          acc[i][0] = vfma(x, b0, acc[i][0]);
          acc[i][1] = vfma(x, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < 4 && r + i < nr; i++) {
        vst(S[r + i], acc[i][0]);
        vst(S[r + i] + VL, acc[i][1]);
      }
    }
  }
  for (int64_t r = 0; r < nr; r++) {
    vst(S[r], vld(S[r]) * scale);
    vst(S[r] + VL, vld(S[r] + VL) * scale);
  }
}

/* Y[i, :] += sum_{j < n} W[i, j] X[j, :] for i < m: Y [m, HS], X [n, HS]
 * row-major, W a [32, 32] tile. j runs in order 0, 1, ..., n-1 for every
 * element (the scalar fallback for HS % 64 != 0 sums in the same order). */
FA_INLINE void tile_acc(float *Y, const float W[BR][BC], const float *X, int64_t HS,
                        int64_t m, int64_t n) {
  if (HS % (4 * VL)) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float w = W[i][j];
        for (int64_t h = 0; h < HS; h++) Y[i * HS + h] = fmaf(w, X[j * HS + h], Y[i * HS + h]);
      }
    return;
  }
  for (int64_t h0 = 0; h0 < HS; h0 += 4 * VL) {
    for (int64_t i = 0; i < m; i += 4) {
      const float *w[4]; /* rows past m repeat the last row; not stored */
      for (int ii = 0; ii < 4; ii++) w[ii] = W[i + ii < m ? i + ii : m - 1];
      v16f acc[4][4];
      for (int ii = 0; ii < 4; ii++)
        for (int k = 0; k < 4; k++)
          acc[ii][k] = i + ii < m ? vld(Y + (i + ii) * HS + h0 + k * VL) : vdup(0.0f);
      for (int64_t j = 0; j < n; j++) {
        v16f x[4];
        for (int k = 0; k < 4; k++) x[k] = vld(X + j * HS + h0 + k * VL);
        for (int ii = 0; ii < 4; ii++) {
          v16f wv = vdup(w[ii][j]);
          for (int k = 0; k < 4; k++) acc[ii][k] = vfma(wv, x[k], acc[ii][k]);
        }
      }
      for (int ii = 0; ii < 4 && i + ii < m; ii++)
        for (int k = 0; k < 4; k++) vst(Y + (i + ii) * HS + h0 + k * VL, acc[ii][k]);
    }
  }
}

/* T[c, r] = S[r, c] for r < nr, c < BC (BR == BC: square tiles). */
FA_INLINE void transpose_tile(const float S[BR][BC], int64_t nr, float T[BR][BC]) {
  for (int64_t c = 0; c < BC; c++)
    for (int64_t r = 0; r < nr; r++) T[c][r] = S[r][c];
}

/* Visible columns of each row of the tile (queries r0.., keys c0..): row r
 * sees keys s <= r0 + r when causal. */
FA_INLINE void visible(const fa_geom *g, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                       int64_t nv[BR]) {
  for (int64_t r = 0; r < nr; r++) {
    int64_t n = g->causal ? r0 + r - c0 + 1 : nc;
    nv[r] = n < 0 ? 0 : n > nc ? nc : n;
  }
}

/* Sets the invisible entries of score tile S (future keys, padding columns
 * past nc) to -inf, so full-width row loops give them probability 0. */
FA_INLINE void mask_tile(const int64_t nv[BR], int64_t nr, float S[BR][BC]) {
  for (int64_t r = 0; r < nr; r++)
    for (int64_t c = nv[r]; c < BC; c++) S[r][c] = -INFINITY;
}

/* Keys a query tile [r0, r0 + nr) looks at: [0, end). */
FA_INLINE int64_t key_end(const fa_geom *g, int64_t r0, int64_t nr) {
  return g->causal ? r0 + nr : g->T;
}

/* Row r of tile S becomes exp(S - x) (masked entries 0). */
FA_INLINE void exp_row(float *row, float x) {
  vst(row, vexp(vld(row) - x));
  vst(row + VL, vexp(vld(row + VL) - x));
}

/* Forward of one query tile (Algorithm 1/2): running row max m and sum l of
 * exp(S - m); o accumulates (dropout-masked) exp(S - m) v, rescaled by
 * exp(m_old - m_new) when the max grows, and is divided by l at the end. */
FA_INLINE void fwd_tile(const fa_geom *g, int64_t HS, int64_t bh, int64_t r0) {
  int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, base = bh * g->T * HS;
  const float *qb = g->q + base, *kb = g->k + base, *vb = g->v + base;
  float *ob = g->o + base + r0 * HS; /* ob [nr, HS]: this tile's output rows */
  _Alignas(64) float S[BR][BC];      /* S [nr, BC]: scores, then probabilities */
  int64_t nv[BR];                    /* visible columns per row of S */
  float m[BR], l[BR];                /* running row max and row sum */
  for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0f;
  memset(ob, 0, (size_t)(nr * HS) * sizeof(float));
  int64_t end = key_end(g, r0, nr);
  for (int64_t c0 = 0; c0 < end; c0 += BC) {
    int64_t nc = end - c0 < BC ? end - c0 : BC;
    tile_abt(qb + r0 * HS, kb + c0 * HS, HS, nr, nc, g->scale, S);
    visible(g, r0, nr, c0, nc, nv);
    mask_tile(nv, nr, S);
    for (int64_t r = 0; r < nr; r++) {
      if (!nv[r]) { /* every key of this tile is in row r's future: P = 0 */
        memset(S[r], 0, sizeof S[r]);
        continue;
      }
      float mt = row_max(S[r], m[r]);
      float alpha = fexp(m[r] - mt); /* m[r] = -inf: alpha = 0 */
      exp_row(S[r], mt);
      l[r] = alpha * l[r] + row_sum(S[r]);
      m[r] = mt;
      if (g->dropout)
        for (int64_t c = 0; c < nv[r]; c++) S[r][c] *= drop_factor(g, bh, r0 + r, c0 + c);
      if (alpha != 1.0f)
        for (int64_t d = 0; d < HS; d++) ob[r * HS + d] *= alpha;
    }
    tile_acc(ob, (const float(*)[BC])S, vb + c0 * HS, HS, nr, nc);
  }
  for (int64_t r = 0; r < nr; r++) {
    float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < HS; d++) ob[r * HS + d] *= inv;
  }
}

SLAPO__SIMD_PROC(fwd_job, (const fa_geom *g, int64_t bh, int64_t r0), (g, bh, r0)) {
  if (g->HS == 64) fwd_tile(g, 64, bh, r0);
  else if (g->HS == 128) fwd_tile(g, 128, bh, r0);
  else fwd_tile(g, g->HS, bh, r0);
}

static void fa_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                    const slapo_kernel_env *env) {
  fa_geom g = geom_of(node, in[0], env);
  g.q = slapo_tensor_data(in[0]); /* q [BH, T, HS] */
  g.k = slapo_tensor_data(in[1]); /* k [BH, T, HS] */
  g.v = slapo_tensor_data(in[2]); /* v [BH, T, HS] */
  g.o = slapo_tensor_data(out);   /* o [BH, T, HS] */
  int64_t n_qt = (g.T + BR - 1) / BR;
  int64_t work = g.BH * g.T * (g.causal ? g.T / 2 + 1 : g.T) * (g.HS ? 2 * g.HS : 1);
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(dynamic, 1)
  for (int64_t job = 0; job < g.BH * n_qt; job++) fwd_job(&g, job / n_qt, (job % n_qt) * BR);
}

/* Backward of one head (Algorithm 4 with the loops swapped, so one thread
 * owns a head): for each query tile, pass 1 recomputes the row log-sum-exp L
 * with the online max/sum and D = rowsum(dO o); pass 2 walks the key tiles
 * again, rebuilding P = exp(S - L), and accumulates dq (this tile's rows),
 * dk and dv (the key tile's rows) in the output. The thread writes only its
 * head's rows: no races, and a fixed summation order. */
FA_INLINE void bwd_head(const fa_geom *g, int64_t HS, int64_t bh) {
  int64_t base = bh * g->T * HS, N = g->BH * g->T * HS;
  const float *qb = g->q + base, *kb = g->k + base, *vb = g->v + base, *ob = g->o + base,
              *dob = g->dO + base;
  float *dqb = g->dx + base, *dkb = g->dx + N + base, *dvb = g->dx + 2 * N + base;
  memset(dqb, 0, (size_t)(g->T * HS) * sizeof(float)); /* dq, dk, dv [T, HS] */
  memset(dkb, 0, (size_t)(g->T * HS) * sizeof(float));
  memset(dvb, 0, (size_t)(g->T * HS) * sizeof(float));
  for (int64_t r0 = 0; r0 < g->T; r0 += BR) {
    int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, end = key_end(g, r0, nr);
    _Alignas(64) float P[BR][BC];  /* P [nr, BC]: scores, then P, then Pd = P z */
    _Alignas(64) float dS[BR][BC]; /* dS [nr, BC]: dPd = dO v^T, then scale * dS */
    _Alignas(64) float Tt[BR][BC]; /* Tt [BC, nr]: Pd or dS transposed */
    int64_t nv[BR];                /* visible columns per row */
    float m[BR], l[BR];            /* pass 1: running max and sum */
    float L[BR], D[BR];            /* row log-sum-exp and rowsum(dO o) */
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * HS, kb + c0 * HS, HS, nr, nc, g->scale, P);
      visible(g, r0, nr, c0, nc, nv);
      mask_tile(nv, nr, P);
      for (int64_t r = 0; r < nr; r++) {
        if (!nv[r]) continue;
        float mt = row_max(P[r], m[r]);
        exp_row(P[r], mt);
        l[r] = fexp(m[r] - mt) * l[r] + row_sum(P[r]);
        m[r] = mt;
      }
    }
    for (int64_t r = 0; r < nr; r++) {
      L[r] = m[r] + logf(l[r]);
      D[r] = dot16(dob + (r0 + r) * HS, ob + (r0 + r) * HS, HS);
    }
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * HS, kb + c0 * HS, HS, nr, nc, g->scale, P);
      tile_abt(dob + r0 * HS, vb + c0 * HS, HS, nr, nc, 1.0f, dS);
      visible(g, r0, nr, c0, nc, nv);
      mask_tile(nv, nr, P);
      /* Every row r < nr is computed (fully masked rows give P = dS = 0), so
       * the tile products below need no masks. */
      for (int64_t r = 0; r < nr; r++) {
        _Alignas(64) float Z[BC]; /* Z [BC]: row r's dropout factors */
        for (int c = 0; c < BC; c++) Z[c] = 1.0f;
        if (g->dropout)
          for (int64_t c = 0; c < nv[r]; c++) Z[c] = drop_factor(g, bh, r0 + r, c0 + c);
        for (int h = 0; h < BC; h += VL) {
          v16f p = vexp(vld(P[r] + h) - L[r]), z = vld(Z + h);
          vst(dS[r] + h, (p * (z * vld(dS[r] + h) - D[r])) * g->scale);
          vst(P[r] + h, p * z);
        }
      }
      /* dv[c] += sum_r Pd[r, c] dO[r];  dk[c] += sum_r dS[r, c] q[r] */
      transpose_tile((const float(*)[BC])P, nr, Tt);
      tile_acc(dvb + c0 * HS, (const float(*)[BC])Tt, dob + r0 * HS, HS, nc, nr);
      transpose_tile((const float(*)[BC])dS, nr, Tt);
      tile_acc(dkb + c0 * HS, (const float(*)[BC])Tt, qb + r0 * HS, HS, nc, nr);
      /* dq[r] += sum_c dS[r, c] k[c] */
      tile_acc(dqb + r0 * HS, (const float(*)[BC])dS, kb + c0 * HS, HS, nr, nc);
    }
  }
}

SLAPO__SIMD_PROC(bwd_job, (const fa_geom *g, int64_t bh), (g, bh)) {
  if (g->HS == 64) bwd_head(g, 64, bh);
  else if (g->HS == 128) bwd_head(g, 128, bh);
  else bwd_head(g, g->HS, bh);
}

static void fa_backward_fast(const slapo_node *node, const slapo_tensor *const *in,
                             slapo_tensor *out, const slapo_kernel_env *env) {
  fa_geom g = geom_of(node, in[0], env);
  g.q = slapo_tensor_data(in[0]);  /* q  [BH, T, HS] */
  g.k = slapo_tensor_data(in[1]);  /* k  [BH, T, HS] */
  g.v = slapo_tensor_data(in[2]);  /* v  [BH, T, HS] */
  g.o = slapo_tensor_data(in[3]);  /* o  [BH, T, HS] (read only here) */
  g.dO = slapo_tensor_data(in[4]); /* dO [BH, T, HS] */
  g.dx = slapo_tensor_data(out);   /* dx [3, BH, T, HS]: dq, dk, dv */
  int64_t work = g.BH * g.T * (g.causal ? g.T / 2 + 1 : g.T) * (g.HS ? 5 * g.HS : 1);
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(dynamic, 1)
  for (int64_t bh = 0; bh < g.BH; bh++) bwd_job(&g, bh);
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

static slapo_status fa_infer(slapo_node *node) {
  SLAPO_TRY(check_inputs(node));
  return slapo__same_as_input(node, 0);
}

static slapo_status fa_backward_infer(slapo_node *node) {
  SLAPO_TRY(check_inputs(node));
  const slapo_node *q = node->inputs[0];
  int64_t shape[5] = {3, q->shape[0], q->shape[1], q->shape[2], q->shape[3]};
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 5, shape);
}

/* Gradient i of the packed [3, B, NH, T, HS] result: slice i, drop dim 0. */
static slapo_node *unpack(slapo_ctx *ctx, slapo_node *packed, int i, const slapo_node *like) {
  slapo_attr a[3] = {slapo_attr_int("dim", 0), slapo_attr_int("start", i),
                     slapo_attr_int("end", i + 1)};
  slapo_node *s = slapo__call1(ctx, "slice", packed, 3, a);
  slapo_attr r = slapo_attr_ints("shape", like->ndim, like->shape);
  return slapo__call1(ctx, "reshape", s, 1, &r);
}

static slapo_status fa_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                const bool *need, slapo_node **dx) {
  for (int i = 0; i < 3; i++) dx[i] = NULL;
  if (!need[0] && !need[1] && !need[2]) return slapo_ctx_status(ctx);
  /* Same attributes (causal, scale, dropout_p, stream, offset): the backward
   * regenerates the forward's dropout mask instead of storing it. */
  slapo_node *in[5] = {node->inputs[0], node->inputs[1], node->inputs[2], node, dy};
  slapo_node *packed =
      slapo_op_call(ctx, "flash_attention_backward", 5, in, node->n_attrs, node->attrs);
  for (int i = 0; i < 3; i++)
    if (need[i]) dx[i] = unpack(ctx, packed, i, node->inputs[i]);
  return slapo_ctx_status(ctx);
}

/* B = 1, NH = 2, T = 5, HS = 4, causal, dropout 0.2: the mask is a fixed
 * function of the keys, so finite differences see a smooth function. */
static slapo_node *fa_example(slapo_ctx *ctx) {
  int64_t shape[4] = {1, 2, 5, 4};
  slapo_node *in[3];
  for (int i = 0; i < 3; i++) in[i] = slapo_input(ctx, k_names[i], SLAPO_DTYPE_F32, 4, shape);
  slapo_attr a[3] = {slapo_attr_int("causal", 1), slapo_attr_float("scale", 0.5),
                     slapo_attr_float("dropout_p", 0.2)};
  return slapo_op_call(ctx, "flash_attention", 3, in, 3, a);
}

/* Non-causal, with a T (37) that crosses tile boundaries; `out` is an
 * arbitrary input here (the kernels only use it for D = rowsum(dO out)). */
static slapo_node *fa_backward_example(slapo_ctx *ctx) {
  int64_t shape[4] = {1, 2, 37, 3};
  slapo_node *in[5];
  for (int i = 0; i < 5; i++) in[i] = slapo_input(ctx, k_names[i], SLAPO_DTYPE_F32, 4, shape);
  slapo_attr a[2] = {slapo_attr_int("causal", 0), slapo_attr_float("dropout_p", 0.3)};
  return slapo_op_call(ctx, "flash_attention_backward", 5, in, 2, a);
}

SLAPO_OP_DESCRIPTOR(flash_attention) = {
    .name = "flash_attention",
    .n_inputs = 3,
    .infer = fa_infer,
    .ref = fa_ref,
    .fast = fa_fast,
    .backward = fa_backward,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(q, k, v) [B, NH, T, HS] -> dropout(softmax(scale q k^T, causal)) v without "
           "materializing the [T, T] scores (FlashAttention, Dao et al. 2022, Alg. 1-2); attrs "
           "causal (0/1), scale (default 1/sqrt(HS)), dropout_p, stream (the RNG key of the "
           "dropout it replaces; set by slapo_op_call when absent), offset (default 0); P[b, h, "
           "t, s] kept iff uniform(seed, stream, step, offset + ((b NH + h) T + t) T + s) >= p",
    .test = {.example = fa_example, .lo = -1, .hi = 1},
};

SLAPO_OP_DESCRIPTOR(flash_attention_backward) = {
    .name = "flash_attention_backward",
    .n_inputs = 5,
    .infer = fa_backward_infer,
    .ref = fa_backward_ref,
    .fast = fa_backward_fast,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(q, k, v, out, dout) -> [dq, dk, dv] packed as [3, B, NH, T, HS], recomputing the "
           "scores and the row log-sum-exp tile by tile (FlashAttention Alg. 4) instead of the "
           "composite's [T, T] probabilities, dropout mask and their gradients; attrs as "
           "flash_attention",
    .test = {.example = fa_backward_example,
             .checked_by = "softmax + dropout + matmul composite (through flash_attention's "
                           "gradcheck)"},
};
