/* ops/fa_tiles.h - the FlashAttention tile kernels (forward: one query tile
 * of a head; backward: one head), included once per ISA level by
 * fa_tiles_<isa>.c, each compiled for its instruction set, with FA_NAME
 * naming the functions slapo__fa_<name>_<isa>; ops/attention.c picks one per
 * call from slapo_isa_active() (SLAPO_MAX_ISA caps it).
 * Tiles are kept transposed, keys by queries (St [BC keys][BR queries]): the
 * query tile's q (and dO) rows are packed transposed once per tile, the key
 * rows are read in place, so no key or value tile is ever repacked or
 * transposed, a tile's softmax statistics are per-lane vector operations,
 * and dk, dv accumulate from the tiles as they lie (docs/flash_attention_
 * backward.md, "Kernels").
 * The tile work is written with GCC vector extensions of each level's
 * native width (16 floats AVX-512, 8 AVX2, 4 SSE), and inside each level
 * once for the common head sizes 64 and 128 so the HS loops have constant
 * trip counts. Every level performs the same float operations in
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

/* Native vector width per level: 16 floats (AVX-512), 8 (AVX2), 4 (SSE).
 * Every operation below is lane by lane or sums in an order fixed
 * independently of the width, so the width never changes a bit. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vw __attribute__((vector_size(VL * 4)));
#define NV (BR / VL) /* vectors per tile row (32 queries) */
_Static_assert(BR % VL == 0 && 16 % VL == 0, "tile rows and Philox batches are whole vectors");

/* Head-size columns of a query tile packed transposed per pass (kq_tile):
 * head sizes up to DCH are packed once per query tile, larger ones in
 * chunks of DCH per key tile (the same sums in the same order). */
#define DCH 128

/* Register blocking: key rows of a score tile computed together (kq_tile:
 * RK x NV vector accumulators) and rows x column vectors of an
 * accumulation block (tile_acc: RB x NC, NC VL head-size columns).
 * AVX-512 has 32 vector registers, so 8 x 2 and 4 x 4 (HS chunks of 64;
 * 4 x 2 score blocks, 8 accumulators for 2 FMA ports of 4 cycles' latency,
 * made the tile kernels ~3% slower); AVX2 and SSE 16, so 2 x NV and 2 x 4
 * (chunks of 32 and 16). Blocking picks which elements are computed
 * together, never the order of one element's terms: same bits. */
#if defined(__AVX512F__)
#define RB 4
#define RK 8
#else
#define RB 2
#define RK 2
#endif
#define NC 4

FA_INLINE vf vld(const float *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
FA_INLINE void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }
/* x in every lane, and a * b + c lane by lane with one rounding: FMA
 * instructions where the level has them, else libm's correctly rounded
 * fmaf, so every level gets the same bits. */
#if defined(__AVX512F__)
FA_INLINE vf vdup(float x) { return (vf)_mm512_set1_ps(x); }
FA_INLINE vf vfma(vf a, vf b, vf c) { return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__AVX2__) && defined(__FMA__)
FA_INLINE vf vdup(float x) { return (vf)_mm256_set1_ps(x); }
FA_INLINE vf vfma(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
FA_INLINE vf vdup(float x) { return (vf){x, x, x, x}; }
FA_INLINE vf vfma(vf a, vf b, vf c) {
  vf r;
  for (int j = 0; j < VL; j++) r[j] = fmaf(a[j], b[j], c[j]);
  return r;
}
#endif
/* mask ? a : b, lane by lane (mask lanes are 0 or -1). */
FA_INLINE vf vsel(vi mask, vf a, vf b) {
  return (vf)((mask & (vi)a) | (~mask & (vi)b));
}

/* b > a ? b : a lane by lane, i.e. max(a, b) keeping a where b is NaN or
 * equal: one MAXPS (it returns its second operand unless the first is
 * greater) at every level, so every level gets the same bits. As a select
 * it compiled to a compare and two masked xors, a chain that made the
 * row-max loop ~8% of the forward (AMD Zen 5, 1 thread). */
#if defined(__AVX512F__)
FA_INLINE vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)b, (__m512)a); }
#elif defined(__AVX2__) && defined(__FMA__)
FA_INLINE vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)b, (__m256)a); }
#elif defined(__x86_64__)
FA_INLINE vf vmax(vf a, vf b) { return (vf)_mm_max_ps((__m128)b, (__m128)a); }
#else
FA_INLINE vf vmax(vf a, vf b) { return vsel(b > a, b, a); }
#endif

