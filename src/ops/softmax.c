/* ops/softmax.c - softmax over the last axis, optionally causal, and its fused
 * backward "softmax_backward". Layer: ops.
 * Math: y_s = exp(x_s - m) / sum_j exp(x_j - m) with m = max_j x_j (m cancels
 * in the ratio; subtracting it keeps exp() from overflowing). Backward: the
 * softmax Jacobian diag(y) - y y^T applied to dy gives dx = y * (dy - <dy, y>)
 * (llm.c softmax_autoregressive_backward; derivation in docs/nn_backward.md).
 * Causal mask as in GPT-2 attention: query t of T sees keys s <= t + (S - T). */
#include <math.h>
#include <string.h>

#include "ops/internal.h"
#include "slapo/ops/rowmath.h"

/* Rows of x [R, S] and the causal geometry [.., T, S] of a node's input. */
typedef struct rows {
  int64_t R, S, T;
  bool causal;
} rows;

static rows rows_of(const slapo_node *node, const slapo_tensor *x) {
  rows r = {0};
  r.S = x->shape[x->ndim - 1];
  r.R = r.S ? slapo_tensor_numel(x) / r.S : 0;
  r.causal = slapo_node_attr_int(node, "causal", 0) != 0;
  r.T = r.causal ? x->shape[x->ndim - 2] : 1;
  return r;
}

/* Number of unmasked leading entries of row r. Without a mask all S; with the
 * causal mask, row t = r % T keeps s <= t + (S - T): the last query sees every
 * key, and when T > S the first T - S queries see none (their row is zeros). */
static int64_t row_valid(const rows *g, int64_t r) {
  if (!g->causal) return g->S;
  int64_t n = r % g->T + g->S - g->T + 1;
  return n < 0 ? 0 : n > g->S ? g->S : n;
}

/* ---- forward ---- */

static slapo_status softmax_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0];
  if (x->ndim < 1)
    return slapo_error(SLAPO_SHAPE,
                       "softmax: x %s is a scalar; softmax needs a last axis to normalise over",
                       slapo__shape_of(x));
  int64_t causal = slapo_node_attr_int(node, "causal", 0);
  if (causal != 0 && causal != 1)
    return slapo_error(SLAPO_INVALID_ARG, "softmax: attribute causal = %lld; use 0 or 1",
                       (long long)causal);
  if (causal && x->ndim < 2)
    return slapo_error(SLAPO_SHAPE,
                       "softmax: causal softmax needs x [.., T, S] (at least 2-d), got x %s",
                       slapo__shape_of(x));
  return slapo__same_as_input(node, 0);
}

/* Reference: double accumulators, two exps per element kept simple. */
static void softmax_ref(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* x [R, S] */
  float *y = slapo_tensor_data(out);         /* y [R, S] */
  rows g = rows_of(node, in[0]);
  for (int64_t r = 0; r < g.R; r++) {
    const float *xr = x + r * g.S;
    float *yr = y + r * g.S;
    int64_t n = row_valid(&g, r);
    double m = -INFINITY;
    for (int64_t s = 0; s < n; s++) m = xr[s] > m ? xr[s] : m;
    double sum = 0;
    for (int64_t s = 0; s < n; s++) sum += exp(xr[s] - m);
    /* m == -inf: every visible entry is -inf, i.e. masked: zeros, not NaN. */
    for (int64_t s = 0; s < g.S; s++)
      yr[s] = (s < n && m > -INFINITY) ? (float)(exp(xr[s] - m) / sum) : 0.0f;
  }
}

/* The fast kernel's row is slapo/ops/rowmath.h's (the cc backend pastes the
 * same text into fused regions), compiled per ISA level here. */
SLAPO__SIMD_PROC(softmax_row,
                 (const float *restrict x, float *restrict y, int64_t n, int64_t S),
                 (x, y, n, S)) {
  slapo__softmax_row(x, y, n, S);
}

/* Fast: rows in parallel; max, the vectorized exponentials and their sum,
 * then one scaling pass. */
static void softmax_fast(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* x [R, S] */
  float *y = slapo_tensor_data(out);         /* y [R, S] */
  rows g = rows_of(node, in[0]);
#pragma omp parallel for num_threads(slapo__threads_for(g.R * g.S)) schedule(static)
  for (int64_t r = 0; r < g.R; r++) softmax_row(x + r * g.S, y + r * g.S, row_valid(&g, r), g.S);
}

static slapo_status softmax_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  /* Masked entries have y = 0, so the fused rule needs no mask of its own. */
  dx[0] = need[0] ? slapo__call2(ctx, SLAPO_OP_DESC(softmax_backward), node, dy, 0, NULL) : NULL;
  return slapo_ctx_status(ctx);
}

