/* ops/attention.c - fused scaled-dot-product attention for CPU: FlashAttention
 * (Dao, Fu, Ermon, Rudra, Ré, NeurIPS 2022: Algorithm 1 forward with the online
 * softmax of Milakov & Gimelshein 2018, Algorithm 2 dropout, Algorithm 4 backward)
 * as "flash_attention"(q, k, v) and its backward-only op "flash_attention_backward".
 * Layer: ops. Derivation of the backward: docs/flash_attention_backward.md.
 * Design (a node has one output, and the executor runs no multi-result nodes):
 *  - forward out = dropout(softmax(scale q k^T, causal)) v in [BR, BC] tiles;
 *    the T x T matrix exists only as one [BR, BC] tile per thread. It does not
 *    save the row log-sum-exp L: the backward kernel recomputes L tile by tile
 *    (one more pass of q k^T, about 1/5 of the backward's work) instead of
 *    needing a second forward output or a separate "lse" node;
 *  - "flash_attention_backward"(q, k, v, out, dout) returns dq, dk, dv packed
 *    as [3, B, NH, T, HS]; the rule slices and reshapes it into the three
 *    gradients (one recompute of the scores instead of three);
 *  - dropout on P reproduces the unfused Dropout module exactly: P[b, h, t, s]
 *    is kept iff slapo_rng_uniform(seed, stream, step, offset + ((b NH + h) T +
 *    t) T + s) >= p (its flat index in the [B, NH, T, T] probabilities). */
#include <math.h>
#include <string.h>

#include "ops/internal.h"

/* Tile sizes of the fast kernels: a [BR, BC] score tile (4 KiB) plus the
 * touched rows of q, k, v (BR + 2 BC rows of HS floats) stay in L1/L2. */
#define BR 32
#define BC 32

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
  return g;
}

/* Dropout factor of P[bh, t, s]: keep_scale or 0, decided exactly as the
 * dropout op decides element ((bh T) + t) T + s of the [B, NH, T, T] tensor. */
