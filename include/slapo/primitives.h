/* slapo/primitives.h - schedule primitives: the registry (from
 * src/primitives/primitives.def), the registry of replacement modules that
 * schedule files name, and the typed C function of each primitive. Every
 * primitive checks before it mutates (a failed primitive leaves the model
 * and the schedule exactly as they were) and, on success, appends one
 * replayable line to the schedule log (slapo_sched_log_of(root)).
 * Layer: primitives (depends on schedule, pattern, compiler, dist). */
#ifndef SLAPO_PRIMITIVES_H
#define SLAPO_PRIMITIVES_H

#include <stdbool.h>

#include "slapo/compiler.h"
#include "slapo/pattern.h"
#include "slapo/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Primitive registry                                                        */
/* ------------------------------------------------------------------------ */

typedef struct slapo_primitive {
  const char *name;    /* "checkpoint"                                    */
  const char *summary; /* one line, for `slapo primitives`                */
  const char *doc;     /* the doc block, for `slapo help <primitive>`     */
  /* True when the primitive keeps arithmetic unchanged, so verify demands
   * bitwise equality; false: verified within tolerances. */
  bool bitwise;
  /* Text-form adapter: checks the entry's arguments and applies it to
   * `node` (the entry's path already resolved). The log line it appends
   * carries the entry's file and line. */
  slapo_status (*apply)(slapo_sched *node, const slapo_sched_entry *e);
} slapo_primitive;

/* The primitive named `name`, or NULL. */
const slapo_primitive *slapo_primitive_find(const char *name);
int slapo_primitive_count(void);
const slapo_primitive *slapo_primitive_at(int i);

/* Applies a schedule-file entry to `node`: looks up the primitive
 * (SLAPO_NOT_FOUND listing the known ones) and calls its adapter. Errors are
 * prefixed with the entry's file:line when it has one. */
slapo_status slapo_primitive_apply(slapo_sched *node, const slapo_sched_entry *e);

/* ------------------------------------------------------------------------ */
/* Replacement modules                                                       */
/* ------------------------------------------------------------------------ */

/* Builds a module to take the place of `old` (borrowed, still attached, so
 * its path is known): sizes carry over from it, and Hugging Face parameter
 * paths are kept by sharing its parameter objects where they correspond. */
typedef slapo_status (*slapo_module_factory)(const slapo_module *old, slapo_module **out);

/* Registers a replacement module under `name` ("FlashAttention") for
 * schedule files. Registration is explicit (models call it from their init
 * function); strings are borrowed and must be static.
 * Errors: SLAPO_INVALID_ARG (name taken), NOMEM. Thread-safe. */
slapo_status slapo_module_register(const char *name, const char *summary,
                                   slapo_module_factory factory);
/* The factory registered as `name`, or NULL. */
slapo_module_factory slapo_module_factory_find(const char *name);
int slapo_module_registered_count(void);
const char *slapo_module_registered_name(int i);
const char *slapo_module_registered_summary(int i);

/* ------------------------------------------------------------------------ */
/* Subgraph modules (replace on a traced graph)                              */
/* ------------------------------------------------------------------------ */

/* Builds the module that takes the place of `n_matches` matches in the
 * traced graph of `owner` (one for a vertical replacement, all of them for a
 * horizontal one): it receives the matches (bound inputs with shapes, the
 * matched nodes and the module paths they belong to, relative to owner),
 * not an old module, and ties the parameters it takes over (a matched
 * Linear's weight) so Hugging Face paths and checkpoints still load. Its
 * forward takes the input nodes bound to the pattern's placeholders, in
 * pattern order (parameters excluded), and returns the result; when there
 * are several (a pattern with several results, the matches of a horizontal
 * replacement), either a tuple of them (slapo_tuple: one value per result,
 * each match's results in turn) or one value holding them joined along the
 * last axis. */
typedef slapo_status (*slapo_subgraph_factory)(slapo_module *owner, int n_matches,
                                               const slapo_match *matches, slapo_module **out);

/* Registers a subgraph module under `name` for `replace NAME pattern=P`.
 * Strings are borrowed and must be static. Errors: SLAPO_INVALID_ARG (name
 * taken by another factory), SLAPO_LIMIT (32 registered). */
slapo_status slapo_subgraph_register(const char *name, const char *summary,
                                     slapo_subgraph_factory factory);
slapo_subgraph_factory slapo_subgraph_factory_find(const char *name);
int slapo_subgraph_registered_count(void);
const char *slapo_subgraph_registered_name(int i);
const char *slapo_subgraph_registered_summary(int i);

/* ------------------------------------------------------------------------ */
/* Primitives (one file each under src/primitives/)                          */
/* ------------------------------------------------------------------------ */