/* floor(x) lane by lane (exact at every level). */
#if defined(__AVX512F__)
FA_INLINE vf vfloor(vf x) {
  return (vf)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
#elif defined(__AVX2__) && defined(__FMA__)
FA_INLINE vf vfloor(vf x) { return (vf)_mm256_floor_ps((__m256)x); }
#else
FA_INLINE vf vfloor(vf x) {
  for (int j = 0; j < VL; j++) x[j] = floorf(x[j]);
  return x;
}
#endif

/* exp(x) lane by lane, as Cephes expf: x = n ln2 + r with n = floor(x /
 * ln2 + 1/2), so |r| <= ln2/2 (ln2 split in two, n 0.693359375 exact), and
 * exp(r) by a degree-6 polynomial, every step one fused multiply-add; 2^n
 * from exponent bits; x < -87 (also -inf, i.e. masked scores) gives 0. At
 * most 1.01 ulp (8.4e-8 relative) from exp() in double on [-87, 0.5],
 * measured on every float there. The arguments here are scores minus their
 * row max, so <= 0 up to rounding. libm's expf does not vectorize without
 * -ffast-math. (The same steps as separate multiplies and adds, with floor
 * from a truncating conversion, were 0.98 ulp in ~30 instructions for ~20
 * here: the exponentials were ~17% of the forward's time.) */
FA_INLINE vf vexp(vf x) {
  vi tiny = x < vdup(-87.0f);
  vf xc = vsel(tiny, vdup(-87.0f), x);
  vf nf = vfloor(vfma(xc, vdup(1.44269504088896341f), vdup(0.5f)));
  vf r = vfma(nf, vdup(-0.693359375f), xc);
  r = vfma(nf, vdup(2.12194440e-4f), r);
  vf y = vdup(1.9875691500e-4f);
  y = vfma(y, r, vdup(1.3981999507e-3f));
  y = vfma(y, r, vdup(8.3334519073e-3f));
  y = vfma(y, r, vdup(4.1665795894e-2f));
  y = vfma(y, r, vdup(1.6666665459e-1f));
  y = vfma(y, r, vdup(5.0000001201e-1f));
  y = vfma(y, r * r, r);
  vi n = __builtin_convertvector(nf, vi);
  vf p2 = (vf)((n + 127) << 23); /* (1 + y) 2^n: 2^n exact, one rounding */
  return vsel(tiny, vdup(0.0f), vfma(y, p2, p2));
}

/* a[n] . b[n] with 16 lanes of partial sums, combined in a fixed order. */
FA_INLINE float dot16(const float *a, const float *b, int64_t n) {
  vf acc[16 / VL]; /* lanes 0 .. 15 of the partial sums */
  for (int k = 0; k < 16 / VL; k++) acc[k] = vdup(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16 / VL; k++)
      acc[k] = vfma(vld(a + i + k * VL), vld(b + i + k * VL), acc[k]);
  float s = 0.0f;
  for (int k = 0; k < 16 / VL; k++)
    for (int j = 0; j < VL; j++) s += acc[k][j];
  for (; i < n; i++) s = fmaf(a[i], b[i], s);
  return s;
}

/* One tile's operand rows packed transposed: At [DCH, BR] holds columns
 * d0 .. d0 + nd - 1 of the rows A [nr, HS] (lda floats apart), At[d][r] =
 * A[r, d0 + d], zero for r >= nr. `once`: HS <= DCH, packed before the key
 * loop (all of HS), else repacked per chunk by kq_tile. */
typedef struct fa_panel {
  const float *a;
  int64_t lda, nr;
  bool once;
  float (*t)[BR];
} fa_panel;

#if defined(__GNUC__) && !defined(__clang__)
/* GCC's __builtin_shuffle takes computed masks; clang (the fuzz build) has
 * only constant-index shuffles, so it packs element by element below: the
 * same values either way. */
#define FA_REG_TRANSPOSE 1
/* x[i][j] <- x[j][i]: log2(VL) stages, stage s swapping bit s of the row
 * index with bit s of the column index through two-input shuffles (one
 * permute instruction each on AVX-512). A copy: no value changes. */
FA_INLINE void transpose_vl(vf x[VL]) {
#pragma GCC unroll 4
  for (int s = VL / 2; s >= 1; s /= 2) {
    vi lo, hi; /* lane j: bit s clear keeps a's lane, set takes b's */
    for (int j = 0; j < VL; j++) {
      lo[j] = (j & s) ? VL + j - s : j;
      hi[j] = (j & s) ? VL + j : j + s;
    }
#pragma GCC unroll 16
    for (int i = 0; i < VL; i++)
      if (!(i & s)) {
        vf a = x[i], b = x[i + s];
        x[i] = __builtin_shuffle(a, b, lo);
        x[i + s] = __builtin_shuffle(a, b, hi);
      }
  }
}
#else
#define FA_REG_TRANSPOSE 0
#endif

/* Packs VL x VL blocks through registers (rows past nr as zero vectors);
 * column counts that are not whole vectors element by element. The
 * element-by-element pack was ~12% of the forward's time (GPT-2 `small`
 * heads, Intel AVX-512, 1 thread). */
FA_INLINE void pack_t(const fa_panel *p, int64_t d0, int64_t nd) {
#if FA_REG_TRANSPOSE
  if (nd % VL == 0) {
    for (int64_t rb = 0; rb < BR; rb += VL)
      for (int64_t d = 0; d < nd; d += VL) {
        vf x[VL];
        for (int i = 0; i < VL; i++)
          x[i] = rb + i < p->nr ? vld(p->a + (rb + i) * p->lda + d0 + d) : vdup(0.0f);
        transpose_vl(x);
        for (int j = 0; j < VL; j++) vst(p->t[d + j] + rb, x[j]);
      }
    return;
  }
#endif
  for (int64_t r = 0; r < BR; r++) {
    const float *a = p->a + (r < p->nr ? r : 0) * p->lda + d0;
    for (int64_t d = 0; d < nd; d++) p->t[d][r] = r < p->nr ? a[d] : 0.0f;
  }
}

FA_INLINE void panel_init(fa_panel *p, const float *a, int64_t lda, int64_t nr, int64_t HS,
                          float (*t)[BR]) {
  *p = (fa_panel){a, lda, nr, HS <= DCH, t};
  if (p->once) pack_t(p, 0, HS);
}

/* One register block of kq_tile: St[i][r] (+)= sum_{d < nd} k[i ldk + d]
 * At[d][r] for rows i < n_rows (<= RK; rows past it repeat the last row
 * and are not stored); `fresh`: St not read (the first head-size chunk). */
FA_INLINE void kq_block(const float *k, int64_t ldk, int64_t n_rows, bool fresh,
                        const float (*At)[BR], int64_t nd, float St[RK][BR]) {
  vf acc[RK][NV];
  for (int i = 0; i < RK; i++)
    for (int v = 0; v < NV; v++)
      acc[i][v] = fresh || i >= n_rows ? vdup(0.0f) : vld(St[i] + v * VL);
  for (int64_t d = 0; d < nd; d++) {
    vf a[NV];
    for (int v = 0; v < NV; v++) a[v] = vld(At[d] + v * VL);
    for (int i = 0; i < RK; i++) {
      vf x = vdup(k[(i < n_rows ? i : n_rows - 1) * ldk + d]);
      for (int v = 0; v < NV; v++) acc[i][v] = vfma(x, a[v], acc[i][v]);
    }
  }
  for (int i = 0; i < RK && i < n_rows; i++)
    for (int v = 0; v < NV; v++) vst(St[i] + v * VL, acc[i][v]);
}

/* St[c][r] = sum_d K[c, d] A[r, d] for key rows c < nk (K rows ldk floats
 * apart) and all BR lanes r of the panel A: RK key rows x 32 lanes stay in
 * registers while d runs in order 0, 1, ..., HS-1 (rows c >= nk are not
 * written). A full block gets RK as a constant, so its rows lie at fixed
 * offsets from one base: clamped per-row pointers spilled to the stack
 * inside the backward (one reload per broadcast). */
FA_INLINE void kq_tile(const float *K, int64_t ldk, int64_t nk, const fa_panel *A, int64_t HS,
                       float St[BC][BR]) {
  for (int64_t d0 = 0; d0 < HS; d0 += DCH) {
    int64_t nd = HS - d0 < DCH ? HS - d0 : DCH;
    if (!A->once) pack_t(A, d0, nd);
    const float(*At)[BR] = (const float(*)[BR])A->t;
    for (int64_t c = 0; c < nk; c += RK) {
      const float *k = K + c * ldk + d0;
      if (c + RK <= nk) kq_block(k, ldk, RK, d0 == 0, At, nd, St + c);
      else kq_block(k, ldk, nk - c, d0 == 0, At, nd, St + c);
    }
  }
}

/* Scores of key tile c0 (nk keys, rows kt) against query tile r0 (panel
 * qp) of head bh, transposed: St[c][r] = scale q_{r0+r} . k_{c0+c} plus the
 * key's mask bias (as the reference adds it to each scaled score), -inf
 * where a causal query r does not see key c. */
FA_INLINE void scores_t(const fa_geom *g, int64_t HS, int64_t bh, const fa_panel *qp,
                        const float *kt, int64_t ldk, int64_t r0, int64_t c0, int64_t nk,
                        float St[BC][BR]) {
  kq_tile(kt, ldk, nk, qp, HS, St);
  const float *mb = g->mask ? g->mask + (bh / g->NH) * g->T + c0 : NULL; /* mb [nk] */
  for (int64_t c = 0; c < nk; c++)
    for (int v = 0; v < NV; v++) {
      vf x = vld(St[c] + v * VL) * g->scale;
      if (mb) x = x + mb[c];
      vst(St[c] + v * VL, x);
    }
  /* causal: query r sees key c iff c0 + c <= r0 + r, so on a tile that
   * reaches past the diagonal, lanes r < c0 + c - r0 of row c are -inf,
   * selected per vector (a scalar store loop was ~2% of the forward) */
  if (g->causal && c0 + nk - 1 > r0) {
    vi lane;
    for (int j = 0; j < VL; j++) lane[j] = j;
    for (int64_t c = 0; c < nk; c++) {
      int64_t hide = c0 + c - r0;
      for (int v = 0; v < NV && hide > v * VL; v++)
        vst(St[c] + v * VL, vsel(lane + v * VL < (int32_t)(hide < BR ? hide : BR),
                                 vdup(-INFINITY), vld(St[c] + v * VL)));
    }
  }
}

/* Visible keys of each query row r < nr of the tile (queries r0.., keys
 * c0 .. c0 + nk - 1): row r sees keys s <= r0 + r when causal. */
FA_INLINE void visible(const fa_geom *g, int64_t r0, int64_t nr, int64_t c0, int64_t nk,
                       int64_t nv[BR]) {
  for (int64_t r = 0; r < nr; r++) {
    int64_t n = g->causal ? r0 + r - c0 + 1 : nk;
    nv[r] = n < 0 ? 0 : n > nk ? nk : n;
  }
}

/* Row max of the query lanes over key rows c < nk of a score tile: m <-
 * max(m, max_c St[c]), in two chains per vector (even and odd key rows)
 * so the loop waits less on each max's latency; max is exact, so the
 * grouping changes no value. */
FA_INLINE void max_update(float St[BC][BR], int64_t nk, vf m[NV]) {
  vf a0[NV], a1[NV];
  for (int h = 0; h < NV; h++) a0[h] = m[h], a1[h] = m[h];
  int64_t c = 0;
  for (; c + 1 < nk; c += 2)
    for (int h = 0; h < NV; h++) {
      a0[h] = vmax(a0[h], vld(St[c] + h * VL));
      a1[h] = vmax(a1[h], vld(St[c + 1] + h * VL));
    }
  for (int h = 0; h < NV; h++)
    m[h] = vmax(c < nk ? vmax(a0[h], vld(St[c] + h * VL)) : a0[h], a1[h]);
}

/* Online softmax statistics (Algorithm 1) of the query lanes over key rows
 * c < nk of a score tile: m <- max(m, max_c St[c]), p[c] = exp(St[c] - m)
 * (masked entries 0), l <- alpha l + sum_c p[c] (c in order) with alpha =
 * exp(m_old - m), returned; with `store` St[c] becomes p[c], else the
 * scores stay. A lane that has seen no visible key yet keeps m = -inf and
 * l = 0. */
FA_INLINE void stats_update(float St[BC][BR], int64_t nk, bool store, vf m[NV], vf l[NV],
                            vf alpha[NV]) {
  vf mo[NV];
  for (int h = 0; h < NV; h++) mo[h] = m[h];
  max_update(St, nk, m);
  for (int h = 0; h < NV; h++) {
    vf mt = m[h];
    vf ms = vsel(mt == vdup(-INFINITY), vdup(0.0f), mt);
    vf sum = vdup(0.0f);
    for (int64_t c = 0; c < nk; c++) {
      vf p = vexp(vld(St[c] + h * VL) - ms);
      if (store) vst(St[c] + h * VL, p);
      sum = sum + p;
    }
    alpha[h] = vexp(mo[h] - ms);
    l[h] = alpha[h] * l[h] + sum;
  }
}

/* Given the final row max ms (a lane that sees no key: 0), St[c] <-
 * exp(St[c] - ms) for c < nk and l += their sum (c in order): the
 * backward's kept tiles take this in place of stats_update's online sums,
 * so its second pass reads each exponential instead of forming it again. */
FA_INLINE void exp_sum(float St[BC][BR], int64_t nk, const vf ms[NV], vf l[NV]) {
  for (int h = 0; h < NV; h++)
    for (int64_t c = 0; c < nk; c++) {
      vf p = vexp(vld(St[c] + h * VL) - ms[h]);
      vst(St[c] + h * VL, p);
      l[h] = l[h] + p;
    }
}

/* Y[i, :] += sum_j W(i, j) X[j, :] for i < m, W(i, j) = W[i wi + j wj] (a
 * [32, 32] tile read as it lies or transposed), or with `fresh` Y[i, :] =
 * the sum (Y not read: the first tile's terms accumulate onto +0 as onto a
 * zeroed Y, the same bits, and the output needs no zeroing pass; zeroing
 * was ~6% of the backward's time): Y [m, HS], X [n, HS] with
 * rows ldy and ldx floats apart. j runs in order over [max(0, i4 + lo),
 * min(n, i4 + 4 + hi)), i4 = i rounded down to a multiple of 4: a causal
 * tile's rows skip the keys (or queries) whose weights are all zero in
 * their group of 4 rows, a range that does not depend on RB, so every
 * level sums the same terms (the scalar fallback for HS % (NC VL) != 0
 * too). With rs (not with `fresh`), Y[i, :] is first scaled by rs[i] as
 * it is loaded: the forward's rescale of o by exp(m_old - m_new) without
 * a pass of its own over o (the same multiply, so the same bits). */
#define FA_ALL (2 * BC) /* lo = -FA_ALL, hi = FA_ALL: every j < n */
_Static_assert(4 % RB == 0, "a register block lies in one group of 4 rows");
/* One register block of tile_acc: rows i < n_rows (<= RB) of Y [., NC VL]
 * (ldy apart) += sum_{j0 <= j < j1} W[i wi + j wj] X[j, :] (X rows ldx
 * apart); `fresh` and rs (rs[i]) as tile_acc's. */
FA_INLINE void acc_block(float *Y, int64_t ldy, const float *W, int64_t wi, int64_t wj,
                         const float *X, int64_t ldx, int64_t j0, int64_t j1, int64_t n_rows,
                         bool fresh, const float *rs) {
  const float *w[RB]; /* rows past n_rows repeat the last row; not stored */
  for (int ii = 0; ii < RB; ii++) w[ii] = W + (ii < n_rows ? ii : n_rows - 1) * wi;
  vf acc[RB][NC];
  for (int ii = 0; ii < RB; ii++)
    for (int k = 0; k < NC; k++) {
      acc[ii][k] = ii < n_rows && !fresh ? vld(Y + ii * ldy + k * VL) : vdup(0.0f);
      if (rs && ii < n_rows) acc[ii][k] = acc[ii][k] * rs[ii];
    }
  for (int64_t j = j0; j < j1; j++) {
    vf x[NC];
    for (int k = 0; k < NC; k++) x[k] = vld(X + j * ldx + k * VL);
    for (int ii = 0; ii < RB; ii++) {
      vf wv = vdup(w[ii][j * wj]);
      for (int k = 0; k < NC; k++) acc[ii][k] = vfma(wv, x[k], acc[ii][k]);
    }
  }
  for (int ii = 0; ii < RB && ii < n_rows; ii++)
    for (int k = 0; k < NC; k++) vst(Y + ii * ldy + k * VL, acc[ii][k]);
}

FA_INLINE void tile_acc(float *Y, int64_t ldy, const float *W, int64_t wi, int64_t wj,
                        const float *X, int64_t ldx, int64_t HS, int64_t m, int64_t n,
                        int64_t lo, int64_t hi, bool fresh, const float *rs) {
  if (HS % (NC * VL)) {
    for (int64_t i = 0; i < m && fresh; i++) memset(Y + i * ldy, 0, (size_t)HS * sizeof(float));
    for (int64_t i = 0; i < m && rs; i++)
      for (int64_t h = 0; h < HS; h++) Y[i * ldy + h] *= rs[i];
    for (int64_t i = 0; i < m; i++) {
      int64_t i4 = i & ~(int64_t)3, j0 = i4 + lo > 0 ? i4 + lo : 0,
              j1 = i4 + 4 + hi < n ? i4 + 4 + hi : n;
      for (int64_t j = j0; j < j1; j++) {
        float w = W[i * wi + j * wj];
        for (int64_t h = 0; h < HS; h++) Y[i * ldy + h] = fmaf(w, X[j * ldx + h], Y[i * ldy + h]);
      }
    }
    return;
  }
  for (int64_t h0 = 0; h0 < HS; h0 += NC * VL)
    for (int64_t i = 0; i < m; i += RB) {
      int64_t i4 = i & ~(int64_t)3, j0 = i4 + lo > 0 ? i4 + lo : 0,
              j1 = i4 + 4 + hi < n ? i4 + 4 + hi : n;
      const float *r = rs ? rs + i : NULL;
      if (i + RB <= m) /* RB a constant here: the rows' weights at fixed offsets */
        acc_block(Y + i * ldy + h0, ldy, W + i * wi, wi, wj, X + h0, ldx, j0, j1, RB, fresh, r);
      else
        acc_block(Y + i * ldy + h0, ldy, W + i * wi, wi, wj, X + h0, ldx, j0, j1, m - i, fresh, r);
    }
}

/* Philox4x32-10 (as core/philox.c) of DROP_BLOCKS counters side by side
 * (the rounds vectorize across blocks): w[q][l] = word q of block ctr[l].
 * With AVX-512 or AVX2 the 32 x 32 -> 64-bit products are vpmuludq on the
 * even and odd lanes (GCC's lowering of the generic loop widens every word
 * to 64 bits and multiplies 64 x 64); integer arithmetic, so the same words
 * at every level. */
enum { DROP_BLOCKS = 16 };
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
typedef __m512i vpi;
#define PW 16
#define P_SET1(x) _mm512_set1_epi32((int)(x))
#define P_MUL(a, b) _mm512_mul_epu32(a, b)
#define P_SRL(a) _mm512_srli_epi64(a, 32)
#define P_SLL(a) _mm512_slli_epi64(a, 32)
#define P_ODD(a, b) _mm512_mask_blend_epi32(0xAAAA, a, b) /* even lanes a, odd b */
#define P_XOR3(a, b, c) _mm512_ternarylogic_epi32(a, b, c, 0x96)
#else
typedef __m256i vpi;
#define PW 8
#define P_SET1(x) _mm256_set1_epi32((int)(x))
#define P_MUL(a, b) _mm256_mul_epu32(a, b)
#define P_SRL(a) _mm256_srli_epi64(a, 32)
#define P_SLL(a) _mm256_slli_epi64(a, 32)
#define P_ODD(a, b) _mm256_blend_epi32(a, b, 0xAA)
#define P_XOR3(a, b, c) _mm256_xor_si256(_mm256_xor_si256(a, b), c)
#endif
/* hi and lo 32 bits of a * m lane by lane (m the same in every lane). */
#if defined(__AVX512F__)
/* Each 64-bit product's halves moved to their lanes by one masked swap of
 * 32-bit pairs (instead of a shift and a blend). */
FA_INLINE void p_mulhilo(vpi a, vpi m, vpi *hi, vpi *lo) {
  vpi even = P_MUL(a, m), odd = P_MUL(P_SRL(a), m);
  *lo = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CDAB);
  *hi = _mm512_mask_shuffle_epi32(odd, 0x5555, even, _MM_PERM_CDAB);
}
#else
FA_INLINE void p_mulhilo(vpi a, vpi m, vpi *hi, vpi *lo) {
  vpi even = P_MUL(a, m), odd = P_MUL(P_SRL(a), m);
  *lo = P_ODD(even, P_SLL(odd));
  *hi = P_ODD(P_SRL(even), odd);
}
#endif
FA_INLINE void philox_batch(const fa_geom *g, const uint64_t ctr[DROP_BLOCKS],
                            uint32_t w[4][DROP_BLOCKS]) {
  uint32_t lo[DROP_BLOCKS], hi[DROP_BLOCKS]; /* the counters' two words */
  for (int l = 0; l < DROP_BLOCKS; l++) lo[l] = (uint32_t)ctr[l], hi[l] = (uint32_t)(ctr[l] >> 32);
  const vpi m0 = P_SET1(0xD2511F53u), m1 = P_SET1(0xCD9E8D57u);
  for (int v = 0; v < DROP_BLOCKS / PW; v++) {
    vpi c0, c1, c2 = P_SET1(g->step), c3 = P_SET1(g->step >> 32);
    memcpy(&c0, lo + v * PW, sizeof c0);
    memcpy(&c1, hi + v * PW, sizeof c1);
    uint32_t x0 = (uint32_t)g->key, x1 = (uint32_t)(g->key >> 32);
    for (int round = 0; round < 10; round++) {
      vpi h0, l0, h1, l1;
      p_mulhilo(c0, m0, &h0, &l0);
      p_mulhilo(c2, m1, &h1, &l1);
      vpi n0 = P_XOR3(h1, c1, P_SET1(x0)), n2 = P_XOR3(h0, c3, P_SET1(x1));
      c1 = l1, c3 = l0, c0 = n0, c2 = n2;
      x0 += 0x9E3779B9u, x1 += 0xBB67AE85u;
    }
    memcpy(w[0] + v * PW, &c0, sizeof c0);
    memcpy(w[1] + v * PW, &c1, sizeof c1);
    memcpy(w[2] + v * PW, &c2, sizeof c2);
    memcpy(w[3] + v * PW, &c3, sizeof c3);
  }
}
#else
FA_INLINE void philox_batch(const fa_geom *g, const uint64_t ctr[DROP_BLOCKS],
                            uint32_t w[4][DROP_BLOCKS]) {
  uint32_t k0 = (uint32_t)g->key, k1 = (uint32_t)(g->key >> 32);
  uint32_t s0 = (uint32_t)g->step, s1 = (uint32_t)(g->step >> 32);
#pragma omp simd
  for (int l = 0; l < DROP_BLOCKS; l++) {
    uint64_t b = ctr[l];
    uint32_t c_0 = (uint32_t)b, c_1 = (uint32_t)(b >> 32), c_2 = s0, c_3 = s1, x0 = k0, x1 = k1;
    for (int round = 0; round < 10; round++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * c_0, p1 = (uint64_t)0xCD9E8D57u * c_2;
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c_1 ^ x0, n2 = (uint32_t)(p0 >> 32) ^ c_3 ^ x1;
      c_1 = (uint32_t)p1, c_3 = (uint32_t)p0, c_0 = n0, c_2 = n2;
      x0 += 0x9E3779B9u, x1 += 0xBB67AE85u;
    }
    w[0][l] = c_0, w[1][l] = c_1, w[2][l] = c_2, w[3][l] = c_3;
  }
}
#endif

