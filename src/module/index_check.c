/* module/index_check.c - token ids and targets checked before a step runs.
 * Kernels cannot fail (ops.h), so an id outside the vocabulary reads a
 * zero row in embedding and a target outside it is skipped by
 * cross_entropy: the step would return a plausible, wrong loss where
 * PyTorch raises "index out of range". So once a step's graph is built,
 * each integer input that reaches an embedding's ids or a cross-entropy's
 * targets (directly or through views such as reshape) gets the range its
 * values must lie in, and every step checks the bound tensors against it
 * (one pass over B*T integers). Layer: module. */
#include <stdio.h>

#include "module/internal.h"

/* The full vocabulary of an embedding's weight: a vocab-parallel shard
 * (an "offset" attribute) holds rows of a larger table; ids of other
 * ranks' rows are valid. */
static int64_t embedding_rows(slapo_module *root, const slapo_node *emb) {
  const slapo_node *w = emb->inputs[0];
  if (!slapo_node_attr(emb, "offset") || w->kind != SLAPO_NODE_PARAM) return w->shape[0];
  const slapo_parameter *p = slapo_module_param_at(root, w->target);
  return p && p->shard ? p->shard->full[0] : w->shape[0];
}

static void narrow(slapo__index_bound *b, int64_t hi, bool has_ignore, int64_t ignore,
                   const slapo_node *user) {
  if (b->node[0] && b->hi <= hi) return;
  b->hi = hi, b->has_ignore = has_ignore, b->ignore = ignore;
  snprintf(b->node, sizeof b->node, "%s", user->name);
}

/* Walks the users of x (through view ops) and narrows b by each embedding
 * or cross-entropy that reads x as its ids or targets. */
static void visit_users(slapo_module *root, const slapo_node *x, slapo__index_bound *b,
                        int depth) {
  for (int u = 0; u < x->n_users && depth < 16; u++) {
    const slapo_node *n = x->users[u];
    if (n->kind != SLAPO_NODE_CALL_OP || n->n_inputs < 1) continue;
    if (n->op == SLAPO_OP_DESC(embedding) && n->inputs[1] == x)
      narrow(b, embedding_rows(root, n), false, 0, n);
    else if (n->op == SLAPO_OP_DESC(cross_entropy) && n->inputs[1] == x)
      narrow(b, n->inputs[0]->shape[n->inputs[0]->ndim - 1], true,
             slapo_node_attr_int(n, "ignore_index", -100), n);
    else if (n->inputs[0] == x && (n->op->view || n->op == SLAPO_OP_DESC(reshape)))
      visit_users(root, n, b, depth + 1);
  }
}

void slapo__index_bounds(slapo_module *root, int n_in, slapo_node *const *ins,
                         slapo__index_bound *out) {
  for (int i = 0; i < n_in; i++) {
    out[i] = (slapo__index_bound){0};
    if (ins[i]->dtype == SLAPO_DTYPE_I32 || ins[i]->dtype == SLAPO_DTYPE_I64)
      visit_users(root, ins[i], &out[i], 0);
  }
}

static slapo_status check_values(const slapo__index_bound *b, int i, const slapo_tensor *t) {
  const void *data = slapo_tensor_data(t);
  bool i32 = t->dtype == SLAPO_DTYPE_I32;
  for (int64_t k = 0, n = slapo_tensor_numel(t); k < n; k++) {
    int64_t v = i32 ? ((const int32_t *)data)[k] : ((const int64_t *)data)[k];
    if ((v >= 0 && v < b->hi) || (b->has_ignore && v == b->ignore)) continue;
    return slapo_error(SLAPO_INVALID_ARG,
                       "step: input %d holds %lld at element %lld, outside [0, %lld), the "
                       "vocabulary of %s%s",
                       i, (long long)v, (long long)k, (long long)b->hi, b->node,
                       b->has_ignore ? " (its ignore_index marks a skipped target)" : "");
  }
  return SLAPO_OK;
}

slapo_status slapo__index_check(const slapo__index_bound *b, int i, const slapo_tensor *t) {
  if (!b->node[0] || !t->storage) return SLAPO_OK; /* binding reports a meta tensor */
  if (slapo_tensor_is_contiguous(t)) return check_values(b, i, t);
  slapo_tensor *c;
  SLAPO_TRY(slapo_tensor_contiguous(t, &c));
  slapo_status s = check_values(b, i, c);
  slapo_tensor_free(c);
  return s;
}