/* replace: swaps `node`'s module for the registered module `name` built from
 * it (the parent's child table entry changes; the schedule subtree is
 * rebuilt). Errors: SLAPO_INVALID_ARG (node is the root), SLAPO_NOT_FOUND
 * (no module registered as `name`: message lists them), and the factory's
 * own errors (e.g. a type it cannot replace), all naming the path. */
slapo_status slapo_replace(slapo_sched *node, const char *name);
/* replace with a C-only module (consumed, also on error): logged by its type
 * name and marked not replayable. */
slapo_status slapo_replace_with(slapo_sched *node, slapo_module *mod);

/* replace_all: replaces every module below `node` (node included) whose type
 * is `type_name` by the registered module `name`, in tree pre-order, from a
 * snapshot taken first (a replacement that contains the old module is not
 * replaced again). All replacements are built before any is swapped in.
 * Errors: SLAPO_NO_MATCH (no module of that type), as replace. */
slapo_status slapo_replace_all(slapo_sched *node, const char *type_name, const char *name);

/* annotate: tags parameter `param` of node's module with key=value (the
 * optimizer reads weight_decay). Tags live on the parameter, so they survive
 * replacement. Errors: SLAPO_NOT_FOUND (no such parameter: message lists the
 * module's parameters), SLAPO_INVALID_ARG (bad weight_decay value). */
slapo_status slapo_annotate(slapo_sched *node, const char *param, const char *key,
                            const char *value);

/* checkpoint: with ratio <= 0 the module's activations are recomputed in
 * the backward instead of kept; with 0 < ratio <= 1 on a module with
 * children (a list such as transformer.h), its first floor(ratio * n)
 * children are checkpointed. Loss, outputs and gradients stay bitwise equal
 * (DESIGN.md §3).
 * Errors: SLAPO_INVALID_ARG (the root; ratio > 1; a ratio on a module
 * without children, or one selecting none), SLAPO_STATE (already
 * checkpointed). */
slapo_status slapo_checkpoint(slapo_sched *node, double ratio);

/* Ends a pipeline stage after node's module (the `cut` primitive; `slapo
 * help cut`). Errors: SLAPO_INVALID_ARG (the root), SLAPO_STATE (already
 * cut there), NOMEM. */
slapo_status slapo_cut(slapo_sched *node);

/* autocast: node's GEMMs (and those below it, unless a descendant sets its
 * own) take bf16 operands ("bf16") or f32 ones ("f32"). Documented once in
 * the primitive's .doc (`slapo help autocast`). Errors: SLAPO_INVALID_ARG
 * (dtype), SLAPO_STATE (traced, inlined, already set). */
slapo_status slapo_autocast_module(slapo_sched *node, const char *dtype);

/* find on a schedule node: slapo_find on its module (a query; nothing is
 * logged). Errors: those of slapo_find (SLAPO_PRECOND when not traced). */
slapo_status slapo_sched_find(slapo_sched *node, const slapo_pattern *p, slapo_matches *out);

/* replace on a subgraph (primitives/subgraph.c): every match of p in node's
 * traced graph becomes a call of a new child "<name>_<k>" built by the
 * registered subgraph factory `name` (one child per match; with
 * `horizontal`, one child for all matches, which must share their input
 * nodes, its result split back along the last axis). p is copied.
 * .sched: `PATH replace NAME pattern=P [horizontal=true]`.
 * Errors (nothing changed): SLAPO_PRECOND (not traced), SLAPO_NOT_FOUND (no
 * such factory), SLAPO_NO_MATCH, SLAPO_STATE (a match not replaceable: names
 * the outside user; a result used before an input exists), SLAPO_SHAPE (the
 * module's result does not fit the match's), SLAPO_INVALID_ARG (horizontal
 * matches with different inputs), the factory's and forward's errors
 * (a wrong input count among them). */
slapo_status slapo_replace_subgraph(slapo_sched *node, const slapo_pattern *p, const char *name,
                                    bool horizontal);
/* Vertical replacement by an op function (ops emitted into the graph in
 * place of each match) taking n_inputs input nodes; `name` labels the log
 * line, which is not replayable (C only). Errors: as above, plus
 * SLAPO_INVALID_ARG when n_inputs differs from the nodes a match binds. */
slapo_status slapo_replace_subgraph_fn(slapo_sched *node, const slapo_pattern *p,
                                       const char *name, int n_inputs, slapo_pattern_fn fn,
                                       void *ud);
/* checkpoint on a subgraph: each match of p becomes its own recompute
 * region (its intermediates die in the forward and are recomputed before
 * its backward). .sched: `PATH checkpoint pattern=P`. Errors: SLAPO_PRECOND,
 * SLAPO_NO_MATCH, SLAPO_STATE (a matched node already checkpointed). */
