/* apply/apply.c - applying a schedule file's expanded steps to a model.
 * Layer: apply. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/apply.h"

static bool is_disabled(size_t number, const size_t *disabled, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (disabled[i] == number) return true;
  return false;
}

/* A step that fails after disabled ones may fail because of them (a fuse
 * whose trace was disabled): the message lists those before it. */
static slapo_status name_disabled(slapo_status s, size_t number, const size_t *disabled,
                                  size_t n) {
  char list[256] = "";
  size_t len = 0;
  for (size_t i = 0; i < n && len < sizeof list - 24; i++)
    if (disabled[i] < number)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%zu", len ? ", " : "", disabled[i]);
  if (!len) return s;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", slapo_last_error());
  return slapo_error(s, "%s (this step may need disabled step%s %s)", msg,
                     strchr(list, ',') ? "s" : "", list);
}

slapo_status slapo_apply_schedule(slapo_sched *root, const slapo_sched_log *log,
                                  const size_t *disabled, size_t n_disabled, size_t upto,
                                  size_t *n_applied) {
  if (n_applied) *n_applied = 0;
  slapo_sched_steps steps = {0};
  SLAPO_TRY(slapo_sched_expand(log, root, &steps));
  slapo_status s = SLAPO_OK;
  size_t last = steps.n ? steps.items[steps.n - 1].number : 0;
  for (size_t i = 0; i < n_disabled && s == SLAPO_OK; i++)
    if (disabled[i] < 1 || disabled[i] > last)
      s = slapo_error(SLAPO_INVALID_ARG,
                      "disabled step %zu does not exist: the schedule expands to %zu steps on "
                      "this model (see slapo show --schedule)",
                      disabled[i], last);
  for (size_t i = 0; i < steps.n && s == SLAPO_OK; i++) {
    const slapo_sched_step *st = &steps.items[i];
    if (upto && st->number > upto) break;
    if (is_disabled(st->number, disabled, n_disabled)) continue;
    slapo_sched *node;
    s = slapo_sched_at(root, st->path, &node);
    if (s != SLAPO_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      s = slapo_error(s, "%s:%d: step %zu (%s %s): %s", st->entry->file ? st->entry->file : "?",
                      st->entry->line, st->number, st->path, st->entry->primitive, msg);
      break;
    }
    slapo_sched_entry e = *st->entry;
    e.path = st->path;
    s = slapo_primitive_apply(node, &e);
    if (s != SLAPO_OK) s = name_disabled(s, st->number, disabled, n_disabled);
    if (s == SLAPO_OK && n_applied) (*n_applied)++;
  }
  slapo_sched_steps_deinit(&steps);
  return s;
}
