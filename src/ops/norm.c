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

bool slapo__norm_residual(const slapo_node *node) {
  return slapo_node_attr_int(node, "residual", 0) != 0;
}

int slapo__norm_core(const slapo_node *node) {
  return node->n_inputs - (slapo__norm_residual(node) ? 1 : 0);
}

slapo_status slapo__norm_backward_infer(slapo_node *node, double eps_default) {
  int core = slapo__norm_core(node);
  if (core != 2 && core != 3)
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: expects (x, dy) or (x, weight, dy)%s, got %d inputs", node->target,
                       slapo__norm_residual(node) ? " and r (residual = 1)" : "",
                       node->n_inputs);
  SLAPO_TRY(slapo__norm_want_rows(node, eps_default));
  const slapo_node *x = node->inputs[0];
  for (int i = core - 1; i < node->n_inputs; i++) { /* dy, and r */
    SLAPO_TRY(slapo__want_dtype(node, i, SLAPO_DTYPE_F32));
    const slapo_node *v = node->inputs[i];
    if (!slapo_shape_equal(x->ndim, x->shape, v->ndim, v->shape))
      return slapo_error(SLAPO_SHAPE, "%s: x %s and %s %s must have one shape", node->target,
                         slapo__shape_of(x), i == core ? "r" : "dy", slapo__shape_of(v));
  }
  if (core == 3) SLAPO_TRY(slapo__norm_want_channel(node, 1, "weight"));
  return slapo__same_as_input(node, 0);
}

slapo__norm_bwd slapo__norm_bwd_of(const slapo_node *node, const slapo_tensor *const *in,
                                   slapo_tensor *out) {
  int core = slapo__norm_core(node);
  slapo__norm_bwd b = {
      .x = slapo_tensor_data(in[0]),
      .w = core == 3 ? slapo_tensor_data(in[1]) : NULL,
      .dy = slapo_tensor_data(in[core - 1]),
      .r = slapo__norm_residual(node) ? slapo_tensor_data(in[core]) : NULL,
      .dx = slapo_tensor_data(out),
  };
  slapo__norm_rows(in[0], &b.R, &b.C);
  return b;
}

void slapo__norm_rows(const slapo_tensor *x, int64_t *R, int64_t *C) {
  *C = x->shape[x->ndim - 1];
  *R = *C ? slapo_tensor_numel(x) / *C : 0;
}
