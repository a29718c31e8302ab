/* rewrite/internal.h - what the rules' files share: the step's rules
 * (one const slapo_rewrite_rule per file, listed in step_rules.def) and two
 * small predicates. Layer: rewrite (internal). */
#ifndef SLAPO_REWRITE_INTERNAL_H
#define SLAPO_REWRITE_INTERNAL_H

#include "core/assert.h"
#include "slapo/rewrite.h"

#define SLAPO_RULE(id) extern const slapo_rewrite_rule slapo__rule_##id;
#include "rewrite/step_rules.def"
#undef SLAPO_RULE

/* Same dtype and shape. */
static inline bool slapo__same_meta(const slapo_node *a, const slapo_node *b) {
  return a->dtype == b->dtype && slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape);
}

/* Guard of the rules that fold a derived backward: the graph trains. */
static inline bool slapo__rule_training(const slapo_rewrite_env *env) { return env->training; }

#endif
