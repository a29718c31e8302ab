/* ops/reduce.c - reductions and broadcasting: sum and mean over axes (with
 * keepdim), sum_to (the inverse of broadcasting, used for gradients of
 * broadcast operands such as biases) and broadcast_to (materialized).
 * Layer: ops. Semantics follow NumPy/PyTorch (torch.sum, torch.mean,
 * torch.broadcast_to; sum_to as in Chainer's F.sum_to). Every output element
 * is reduced in row-major order of the reduced index space, so results are
 * the same for any thread count. */
#include <inttypes.h>
#include <string.h>

#include "ops/internal.h"
#include "ops/strided.h"

/* ------------------------------------------------------------------------ */
/* Attributes and shape inference                                            */
/* ------------------------------------------------------------------------ */

/* Reads attr "axes" of a sum/mean node against x's shape into red[] (true =
 * reduced). Negative axes count from the end; duplicates are an error. An
 * empty list reduces nothing (the sum over no axes is x itself). */
static slapo_status read_axes(const slapo_node *node, int ndim, const int64_t *shape,
                              bool *red) {
  const char *op = node->target;
  char xs[160];
  const slapo_attr *a = slapo_node_attr(node, "axes");
  if (!a || a->kind != SLAPO_ATTR_INTS)
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: attribute axes (ints) is missing; list the axes to reduce", op);
  for (int d = 0; d < ndim; d++) red[d] = false;
  for (int i = 0; i < a->n; i++) {
    int64_t ax = a->ints[i];
    int64_t d = ax < 0 ? ax + ndim : ax;
    if (d < 0 || d >= ndim || red[d]) slapo_shape_str(ndim, shape, xs, sizeof xs);
    if (ndim == 0)
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: x %s is 0-d and has no axis %" PRId64 "; pass no axes", op, xs,
                         ax);
    if (d < 0 || d >= ndim)
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: axis %" PRId64 " is out of range for x %s; axes must be in "
                         "[%d, %d]",
                         op, ax, xs, -ndim, ndim - 1);
    if (red[d])
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: axis %" PRId64 " (dim %" PRId64 ") is given twice for x %s; "
                         "list each axis once",
                         op, ax, d, xs);
    red[d] = true;
  }
  return SLAPO_OK;
}

static slapo_status read_keepdim(const slapo_node *node, bool *keepdim) {
  int64_t k = slapo_node_attr_int(node, "keepdim", 0);
  if (k != 0 && k != 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: keepdim is %" PRId64 "; it must be 0 or 1",
                       node->target, k);
  *keepdim = k == 1;
  return SLAPO_OK;
}

static slapo_status infer_reduce(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  bool red[SLAPO_MAX_DIMS], keepdim = false;
  SLAPO_TRY(read_axes(node, x->ndim, x->shape, red));
  SLAPO_TRY(read_keepdim(node, &keepdim));
  int64_t shape[SLAPO_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (!red[d]) shape[n++] = x->shape[d];
    else if (keepdim) shape[n++] = 1;
  }
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, n, shape);
}

/* Reads an ints attribute `key` holding a shape; every dim >= 0. */
static slapo_status read_shape_attr(const slapo_node *node, const char *key, int *ndim,
                                    const int64_t **shape) {
  const slapo_attr *a = slapo_node_attr(node, key);
  if (!a || a->kind != SLAPO_ATTR_INTS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %s (ints) is missing", node->target,
                       key);
  if (a->n > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s has %d dims; at most %d are supported",
                       node->target, key, a->n, SLAPO_MAX_DIMS);
  for (int i = 0; i < a->n; i++) {
    if (a->ints[i] < 0) {
      char s[160];
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s %s has a negative dim %d (%" PRId64 ")",
                         node->target, key, slapo_shape_str(a->n, a->ints, s, sizeof s), i,
                         a->ints[i]);
    }
  }
  *ndim = a->n;
  *shape = a->ints;
  return SLAPO_OK;
}