slapo_status slapo_checkpoint_subgraph(slapo_sched *node, const slapo_pattern *p);

/* fuse (primitives/fuse.c): the match of p in node's traced graph becomes
 * a child "<name>_<k>" whose forward is one op compiled by `compiler`
 * ("cc", "none"; opts pass through). Without `all` anything but exactly one
 * replaceable match is an error; with it every replaceable match is fused
 * (equal regions share one compiled op) and the others are logged.
 * .sched: `PATH fuse pattern=P compiler=cc name=Name [all=true]`.
 * Errors: SLAPO_PRECOND, SLAPO_NO_MATCH, SLAPO_INVALID_ARG (several matches,
 * unknown compiler), SLAPO_STATE (escaping value), SLAPO_UNSUPPORTED,
 * SLAPO_COMPILE. */
slapo_status slapo_fuse(slapo_sched *node, const slapo_pattern *p, const char *compiler,
                        const char *name, const slapo_compile_opts *opts, bool all);

/* fuse_all (primitives/fuse_all.c): every maximal elementwise region of
 * node's traced graph (slapo_find_elementwise) fused into its own child
 * "<name>_<k>" (compiler NULL: "cc"; name NULL: "Fused"); regions the
 * backend cannot generate are left and logged. Errors: SLAPO_PRECOND,
 * SLAPO_NO_MATCH, SLAPO_UNSUPPORTED (none fused), SLAPO_INVALID_ARG. */
slapo_status slapo_fuse_all(slapo_sched *node, const char *compiler, const char *name);

/* decompose (primitives/decompose.c): a Linear with a bias becomes a
 * module computing matmul then a separate bias add (same parameters), so a
 * flattened trace exposes the add to fuse with what follows.
 * Errors: SLAPO_INVALID_ARG (not a Linear; the root), SLAPO_PRECOND (no
 * bias), SLAPO_STATE (inlined into a flattened trace). */
slapo_status slapo_decompose(slapo_sched *node);

/* shard (primitives/shard.c): splits parameter `param` of node's module
 * along `axis` across the tensor-parallel group (slapo_dist_init), in
 * `parts` blocks each split on its own (3 for GPT-2's q|k|v c_attn); pad >
 * 1 pads axis 0 with zero rows to a multiple of pad x group size (a
 * vocabulary of 50257). .sched: `PATH shard PARAM axis=A [parts=P] [pad=M]`. Errors: SLAPO_NOT_FOUND (no
 * such parameter), SLAPO_SHAPE (size not divisible by parts x group size:
 * names parameter, axis, size, group size), SLAPO_INVALID_ARG (bad axis or
 * parts), SLAPO_STATE (sharded another way; inlined into a trace). */
slapo_status slapo_shard_param(slapo_sched *node, const char *param, int axis, int parts,
                               int64_t pad);

/* sync (primitives/sync.c): a collective at node's module boundary: mode
 * "fwd_pre" (on the first input), "fwd_post" (on the output) or "bwd_post"
 * (the input's gradient); op "all_reduce", "all_gather", "reduce_scatter"
 * or "scatter" along `axis`; reduce_grad: all_gather's backward
 * reduce-scatters (true) or takes the own block. A row-parallel Linear with
 * a bias becomes a SyncedLinear (matmul, collective, bias). .sched: `PATH
 * sync MODE OP [axis=A] [reduce=false] [group=tp|dp|world]`. Errors:
 * SLAPO_INVALID_ARG (unknown mode or op, a pair that does not exist),
 * SLAPO_PRECOND (the collective does not fit the shards' output: the
 * message names the one that does), SLAPO_STATE (inlined). */
slapo_status slapo_sync(slapo_sched *node, const char *mode, const char *op, int axis,
                        bool reduce_grad);
/* sync on values inside node's traced graph: `op` after the value of every
 * match of p (each match becomes a child "Synced_<k>" re-emitting its ops,
 * the collective its output sync). .sched: `PATH sync fwd_post OP
 * pattern=P`. Errors: as slapo_sync, plus those of subgraph replacement
 * (SLAPO_PRECOND not traced, SLAPO_NO_MATCH). */
slapo_status slapo_sync_pattern(slapo_sched *node, const slapo_pattern *p, const char *op,
                                int axis, bool reduce_grad);

/* trace: captures node's module as a static graph (slapo_module_trace; see
 * primitives/trace.c). opts NULL: no flatten, default leaves. Errors: those
 * of slapo_module_trace. */
slapo_status slapo_trace(slapo_sched *node, const slapo_trace_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
