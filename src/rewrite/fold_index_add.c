/* rewrite/fold_index_add.c - a rule for a step's joint graph (the backward
 * derived): `add(index_add(full(0), idx, src), g)` (either
 * operand order) becomes `index_add(g, idx, src)`: the rows are added into
 * the other gradient instead of into a buffer of zeros that is then added.
 * Layer: rewrite.
 * Why: an embedding's weight gradient is index_add into zeros, and GPT-2's
 * wte is also lm_head's weight, whose gradient is summed with it: for the
 * [50257, 768] table that was a 154 MB fill, a copy of it inside index_add
 * and a full add (three passes over 154 MB; ~22 ms of a 124M step here).
 * Not bitwise: each touched row becomes g + s1 + s2 ... instead of
 * (0 + s1 + s2 ...) + g, float sums in another order (deterministic, and
 * within the GPT-2 fixture's tolerances). */
#include "rewrite/internal.h"

/* index_add(full(0), idx, src) used only by `add`, of add's shape. */
static bool is_scatter_into_zeros(const slapo_node *n, const slapo_node *add) {
  if (!slapo_node_is_op(n, SLAPO_OP_DESC(index_add)) || n->n_users != 1 || !slapo__same_meta(n, add))
    return false;
  const slapo_node *base = n->inputs[0];
  return slapo_node_is_op(base, SLAPO_OP_DESC(full)) && base->n_users == 1 &&
         slapo_node_attr_float(base, "value", 1.0) == 0.0;
}

/* add(a, b) with a or b a scatter into zeros (k: which). */
static bool match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  (void)env;
  if (n->inputs[0] == n->inputs[1] || !slapo__same_meta(n->inputs[0], n) ||
      !slapo__same_meta(n->inputs[1], n))
    return false;
  m->node[0] = n;
  m->k = is_scatter_into_zeros(n->inputs[0], n) ? 0 : is_scatter_into_zeros(n->inputs[1], n) ? 1 : -1;
  return m->k >= 0;
}

static slapo_status rewrite(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **resume) {
  slapo_node *n = m->node[0];
  slapo_node *scatter = n->inputs[m->k], *other = n->inputs[1 - m->k], *zeros = scatter->inputs[0];
  /* index_add(other, idx, src) replaces the add in place: it comes after
   * every input (other and the add's operands precede the add). */
  slapo_node *ins[3] = {other, scatter->inputs[1], scatter->inputs[2]}, *folded;
  SLAPO_TRY(slapo_rewrite_emit_before(g, n, scatter->op, 3, ins, scatter->n_attrs, scatter->attrs,
                                      scatter, &folded));
  SLAPO_TRY(slapo_node_replace_all_uses(n, folded));
  SLAPO_TRY(slapo_graph_erase(g, n));
  SLAPO_TRY(slapo_graph_erase(g, scatter));
  SLAPO_TRY(slapo_graph_erase(g, zeros));
  *resume = folded;
  return SLAPO_OK;
}

const slapo_rewrite_rule slapo__rule_fold_index_add = {
    .name = "fold_index_add",
    .summary = "add(index_add(full(0), idx, src), g) -> index_add(g, idx, src)",
    .anchor = SLAPO_OP_DESC(add),
    .guard = slapo__rule_training,
    .match = match,
    .rewrite = rewrite,
};
