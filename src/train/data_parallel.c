/* train/data_parallel.c - the data-parallel gradient all-reduce: after a
 * step's micro-batches every data-parallel rank holds the gradient of its
 * own batches, weighted by the global token count (train/accumulate.c), so
 * their sum is the global batch's gradient. Gradients are packed into
 * buckets (as PyTorch DDP does, 25 MiB there) so a 124M model takes a few
 * large all-reduces instead of 148 small ones. The reduction runs after
 * the backward, not overlapped with it: the executor runs one node at a
 * time and accumulates each gradient as it is produced, so an overlap
 * would need a non-blocking all-reduce started from inside a step (noted
 * in docs/ARCHITECTURE.md). Layer: train. */
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"

enum { BUCKET_FLOATS = 8 << 20 }; /* 32 MiB */

typedef struct bucket {
  float *buf;
  int64_t used;
  slapo_parameter *params[4096];
  int n;
  slapo_status status;
} bucket;

/* All-reduces the bucket and copies the sums back into the gradients. */
static void flush(bucket *b) {
  if (b->status != SLAPO_OK || b->used == 0) return;
  b->status = slapo_dist_all_reduce_f32(SLAPO_GROUP_DP, b->buf, b->used);
  int64_t at = 0;
  for (int i = 0; i < b->n && b->status == SLAPO_OK; i++) {
    int64_t n = slapo_tensor_numel(b->params[i]->grad);
    memcpy(slapo_tensor_data(b->params[i]->grad), b->buf + at, sizeof(float) * (size_t)n);
    at += n;
  }
  b->used = 0, b->n = 0;
}

static void add(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  bucket *b = ud;
  if (b->status != SLAPO_OK || !p->grad) return;
  int64_t n = slapo_tensor_numel(p->grad);
  if (n > BUCKET_FLOATS) { /* one parameter larger than a bucket: in place */
    flush(b);
    if (b->status == SLAPO_OK)
      b->status = slapo_dist_all_reduce_f32(SLAPO_GROUP_DP, slapo_tensor_data(p->grad), n);
    return;
  }
  if (b->used + n > BUCKET_FLOATS || b->n == 4096) flush(b);
  memcpy(b->buf + b->used, slapo_tensor_data(p->grad), sizeof(float) * (size_t)n);
  b->params[b->n++] = p;
  b->used += n;
}

slapo_status slapo_dp_all_reduce_grads(slapo_module *model, double *comm_s) {
  if (comm_s) *comm_s = 0;
  if (slapo_dist_size(SLAPO_GROUP_DP) == 1) return SLAPO_OK;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  bucket *b = slapo_calloc(1, sizeof *b);
  if (b) b->buf = slapo_malloc(sizeof(float) * BUCKET_FLOATS);
  if (!b || !b->buf) {
    if (b) slapo_free(b);
    return slapo_error(SLAPO_NOMEM, "data parallel: out of memory for the gradient bucket");
  }
  slapo_status s = slapo_module_visit_params(model, add, b);
  if (s == SLAPO_OK) flush(b), s = b->status;
  slapo_free(b->buf);
  slapo_free(b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (comm_s) *comm_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return s;
}
