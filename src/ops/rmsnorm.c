/* ops/rmsnorm.c - RMSNorm over the last axis (Zhang & Sennrich 2019, eq. 4;
 * as LLaMA's RMSNorm: eps inside the sqrt, optional weight, no bias) and its
 * fused input gradient "rms_norm_backward". Layer: ops.
 *   rstd = 1 / sqrt(mean(x^2) + eps), xhat = x * rstd, y = xhat * w
 *   dx = rstd * (dyw - xhat * mean(dyw * xhat)), dyw = dy * w
 * (the LayerNorm formula without the mean terms; docs/nn_backward.md). */
#include <math.h>

#include "ops/norm.h"
#include "slapo/ops/rowmath.h"

#define RMS_EPS_DEFAULT 1e-6

/* ---- forward ---- */

static slapo_status rms_norm_infer(slapo_node *node) {
  if (node->n_inputs != 1 && node->n_inputs != 2)
    return slapo_error(SLAPO_INVALID_ARG, "rms_norm: expects (x) or (x, weight), got %d inputs",
                       node->n_inputs);
  SLAPO_TRY(slapo__norm_want_rows(node, RMS_EPS_DEFAULT));
  if (node->n_inputs == 2) SLAPO_TRY(slapo__norm_want_channel(node, 1, "weight"));
  return slapo__same_as_input(node, 0);
}

static void rms_norm_ref(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);                            /* x [R, C] */
  const float *w = node->n_inputs == 2 ? slapo_tensor_data(in[1]) : NULL; /* w [C] */
  float *y = slapo_tensor_data(out);                                    /* y [R, C] */
  double eps = slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C;
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
    double rstd = 1.0 / sqrt(ss / (double)C + eps);
    for (int64_t c = 0; c < C; c++) y[r * C + c] = (float)(xr[c] * rstd * (w ? w[c] : 1.0));
  }
}

static void rms_norm_fast(const slapo_node *node, const slapo_tensor *const *in,
                          slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);                            /* x [R, C] */
  const float *w = node->n_inputs == 2 ? slapo_tensor_data(in[1]) : NULL; /* w [C] */
  float *y = slapo_tensor_data(out);                                    /* y [R, C] */
  float eps = (float)slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t r = 0; r < R; r++)
    slapo__rms_norm_row(x + r * C, w, y + r * C, C, slapo__rms_row_rstd(x + r * C, C, eps));
}

static slapo_status rms_norm_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                           const bool *need, slapo_node **dx) {
  slapo_node *x = node->inputs[0];
  bool affine = node->n_inputs == 2;
  slapo_attr eps = slapo_attr_float("eps", slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT));
  for (int i = 0; i < node->n_inputs; i++) dx[i] = NULL;
  if (need[0]) {
    slapo_node *in[3] = {x, affine ? node->inputs[1] : dy, dy};
    dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(rms_norm_backward), affine ? 3 : 2, in, 1, &eps);
  }
  if (affine && need[1]) {
    /* dw = sum over leading axes of dy * xhat in one pass (xhat recomputed,
     * not y / w). */
    slapo_node *in[2] = {x, dy};
    dx[1] = slapo_op_apply(ctx, SLAPO_OP_DESC(rms_norm_backward_weight), 2, in, 1, &eps);
  }
  return slapo_ctx_status(ctx);
}

static slapo_node *rms_norm_example(slapo_ctx *ctx) {
  int64_t xs[3] = {2, 3, 7}, cs[1] = {7};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, xs);
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 1, cs);
  return slapo_rms_norm(ctx, x, w, 1e-6);
}

SLAPO_OP_DESCRIPTOR(rms_norm) = {
    .name = "rms_norm",
    .n_inputs = -1,
    .infer = rms_norm_infer,
    .ref = rms_norm_ref,
    .fast = rms_norm_fast,
    .backward = rms_norm_backward_rule,
    .contiguous_inputs = true,
    .doc = "(x [.., C][, w [C]]) -> x / sqrt(mean(x^2) + eps) [* w] over the last axis "
           "(Zhang & Sennrich 2019; LLaMA RMSNorm); attr eps",
    .test = {.example = rms_norm_example},
};

/* ---- fused backward: dx ---- */

static slapo_status rms_norm_backward_infer(slapo_node *node) {
  return slapo__norm_backward_infer(node, RMS_EPS_DEFAULT);
}

static void rms_norm_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                                  slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  slapo__norm_bwd b = slapo__norm_bwd_of(node, in, out);
  const float *x = b.x, *w = b.w, *dy = b.dy, *res = b.r;
  float *dx = b.dx;
  const int64_t R = b.R, C = b.C;
  double eps = slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C, *dyr = dy + r * C;
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
    double rstd = 1.0 / sqrt(ss / (double)C + eps);
    double mean_dyw_xhat = 0;
    for (int64_t c = 0; c < C; c++)
      mean_dyw_xhat += (double)dyr[c] * (w ? w[c] : 1.0) * xr[c] * rstd;
    mean_dyw_xhat /= (double)C;
    for (int64_t c = 0; c < C; c++) {
      double dyw = (double)dyr[c] * (w ? w[c] : 1.0);
      float d = (float)(rstd * (dyw - xr[c] * rstd * mean_dyw_xhat));
      dx[r * C + c] = res ? d + res[r * C + c] : d; /* the unfolded add's float add */
    }
  }
}