/* For sum_to: which dims of x [xn] are summed to reach target [tn]. */
static slapo_status sum_to_axes(const char *op, int xn, const int64_t *xshape, int tn,
                                const int64_t *tshape, bool *red) {
  char xs[160], ts[160];
  if (tn > xn)
    return slapo_error(SLAPO_SHAPE,
                       "%s: cannot sum x %s to %s: the target has more dims (%d) than x (%d)",
                       op, slapo_shape_str(xn, xshape, xs, sizeof xs),
                       slapo_shape_str(tn, tshape, ts, sizeof ts), tn, xn);
  int lead = xn - tn;
  for (int d = 0; d < xn; d++) {
    if (d < lead) {
      red[d] = true;
      continue;
    }
    int64_t t = tshape[d - lead];
    if (t != xshape[d] && t != 1)
      return slapo_error(SLAPO_SHAPE,
                         "%s: cannot sum x %s to %s: dim %d is %" PRId64 " in x but %" PRId64
                         " in the target; each target dim must equal x's or be 1",
                         op, slapo_shape_str(xn, xshape, xs, sizeof xs),
                         slapo_shape_str(tn, tshape, ts, sizeof ts), d - xn, xshape[d], t);
    red[d] = t == 1 && xshape[d] != 1;
  }
  return SLAPO_OK;
}

static slapo_status infer_sum_to(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  int tn = 0;
  const int64_t *ts = NULL;
  SLAPO_TRY(read_shape_attr(node, "shape", &tn, &ts));
  bool red[SLAPO_MAX_DIMS];
  SLAPO_TRY(sum_to_axes(node->target, x->ndim, x->shape, tn, ts, red));
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, tn, ts);
}

/* For broadcast_to: x [xn] must broadcast to the target [tn] (x's dims,
 * aligned right, equal the target's or are 1). */
static slapo_status broadcast_check(const char *op, int xn, const int64_t *xshape, int tn,
                                    const int64_t *tshape) {
  char xs[160], ts[160];
  if (xn > tn)
    return slapo_error(SLAPO_SHAPE,
                       "%s: cannot broadcast x %s to %s: x has more dims (%d) than the "
                       "target (%d)",
                       op, slapo_shape_str(xn, xshape, xs, sizeof xs),
                       slapo_shape_str(tn, tshape, ts, sizeof ts), xn, tn);
  for (int d = 0; d < xn; d++) {
    int64_t xd = xshape[d], td = tshape[tn - xn + d];
    if (xd != td && xd != 1)
      return slapo_error(SLAPO_SHAPE,
                         "%s: cannot broadcast x %s to %s: dim %d is %" PRId64
                         " in x but %" PRId64 " in the target; each x dim must equal the "
                         "target's or be 1",
                         op, slapo_shape_str(xn, xshape, xs, sizeof xs),
                         slapo_shape_str(tn, tshape, ts, sizeof ts), d - xn, xd, td);
  }
  return SLAPO_OK;
}

static slapo_status infer_broadcast_to(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  int tn = 0;
  const int64_t *ts = NULL;
  SLAPO_TRY(read_shape_attr(node, "shape", &tn, &ts));
  SLAPO_TRY(broadcast_check(node->target, x->ndim, x->shape, tn, ts));
  return slapo_node_set_meta(node, x->dtype, tn, ts);
}

/* ------------------------------------------------------------------------ */
/* Reduction kernels                                                         */
/* ------------------------------------------------------------------------ */

/* Element offset of row-major position `pos` in a space of `n` dims. */
static int64_t offset_of(int64_t pos, int n, const int64_t *size, const int64_t *stride) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    off += (pos % size[d]) * stride[d];
    pos /= size[d];
  }
  return off;
}

/* Row-major walk over a space of `n` dims, tracking the element offset. */
typedef struct odometer {
  int n;
  const int64_t *size, *stride;
  int64_t idx[SLAPO_MAX_DIMS];
  int64_t off;
} odometer;

static void odo_seek(odometer *o, int n, const int64_t *size, const int64_t *stride,
                     int64_t pos) {
  o->n = n;
  o->size = size;
  o->stride = stride;
  o->off = 0;
  for (int d = n - 1; d >= 0; d--) {
    o->idx[d] = pos % size[d];
    o->off += o->idx[d] * stride[d];
    pos /= size[d];
  }
}

