/* slapo/ops/gemm.h - the batched GEMM behind "matmul" and "linear":
 *   C[.., M, N] = A[.., M, K] @ B[.., K, N] (+ bias[N])
 * with NumPy-broadcast batch dims and arbitrary element strides, so a
 * transposed operand is only a swap of two strides. The reference loop is in
 * gemm_ref.c, the oneDNN matmul fast path in gemm_dnnl.c.
 * Layer: ops; public (not stable API) because the dnnl compiler
 * backend runs its fused GEMMs through it. */
#ifndef SLAPO_OPS_GEMM_H
#define SLAPO_OPS_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "slapo/tensor.h"

/* One GEMM problem, in elements. Batch strides of 0 broadcast an operand
 * along that batch dim. C is contiguous with shape [batch.., M, N]. */
typedef struct slapo__gemm {
  int nb;                               /* number of batch dims */
  int64_t batch[SLAPO_MAX_DIMS];        /* C's batch shape [nb] */
  int64_t M, N, K;
  bool bf16;                            /* A and B hold bf16, else f32 */
  const void *a;                        /* A [.., M, K] */
  int64_t a_bs[SLAPO_MAX_DIMS], a_sm, a_sk;
  const void *b;                        /* B [.., K, N] */
  int64_t b_bs[SLAPO_MAX_DIMS], b_sk, b_sn;
  const float *bias;                    /* bias [N] or NULL */
  int64_t bias_sn;
  float *c;                             /* C [.., M, N], contiguous */
} slapo__gemm;

/* Describes c = op(a) @ op(b) (+ bias) over tensors: a is [.., M, K] (stored
 * [.., K, M] when trans_a), b is [.., K, N] (stored [.., N, K] when trans_b),
 * both with ndim >= 2 and batch dims that broadcast to c's, both f32 or both
 * bf16; bias [N] f32 may be NULL; c [.., M, N] contiguous f32. Shapes and
 * dtypes were checked by shape inference; a mismatch here is an internal
 * bug (SLAPO_ASSERT). */
void slapo__gemm_init(slapo__gemm *g, const slapo_tensor *a, bool trans_a, const slapo_tensor *b,
                      bool trans_b, const slapo_tensor *bias, slapo_tensor *c);

/* Reference: one double accumulator per output element, summed over k in
 * ascending order (bf16 operands widened exactly), then the bias added,
 * then rounded to f32. */
void slapo__gemm_ref(const slapo__gemm *g);

/* The fast path of "matmul" and "linear" (arguments as slapo__gemm_init):
 * f32 operands through oneDNN's f32 matmul; bf16 operands through oneDNN's
 * bf16 x bf16 -> f32 matmul where slapo_bf16_gemm_native() says the CPU
 * runs it in hardware, else widened to f32 first (exact) and run as f32:
 * the same products, never oneDNN's slow emulation. The reference
 * whatever oneDNN refuses. Cannot fail. */
void slapo__gemm_fast(const slapo_tensor *a, bool trans_a, const slapo_tensor *b, bool trans_b,
                      const slapo_tensor *bias, slapo_tensor *c);

/* oneDNN matmul primitive (cached per problem shape and strides; for some
 * 2-D problems one single-thread primitive per thread, each on its own rows
 * or columns of C). Returns false when oneDNN cannot take the problem (an
 * unusual stride pattern, primitive creation failed), possibly having
 * written part of C; the caller then runs the reference, which writes all
 * of it. Deterministic for a fixed OpenMP thread count. */
bool slapo__gemm_dnnl(const slapo__gemm *g);

/* Number of problems currently held by the primitive cache (tests). */
int slapo__gemm_dnnl_cache_count(void);

#endif
