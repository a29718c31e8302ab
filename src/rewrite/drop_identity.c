/* rewrite/drop_identity.c - the rule that removes a `dropout` node that is
 * the identity in this step, its users reading its input directly. A
 * dropout is the identity when its p is 0 (the byte-level configs and any
 * model built with dropout 0) or when the step does not train (eval mode),
 * as the op's kernels define it. Layer: rewrite.
 * Why: such a node copies its input into a fresh buffer, forward and (as its
 * own backward) again in the backward: 38 copies of up to [B, NH, T, T] per
 * step of GPT-2 `small`, ~3% of its step time, for no change in any value. */
#include "rewrite/internal.h"

static bool match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  m->node[0] = n;
  return !env->training || slapo_node_attr_float(n, "p", 0.0) == 0.0;
}

static slapo_status rewrite(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **resume) {
  slapo_node *n = m->node[0];
  *resume = n->prev;
  SLAPO_TRY(slapo_node_replace_all_uses(n, n->inputs[0]));
  return slapo_graph_erase(g, n);
}

const slapo_rewrite_rule slapo__rule_drop_identity = {
    .name = "drop_identity",
    .summary = "dropout(x) -> x where the step does not train or p = 0",
    .anchor = SLAPO_OP_DESC(dropout),
    .match = match,
    .rewrite = rewrite,
};
