/* train/schedule.c - learning-rate schedule (linear warmup, cosine decay;
 * Loshchilov & Hutter, "SGDR", 2017, without restarts) and clipping by the
 * global gradient norm (Pascanu et al. 2013; torch.nn.utils.clip_grad_norm_).
 * Layer: train. */
#include <math.h>

#include "ops/vmath.h"
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

/* Sum of squares of x [n] in double. LANES interleaved partial sums (element
 * i goes to lane i % LANES), added in lane order at the end: a fixed order,
 * so the result is reproducible, and one the compiler vectorizes (AVX-512
 * where the CPU has it: the float-to-double conversions make this loop
 * compute-bound at SSE width), where a single running sum waits on the
 * previous add for every element. */
SLAPO__SIMD_FN(double, sum_sq, (const float *x, int64_t n), (x, n)) {
  enum { LANES = 16 };
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += (double)x[i + l] * x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * x[i];
  double s = 0;
  for (int l = 0; l < LANES; l++) s += acc[l];
  return s;
}

static void add_sq(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  norm_state *st = ud;
  if (!p->grad) return;
  const float *g = slapo_tensor_data(p->grad); /* [numel] */
  int64_t n = slapo_tensor_numel(p->grad);
  /* Fixed chunks summed in order (an OpenMP reduction combines partial sums
   * in arrival order, which is not bitwise reproducible). */
  enum { CHUNKS = 64 };
  double part[CHUNKS] = {0};
  int64_t per = (n + CHUNKS - 1) / CHUNKS;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int c = 0; c < CHUNKS; c++) {
    int64_t begin = c * per, end = (c + 1) * per < n ? (c + 1) * per : n;
    part[c] = begin < end ? sum_sq(g + begin, end - begin) : 0.0;
  }
  double sq = 0;
  for (int c = 0; c < CHUNKS; c++) sq += part[c];
  if (p->shard && p->shard->count > 1) st->sharded += sq; /* summed over the group below */
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

double slapo_clip_grad_norm(slapo_module *model, double max_norm) {
  norm_state st = {0, 1, 0};
  slapo_module_visit_params(model, add_sq, &st);
  /* Sharded parameters: every rank of the tensor-parallel group holds a
   * different piece. A failed all-reduce gives NaN (the norm is unknown). */
  if (slapo_dist_all_reduce_f64(SLAPO_GROUP_TP, &st.sharded, 1) != SLAPO_OK) return NAN;
  double norm = sqrt(st.sumsq + st.sharded);
  if (max_norm > 0 && norm > max_norm) {
    st.scale = slapo_clip_scale(norm, max_norm);
    slapo_module_visit_params(model, scale, &st);
  }
  return norm;
}
