/* ops/gemm_ref.c - the reference batched GEMM shared by "matmul" and
 * "linear" (see ops/gemm.h), and the translation of tensors (strides,
 * transposes, broadcast batch dims) into a slapo__gemm problem.
 * Math: C[b, m, n] = sum_k A[b, m, k] * B[b, k, n] (+ bias[n]), accumulated
 * in double in ascending k, so both loop orders below give the same bits.
 * Layer: ops. */
#include "slapo/ops/gemm.h"

#include "ops/internal.h"

/* Batch strides of operand t (logical [.., R, S]) against C's batch shape:
 * missing leading dims and size-1 dims broadcast (stride 0). */
static void batch_strides(const slapo__gemm *g, const slapo_tensor *t, int64_t *bs) {
  int tb = t->ndim - 2;
  for (int i = 0; i < g->nb; i++) {
    int j = i - (g->nb - tb);
    if (j < 0 || t->shape[j] == 1) {
      bs[i] = 0;
    } else {
      SLAPO_ASSERT(t->shape[j] == g->batch[i]);
      bs[i] = t->strides[j];
    }
  }
}

void slapo__gemm_init(slapo__gemm *g, const slapo_tensor *a, bool trans_a, const slapo_tensor *b,
                      bool trans_b, const slapo_tensor *bias, slapo_tensor *c) {
  SLAPO_ASSERT(a->ndim >= 2 && b->ndim >= 2 && c->ndim >= 2);
  SLAPO_ASSERT(slapo_tensor_is_contiguous(c));
  *g = (slapo__gemm){0};
  g->nb = c->ndim - 2;
  for (int i = 0; i < g->nb; i++) g->batch[i] = c->shape[i];
  g->M = c->shape[g->nb];
  g->N = c->shape[g->nb + 1];

  int na = a->ndim, nbb = b->ndim;
  /* A [.., M, K]: trans_a stores it as [.., K, M], i.e. swapped strides. */
  g->K = trans_a ? a->shape[na - 2] : a->shape[na - 1];
  g->a_sm = trans_a ? a->strides[na - 1] : a->strides[na - 2];
  g->a_sk = trans_a ? a->strides[na - 2] : a->strides[na - 1];
  SLAPO_ASSERT((trans_a ? a->shape[na - 1] : a->shape[na - 2]) == g->M);
  /* B [.., K, N]: trans_b stores it as [.., N, K]. */
  g->b_sk = trans_b ? b->strides[nbb - 1] : b->strides[nbb - 2];
  g->b_sn = trans_b ? b->strides[nbb - 2] : b->strides[nbb - 1];
  SLAPO_ASSERT((trans_b ? b->shape[nbb - 1] : b->shape[nbb - 2]) == g->K);
  SLAPO_ASSERT((trans_b ? b->shape[nbb - 2] : b->shape[nbb - 1]) == g->N);
  SLAPO_ASSERT(a->dtype == b->dtype && (a->dtype == SLAPO_DTYPE_F32 || a->dtype == SLAPO_DTYPE_BF16));
  g->bf16 = a->dtype == SLAPO_DTYPE_BF16;
  batch_strides(g, a, g->a_bs);
  batch_strides(g, b, g->b_bs);
  g->a = slapo_tensor_data(a);
  g->b = slapo_tensor_data(b);
  if (bias) {
    SLAPO_ASSERT(bias->ndim == 1 && bias->shape[0] == g->N);
    g->bias = slapo_tensor_data(bias);
    g->bias_sn = bias->strides[0];
  }
  g->c = slapo_tensor_data(c);
}

/* Element i of operand p (f32, or bf16 widened exactly). */
static inline double ld(const void *p, int64_t i, bool bf16) {
  return bf16 ? (double)slapo_bf16_to_f32(((const uint16_t *)p)[i]) : (double)((const float *)p)[i];
}

/* Columns per tile of the row-accumulating loop (doubles on the stack). */
#define N_TILE 256

void slapo__gemm_ref(const slapo__gemm *g) {
  int64_t nbatch = 1;
  for (int i = 0; i < g->nb; i++) nbatch *= g->batch[i];
  const int64_t M = g->M, N = g->N, K = g->K;
  const int64_t rows = nbatch * M;
  if (rows == 0 || N == 0) return;

#pragma omp parallel for num_threads(slapo__threads_for(rows * N * (K + 1))) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t bi = r / M, m = r % M;
    /* Offsets of this batch entry in A and B (row-major unravel of bi). */
    int64_t ao = 0, bo = 0;
    for (int i = g->nb - 1; i >= 0; i--) {
      int64_t idx = bi % g->batch[i];
      bi /= g->batch[i];
      ao += idx * g->a_bs[i];
      bo += idx * g->b_bs[i];
    }
    const int64_t arow = ao + m * g->a_sm; /* A[b, m, :] stride a_sk */
    const int64_t bmat = bo;               /* B[b] [K, N] */
    const bool h = g->bf16;
    float *crow = g->c + r * N;            /* C[b, m, :] contiguous */

    if (g->b_sn == 1 && N > 1) {
      /* B's rows are contiguous: sweep them, keeping a tile of accumulators,
       * so B is read in order (the dot form would stride across rows). */
      for (int64_t n0 = 0; n0 < N; n0 += N_TILE) {
        int64_t nt = N - n0 < N_TILE ? N - n0 : N_TILE;
        double acc[N_TILE]; /* acc [nt] */
        for (int64_t j = 0; j < nt; j++) acc[j] = 0.0;
        for (int64_t k = 0; k < K; k++) {
          double av = ld(g->a, arow + k * g->a_sk, h);
          const int64_t brow = bmat + k * g->b_sk + n0; /* B[b, k, n0:] */
          for (int64_t j = 0; j < nt; j++) acc[j] += av * ld(g->b, brow + j, h);
        }
        for (int64_t j = 0; j < nt; j++) {
          double v = acc[j];
          if (g->bias) v += g->bias[(n0 + j) * g->bias_sn];
          crow[n0 + j] = (float)v;
        }
      }
    } else {
      for (int64_t n = 0; n < N; n++) {
        const int64_t bcol = bmat + n * g->b_sn; /* B[b, :, n] stride b_sk */
        double acc = 0.0;
        for (int64_t k = 0; k < K; k++)
          acc += ld(g->a, arow + k * g->a_sk, h) * ld(g->b, bcol + k * g->b_sk, h);
        if (g->bias) acc += g->bias[n * g->bias_sn];
        crow[n] = (float)acc;
      }
    }
  }
}
