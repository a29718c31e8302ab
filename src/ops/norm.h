/* ops/norm.h - checks and row helpers shared by the normalisation ops over
 * the last axis (layer_norm, rms_norm and their fused backward ops).
 * Layer: ops (internal). */
#ifndef SLAPO_OPS_NORM_H
#define SLAPO_OPS_NORM_H

#include "ops/internal.h"

/* x (input 0) f32 with a last axis; attr eps (default `eps_default`) >= 0. */
slapo_status slapo__norm_want_rows(const slapo_node *node, double eps_default);
/* Input i f32 [C], the size of x's last axis; `what` names it ("weight"). */
slapo_status slapo__norm_want_channel(const slapo_node *node, int i, const char *what);
/* A fused backward's inputs are (x, [weight,] dy[, r]): with attribute
 * residual = 1 a last input r (x's shape) is added to dx, the other
 * gradient of x folded in by module/fold_norm_add.c. Whether r is there,
 * and the number of inputs before it. */
bool slapo__norm_residual(const slapo_node *node);
int slapo__norm_core(const slapo_node *node);
/* Shape inference of a fused backward (x, [weight,] dy[, r]) -> dx. */
slapo_status slapo__norm_backward_infer(slapo_node *node, double eps_default);

/* A fused backward's operands, as its kernels read them: x, dy, r (NULL
 * without residual) and dx [R, C] contiguous; w [C] or NULL without a
 * weight; dx is the output's first R * C values. */
typedef struct slapo__norm_bwd {
  const float *x, *w, *dy, *r;
  float *dx;
  int64_t R, C;
} slapo__norm_bwd;
slapo__norm_bwd slapo__norm_bwd_of(const slapo_node *node, const slapo_tensor *const *in,
                                   slapo_tensor *out);
/* x [R, C]: C and R of a contiguous input. */
void slapo__norm_rows(const slapo_tensor *x, int64_t *R, int64_t *C);

#endif
