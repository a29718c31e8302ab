/* primitives/decompose.c - the `decompose` primitive: a Linear becomes a
 * matmul followed by a separate bias add, so that a flattened trace of its
 * parent exposes the add to fusion with what follows (bias + GELU).
 * Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help decompose` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

/* x [.., in] -> x W^T [.., out] + b */
static slapo_node *dl_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: DecomposedLinear expects 1 input, got %d",
                   slapo_ctx_origin(ctx), n_in);
    return NULL;
  }
  slapo_node *y = slapo_matmul(ctx, in[0], slapo_weight(ctx, self, "weight"), false, true);
  return slapo_add(ctx, y, slapo_weight(ctx, self, "bias"));
}

static void dl_describe(const slapo_module *self, char *buf, size_t cap) {
  const slapo_parameter *w = slapo_module_param(self, "weight");
  snprintf(buf, cap, "in_features=%lld, out_features=%lld, bias=True",
           (long long)w->value->shape[1], (long long)w->value->shape[0]);
}

static const slapo_module_type k_decomposed = {"DecomposedLinear", dl_forward, dl_describe, NULL,
                                               NULL};

static slapo_status decompose_impl(slapo_sched *node, const slapo_sched_entry *from) {
  slapo_module *m = slapo_sched_module(node);
  const char *path = slapo__prim_path(node);
  if (!slapo_sched_parent(node))
    return slapo_error(SLAPO_INVALID_ARG, "decompose: the root is not a Linear");
  if (strcmp(m->type->name, "Linear"))
    return slapo_error(SLAPO_INVALID_ARG, "decompose: %s is a %s; decompose takes a Linear",
                       path, m->type->name);
  if (!slapo_module_param(m, "bias"))
    return slapo_error(SLAPO_PRECOND, "decompose: %s has no bias: there is nothing to split "
                       "off the matmul", path);
  const slapo_parameter *w = slapo_module_param(m, "weight");
  if (w && w->shard)
    return slapo_error(SLAPO_STATE, "decompose: %s is sharded already (axis %d): decompose "
                       "before shard, since the order matters", path, w->shard->axis);
  SLAPO_TRY(slapo__prim_not_in_trace(node, "decompose"));
  SLAPO_TRY(slapo__prim_log_check(node, "decompose", 0, NULL));
  slapo_module *d;
  SLAPO_TRY(slapo_module_new(&k_decomposed, NULL, &d));
  slapo_status s = slapo_module_tie_param(d, "weight", slapo_module_param(m, "weight"));
  if (s == SLAPO_OK) s = slapo_module_tie_param(d, "bias", slapo_module_param(m, "bias"));
  if (s != SLAPO_OK) {
    slapo_module_free(d);
    return s;
  }
  SLAPO_TRY(slapo__prim_swap(node, d));
  return slapo__prim_log(node, "decompose", 0, NULL, from, true);
}

slapo_status slapo_decompose(slapo_sched *node) { return decompose_impl(node, NULL); }

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){NULL}, 0));
  return decompose_impl(node, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(decompose) = {
    .name = "decompose",
    .summary = "split a Linear into matmul + bias add (so the add can fuse with what follows)",
    .doc = "decompose\n"
           "  C: slapo_decompose(node)\n"
           "  Applies to a Linear with a bias; decompose before tracing its parent with\n"
           "  flatten=true.\n"
           "  Effect: the module becomes DecomposedLinear (same parameters, same Hugging\n"
           "  Face paths): y = x W^T, then y + b.\n"
           "  Fails: INVALID_ARG for a module that is not a Linear; PRECOND without a bias;\n"
           "  STATE when the Linear lies in an ancestor's flattened trace (its graph\n"
           "  keeps the Linear as it was: decompose before the trace line).\n"
           "  Verified: outputs and gradients within tolerance.\n",
    .bitwise = false,
    .apply = apply,
};
