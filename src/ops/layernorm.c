/* ops/layernorm.c - LayerNorm over the last axis (Ba, Kiros, Hinton 2016;
 * PyTorch nn.LayerNorm: biased variance, eps inside the sqrt) with or without
 * the affine weight/bias, and its fused gradient "layer_norm_backward": dx,
 * or (attribute params = 1) dx, dw and db in one pass, packed; with
 * residual = 1 a last input r is added to dx (ops/norm.h).
 * Layer: ops. Math follows llm.c layernorm_forward/layernorm_backward:
 *   xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps), y = xhat * w + b
 *   dx = rstd * (dyw - mean(dyw) - xhat * mean(dyw * xhat)), dyw = dy * w
 *   dw = sum over rows of dy * xhat, db = sum over rows of dy
 * (derivation in docs/nn_backward.md). */
#include <math.h>
#include <string.h>

#include "ops/norm.h"
#include "slapo/ops/rowmath.h"
#include "slapo/ops/vmath.h"

#define LN_EPS_DEFAULT 1e-5

/* ---- forward ---- */

static slapo_status layer_norm_infer(slapo_node *node) {
  if (node->n_inputs != 1 && node->n_inputs != 3)
    return slapo_error(SLAPO_INVALID_ARG,
                       "layer_norm: expects 1 input (x) or 3 (x, weight, bias), got %d; pass "
                       "both weight and bias or neither",
                       node->n_inputs);
  SLAPO_TRY(slapo__norm_want_rows(node, LN_EPS_DEFAULT));
  if (node->n_inputs == 3) {
    SLAPO_TRY(slapo__norm_want_channel(node, 1, "weight"));
    SLAPO_TRY(slapo__norm_want_channel(node, 2, "bias"));
  }
  return slapo__same_as_input(node, 0);
}

/* The reference kernels' mean and 1/std of one row, in double (two passes,
 * biased variance, eps inside the sqrt: PyTorch's definition). */
static void ref_row_stats(const float *xr, int64_t C, double eps, double *mean, double *rstd) {
  double m = 0, var = 0;
  for (int64_t c = 0; c < C; c++) m += xr[c];
  m /= (double)C;
  for (int64_t c = 0; c < C; c++) var += (xr[c] - m) * (xr[c] - m);
  *mean = m;
  *rstd = 1.0 / sqrt(var / (double)C + eps);
}

static void layer_norm_ref(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);                            /* x [R, C] */
  const float *w = node->n_inputs == 3 ? slapo_tensor_data(in[1]) : NULL; /* w [C] */
  const float *b = node->n_inputs == 3 ? slapo_tensor_data(in[2]) : NULL; /* b [C] */
  float *y = slapo_tensor_data(out);                                    /* y [R, C] */
  double eps = slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C;
    double mean, rstd;
    ref_row_stats(xr, C, eps, &mean, &rstd);
    for (int64_t c = 0; c < C; c++) {
      double v = (xr[c] - mean) * rstd;
      y[r * C + c] = (float)(w ? v * w[c] + b[c] : v);
    }
  }
}

/* The fast kernels' row routines are slapo/ops/rowmath.h's (the cc backend
 * pastes the same text into fused regions), compiled per ISA level here. */
SLAPO__SIMD_PROC(row_stats, (const float *xr, int64_t C, float eps, float *mean, float *rstd),
                 (xr, C, eps, mean, rstd)) {
  slapo__ln_row_stats(xr, C, eps, mean, rstd);
}

SLAPO__SIMD_PROC(norm_row,
                 (const float *restrict xr, const float *restrict w, const float *restrict b,
                  float *restrict yr, int64_t C, float mean, float rstd),
                 (xr, w, b, yr, C, mean, rstd)) {
  slapo__ln_norm_row(xr, w, b, yr, C, mean, rstd);
}

static void layer_norm_fast(const slapo_node *node, const slapo_tensor *const *in,
                            slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);                            /* x [R, C] */
  const float *w = node->n_inputs == 3 ? slapo_tensor_data(in[1]) : NULL; /* w [C] */
  const float *b = node->n_inputs == 3 ? slapo_tensor_data(in[2]) : NULL; /* b [C] */
  float *y = slapo_tensor_data(out);                                    /* y [R, C] */
  float eps = (float)slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C;
    float *yr = y + r * C;
    float mean, rstd;
    row_stats(xr, C, eps, &mean, &rstd);
    norm_row(xr, w, b, yr, C, mean, rstd);
  }
}

