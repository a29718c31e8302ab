/* ops/strided.c - strided gathers into contiguous buffers, the one loop
 * behind permute, slice, broadcast_to and contiguous (see ops/strided.h).
 * Layer: ops. The dim-merging rule is the one PyTorch's TensorIterator uses:
 * an outer dim folds into its inner neighbour when stride_outer ==
 * stride_inner * size_inner. */
#include <string.h>

#include "ops/internal.h"
#include "ops/strided.h"

void slapo__strided_copy_ref(int ndim, const int64_t *shape, const int64_t *strides,
                             const void *src, size_t esz, void *dst) {
  int64_t numel = slapo_shape_numel(ndim, shape);
  const char *s = src;
  char *d = dst;
  int64_t idx[SLAPO_MAX_DIMS] = {0};
  int64_t off = 0; /* element offset of idx in src */
  for (int64_t i = 0; i < numel; i++) {
    memcpy(d + (size_t)i * esz, s + (size_t)off * esz, esz);
    /* Row-major odometer: bump the last dim, carry into outer ones. */
    for (int k = ndim - 1; k >= 0; k--) {
      off += strides[k];
      if (++idx[k] < shape[k]) break;
      off -= strides[k] * shape[k];
      idx[k] = 0;
    }
  }
}

/* Copies `n` elements spaced `stride` apart in src to consecutive dst slots.
 * Constant-size memcpy compiles to plain moves and keeps strict aliasing. */
static void copy_row(char *d, const char *s, int64_t n, int64_t stride, size_t esz) {
  if (stride == 1) {
    memcpy(d, s, (size_t)n * esz);
    return;
  }
  switch (esz) {
  case 4:
    for (int64_t j = 0; j < n; j++) memcpy(d + 4 * j, s + 4 * j * stride, 4);
    break;
  case 8:
    for (int64_t j = 0; j < n; j++) memcpy(d + 8 * j, s + 8 * j * stride, 8);
    break;
  case 2:
    for (int64_t j = 0; j < n; j++) memcpy(d + 2 * j, s + 2 * j * stride, 2);
    break;
  default:
    for (int64_t j = 0; j < n; j++)
      memcpy(d + (size_t)j * esz, s + (size_t)(j * stride) * esz, esz);
    break;
  }
}

enum { TT = 32 }; /* transpose tile: TT x TT elements stay in L1 */

/* Tiled copy for a source whose innermost output dim is strided but some
 * outer output dim `c` is contiguous (a transpose, e.g. [M, N] -> [N, M]):
 * walking TT x TT tiles of (c, last) reads each source cache line once
 * instead of once per element. sz/st describe the merged dims [n]. */
static void transpose_copy(int n, const int64_t *sz, const int64_t *st, int c, const char *s,
                           size_t esz, char *d, int64_t numel) {
  int64_t dst[SLAPO_MAX_DIMS]; /* output (contiguous) strides */
  slapo_shape_contiguous_strides(n, sz, dst);
  int64_t bsz[SLAPO_MAX_DIMS], bsrc[SLAPO_MAX_DIMS], bdst[SLAPO_MAX_DIMS];
  int nb = 0; /* batch dims: all but c and the last */
  for (int k = 0; k < n - 1; k++)
    if (k != c) bsz[nb] = sz[k], bsrc[nb] = st[k], bdst[nb++] = dst[k];
  int64_t nbatch = slapo_shape_numel(nb, bsz);
  int64_t nc = sz[c], nl = sz[n - 1], S = st[n - 1], dc = dst[c];
  int64_t tc = (nc + TT - 1) / TT, tl = (nl + TT - 1) / TT;
#pragma omp parallel for num_threads(slapo__threads_for(numel)) schedule(static)
  for (int64_t t = 0; t < nbatch * tc * tl; t++) {
    int64_t b = t / (tc * tl), r = t % (tc * tl);
    int64_t c0 = (r / tl) * TT, l0 = (r % tl) * TT;
    int64_t c1 = c0 + TT < nc ? c0 + TT : nc, l1 = l0 + TT < nl ? l0 + TT : nl;
    int64_t so = 0, dof = 0, rem = b;
    for (int k = nb - 1; k >= 0; k--) {
      so += (rem % bsz[k]) * bsrc[k];
      dof += (rem % bsz[k]) * bdst[k];
      rem /= bsz[k];
    }
    for (int64_t ic = c0; ic < c1; ic++) {
      char *dp = d + (size_t)(dof + ic * dc) * esz;
      const char *sp = s + (size_t)(so + ic) * esz; /* st[c] == 1 */
      if (esz == 4) {
        for (int64_t il = l0; il < l1; il++) memcpy(dp + 4 * il, sp + 4 * il * S, 4);
      } else {
        for (int64_t il = l0; il < l1; il++)
          memcpy(dp + (size_t)il * esz, sp + (size_t)(il * S) * esz, esz);
      }
    }
  }
}

void slapo__strided_copy(int ndim, const int64_t *shape, const int64_t *strides,
                         const void *src, size_t esz, void *dst) {
  int64_t numel = slapo_shape_numel(ndim, shape);
  if (numel == 0) return;
  /* Drop size-1 dims and merge neighbours that are contiguous in src, so a
   * contiguous copy becomes one run and [B, T, NH, HS] -> [B, NH, T, HS]
   * becomes rows of HS. */
  int64_t sz[SLAPO_MAX_DIMS], st[SLAPO_MAX_DIMS];
  int n = 0;
  for (int k = 0; k < ndim; k++) {
    if (shape[k] == 1) continue;
    if (n > 0 && st[n - 1] == strides[k] * shape[k]) {
      sz[n - 1] *= shape[k];
      st[n - 1] = strides[k];
      continue;
    }
    sz[n] = shape[k];
    st[n] = strides[k];
    n++;
  }
  const char *s = src;
  char *d = dst;
  if (n == 0) {
    memcpy(d, s, esz);
    return;
  }
  int64_t inner = sz[n - 1], istride = st[n - 1];
  int64_t rows = numel / inner;
  if (istride > 1) {
    for (int c = n - 2; c >= 0; c--) {
      if (st[c] == 1) {
        transpose_copy(n, sz, st, c, s, esz, d, numel);
        return;
      }
    }
  }
  if (rows == 1) {
    /* One long run: split it into fixed chunks so that big contiguous
     * copies use every thread. */
    const int64_t chunk = 1 << 16;
    int64_t nchunks = (inner + chunk - 1) / chunk;
#pragma omp parallel for num_threads(slapo__threads_for(numel)) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
      int64_t j0 = c * chunk, len = inner - j0 < chunk ? inner - j0 : chunk;
      copy_row(d + (size_t)j0 * esz, s + (size_t)(j0 * istride) * esz, len, istride, esz);
    }
    return;
  }
#pragma omp parallel for num_threads(slapo__threads_for(numel)) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0, rem = r;
    for (int k = n - 2; k >= 0; k--) {
      off += (rem % sz[k]) * st[k];
      rem /= sz[k];
    }
    copy_row(d + (size_t)(r * inner) * esz, s + (size_t)off * esz, inner, istride, esz);
  }
}
