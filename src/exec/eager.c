/* exec/eager.c - slapo_eager: run one op at once on concrete tensors (tests
 * and small tools) by building a one-op graph over placeholders "in0".."inN",
 * planning, binding and running it, and returning a contiguous copy of the
 * result. Slow by design (a graph and a plan per call). Layer: exec. */
#include <stdio.h>

#include "exec/internal.h"

slapo_status slapo_eager(const char *op, int n_in, const slapo_tensor *const *in, int n_attrs,
                         const slapo_attr *attrs, const slapo_kernel_env *env,
                         const slapo_plan_opts *opts, slapo_tensor **out) {
  if (!out) return slapo_error(SLAPO_INVALID_ARG, "eager: out is NULL");
  *out = NULL;
  if (!op) return slapo_error(SLAPO_INVALID_ARG, "eager: op name is NULL");
  if (n_in < 0 || (n_in > 0 && !in))
    return slapo_error(SLAPO_INVALID_ARG, "eager %s: bad input list (n_in %d)", op, n_in);
  for (int i = 0; i < n_in; i++)
    if (!in[i] || !in[i]->storage)
      return slapo_error(SLAPO_INVALID_ARG, "eager %s: input %d is %s", op, i,
                         in[i] ? "a meta tensor (no storage)" : "NULL");

  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo_plan *plan = NULL;
  slapo_node **nodes = NULL;
  slapo_status s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  if (s == SLAPO_OK) {
    nodes = slapo_calloc((size_t)n_in + 1, sizeof *nodes);
    if (!nodes) s = slapo_error(SLAPO_NOMEM, "eager %s: out of memory", op);
  }
  if (s == SLAPO_OK) {
    char name[32];
    for (int i = 0; i < n_in; i++) {
      snprintf(name, sizeof name, "in%d", i);
      nodes[i] = slapo_input(ctx, name, in[i]->dtype, in[i]->ndim, in[i]->shape);
    }
    slapo_node *y = slapo_op_call(ctx, op, n_in, nodes, n_attrs, attrs);
    slapo_output(ctx, 1, &y);
    s = slapo_ctx_status(ctx);
    /* The ctx message names the op and the shapes; keep it as the thread's
     * error (freeing below does not touch it, but be explicit). */
    if (s != SLAPO_OK) slapo_error(s, "%s", slapo_ctx_message(ctx));
  }
  if (s == SLAPO_OK) s = slapo_plan_new(g, opts, &plan);
  if (s == SLAPO_OK) {
    char name[32];
    for (int i = 0; i < n_in && s == SLAPO_OK; i++) {
      snprintf(name, sizeof name, "in%d", i);
      s = slapo_plan_bind_input(plan, name, in[i]);
    }
  }
  if (s == SLAPO_OK) s = slapo_plan_run(plan, env);
  if (s == SLAPO_OK) s = slapo_tensor_contiguous(slapo_plan_output(plan, 0), out);
  slapo_plan_free(plan);
  slapo_free(nodes);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}