static slapo_status layer_norm_backward_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                             const bool *need, slapo_node **dx) {
  slapo_node *x = node->inputs[0];
  bool affine = node->n_inputs == 3;
  slapo_attr eps = slapo_attr_float("eps", slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT));
  for (int i = 0; i < node->n_inputs; i++) dx[i] = NULL;
  if (affine && (need[1] || need[2])) {
    /* One pass for dx, dw and db (layer_norm_backward with params = 1),
     * read back through zero-copy unpack views, instead of dx plus a
     * recomputed xhat, a product and two reductions over [R, C]. */
    slapo_node *in[3] = {x, node->inputs[1], dy};
    slapo_attr pa[2] = {eps, slapo_attr_int("params", 1)};
    slapo_node *pk = slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm_backward), 3, in, 2, pa);
    int64_t n = 1, C = x->shape[x->ndim - 1];
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d];
    for (int i = 0; i < 3; i++) {
      if (!need[i]) continue;
      int64_t off = i == 0 ? 0 : n + (i - 1) * C;
      slapo_attr a[2] = {slapo_attr_int("offset", off),
                         i == 0 ? slapo_attr_ints("shape", x->ndim, x->shape)
                                : slapo_attr_ints("shape", 1, &C)};
      dx[i] = slapo_op_apply(ctx, SLAPO_OP_DESC(unpack), 1, &pk, 2, a);
    }
    return slapo_ctx_status(ctx);
  }
  if (need[0]) {
    slapo_node *in[3] = {x, affine ? node->inputs[1] : dy, dy};
    dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm_backward), affine ? 3 : 2, in, 1, &eps);
  }
  if (affine && need[1]) {
    /* dw = sum over leading axes of dy * xhat; xhat is recomputed rather than
     * derived as (y - b) / w, which divides by weights that may be 0. */
    slapo_node *xhat = slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm), 1, &x, 1, &eps);
    dx[1] = slapo__grad_to(ctx, slapo_mul(ctx, dy, xhat), node->inputs[1]);
  }
  if (affine && need[2]) dx[2] = slapo__grad_to(ctx, dy, node->inputs[2]);
  return slapo_ctx_status(ctx);
}

static slapo_node *layer_norm_example(slapo_ctx *ctx) {
  int64_t xs[3] = {2, 3, 7}, cs[1] = {7};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, xs);
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 1, cs);
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, cs);
  return slapo_layer_norm(ctx, x, w, b, 1e-5);
}

SLAPO_OP_DESCRIPTOR(layer_norm) = {
    .name = "layer_norm",
    .n_inputs = -1,
    .infer = layer_norm_infer,
    .ref = layer_norm_ref,
    .fast = layer_norm_fast,
    .backward = layer_norm_backward_rule,
    .contiguous_inputs = true,
    .doc = "(x [.., C][, w [C], b [C]]) -> (x - mean) / sqrt(var + eps) [* w + b] over the "
           "last axis, biased variance (Ba et al. 2016; PyTorch nn.LayerNorm); attr eps",
    /* Inputs in [-1, 1] over 7 channels can have a small variance (rstd ~ 5):
     * the default tolerances still hold with the 1e-3 step. */
    .test = {.example = layer_norm_example},
};

/* ---- fused backward: dx ---- */

static void layer_norm_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                                    slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  slapo__norm_bwd b = slapo__norm_bwd_of(node, in, out);
  const float *x = b.x, *w = b.w, *dy = b.dy, *res = b.r;
  float *dx = b.dx;
  const int64_t R = b.R, C = b.C;
  double eps = slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C, *dyr = dy + r * C;
    double mean, rstd;
    ref_row_stats(xr, C, eps, &mean, &rstd);
    double mean_dyw = 0, mean_dyw_xhat = 0;
    for (int64_t c = 0; c < C; c++) {
      double dyw = (double)dyr[c] * (w ? w[c] : 1.0);
      mean_dyw += dyw;
      mean_dyw_xhat += dyw * (xr[c] - mean) * rstd;
    }
    mean_dyw /= (double)C;
    mean_dyw_xhat /= (double)C;
    for (int64_t c = 0; c < C; c++) {
      double dyw = (double)dyr[c] * (w ? w[c] : 1.0);
      double xhat = (xr[c] - mean) * rstd;
      float d = (float)(rstd * (dyw - mean_dyw - xhat * mean_dyw_xhat));
      /* The float add the unfolded graph's `add` did. */
      dx[r * C + c] = res ? d + res[r * C + c] : d;
    }
  }
}

SLAPO__SIMD_PROC(backward_row,
                 (const float *restrict xr, const float *restrict w, const float *restrict dyr,
                  const float *restrict rr, float *restrict dxr, int64_t C, float mean,
                  float rstd),
                 (xr, w, dyr, rr, dxr, C, mean, rstd)) {
  slapo__ln_backward_row(xr, w, dyr, rr, dxr, C, mean, rstd);
}