/* Dropout factors of a tile, transposed: Zt[c][r] for query r0 + r and key
 * c0 + c, c < nk; each element is decided as drop_factor decides it (the
 * same counter, key and word, the same integer threshold), bit for bit.
 * Query r's elements start at i0 + r T in the [B, NH, T, T] index space
 * (i0: element (r0, c0) of head bh). When T % 4 == 0 every query's key c is
 * word (i0 + c) % 4 of block (i0 + c) / 4 + r T / 4: one batch of 16
 * blocks, one per query lane, gives 4 whole rows of Zt, so the tile takes
 * 2 ceil(((i0 % 4) + nk) / 4) batches (16 for a full aligned tile) and no
 * transposition. Otherwise the blocks each query row needs (at most BC / 4
 * + 1) are listed and run in batches, and the factors are placed one by
 * one (lanes past nr and keys past nv[r] 0; their probabilities are 0). */
enum { DROP_MAX = BR * (BC / 4 + 1) + DROP_BLOCKS };
_Static_assert(BR == 2 * DROP_BLOCKS, "a tile's query lanes are two Philox batches");
FA_INLINE void drop_tile(const fa_geom *g, int64_t bh, int64_t r0, int64_t nr, int64_t c0,
                         int64_t nk, float Zt[BC][BR]) {
  uint64_t i0 = g->offset + (uint64_t)((fa_drop_bh(g, bh) * g->T + r0) * g->T + c0);
  vw thresh = (vw){0} + g->thresh;
  vf keep = vdup(g->keep_scale);
  if (g->T % 4 == 0) {
    uint64_t e0 = i0 & 3, step = (uint64_t)g->T / 4; /* blocks from one query to the next */
    for (int64_t j = 0; 4 * j < (int64_t)e0 + nk; j++)
      for (int h = 0; h < 2; h++) {
        uint64_t ctr[DROP_BLOCKS]; /* ctr [16]: block j of query lanes 16 h .. 16 h + 15 */
        uint32_t w[4][DROP_BLOCKS];
        for (int l = 0; l < DROP_BLOCKS; l++)
          ctr[l] = (i0 >> 2) + (uint64_t)j + (uint64_t)(h * DROP_BLOCKS + l) * step;
        philox_batch(g, ctr, w);
        for (int q = 0; q < 4; q++) {
          int64_t c = 4 * j + q - (int64_t)e0;
          if (c < 0 || c >= nk) continue;
          for (int v = 0; v < DROP_BLOCKS / VL; v++) {
            vw x;
            memcpy(&x, w[q] + v * VL, sizeof x);
            vst(Zt[c] + h * DROP_BLOCKS + v * VL, vsel((x >> 8) >= thresh, keep, vdup(0.0f)));
          }
        }
      }
    return;
  }
  int64_t nv[BR]; /* visible keys per query row */
  visible(g, r0, nr, c0, nk, nv);
  uint64_t ctr[DROP_MAX];  /* ctr [nb]: the blocks' counters, row by row */
  uint32_t w[4][DROP_MAX]; /* w[q][b]: word q of block ctr[b] */
  int64_t first[BR], nb = 0;
  for (int64_t r = 0; r < nr; r++) {
    uint64_t ir = i0 + (uint64_t)(r * g->T);
    first[r] = nb;
    if (nv[r] > 0)
      for (uint64_t b = ir >> 2; b <= (ir + (uint64_t)nv[r] - 1) >> 2; b++) ctr[nb++] = b;
  }
  for (int64_t b = nb; b % DROP_BLOCKS; b++) ctr[b] = 0; /* padding lanes, unread */
  uint32_t wb[4][DROP_BLOCKS];
  for (int64_t b0 = 0; b0 < nb; b0 += DROP_BLOCKS) {
    philox_batch(g, ctr + b0, wb);
    for (int q = 0; q < 4; q++) memcpy(w[q] + b0, wb[q], sizeof wb[q]);
  }
  for (int64_t c = 0; c < nk; c++) memset(Zt[c], 0, sizeof Zt[c]);
  for (int64_t r = 0; r < nr; r++) {
    uint64_t e0 = (i0 + (uint64_t)(r * g->T)) & 3; /* row r's key c: word e0 + c */
    for (int64_t c = 0; c < nv[r]; c++) {
      uint64_t e = e0 + (uint64_t)c;
      Zt[c][r] = (w[e & 3][first[r] + (int64_t)(e >> 2)] >> 8) >= g->thresh ? g->keep_scale
                                                                             : 0.0f;
    }
  }
}

