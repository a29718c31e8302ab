/* train/data_parallel.c - the data-parallel gradient all-reduce: after a
 * step's micro-batches every data-parallel rank holds the gradient of its
 * own batches, weighted by the global token count (train/accumulate.c), so
 * their sum is the global batch's gradient, all-reduced in buckets
 * (slapo_dist_all_reduce_tensors). The reduction runs after
 * the backward, not overlapped with it: the executor runs one node at a
 * time and accumulates each gradient as it is produced, so an overlap
 * would need a non-blocking all-reduce started from inside a step (noted
 * in docs/ARCHITECTURE.md). Layer: train. */

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"

/* Collects the gradients in visit order. */
typedef struct grads {
  slapo_tensor **t;
  int n, cap;
  slapo_status status;
} grads;

static void collect(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  grads *g = ud;
  if (!p->grad || g->status != SLAPO_OK) return;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 256;
    slapo_tensor **t = slapo_realloc(g->t, sizeof *t * (size_t)cap);
    if (!t) {
      g->status = slapo_error(SLAPO_NOMEM, "data parallel: out of memory");
      return;
    }
    g->t = t, g->cap = cap;
  }
  g->t[g->n++] = p->grad;
}

slapo_status slapo_dp_all_reduce_grads(slapo_module *model, double *comm_s) {
  if (comm_s) *comm_s = 0;
  if (slapo_dist_size(SLAPO_GROUP_DP) == 1) return SLAPO_OK;
  grads g = {0};
  slapo_status s = slapo_module_visit_params(model, collect, &g);
  if (s == SLAPO_OK) s = g.status;
  if (s == SLAPO_OK) s = slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, g.n, g.t, comm_s);
  slapo_free(g.t);
  return s;
}
