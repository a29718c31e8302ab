/* ops/embedding.c - row gather "embedding" (weight [V, C], idx [..] ->
 * [.., C]; PyTorch nn.functional.embedding) and its adjoint, the row scatter-
 * add "index_add" (PyTorch Tensor.index_add along dim 0). Layer: ops.
 * The weight gradient of embedding is index_add of dy rows into zeros (llm.c
 * encoder_backward); index_add's own gradient is (dy, gather of dy rows).
 * Out-of-range indices: kernels cannot fail, so slapo_step checks token
 * ids first (module/index_check.c); a stray index reaching a kernel reads
 * a zero row / adds nothing (never clamps). */
#include <omp.h>
#include <string.h>

#include "ops/internal.h"
#include "slapo/ops/vmath.h"

/* Element i of a contiguous i32/i64 index tensor. */
static int64_t index_at(const slapo_tensor *t, int64_t i) {
  if (t->dtype == SLAPO_DTYPE_I32) return ((const int32_t *)slapo_tensor_data(t))[i];
  return ((const int64_t *)slapo_tensor_data(t))[i];
}

/* ---- embedding ---- */

static slapo_status embedding_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_index(node, 1));
  const slapo_node *w = node->inputs[0], *idx = node->inputs[1];
  if (w->ndim != 2)
    return slapo_error(SLAPO_SHAPE, "embedding: weight %s must be 2-d [V, C]",
                       slapo__shape_of(w));
  if (idx->ndim + 1 > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_SHAPE,
                       "embedding: idx %s has %d dims; the result [.., C] would exceed %d dims",
                       slapo__shape_of(idx), idx->ndim, SLAPO_MAX_DIMS);
  int64_t shape[SLAPO_MAX_DIMS];
  for (int i = 0; i < idx->ndim; i++) shape[i] = idx->shape[i];
  shape[idx->ndim] = w->shape[1];
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, idx->ndim + 1, shape);
}

/* Reference and fast share one body: a row copy has nothing to accumulate;
 * the fast one copies rows in parallel. */
static void embedding_rows(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, bool parallel) {
  int64_t off = slapo_node_attr_int(node, "offset", 0);
  const float *w = slapo_tensor_data(in[0]); /* w   [V, C] */
  float *y = slapo_tensor_data(out);         /* y   [N, C] (N = numel(idx)) */
  int64_t V = in[0]->shape[0], C = in[0]->shape[1];
  int64_t N = slapo_tensor_numel(in[1]); /* idx [N] */
#pragma omp parallel for if (parallel) num_threads(slapo__threads_for(N * C)) schedule(static)
  for (int64_t n = 0; n < N; n++) {
    int64_t v = index_at(in[1], n) - off;
    /* Another rank's rows (or, past slapo_step's check, out of range): a zero row. */
    if (v >= 0 && v < V) memcpy(y + n * C, w + v * C, (size_t)C * sizeof(float));
    else memset(y + n * C, 0, (size_t)C * sizeof(float));
  }
}

static void embedding_ref(const slapo_node *node, const slapo_tensor *const *in,
                          slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  embedding_rows(node, in, out, false);
}

static void embedding_fast(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  embedding_rows(node, in, out, true);
}

static slapo_status embedding_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                       const bool *need, slapo_node **dx) {
  dx[0] = dx[1] = NULL; /* idx is an integer input: no gradient */
  if (!need[0]) return slapo_ctx_status(ctx);
  slapo_node *w = node->inputs[0], *idx = node->inputs[1];
  int64_t C = w->shape[1], N = slapo_shape_numel(idx->ndim, idx->shape);
  /* index_add takes idx [N] and src [N, C]: flatten the leading dims. */
  if (idx->ndim != 1) {
    int64_t s[1] = {N};
    slapo_attr a = slapo_attr_ints("shape", 1, s);
    idx = slapo__call1(ctx, SLAPO_OP_DESC(reshape), idx, 1, &a);
  }
  if (dy->ndim != 2) {
    int64_t s[2] = {N, C};
    slapo_attr a = slapo_attr_ints("shape", 2, s);
    dy = slapo__call1(ctx, SLAPO_OP_DESC(reshape), dy, 1, &a);
  }
  slapo_attr fa[2] = {slapo_attr_ints("shape", 2, w->shape), slapo_attr_float("value", 0.0)};
  slapo_node *zeros = slapo_op_apply(ctx, SLAPO_OP_DESC(full), 0, NULL, 2, fa);
  slapo_node *in[3] = {zeros, idx, dy};
  const slapo_attr *off = slapo_node_attr(node, "offset");
  dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(index_add), 3, in, off ? 1 : 0, off);
  return slapo_ctx_status(ctx);
}

