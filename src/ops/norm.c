/* ops/norm.c - checks and row helpers shared by layer_norm and rms_norm (see
 * ops/norm.h). Layer: ops. */
#include "ops/norm.h"

slapo_status slapo__norm_want_rows(const slapo_node *node, double eps_default) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0];
  if (x->ndim < 1)
    return slapo_error(SLAPO_SHAPE, "%s: x %s is a scalar; it needs a last axis to normalise",
                       node->target, slapo__shape_of(x));
  double eps = slapo_node_attr_float(node, "eps", eps_default);
  if (!(eps >= 0))
    return slapo_error(SLAPO_INVALID_ARG, "%s: eps = %g; it must be >= 0 (e.g. %g)",
                       node->target, eps, eps_default);
  return SLAPO_OK;
}

slapo_status slapo__norm_want_channel(const slapo_node *node, int i, const char *what) {
  SLAPO_TRY(slapo__want_dtype(node, i, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0], *v = node->inputs[i];
  int64_t C = x->shape[x->ndim - 1];
  if (v->ndim != 1 || v->shape[0] != C)
    return slapo_error(SLAPO_SHAPE,
                       "%s: %s %s does not match x %s: expected [%lld] (the size of x's last "
                       "axis)",
                       node->target, what, slapo__shape_of(v), slapo__shape_of(x),
                       (long long)C);
  return SLAPO_OK;
}

slapo_status slapo__norm_backward_infer(slapo_node *node, double eps_default) {
  if (node->n_inputs != 2 && node->n_inputs != 3)
    return slapo_error(SLAPO_INVALID_ARG, "%s: expects (x, dy) or (x, weight, dy), got %d inputs",
                       node->target, node->n_inputs);
  SLAPO_TRY(slapo__norm_want_rows(node, eps_default));
  int idy = node->n_inputs - 1;
  SLAPO_TRY(slapo__want_dtype(node, idy, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0], *dy = node->inputs[idy];
  if (!slapo_shape_equal(x->ndim, x->shape, dy->ndim, dy->shape))
    return slapo_error(SLAPO_SHAPE, "%s: x %s and dy %s must have one shape", node->target,
                       slapo__shape_of(x), slapo__shape_of(dy));
  if (node->n_inputs == 3) SLAPO_TRY(slapo__norm_want_channel(node, 1, "weight"));
  return slapo__same_as_input(node, 0);
}

void slapo__norm_rows(const slapo_tensor *x, int64_t *R, int64_t *C) {
  *C = x->shape[x->ndim - 1];
  *R = *C ? slapo_tensor_numel(x) / *C : 0;
}

enum { PTILE = 64 }; /* columns per job */

/* Columns [c0, c0 + n) of the sums, rows in order 0 .. R-1, in double. */
static void param_cols(const float *x, const float *dy, const float *stats, int64_t R, int64_t C,
                       int64_t c0, int64_t n, bool with_db, float *out) {
  double dw[PTILE] = {0}, db[PTILE] = {0};
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * C + c0, *dyr = dy + r * C + c0;
    float mean = stats[2 * r], rstd = stats[2 * r + 1];
    for (int64_t j = 0; j < n; j++) {
      dw[j] += (double)(dyr[j] * ((xr[j] - mean) * rstd));
      db[j] += dyr[j];
    }
  }
  for (int64_t j = 0; j < n; j++) out[c0 + j] = (float)dw[j];
  if (with_db)
    for (int64_t j = 0; j < n; j++) out[C + c0 + j] = (float)db[j];
}

void slapo__norm_param_grads(const float *x, const float *dy, const float *stats, int64_t R,
                             int64_t C, bool with_db, float *out) {
  int64_t tiles = (C + PTILE - 1) / PTILE;
#pragma omp parallel for num_threads(slapo__threads_for(R * C)) schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; t++) {
    int64_t c0 = t * PTILE;
    param_cols(x, dy, stats, R, C, c0, C - c0 < PTILE ? C - c0 : PTILE, with_db, out);
  }
}
