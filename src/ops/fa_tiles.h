/* ops/fa_tiles.h - the FlashAttention tile kernels (forward: one query tile
 * of a head; backward: one head), included once per ISA level by
 * fa_tiles_<isa>.c, each compiled for its instruction set, with FA_NAME
 * naming the functions slapo__fa_<name>_<isa>; ops/attention.c picks one per
 * call from slapo_isa_active() (SLAPO_MAX_ISA caps it).
 * The tile work is written with GCC vector extensions, 16 floats a vector
 * (one AVX-512 register, two AVX2 or four SSE registers), and inside each
 * level once for the common head sizes 64 and 128 so the HS loops have
 * constant trip counts. Every level performs the same float operations in
 * the same order (products accumulate through fused multiply-adds; ISO C
 * mode contracts nothing else; sums run in a fixed order), so results are
 * bitwise identical across levels, thread counts and alignment.
 * Layer: ops (internal). */
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops/fa.h"

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

/* Register blocking: rows of a score tile computed together (tile_abt:
 * RB x 2 vector accumulators) and rows x column vectors of an accumulation
 * block (tile_acc: RB x RB). AVX-512 has 32 vector registers, so 4; AVX2's
 * 16 (each holding half a vector) fit 2. Blocking picks which elements are
 * computed together, never the order of one element's terms: same bits. */
#if defined(__AVX512F__)
#define RB 4
#else
#define RB 2
#endif

FA_INLINE v16f vld(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}
FA_INLINE void vst(float *p, v16f v) { memcpy(p, &v, sizeof v); }
/* x in every lane, and a * b + c lane by lane with one rounding. With AVX2
 * a 16-float vector is two ymm registers, and GCC's lowering of the generic
 * forms goes lane by lane through memory, so there they are two native
 * operations each; FMA rounds once as fmaf does, so every variant (FMA
 * instructions, or libm's correctly rounded fmaf in the baseline one) gets
 * the same bits. */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
typedef union v16u {
  v16f v;
  __m256 h[2];
} v16u;
FA_INLINE v16f vdup(float x) {
  v16u u;
  u.h[0] = u.h[1] = _mm256_set1_ps(x);
  return u.v;
}
FA_INLINE v16f vfma(v16f a, v16f b, v16f c) {
  v16u x = {a}, y = {b}, z = {c}, r;
  r.h[0] = _mm256_fmadd_ps(x.h[0], y.h[0], z.h[0]);
  r.h[1] = _mm256_fmadd_ps(x.h[1], y.h[1], z.h[1]);
  return r.v;
}
#else
FA_INLINE v16f vdup(float x) { return (v16f){0} + x; }
FA_INLINE v16f vfma(v16f a, v16f b, v16f c) {
  v16f r;
#pragma omp simd
  for (int j = 0; j < VL; j++) r[j] = fmaf(a[j], b[j], c[j]);
  return r;
}
#endif
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
 * and B [nc, HS] rows lda and ldb floats apart (columns c >= nc come out 0).
 * B is packed transposed (Bt [DCH, BC], zero-padded) so 4 rows x 32 columns
 * of S stay in registers while d runs in order 0, 1, ..., HS-1. */