static void layer_norm_backward_fast(const slapo_node *node, const slapo_tensor *const *in,
                                     slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  slapo__norm_bwd b = slapo__norm_bwd_of(node, in, out);
  const int64_t R = b.R, C = b.C;
  float eps = (float)slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t r = 0; r < R; r++) {
    const float *xr = b.x + r * C;
    float mean, rstd;
    row_stats(xr, C, eps, &mean, &rstd);
    backward_row(xr, b.w, b.dy + r * C, b.r ? b.r + r * C : NULL, b.dx + r * C, C, mean, rstd);
  }
}

/* ---- fused backward with params = 1: dx, dw, db ---- */

/* The packed output of layer_norm_backward with params = 1 over x [R, C]: dx [R * C],
 * dw [C], db [C]; then, from a 64-byte boundary, the fast kernel's work
 * area of LNB_BLOCKS * 2C floats (the row blocks' partial sums of dw and
 * db; float adds keep affine_row at the vector width, where double ones
 * cost the kernel ~10% in the model), zero when the kernel returns. The
 * work lives in the node's own buffer because kernels cannot fail (no
 * allocation in them). */
enum { LNB_BLOCKS = 32 };
static int64_t lnb_work_at(int64_t R, int64_t C) { return (R * C + 2 * C + 15) / 16 * 16; }

static bool lnb_params(const slapo_node *node) { return slapo_node_attr_int(node, "params", 0); }

static slapo_status layer_norm_backward_params_infer(slapo_node *node) {
  if (slapo__norm_core(node) != 3)
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: params = 1 expects (x, weight, dy[, r]), got %d inputs",
                       node->target, node->n_inputs);
  const slapo_node *x = node->inputs[0];
  int64_t C = x->shape[x->ndim - 1], R = 1;
  for (int d = 0; d + 1 < x->ndim; d++) R *= x->shape[d];
  int64_t n = lnb_work_at(R, C) + (int64_t)LNB_BLOCKS * 2 * C;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &n);
}

static void layer_norm_backward_params_ref(const slapo_node *node, const slapo_tensor *const *in,
                                           slapo_tensor *out, const slapo_kernel_env *env) {
  layer_norm_backward_ref(node, in, out, env); /* dx: the first R * C values */
  const float *x = slapo_tensor_data(in[0]);  /* x  [R, C] */
  const float *dy = slapo_tensor_data(in[2]); /* dy [R, C] */
  float *o = slapo_tensor_data(out);          /* dx [R, C], dw [C], db [C], work */
  double eps = slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
  int64_t R, C;
  slapo__norm_rows(in[0], &R, &C);
  double *acc = (double *)(o + lnb_work_at(R, C)); /* dw, db [2, C]: the work area */
  memset(acc, 0, sizeof(double) * 2 * (size_t)C);
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C;
    double mean, rstd;
    ref_row_stats(xr, C, eps, &mean, &rstd);
    for (int64_t c = 0; c < C; c++) {
      acc[c] += (double)dy[r * C + c] * ((xr[c] - mean) * rstd);
      acc[C + c] += dy[r * C + c];
    }
  }
  for (int64_t c = 0; c < 2 * C; c++) o[R * C + c] = (float)acc[c];
  memset(o + R * C + 2 * C, 0,
         sizeof(float) * (size_t)(slapo_tensor_numel(out) - R * C - 2 * C));
}

SLAPO__SIMD_PROC(affine_row,
                 (const float *restrict xr, const float *restrict dyr, float *restrict pw,
                  float *restrict pb, int64_t C, float mean, float rstd),
                 (xr, dyr, pw, pb, C, mean, rstd)) {
  slapo__ln_affine_row(xr, dyr, pw, pb, C, mean, rstd);
}

/* Parallel over LNB_BLOCKS fixed row blocks (set by R, not by the thread
 * count), each walking its rows in order: dx exactly as
 * layer_norm_backward's fast kernel, dw and db into the block's partials,
 * which are then added in block order: reruns are byte-identical at any
 * thread count. */
