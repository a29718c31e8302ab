/* ops/elementwise.h - pieces shared by the elementwise op files (binary.c,
 * scalar.c, unary.c, activation.c): f32 shape inference, numeric attributes,
 * broadcast/strided indexing, and generators for the reference and fast
 * kernels of one- and two-input maps from the ops' math (slapo/ops/math.h). Layer: ops (internal to this group).
 * Broadcasting follows NumPy's rules (numpy.org/doc/stable/user/basics.broadcasting). */
#ifndef SLAPO_OPS_ELEMENTWISE_H
#define SLAPO_OPS_ELEMENTWISE_H

#include <math.h>

#include "ops/internal.h"
#include "slapo/ops/vmath.h"

/* ---- inference ---- */

/* One f32 input; the result has its shape. */
static inline slapo_status ew_infer_unary(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  return slapo__same_as_input(node, 0);
}

/* Two f32 inputs broadcast against each other (NumPy rules). */
static inline slapo_status ew_infer_broadcast(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_dtype(node, 1, SLAPO_DTYPE_F32));
  const slapo_node *a = node->inputs[0], *b = node->inputs[1];
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
  SLAPO_TRY(slapo__broadcast_shapes(node->target, a->ndim, a->shape, b->ndim, b->shape, &ndim,
                                    shape));
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, ndim, shape);
}

/* Two f32 inputs of one shape (the fused backward ops: x and dy). */
static inline slapo_status ew_infer_same(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_dtype(node, 1, SLAPO_DTYPE_F32));
  const slapo_node *a = node->inputs[0], *b = node->inputs[1];
  if (!slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape))
    return slapo_error(SLAPO_SHAPE, "%s: x %s and dy %s must have the same shape", node->target,
                       slapo__shape_of(a), slapo__shape_of(b));
  return slapo__same_as_input(node, 0);
}

/* Reads the numeric attribute `key` (FLOAT, or INT converted) into *out.
 * SLAPO_INVALID_ARG naming the op when it is missing or not a number. */
static inline slapo_status ew_attr_number(const slapo_node *node, const char *key, double *out) {
  const slapo_attr *a = slapo_node_attr(node, key);
  if (!a || (a->kind != SLAPO_ATTR_FLOAT && a->kind != SLAPO_ATTR_INT))
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: needs a numeric attribute '%s' (use the typed builder, e.g. "
                       "slapo_%s)",
                       node->target, key, node->target);
  *out = a->kind == SLAPO_ATTR_FLOAT ? a->f : (double)a->i;
  return SLAPO_OK;
}

/* The attribute after inference has validated it (kernels). */
static inline double ew_attr(const slapo_node *node, const char *key) {
  double v = 0;
  slapo_status s = ew_attr_number(node, key, &v);
  SLAPO_ASSERT(s == SLAPO_OK);
  return v;
}

/* ---- indexing ---- */

/* Element offset of the i-th (row-major) element of a value of shape
 * (ndim, shape) in an input whose per-dim strides are `st` (0 on broadcast
 * dims, from slapo__broadcast_strides). */
static inline int64_t ew_offset(int64_t i, int ndim, const int64_t *shape, const int64_t *st) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    off += (i % shape[d]) * st[d];
    i /= shape[d];
  }
  return off;
}

/* How a fast kernel may read an input relative to the contiguous output. */
typedef enum ew_layout {
  EW_FULL,   /* contiguous, same number of elements as out: x[i]         */
  EW_ROW,    /* contiguous [.., 1, C] against out [.., C]: x[i % C]      */
  EW_SCALAR, /* one element: x[0]                                        */
  EW_OTHER   /* strided or other broadcast: per-row offsets              */
} ew_layout;

static inline ew_layout ew_layout_of(const slapo_tensor *t, const slapo_tensor *out) {
  int64_t n = slapo_tensor_numel(t);
  if (n == 1) return EW_SCALAR;
  if (!slapo_tensor_is_contiguous(t)) return EW_OTHER;
  /* Broadcasting only ever shrinks dims to 1, so equal counts mean equal
   * (left-padded) shapes. */
  if (n == slapo_tensor_numel(out)) return EW_FULL;
  int64_t C = out->ndim ? out->shape[out->ndim - 1] : 1;
  if (t->ndim >= 1 && t->shape[t->ndim - 1] == C && n == C) return EW_ROW;
  return EW_OTHER;
}