static inline void odo_next(odometer *o) {
  for (int d = o->n - 1; d >= 0; d--) {
    o->off += o->stride[d];
    if (++o->idx[d] < o->size[d]) return;
    o->off -= o->stride[d] * o->size[d];
    o->idx[d] = 0;
  }
}

/* Reference: y[o] = sum of x over the reduced dims / div, one output per
 * iteration, the reduced positions in row-major order, double accumulator.
 * x [shape] contiguous; y [kept dims of shape] contiguous. */
static void reduce_ref(const float *x, int ndim, const int64_t *shape, const bool *red,
                       double div, float *y) {
  int64_t xst[SLAPO_MAX_DIMS];
  slapo_shape_contiguous_strides(ndim, shape, xst);
  int64_t ks[SLAPO_MAX_DIMS], kst[SLAPO_MAX_DIMS], rs[SLAPO_MAX_DIMS], rst[SLAPO_MAX_DIMS];
  int nk = 0, nr = 0;
  for (int d = 0; d < ndim; d++) {
    if (red[d]) rs[nr] = shape[d], rst[nr++] = xst[d];
    else ks[nk] = shape[d], kst[nk++] = xst[d];
  }
  int64_t nout = slapo_shape_numel(nk, ks), nred = slapo_shape_numel(nr, rs);
#pragma omp parallel for num_threads(slapo__threads_for(nout * nred)) schedule(static)
  for (int64_t o = 0; o < nout; o++) {
    int64_t base = offset_of(o, nk, ks, kst);
    double acc = 0.0;
    for (int64_t r = 0; r < nred; r++) acc += x[base + offset_of(r, nr, rs, rst)];
    y[o] = (float)(acc / div);
  }
}

