/* ops/tuple.c - several values returned together: slapo_tuple builds a
 * tuple node of a forward's values, slapo_getitem reads one back, and the
 * message every builder gives a caller that uses a tuple as one value.
 *
 * A tuple exists only while a graph is built: getitem of a tuple node is
 * its input itself (no node), so the ops, the autograd and the executor
 * never meet one, and a value nobody reads is a dead node that the step's
 * pruning and a trace's DCE remove, gradient work included (PyTorch's
 * tuple outputs, whose unused items get no gradient). Layer: ops. */
#include <stdio.h>

#include "ops/internal.h"

/* "returned by PATH" for the module a tuple came from. */
static const char *from(const slapo_node *t, char *buf, size_t cap) {
  const char *o = t->origin && t->origin[0] ? t->origin : ".";
  snprintf(buf, cap, "returned by %s", o);
  return buf;
}

slapo_status slapo__tuple_misuse(const slapo_node *t, const char *user, int slot) {
  char by[512];
  return slapo_error(SLAPO_INVALID_ARG,
                     "%s: input %d (%%%s) is a tuple of %d values (%s), not one value; take "
                     "one with slapo_getitem(ctx, value, i)",
                     user, slot, t->name, t->n_results, from(t, by, sizeof by));
}

slapo_node *slapo_tuple(slapo_ctx *ctx, int n, slapo_node *const *values) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  for (int i = 0; i < n && values; i++)
    if (!values[i]) {
      slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: tuple: value %d is NULL",
                     slapo_ctx_origin(ctx)[0] ? slapo_ctx_origin(ctx) : ".", i);
      return NULL;
    }
  slapo_node *t;
  slapo_status s = slapo_graph_add_tuple(slapo_ctx_graph(ctx), n, values, &t);
  if (s == SLAPO_OK) s = slapo_node_set_origin(t, slapo_ctx_origin(ctx), 0);
  if (s != SLAPO_OK) {
    slapo_ctx_fail(ctx, s, "%s: %s", slapo_ctx_origin(ctx)[0] ? slapo_ctx_origin(ctx) : ".",
                   slapo_last_error());
    return NULL;
  }
  t->recompute = slapo_ctx_region(ctx);
  return t;
}

slapo_node *slapo_getitem(slapo_ctx *ctx, slapo_node *t, int i) {
  if (slapo_ctx_status(ctx) != SLAPO_OK || !t) return NULL;
  const char *where = slapo_ctx_origin(ctx)[0] ? slapo_ctx_origin(ctx) : ".";
  char by[512];
  if (t->kind != SLAPO_NODE_TUPLE) {
    const char *o = t->origin && t->origin[0] ? t->origin : ".";
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                   "%s: getitem(%%%s, %d): %%%s (%s from %s) is one value, not a tuple; use "
                   "it as it is", where, t->name, i, t->name, t->target, o);
    return NULL;
  }
  if (i < 0 || i >= t->n_inputs) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: getitem(%%%s, %d): the tuple holds %d values "
                   "(%s); items are 0..%d", where, t->name, i, t->n_inputs,
                   from(t, by, sizeof by), t->n_inputs - 1);
    return NULL;
  }
  return t->inputs[i];
}