static slapo_node *embedding_example(slapo_ctx *ctx) {
  /* 10 indices drawn from 7 rows: repeated rows are (almost) certain, so the
   * gradcheck covers accumulation in index_add. */
  int64_t ws[2] = {7, 3}, is[2] = {2, 5};
  slapo_node *w = slapo_input(ctx, "weight", SLAPO_DTYPE_F32, 2, ws);
  return slapo_embedding(ctx, w, slapo_input(ctx, "idx", SLAPO_DTYPE_I64, 2, is));
}

SLAPO_OP_DESCRIPTOR(embedding) = {
    .name = "embedding",
    .n_inputs = 2,
    .infer = embedding_infer,
    .ref = embedding_ref,
    .fast = embedding_fast,
    .backward = embedding_backward,
    .contiguous_inputs = true,
    .doc = "(weight [V, C] f32, idx [..] i32/i64) -> weight[idx] [.., C]; an index outside "
           "[0, V) gives a zero row (the data loader validates ids; kernels cannot fail); attr "
           "offset (default 0): the weight holds rows [offset, offset + V) of a vocabulary "
           "split across ranks, idx are global ids and other ranks' rows read zeros",
    .test = {.example = embedding_example, .int_high = 7},
};

/* ---- index_add ---- */

static slapo_status index_add_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_index(node, 1));
  SLAPO_TRY(slapo__want_dtype(node, 2, SLAPO_DTYPE_F32));
  const slapo_node *base = node->inputs[0], *idx = node->inputs[1], *src = node->inputs[2];
  if (base->ndim != 2 || idx->ndim != 1 || src->ndim != 2 ||
      src->shape[0] != idx->shape[0] || src->shape[1] != base->shape[1])
    return slapo_error(SLAPO_SHAPE,
                       "index_add: base %s, idx %s, src %s: expected base [V, C], idx [N], "
                       "src [N, C]",
                       slapo__shape_of(base), slapo__shape_of(idx), slapo__shape_of(src));
  return slapo__same_as_input(node, 0);
}

/* y[c] += s[c] for c < n; its own function so the loop vectorizes with
 * restrict pointers (y and s never overlap: out is base's buffer or a fresh
 * one, and src is never base: the planner shares only input 0's buffer). */
SLAPO__SIMD_PROC(add_row, (float *restrict y, const float *restrict s, int64_t n), (y, s, n)) {
  for (int64_t c = 0; c < n; c++) y[c] += s[c];
}

/* Reference: copy base (unless out is base's buffer: the op is inplace),
 * then add the source rows in index order (float sums: a double accumulator
 * per element would need a [V, C] scratch buffer, and a kernel cannot report
 * an allocation failure). */
static void index_add_ref(const slapo_node *node, const slapo_tensor *const *in,
                          slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *base = slapo_tensor_data(in[0]); /* base [V, C] */
  const float *src = slapo_tensor_data(in[2]);  /* src  [N, C] */
  float *y = slapo_tensor_data(out);            /* y    [V, C] */
  int64_t V = in[0]->shape[0], C = in[0]->shape[1], N = in[1]->shape[0]; /* idx [N] */
  int64_t off = slapo_node_attr_int(node, "offset", 0);
  if (y != base) memcpy(y, base, (size_t)(V * C) * sizeof(float));
  for (int64_t n = 0; n < N; n++) {
    int64_t v = index_at(in[1], n) - off;
    if (v < 0 || v >= V) continue; /* stray index: adds nothing (documented) */
    for (int64_t c = 0; c < C; c++) y[v * C + c] += src[n * C + c];
  }
}

