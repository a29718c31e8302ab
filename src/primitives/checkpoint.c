/* primitives/checkpoint.c - the `checkpoint` primitive: activation
 * checkpointing of a module, or of the first floor(ratio * n) children of a
 * module list (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
 * Cost"). Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help checkpoint` prints it). */
#include <math.h>
#include <stdio.h>

#include "primitives/internal.h"

static slapo_status checkpoint_impl(slapo_sched *node, double ratio, bool has_ratio,
                                    const slapo_sched_entry *from) {
  const char *path = slapo__prim_path(node);
  slapo_module *m = slapo_sched_module(node);
  SLAPO_TRY(slapo__prim_not_inlined(node, "checkpoint"));
  if (!has_ratio) {
    if (!slapo_sched_parent(node))
      return slapo_error(SLAPO_INVALID_ARG, "checkpoint: cannot checkpoint the root module; "
                                            "checkpoint its children");
    if (m->checkpoint)
      return slapo_error(SLAPO_STATE, "checkpoint: %s is already checkpointed", path);
    m->checkpoint = true;
    slapo_module_touch(m);
    slapo_status s = slapo__prim_log(node, "checkpoint", 0, NULL, from, true);
    if (s != SLAPO_OK) m->checkpoint = false;
    return s;
  }
  if (!(ratio > 0 && ratio <= 1))
    return slapo_error(SLAPO_INVALID_ARG, "checkpoint: %s: ratio=%g is not in (0, 1]", path,
                       ratio);
  int n = m->n_children;
  int k = (int)floor(ratio * n + 1e-9);
  if (n == 0)
    return slapo_error(SLAPO_INVALID_ARG, "checkpoint: %s (a %s) has no children for ratio=%g; "
                                          "drop the ratio to checkpoint the module itself",
                       path, m->type->name, ratio);
  if (k == 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "checkpoint: %s: ratio=%g of %d children selects none (floor(%g x %d) = 0)",
                       path, ratio, n, ratio, n);
  for (int i = 0; i < k; i++)
    if (m->children[i]->checkpoint)
      return slapo_error(SLAPO_STATE, "checkpoint: %s.%s is already checkpointed", path,
                         m->children[i]->name);
  for (int i = 0; i < k; i++) m->children[i]->checkpoint = true;
  slapo_module_touch(m);
  slapo_sched_arg a = slapo_sched_arg_float("ratio", ratio);
  slapo_status s = slapo__prim_log(node, "checkpoint", 1, &a, from, true);
  if (s != SLAPO_OK)
    for (int i = 0; i < k; i++) m->children[i]->checkpoint = false;
  return s;
}

slapo_status slapo_checkpoint(slapo_sched *node, double ratio) {
  return checkpoint_impl(node, ratio, ratio > 0, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"ratio", "pattern", NULL}, 0));
  double ratio = 0;
  bool has = slapo_sched_entry_find(e, "ratio") != NULL;
  const slapo_pattern *p;
  bool owned;
  SLAPO_TRY(slapo__prim_pattern(e, "checkpoint", &p, &owned));
  if (p && has) {
    if (owned) slapo_pattern_free((slapo_pattern *)p);
    return slapo_error(SLAPO_INVALID_ARG, "checkpoint: give ratio= or pattern=, not both");
  }
  if (p) {
    slapo_status s = slapo__checkpoint_subgraph(node, p, e);
    if (owned) slapo_pattern_free((slapo_pattern *)p);
    return s;
  }
  if (has) SLAPO_TRY(slapo_sched_entry_get_float(e, "ratio", true, &ratio));
  return checkpoint_impl(node, ratio, has, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(checkpoint) = {
    .name = "checkpoint",
    .summary = "recompute a module's activations in the backward instead of keeping them",
    .doc = "checkpoint [ratio=r | pattern=P]\n"
           "  C: slapo_checkpoint(node, 0) (the module); slapo_checkpoint(list, 0.5)\n"
           "  Applies to any module but the root; with ratio=r to a module with\n"
           "  children (a list such as transformer.h), checkpointing its first\n"
           "  floor(r * n) children.\n"
           "  Effect: intermediates of the region die during the forward; autograd\n"
           "  re-emits the region just before its backward (one extra forward of it).\n"
           "  Fails: INVALID_ARG for the root, a ratio outside (0, 1], a ratio on a\n"
           "  module without children or one selecting none; STATE if already\n"
           "  checkpointed.\n"
           "  With pattern=P on a traced module: each match is recomputed on its own.\n"
           "  Verified: bitwise equal loss, outputs and gradients.\n",
    .bitwise = true,
    .apply = apply,
};
