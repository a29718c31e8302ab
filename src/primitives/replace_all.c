/* primitives/replace_all.c - the `replace_all` primitive: replace every
 * module of one type below a node. Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help replace_all` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

static bool inside(const char *path, const char *outer) {
  size_t n = strlen(outer);
  return !strncmp(path, outer, n) && path[n] == '.';
}

static slapo_status replace_all_impl(slapo_sched *node, const char *type, const char *name,
                                     const slapo_sched_entry *from) {
  const char *where = slapo__prim_path(node);
  slapo_module_factory f = slapo_module_factory_find(name);
  if (!f) return slapo__prim_unregistered("replace_all", where, name);
  /* The log line is checked before anything is built or swapped. */
  slapo_sched_arg a[2] = {slapo_sched_arg_word(NULL, type), slapo_sched_arg_word(NULL, name)};
  SLAPO_TRY(slapo__prim_log_check(node, "replace_all", 2, a));
  /* Snapshot of matching nodes (outermost only), taken before any swap. */
  size_t cap = slapo_sched_count(node), n = 0;
  slapo_sched **match = slapo_calloc(cap + 1, sizeof *match);
  slapo_module **made = slapo_calloc(cap + 1, sizeof *made);
  slapo_status s = match && made ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "replace_all: out of memory");
  for (slapo_sched *x = node; s == SLAPO_OK && x; x = slapo_sched_next(x, node)) {
    if (strcmp(slapo_sched_module(x)->type->name, type)) continue;
    if (n && inside(slapo_sched_path(x), slapo_sched_path(match[n - 1]))) continue;
    if (!slapo_sched_parent(x)) {
      s = slapo_error(SLAPO_INVALID_ARG, "replace_all: the root is a %s; it cannot be replaced",
                      type);
      break;
    }
    s = slapo__prim_not_in_trace(x, "replace_all");
    if (s != SLAPO_OK) break;
    match[n++] = x;
  }
  if (s == SLAPO_OK && n == 0)
    s = slapo_error(SLAPO_NO_MATCH, "replace_all: no %s module below %s", type, where);
  for (size_t i = 0; s == SLAPO_OK && i < n; i++) {
    s = f(slapo_sched_module(match[i]), &made[i]);
    if (s != SLAPO_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", slapo_last_error());
      s = slapo_error(s, "replace_all: %s: %s", slapo__prim_path(match[i]), msg);
    }
  }
  if (s != SLAPO_OK) {
    for (size_t i = 0; made && i < n; i++) slapo_module_free(made[i]);
    slapo_free(match);
    slapo_free(made);
    return s;
  }
  /* Matches are disjoint subtrees in pre-order: swapping one rebuilds only
   * its own subtree, so the other handles stay valid. */
  for (size_t i = 0; i < n; i++) {
    s = slapo__prim_swap(match[i], made[i]);
    made[i] = NULL;
    /* NOMEM mid-way (the failed swap undoes itself): earlier swaps stay
     * and are not logged. */
    if (s != SLAPO_OK) break;
  }
  for (size_t i = 0; i < n; i++) slapo_module_free(made[i]);
  slapo_free(match);
  slapo_free(made);
  SLAPO_TRY(s);
  return slapo__prim_log(node, "replace_all", 2, a, from, true);
}

slapo_status slapo_replace_all(slapo_sched *node, const char *type_name, const char *name) {
  return replace_all_impl(node, type_name, name, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){NULL}, 2));
  const slapo_sched_arg *t = slapo_sched_entry_positional(e, 0);
  const slapo_sched_arg *m = slapo_sched_entry_positional(e, 1);
  if (!t || !m || t->kind != SLAPO_SCHED_ARG_WORD || m->kind != SLAPO_SCHED_ARG_WORD)
    return slapo_error(SLAPO_INVALID_ARG, "replace_all: expected a module type and a registered "
                                          "module name, e.g. 'replace_all GPT2Attention "
                                          "FlashAttention'");
  return replace_all_impl(node, t->text, m->text, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(replace_all) = {
    .name = "replace_all",
    .summary = "replace every module of a type below a node",
    .doc = "replace_all <TypeName> <ModuleName>\n"
           "  C: slapo_replace_all(node, \"GPT2Attention\", \"FlashAttention\")\n"
           "  Applies to every module of type TypeName below the node (the node\n"
           "  included), outermost matches only, from a snapshot taken first.\n"
           "  Effect: as replace for each; all replacements are built before any is\n"
           "  swapped in.\n"
           "  Fails: NO_MATCH when no module has that type; STATE when a match lies in\n"
           "  an ancestor's flattened trace (replace before the trace line); NOT_FOUND\n"
           "  for an unregistered name; the factory's status for a module it cannot\n"
           "  replace.\n"
           "  Verified: as replace.\n",
    .bitwise = false,
    .apply = apply,
};
