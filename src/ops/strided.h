/* ops/strided.h - strided element gathers shared by the data-movement ops
 * (permute, slice, broadcast_to, contiguous): copy a source described by a
 * shape and per-dim element strides (0 = broadcast) into a contiguous
 * destination. Layer: ops (internal). */
#ifndef SLAPO_OPS_STRIDED_H
#define SLAPO_OPS_STRIDED_H

#include <stddef.h>
#include <stdint.h>

/* dst[i] = src[offset(i)] for every row-major index i of `shape` [ndim], where
 * offset(i) = sum_d i_d * strides[d] in elements of `esz` bytes; strides are
 * >= 0 (0 repeats an element: broadcasting). dst is contiguous and never
 * overlaps src. The reference form walks one element at a time; the fast
 * form drops size-1 dims, merges dims that are contiguous in the source, and
 * copies whole rows (memcpy when the inner stride is 1) or, for transposes,
 * 32 x 32 tiles, in parallel. Both give the same bytes. */
void slapo__strided_copy_ref(int ndim, const int64_t *shape, const int64_t *strides,
                             const void *src, size_t esz, void *dst);
void slapo__strided_copy(int ndim, const int64_t *shape, const int64_t *strides,
                         const void *src, size_t esz, void *dst);

#endif
