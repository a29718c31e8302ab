/* ops/cost.c - what a node costs from its shapes alone: its op's FLOPs
 * (slapo_op.flops) and the bytes it moves. Deterministic, so every rank
 * balancing pipeline stages from it cuts alike. Layer: ops. */
#include "ops/internal.h"

/* Elements of a node's value (a tuple-valued node: 0, its getitems count). */
static double numel(const slapo_node *n) {
  return n->n_results > 0 ? 0 : (double)slapo_shape_numel(n->ndim, n->shape);
}

double slapo_node_flops(const slapo_node *node) {
  return node->kind == SLAPO_NODE_CALL_OP && node->op && node->op->flops ? node->op->flops(node)
                                                                         : 0;
}

double slapo_node_bytes(const slapo_node *node) {
  /* A view moves nothing; what is not an op (placeholders, parameters,
   * getitems of a tuple) is counted where it is read. */
  if (node->kind != SLAPO_NODE_CALL_OP || !node->op || node->op->view) return 0;
  double b = numel(node) * (double)slapo_dtype_size(node->dtype);
  for (int i = 0; i < node->n_inputs; i++)
    b += numel(node->inputs[i]) * (double)slapo_dtype_size(node->inputs[i]->dtype);
  return b;
}

double slapo__flops_contract_last(const slapo_node *node) {
  /* out = sum over K of in0[..., K] x ...: 2 K per output element */
  const slapo_node *x = node->inputs[0];
  return 2.0 * numel(node) * (double)x->shape[x->ndim - 1];
}
