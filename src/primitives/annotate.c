/* primitives/annotate.c - the `annotate` primitive: key/value tags on a
 * parameter. Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help annotate` prints it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "primitives/internal.h"

/* The log argument for key=value from C, in the form a .sched line writes
 * it: weight_decay=0 (a number, as in a schedule file), a bare word where
 * the value is one, else a quoted string. */
static slapo_sched_arg value_arg(slapo_sched *node, const char *key, const char *value) {
  char *end;
  slapo_sched_arg bare[4] = {
      slapo_sched_arg_word(key, value),
      {.key = key, .kind = SLAPO_SCHED_ARG_INT, .text = value, .i = strtoll(value, &end, 10)},
      {.key = key, .kind = SLAPO_SCHED_ARG_FLOAT, .text = value, .f = strtod(value, &end)},
      {.key = key, .kind = SLAPO_SCHED_ARG_BOOL, .text = value, .b = !strcmp(value, "true")},
  };
  for (int i = 0; i < 4; i++)
    if (slapo__prim_log_check(node, "annotate", 1, &bare[i]) == SLAPO_OK) return bare[i];
  return slapo_sched_arg_string(key, value);
}

/* Tags param with keys[i]=values[i]; logs `from`'s arguments as written when
 * the request came from a schedule line, else args made by value_arg. */
static slapo_status annotate_impl(slapo_sched *node, const char *param, int n,
                                  const char *const *keys, const char *const *values,
                                  const slapo_sched_entry *from) {
  slapo_parameter *p;
  SLAPO_TRY(slapo__prim_param(node, "annotate", param, &p));
  /* Check every value and the log line before setting any tag, so a failure
   * changes nothing. */
  for (int i = 0; i < n; i++) {
    if (!strcmp(keys[i], "weight_decay")) {
      char *end;
      double wd = strtod(values[i], &end);
      if (!values[i][0] || *end || !isfinite(wd))
        return slapo_error(SLAPO_INVALID_ARG,
                           "annotate: %s.%s: weight_decay=%s is not a finite number",
                           slapo__prim_path(node), param, values[i]);
    }
  }
  slapo_sched_arg args[17];
  int na = 0;
  if (from) {
    for (int i = 0; i < from->n_args && na < 17; i++) args[na++] = from->args[i];
  } else {
    args[na++] = slapo_sched_arg_word(NULL, param);
    for (int i = 0; i < n && na < 17; i++) args[na++] = value_arg(node, keys[i], values[i]);
  }
  SLAPO_TRY(slapo__prim_log_check(node, "annotate", na, args));
  for (int i = 0; i < n; i++) SLAPO_TRY(slapo_parameter_set_tag(p, keys[i], values[i]));
  return slapo__prim_log(node, "annotate", na, args, from, true);
}

slapo_status slapo_annotate(slapo_sched *node, const char *param, const char *key,
                            const char *value) {
  if (!param || !key || !value)
    return slapo_error(SLAPO_INVALID_ARG,
                       "annotate: %s: parameter, key and value must not be NULL",
                       slapo__prim_path(node));
  return annotate_impl(node, param, 1, &key, &value, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  const slapo_sched_arg *p = slapo_sched_entry_positional(e, 0);
  if (!p || p->kind != SLAPO_SCHED_ARG_WORD || slapo_sched_entry_positional(e, 1))
    return slapo_error(SLAPO_INVALID_ARG, "annotate: expected a parameter name and key=value "
                                          "tags, e.g. 'annotate bias weight_decay=0'");
  const char *keys[16], *values[16];
  char text[16][40]; /* values of numbers and booleans made in C (text NULL) */
  int n = 0;
  for (int i = 0; i < e->n_args; i++) {
    const slapo_sched_arg *a = &e->args[i];
    if (!a->key) continue;
    if (n == 16) return slapo_error(SLAPO_LIMIT, "annotate: at most 16 tags a line");
    keys[n] = a->key;
    values[n] = a->text;
    if (!a->text) {
      if (a->kind == SLAPO_SCHED_ARG_INT)
        snprintf(text[n], sizeof text[n], "%lld", (long long)a->i);
      else if (a->kind == SLAPO_SCHED_ARG_FLOAT)
        snprintf(text[n], sizeof text[n], "%.17g", a->f);
      else if (a->kind == SLAPO_SCHED_ARG_BOOL)
        snprintf(text[n], sizeof text[n], "%s", a->b ? "true" : "false");
      else
        return slapo_error(SLAPO_INVALID_ARG, "annotate: %s: %s has no value",
                           slapo__prim_path(node), a->key);
      values[n] = text[n];
    }
    n++;
  }
  if (n == 0)
    return slapo_error(SLAPO_INVALID_ARG, "annotate: %s: no key=value tag given",
                       slapo__prim_path(node));
  return annotate_impl(node, p->text, n, keys, values, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(annotate) = {
    .name = "annotate",
    .summary = "tag a parameter with key=value (weight_decay is read by AdamW)",
    .doc = "annotate <param> key=value [key=value ...]\n"
           "  C: slapo_annotate(node, \"bias\", \"weight_decay\", \"0\")\n"
           "  Applies to a parameter of the node's module.\n"
           "  Effect: tags live on the parameter, so they survive replace and tied\n"
           "  uses; AdamW reads weight_decay as the parameter's decay coefficient.\n"
           "  Fails: NOT_FOUND for an unknown parameter (the message lists them);\n"
           "  INVALID_ARG when weight_decay is not a finite number.\n"
           "  Verified: bitwise (no arithmetic of a step changes).\n",
    .bitwise = true,
    .apply = apply,
};
