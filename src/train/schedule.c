/* train/schedule.c - learning-rate schedule (linear warmup, cosine decay;
 * Loshchilov & Hutter, "SGDR", 2017, without restarts) and clipping by the
 * global gradient norm (Pascanu et al. 2013; torch.nn.utils.clip_grad_norm_).
 * Layer: train. */
#include <math.h>

#include "slapo/ops/vmath.h"
#include "slapo/dist.h"
#include "slapo/train.h"

float slapo_lr_at(int64_t step, int64_t warmup, int64_t total, float max_lr, float min_lr) {
  if (warmup > 0 && step < warmup) return max_lr * (float)(step + 1) / (float)warmup;
  if (step >= total) return min_lr;
  double span = (double)(total - warmup);
  double frac = span > 0 ? (double)(step - warmup) / span : 1.0;
  return min_lr + (float)(0.5 * (1.0 + cos(M_PI * frac))) * (max_lr - min_lr);
}

typedef struct norm_state {
  double sumsq;
  double scale;
  double sharded; /* squares of tensor-parallel shards: summed over the group */
} norm_state;

static void add_sq(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  norm_state *st = ud;
  if (!p->grad) return;
  const float *g = slapo_tensor_data(p->grad); /* [numel] */
  double sq = slapo__sum_squares(g, slapo_tensor_numel(p->grad));
  if (slapo_parameter_is_sharded(p)) st->sharded += sq; /* summed over the group below */
  else st->sumsq += sq;
}

static void scale(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  const norm_state *st = ud;
  if (!p->grad) return;
  float *g = slapo_tensor_data(p->grad);
  int64_t n = slapo_tensor_numel(p->grad);
  const float c = (float)st->scale;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) g[i] *= c;
}

float slapo_clip_scale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

double slapo_grad_norm_from_sumsq(double replicated, double sharded) {
  /* Sharded parameters: every rank of the tensor-parallel group holds a
   * different piece. A failed all-reduce gives NaN (the norm is unknown). */
  if (slapo_dist_all_reduce_f64(SLAPO_GROUP_TP, &sharded, 1) != SLAPO_OK) return NAN;
  return sqrt(replicated + sharded);
}

double slapo_train_grad_norm(slapo_runner *r, slapo_module *model) {
  double replicated, sharded;
  if (slapo_dist_size(SLAPO_GROUP_DP) > 1 ||
      slapo_runner_grad_sumsq(r, &replicated, &sharded) != SLAPO_OK)
    return slapo_clip_grad_norm(model, 0);
  return slapo_grad_norm_from_sumsq(replicated, sharded);
}

double slapo_clip_grad_norm(slapo_module *model, double max_norm) {
  norm_state st = {0, 1, 0};
  slapo_module_visit_params(model, add_sq, &st);
  double norm = slapo_grad_norm_from_sumsq(st.sumsq, st.sharded);
  if (isnan(norm)) return norm;
  if (max_norm > 0 && norm > max_norm) {
    st.scale = slapo_clip_scale(norm, max_norm);
    slapo_module_visit_params(model, scale, &st);
  }
  return norm;
}