/* Fast: first the base is copied contiguously (memcpy, in contiguous chunks
 * per thread; nothing when out is base's buffer, which makes a tied
 * embedding's weight gradient cost its N rows, not a pass over [V, C]),
 * then the source rows are scattered: each thread owns one
 * contiguous block of columns (a multiple of 16 floats = 64 bytes, so no two
 * threads write one cache line) and walks the sources in index order, so
 * each sum has the reference's order for every thread count and needs no
 * atomics. Sorting the indices to own destination rows instead would need
 * scratch memory, and a kernel has no way to report an allocation failure. */
static void index_add_fast(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *base = slapo_tensor_data(in[0]); /* base [V, C] */
  const float *src = slapo_tensor_data(in[2]);  /* src  [N, C] */
  float *y = slapo_tensor_data(out);            /* y    [V, C] */
  int64_t V = in[0]->shape[0], C = in[0]->shape[1], N = in[1]->shape[0]; /* idx [N] */
  int64_t off = slapo_node_attr_int(node, "offset", 0);
  const int64_t BLOCK = 16;
  int64_t total = V * C, n_blocks = (C + BLOCK - 1) / BLOCK;
  if (total == 0) return;
  int threads = slapo__threads_for((V + N) * C);
#pragma omp parallel num_threads(threads)
  {
    int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    /* Copy: chunk boundaries on 16-float multiples of the flat [V * C]. */
    int64_t e0 = total * tid / nt / BLOCK * BLOCK;
    int64_t e1 = tid + 1 == nt ? total : total * (tid + 1) / nt / BLOCK * BLOCK;
    if (e1 > e0 && y != base) memcpy(y + e0, base + e0, (size_t)(e1 - e0) * sizeof(float));
#pragma omp barrier
    /* Scatter: this thread's columns [c0, c1). */
    int64_t c0 = n_blocks * tid / nt * BLOCK, c1 = n_blocks * (tid + 1) / nt * BLOCK;
    if (c1 > C) c1 = C;
    if (c1 > c0)
      for (int64_t n = 0; n < N; n++) {
        int64_t v = index_at(in[1], n) - off;
        if (v < 0 || v >= V) continue; /* stray index: adds nothing (documented) */
        add_row(y + v * C + c0, src + n * C + c0, c1 - c0);
      }
  }
}

static slapo_status index_add_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                       const bool *need, slapo_node **dx) {
  dx[0] = need[0] ? dy : NULL;
  dx[1] = NULL; /* integer indices */
  if (need[2]) {
    slapo_node *in[2] = {dy, node->inputs[1]};
    const slapo_attr *off = slapo_node_attr(node, "offset");
    dx[2] = slapo_op_apply(ctx, SLAPO_OP_DESC(embedding), 2, in, off ? 1 : 0, off);
  }
  return slapo_ctx_status(ctx);
}

static slapo_node *index_add_example(slapo_ctx *ctx) {
  int64_t bs[2] = {5, 3}, is[1] = {7}, ss[2] = {7, 3};
  return slapo_index_add(ctx, slapo_input(ctx, "base", SLAPO_DTYPE_F32, 2, bs),
                         slapo_input(ctx, "idx", SLAPO_DTYPE_I32, 1, is),
                         slapo_input(ctx, "src", SLAPO_DTYPE_F32, 2, ss));
}

SLAPO_OP_DESCRIPTOR(index_add) = {
    .name = "index_add",
    .n_inputs = 3,
    .infer = index_add_infer,
    .ref = index_add_ref,
    .fast = index_add_fast,
    .backward = index_add_backward,
    .contiguous_inputs = true,
    .inplace = true,
    .doc = "(base [V, C], idx [N] i32/i64, src [N, C]) -> base with src[n] added to row "
           "idx[n], in index order (deterministic, no atomics); stray indices add nothing; "
           "in place over base's buffer where base has no later reader",
    .test = {.example = index_add_example, .int_high = 5},
};

/* ---- typed builders ---- */

slapo_node *slapo_embedding(slapo_ctx *ctx, slapo_node *weight, slapo_node *idx) {
  return slapo__call2(ctx, SLAPO_OP_DESC(embedding), weight, idx, 0, NULL);
}

slapo_node *slapo_index_add(slapo_ctx *ctx, slapo_node *base, slapo_node *idx,
                            slapo_node *src) {
  slapo_node *in[3] = {base, idx, src};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(index_add), 3, in, 0, NULL);
}