/* Asks for rows [r0, min(r0 + BR, T)) of a head (rows ld floats apart, HS
 * floats each) ahead of their use, one hint per 64-byte line: a head's
 * rows lie ld = (NH + 2 NKV) HS floats apart in the packed qkv input, a
 * page or more, where the hardware prefetcher does not follow (GPT-2
 * `small` in the model, Intel AVX-512, 2 threads: forward 12.3 -> 11.3 ms a
 * step, backward 28.8 -> 26.2). The forward asks for k before its scores
 * and v after them: 256 hints in one burst stall on the line fill buffers
 * (forward 7.9 -> 7.6 ms a step split so). Hints only: the same bits. */
FA_INLINE void prefetch_rows(const float *base, int64_t ld, int64_t r0, int64_t T, int64_t HS) {
  for (int64_t r = r0; r < r0 + BR && r < T; r++)
    for (int64_t d = 0; d < HS; d += 16) __builtin_prefetch(base + r * ld + d, 0);
}

/* Keys a query tile [r0, r0 + nr) looks at: [0, end). */
FA_INLINE int64_t key_end(const fa_geom *g, int64_t r0, int64_t nr) {
  return g->causal ? r0 + nr : g->T;
}

/* Forward of one query tile (Algorithm 1/2), transposed tiles: running max
 * m and sum l of exp(S - m) per query lane; o accumulates (dropout-masked)
 * exp(S - m) v, rescaled by exp(m_old - m_new) when the max grows, and is
 * divided by l at the end. */
