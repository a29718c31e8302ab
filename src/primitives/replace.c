/* primitives/replace.c - the `replace` primitive: swap a module for a
 * registered replacement built from it. Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help replace` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

/* Builds the replacement for node's module; node must not be the root. */
static slapo_status build(slapo_sched *node, const char *name, slapo_module **out) {
  *out = NULL;
  const char *path = slapo__prim_path(node);
  if (!slapo_sched_parent(node))
    return slapo_error(SLAPO_INVALID_ARG, "replace: cannot replace the root module; replace "
                                          "one of its children");
  SLAPO_TRY(slapo__prim_not_in_trace(node, "replace"));
  slapo_module_factory f = slapo_module_factory_find(name);
  if (!f) return slapo__prim_unregistered("replace", path, name);
  /* The log line is checked before anything is built or swapped. */
  slapo_sched_arg a = slapo_sched_arg_word(NULL, name);
  SLAPO_TRY(slapo__prim_log_check(node, "replace", 1, &a));
  slapo_status s = f(slapo_sched_module(node), out);
  if (s != SLAPO_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    return slapo_error(s, "replace: %s: %s", path, msg);
  }
  return SLAPO_OK;
}

slapo_status slapo__prim_swap(slapo_sched *node, slapo_module *mod) {
  slapo_module *parent = slapo_sched_module(slapo_sched_parent(node)), *old = NULL;
  char name[256];
  snprintf(name, sizeof name, "%s", slapo_sched_name(node));
  SLAPO_TRY(slapo_module_replace_child(parent, name, mod, &old));
  slapo_status s = slapo_sched_rebuild(node);
  if (s != SLAPO_OK) {
    /* Put the old module back so the failed primitive changes nothing. A
     * replace allocates nothing, so this cannot fail; a failed rebuild left
     * the node's subtree as it was, over the old module, so none is needed. */
    slapo_module *mine = NULL;
    SLAPO_ASSERT(slapo_module_replace_child(parent, name, old, &mine) == SLAPO_OK);
    slapo_module_free(mine);
    return s;
  }
  slapo_module_free(old);
  slapo_module_touch(parent);
  return SLAPO_OK;
}

static slapo_status replace_impl(slapo_sched *node, const char *name,
                                 const slapo_sched_entry *from) {
  slapo_module *mod;
  SLAPO_TRY(build(node, name, &mod));
  SLAPO_TRY(slapo__prim_swap(node, mod));
  slapo_sched_arg a = slapo_sched_arg_word(NULL, name);
  return slapo__prim_log(node, "replace", 1, &a, from, true);
}

slapo_status slapo_replace(slapo_sched *node, const char *name) {
  return replace_impl(node, name, NULL);
}

slapo_status slapo_replace_with(slapo_sched *node, slapo_module *mod) {
  if (!mod) return slapo_error(SLAPO_INVALID_ARG, "replace: module is NULL");
  if (!slapo_sched_parent(node)) {
    slapo_module_free(mod);
    return slapo_error(SLAPO_INVALID_ARG, "replace: cannot replace the root module; replace "
                                          "one of its children");
  }
  char type[128];
  snprintf(type, sizeof type, "%s", mod->type->name);
  slapo_sched_arg a = slapo_sched_arg_word(NULL, type);
  slapo_status s = slapo__prim_log_check(node, "replace", 1, &a);
  if (s != SLAPO_OK) {
    slapo_module_free(mod);
    return s;
  }
  SLAPO_TRY(slapo__prim_swap(node, mod));
  /* A C-only object cannot be rebuilt from a schedule file. */
  return slapo__prim_log(node, "replace", 1, &a, NULL, false);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"pattern", "horizontal", NULL},
                                         1));
  const slapo_sched_arg *a = slapo_sched_entry_positional(e, 0);
  if (!a || a->kind != SLAPO_SCHED_ARG_WORD)
    return slapo_error(SLAPO_INVALID_ARG,
                       "replace: expected a registered module name, e.g. 'replace FlashAttention'");
  const slapo_pattern *p;
  bool owned, horizontal = false;
  SLAPO_TRY(slapo_sched_entry_get_bool(e, "horizontal", false, &horizontal));
  SLAPO_TRY(slapo__prim_pattern(e, "replace", &p, &owned));
  if (!p) {
    if (horizontal)
      return slapo_error(SLAPO_INVALID_ARG, "replace: horizontal=true needs pattern=");
    return replace_impl(node, a->text, e);
  }
  slapo_status s = slapo__replace_subgraph(node, p, a->text, horizontal, e);
  if (owned) slapo_pattern_free((slapo_pattern *)p);
  return s;
}

SLAPO_PRIMITIVE_DESCRIPTOR(replace) = {
    .name = "replace",
    .summary = "swap a module for a registered replacement built from it",
    .doc = "replace <ModuleName> [pattern=P [horizontal=true]]\n"
           "  C: slapo_replace(node, \"FlashAttention\"); slapo_replace_with(node, module)\n"
           "  Applies to any module but the root; the replacement's factory decides which\n"
           "  types it can stand in for (FlashAttention: each model family's attention,\n"
           "  as `slapo models` lists them).\n"
           "  Effect: the parent's child table entry points at the new module and the\n"
           "  schedule subtree is rebuilt. Shared parameters keep their Hugging Face\n"
           "  paths, so checkpoints still load.\n"
           "  Fails: INVALID_ARG on the root; STATE when the module lies in an\n"
           "  ancestor's flattened trace (replace it before the trace line); NOT_FOUND\n"
           "  for an unregistered name; the factory's status for a module it cannot\n"
           "  replace.\n"
           "  With pattern=P (a registered pattern or a \"text pattern\") on a traced\n"
           "  module: every match becomes a call of a new child <Name>_<k> built by the\n"
           "  registered subgraph module Name (horizontal=true: one child for all\n"
           "  matches, which share their inputs). Several results (a pattern (p, q), or\n"
           "  the matches of a horizontal replacement) take a tuple from the child, one\n"
           "  value each, read back with getitem, or one value split back along the last\n"
           "  axis.\n"
           "  Verified: outputs and gradients within tolerance (dropout masks included).\n",
    .bitwise = false,
    .apply = apply,
};
