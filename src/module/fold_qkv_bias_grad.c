/* module/fold_qkv_bias_grad.c - a pass over a step's joint graph, run after
 * the backward is derived: `sum(d, axes=[0, 1])` of a
 * flash_attention_qkv_backward's d(qkv) [B, T, W] (the bias gradient of the
 * fused projection that wrote qkv, GPT-2's c_attn) becomes the same
 * backward op with bias_grad = 1: each job sums the columns it has just
 * written, while they are in cache, and d(qkv) and the sum are read back
 * through two unpack views.
 * Layer: module.
 * Why: the sum read all of d(qkv) again, [B T, 3 C] from memory with
 * rows a page apart (GPT-2 `small`: 4.7 MB a layer, ~0.8 ms a step).
 * Not bitwise: each batch row's sums over T are added in order, where the
 * sum added all B T rows in order (float results agree to rounding;
 * deterministic at any thread count). */
#include "module/internal.h"
#include "slapo/ops.h"

/* Room for the backward's inputs (3 or 4) and attributes (at most 10). */
enum { MAX_ATTRS = 16 };

/* A flash_attention_qkv_backward without bias_grad (and with room for it
 * among its attributes), summed by n over its leading two axes into [W];
 * else NULL. */
static slapo_node *qkv_backward_summed(const slapo_node *n) {
  if (!slapo_node_is_op(n, SLAPO_OP_DESC(sum)) || n->n_inputs != 1) return NULL;
  slapo_node *d = n->inputs[0];
  if (!slapo_node_is_op(d, SLAPO_OP_DESC(flash_attention_qkv_backward)) || d->ndim != 3 ||
      d->n_attrs + 1 > MAX_ATTRS || slapo_node_attr_int(d, "bias_grad", 0) ||
      slapo_node_attr_int(n, "keepdim", 0))
    return NULL;
  const slapo_attr *a = slapo_node_attr(n, "axes");
  if (!a || a->kind != SLAPO_ATTR_INTS || a->n != 2) return NULL;
  bool lead[2] = {false, false}; /* axes 0 and 1 of 3, either order, either sign */
  for (int i = 0; i < 2; i++) {
    int64_t ax = a->ints[i] < 0 ? a->ints[i] + 3 : a->ints[i];
    if (ax == 0 || ax == 1) lead[ax] = true;
  }
  return lead[0] && lead[1] && n->ndim == 1 && n->shape[0] == d->shape[2] ? d : NULL;
}

/* d's op again before d with bias_grad = 1, d(qkv) and the sum as unpack
 * views of it; d's users and sum's read those; d and sum are erased. */
static slapo_status refold(slapo_graph *g, slapo_node *d, slapo_node *sum) {
  slapo_attr attrs[MAX_ATTRS];
  for (int i = 0; i < d->n_attrs; i++) attrs[i] = d->attrs[i];
  attrs[d->n_attrs] = slapo_attr_int("bias_grad", 1);
  slapo_node *pk, *dqkv, *db;
  SLAPO_TRY(slapo__emit_before(g, d, d->op, d->n_inputs, d->inputs, d->n_attrs + 1, attrs, d, &pk));
  int64_t n = d->shape[0] * d->shape[1] * d->shape[2];
  slapo_attr u0[2] = {slapo_attr_int("offset", 0), slapo_attr_ints("shape", 3, d->shape)};
  slapo_attr u1[2] = {slapo_attr_int("offset", n), slapo_attr_ints("shape", 1, sum->shape)};
  SLAPO_TRY(slapo__emit_before(g, d, SLAPO_OP_DESC(unpack), 1, &pk, 2, u0, d, &dqkv));
  SLAPO_TRY(slapo__emit_before(g, d, SLAPO_OP_DESC(unpack), 1, &pk, 2, u1, sum, &db));
  SLAPO_TRY(slapo_node_replace_all_uses(sum, db));
  SLAPO_TRY(slapo_graph_erase(g, sum));
  SLAPO_TRY(slapo_node_replace_all_uses(d, dqkv));
  return slapo_graph_erase(g, d);
}

slapo_status slapo__fold_qkv_bias_grad(slapo_graph *g, int *n_folded) {
  int count = 0;
  for (slapo_node *n = slapo_graph_first(g); n;) {
    slapo_node *next = n->next, *d = qkv_backward_summed(n);
    if (d) {
      SLAPO_TRY(refold(g, d, n));
      count++;
    }
    n = next;
  }
  if (n_folded) *n_folded = count;
  return SLAPO_OK;
}
