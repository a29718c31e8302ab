/* primitives/annotate.c - the `annotate` primitive: key/value tags on a
 * parameter. Layer: primitives.
 *
 * Signature   slapo_status slapo_annotate(slapo_sched *node, const char *param,
 *                                         const char *key, const char *value)
 * .sched form <path> annotate <param> key=value [key=value ...]
 * Applies to  a parameter of the node's module (local name: "weight").
 * Effect      the tag lives on the parameter object, so it survives replace
 *             (replacements share parameters) and is seen through tied uses.
 *             The optimizer reads weight_decay (AdamW's decoupled decay
 *             coefficient for that parameter). No change to the graph.
 * Fails       SLAPO_NOT_FOUND    the module has no such parameter
 *             SLAPO_INVALID_ARG  weight_decay is not a number
 * Verified by verify: bitwise equal (a tag changes no arithmetic of a step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "primitives/internal.h"

static slapo_status find_param(slapo_sched *node, const char *param, slapo_parameter **out) {
  slapo_module *m = slapo_sched_module(node);
  *out = slapo_module_param(m, param);
  if (*out) return SLAPO_OK;
  char known[256] = "";
  size_t used = 0;
  for (int i = 0; i < m->n_params && used + 1 < sizeof known; i++)
    used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                             m->param_names[i]);
  return slapo_error(SLAPO_NOT_FOUND, "annotate: %s (a %s) has no parameter '%s'; its "
                                      "parameters: %s",
                     slapo__prim_path(node), m->type->name, param, used ? known : "(none)");
}

static slapo_status annotate_impl(slapo_sched *node, const char *param, int n,
                                  const char *const *keys, const char *const *values,
                                  const slapo_sched_entry *from) {
  slapo_parameter *p;
  SLAPO_TRY(find_param(node, param, &p));
  /* Check every value before setting any, so a failure changes nothing. */
  for (int i = 0; i < n; i++) {
    if (!strcmp(keys[i], "weight_decay")) {
      char *end;
      strtod(values[i], &end);
      if (!values[i][0] || *end)
        return slapo_error(SLAPO_INVALID_ARG, "annotate: %s.%s: weight_decay=%s is not a number",
                           slapo__prim_path(node), param, values[i]);
    }
  }
  for (int i = 0; i < n; i++) SLAPO_TRY(slapo_parameter_set_tag(p, keys[i], values[i]));
  slapo_sched_arg args[17];
  int na = 0;
  args[na++] = slapo_sched_arg_word(NULL, param);
  for (int i = 0; i < n && na < 17; i++) args[na++] = slapo_sched_arg_string(keys[i], values[i]);
  return slapo__prim_log(node, "annotate", na, args, from, true);
}

slapo_status slapo_annotate(slapo_sched *node, const char *param, const char *key,
                            const char *value) {
  return annotate_impl(node, param, 1, &key, &value, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  const slapo_sched_arg *p = slapo_sched_entry_positional(e, 0);
  if (!p || p->kind != SLAPO_SCHED_ARG_WORD || slapo_sched_entry_positional(e, 1))
    return slapo_error(SLAPO_INVALID_ARG, "annotate: expected a parameter name and key=value "
                                          "tags, e.g. 'annotate bias weight_decay=0'");
  const char *keys[16], *values[16];
  int n = 0;
  for (int i = 0; i < e->n_args; i++) {
    if (!e->args[i].key) continue;
    if (n == 16) return slapo_error(SLAPO_LIMIT, "annotate: at most 16 tags a line");
    keys[n] = e->args[i].key;
    values[n++] = e->args[i].text;
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
           "  INVALID_ARG when weight_decay is not a number.\n"
           "  Verified: bitwise (no arithmetic of a step changes).\n",
    .bitwise = true,
    .apply = apply,
};
