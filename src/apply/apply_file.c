/* apply/apply_file.c - a `.sched` file applied to a model in one call: parse,
 * create the model's schedule tree, expand the file's lines into numbered
 * steps, apply them (skipping disabled numbers). The CLI and the trainer
 * both go through here. Layer: apply. */
#include <string.h>

#include "slapo/apply.h"

slapo_status slapo_schedule_file_apply(slapo_module *model, const char *path,
                                       const size_t *disabled, size_t n_disabled,
                                       slapo_schedule_run *out) {
  memset(out, 0, sizeof *out);
  slapo_status s = slapo_sched_parse_file(path, &out->log);
  if (s == SLAPO_OK) s = slapo_sched_create(model, &out->tree);
  if (s == SLAPO_OK) s = slapo_sched_expand(out->log, out->tree, &out->steps);
  if (s == SLAPO_OK)
    s = slapo_apply_schedule(out->tree, out->log, disabled, n_disabled, 0, &out->applied);
  return s;
}

void slapo_schedule_run_deinit(slapo_schedule_run *r) {
  if (!r) return;
  slapo_sched_steps_deinit(&r->steps);
  slapo_sched_free(r->tree);
  slapo_sched_log_free(r->log);
  memset(r, 0, sizeof *r);
}
