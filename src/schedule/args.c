/* schedule/args.c - typed access to an entry's arguments for primitives'
 * text-form adapters: lookup by key or position, int / float / bool /
 * string getters and the known-keys check, with messages that name the
 * entry's file:line, the primitive and the key. Layer: schedule. */
#include <stdio.h>
#include <string.h>

#include "schedule/internal.h"

/* "m.sched:3: checkpoint" or "transformer.h checkpoint" into buf. */
static const char *where(const slapo_sched_entry *e, char *buf, size_t cap) {
  if (e->file && e->line > 0) snprintf(buf, cap, "%s:%d: %s", e->file, e->line, e->primitive);
  else if (e->file) snprintf(buf, cap, "%s: %s", e->file, e->primitive);
  else snprintf(buf, cap, "%s %s", e->path, e->primitive);
  return buf;
}

const slapo_sched_arg *slapo_sched_entry_find(const slapo_sched_entry *e, const char *key) {
  for (int j = 0; j < e->n_args; j++)
    if (e->args[j].key && !strcmp(e->args[j].key, key)) return &e->args[j];
  return NULL;
}

const slapo_sched_arg *slapo_sched_entry_positional(const slapo_sched_entry *e, int i) {
  for (int j = 0; j < e->n_args; j++)
    if (!e->args[j].key && i-- == 0) return &e->args[j];
  return NULL;
}

/* The argument for key, or NULL with *st set: OK (absent, optional) or
 * INVALID_ARG (absent, required). */
static const slapo_sched_arg *lookup(const slapo_sched_entry *e, const char *key, bool required,
                                     const char *expected, slapo_status *st) {
  const slapo_sched_arg *a = slapo_sched_entry_find(e, key);
  *st = SLAPO_OK;
  if (!a && required) {
    char w[512];
    *st = slapo_error(SLAPO_INVALID_ARG, "%s: missing argument '%s' (expected %s=<%s>)",
                      where(e, w, sizeof w), key, key, expected);
  }
  return a;
}

static slapo_status wrong(const slapo_sched_entry *e, const slapo_sched_arg *a,
                          const char *expected) {
  char w[512];
  bool str = a->kind == SLAPO_SCHED_ARG_STRING;
  const char *q = str ? "\"" : "";
  return slapo_error(SLAPO_INVALID_ARG, "%s: %s=%s%s%s: expected %s, got %s%s%s",
                     where(e, w, sizeof w), a->key, q, a->text, q, expected, str ? "\"" : "'",
                     a->text, str ? "\"" : "'");
}

slapo_status slapo_sched_entry_get_int(const slapo_sched_entry *e, const char *key, bool required,
                                       int64_t *out) {
  slapo_status st;
  const slapo_sched_arg *a = lookup(e, key, required, "integer", &st);
  if (!a) return st;
  if (a->kind != SLAPO_SCHED_ARG_INT) return wrong(e, a, "an integer");
  *out = a->i;
  return SLAPO_OK;
}

slapo_status slapo_sched_entry_get_float(const slapo_sched_entry *e, const char *key,
                                         bool required, double *out) {
  slapo_status st;
  const slapo_sched_arg *a = lookup(e, key, required, "number", &st);
  if (!a) return st;
  if (a->kind != SLAPO_SCHED_ARG_INT && a->kind != SLAPO_SCHED_ARG_FLOAT)
    return wrong(e, a, "a number");
  *out = a->f;
  return SLAPO_OK;
}

slapo_status slapo_sched_entry_get_bool(const slapo_sched_entry *e, const char *key, bool required,
                                        bool *out) {
  slapo_status st;
  const slapo_sched_arg *a = lookup(e, key, required, "true|false", &st);
  if (!a) return st;
  if (a->kind != SLAPO_SCHED_ARG_BOOL) return wrong(e, a, "true or false");
  *out = a->b;
  return SLAPO_OK;
}

slapo_status slapo_sched_entry_get_string(const slapo_sched_entry *e, const char *key,
                                          bool required, const char **out) {
  slapo_status st;
  const slapo_sched_arg *a = lookup(e, key, required, "name", &st);
  if (!a) return st;
  if (a->kind != SLAPO_SCHED_ARG_WORD && a->kind != SLAPO_SCHED_ARG_STRING)
    return wrong(e, a, "a name or a quoted string");
  *out = a->text;
  return SLAPO_OK;
}

slapo_status slapo_sched_entry_check_args(const slapo_sched_entry *e, const char *const *known,
                                          int max_positional) {
  char w[512];
  int n_pos = 0;
  for (int j = 0; j < e->n_args; j++) {
    const slapo_sched_arg *a = &e->args[j];
    if (!a->key) {
      if (++n_pos > max_positional)
        return slapo_error(SLAPO_INVALID_ARG,
                           "%s: unexpected argument '%s' (at most %d positional argument%s)",
                           where(e, w, sizeof w), a->text, max_positional,
                           max_positional == 1 ? "" : "s");
      continue;
    }
    bool ok = false;
    for (const char *const *k = known; k && *k && !ok; k++) ok = !strcmp(*k, a->key);
    if (ok) continue;
    char list[512] = "";
    for (const char *const *k = known; k && *k; k++) slapo_list_append(list, sizeof list, *k);
    return slapo_error(SLAPO_INVALID_ARG, "%s: unknown argument '%s' (known: %s)",
                       where(e, w, sizeof w), a->key, list[0] ? list : "none");
  }
  return SLAPO_OK;
}
