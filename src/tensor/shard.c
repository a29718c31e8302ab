/* tensor/shard.c - shard layouts: which elements of an unsharded tensor a
 * rank holds when it is split along one axis (possibly in `parts` blocks,
 * each split on its own). Used to materialize sharded parameters with the
 * unsharded model's values, to slice loaded weights, and to place gathered
 * pieces for a checkpoint. Layer: tensor. */
#include <string.h>

#include "core/assert.h"
#include "slapo/tensor.h"

slapo_status slapo_shard_make(int ndim, const int64_t *full, int axis, int parts, int index,
                              int count, int64_t pad, slapo_shard *out) {
  if (axis < 0) axis += ndim;
  if (ndim < 1 || ndim > SLAPO_MAX_DIMS || axis < 0 || axis >= ndim)
    return slapo_error(SLAPO_INVALID_ARG, "axis %d is outside a %d-d tensor", axis, ndim);
  if (parts < 1 || count < 1 || index < 0 || index >= count)
    return slapo_error(SLAPO_INVALID_ARG, "parts %d, rank %d of %d: parts and group size must "
                       "be >= 1 and the rank inside the group", parts, index, count);
  if (pad > 1 && (axis != 0 || parts != 1))
    return slapo_error(SLAPO_INVALID_ARG, "pad=%lld pads axis 0 of a plain split (got axis %d, "
                       "parts %d)", (long long)pad, axis, parts);
  int64_t size = full[axis];
  if (pad > 1) size = (size + pad * count - 1) / (pad * count) * (pad * count);
  if (size % ((int64_t)parts * count))
    return slapo_error(SLAPO_SHAPE, "axis %d has size %lld, not divisible by %s%d (group size "
                       "%d, parts %d)", axis, (long long)full[axis],
                       parts > 1 ? "parts x group = " : "", parts * count, count, parts);
  *out = (slapo_shard){axis, parts, index, count, ndim, {0}, full[axis]};
  memcpy(out->full, full, sizeof(int64_t) * (size_t)ndim);
  out->full[axis] = size;
  return SLAPO_OK;
}

void slapo_shard_orig_shape(const slapo_shard *s, int64_t *shape) {
  memcpy(shape, s->full, sizeof(int64_t) * (size_t)s->ndim);
  shape[s->axis] = s->valid;
}

/* Whether t has the unsharded shape, padded or not. */
static bool unsharded_shape(const slapo_shard *s, const slapo_tensor *t) {
  int64_t orig[SLAPO_MAX_DIMS];
  slapo_shard_orig_shape(s, orig);
  return slapo_shape_equal(t->ndim, t->shape, s->ndim, s->full) ||
         slapo_shape_equal(t->ndim, t->shape, s->ndim, orig);
}

void slapo_shard_local_shape(const slapo_shard *s, int64_t *shape) {
  memcpy(shape, s->full, sizeof(int64_t) * (size_t)s->ndim);
  shape[s->axis] /= s->count;
}

/* inner = elements per step of the axis; L = local axis size. */
static void dims(const slapo_shard *s, int64_t *inner, int64_t *L) {
  *inner = 1;
  for (int i = s->axis + 1; i < s->ndim; i++) *inner *= s->full[i];
  *L = s->full[s->axis] / s->count;
}

/* The unsharded axis coordinate of local axis coordinate a of rank r. */
static int64_t global_coord(const slapo_shard *s, int r, int64_t a) {
  int64_t block = s->full[s->axis] / s->parts, chunk = block / s->count;
  return a / chunk * block + (int64_t)r * chunk + a % chunk;
}

int64_t slapo_shard_global_index(const slapo_shard *s, int64_t i) {
  int64_t inner, L;
  dims(s, &inner, &L);
  int64_t e = i % inner, a = i / inner % L, o = i / inner / L;
  return (o * s->full[s->axis] + global_coord(s, s->index, a)) * inner + e;
}

slapo_status slapo_shard_slice(const slapo_shard *s, const slapo_tensor *full,
                               slapo_tensor **out) {
  *out = NULL;
  if (full->dtype != SLAPO_DTYPE_F32) return slapo_error(SLAPO_DTYPE, "shard: tensor is not f32");
  if (!unsharded_shape(s, full))
    return slapo_error(SLAPO_SHAPE, "shard: tensor does not have the unsharded shape");
  slapo_tensor *c = NULL;
  const slapo_tensor *src = full;
  if (!slapo_tensor_is_contiguous(full)) {
    SLAPO_TRY(slapo_tensor_contiguous(full, &c));
    src = c;
  }
  int64_t shape[SLAPO_MAX_DIMS];
  slapo_shard_local_shape(s, shape);
  slapo_status st = slapo_tensor_new(SLAPO_DTYPE_F32, s->ndim, shape, out);
  if (st == SLAPO_OK) {
    const float *x = slapo_tensor_data(src);
    float *y = slapo_tensor_data(*out);
    /* Padding exists on axis 0 only, where padded and unpadded flat indices
     * agree: what lies past the source's end is padding. */
    int64_t n = slapo_tensor_numel(*out), limit = slapo_tensor_numel(src);
    for (int64_t i = 0; i < n; i++) {
      int64_t g = slapo_shard_global_index(s, i);
      y[i] = g < limit ? x[g] : 0.0f;
    }
  }
  slapo_tensor_free(c);
  return st;
}

void slapo_shard_place(const slapo_shard *s, int index, const float *local, slapo_tensor *full) {
  slapo_shard r = *s;
  r.index = index;
  float *y = slapo_tensor_data(full);
  int64_t inner, L;
  dims(s, &inner, &L);
  int64_t n = L * inner;
  for (int i = 0; i < s->axis; i++) n *= s->full[i];
  int64_t limit = slapo_tensor_numel(full); /* padding (past the end) dropped */
  for (int64_t i = 0; i < n; i++) {
    int64_t g = slapo_shard_global_index(&r, i);
    if (g < limit) y[g] = local[i];
  }
}