FA_INLINE void fwd_tile(const fa_geom *g, int64_t HS, int64_t bh, int64_t r0) {
  int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, kvh = bh / g->G;
  int64_t ldq = g->lq.ld, ldkv = g->lkv.ld, ldo = g->lo.ld;
  const float *qb = g->q + fa_head_off(g->lq, bh), *kb = g->k + fa_head_off(g->lkv, kvh),
              *vb = g->v + fa_head_off(g->lkv, kvh);
  float *ob = g->o + fa_head_off(g->lo, bh) + r0 * ldo; /* ob [nr, HS]: this tile's rows */
  _Alignas(64) float Qt[DCH][BR]; /* Qt [HS, BR]: the tile's q rows transposed */
  _Alignas(64) float St[BC][BR];  /* St [nk, BR]: scores, then probabilities */
  _Alignas(64) float Zt[BC][BR];  /* Zt [nk, BR]: dropout factors */
  _Alignas(64) float al[BR];      /* al [BR]: alpha per query */
  vf m[NV], l[NV], alpha[NV];   /* running max and sum per query lane */
  for (int h = 0; h < NV; h++) m[h] = vdup(-INFINITY), l[h] = vdup(0.0f);
  fa_panel qp;
  panel_init(&qp, qb + r0 * ldq, ldq, nr, HS, Qt);
  int64_t end = key_end(g, r0, nr);
  if (g->causal && r0 + BR < g->T) { /* the next query tile's rows, its one new key tile's */
    prefetch_rows(qb, ldq, r0 + BR, g->T, HS);
    prefetch_rows(kb, ldkv, r0 + BR, g->T, HS), prefetch_rows(vb, ldkv, r0 + BR, g->T, HS);
  }
  for (int64_t c0 = 0; c0 < end; c0 += BC) {
    int64_t nk = end - c0 < BC ? end - c0 : BC;
    bool next = c0 + BC < end; /* the next key tile's rows, k then v */
    if (next) prefetch_rows(kb, ldkv, c0 + BC, end, HS);
    scores_t(g, HS, bh, &qp, kb + c0 * ldkv, ldkv, r0, c0, nk, St);
    stats_update(St, nk, true, m, l, alpha);
    if (next) prefetch_rows(vb, ldkv, c0 + BC, end, HS);
    if (g->dropout) {
      drop_tile(g, bh, r0, nr, c0, nk, Zt);
      for (int64_t c = 0; c < nk; c++)
        for (int v = 0; v < NV; v++) vst(St[c] + v * VL, vld(St[c] + v * VL) * vld(Zt[c] + v * VL));
    }
    for (int v = 0; v < NV; v++) vst(al + v * VL, alpha[v]);
    /* o[r] = al[r] o[r] + sum_c P[c][r] v[c]; causal: keys past the row
     * group skipped; key tile 0 writes o fresh (nothing to rescale yet) */
    tile_acc(ob, ldo, &St[0][0], 1, BR, vb + c0 * ldkv, ldkv, HS, nr, nk, -FA_ALL,
             g->causal ? r0 - c0 : FA_ALL, c0 == 0, c0 > 0 ? al : NULL);
  }
  _Alignas(64) float lr[BR]; /* lr [BR]: l per query */
  for (int v = 0; v < NV; v++) vst(lr + v * VL, l[v]);
  for (int64_t r = 0; r < nr; r++) {
    float inv = lr[r] > 0 ? 1.0f / lr[r] : 0.0f;
    for (int64_t d = 0; d < HS; d++) ob[r * ldo + d] *= inv;
  }
}

