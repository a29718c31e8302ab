/* primitives/autocast.c - the `autocast` primitive: mixed precision for a
 * module's GEMMs, PyTorch's torch.autocast as a line of the schedule.
 * Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help autocast` prints it). */
#include <string.h>

#include "primitives/internal.h"

/* The first traced module in m's subtree (m included), or NULL: a trace
 * stores a graph built without the casts, which the flag would not change. */
static const slapo_module *traced_in(const slapo_module *m) {
  if (m->trace) return m;
  for (int i = 0; i < m->n_children; i++) {
    const slapo_module *t = traced_in(m->children[i]);
    if (t) return t;
  }
  return NULL;
}

static slapo_status autocast_impl(slapo_sched *node, const char *dtype,
                                  const slapo_sched_entry *from) {
  const char *path = slapo__prim_path(node);
  slapo_module *m = slapo_sched_module(node);
  bool bf16 = dtype && strcmp(dtype, "bf16") == 0;
  if (!bf16 && !(dtype && strcmp(dtype, "f32") == 0))
    return slapo_error(SLAPO_INVALID_ARG,
                       "autocast: %s: dtype=%s is not a GEMM precision slapo autocasts to: "
                       "bf16, or f32 to turn it off below a bf16 ancestor",
                       path, dtype ? dtype : "(none)");
  SLAPO_TRY(slapo__prim_not_inlined(node, "autocast"));
  const slapo_module *t = traced_in(m);
  if (t)
    return slapo_error(SLAPO_STATE,
                       "autocast: %s is traced (at %s): its graph was recorded without casts; "
                       "put the autocast line before the trace line",
                       path, t == m ? "itself" : t->name);
  if (m->autocast_set)
    return slapo_error(SLAPO_STATE, "autocast: %s already has autocast dtype=%s",
                       path, m->autocast == SLAPO_AUTOCAST_OFF ? "f32" : "bf16");
  slapo_module_set_autocast(m, bf16);
  slapo_sched_arg a = slapo_sched_arg_word("dtype", bf16 ? "bf16" : "f32");
  slapo_status s = slapo__prim_log(node, "autocast", 1, &a, from, true);
  if (s != SLAPO_OK) m->autocast_set = false;
  return s;
}

slapo_status slapo_autocast_module(slapo_sched *node, const char *dtype) {
  return autocast_impl(node, dtype, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"dtype", NULL}, 0));
  const char *dtype = NULL;
  SLAPO_TRY(slapo_sched_entry_get_string(e, "dtype", true, &dtype));
  return autocast_impl(node, dtype, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(autocast) = {
    .name = "autocast",
    .summary = "run a module's GEMMs with bf16 operands (f32 accumulation and output)",
    .doc = "autocast dtype=bf16|f32\n"
           "  C: slapo_autocast_module(node, \"bf16\")\n"
           "  Applies to any module, the root included (slapo train --precision bf16\n"
           "  adds `autocast dtype=bf16` on the root); the nearest module with a\n"
           "  setting wins, so `lm_head autocast dtype=f32` keeps one module in f32.\n"
           "  Effect: inside the module, linear and matmul (the attention's two\n"
           "  products included) cast their f32 operands with to_bf16 (each value\n"
           "  once per graph; a weight again where the backward reads it, so no\n"
           "  bf16 copy lives from forward to backward), multiply bf16 x bf16,\n"
           "  accumulate and write f32; their backward GEMMs read dy in bf16.\n"
           "  Everything else (LayerNorm, softmax, GELU, residual adds, the loss,\n"
           "  FlashAttention), the master weights, gradients, their all-reduce and\n"
           "  AdamW stay f32. Saved GEMM inputs are the bf16 copies (half the\n"
           "  memory). The GEMMs run on bf16 hardware (AVX512_BF16 or AMX-BF16,\n"
           "  slapo_bf16_gemm_native); elsewhere their operands are widened to\n"
           "  f32 first: the same products at f32 speed, never a slow emulation.\n"
           "  A checkpointed region's recompute redoes its own casts; tensor\n"
           "  parallel shards the f32 weights and casts the shards.\n"
           "  Fails: INVALID_ARG for a dtype other than bf16 or f32; STATE when\n"
           "  the module (or one below it) is traced, since its recorded graph has\n"
           "  no casts (put autocast first), when it is inlined in a traced\n"
           "  ancestor, or when it already has an autocast line.\n"
           "  Verified in three parts: the schedule without its autocast lines\n"
           "  against the unscheduled model and the schedule against itself with\n"
           "  autocast emulated in f32 (operands through round_bf16, dy through\n"
           "  round_bf16_dy), both at the f32 tolerance; and against plain f32\n"
           "  within 5% of each tensor's largest magnitude (at least 1e-3).\n",
    .bitwise = false,
    .apply = apply,
};
