/* train/data_parallel.c - the data-parallel gradient all-reduce: after a
 * step's micro-batches every data-parallel rank holds the gradient of its
 * own batches, weighted by the global token count (train/accumulate.c), so
 * their sum is the global batch's gradient, all-reduced in buckets
 * (slapo_dist_all_reduce_tensors). The reduction runs after
 * the backward, not overlapped with it: the executor runs one node at a
 * time and accumulates each gradient as it is produced, so an overlap
 * would need a non-blocking all-reduce started from inside a step (noted
 * in docs/distributed.md, data parallelism). Layer: train. */

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"

slapo_status slapo_dp_all_reduce_grads(slapo_module *model, double *comm_s) {
  if (comm_s) *comm_s = 0;
  if (slapo_dist_size(SLAPO_GROUP_DP) == 1) return SLAPO_OK;
  slapo_tensor **g;
  int n;
  SLAPO_TRY(slapo_module_grads(model, &g, &n));
  slapo_status s = slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, n, g, comm_s);
  slapo_free(g);
  return s;
}
