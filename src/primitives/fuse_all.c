/* primitives/fuse_all.c - the `fuse_all` primitive: every maximal
 * elementwise region of a traced module (ending, where the backend
 * generates it, in a norm or softmax) fused, each into its own Fused module, with
 * one call. Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help fuse_all` prints it). */
#include <stdio.h>

#include "primitives/internal.h"

static slapo_status fuse_all_impl(slapo_sched *node, const char *compiler, const char *name,
                                  const slapo_sched_entry *from) {
  const slapo_compiler *cc;
  SLAPO_TRY(slapo__compiler_named(node, "fuse_all", compiler, &cc));
  slapo_sched_arg args[2] = {slapo_sched_arg_word("compiler", compiler),
                             slapo_sched_arg_word("name", name)};
  slapo__fuse_req rq = {cc, name, NULL};
  /* auto: its regions may end where cc's may (auto's last resort). */
  const slapo_compiler *ender = cc ? cc : slapo_compiler_find("cc");
  slapo__subgraph_spec sp = {.primitive = "fuse_all", .child = name,
                             .factory = {slapo__fuse_factory, &rq}, .skip_unsupported = true,
                             .region_ends = ender ? ender->ends_region : NULL,
                             .args = args, .n_args = 2, .replayable = true, .from = from};
  return slapo__subgraph_apply(node, NULL, &sp);
}

slapo_status slapo_fuse_all(slapo_sched *node, const char *compiler, const char *name) {
  return fuse_all_impl(node, compiler ? compiler : "cc", name ? name : "Fused", NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"compiler", "name", NULL}, 0));
  const char *compiler = "cc", *name = "Fused";
  SLAPO_TRY(slapo_sched_entry_get_string(e, "compiler", false, &compiler));
  SLAPO_TRY(slapo_sched_entry_get_string(e, "name", false, &name));
  return fuse_all_impl(node, compiler, name, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(fuse_all) = {
    .name = "fuse_all",
    .summary = "fuse every maximal elementwise region of a traced module",
    .doc = "fuse_all [compiler=cc|dnnl|none|auto] [name=Fused]\n"
           "  C: slapo_fuse_all(node, \"cc\", \"Fused\")\n"
           "  Applies to a traced module (flatten=true exposes its children's ops).\n"
           "  Effect: every region of connected elementwise nodes whose values are used\n"
           "  only inside it but for its result (two ops or more) becomes a call of\n"
           "  <name>_<k>; a region never crosses a value read outside it. Regions the\n"
           "  backend cannot generate are left and logged (SLAPO_DEBUG=1); with\n"
           "  compiler=auto each region goes to the first backend that takes it. With\n"
           "  cc and auto a region may end in a LayerNorm, RMSNorm or softmax over the\n"
           "  last axis (its input's producers join it when nothing else reads them: a\n"
           "  post-LN block's bias + dropout + residual + LayerNorm); a pre-LN block's\n"
           "  residual sum is read on, so its norm stays outside (fuse it with a\n"
           "  pattern: the sum is a second result). A causal softmax is left unfused.\n"
           "  Fails: PRECOND if not traced; NO_MATCH without such regions; UNSUPPORTED\n"
           "  when none could be fused; INVALID_ARG for an unknown compiler.\n"
           "  Verified: outputs and gradients within tolerance.\n",
    .bitwise = false,
    .apply = apply,
};