/* Sum of a contiguous run p [n] with 8 double lanes (vectorizes). */
static double run_sum(const float *p, int64_t n) {
  double l[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) l[j] += p[i + j];
  for (; i < n; i++) l[i & 7] += p[i];
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

enum { TILE = 64,        /* least columns per task in column sums           */
       MAX_STRIP = 1024, /* most (doubles: 8 KiB of accumulators, in L1)    */
       MAX_BLOCKS = 64,  /* row blocks of a narrow column sum               */
       MAX_CHUNKS = 256 }; /* chunks of a full reduction                     */

/* Last (coalesced) dim reduced: each output sums runs of L contiguous
 * values, one run per position of the outer reduced dims. */
static void reduce_rows(const float *x, int64_t L, int nk, const int64_t *ks,
                        const int64_t *kst, int nr, const int64_t *rs, const int64_t *rst,
                        double div, float *y) {
  int64_t nout = slapo_shape_numel(nk, ks), nro = slapo_shape_numel(nr, rs);
  if (nout == 1 && nro == 1) {
    /* Everything reduced into one value: fixed chunks (their number depends
     * only on L, not on the thread count), partial sums added in order. */
    int64_t chunk = (L + MAX_CHUNKS - 1) / MAX_CHUNKS;
    if (chunk < 8192) chunk = 8192;
    int64_t nc = (L + chunk - 1) / chunk;
    double part[MAX_CHUNKS];
#pragma omp parallel for num_threads(slapo__threads_for(L)) schedule(static)
    for (int64_t c = 0; c < nc; c++) {
      int64_t j0 = c * chunk;
      part[c] = run_sum(x + j0, L - j0 < chunk ? L - j0 : chunk);
    }
    double acc = 0.0;
    for (int64_t c = 0; c < nc; c++) acc += part[c];
    y[0] = (float)(acc / div);
    return;
  }
#pragma omp parallel for num_threads(slapo__threads_for(nout * nro * L)) schedule(static)
  for (int64_t o = 0; o < nout; o++) {
    int64_t base = offset_of(o, nk, ks, kst);
    odometer it;
    odo_seek(&it, nr, rs, rst, 0);
    double acc = 0.0;
    for (int64_t r = 0; r < nro; r++, odo_next(&it)) acc += run_sum(x + base + it.off, L);
    y[o] = (float)(acc / div);
  }
}

/* Last (coalesced) dim kept, K wide: column sums. Each task owns a strip
 * of columns of one outer output and walks the reduced rows in order, so
 * the result equals reduce_ref bit for bit. This is the bias-gradient case
 * (dy [B*T, C] -> [C]). */
static void reduce_cols(const float *x, int64_t K, int nk, const int64_t *ks,
                        const int64_t *kst, int nr, const int64_t *rs, const int64_t *rst,
                        double div, float *y) {
  int64_t nko = slapo_shape_numel(nk, ks), nro = slapo_shape_numel(nr, rs);
  int64_t ntiles = (K + TILE - 1) / TILE, ntasks = nko * ntiles;
  int64_t work = nko * nro * K;
  if (ntasks == 1 && nro >= 2 * 256 && work >= 32768) {
    /* Narrow and tall ([N, 3]): one task would leave the other threads
     * idle, so split the rows into a fixed number of blocks (a function of
     * the shape only) and add the block sums in order. */
    int64_t nb = nro / 256 < MAX_BLOCKS ? nro / 256 : MAX_BLOCKS;
    int64_t brows = (nro + nb - 1) / nb;
    nb = (nro + brows - 1) / brows;
    double part[MAX_BLOCKS][TILE];
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
      double *acc = part[b];
      for (int64_t k = 0; k < K; k++) acc[k] = 0.0;
      int64_t r0 = b * brows, r1 = r0 + brows < nro ? r0 + brows : nro;
      odometer it;
      odo_seek(&it, nr, rs, rst, r0);
      for (int64_t r = r0; r < r1; r++, odo_next(&it)) {
        const float *p = x + it.off;
        for (int64_t k = 0; k < K; k++) acc[k] += p[k];
      }
    }
    for (int64_t k = 0; k < K; k++) {
      double acc = 0.0;
      for (int64_t b = 0; b < nb; b++) acc += part[b][k];
      y[k] = (float)(acc / div);
    }
    return;
  }
  /* Strips as wide as the threads allow (up to MAX_STRIP columns): a wide
   * strip reads each row as one long run the hardware prefetcher follows,
   * where a 64-column tile read 256 bytes a row, a page apart, and waited
   * on memory at every row. The width changes only which task sums a
   * column, never the order of its sum. */
  int nthr = slapo__threads_for(work);
  int64_t tile = TILE;
  if (nko == 1) {
    /* A whole number of strips per thread, each at most MAX_STRIP wide. */
    int64_t nstrips = nthr * ((K + (int64_t)nthr * MAX_STRIP - 1) / ((int64_t)nthr * MAX_STRIP));
    tile = ((K + nstrips - 1) / nstrips + 15) / 16 * 16;
    if (tile < TILE) tile = TILE;
  }
  ntiles = (K + tile - 1) / tile, ntasks = nko * ntiles;
#pragma omp parallel for num_threads(nthr) schedule(static)
  for (int64_t t = 0; t < ntasks; t++) {
    int64_t ok = t / ntiles, k0 = (t % ntiles) * tile;
    int64_t w = K - k0 < tile ? K - k0 : tile;
    int64_t base = offset_of(ok, nk, ks, kst) + k0;
    double acc[MAX_STRIP];
    for (int64_t j = 0; j < w; j++) acc[j] = 0.0; /* only the strip's, not 8 KiB a task */
    odometer it;
    odo_seek(&it, nr, rs, rst, 0);
    int64_t r = 0;
    /* Four rows per pass: each accumulator is loaded and stored once per
     * four adds, and the adds stay in row order (bitwise equal to ref). */
    for (; r + 4 <= nro; r += 4) {
      const float *p0 = x + base + it.off;
      odo_next(&it);
      const float *p1 = x + base + it.off;
      odo_next(&it);
      const float *p2 = x + base + it.off;
      odo_next(&it);
      const float *p3 = x + base + it.off;
      odo_next(&it);
      for (int64_t j = 0; j < w; j++) {
        double a = acc[j];
        a += p0[j];
        a += p1[j];
        a += p2[j];
        a += p3[j];
        acc[j] = a;
      }
    }
    for (; r < nro; r++, odo_next(&it)) {
      const float *p = x + base + it.off;
      for (int64_t j = 0; j < w; j++) acc[j] += p[j];
    }
    float *q = y + ok * K + k0;
    for (int64_t j = 0; j < w; j++) q[j] = (float)(acc[j] / div);
  }
}

