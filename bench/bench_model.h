/* bench/bench_model.h - what the training benchmarks set up alike: a
 * registered family's model, scheduled, materialized (seed 1), its runner,
 * AdamW (GPT-2's betas, decay 0.1) and a batch of random ids. */
#ifndef SLAPO_BENCH_MODEL_H
#define SLAPO_BENCH_MODEL_H

#include "core/assert.h"
#include "slapo/train.h"
#include "bench_machine.h"

typedef struct bench_model {
  const slapo_model_family *family;
  slapo_model_dims dims;
  slapo_module *model;
  slapo_schedule_run sched;
  slapo_runner *runner;
  slapo_adamw *opt;
  slapo_tensor *x, *y; /* idx, targets [B, T] i32 */
} bench_model;

/* schedule may be NULL; precision NULL, "f32" or "bf16" (the root autocast
 * line `slapo train --precision` adds, before the schedule's lines); ids from
 * bench_random_ids(seed). Errors: those of the calls (the message is
 * slapo_last_error()). */
static inline slapo_status bench_model_new(const char *family, const char *config,
                                           const char *schedule, const char *precision,
                                           int64_t B, int64_t T, bool timing, uint64_t seed,
                                           bench_model *m) {
  *m = (bench_model){0};
  SLAPO_TRY(slapo_model_find(family, &m->family));
  SLAPO_TRY(m->family->dims(config, &m->dims));
  SLAPO_TRY(m->family->create(config, NULL, &m->model));
  if (schedule || precision) {
    SLAPO_TRY(slapo_models_init());
    SLAPO_TRY(slapo_schedule_file_apply(m->model, schedule, precision, NULL, 0, &m->sched));
  }
  SLAPO_TRY(slapo_module_materialize(m->model, 1));
  slapo_plan_opts opts = {.timing = timing};
  SLAPO_TRY(slapo_runner_new(m->model, &opts, &m->runner));
  SLAPO_TRY(slapo_adamw_new(m->model, &(slapo_adamw_config){0.9f, 0.95f, 1e-8f, 0.1f, false}, &m->opt));
  int64_t sh[2] = {B, T};
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &m->x));
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &m->y));
  bench_random_ids(seed, m->dims.vocab_size, B * T, slapo_tensor_data(m->x),
                   slapo_tensor_data(m->y));
  return SLAPO_OK;
}

static inline void bench_model_free(bench_model *m) {
  slapo_tensor_free(m->x);
  slapo_tensor_free(m->y);
  slapo_adamw_free(m->opt);
  slapo_runner_free(m->runner);
  slapo_schedule_run_deinit(&m->sched);
  slapo_module_free(m->model);
}

#endif
