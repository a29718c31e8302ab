/* ops/fa.h - what the FlashAttention op (ops/attention.c) shares with its
 * tile kernels (ops/fa_tiles.h, compiled once per ISA level in
 * fa_tiles_<isa>.c): tile sizes, the problem's geometry, the dropout factor.
 * Layer: ops (internal). */
#ifndef SLAPO_OPS_FA_H
#define SLAPO_OPS_FA_H

#include "ops/internal.h"

/* Tile sizes of the fast kernels: a [BR, BC] score tile (4 KiB) plus the
 * touched rows of q, k, v (BR + 2 BC rows of HS floats) stay in L1/L2. */
#define BR 32
#define BC 32
_Static_assert(BR == BC, "transpose_tile needs square tiles");

/* Where the rows of one tensor's heads are: row t of head `idx` (counted
 * over B * n heads) starts at (idx / n) sb + (idx % n) sh + t ld floats.
 * [B, n, T, HS] contiguous: sb = n T HS, sh = T HS, ld = HS; heads packed
 * in the last axis of [B, T, W] (the Linear's output): sb = T W, sh = HS,
 * ld = W. */
typedef struct fa_rows {
  int64_t n, sb, sh, ld;
} fa_rows;

static inline int64_t fa_head_off(fa_rows l, int64_t idx) {
  return (idx / l.n) * l.sb + (idx % l.n) * l.sh;
}

typedef struct fa_geom {
  int64_t BH, T, HS; /* B * NH query heads of [T, HS] each         */
  int64_t NH, G;     /* query heads per batch row; per kv head (GQA) */
  const float *mask; /* [B, T] additive key bias, or NULL          */
  bool causal;       /* query t sees keys s <= t                    */
  float scale;       /* on q k^T; default 1/sqrt(HS)                */
  bool dropout;      /* training and p > 0                          */
  double p;
  float keep_scale;  /* 1/(1-p), as the dropout op computes it      */
  uint32_t thresh;   /* keep iff (word >> 8) >= thresh = ceil(p 2^24) */
  uint64_t seed, stream, step, offset;
  /* Tensor parallelism: these heads are [head0, head0 + NH) of NHg heads
   * (NHg 0: all of them), so dropout draws the unsharded model's mask. */
  int64_t head0, NHg;
  uint64_t key;      /* slapo_rng_key(seed, stream), hashed once      */
  /* Fast kernels: the tensors and their row layouts: q and dq (lq), k, v,
   * dk and dv (lkv, over BH / G kv heads), o and dO (lo). */
  fa_rows lq, lkv, lo;
  const float *q, *k, *v, *dO;
  float *o, *dq, *dk, *dv; /* o is read only by the backward */
} fa_geom;

/* Offset of kv head bh / G's rows in [BH / G, T, HS], the one query head bh
 * reads (grouped heads: bh = (b NKV + j) G + i for kv head j of batch row
 * b); the reference kernels' contiguous layout. */
static inline int64_t fa_kv_base(const fa_geom *g, int64_t bh) { return bh / g->G * g->T * g->HS; }

/* The head index bh = b NH + h in the unsharded [B, NHg, T, T] index space. */
static inline int64_t fa_drop_bh(const fa_geom *g, int64_t bh) {
  return g->NHg ? bh / g->NH * g->NHg + g->head0 + bh % g->NH : bh;
}

/* Dropout factor of P[bh, t, s]: keep_scale or 0, decided exactly as the
 * dropout op decides element ((bh T) + t) T + s of the [B, NH, T, T] tensor. */
static inline float drop_factor(const fa_geom *g, int64_t bh, int64_t t, int64_t s) {
  if (!g->dropout) return 1.0f;
  uint64_t i = g->offset + (uint64_t)((fa_drop_bh(g, bh) * g->T + t) * g->T + s);
  float u4[4];
  slapo_rng_uniform4(g->key, g->step, i >> 2, u4); /* key hashed once per kernel */
  float u = u4[i & 3];
  return (double)u >= g->p ? g->keep_scale : 0.0f;
}

/* The attributes (causal, scale, dropout, RNG key) of `node` into g. */
void slapo__fa_attrs(fa_geom *g, const slapo_node *node, const slapo_kernel_env *env);
/* Runs a set-up geometry (ops/fa_kernels.c): the forward writes o; the
 * backward zeroes and writes dq, dk, dv, which lie inside out [n_out]. */
void slapo__fa_forward(const fa_geom *g, bool reference);
void slapo__fa_backward(const fa_geom *g, bool reference, float *out, int64_t n_out);

/* The four kernels of an op form (reference and fast, forward and
 * backward) from its two set-up functions forward_kernel and
 * backward_kernel(node, in, out, env, reference). */
#define FA_OP_KERNELS                                                                       \
  static void fa_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out, \
                     const slapo_kernel_env *env) {                                         \
    forward_kernel(node, in, out, env, true);                                               \
  }                                                                                         \
  static void fa_fast(const slapo_node *node, const slapo_tensor *const *in,                \
                      slapo_tensor *out, const slapo_kernel_env *env) {                     \
    forward_kernel(node, in, out, env, false);                                              \
  }                                                                                         \
  static void fa_backward_ref(const slapo_node *node, const slapo_tensor *const *in,        \
                              slapo_tensor *out, const slapo_kernel_env *env) {             \
    backward_kernel(node, in, out, env, true);                                              \
  }                                                                                         \
  static void fa_backward_fast(const slapo_node *node, const slapo_tensor *const *in,       \
                               slapo_tensor *out, const slapo_kernel_env *env) {            \
    backward_kernel(node, in, out, env, false);                                             \
  }

/* The tile kernels of each ISA level: fwd_job computes query tile r0 of
 * head bh, bwd_job every gradient row of kv head kvh and of its G query
 * heads (see ops/fa_tiles.h). */
void slapo__fa_fwd_job_baseline(const fa_geom *g, int64_t bh, int64_t r0);
void slapo__fa_fwd_job_avx2(const fa_geom *g, int64_t bh, int64_t r0);
void slapo__fa_fwd_job_avx512(const fa_geom *g, int64_t bh, int64_t r0);
void slapo__fa_bwd_job_baseline(const fa_geom *g, int64_t kvh);
void slapo__fa_bwd_job_avx2(const fa_geom *g, int64_t kvh);
void slapo__fa_bwd_job_avx512(const fa_geom *g, int64_t kvh);

#endif
