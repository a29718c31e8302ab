/* rewrite/rules.c - the tables of rules: the step's (step_rules.def), and
 * lookup by name for tools and tests. Layer: rewrite. */
#include <string.h>

#include "rewrite/internal.h"

static const slapo_rewrite_rule *const k_step[] = {
#define SLAPO_RULE(id) &slapo__rule_##id,
#include "rewrite/step_rules.def"
#undef SLAPO_RULE
};

const slapo_rewrite_rule *const *slapo_rewrite_step_rules(int *n) {
  *n = (int)SLAPO_ARRAY_LEN(k_step);
  return k_step;
}

const slapo_rewrite_rule *slapo_rewrite_rule_find(const char *name) {
  for (size_t i = 0; name && i < SLAPO_ARRAY_LEN(k_step); i++)
    if (!strcmp(k_step[i]->name, name)) return k_step[i];
  return NULL;
}