/* Fast reduction: drop size-1 dims and merge neighbours with the same role
 * (x is contiguous), then dispatch on whether the innermost dim is reduced.
 * Shapes as in reduce_ref. */
static void reduce_fast(const float *x, int ndim, const int64_t *shape, const bool *red,
                        double div, float *y) {
  int64_t nout = 1;
  for (int d = 0; d < ndim; d++)
    if (!red[d]) nout *= shape[d];
  if (slapo_shape_numel(ndim, shape) == 0) {
    /* Empty reductions: sum 0, mean 0/0 = NaN, as in PyTorch. */
    float v = (float)(0.0 / div);
    for (int64_t o = 0; o < nout; o++) y[o] = v;
    return;
  }
  int64_t sz[SLAPO_MAX_DIMS];
  bool rd[SLAPO_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    if (n > 0 && rd[n - 1] == red[d]) {
      sz[n - 1] *= shape[d];
    } else {
      sz[n] = shape[d];
      rd[n++] = red[d];
    }
  }
  if (n == 0) {
    y[0] = (float)(x[0] / div);
    return;
  }
  int64_t st[SLAPO_MAX_DIMS];
  slapo_shape_contiguous_strides(n, sz, st);
  int64_t ks[SLAPO_MAX_DIMS], kst[SLAPO_MAX_DIMS], rs[SLAPO_MAX_DIMS], rst[SLAPO_MAX_DIMS];
  int nk = 0, nr = 0;
  for (int d = 0; d < n - 1; d++) {
    if (rd[d]) rs[nr] = sz[d], rst[nr++] = st[d];
    else ks[nk] = sz[d], kst[nk++] = st[d];
  }
  if (rd[n - 1]) reduce_rows(x, sz[n - 1], nk, ks, kst, nr, rs, rst, div, y);
  else reduce_cols(x, sz[n - 1], nk, ks, kst, nr, rs, rst, div, y);
}

/* Count of reduced elements (the mean's divisor). */
static double reduced_count(int ndim, const int64_t *shape, const bool *red) {
  double c = 1.0;
  for (int d = 0; d < ndim; d++)
    if (red[d]) c *= (double)shape[d];
  return c;
}

static void run_reduce(const slapo_node *node, const slapo_tensor *x, slapo_tensor *out,
                       bool mean, bool fast) {
  bool red[SLAPO_MAX_DIMS];
  slapo_status s = read_axes(node, x->ndim, x->shape, red);
  SLAPO_ASSERT(s == SLAPO_OK); /* checked by infer */
  double div = mean ? reduced_count(x->ndim, x->shape, red) : 1.0;
  const float *xp = slapo_tensor_data(x); /* x [..] contiguous */
  float *yp = slapo_tensor_data(out);     /* y [kept dims] */
  if (fast) reduce_fast(xp, x->ndim, x->shape, red, div, yp);
  else reduce_ref(xp, x->ndim, x->shape, red, div, yp);
}

static void sum_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                    const slapo_kernel_env *env) {
  run_reduce(node, in[0], out, false, false);
}
static void sum_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                     const slapo_kernel_env *env) {
  run_reduce(node, in[0], out, false, true);
}
static void mean_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                     const slapo_kernel_env *env) {
  run_reduce(node, in[0], out, true, false);
}
static void mean_fast(const slapo_node *node, const slapo_tensor *const *in,
                      slapo_tensor *out, const slapo_kernel_env *env) {
  run_reduce(node, in[0], out, true, true);
}

static void run_sum_to(const slapo_node *node, const slapo_tensor *x, slapo_tensor *out,
                       bool fast) {
  bool red[SLAPO_MAX_DIMS];
  slapo_status s = sum_to_axes(node->target, x->ndim, x->shape, out->ndim, out->shape, red);
  SLAPO_ASSERT(s == SLAPO_OK);
  /* The kept dims of x, in order, have the target's layout: the dropped
   * leading dims and the summed dims are all size 1 (or absent) there. */
  const float *xp = slapo_tensor_data(x); /* x [..] contiguous */
  float *yp = slapo_tensor_data(out);     /* y [target] */
  if (fast) reduce_fast(xp, x->ndim, x->shape, red, 1.0, yp);
  else reduce_ref(xp, x->ndim, x->shape, red, 1.0, yp);
}