void FA_NAME(fwd_job)(const fa_geom *g, int64_t bh, int64_t r0) {
  if (g->HS == 64) fwd_tile(g, 64, bh, r0);
  else if (g->HS == 128) fwd_tile(g, 128, bh, r0);
  else fwd_tile(g, g->HS, bh, r0);
}

/* Backward of one query head (Algorithm 4 with the loops swapped, so one
 * thread owns a head): for each query tile (q and dO packed transposed
 * once), pass 1 recomputes the row max m and sum l and D = rowsum(dO o);
 * pass 2 walks the key tiles again with P = exp(S - m) / l and accumulates
 * dq (this tile's rows), dk and dv (the key tile's rows of the head's kv
 * head) in the output, each written fresh by its first tile (tile_acc).
 * With T <= SC_TILES BC, pass 1 keeps the query tile's score tiles (Sc,
 * 128 KiB of stack): it takes the exact row max over all of them, then
 * replaces each score by exp(S - m) while summing l, and pass 2 reads
 * those instead of recomputing q k^T (a sixth of the backward's
 * multiply-adds) and the exponential (GPT-2 `small` heads at one thread:
 * the backward 0.89x). Longer rows recompute both, with m and l formed
 * online (stats_update) as the forward forms them. */
enum { SC_TILES = 32 };
FA_INLINE void bwd_head(const fa_geom *g, int64_t HS, int64_t bh) {
  int64_t q0 = fa_head_off(g->lq, bh), kv0 = fa_head_off(g->lkv, bh / g->G),
          o0 = fa_head_off(g->lo, bh);
  int64_t ldq = g->lq.ld, ldkv = g->lkv.ld, ldo = g->lo.ld;
  const float *qb = g->q + q0, *kb = g->k + kv0, *vb = g->v + kv0, *ob = g->o + o0,
              *dob = g->dO + o0;
  float *dqb = g->dq + q0, *dkb = g->dk + kv0, *dvb = g->dv + kv0;
  _Alignas(64) float Sc[SC_TILES][BC][BR]; /* Sc [T / BC, nk, BR]: the tile's scores */
  bool cached = g->T <= SC_TILES * BC;
  for (int64_t r0 = 0; r0 < g->T; r0 += BR) {
    int64_t nr = g->T - r0 < BR ? g->T - r0 : BR, end = key_end(g, r0, nr);
    _Alignas(64) float Qt[DCH][BR];  /* Qt [HS, BR]: q rows transposed */
    _Alignas(64) float dOt[DCH][BR]; /* dOt [HS, BR]: dO rows transposed */
    _Alignas(64) float St1[BC][BR];  /* St1 [nk, BR]: scores, then Pd = P z (uncached) */
    _Alignas(64) float dSt[BC][BR];  /* dSt [nk, BR]: dPd = v dO^T, then scale dS */
    _Alignas(64) float Zt[BC][BR];   /* Zt [nk, BR]: dropout factors */
    _Alignas(64) float Dr[BR];       /* Dr [BR]: rowsum(dO o), 0 past nr */
    vf m[NV], l[NV], alpha[NV], il[NV], D[NV];
    fa_panel qp, dop;
    panel_init(&qp, qb + r0 * ldq, ldq, nr, HS, Qt);
    panel_init(&dop, dob + r0 * ldo, ldo, nr, HS, dOt);
    for (int h = 0; h < NV; h++) m[h] = vdup(-INFINITY), l[h] = vdup(0.0f);
    if (r0 + BR < g->T) { /* the next query tile's rows; its one new key tile's */
      prefetch_rows(qb, ldq, r0 + BR, g->T, HS), prefetch_rows(dob, ldo, r0 + BR, g->T, HS);
      prefetch_rows(ob, ldo, r0 + BR, g->T, HS), prefetch_rows(kb, ldkv, r0 + BR, g->T, HS);
    }
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nk = end - c0 < BC ? end - c0 : BC;
      float(*S)[BR] = cached ? Sc[c0 / BC] : St1;
      scores_t(g, HS, bh, &qp, kb + c0 * ldkv, ldkv, r0, c0, nk, S);
      if (cached) max_update(S, nk, m);
      else stats_update(S, nk, false, m, l, alpha);
    }
    for (int h = 0; h < NV; h++) m[h] = vsel(m[h] == vdup(-INFINITY), vdup(0.0f), m[h]);
    if (cached) /* the exact max first, then one exponential per score */
      for (int64_t c0 = 0; c0 < end; c0 += BC)
        exp_sum(Sc[c0 / BC], end - c0 < BC ? end - c0 : BC, m, l);
    for (int64_t r = 0; r < BR; r++)
      Dr[r] = r < nr ? dot16(dob + (r0 + r) * ldo, ob + (r0 + r) * ldo, HS) : 0.0f;
    for (int h = 0; h < NV; h++) {
      D[h] = vld(Dr + h * VL);
      il[h] = 1.0f / l[h];
    }
    if (r0 + BR < g->T) prefetch_rows(vb, ldkv, r0 + BR, g->T, HS);
    for (int64_t c0 = 0; c0 < end; c0 += BC) {
      int64_t nk = end - c0 < BC ? end - c0 : BC;
      float(*St)[BR] = cached ? Sc[c0 / BC] : St1;
      if (!cached) scores_t(g, HS, bh, &qp, kb + c0 * ldkv, ldkv, r0, c0, nk, St);
      kq_tile(vb + c0 * ldkv, ldkv, nk, &dop, HS, dSt);
      if (g->dropout) drop_tile(g, bh, r0, nr, c0, nk, Zt);
      /* Every lane is computed (invisible entries give P = dS = 0; lanes
       * past nr are never summed), so the tile products need no masks. */
      for (int64_t c = 0; c < nk; c++)
        for (int h = 0; h < NV; h++) {
          vf e = cached ? vld(St[c] + h * VL) : vexp(vld(St[c] + h * VL) - m[h]);
          vf p = e * il[h], dp = vld(dSt[c] + h * VL);
          if (g->dropout) {
            vf z = vld(Zt[c] + h * VL);
            vst(dSt[c] + h * VL, (p * (z * dp - D[h])) * g->scale);
            vst(St[c] + h * VL, p * z);
          } else {
            vst(dSt[c] + h * VL, (p * (dp - D[h])) * g->scale);
            vst(St[c] + h * VL, p);
          }
        }
      /* dv[c] += sum_r Pd[c][r] dO[r];  dk[c] += sum_r dS[c][r] q[r]: the
       * tiles as they lie; causal: queries before the row group skipped */
      int64_t lo = g->causal ? c0 - r0 : -FA_ALL, hi = g->causal ? r0 - c0 : FA_ALL;
      /* the group's first head's first query tile that sees key tile c0
       * (all of its rows: BR == BC) writes dk, dv fresh */
      bool kv_fresh = bh % g->G == 0 && (g->causal ? r0 == c0 : r0 == 0);
      tile_acc(dvb + c0 * ldkv, ldkv, &St[0][0], BR, 1, dob + r0 * ldo, ldo, HS, nk, nr, lo,
               FA_ALL, kv_fresh, NULL);
      tile_acc(dkb + c0 * ldkv, ldkv, &dSt[0][0], BR, 1, qb + r0 * ldq, ldq, HS, nk, nr, lo,
               FA_ALL, kv_fresh, NULL);
      /* dq[r] += sum_c dS[c][r] k[c]: the tile read transposed; key tile 0
       * writes it fresh */
      tile_acc(dqb + r0 * ldq, ldq, &dSt[0][0], 1, BR, kb + c0 * ldkv, ldkv, HS, nr, nk,
               -FA_ALL, hi, c0 == 0, NULL);
    }
  }
}

/* Kv head kvh and its G query heads, in order: the thread writes only their
 * rows (no races), and dk, dv sum over the group in a fixed order. */
void FA_NAME(bwd_job)(const fa_geom *g, int64_t kvh) {
  for (int64_t bh = kvh * g->G; bh < (kvh + 1) * g->G; bh++) {
    if (g->HS == 64) bwd_head(g, 64, bh);
    else if (g->HS == 128) bwd_head(g, 128, bh);
    else bwd_head(g, g->HS, bh);
  }
}
