/* slapo/compiler.h - fusion backends (DESIGN.md §6): a backend compiles a
 * region graph (an elementwise chain, say) with known shapes into one op
 * registered at run time, with a forward and a backward kernel. Backends
 * are registered by name in src/compiler/compilers.def (one file and one
 * line each) and chosen by schedules (`fuse ... compiler=cc`).
 * Layer: compiler (depends on ir, ops). */
#ifndef SLAPO_COMPILER_H
#define SLAPO_COMPILER_H

#include <stdbool.h>

#include "slapo/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backend options from a schedule line, key=value (borrowed strings). */
typedef struct slapo_compile_opts {
  int n;
  const char *const *keys;
  const char *const *values;
} slapo_compile_opts;


/* A fusion backend. `compile` turns `region` into an op:
 *   region  placeholders = the op's inputs in order (dtype and shape as at
 *           the example call), call_op nodes, one output node; borrowed.
 *   name    the fused module's name ("FusedBiasGeLU"); the op's name is made
 *           from it and a hash of the region, so equal regions share one op.
 *   *out    the fused op, registered with slapo_op_register and living until
 *           exit: its inputs are the region's inputs (other shapes allowed
 *           where the backend's kernels take sizes as arguments), its output
 *           the region's; its backward rule gives every input's gradient.
 *           A region may have several results (its output node's inputs):
 *           a backend that compiles them into one op packs them into its
 *           one value, flat f32, result k from the sum of the earlier
 *           results' sizes, read through `unpack` views, and gives the op a
 *           backward_packed rule (autograd hands it every result's gradient
 *           at once); one with a single result may pack it the same way
 *           (beside values it saves for its backward). A backend that does
 *           not pack refuses several results with SLAPO_UNSUPPORTED, and
 *           fuse compiles one op per result.
 *           NULL: the backend registers nothing and the fused module
 *           re-emits the region's ops (`none`).
 * Errors: SLAPO_UNSUPPORTED naming the op or shape and the backend,
 * SLAPO_COMPILE (the system compiler failed, with its stderr), SLAPO_IO,
 * SLAPO_NOMEM. */
typedef struct slapo_compiler {
  const char *name;    /* "cc" */
  const char *summary; /* one line for `slapo primitives` */
  slapo_status (*compile)(const slapo_graph *region, const char *name,
                          const slapo_compile_opts *opts, const slapo_op **out);
  /* Non-elementwise ops the backend generates with the elementwise ops
   * before them (cc: LayerNorm), so that fuse_all's regions may end in
   * one; NULL: none. */
  bool (*ends_region)(const slapo_op *op);
} slapo_compiler;

/* The backend `name`, or NULL. Built-ins from compilers.def. */
const slapo_compiler *slapo_compiler_find(const char *name);
int slapo_compiler_count(void);
const slapo_compiler *slapo_compiler_at(int i);

/* The cache directory of compiled kernels: SLAPO_CACHE_DIR, else
 * $XDG_CACHE_HOME/slapo, else $HOME/.cache/slapo, else
 * /tmp/slapo-cache-<effective uid>. Written into buf [cap]. The cc backend
 * creates it 0700 and uses it only when nobody but the user can write it
 * or the directories above it (docs/fusion.md, the kernel cache). */
void slapo_compiler_cache_dir(char *buf, size_t cap);

/* Counters of the cc backend since start: objects compiled, cache hits
 * (object found, nothing compiled), ops reused in this process. */
typedef struct slapo_cc_stats {
  int compiled, cache_hits, reused;
} slapo_cc_stats;
slapo_cc_stats slapo_cc_stats_get(void);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_COMPILER_H */
