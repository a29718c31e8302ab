/* module/internal.h - state shared by the module layer's files while a step
 * graph is built. Layer: module (internal). */
#ifndef SLAPO_MODULE_INTERNAL_H
#define SLAPO_MODULE_INTERNAL_H

#include "core/assert.h"
#include "slapo/module.h"

/* While a decoding step is built (decode.c): the cache it reads and the
 * present keys and values the attention modules record. */
typedef struct slapo__decode_state {
  slapo_kv_cache *cache;
  int n, cap;
  char **paths;        /* attention module path of each record (owned)   */
  slapo_node **k, **v; /* present keys / values [B, NH, P + T, HS]       */
} slapo__decode_state;

/* Attached to the ctx (slapo_ctx_set_user) while a step is built. */
typedef struct slapo__build_state {
  slapo_map *param_nodes; /* canonical path -> param node */
  slapo_map *param_objs;  /* canonical path -> slapo_parameter */
  slapo__decode_state *decode; /* NULL unless a decoding step is built */
} slapo__build_state;

/* The runner's root module; and the last decoding step's graph and plan,
 * kept (owned by the runner) so its logits stay valid until the next one:
 * the previous pair is freed. */
slapo_module *slapo__runner_root(const slapo_runner *r);
void slapo__runner_keep_decode(slapo_runner *r, slapo_graph *g, slapo_plan *p);

/* Graph pass (fold_grads.c), run by slapo_step on the joint graph: every
 * sum of step-1 slice_backward nodes whose slices tile their dim (the
 * gradient of a split) becomes one concat of the pieces' gradients; the
 * replaced adds and slice_backwards are erased. Exact up to the sign of
 * zeros. *n_folded (may be NULL) receives the number of sums replaced.
 * Errors: SLAPO_NOMEM (the graph may then hold an unused concat). */
slapo_status slapo__fold_split_grads(slapo_graph *g, int *n_folded);

/* Graph pass (fold_index_add.c), run by slapo_step on the joint graph:
 * add(index_add(full(0), idx, src), g) -> index_add(g, idx, src) where the
 * full and the index_add have no other user. Changes the order of float
 * sums in the touched rows (documented there). Errors: SLAPO_NOMEM. */
slapo_status slapo__fold_index_add(slapo_graph *g, int *n_folded);

/* Graph pass (drop_identity.c), run by slapo_step: removes every dropout
 * node that is the identity in the step (p == 0, or `training` false), its
 * users reading its input instead. *n_dropped (may be NULL) receives the
 * count. Errors: SLAPO_NOMEM. */
slapo_status slapo__drop_identity_dropouts(slapo_graph *g, bool training, int *n_dropped);

#endif
