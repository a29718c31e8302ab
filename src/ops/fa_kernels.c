/* ops/fa_kernels.c - the FlashAttention kernels behind both op forms
 * (ops/attention.c: heads split [B, NH, T, HS]; ops/attention_qkv.c: heads
 * packed in the projections' [B, T, W] rows), over a fa_geom whose row
 * layouts say where each head's rows are: the attributes read once, the
 * reference kernels (one query row at a time, scores recomputed per pass,
 * double accumulation) and the drivers of the tile kernels (ops/fa_tiles.h,
 * one per ISA level). Derivation: docs/flash_attention_backward.md.
 * Layer: ops. */
#include <math.h>
#include <string.h>

#include "ops/fa.h"

void slapo__fa_attrs(fa_geom *g, const slapo_node *node, const slapo_kernel_env *env) {
  g->causal = slapo_node_attr_int(node, "causal", 0) != 0;
  g->scale = (float)slapo_node_attr_float(node, "scale", 1.0 / sqrt((double)(g->HS ? g->HS : 1)));
  g->p = slapo_node_attr_float(node, "dropout_p", 0.0);
  g->dropout = env && env->training && g->p > 0;
  g->keep_scale = g->p < 1 ? (float)(1.0 / (1.0 - g->p)) : 0.0f;
  /* u = (word >> 8) 2^-24 >= p exactly when word >> 8 >= ceil(p 2^24) (p
   * 2^24 is exact in double): the dropout op's integer test. */
  g->thresh = (uint32_t)ceil(g->p * 16777216.0);
  g->seed = env ? env->seed : 0;
  g->step = env ? env->step : 0;
  g->stream = (uint64_t)slapo_node_attr_int(node, "stream", 0);
  g->offset = (uint64_t)slapo_node_attr_int(node, "offset", 0);
  g->head0 = slapo_node_attr_int(node, "head_offset", 0);
  g->NHg = slapo_node_attr_int(node, "n_head_total", 0);
  g->key = slapo_rng_key(g->seed, g->stream);
}

/* Number of keys query t sees. */
static inline int64_t n_keys(const fa_geom *g, int64_t t) { return g->causal ? t + 1 : g->T; }

/* ---- reference kernels ---- */

