/* tensor/shape.c - shape helpers: element counts, "[a, b]" formatting for
 * messages, row-major strides, equality.
 * Layer: tensor. Stride convention: PyTorch's (last dim contiguous; a dim of
 * size 0 counts as 1 so strides stay positive). */
#include <stdint.h>
#include <stdio.h>

#include "slapo/tensor.h"

int64_t slapo_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

char *slapo_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  if (!cap) return buf;
  size_t len = 0;
  buf[0] = '\0';
  /* snprintf returns the would-be length; stop appending once full. */
  for (int i = -1; i <= ndim && len < cap; i++) {
    int w;
    if (i < 0) w = snprintf(buf + len, cap - len, "[");
    else if (i == ndim) w = snprintf(buf + len, cap - len, "]");
    else w = snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (w < 0) break;
    len += (size_t)w;
  }
  return buf;
}

void slapo_shape_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i] > 1 ? shape[i] : 1;
  }
}

bool slapo_shape_addressable(int ndim, const int64_t *shape, uint64_t elem_nbytes) {
  const uint64_t lim = (uint64_t)INT64_MAX < SIZE_MAX ? (uint64_t)INT64_MAX : SIZE_MAX;
  uint64_t n = elem_nbytes ? elem_nbytes : 1;
  if (n > lim) return false;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return false;
    uint64_t d = shape[i] > 1 ? (uint64_t)shape[i] : 1;
    if (n > lim / d) return false;
    n *= d;
  }
  return true;
}

bool slapo_shape_equal(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b) {
  if (ndim_a != ndim_b) return false;
  for (int i = 0; i < ndim_a; i++)
    if (a[i] != b[i]) return false;
  return true;
}
