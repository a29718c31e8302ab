/* train/pp_verify.c - pipeline parallelism checked against one process
 * (slapo_pp_verify, `slapo verify --pp K`): the same scheduled model run
 * whole by slapo_train_accumulate and as this rank's stage by
 * slapo_pp_train_accumulate over the same micro-batches; the loss and
 * every gradient a single stage holds must be bitwise equal (the stages
 * run the one-process graph's ops in its order, and accumulate the
 * micro-batches in its order), a tied one within a tolerance (its two
 * holders' sums meet in another order). Layer: train. */
#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "train/internal.h"

typedef struct compare {
  double tied_atol;
  int n_bitwise, n_tied;
  double tied_worst;
} compare;

/* Parameter p's gradient in the pipeline (a, this stage's) against one
 * process's (b), both [n]: bitwise, or within c->tied_atol for a tied one;
 * counted when `count` (its first holder: a tied one counts once). */
static slapo_status compare_grad(compare *c, bool count, const char *path, bool tied,
                                 const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (tied && d > c->tied_worst) c->tied_worst = d;
    if (tied ? d <= c->tied_atol : memcmp(&a[i], &b[i], sizeof *a) == 0) continue;
    return slapo_error(SLAPO_VERIFY, "verify --pp: stage %d: the gradient of %s%s differs at "
                       "element %lld: %.9g pipelined, %.9g in one process (%s)",
                       slapo_dist_rank(SLAPO_GROUP_PP), path,
                       tied ? " (tied)" : "", (long long)i, (double)a[i], (double)b[i],
                       tied ? "beyond the tied tolerance" : "not bitwise");
  }
  if (count) *(tied ? &c->n_tied : &c->n_bitwise) += 1;
  return SLAPO_OK;
}

/* Every gradient this stage holds against one process's. */
static slapo_status compare_stage(compare *c, const slapo_pp_stage *st, slapo_module *pp,
                                  const slapo_module *one) {
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, pp, &o));
  slapo_status s = SLAPO_OK;
  int stage = slapo_pp_stage_index(st);
  for (int i = 0; s == SLAPO_OK && i < o.n; i++) {
    const slapo_parameter *p = o.params[i], *q = slapo_module_param_at(one, p->path);
    if (!o.mine[i] || !o.holders[i]) continue;
    if (!q || slapo_tensor_numel(q->grad) != slapo_tensor_numel(p->grad))
      s = slapo_error(SLAPO_VERIFY, "verify --pp: stage %d holds %s, which the one-process "
                      "model %s", stage, p->path, q ? "shapes otherwise" : "lacks");
    else
      s = compare_grad(c, o.first[i] == stage, p->path, o.holders[i] > 1,
                       slapo_tensor_data(p->grad), slapo_tensor_data(q->grad),
                       slapo_tensor_numel(p->grad));
  }
  slapo__pp_owners_free(&o);
  return s;
}

/* One process's loss and gradients into `one`. */
static slapo_status run_one(slapo_module *one, int n_micro, const slapo_tensor *const *inputs,
                            const slapo_kernel_env *envs, double *loss) {
  slapo_runner *r;
  SLAPO_TRY(slapo_runner_new(one, NULL, &r));
  slapo_status s = slapo_train_accumulate(r, n_micro, inputs, envs, loss, NULL);
  slapo_runner_free(r);
  return s;
}

/* The pipeline's loss and this stage's gradients into `pp`. */
static slapo_status run_pp(slapo_module *pp, slapo_pp_schedule sched, int n_micro,
                           const slapo_tensor *const *inputs, const slapo_kernel_env *envs,
                           slapo_pp_stage **st, double *loss) {
  int p = slapo_dist_size(SLAPO_GROUP_PP), s = slapo_dist_rank(SLAPO_GROUP_PP);
  int slots = slapo_pp_slots(sched, p, s, n_micro);
  SLAPO_TRY(slapo_pp_stage_new(pp, 2, inputs, s, slots, NULL, st));
  SLAPO_TRY(slapo_pp_train_accumulate(*st, sched, n_micro, inputs, envs, loss, NULL));
  return slapo_pp_sum_tied_grads(*st, pp, NULL);
}

slapo_status slapo_pp_verify(slapo_module *pp, slapo_module *one, slapo_pp_schedule sched,
                             int n_micro, const slapo_tensor *const *inputs,
                             const slapo_kernel_env *envs, double tied_atol,
                             slapo_pp_verify_report *out) {
  *out = (slapo_pp_verify_report){0};
  int p = slapo_dist_size(SLAPO_GROUP_PP);
  if (slapo_dist_size(SLAPO_GROUP_DP) > 1 || slapo_dist_size(SLAPO_GROUP_TP) > 1)
    return slapo_error(SLAPO_INVALID_ARG, "verify --pp %d: run it on %d ranks, one a stage "
                       "(the world is %d: data- or tensor-parallel ranks beside the pipeline "
                       "are not checked)", p, p, slapo_dist_size(SLAPO_GROUP_WORLD));
  if (slapo_pp_stage_count(pp) != p)
    return slapo_error(SLAPO_INVALID_ARG, "verify --pp %d: the schedule cuts the model into %d "
                       "stages; give %d cut lines", p, slapo_pp_stage_count(pp), p - 1);
  double want;
  slapo_pp_stage *st = NULL;
  SLAPO_TRY(run_one(one, n_micro, inputs, envs, &want));
  compare c = {tied_atol, 0, 0, 0};
  slapo_status s = run_pp(pp, sched, n_micro, inputs, envs, &st, &out->loss);
  slapo_status diff = s == SLAPO_OK ? compare_stage(&c, st, pp, one) : SLAPO_OK;
  slapo_pp_stage_free(st);
  SLAPO_TRY(s);
  if (diff != SLAPO_OK && diff != SLAPO_VERIFY) return diff;
  /* The verdicts of every stage: counts summed, the worst and any
   * difference the largest. */
  double sum[2] = {c.n_bitwise, c.n_tied}, worst[2] = {c.tied_worst, diff != SLAPO_OK};
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_PP, sum, 2));
  SLAPO_TRY(slapo_dist_max_f64(SLAPO_GROUP_PP, worst, 2));
  out->n_bitwise = (int)sum[0], out->n_tied = (int)sum[1], out->tied_worst = worst[0];
  if (diff != SLAPO_OK) return diff; /* its own message */
  if (worst[1] > 0)
    return slapo_error(SLAPO_VERIFY, "verify --pp: another stage's gradients differ (its rank "
                       "names the parameter)");
  if (memcmp(&out->loss, &want, sizeof want))
    return slapo_error(SLAPO_VERIFY, "verify --pp: the loss differs: %.17g pipelined, %.17g in "
                       "one process", out->loss, want);
  return SLAPO_OK;
}
