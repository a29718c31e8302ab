/* primitives/cut.c - the `cut` primitive: a pipeline stage ends after a
 * module (pipeline parallelism, docs/distributed.md). The original
 * system's name, `cut_pipeline_stage`, is the same primitive, so ported
 * schedules read; both log as `cut`. Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help cut` prints it). The stages
 * themselves are made where a step is built (module/pipeline.c), which
 * checks what only the traced forward shows. */
#include "primitives/internal.h"

static slapo_status cut_impl(slapo_sched *node, const slapo_sched_entry *from) {
  const char *path = slapo__prim_path(node);
  slapo_module *m = slapo_sched_module(node);
  if (!slapo_sched_parent(node))
    return slapo_error(SLAPO_INVALID_ARG, "cut: the root module cannot end a pipeline stage: "
                                          "the last stage ends with it; cut after one of its "
                                          "descendants (transformer.h.5)");
  if (m->pp_cut)
    return slapo_error(SLAPO_STATE, "cut: a pipeline stage already ends after %s", path);
  m->pp_cut = true;
  slapo_module_touch(m);
  slapo_status s = slapo__prim_log(node, "cut", 0, NULL, from, true);
  if (s != SLAPO_OK) m->pp_cut = false;
  return s;
}

slapo_status slapo_cut(slapo_sched *node) { return cut_impl(node, NULL); }

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){NULL}, 0));
  return cut_impl(node, e);
}

#define CUT_DOC                                                                   \
  "cut\n"                                                                         \
  "  C: slapo_cut(node). Also spelled cut_pipeline_stage (the original\n"        \
  "  system's name); both log as cut.\n"                                         \
  "  Ends a pipeline stage after the module: with k cut lines the model runs\n"  \
  "  as k + 1 stages (mpirun -np N train --pp k+1). Globs cut several\n"          \
  "  modules: transformer.h.{3,7} cut. The stages split the step's forward\n"    \
  "  where each cut module's last node is; every value an earlier stage\n"       \
  "  computed and a later one reads crosses each boundary between them.\n"       \
  "  Fails: INVALID_ARG for the root; STATE if a stage already ends there.\n"   \
  "  Building the stages fails (naming the module) when a cut module emits\n"   \
  "  no node of its own (fused away or never called), is called more than\n"   \
  "  once or with other modules' nodes among its own, or leaves nothing for\n"  \
  "  the stage after it.\n"                                                      \
  "  One process ignores cut lines. Without any, --pp K balances K stages by\n"   \
  "  each block's cost and prints the cut lines it chose. Verified: slapo\n"      \
  "  verify --pp K compares the stages with one process (bitwise but the tied\n" \
  "  embedding's gradient).\n"

SLAPO_PRIMITIVE_DESCRIPTOR(cut) = {
    .name = "cut",
    .summary = "end a pipeline stage after a module",
    .doc = CUT_DOC,
    .bitwise = true,
    .apply = apply,
};

SLAPO_PRIMITIVE_DESCRIPTOR(cut_pipeline_stage) = {
    .name = "cut_pipeline_stage",
    .summary = "the original system's name for cut",
    .doc = CUT_DOC,
    .bitwise = true,
    .apply = apply,
};
