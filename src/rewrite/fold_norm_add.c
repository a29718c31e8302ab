/* rewrite/fold_norm_add.c - a rule for a step's joint graph (the backward
 * derived): `add(dx, r)` (either operand order), where dx is
 * the input gradient of a layer_norm_backward or rms_norm_backward used by
 * that add alone (the node itself, or its offset-0 unpack when it also
 * packs dw and db) and r is computed before it, becomes that backward op
 * with residual = 1 and r as a last input: the kernel adds r's row as it
 * writes dx's (ops/norm.h).
 * Layer: rewrite.
 * Why: in a pre-norm transformer block (GPT-2, LLaMA) the input of each
 * norm is also the residual stream, so its gradient is the norm's dx plus
 * the gradient that came down the stream: an `add` reading two [B, T, C]
 * tensors and writing a third, two per block. Folded, the norm's backward
 * reads r in the loop that writes dx (GPT-2 `small`: 12 adds, ~1 ms of
 * memory traffic a step).
 * Bitwise: the kernel rounds dx to float, then adds r's float, the add's
 * own operation (float addition commutes, so the operand order is moot). */
#include <string.h>

#include "rewrite/internal.h"

/* Room for layer_norm_backward's inputs (at most 3 before r) and attributes. */
enum { MAX_IN = 8, MAX_ATTRS = 8 };

/* The norm backward whose dx is n, with n used by one node only (the add),
 * and not folded yet; else NULL. */
static slapo_node *norm_backward_of(slapo_node *n) {
  if (n->n_users != 1) return NULL;
  slapo_node *p = n;
  if (slapo_node_is_op(n, SLAPO_OP_DESC(unpack))) {
    if (slapo_node_attr_int(n, "offset", -1) != 0) return NULL;
    p = n->inputs[0];
    if (!slapo_node_attr_int(p, "params", 0)) return NULL;
  } else if (slapo_node_attr_int(p, "params", 0)) {
    return NULL; /* the packed buffer itself is not dx */
  }
  if ((!slapo_node_is_op(p, SLAPO_OP_DESC(layer_norm_backward)) &&
       !slapo_node_is_op(p, SLAPO_OP_DESC(rms_norm_backward))) ||
      slapo_node_attr_int(p, "residual", 0))
    return NULL;
  return p;
}

/* Whether a comes before b in the graph's order. */
static bool before(const slapo_node *a, const slapo_node *b) {
  for (const slapo_node *q = a->next; q; q = q->next)
    if (q == b) return true;
  return false;
}

/* add(dx, r) or add(r, dx) (k: dx's operand) with p the norm backward of
 * dx, computed after r, with room for one more input and attribute. */
static bool match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  (void)env;
  if (n->inputs[0] == n->inputs[1] || !slapo__same_meta(n->inputs[0], n) ||
      !slapo__same_meta(n->inputs[1], n) || n->dtype != SLAPO_DTYPE_F32)
    return false;
  slapo_node *p = NULL;
  for (int i = 0; i < 2 && !p; i++)
    if ((p = norm_backward_of(n->inputs[i])) && before(n->inputs[1 - i], p)) m->k = i;
    else p = NULL;
  if (!p || p->n_inputs + 1 > MAX_IN || p->n_attrs + 1 > MAX_ATTRS) return false;
  m->node[0] = n, m->node[1] = p;
  return true;
}

/* p's op again, before p, with r as a last input and residual = 1; p's
 * users, and the add's, then read it (or its dx unpack), and p and the add
 * are erased. The folded node takes p's place, where r is computed. */
static slapo_status rewrite(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **resume) {
  slapo_node *n = m->node[0], *p = m->node[1];
  slapo_node *dx = n->inputs[m->k], *r = n->inputs[1 - m->k], *folded;
  slapo_node *ins[MAX_IN];
  slapo_attr attrs[MAX_ATTRS];
  memcpy(ins, p->inputs, (size_t)p->n_inputs * sizeof *ins);
  ins[p->n_inputs] = r;
  memcpy(attrs, p->attrs, (size_t)p->n_attrs * sizeof *attrs);
  attrs[p->n_attrs] = slapo_attr_int("residual", 1);
  SLAPO_TRY(slapo_rewrite_emit_before(g, p, p->op, p->n_inputs + 1, ins, p->n_attrs + 1, attrs, p,
                                      &folded));
  SLAPO_TRY(slapo_node_replace_all_uses(p, folded));
  SLAPO_TRY(slapo_graph_erase(g, p));
  slapo_node *dx_now = dx == p ? folded : dx; /* an unpack now reads folded */
  SLAPO_TRY(slapo_node_replace_all_uses(n, dx_now));
  SLAPO_TRY(slapo_graph_erase(g, n));
  *resume = folded;
  return SLAPO_OK;
}

const slapo_rewrite_rule slapo__rule_fold_norm_add = {
    .name = "fold_norm_add",
    .summary = "add(norm_backward's dx, r) -> the norm backward with residual r",
    .anchor = SLAPO_OP_DESC(add),
    .guard = slapo__rule_training,
    .match = match,
    .rewrite = rewrite,
};