static double dot_d(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* Score of query row qt and key s (rows of kb) of head bh: scale q_t . k_s
 * plus the key's mask bias. */
static double score(const fa_geom *g, int64_t bh, const float *qt, const float *kb, int64_t s) {
  double x = g->scale * dot_d(qt, kb + s * g->lkv.ld, g->HS);
  return g->mask ? x + g->mask[(bh / g->NH) * g->T + s] : x;
}

/* Max m and sum l of exp(score - m) of query t over the keys it sees, so
 * P = exp(score - m) / l. Kept apart rather than as m + log(l): with Hugging
 * Face's mask bias (-3.4e38) a fully padded row has m = -3.4e38 and log(l)
 * vanishes in the sum, which would make every P 1 instead of 1/T. */
static void row_stats(const fa_geom *g, int64_t bh, const float *qt, const float *kb, int64_t t,
                      double *m, double *l) {
  int64_t n = n_keys(g, t);
  *m = -INFINITY, *l = 0;
  for (int64_t s = 0; s < n; s++) {
    double x = score(g, bh, qt, kb, s);
    *m = x > *m ? x : *m;
  }
  for (int64_t s = 0; s < n; s++) *l += exp(score(g, bh, qt, kb, s) - *m);
}

/* Output columns are accumulated in double, DC at a time (scores recomputed
 * per chunk, so the kernel needs no heap). */
#define DC 64

static void forward_ref(const fa_geom *g) {
  for (int64_t bh = 0; bh < g->BH; bh++) {
    int64_t kv0 = fa_head_off(g->lkv, bh / g->G);
    const float *kb = g->k + kv0, *vb = g->v + kv0;
    for (int64_t t = 0; t < g->T; t++) {
      const float *qt = g->q + fa_head_off(g->lq, bh) + t * g->lq.ld;
      float *ot = g->o + fa_head_off(g->lo, bh) + t * g->lo.ld;
      double m, l;
      row_stats(g, bh, qt, kb, t, &m, &l);
      for (int64_t d0 = 0; d0 < g->HS; d0 += DC) {
        int64_t nd = g->HS - d0 < DC ? g->HS - d0 : DC;
        double acc[DC] = {0}; /* acc [nd]: o_t[d0 : d0 + nd] */
        for (int64_t s = 0; s < n_keys(g, t); s++) {
          double pr = exp(score(g, bh, qt, kb, s) - m) / l;
          pr *= drop_factor(g, bh, t, s);
          for (int64_t d = 0; d < nd; d++) acc[d] += pr * vb[s * g->lkv.ld + d0 + d];
        }
        for (int64_t d = 0; d < nd; d++) ot[d0 + d] = (float)acc[d];
      }
    }
  }
}

/* Backward, straight from the derivation: P = exp(S - m) / l, Pd = P z,
 * dPd = dO v^T, dS = P (z dPd - D), D = rowsum(dO o), dq = scale dS k,
 * dk = scale dS^T q, dv = Pd^T dO; z = the dropout factor. With grouped
 * heads, dk and dv of a kv head sum over its query heads. The gradients
 * must have been zeroed. */
static void backward_ref(const fa_geom *g) {
  for (int64_t bh = 0; bh < g->BH; bh++) {
    int64_t kv0 = fa_head_off(g->lkv, bh / g->G), ldkv = g->lkv.ld;
    const float *kb = g->k + kv0, *vb = g->v + kv0;
    for (int64_t t = 0; t < g->T; t++) {
      int64_t qrow = fa_head_off(g->lq, bh) + t * g->lq.ld;
      int64_t orow = fa_head_off(g->lo, bh) + t * g->lo.ld;
      const float *qt = g->q + qrow, *dOt = g->dO + orow;
      double m, l;
      row_stats(g, bh, qt, kb, t, &m, &l);
      double D = dot_d(dOt, g->o + orow, g->HS);
      for (int64_t s = 0; s < n_keys(g, t); s++) {
        const float *ks = kb + s * ldkv, *vs = vb + s * ldkv;
        int64_t col = kv0 + s * ldkv;
        double pr = exp(score(g, bh, qt, kb, s) - m) / l;
        double z = drop_factor(g, bh, t, s);
        double ds = pr * (z * dot_d(dOt, vs, g->HS) - D) * g->scale;
        for (int64_t d = 0; d < g->HS; d++) {
          g->dq[qrow + d] += (float)(ds * ks[d]);
          g->dk[col + d] += (float)(ds * qt[d]);
          g->dv[col + d] += (float)(pr * z * dOt[d]);
        }
      }
    }
  }
}

/* ---- tile-kernel drivers ---- */

void slapo__fa_forward(const fa_geom *g, bool reference) {
  if (reference) {
    forward_ref(g);
    return;
  }
  int64_t n_qt = (g->T + BR - 1) / BR;
  slapo_isa isa = slapo_isa_active();
  void (*fwd)(const fa_geom *, int64_t, int64_t) =
      isa >= SLAPO_ISA_AVX512 ? slapo__fa_fwd_job_avx512
      : isa == SLAPO_ISA_AVX2 ? slapo__fa_fwd_job_avx2 : slapo__fa_fwd_job_baseline;
  int64_t work = g->BH * g->T * (g->causal ? g->T / 2 + 1 : g->T) * (g->HS ? 2 * g->HS : 1);
  int nt = slapo__threads_for(work);
  /* A head's query tiles in order on one thread where the heads go round
   * evenly (at least 4 a thread, a multiple of the thread count, so whole
   * heads cost no balance): its k and v rows, read from memory by the first
   * tile, are in that core's cache for the next (tile by tile, the threads
   * shared each head and each fetched its rows) */
  int64_t chunk = g->BH >= 4 * (int64_t)nt && g->BH % nt == 0 ? n_qt : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, chunk)
  for (int64_t job = 0; job < g->BH * n_qt; job++) fwd(g, job / n_qt, (job % n_qt) * BR);
}

void slapo__fa_backward(const fa_geom *g, bool reference, float *out, int64_t n_out) {
  if (reference) {
    memset(out, 0, (size_t)n_out * sizeof(float));
    backward_ref(g);
    return;
  }
  slapo_isa isa = slapo_isa_active();
  void (*bwd)(const fa_geom *, int64_t) =
      isa >= SLAPO_ISA_AVX512 ? slapo__fa_bwd_job_avx512
      : isa == SLAPO_ISA_AVX2 ? slapo__fa_bwd_job_avx2 : slapo__fa_bwd_job_baseline;
  int64_t work = g->BH * g->T * (g->causal ? g->T / 2 + 1 : g->T) * (g->HS ? 5 * g->HS : 1);
  /* One job per kv head, which owns (and zeroes) its dk, dv rows and those
   * of dq of its G query heads: no races, a fixed summation order. */
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(dynamic, 1)
  for (int64_t kvh = 0; kvh < g->BH / g->G; kvh++) bwd(g, kvh);
}