/* Length of the output's last dim (its "rows" are what the strided paths
 * walk); 1 for a scalar. */
static inline int64_t ew_row_len(const slapo_tensor *out) {
  return out->ndim ? out->shape[out->ndim - 1] : 1;
}

/* ---- kernel generators ----
 * The generated functions take tensors and one numeric parameter `p` (the
 * scalar, exponent or variant an op reads from its attributes), so one
 * descriptor can dispatch between several loops. REF is an expression in
 * double `x` (and `y`) and `p`, evaluated per element with the simplest
 * strided indexing; FAST is an expression in float `x` (and `y`) and `pf`,
 * evaluated in contiguous OpenMP loops the compiler can vectorize. Inputs
 * may be strided and broadcast; `out` is contiguous with the result shape. */

/* A file may use only one of a generated pair (pow's x^2 loop has no
 * reference of its own). */
#define EW_MAYBE_UNUSED __attribute__((unused))

#define EW_PARALLEL_FOR                                                        \
  _Pragma("omp parallel for num_threads(slapo__threads_for(ew_n)) schedule(static)")

/* Contiguous inputs are processed in blocks of EW_BLOCK elements by a
 * function compiled once per ISA level (SLAPO__SIMD_PROC): the loop body
 * is then vectorized with AVX-512 where the CPU has it, which matters for
 * the compute-heavy maps (GELU's exp). Blocks split statically over the
 * threads as the elements did, so results do not depend on the clone. */
#define EW_BLOCK ((int64_t)4096)
#define EW_FOR_BLOCKS(CALL)                                                    \
  do {                                                                         \
    int64_t ew_nb = (ew_n + EW_BLOCK - 1) / EW_BLOCK;                          \
    EW_PARALLEL_FOR                                                            \
    for (int64_t ew_b = 0; ew_b < ew_nb; ew_b++) {                             \
      int64_t i0 = ew_b * EW_BLOCK;                                            \
      int64_t len = ew_n - i0 < EW_BLOCK ? ew_n - i0 : EW_BLOCK;               \
      CALL;                                                                    \
    }                                                                          \
  } while (0)