static slapo_node *softmax_example(slapo_ctx *ctx) {
  /* T = 3 < S = 5 exercises the offset of the causal mask (s <= t + 2). */
  int64_t shape[3] = {2, 3, 5};
  return slapo_softmax(ctx, slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, shape), true);
}

SLAPO_OP_DESCRIPTOR(softmax) = {
    .name = "softmax",
    .n_inputs = 1,
    .infer = softmax_infer,
    .ref = softmax_ref,
    .fast = softmax_fast,
    .backward = softmax_backward,
    .contiguous_inputs = true,
    .doc = "softmax over the last axis, max subtracted; attr causal (0/1) masks (t, s) with "
           "s > t + S - T for x [.., T, S]; fully masked rows are zeros",
    .test = {.example = softmax_example, .lo = -2, .hi = 2},
};

/* ---- fused backward ---- */

static slapo_status softmax_backward_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_dtype(node, 1, SLAPO_DTYPE_F32));
  const slapo_node *y = node->inputs[0], *dy = node->inputs[1];
  if (y->ndim < 1 || !slapo_shape_equal(y->ndim, y->shape, dy->ndim, dy->shape))
    return slapo_error(SLAPO_SHAPE,
                       "softmax_backward: y %s and dy %s must have the same shape with at "
                       "least one axis",
                       slapo__shape_of(y), slapo__shape_of(dy));
  return slapo__same_as_input(node, 0);
}

static void softmax_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                                 slapo_tensor *out, const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *y = slapo_tensor_data(in[0]);  /* y  [R, S] */
  const float *dy = slapo_tensor_data(in[1]); /* dy [R, S] */
  float *dx = slapo_tensor_data(out);         /* dx [R, S] */
  int64_t S = in[0]->shape[in[0]->ndim - 1];
  int64_t R = S ? slapo_tensor_numel(in[0]) / S : 0;
  for (int64_t r = 0; r < R; r++) {
    double dot = 0;
    for (int64_t s = 0; s < S; s++) dot += (double)dy[r * S + s] * y[r * S + s];
    for (int64_t s = 0; s < S; s++)
      dx[r * S + s] = (float)(y[r * S + s] * (dy[r * S + s] - dot));
  }
}

SLAPO__SIMD_PROC(softmax_backward_row,
                 (const float *restrict y, const float *restrict dy, float *restrict dx, int64_t S),
                 (y, dy, dx, S)) {
  slapo__softmax_backward_row(y, dy, dx, S);
}

static void softmax_backward_fast(const slapo_node *node, const slapo_tensor *const *in,
                                  slapo_tensor *out, const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *y = slapo_tensor_data(in[0]);  /* y  [R, S] */
  const float *dy = slapo_tensor_data(in[1]); /* dy [R, S] */
  float *dx = slapo_tensor_data(out);         /* dx [R, S] */
  int64_t S = in[0]->shape[in[0]->ndim - 1];
  int64_t R = S ? slapo_tensor_numel(in[0]) / S : 0;
#pragma omp parallel for num_threads(slapo__threads_for(R * S)) schedule(static)
  for (int64_t r = 0; r < R; r++) softmax_backward_row(y + r * S, dy + r * S, dx + r * S, S);
}

static slapo_node *softmax_backward_example(slapo_ctx *ctx) {
  int64_t shape[2] = {3, 5};
  slapo_node *y = slapo_input(ctx, "y", SLAPO_DTYPE_F32, 2, shape);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, shape);
  return slapo__call2(ctx, SLAPO_OP_DESC(softmax_backward), y, dy, 0, NULL);
}

SLAPO_OP_DESCRIPTOR(softmax_backward) = {
    .name = "softmax_backward",
    .n_inputs = 2,
    .infer = softmax_backward_infer,
    .ref = softmax_backward_ref,
    .fast = softmax_backward_fast,
    .contiguous_inputs = true,
    .doc = "(y, dy) -> y * (dy - sum(dy * y)) over the last axis: softmax's gradient in one "
           "pass over each row instead of the 4-op composite (mul, sum, sub, mul) and its "
           "temporaries",
    .test = {.example = softmax_backward_example,
             .checked_by = "softmax composite"},
};

/* ---- typed builder ---- */

slapo_node *slapo_softmax(slapo_ctx *ctx, slapo_node *x, bool causal) {
  slapo_attr a = slapo_attr_int("causal", causal ? 1 : 0);
  return slapo__call1(ctx, SLAPO_OP_DESC(softmax), x, 1, &a);
}
