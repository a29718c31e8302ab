/* module/internal.h - state shared by the module layer's files while a step
 * graph is built. Layer: module (internal). */
#ifndef SLAPO_MODULE_INTERNAL_H
#define SLAPO_MODULE_INTERNAL_H

#include "core/assert.h"
#include "slapo/module.h"

/* Attached to the ctx (slapo_ctx_set_user) while a step is built. */
typedef struct slapo__build_state {
  slapo_map *param_nodes; /* canonical path -> param node */
  slapo_map *param_objs;  /* canonical path -> slapo_parameter */
} slapo__build_state;

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