static void sum_to_ref(const slapo_node *node, const slapo_tensor *const *in,
                       slapo_tensor *out, const slapo_kernel_env *env) {
  run_sum_to(node, in[0], out, false);
}
static void sum_to_fast(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  run_sum_to(node, in[0], out, true);
}

/* Source strides reading x as out's shape (0 along broadcast dims). */
static void broadcast_source_strides(const slapo_tensor *x, const slapo_tensor *out,
                                     int64_t *strides) {
  int lead = out->ndim - x->ndim;
  for (int d = 0; d < out->ndim; d++) {
    int k = d - lead;
    strides[d] = (k < 0 || x->shape[k] == 1) ? 0 : x->strides[k];
  }
}

static void broadcast_to_ref(const slapo_node *node, const slapo_tensor *const *in,
                             slapo_tensor *out, const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS];
  broadcast_source_strides(in[0], out, st); /* x [..] any strides -> out [shape] */
  slapo__strided_copy_ref(out->ndim, out->shape, st, slapo_tensor_data(in[0]),
                          slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

static void broadcast_to_fast(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS];
  broadcast_source_strides(in[0], out, st);
  slapo__strided_copy(out->ndim, out->shape, st, slapo_tensor_data(in[0]),
                      slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

/* ------------------------------------------------------------------------ */
/* Backward rules                                                            */
/* ------------------------------------------------------------------------ */

/* d(sum)/dx: dy reshaped to the keepdim form, scaled (mean), broadcast back
 * to x's shape. The scale is applied before broadcasting, on the small dy. */
static slapo_node *expand_grad(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, bool mean) {
  const slapo_node *x = node->inputs[0];
  bool red[SLAPO_MAX_DIMS], keepdim = false;
  slapo_status s = read_axes(node, x->ndim, x->shape, red);
  if (s == SLAPO_OK) s = read_keepdim(node, &keepdim);
  SLAPO_ASSERT(s == SLAPO_OK); /* checked by infer */
  int64_t kshape[SLAPO_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) kshape[d] = red[d] ? 1 : x->shape[d];
  slapo_node *g = dy;
  if (!slapo_shape_equal(g->ndim, g->shape, x->ndim, kshape))
    g = slapo_reshape(ctx, g, x->ndim, kshape);
  if (mean) {
    double count = reduced_count(x->ndim, x->shape, red);
    if (count != 1.0) g = slapo_mul_scalar(ctx, g, 1.0 / count);
  }
  if (g && !slapo_shape_equal(g->ndim, g->shape, x->ndim, x->shape))
    g = slapo_broadcast_to(ctx, g, x->ndim, x->shape);
  return g;
}

static slapo_status sum_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  dx[0] = need[0] ? expand_grad(ctx, node, dy, false) : NULL;
  return slapo_ctx_status(ctx);
}

static slapo_status mean_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                  const bool *need, slapo_node **dx) {
  dx[0] = need[0] ? expand_grad(ctx, node, dy, true) : NULL;
  return slapo_ctx_status(ctx);
}

static slapo_status sum_to_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  const slapo_node *x = node->inputs[0];
  dx[0] = need[0] ? slapo_broadcast_to(ctx, dy, x->ndim, x->shape) : NULL;
  return slapo_ctx_status(ctx);
}