#define EW_UNARY(NAME, REF, FAST)                                              \
  SLAPO__SIMD_PROC(                                                            \
      NAME##_block, (const float *restrict xp, float *restrict o, int64_t n,   \
                     float pf), (xp, o, n, pf)) {                              \
    (void)pf;                                                                  \
    for (int64_t i = 0; i < n; i++) {                                          \
      float x = xp[i];                                                         \
      o[i] = (FAST);                                                           \
    }                                                                          \
  }                                                                            \
  EW_MAYBE_UNUSED static void NAME##_ref(const slapo_tensor *X,                \
                                          slapo_tensor *out, double p) {       \
    const float *xp = slapo_tensor_data(X); /* x [..] any strides */           \
    float *o = slapo_tensor_data(out);      /* out [..] contiguous */          \
    int64_t st[SLAPO_MAX_DIMS];                                                \
    slapo__broadcast_strides(out->ndim, out->shape, X, st);                    \
    int64_t n = slapo_tensor_numel(out);                                       \
    for (int64_t i = 0; i < n; i++) {                                          \
      double x = xp[ew_offset(i, out->ndim, out->shape, st)];                  \
      o[i] = (float)(REF);                                                     \
    }                                                                          \
  }                                                                            \
  EW_MAYBE_UNUSED static void NAME##_fast(const slapo_tensor *X,               \
                                           slapo_tensor *out, double p) {      \
    const float *xp = slapo_tensor_data(X);                                    \
    float *o = slapo_tensor_data(out);                                         \
    const float pf = (float)p;                                                 \
    (void)pf;                                                                  \
    int64_t ew_n = slapo_tensor_numel(out);                                    \
    if (ew_n == 0) return;                                                     \
    if (ew_layout_of(X, out) == EW_FULL) {                                     \
      EW_FOR_BLOCKS(NAME##_block(xp + i0, o + i0, len, pf));                   \
      return;                                                                  \
    }                                                                          \
    /* Strided input: one offset computation per row of the last dim. */      \
    int64_t st[SLAPO_MAX_DIMS];                                                \
    slapo__broadcast_strides(out->ndim, out->shape, X, st);                    \
    int64_t C = ew_row_len(out), R = ew_n / C;                                 \
    int64_t sc = out->ndim ? st[out->ndim - 1] : 0;                            \
    EW_PARALLEL_FOR                                                            \
    for (int64_t r = 0; r < R; r++) {                                          \
      const float *xr = xp + ew_offset(r * C, out->ndim, out->shape, st);      \
      float *orow = o + r * C;                                                 \
      for (int64_t c = 0; c < C; c++) {                                        \
        float x = xr[c * sc];                                                  \
        orow[c] = (FAST);                                                      \
      }                                                                        \
    }                                                                          \
  }

#define EW_BINARY(NAME, REF, FAST)                                             \
  /* o = a op b over n contiguous elements (a bias row: b = the row). */     \
  SLAPO__SIMD_PROC(                                                            \
      NAME##_block, (const float *restrict ap, const float *restrict bp,       \
                     float *restrict o, int64_t n, float pf),                  \
      (ap, bp, o, n, pf)) {                                                    \
    (void)pf;                                                                  \
    for (int64_t i = 0; i < n; i++) {                                          \
      float x = ap[i], y = bp[i];                                              \
      o[i] = (FAST);                                                           \
    }                                                                          \
  }                                                                            \
  EW_MAYBE_UNUSED static void NAME##_ref(const slapo_tensor *A,                \
                                          const slapo_tensor *B,               \
                                          slapo_tensor *out, double p) {       \
    const float *ap = slapo_tensor_data(A); /* a [..] any strides, broadcast */ \
    const float *bp = slapo_tensor_data(B); /* b [..] any strides, broadcast */ \
    float *o = slapo_tensor_data(out);      /* out [..] contiguous */          \
    int64_t sa[SLAPO_MAX_DIMS], sb[SLAPO_MAX_DIMS];                            \
    slapo__broadcast_strides(out->ndim, out->shape, A, sa);                    \
    slapo__broadcast_strides(out->ndim, out->shape, B, sb);                    \
    int64_t n = slapo_tensor_numel(out);                                       \
    for (int64_t i = 0; i < n; i++) {                                          \
      double x = ap[ew_offset(i, out->ndim, out->shape, sa)];                  \
      double y = bp[ew_offset(i, out->ndim, out->shape, sb)];                  \
      o[i] = (float)(REF);                                                     \
    }                                                                          \
  }                                                                            \
  EW_MAYBE_UNUSED static void NAME##_fast(const slapo_tensor *A,               \
                                           const slapo_tensor *B,              \
                                           slapo_tensor *out, double p) {      \
    const float *ap = slapo_tensor_data(A);                                    \
    const float *bp = slapo_tensor_data(B);                                    \
    float *o = slapo_tensor_data(out);                                         \
    const float pf = (float)p;                                                 \
    (void)pf;                                                                  \
    int64_t ew_n = slapo_tensor_numel(out);                                    \
    if (ew_n == 0) return;                                                     \
    ew_layout la = ew_layout_of(A, out), lb = ew_layout_of(B, out);            \
    int64_t C = ew_row_len(out), R = ew_n / C;                                 \
    if (la == EW_FULL && lb == EW_FULL) {                                      \
      EW_FOR_BLOCKS(NAME##_block(ap + i0, bp + i0, o + i0, len, pf));          \
    } else if (la == EW_FULL && lb == EW_SCALAR) {                             \
      const float y = bp[0];                                                   \
      EW_PARALLEL_FOR                                                          \
      for (int64_t i = 0; i < ew_n; i++) {                                     \
        float x = ap[i];                                                       \
        o[i] = (FAST);                                                         \
      }                                                                        \
    } else if (la == EW_SCALAR && lb == EW_FULL) {                             \
      const float x = ap[0];                                                   \
      EW_PARALLEL_FOR                                                          \
      for (int64_t i = 0; i < ew_n; i++) {                                     \
        float y = bp[i];                                                       \
        o[i] = (FAST);                                                         \
      }                                                                        \
    } else if (la == EW_FULL && lb == EW_ROW) {                                \
      /* a [R, C] op b [C]: the bias-add shape. */                             \
      EW_PARALLEL_FOR                                                          \
      for (int64_t r = 0; r < R; r++)                                          \
        NAME##_block(ap + r * C, bp, o + r * C, C, pf);                        \
    } else if (la == EW_ROW && lb == EW_FULL) {                                \
      EW_PARALLEL_FOR                                                          \
      for (int64_t r = 0; r < R; r++) {                                        \
        const float *brow = bp + r * C;                                        \
        float *orow = o + r * C;                                               \
        for (int64_t c = 0; c < C; c++) {                                      \
          float x = ap[c], y = brow[c];                                        \
          orow[c] = (FAST);                                                    \
        }                                                                      \
      }                                                                        \
    } else {                                                                   \
      /* Any strides and broadcasts: one offset computation per row. */        \
      int64_t sa[SLAPO_MAX_DIMS], sb[SLAPO_MAX_DIMS];                          \
      slapo__broadcast_strides(out->ndim, out->shape, A, sa);                  \
      slapo__broadcast_strides(out->ndim, out->shape, B, sb);                  \
      int64_t sca = out->ndim ? sa[out->ndim - 1] : 0;                         \
      int64_t scb = out->ndim ? sb[out->ndim - 1] : 0;                         \
      EW_PARALLEL_FOR                                                          \
      for (int64_t r = 0; r < R; r++) {                                        \
        const float *arow = ap + ew_offset(r * C, out->ndim, out->shape, sa);  \
        const float *brow = bp + ew_offset(r * C, out->ndim, out->shape, sb);  \
        float *orow = o + r * C;                                               \
        for (int64_t c = 0; c < C; c++) {                                      \
          float x = arow[c * sca], y = brow[c * scb];                          \
          orow[c] = (FAST);                                                    \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }

/* Descriptor-signature kernels NAME_ref_k / NAME_fast_k that call the
 * generated functions with parameter PARAM (an expression in `node`). */
#define EW_KERNELS1(NAME, PARAM)                                               \
  static void NAME##_ref_k(const slapo_node *node, const slapo_tensor *const *in, \
                           slapo_tensor *out, const slapo_kernel_env *env) {   \
    NAME##_ref(in[0], out, (PARAM));                                           \
  }                                                                            \
  static void NAME##_fast_k(const slapo_node *node, const slapo_tensor *const *in, \
                            slapo_tensor *out, const slapo_kernel_env *env) {  \
    NAME##_fast(in[0], out, (PARAM));                                          \
  }

#define EW_KERNELS2(NAME, PARAM)                                               \
  static void NAME##_ref_k(const slapo_node *node, const slapo_tensor *const *in, \
                           slapo_tensor *out, const slapo_kernel_env *env) {   \
    NAME##_ref(in[0], in[1], out, (PARAM));                                    \
  }                                                                            \
  static void NAME##_fast_k(const slapo_node *node, const slapo_tensor *const *in, \
                            slapo_tensor *out, const slapo_kernel_env *env) {  \
    NAME##_fast(in[0], in[1], out, (PARAM));                                   \
  }

/* The typed builder slapo_NAME(ctx, x) of a one-input op without
 * attributes (declared in slapo/ops.h). */
#define EW_BUILDER1(NAME)                                                      \
  slapo_node *slapo_##NAME(slapo_ctx *ctx, slapo_node *x) {                    \
    return slapo__call1(ctx, SLAPO_OP_DESC(NAME), x, 0, NULL);                 \
  }

/* The kernels of op NAME from its math (slapo/ops/math.h), the reference
 * in double and the fast in float: NAME_ref/_fast and NAME_ref_k/_fast_k. */
#define EW_MATH1(NAME)                                                         \
  EW_UNARY(NAME, SLAPO_EW_##NAME(D, x), SLAPO_EW_##NAME(F, x))                 \
  EW_KERNELS1(NAME, 0)
#define EW_MATH2(NAME)                                                         \
  EW_BINARY(NAME, SLAPO_EW_##NAME(D, x, y), SLAPO_EW_##NAME(F, x, y))          \
  EW_KERNELS2(NAME, 0)

#endif
