/* primitives/trace.c - the `trace` primitive: capture a module's forward as
 * a static graph stored on the module, so find, subgraph replace and
 * subgraph checkpoint can work on it (DESIGN.md §3). Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help trace` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

static int log_args(const slapo_trace_opts *o, slapo_sched_arg *args) {
  int n = 0;
  if (o && o->flatten) args[n++] = slapo_sched_arg_bool("flatten", true);
  if (o && o->leaves) args[n++] = slapo_sched_arg_string("leaves", o->leaves);
  return n;
}

static slapo_status trace_impl(slapo_sched *node, const slapo_trace_opts *opts,
                               const slapo_sched_entry *from) {
  slapo_sched_arg args[2];
  int n = log_args(opts, args);
  SLAPO_TRY(slapo__prim_log_check(node, "trace", n, args));
  SLAPO_TRY(slapo_module_trace(slapo_sched_module(node), opts));
  return slapo__prim_log(node, "trace", n, args, from, true);
}

slapo_status slapo_trace(slapo_sched *node, const slapo_trace_opts *opts) {
  return trace_impl(node, opts, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"flatten", "leaves", NULL}, 0));
  slapo_trace_opts o = {0};
  SLAPO_TRY(slapo_sched_entry_get_bool(e, "flatten", false, &o.flatten));
  SLAPO_TRY(slapo_sched_entry_get_string(e, "leaves", false, &o.leaves));
  return trace_impl(node, &o, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(trace) = {
    .name = "trace",
    .summary = "capture a module's forward as a static graph (for find, subgraph replace, "
               "checkpoint)",
    .doc = "trace [flatten=true] [leaves=\"Type,path\"]\n"
           "  C: slapo_trace(node, &(slapo_trace_opts){.flatten = true})\n"
           "  Applies to any module the forward calls on the model's example inputs.\n"
           "  Effect: the module emits its stored graph instead of calling its forward;\n"
           "  children stay call_module nodes unless flatten=true inlines every child\n"
           "  that is not a leaf: a module that stands for one op (Linear, LayerNorm,\n"
           "  RMSNorm, Embedding, Dropout, GELU, ReLU, SiLU; a decomposed Linear is\n"
           "  inlined) or a type or path in leaves. Other input shapes re-trace and\n"
           "  replay the graph's edits.\n"
           "  Fails: STATE if already traced or inlined into an ancestor's flattened\n"
           "  trace; PRECOND without example inputs; UNSUPPORTED for a child that\n"
           "  cannot be inlined (checkpointed).\n"
           "  Verified: bitwise equal loss, outputs and gradients.\n",
    .bitwise = true,
    .apply = apply,
};