static slapo_status broadcast_to_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                          const bool *need, slapo_node **dx) {
  dx[0] = need[0] && node->dtype == SLAPO_DTYPE_F32 ? slapo__grad_to(ctx, dy, node->inputs[0])
                                                    : NULL;
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* Examples for the table-driven tests                                       */
/* ------------------------------------------------------------------------ */

static slapo_node *sum_example(slapo_ctx *ctx) {
  int64_t s[] = {2, 3, 4}, axes[] = {0, -1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
  return slapo_sum(ctx, x, 2, axes, false);
}

static slapo_node *mean_example(slapo_ctx *ctx) {
  int64_t s[] = {3, 5, 2}, axes[] = {1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
  return slapo_mean(ctx, x, 1, axes, true);
}

static slapo_node *sum_to_example(slapo_ctx *ctx) {
  int64_t s[] = {2, 3, 4}, t[] = {3, 1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
  return slapo_sum_to(ctx, x, 2, t);
}

static slapo_node *broadcast_to_example(slapo_ctx *ctx) {
  int64_t s[] = {3, 1}, t[] = {2, 3, 4};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  return slapo_broadcast_to(ctx, x, 3, t);
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

SLAPO_OP_DESCRIPTOR(sum) = {
    .name = "sum",
    .n_inputs = 1,
    .infer = infer_reduce,
    .ref = sum_ref,
    .fast = sum_fast,
    .backward = sum_backward,
    .contiguous_inputs = true,
    .doc = "y = sum of x over attr axes (ints, negative from the end; keepdim 0/1), "
           "as torch.sum",
    .test = {.example = sum_example},
};

SLAPO_OP_DESCRIPTOR(mean) = {
    .name = "mean",
    .n_inputs = 1,
    .infer = infer_reduce,
    .ref = mean_ref,
    .fast = mean_fast,
    .backward = mean_backward,
    .contiguous_inputs = true,
    .doc = "y = mean of x over attr axes (ints; keepdim 0/1), as torch.mean; "
           "an empty reduction gives NaN",
    .test = {.example = mean_example},
};

SLAPO_OP_DESCRIPTOR(sum_to) = {
    .name = "sum_to",
    .n_inputs = 1,
    .infer = infer_sum_to,
    .ref = sum_to_ref,
    .fast = sum_to_fast,
    .backward = sum_to_backward,
    .contiguous_inputs = true,
    .doc = "y [shape] = x summed over its extra leading dims and the dims where attr "
           "shape is 1: the adjoint of broadcasting (Chainer F.sum_to)",
    .test = {.example = sum_to_example},
};

SLAPO_OP_DESCRIPTOR(broadcast_to) = {
    .name = "broadcast_to",
    .n_inputs = 1,
    .infer = infer_broadcast_to,
    .ref = broadcast_to_ref,
    .fast = broadcast_to_fast,
    .backward = broadcast_to_backward,
    .contiguous_inputs = false,
    .doc = "y [shape] = x broadcast NumPy-style to attr shape, materialized "
           "(torch.broadcast_to(...).contiguous()); any dtype",
    .test = {.example = broadcast_to_example},
};

/* ------------------------------------------------------------------------ */
/* Typed builders                                                            */
/* ------------------------------------------------------------------------ */

static slapo_node *reduce_call(slapo_ctx *ctx, const slapo_op *op, slapo_node *x, int n_axes,
                               const int64_t *axes, bool keepdim) {
  slapo_attr a[2] = {slapo_attr_ints("axes", n_axes, axes),
                     slapo_attr_int("keepdim", keepdim ? 1 : 0)};
  return slapo__call1(ctx, op, x, 2, a);
}

slapo_node *slapo_sum(slapo_ctx *ctx, slapo_node *x, int n_axes, const int64_t *axes,
                      bool keepdim) {
  return reduce_call(ctx, SLAPO_OP_DESC(sum), x, n_axes, axes, keepdim);
}

slapo_node *slapo_mean(slapo_ctx *ctx, slapo_node *x, int n_axes, const int64_t *axes,
                       bool keepdim) {
  return reduce_call(ctx, SLAPO_OP_DESC(mean), x, n_axes, axes, keepdim);
}

slapo_node *slapo_sum_to(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *shape) {
  slapo_attr a = slapo_attr_ints("shape", ndim, shape);
  return slapo__call1(ctx, SLAPO_OP_DESC(sum_to), x, 1, &a);
}

slapo_node *slapo_broadcast_to(slapo_ctx *ctx, slapo_node *x, int ndim,
                               const int64_t *shape) {
  slapo_attr a = slapo_attr_ints("shape", ndim, shape);
  return slapo__call1(ctx, SLAPO_OP_DESC(broadcast_to), x, 1, &a);
}