static void rms_norm_backward_fast(const slapo_node *node, const slapo_tensor *const *in,
                                   slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  slapo__norm_bwd b = slapo__norm_bwd_of(node, in, out);
  const float *x = b.x, *w = b.w, *dy = b.dy, *res = b.r;
  float *dx = b.dx;
  const int64_t R = b.R, C = b.C;
  float eps = (float)slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t r = 0; r < R; r++)
    slapo__rms_backward_row(x + r * C, w, dy + r * C, res ? res + r * C : NULL, dx + r * C, C,
                            eps);
}

static slapo_node *rms_norm_backward_example(slapo_ctx *ctx) {
  int64_t xs[2] = {3, 7}, cs[1] = {7};
  slapo_node *in[3] = {slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, xs),
                       slapo_input(ctx, "w", SLAPO_DTYPE_F32, 1, cs),
                       slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, xs)};
  slapo_attr eps = slapo_attr_float("eps", 1e-6);
  return slapo_op_apply(ctx, SLAPO_OP_DESC(rms_norm_backward), 3, in, 1, &eps);
}

SLAPO_OP_DESCRIPTOR(rms_norm_backward) = {
    .name = "rms_norm_backward",
    .n_inputs = -1,
    .infer = rms_norm_backward_infer,
    .ref = rms_norm_backward_ref,
    .fast = rms_norm_backward_fast,
    .contiguous_inputs = true,
    .doc = "(x, [w,] dy) -> dx of rms_norm, recomputing rstd per row: one pass instead of "
           "~9 composite ops and their [.., C] temporaries; attr eps; with residual = 1 a last "
           "input r [.., C] is added to dx (the float add an `add` of the two gradients would "
           "do)",
    .test = {.example = rms_norm_backward_example, .checked_by = "rms_norm composite"},
};

/* ---- fused backward: dw ---- */

static slapo_status weight_infer(slapo_node *node) {
  SLAPO_TRY(slapo__norm_want_rows(node, RMS_EPS_DEFAULT));
  SLAPO_TRY(slapo__want_dtype(node, 1, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0], *dy = node->inputs[1];
  if (!slapo_shape_equal(x->ndim, x->shape, dy->ndim, dy->shape))
    return slapo_error(SLAPO_SHAPE, "rms_norm_backward_weight: dy %s differs from x %s",
                       slapo__shape_of(dy), slapo__shape_of(x));
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &x->shape[x->ndim - 1]);
}

/* The definition, in double: dw[c] = sum_r dy[r, c] x[r, c] rstd_r. */
static void weight_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]), *dy = slapo_tensor_data(in[1]); /* [R, C] */
  float *dw = slapo_tensor_data(out);                                        /* [C] */
  double eps = slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
  for (int64_t c = 0; c < C; c++) {
    double acc = 0;
    for (int64_t r = 0; r < R; r++) {
      double ss = 0;
      for (int64_t k = 0; k < C; k++) ss += (double)x[r * C + k] * x[r * C + k];
      acc += (double)dy[r * C + c] * x[r * C + c] / sqrt(ss / (double)C + eps);
    }
    dw[c] = (float)acc;
  }
}

enum { WTILE = 64 }; /* columns per job: slapo__rms_weight_cols' tile */

/* Pass 1 (rows in parallel): each row's rstd as the forward computes it,
 * into a scratch [R]; pass 2 (64-column tiles in parallel): the sums.
 * Without scratch memory (a kernel cannot fail): the reference. */
static void weight_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  const float *x = slapo_tensor_data(in[0]), *dy = slapo_tensor_data(in[1]); /* [R, C] */
  float *dw = slapo_tensor_data(out);                                        /* [C] */
  float eps = (float)slapo_node_attr_float(node, "eps", RMS_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
  float *rstd = slapo_malloc((size_t)(R > 0 ? R : 1) * sizeof(float)); /* [R] */
  if (!rstd) {
    weight_ref(node, in, out, env);
    return;
  }
  int nt = slapo__threads_for(R * C);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t r = 0; r < R; r++) rstd[r] = slapo__rms_row_rstd(x + r * C, C, eps);
  int64_t tiles = (C + WTILE - 1) / WTILE;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; t++)
    slapo__rms_weight_cols(x, dy, rstd, R, C, t * WTILE,
                           C - t * WTILE < WTILE ? C - t * WTILE : WTILE, dw);
  slapo_free(rstd);
}

static slapo_node *weight_example(slapo_ctx *ctx) {
  int64_t xs[3] = {2, 5, 7};
  slapo_node *in[2] = {slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, xs),
                       slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 3, xs)};
  slapo_attr eps = slapo_attr_float("eps", 1e-6);
  return slapo_op_apply(ctx, SLAPO_OP_DESC(rms_norm_backward_weight), 2, in, 1, &eps);
}

SLAPO_OP_DESCRIPTOR(rms_norm_backward_weight) = {
    .name = "rms_norm_backward_weight",
    .n_inputs = 2,
    .infer = weight_infer,
    .ref = weight_ref,
    .fast = weight_fast,
    .contiguous_inputs = true,
    .doc = "(x [.., C], dy) -> dw [C] of rms_norm: the sum over the leading axes of dy * xhat "
           "in one pass (xhat recomputed) instead of an rms_norm, a mul and a sum_to; attr eps",
    .test = {.example = weight_example, .checked_by = "rms_norm composite"},
};

/* ---- typed builder ---- */

slapo_node *slapo_rms_norm(slapo_ctx *ctx, slapo_node *x, slapo_node *w, double eps) {
  slapo_attr a = slapo_attr_float("eps", eps);
  if (!w) return slapo__call1(ctx, SLAPO_OP_DESC(rms_norm), x, 1, &a);
  return slapo__call2(ctx, SLAPO_OP_DESC(rms_norm), x, w, 1, &a);
}