static inline float drop_factor(const fa_geom *g, int64_t bh, int64_t t, int64_t s) {
  if (!g->dropout) return 1.0f;
  uint64_t i = g->offset + (uint64_t)((bh * g->T + t) * g->T + s);
  float u = slapo_rng_uniform(g->seed, g->stream, g->step, i);
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

/* Row max m and log-sum-exp of scale * q_t . k_s over the visible keys. */
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

/* The per-tile work is compiled once per ISA level (GCC function multi-
 * versioning, picked at load time by CPUID) and, inside, once for the common
 * head sizes 64 and 128 so the HS loops have constant trip counts. Every
 * variant performs the same float operations in the same order (ISO C mode:
 * no FMA contraction; explicit summation orders), so results are bitwise
 * identical across variants and thread counts. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FA_CLONES
#endif
#define FA_INLINE static inline __attribute__((always_inline))

/* Rows of the transposed operand packed per pass of tile_abt. */
#define DCH 64

/* S[r, c] = scale * sum_d A[r, d] B[c, d] for r < nr, c < nc, with A [nr, HS]
 * and B [nc, HS] row-major: B is packed transposed (Bt [DCH, BC], zero-padded
 * to BC columns) so the inner loop runs over BC contiguous columns with no
 * horizontal sums; d is summed in order 0, 1, ..., HS-1. */
FA_INLINE void tile_abt(const float *A, const float *B, int64_t HS, int64_t nr, int64_t nc,
                        float scale, float S[BR][BC]) {
  float Bt[DCH][BC]; /* Bt [nd, BC]: B[:, d0 : d0 + nd] transposed */
  for (int64_t r = 0; r < nr; r++)
    for (int c = 0; c < BC; c++) S[r][c] = 0.0f;
  for (int64_t d0 = 0; d0 < HS; d0 += DCH) {
    int64_t nd = HS - d0 < DCH ? HS - d0 : DCH;
    for (int64_t d = 0; d < nd; d++) {
      for (int64_t c = 0; c < nc; c++) Bt[d][c] = B[c * HS + d0 + d];
      for (int64_t c = nc; c < BC; c++) Bt[d][c] = 0.0f;
    }
    for (int64_t r = 0; r < nr; r++) {
      float acc[BC]; /* acc [BC]: row r of S so far */
      for (int c = 0; c < BC; c++) acc[c] = S[r][c];
      const float *a = A + r * HS + d0;
      for (int64_t d = 0; d < nd; d++)
        for (int c = 0; c < BC; c++) acc[c] += a[d] * Bt[d][c];
      for (int c = 0; c < BC; c++) S[r][c] = acc[c];
    }
  }
  for (int64_t r = 0; r < nr; r++)
    for (int c = 0; c < BC; c++) S[r][c] *= scale;
}

/* y[HS] += a * x[HS] */
FA_INLINE void axpy(float *restrict y, float a, const float *restrict x, int64_t HS) {
  for (int64_t i = 0; i < HS; i++) y[i] += a * x[i];
}

/* y[HS] . x[HS] with 8 fixed partial sums (vectorizes; same rounding for
 * every variant). */
FA_INLINE float dot8(const float *a, const float *b, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* exp(x) as Cephes expf: x = n ln2 + r with |r| <= ln2/2, exp(r) by a
 * degree-6 polynomial, 2^n from exponent bits; x < -87 (also -inf) gives 0.
 * Max relative error 8.1e-8 (< 1 ulp) on [-87, 0.5], measured against exp()
 * in double on every float there. Branch-free, so loops over a tile row
 * vectorize (libm's expf does not without -ffast-math); arguments here are
 * scores minus their row max or log-sum-exp, so x <= 0 up to rounding. */
FA_INLINE float fa_expf(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  float fx = xc * 1.44269504088896341f + 0.5f;
  int32_t ni = (int32_t)fx;
  ni -= (float)ni > fx; /* floor */
  float n = (float)ni;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  int32_t bits = (ni + 127) << 23;
  float p2;
  memcpy(&p2, &bits, sizeof p2);
  return x < -87.0f ? 0.0f : y * p2;
}

/* Max and sum over one BC-wide tile row with 8 fixed partial results (the
 * max is exact in any order; the sum's order is fixed). */
FA_INLINE float row_max(const float *x, float init) {
  float acc[8];
  for (int j = 0; j < 8; j++) acc[j] = init;
  for (int c = 0; c < BC; c += 8)
    for (int j = 0; j < 8; j++) acc[j] = acc[j] > x[c + j] ? acc[j] : x[c + j];
  float m = acc[0];
  for (int j = 1; j < 8; j++) m = m > acc[j] ? m : acc[j];
  return m;
}

FA_INLINE float row_sum(const float *x) {
  float acc[8] = {0};
  for (int c = 0; c < BC; c += 8)
    for (int j = 0; j < 8; j++) acc[j] += x[c + j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
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

/* Forward of one query tile (Algorithm 1/2): running row max m and sum l of
 * exp(S - m); o accumulates (dropout-masked) exp(S - m) v, rescaled by
 * exp(m_old - m_new) when the max grows, and is divided by l at the end. */
FA_INLINE void fwd_tile(const fa_geom *g, int64_t HS, int64_t bh, int64_t r0) {
  int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, base = bh * g->T * HS;
  const float *qb = g->q + base, *kb = g->k + base, *vb = g->v + base;
  float *ob = g->o + base + r0 * HS; /* ob [nr, HS]: this tile's output rows */
  float S[BR][BC];                   /* S [nr, BC]: scores, then probabilities */
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
      int64_t n = nv[r];
      if (!n) continue; /* every key of this tile is in row r's future */
      float mt = row_max(S[r], m[r]);
      float alpha = fa_expf(m[r] - mt); /* m[r] = -inf: alpha = 0 */
      for (int c = 0; c < BC; c++) S[r][c] = fa_expf(S[r][c] - mt);
      float sum = row_sum(S[r]);
      if (g->dropout)
        for (int64_t c = 0; c < n; c++) S[r][c] *= drop_factor(g, bh, r0 + r, c0 + c);
      l[r] = alpha * l[r] + sum;
      m[r] = mt;
      float *orow = ob + r * HS;
      if (alpha != 1.0f)
        for (int64_t d = 0; d < HS; d++) orow[d] *= alpha;
      for (int64_t c = 0; c < n; c++)
        if (S[r][c] != 0.0f) axpy(orow, S[r][c], vb + (c0 + c) * HS, HS);
    }
  }
  for (int64_t r = 0; r < nr; r++) {
    float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < HS; d++) ob[r * HS + d] *= inv;
  }
}

FA_CLONES static void fwd_job(const fa_geom *g, int64_t bh, int64_t r0) {
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
    float P[BR][BC];    /* P [nr, BC]: scores, then P, then Pd = P z */
    float dS[BR][BC];   /* dS [nr, BC]: dPd = dO v^T, then scale * dS */
    int64_t nv[BR];     /* visible columns per row */
    float m[BR], l[BR]; /* pass 1: running max and sum */
    float L[BR], D[BR]; /* row log-sum-exp and rowsum(dO o) */
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * HS, kb + c0 * HS, HS, nr, nc, g->scale, P);
      visible(g, r0, nr, c0, nc, nv);
      mask_tile(nv, nr, P);
      for (int64_t r = 0; r < nr; r++) {
        if (!nv[r]) continue;
        float mt = row_max(P[r], m[r]);
        for (int c = 0; c < BC; c++) P[r][c] = fa_expf(P[r][c] - mt);
        l[r] = fa_expf(m[r] - mt) * l[r] + row_sum(P[r]);
        m[r] = mt;
      }
    }
    for (int64_t r = 0; r < nr; r++) {
      L[r] = m[r] + logf(l[r]);
      D[r] = dot8(dob + (r0 + r) * HS, ob + (r0 + r) * HS, HS);
    }
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * HS, kb + c0 * HS, HS, nr, nc, g->scale, P);
      tile_abt(dob + r0 * HS, vb + c0 * HS, HS, nr, nc, 1.0f, dS);
      visible(g, r0, nr, c0, nc, nv);
      mask_tile(nv, nr, P);
      for (int64_t r = 0; r < nr; r++) {
        if (!nv[r]) continue;
        float Z[BC]; /* Z [BC]: dropout factors of row r (1 without dropout) */
        for (int c = 0; c < BC; c++) Z[c] = 1.0f;
        if (g->dropout)
          for (int64_t c = 0; c < nv[r]; c++) Z[c] = drop_factor(g, bh, r0 + r, c0 + c);
        for (int c = 0; c < BC; c++) {
          float p = fa_expf(P[r][c] - L[r]); /* masked: 0 */
          dS[r][c] = g->scale * (p * (Z[c] * dS[r][c] - D[r]));
          P[r][c] = p * Z[c];
        }
      }
      /* dv[c] += sum_r Pd[r, c] dO[r];  dk[c] += sum_r dS[r, c] q[r] */
      for (int64_t c = 0; c < nc; c++) {
        float *dvc = dvb + (c0 + c) * HS, *dkc = dkb + (c0 + c) * HS;
        for (int64_t r = 0; r < nr; r++) {
          if (c >= nv[r]) continue;
          if (P[r][c] != 0.0f) axpy(dvc, P[r][c], dob + (r0 + r) * HS, HS);
          axpy(dkc, dS[r][c], qb + (r0 + r) * HS, HS);
        }
      }
      /* dq[r] += sum_c dS[r, c] k[c] */
      for (int64_t r = 0; r < nr; r++) {
        float *dqr = dqb + (r0 + r) * HS;
        for (int64_t c = 0; c < nv[r]; c++) axpy(dqr, dS[r][c], kb + (c0 + c) * HS, HS);
      }
    }
  }
}

FA_CLONES static void bwd_job(const fa_geom *g, int64_t bh) {
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
