/* module/fold_norm_add.c - a pass over a step's joint graph, run after the
 * backward is derived: `add(dx, r)` (either operand order), where dx is
 * the input gradient of a layer_norm_backward or rms_norm_backward used by
 * that add alone (the node itself, or its offset-0 unpack when it also
 * packs dw and db) and r is computed before it, becomes that backward op
 * with residual = 1 and r as a last input: the kernel adds r's row as it
 * writes dx's (ops/norm.h).
 * Layer: module.
 * Why: in a pre-norm transformer block (GPT-2, LLaMA) the input of each
 * norm is also the residual stream, so its gradient is the norm's dx plus
 * the gradient that came down the stream: an `add` reading two [B, T, C]
 * tensors and writing a third, two per block. Folded, the norm's backward
 * reads r in the loop that writes dx (GPT-2 `small`: 12 adds, ~1 ms of
 * memory traffic a step).
 * Bitwise: the kernel rounds dx to float, then adds r's float, the add's
 * own operation (float addition commutes, so the operand order is moot). */
#include <string.h>

#include "module/internal.h"
#include "slapo/ops.h"

/* Room for layer_norm_backward's inputs (at most 3 before r) and attributes. */
enum { MAX_IN = 8, MAX_ATTRS = 8 };

static bool same_meta(const slapo_node *a, const slapo_node *b) {
  return a->dtype == b->dtype && slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape);
}

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

/* p's op again, before p, with r as a last input and residual = 1; p's
 * users then read it, and p is erased. *out stays NULL (nothing done) when
 * p has more inputs or attributes than this pass has room for. */
static slapo_status refold(slapo_graph *g, slapo_node *p, slapo_node *r, slapo_node **out) {
  slapo_node *ins[MAX_IN];
  slapo_attr attrs[MAX_ATTRS];
  if (p->n_inputs + 1 > MAX_IN || p->n_attrs + 1 > MAX_ATTRS) return SLAPO_OK;
  memcpy(ins, p->inputs, (size_t)p->n_inputs * sizeof *ins);
  ins[p->n_inputs] = r;
  memcpy(attrs, p->attrs, (size_t)p->n_attrs * sizeof *attrs);
  attrs[p->n_attrs] = slapo_attr_int("residual", 1);
  SLAPO_TRY(slapo__emit_before(g, p, p->op, p->n_inputs + 1, ins, p->n_attrs + 1, attrs, p, out));
  SLAPO_TRY(slapo_node_replace_all_uses(p, *out));
  return slapo_graph_erase(g, p);
}

slapo_status slapo__fold_norm_add(slapo_graph *g, int *n_folded) {
  int count = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (!slapo_node_is_op(n, SLAPO_OP_DESC(add)) || n->inputs[0] == n->inputs[1] ||
        !same_meta(n->inputs[0], n) || !same_meta(n->inputs[1], n) ||
        n->dtype != SLAPO_DTYPE_F32)
      continue;
    int k = -1;
    slapo_node *p = NULL;
    for (int i = 0; i < 2 && !p; i++)
      if ((p = norm_backward_of(n->inputs[i])) && before(n->inputs[1 - i], p)) k = i;
      else p = NULL;
    if (k < 0) continue;
    /* The folded node takes p's place, so r must already be computed there. */
    slapo_node *dx = n->inputs[k], *r = n->inputs[1 - k], *folded = NULL;
    SLAPO_TRY(refold(g, p, r, &folded));
    if (!folded) continue;
    slapo_node *dx_now = dx == p ? folded : dx; /* an unpack now reads folded */
    SLAPO_TRY(slapo_node_replace_all_uses(n, dx_now));
    slapo_node *prev = n->prev;
    SLAPO_TRY(slapo_graph_erase(g, n));
    n = prev;
    count++;
  }
  if (n_folded) *n_folded = count;
  return SLAPO_OK;
}