static void layer_norm_backward_params_fast(const slapo_node *node,
                                            const slapo_tensor *const *in, slapo_tensor *out,
                                            const slapo_kernel_env *env) {
  (void)env;
  slapo__norm_bwd b = slapo__norm_bwd_of(node, in, out);
  const float *x = b.x, *w = b.w, *dy = b.dy, *res = b.r;
  float *o = b.dx; /* dx [R, C], dw [C], db [C], work */
  const int64_t R = b.R, C = b.C;
  float eps = (float)slapo_node_attr_float(node, "eps", LN_EPS_DEFAULT);
  float *work = o + lnb_work_at(R, C); /* [nrb, 2, C] */
  const int64_t rpb = (R + LNB_BLOCKS - 1) / LNB_BLOCKS, nrb = R ? (R + rpb - 1) / rpb : 0;
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t t = 0; t < nrb; t++) {
    float *pw = work + t * 2 * C, *pb = pw + C;
    memset(pw, 0, sizeof(float) * 2 * (size_t)C);
    for (int64_t r = t * rpb; r < R && r < (t + 1) * rpb; r++) {
      const float *xr = x + r * C, *dyr = dy + r * C;
      float mean, rstd;
      row_stats(xr, C, eps, &mean, &rstd);
      backward_row(xr, w, dyr, res ? res + r * C : NULL, o + r * C, C, mean, rstd);
      affine_row(xr, dyr, pw, pb, C, mean, rstd);
    }
  }
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double sw = 0, sb = 0;
    for (int64_t t = 0; t < nrb; t++) sw += work[t * 2 * C + c], sb += work[t * 2 * C + C + c];
    o[R * C + c] = (float)sw;
    o[R * C + C + c] = (float)sb;
  }
  /* The tail as the reference leaves it: zeros. */
  memset(o + R * C + 2 * C, 0,
         sizeof(float) * (size_t)(slapo_tensor_numel(out) - R * C - 2 * C));
}

/* Both forms: dx alone (layer_norm_backward_ref / _fast), or packed with params. */
static slapo_status layer_norm_backward_any_infer(slapo_node *node) {
  SLAPO_TRY(slapo__norm_backward_infer(node, LN_EPS_DEFAULT));
  return lnb_params(node) ? layer_norm_backward_params_infer(node) : SLAPO_OK;
}
static void layer_norm_backward_any_ref(const slapo_node *node, const slapo_tensor *const *in,
                                        slapo_tensor *out, const slapo_kernel_env *env) {
  if (lnb_params(node)) layer_norm_backward_params_ref(node, in, out, env);
  else layer_norm_backward_ref(node, in, out, env);
}
static void layer_norm_backward_any_fast(const slapo_node *node, const slapo_tensor *const *in,
                                         slapo_tensor *out, const slapo_kernel_env *env) {
  if (lnb_params(node)) layer_norm_backward_params_fast(node, in, out, env);
  else layer_norm_backward_fast(node, in, out, env);
}

/* The packed form over 37 rows: several row blocks, the last one shorter
 * (dx alone is the same code, checked as the packed form's first part). */
static slapo_node *layer_norm_backward_example(slapo_ctx *ctx) {
  int64_t xs[2] = {37, 7}, cs[1] = {7};
  slapo_node *in[3] = {slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, xs),
                       slapo_input(ctx, "w", SLAPO_DTYPE_F32, 1, cs),
                       slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, xs)};
  slapo_attr a[2] = {slapo_attr_float("eps", 1e-5), slapo_attr_int("params", 1)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm_backward), 3, in, 2, a);
}

SLAPO_OP_DESCRIPTOR(layer_norm_backward) = {
    .name = "layer_norm_backward",
    .n_inputs = -1,
    .infer = layer_norm_backward_any_infer,
    .ref = layer_norm_backward_any_ref,
    .fast = layer_norm_backward_any_fast,
    .contiguous_inputs = true,
    .doc = "(x, [w,] dy) -> dx of layer_norm, recomputing mean/rstd per row (llm.c "
           "layernorm_backward): one pass per row instead of ~12 composite ops and their "
           "[.., C] temporaries, and no stored mean/rstd; attr eps; with params = 1 and w, "
           "[dx (R * C), dw (C), db (C), work] in the same pass (read back with unpack views) "
           "instead of a recomputed xhat, dy * xhat and two row reductions; dw and db summed "
           "in double over fixed row blocks; with residual = 1 a last input r [.., C] is added "
           "to dx (the float add an `add` of the two gradients would do)",
    .test = {.example = layer_norm_backward_example, .checked_by = "layer_norm composite"},
};

/* ---- typed builder ---- */

slapo_node *slapo_layer_norm(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b,
                             double eps) {
  slapo_attr a = slapo_attr_float("eps", eps);
  if (!w && !b) return slapo__call1(ctx, SLAPO_OP_DESC(layer_norm), x, 1, &a);
  if (!w || !b) {
    /* A NULL left by an earlier failure keeps that (sticky) error. */
    const char *o = slapo_ctx_origin(ctx);
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                   "%s%slayer_norm: weight is %s but bias is %s; pass both or neither (use a "
                   "zero bias for a weight-only LayerNorm)",
                   o, o[0] ? ": " : "", w ? "given" : "NULL", b ? "given" : "NULL");
    return NULL;
  }
  slapo_node *in[3] = {x, w, b};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm), 3, in, 1, &a);
}