FA_INLINE void tile_abt(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t HS,
                        int64_t nr, int64_t nc, float scale, float S[BR][BC]) {
  _Alignas(64) float Bt[DCH][BC]; /* Bt [nd, BC]: B[:, d0 : d0 + nd] transposed */
  for (int64_t d0 = 0; d0 < HS; d0 += DCH) {
    int64_t nd = HS - d0 < DCH ? HS - d0 : DCH;
    for (int64_t c = 0; c < nc; c++)
      for (int64_t d = 0; d < nd; d++) Bt[d][c] = B[c * ldb + d0 + d];
    for (int64_t d = 0; d < nd; d++)
      for (int64_t c = nc; c < BC; c++) Bt[d][c] = 0.0f;
    for (int64_t r = 0; r < nr; r += RB) {
      const float *a[RB]; /* rows past nr repeat the last row; not stored */
      for (int i = 0; i < RB; i++) a[i] = A + (r + i < nr ? r + i : nr - 1) * lda + d0;
      v16f acc[RB][2];
      for (int i = 0; i < RB; i++) {
        bool fresh = d0 == 0 || r + i >= nr;
        acc[i][0] = fresh ? vdup(0.0f) : vld(S[r + i]);
        acc[i][1] = fresh ? vdup(0.0f) : vld(S[r + i] + VL);
      }
      for (int64_t d = 0; d < nd; d++) {
        v16f b0 = vld(Bt[d]), b1 = vld(Bt[d] + VL);
        for (int i = 0; i < RB; i++) {
          v16f x = vdup(a[i][d]);
          acc[i][0] = vfma(x, b0, acc[i][0]);
          acc[i][1] = vfma(x, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < RB && r + i < nr; i++) {
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
 * with rows ldy and ldx floats apart, W a [32, 32] tile. j runs in order 0,
 * 1, ..., n-1 for every element (the scalar fallback for HS % 64 != 0 sums
 * in the same order). */
FA_INLINE void tile_acc(float *Y, int64_t ldy, const float W[BR][BC], const float *X,
                        int64_t ldx, int64_t HS, int64_t m, int64_t n) {
  if (HS % (RB * VL)) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float w = W[i][j];
        for (int64_t h = 0; h < HS; h++) Y[i * ldy + h] = fmaf(w, X[j * ldx + h], Y[i * ldy + h]);
      }
    return;
  }
  for (int64_t h0 = 0; h0 < HS; h0 += RB * VL) {
    for (int64_t i = 0; i < m; i += RB) {
      const float *w[RB]; /* rows past m repeat the last row; not stored */
      for (int ii = 0; ii < RB; ii++) w[ii] = W[i + ii < m ? i + ii : m - 1];
      v16f acc[RB][RB];
      for (int ii = 0; ii < RB; ii++)
        for (int k = 0; k < RB; k++)
          acc[ii][k] = i + ii < m ? vld(Y + (i + ii) * ldy + h0 + k * VL) : vdup(0.0f);
      for (int64_t j = 0; j < n; j++) {
        v16f x[RB];
        for (int k = 0; k < RB; k++) x[k] = vld(X + j * ldx + h0 + k * VL);
        for (int ii = 0; ii < RB; ii++) {
          v16f wv = vdup(w[ii][j]);
          for (int k = 0; k < RB; k++) acc[ii][k] = vfma(wv, x[k], acc[ii][k]);
        }
      }
      for (int ii = 0; ii < RB && i + ii < m; ii++)
        for (int k = 0; k < RB; k++) vst(Y + (i + ii) * ldy + h0 + k * VL, acc[ii][k]);
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

/* Adds the additive key mask (when present) to score tile S of head bh,
 * keys c0 .. c0 + nc - 1, as the reference adds it to each scaled score. */
FA_INLINE void add_key_bias(const fa_geom *g, int64_t bh, int64_t c0, int64_t nr, int64_t nc,
                            float S[BR][BC]) {
  if (!g->mask) return;
  const float *mb = g->mask + (bh / g->NH) * g->T + c0; /* mb [nc]: this tile's keys */
  for (int64_t r = 0; r < nr; r++)
    for (int64_t c = 0; c < nc; c++) S[r][c] += mb[c];
}

/* Dropout factors of query t's keys c0 .. c0 + n - 1 of head bh (n <= BC)
 * into Z: the elements are contiguous in the [B, NH, T, T] index space, so
 * they come from at most 9 consecutive Philox blocks, computed side by side
 * (the rounds vectorize across blocks) instead of one scalar Philox call per
 * element; each element is decided as drop_factor decides it (the same
 * counter, key and word, the same integer threshold), bit for bit. */
enum { DROP_BLOCKS = 16 };
_Static_assert(4 * DROP_BLOCKS >= BC + 3, "one batch covers a tile row");
FA_INLINE void drop_row(const fa_geom *g, int64_t bh, int64_t t, int64_t c0, int64_t n,
                        float Z[BC]) {
  uint64_t i0 = g->offset + (uint64_t)((fa_drop_bh(g, bh) * g->T + t) * g->T + c0), b0 = i0 >> 2;
  uint32_t w[4][DROP_BLOCKS]; /* w[q][l]: word q of block b0 + l */
  uint32_t k0 = (uint32_t)g->key, k1 = (uint32_t)(g->key >> 32);
  uint32_t s0 = (uint32_t)g->step, s1 = (uint32_t)(g->step >> 32);
#pragma omp simd
  for (int l = 0; l < DROP_BLOCKS; l++) {
    uint64_t b = b0 + (uint64_t)l;
    uint32_t c_0 = (uint32_t)b, c_1 = (uint32_t)(b >> 32), c_2 = s0, c_3 = s1, x0 = k0, x1 = k1;
    for (int round = 0; round < 10; round++) { /* Philox4x32-10, as core/philox.c */
      uint64_t p0 = (uint64_t)0xD2511F53u * c_0, p1 = (uint64_t)0xCD9E8D57u * c_2;
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c_1 ^ x0, n2 = (uint32_t)(p0 >> 32) ^ c_3 ^ x1;
      c_1 = (uint32_t)p1, c_3 = (uint32_t)p0, c_0 = n0, c_2 = n2;
      x0 += 0x9E3779B9u, x1 += 0xBB67AE85u;
    }
    w[0][l] = c_0, w[1][l] = c_1, w[2][l] = c_2, w[3][l] = c_3;
  }
  for (int64_t c = 0; c < n; c++) {
    uint64_t e = i0 + (uint64_t)c - 4 * b0; /* element of the batch */
    Z[c] = (w[e & 3][e >> 2] >> 8) >= g->thresh ? g->keep_scale : 0.0f;
  }
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
  int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, kvh = bh / g->G;
  int64_t ldq = g->lq.ld, ldkv = g->lkv.ld, ldo = g->lo.ld;
  const float *qb = g->q + fa_head_off(g->lq, bh), *kb = g->k + fa_head_off(g->lkv, kvh),
              *vb = g->v + fa_head_off(g->lkv, kvh);
  float *ob = g->o + fa_head_off(g->lo, bh) + r0 * ldo; /* ob [nr, HS]: this tile's rows */
  _Alignas(64) float S[BR][BC];      /* S [nr, BC]: scores, then probabilities */
  int64_t nv[BR];                    /* visible columns per row of S */
  float m[BR], l[BR];                /* running row max and row sum */
  for (int64_t r = 0; r < nr; r++) {
    m[r] = -INFINITY, l[r] = 0.0f;
    memset(ob + r * ldo, 0, (size_t)HS * sizeof(float));
  }
  int64_t end = key_end(g, r0, nr);
  for (int64_t c0 = 0; c0 < end; c0 += BC) {
    int64_t nc = end - c0 < BC ? end - c0 : BC;
    tile_abt(qb + r0 * ldq, ldq, kb + c0 * ldkv, ldkv, HS, nr, nc, g->scale, S);
    add_key_bias(g, bh, c0, nr, nc, S);
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
      if (g->dropout) {
        float Z[BC]; /* Z [nv[r]]: row r's dropout factors */
        drop_row(g, bh, r0 + r, c0, nv[r], Z);
        for (int64_t c = 0; c < nv[r]; c++) S[r][c] *= Z[c];
      }
      if (alpha != 1.0f)
        for (int64_t d = 0; d < HS; d++) ob[r * ldo + d] *= alpha;
    }
    tile_acc(ob, ldo, (const float(*)[BC])S, vb + c0 * ldkv, ldkv, HS, nr, nc);
  }
  for (int64_t r = 0; r < nr; r++) {
    float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < HS; d++) ob[r * ldo + d] *= inv;
  }
}

void FA_NAME(fwd_job)(const fa_geom *g, int64_t bh, int64_t r0) {
  if (g->HS == 64) fwd_tile(g, 64, bh, r0);
  else if (g->HS == 128) fwd_tile(g, 128, bh, r0);
  else fwd_tile(g, g->HS, bh, r0);
}


/* Backward of one query head (Algorithm 4 with the loops swapped, so one
 * thread owns a head): for each query tile, pass 1 recomputes the row
 * max m and sum l online and D = rowsum(dO o); pass 2 walks the key tiles
 * again, rebuilding P = exp(S - m) / l, and accumulates dq (this
 * tile's rows, zeroed here), dk and dv (the key tile's rows of the head's kv
 * head, zeroed by the caller) in the output. */
FA_INLINE void bwd_head(const fa_geom *g, int64_t HS, int64_t bh) {
  int64_t q0 = fa_head_off(g->lq, bh), kv0 = fa_head_off(g->lkv, bh / g->G),
          o0 = fa_head_off(g->lo, bh);
  int64_t ldq = g->lq.ld, ldkv = g->lkv.ld, ldo = g->lo.ld;
  const float *qb = g->q + q0, *kb = g->k + kv0, *vb = g->v + kv0, *ob = g->o + o0,
              *dob = g->dO + o0;
  float *dqb = g->dq + q0, *dkb = g->dk + kv0, *dvb = g->dv + kv0;
  for (int64_t t = 0; t < g->T; t++) /* dq [T, HS] */
    memset(dqb + t * ldq, 0, (size_t)HS * sizeof(float));
  for (int64_t r0 = 0; r0 < g->T; r0 += BR) {
    int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, end = key_end(g, r0, nr);
    _Alignas(64) float P[BR][BC];  /* P [nr, BC]: scores, then P, then Pd = P z */
    _Alignas(64) float dS[BR][BC]; /* dS [nr, BC]: dPd = dO v^T, then scale * dS */
    _Alignas(64) float Tt[BR][BC]; /* Tt [BC, nr]: Pd or dS transposed */
    int64_t nv[BR];                /* visible columns per row */
    float m[BR], l[BR];            /* pass 1: running max and sum */
    float il[BR], D[BR];           /* 1 / l and rowsum(dO o) */
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * ldq, ldq, kb + c0 * ldkv, ldkv, HS, nr, nc, g->scale, P);
      add_key_bias(g, bh, c0, nr, nc, P);
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
      il[r] = 1.0f / l[r];
      D[r] = dot16(dob + (r0 + r) * ldo, ob + (r0 + r) * ldo, HS);
    }
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nc = end - c0 < BC ? end - c0 : BC;
      tile_abt(qb + r0 * ldq, ldq, kb + c0 * ldkv, ldkv, HS, nr, nc, g->scale, P);
      add_key_bias(g, bh, c0, nr, nc, P);
      tile_abt(dob + r0 * ldo, ldo, vb + c0 * ldkv, ldkv, HS, nr, nc, 1.0f, dS);
      visible(g, r0, nr, c0, nc, nv);
      mask_tile(nv, nr, P);
      /* Every row r < nr is computed (fully masked rows give P = dS = 0), so
       * the tile products below need no masks. */
      for (int64_t r = 0; r < nr; r++) {
        _Alignas(64) float Z[BC]; /* Z [BC]: row r's dropout factors */
        for (int c = 0; c < BC; c++) Z[c] = 1.0f;
        if (g->dropout) drop_row(g, bh, r0 + r, c0, nv[r], Z);
        for (int h = 0; h < BC; h += VL) {
          v16f p = vexp(vld(P[r] + h) - m[r]) * il[r], z = vld(Z + h);
          vst(dS[r] + h, (p * (z * vld(dS[r] + h) - D[r])) * g->scale);
          vst(P[r] + h, p * z);
        }
      }
      /* dv[c] += sum_r Pd[r, c] dO[r];  dk[c] += sum_r dS[r, c] q[r] */
      transpose_tile((const float(*)[BC])P, nr, Tt);
      tile_acc(dvb + c0 * ldkv, ldkv, (const float(*)[BC])Tt, dob + r0 * ldo, ldo, HS, nc, nr);
      transpose_tile((const float(*)[BC])dS, nr, Tt);
      tile_acc(dkb + c0 * ldkv, ldkv, (const float(*)[BC])Tt, qb + r0 * ldq, ldq, HS, nc, nr);
      /* dq[r] += sum_c dS[r, c] k[c] */
      tile_acc(dqb + r0 * ldq, ldq, (const float(*)[BC])dS, kb + c0 * ldkv, ldkv, HS, nr, nc);
    }
  }
}

/* Kv head kvh and its G query heads, in order: the thread writes only their
 * rows (no races), and dk, dv sum over the group in a fixed order. */
void FA_NAME(bwd_job)(const fa_geom *g, int64_t kvh) {
  int64_t kv0 = fa_head_off(g->lkv, kvh);
  for (int64_t t = 0; t < g->T; t++) { /* dk, dv [T, HS] */
    memset(g->dk + kv0 + t * g->lkv.ld, 0, (size_t)g->HS * sizeof(float));
    memset(g->dv + kv0 + t * g->lkv.ld, 0, (size_t)g->HS * sizeof(float));
  }
  for (int64_t bh = kvh * g->G; bh < (kvh + 1) * g->G; bh++) {
    if (g->HS == 64) bwd_head(g, 64, bh);
    else if (g->HS == 128) bwd_head(g, 128, bh);
    else bwd_head(g, g->HS, bh);
  }
}

