/* tensor/view.c - views that share storage with their source: reshape (one
 * dim may be -1), permute and strided slice. Meta tensors get meta views.
 * Layer: tensor. Semantics follow PyTorch's view/permute and Python slice
 * clamping (negative bounds count from the end). */
#include <inttypes.h>

#include "core/assert.h"
#include "slapo/tensor.h"

slapo_status slapo_tensor_reshape(const slapo_tensor *t, int ndim, const int64_t *shape,
                                  slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = NULL;
  char from[160], to[160];
  if (ndim < 0 || ndim > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "reshape: ndim %d is outside [0, %d]", ndim,
                       SLAPO_MAX_DIMS);
  if (ndim > 0 && !shape)
    return slapo_error(SLAPO_INVALID_ARG, "reshape: shape is NULL for ndim %d", ndim);
  slapo_shape_str(t->ndim, t->shape, from, sizeof from);
  slapo_shape_str(ndim, shape, to, sizeof to);

  int infer = -1;
  int64_t known = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == -1) {
      if (infer >= 0)
        return slapo_error(SLAPO_INVALID_ARG, "reshape: shape %s has more than one -1", to);
      infer = i;
    } else if (shape[i] < 0) {
      return slapo_error(SLAPO_INVALID_ARG, "reshape: shape %s has invalid dim %d (%" PRId64 ")",
                         to, i, shape[i]);
    } else {
      if (shape[i] && known > INT64_MAX / shape[i]) overflow = true;
      else known *= shape[i];
    }
  }
  int64_t numel = slapo_tensor_numel(t);
  int64_t new_shape[SLAPO_MAX_DIMS];
  for (int i = 0; i < ndim; i++) new_shape[i] = shape[i];
  if (infer >= 0) {
    if (known == 0 || overflow || numel % known)
      return slapo_error(SLAPO_SHAPE, "reshape: cannot reshape %s (%" PRId64
                         " elements) into %s: the -1 dim cannot be inferred", from, numel, to);
    new_shape[infer] = numel / known;
  } else if (overflow || known != numel) {
    if (overflow)
      return slapo_error(SLAPO_SHAPE, "reshape: cannot reshape %s (%" PRId64
                         " elements) into %s (too many elements)", from, numel, to);
    return slapo_error(SLAPO_SHAPE, "reshape: cannot reshape %s (%" PRId64 " elements) into %s (%"
                       PRId64 " elements)", from, numel, to, known);
  }
  if (!slapo_shape_addressable(ndim, new_shape, slapo_dtype_size(t->dtype)))
    return slapo_error(SLAPO_SHAPE, "reshape: cannot reshape %s into %s: its strides overflow "
                       "64 bits (zero dims counted as 1)", from, to);
  if (!slapo_tensor_is_contiguous(t))
    return slapo_error(SLAPO_SHAPE, "reshape: cannot reshape non-contiguous %s into %s; "
                       "call slapo_tensor_contiguous first", from, to);

  slapo_tensor *v;
  SLAPO_TRY(slapo_tensor_view(t, &v));
  v->ndim = ndim;
  for (int i = 0; i < ndim; i++) v->shape[i] = new_shape[i];
  slapo_shape_contiguous_strides(ndim, v->shape, v->strides);
  *out = v;
  return SLAPO_OK;
}

slapo_status slapo_tensor_permute(const slapo_tensor *t, const int *perm, slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = NULL;
  if (t->ndim > 0 && !perm) return slapo_error(SLAPO_INVALID_ARG, "permute: perm is NULL");
  bool seen[SLAPO_MAX_DIMS] = {false};
  for (int i = 0; i < t->ndim; i++) {
    if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]]) {
      char shp[160], p[160];
      int64_t p64[SLAPO_MAX_DIMS];
      for (int k = 0; k < t->ndim; k++) p64[k] = perm[k];
      return slapo_error(SLAPO_INVALID_ARG,
                         "permute: %s is not a permutation of 0..%d for shape %s",
                         slapo_shape_str(t->ndim, p64, p, sizeof p), t->ndim - 1,
                         slapo_shape_str(t->ndim, t->shape, shp, sizeof shp));
    }
    seen[perm[i]] = true;
  }
  slapo_tensor *v;
  SLAPO_TRY(slapo_tensor_view(t, &v));
  for (int i = 0; i < t->ndim; i++) {
    v->shape[i] = t->shape[perm[i]];
    v->strides[i] = t->strides[perm[i]];
  }
  *out = v;
  return SLAPO_OK;
}

/* Python's slice-index normalization: negative counts from the end, then
 * clamp to [0, n]. */
static int64_t clamp_index(int64_t i, int64_t n) {
  if (i < 0) i = i < -n ? 0 : i + n;
  return i > n ? n : i;
}

slapo_status slapo_tensor_slice(const slapo_tensor *t, int dim, int64_t start, int64_t end,
                                int64_t step, slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = NULL;
  char shp[160];
  if (dim < 0 || dim >= t->ndim)
    return slapo_error(SLAPO_INVALID_ARG, "slice: dim %d is out of range for shape %s", dim,
                       slapo_shape_str(t->ndim, t->shape, shp, sizeof shp));
  if (step < 1)
    return slapo_error(SLAPO_INVALID_ARG, "slice: step %" PRId64 " must be >= 1", step);
  int64_t n = t->shape[dim];
  start = clamp_index(start, n);
  end = clamp_index(end, n);
  int64_t len = end > start ? (end - start - 1) / step + 1 : 0;
  slapo_tensor *v;
  SLAPO_TRY(slapo_tensor_view(t, &v));
  /* An empty slice keeps the source offset so it never points past the end. */
  if (len) v->offset += start * t->strides[dim];
  v->shape[dim] = len;
  /* With len > 1, step < n, so the product cannot overflow; with len <= 1 the
   * stride is never used to step and stays as it was. */
  if (len > 1) v->strides[dim] = t->strides[dim] * step;
  *out = v;
  return SLAPO_OK;
}
