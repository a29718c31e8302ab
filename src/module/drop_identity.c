/* module/drop_identity.c - a pass over a step's graph: `dropout` nodes that
 * are the identity in this step are removed and their users read the input
 * directly. A dropout is the identity when its p is 0 (the byte-level
 * configs and any model built with dropout 0) or when the step does not
 * train (eval mode), as the op's kernels define it. Layer: module.
 * Why: such a node copies its input into a fresh buffer, forward and (as its
 * own backward) again in the backward: 38 copies of up to [B, NH, T, T] per
 * step of GPT-2 `small`, ~3% of its step time, for no change in any value. */
#include "module/internal.h"
#include "slapo/ops.h"

slapo_status slapo__drop_identity_dropouts(slapo_graph *g, bool training, int *n_dropped) {
  int count = 0;
  for (slapo_node *n = slapo_graph_first(g); n;) {
    slapo_node *next = n->next;
    if (slapo_node_is_op(n, SLAPO_OP_DESC(dropout)) &&
        (!training || slapo_node_attr_float(n, "p", 0.0) == 0.0)) {
      SLAPO_TRY(slapo_node_replace_all_uses(n, n->inputs[0]));
      SLAPO_TRY(slapo_graph_erase(g, n));
      count++;
    }
    n = next;
  }
  if (n_dropped) *n_dropped = count;
  return SLAPO_OK;
}
