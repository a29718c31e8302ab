/* apply/apply_file.c - a `.sched` file applied to a model in one call: parse,
 * create the model's schedule tree, expand the file's lines into numbered
 * steps, apply them (skipping disabled numbers). The CLI and the trainer
 * both go through here. Layer: apply. */
#include <stdbool.h>
#include <string.h>

#include "slapo/apply.h"

slapo_status slapo_schedule_load(const char *path, const char *precision, slapo_sched_log **out) {
  *out = NULL;
  bool bf16 = precision && strcmp(precision, "bf16") == 0;
  if (precision && !bf16 && strcmp(precision, "f32") != 0)
    return slapo_error(SLAPO_INVALID_ARG, "precision '%s': expected f32 or bf16", precision);
  if (!bf16) return path ? slapo_sched_parse_file(path, out) : slapo_sched_log_new(out);
  slapo_sched_log *file = NULL;
  slapo_status s = slapo_sched_parse(". autocast dtype=bf16\n", "--precision bf16", out);
  if (s == SLAPO_OK && path) s = slapo_sched_parse_file(path, &file);
  for (size_t i = 0; s == SLAPO_OK && file && i < slapo_sched_log_count(file); i++)
    s = slapo_sched_log_append(*out, slapo_sched_log_entry(file, i));
  slapo_sched_log_free(file);
  if (s != SLAPO_OK) {
    slapo_sched_log_free(*out);
    *out = NULL;
  }
  return s;
}

slapo_status slapo_schedule_file_apply(slapo_module *model, const char *path,
                                       const char *precision, const size_t *disabled,
                                       size_t n_disabled, slapo_schedule_run *out) {
  memset(out, 0, sizeof *out);
  slapo_status s = slapo_schedule_load(path, precision, &out->log);
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
