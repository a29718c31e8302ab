/* ops/shape.c - shape and data-movement ops: reshape (a view), permute,
 * slice and its adjoint slice_backward, concat, contiguous and full, plus the
 * builders slapo_transpose and slapo_split built from them.
 * Layer: ops. Semantics follow PyTorch (view/reshape, permute, Python slice
 * clamping, torch.cat, torch.full).
 * Only reshape is a view. permute and slice copy into a fresh contiguous
 * buffer: their consumers (matmul, elementwise kernels) mostly want
 * contiguous inputs anyway, so a strided view would only move the copy into
 * the executor at a less predictable place, and a copy lets the planner end
 * the source buffer's lifetime at the permute instead of at its last view. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ops/internal.h"
#include "ops/strided.h"

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                            */
/* ------------------------------------------------------------------------ */

/* Normalizes `dim` (negative counts from the end) of x [ndim] for op `op`;
 * `what` names the argument in the message ("dim", "dim0"). */
static slapo_status norm_dim(const char *op, const char *what, int64_t dim, int ndim,
                             const int64_t *shape, int *out) {
  char xs[160];
  if (ndim == 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: x %s is 0-d and has no %s %" PRId64, op,
                       slapo_shape_str(ndim, shape, xs, sizeof xs), what, dim);
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: %s %" PRId64 " is out of range for x %s; it must be in [%d, %d]",
                       op, what, dim, slapo_shape_str(ndim, shape, xs, sizeof xs), -ndim,
                       ndim - 1);
  *out = (int)d;
  return SLAPO_OK;
}

/* Reads an ints attribute `key` holding a shape (every dim >= 0 unless
 * `allow_minus1`, which admits -1 entries for reshape to resolve). */
static slapo_status read_shape_attr(const slapo_node *node, const char *key, bool allow_minus1,
                                    int *ndim, const int64_t **shape) {
  const slapo_attr *a = slapo_node_attr(node, key);
  if (!a || a->kind != SLAPO_ATTR_INTS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %s (ints) is missing", node->target,
                       key);
  if (a->n > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s has %d dims; at most %d are supported",
                       node->target, key, a->n, SLAPO_MAX_DIMS);
  for (int i = 0; i < a->n; i++) {
    if (a->ints[i] < 0 && !(allow_minus1 && a->ints[i] == -1)) {
      char s[160];
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: %s %s has a negative dim %" PRId64 " at %d; dims must be >= 0%s",
                         node->target, key, slapo_shape_str(a->n, a->ints, s, sizeof s),
                         a->ints[i], i, allow_minus1 ? " or a single -1" : "");
    }
  }
  *ndim = a->n;
  *shape = a->ints;
  return SLAPO_OK;
}

/* Error on the ctx from a builder (not from shape inference, which
 * slapo_op_call reports): prefixes the module path like slapo_op_call. */
static slapo_status builder_fail(slapo_ctx *ctx, slapo_status s, const char *msg) {
  const char *o = slapo_ctx_origin(ctx);
  if (o[0]) return slapo_ctx_fail(ctx, s, "%s: %s", o, msg);
  return slapo_ctx_fail(ctx, s, "%s", msg);
}

/* ------------------------------------------------------------------------ */
/* reshape (view)                                                            */
/* ------------------------------------------------------------------------ */

/* Resolves attr "shape" (one dim may be -1) against x [xn] into out. */
static slapo_status reshape_resolve(const slapo_node *node, int xn, const int64_t *xshape,
                                    int *ndim, int64_t *out) {
  int n = 0;
  const int64_t *shape = NULL;
  SLAPO_TRY(read_shape_attr(node, "shape", true, &n, &shape));
  char xs[160], ts[160];
  slapo_shape_str(xn, xshape, xs, sizeof xs);
  slapo_shape_str(n, shape, ts, sizeof ts);
  int64_t numel = slapo_shape_numel(xn, xshape);
  int infer = -1;
  int64_t known = 1;
  bool overflow = false;
  for (int i = 0; i < n; i++) {
    out[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0)
        return slapo_error(SLAPO_INVALID_ARG,
                           "reshape: shape %s has more than one -1; at most one dim can be "
                           "inferred",
                           ts);
      infer = i;
    } else if (!overflow && __builtin_mul_overflow(known, shape[i], &known)) {
      overflow = true;
    }
  }
  if (infer >= 0) {
    if (overflow || known == 0 || numel % known)
      return slapo_error(SLAPO_SHAPE,
                         "reshape: cannot reshape %s (%" PRId64 " elements) to %s: the -1 dim "
                         "cannot be inferred because %" PRId64
                         " is not a multiple of the other dims' product",
                         xs, numel, ts, numel);
    out[infer] = numel / known;
  } else if (overflow || known != numel) {
    if (overflow)
      return slapo_error(SLAPO_SHAPE,
                         "reshape: cannot reshape %s (%" PRId64 " elements) to %s (more than "
                         "2^63 elements)",
                         xs, numel, ts);
    return slapo_error(SLAPO_SHAPE,
                       "reshape: cannot reshape %s (%" PRId64 " elements) to %s (%" PRId64
                       " elements); the number of elements must stay the same",
                       xs, numel, ts, known);
  }
  *ndim = n;
  return SLAPO_OK;
}

static slapo_status infer_reshape(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  int n = 0;
  int64_t shape[SLAPO_MAX_DIMS];
  SLAPO_TRY(reshape_resolve(node, x->ndim, x->shape, &n, shape));
  return slapo_node_set_meta(node, x->dtype, n, shape);
}

/* The view: y shares x's storage; x is contiguous (contiguous_inputs), so y
 * gets contiguous strides at x's offset. Storage lifetime (refcounts,
 * liveness) belongs to the executor. */
static void reshape_view(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out) {
  const slapo_tensor *x = in[0];
  SLAPO_ASSERT(slapo_tensor_is_contiguous(x));
  out->dtype = x->dtype;
  out->ndim = node->ndim;
  for (int d = 0; d < node->ndim; d++) out->shape[d] = node->shape[d];
  slapo_shape_contiguous_strides(out->ndim, out->shape, out->strides);
  out->offset = x->offset;
  out->storage = x->storage;
}

/* Copying form, for an executor that cannot make a view (x strided, e.g. a
 * bound transposed tensor) or wants a separate buffer: y gets x's elements
 * in row-major order. x [..] any strides -> y [shape] contiguous. */
static void reshape_ref(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  const slapo_tensor *x = in[0];
  slapo__strided_copy(x->ndim, x->shape, x->strides, slapo_tensor_data(x),
                      slapo_dtype_size(x->dtype), slapo_tensor_data(out));
}

static slapo_status reshape_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  const slapo_node *x = node->inputs[0];
  dx[0] = need[0] && x->dtype == SLAPO_DTYPE_F32 ? slapo_reshape(ctx, dy, x->ndim, x->shape)
                                                 : NULL;
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* permute (copy)                                                            */
/* ------------------------------------------------------------------------ */

/* Reads attr "perm" (negative entries count from the end) for x [ndim]. */
static slapo_status read_perm(const slapo_node *node, int ndim, const int64_t *shape,
                              int *perm) {
  const slapo_attr *a = slapo_node_attr(node, "perm");
  if (!a || a->kind != SLAPO_ATTR_INTS)
    return slapo_error(SLAPO_INVALID_ARG, "permute: attribute perm (ints) is missing");
  char ps[160], xs[160];
  if (a->n != ndim)
    return slapo_error(SLAPO_INVALID_ARG,
                       "permute: perm %s has %d entries but x %s has %d dims; give each dim "
                       "exactly once",
                       slapo_shape_str(a->n, a->ints, ps, sizeof ps), a->n,
                       slapo_shape_str(ndim, shape, xs, sizeof xs), ndim);
  bool seen[SLAPO_MAX_DIMS] = {false};
  for (int i = 0; i < ndim; i++) {
    int64_t p = a->ints[i] < 0 ? a->ints[i] + ndim : a->ints[i];
    if (p < 0 || p >= ndim || seen[p])
      return slapo_error(SLAPO_INVALID_ARG,
                         "permute: perm %s is not a permutation of the dims of x %s: entry %d "
                         "(%" PRId64 ") %s; give each dim in [%d, %d] exactly once",
                         slapo_shape_str(a->n, a->ints, ps, sizeof ps),
                         slapo_shape_str(ndim, shape, xs, sizeof xs), i, a->ints[i],
                         p < 0 || p >= ndim ? "is out of range" : "repeats a dim", -ndim,
                         ndim - 1);
    seen[p] = true;
    perm[i] = (int)p;
  }
  return SLAPO_OK;
}

static slapo_status infer_permute(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  int perm[SLAPO_MAX_DIMS];
  SLAPO_TRY(read_perm(node, x->ndim, x->shape, perm));
  int64_t shape[SLAPO_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[perm[i]];
  return slapo_node_set_meta(node, x->dtype, x->ndim, shape);
}

/* Source strides reading x in y's (permuted) index order. */
static void permute_strides(const slapo_node *node, const slapo_tensor *x, int64_t *st) {
  int perm[SLAPO_MAX_DIMS];
  slapo_status s = read_perm(node, x->ndim, x->shape, perm);
  SLAPO_ASSERT(s == SLAPO_OK); /* checked by infer */
  for (int i = 0; i < x->ndim; i++) st[i] = x->strides[perm[i]];
}

static void permute_ref(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS]; /* x [..] any strides, read as y [perm(shape)] */
  permute_strides(node, in[0], st);
  slapo__strided_copy_ref(out->ndim, out->shape, st, slapo_tensor_data(in[0]),
                          slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

static void permute_fast(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS];
  permute_strides(node, in[0], st);
  slapo__strided_copy(out->ndim, out->shape, st, slapo_tensor_data(in[0]),
                      slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

static slapo_status permute_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  const slapo_node *x = node->inputs[0];
  dx[0] = NULL;
  if (!need[0] || x->dtype != SLAPO_DTYPE_F32) return slapo_ctx_status(ctx);
  int perm[SLAPO_MAX_DIMS];
  slapo_status s = read_perm(node, x->ndim, x->shape, perm);
  SLAPO_ASSERT(s == SLAPO_OK);
  int64_t inv[SLAPO_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) inv[perm[i]] = i;
  dx[0] = slapo_permute(ctx, dy, x->ndim, inv);
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* slice (copy) and slice_backward                                           */
/* ------------------------------------------------------------------------ */

/* A normalized slice of one dim: elements start, start+step, ... (len). */
typedef struct slice_spec {
  int dim;
  int64_t start, len, step;
} slice_spec;

/* Python's slice-index normalization: negative counts from the end, then
 * clamp to [0, n]. */
static int64_t clamp_index(int64_t i, int64_t n) {
  if (i < 0) i = i < -n ? 0 : i + n;
  return i > n ? n : i;
}

/* Reads attrs dim, start (0), end (to the end), step (1) of a slice or
 * slice_backward node against the sliced shape [ndim]. */
static slapo_status read_slice(const slapo_node *node, int ndim, const int64_t *shape,
                               slice_spec *sp) {
  const char *op = node->target;
  int64_t step = slapo_node_attr_int(node, "step", 1);
  if (step < 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: step %" PRId64 " must be >= 1", op, step);
  SLAPO_TRY(norm_dim(op, "dim", slapo_node_attr_int(node, "dim", 0), ndim, shape, &sp->dim));
  int64_t n = shape[sp->dim];
  int64_t start = clamp_index(slapo_node_attr_int(node, "start", 0), n);
  int64_t end = clamp_index(slapo_node_attr_int(node, "end", INT64_MAX), n);
  sp->start = start;
  sp->step = step;
  sp->len = end > start ? (end - start - 1) / step + 1 : 0;
  return SLAPO_OK;
}

static slapo_status infer_slice(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  slice_spec sp = {0};
  SLAPO_TRY(read_slice(node, x->ndim, x->shape, &sp));
  int64_t shape[SLAPO_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[sp.dim] = sp.len;
  return slapo_node_set_meta(node, x->dtype, x->ndim, shape);
}

/* Source pointer and strides reading x's slice as y. */
static const void *slice_source(const slapo_node *node, const slapo_tensor *x, int64_t *st) {
  slice_spec sp = {0};
  slapo_status s = read_slice(node, x->ndim, x->shape, &sp);
  SLAPO_ASSERT(s == SLAPO_OK);
  for (int d = 0; d < x->ndim; d++) st[d] = x->strides[d];
  st[sp.dim] *= sp.step;
  const char *base = slapo_tensor_data(x);
  if (sp.len == 0) return base; /* nothing is read; keep the pointer in bounds */
  return base + (size_t)(sp.start * x->strides[sp.dim]) * slapo_dtype_size(x->dtype);
}

static void slice_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                      const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS]; /* x [..] any strides -> y [.., len, ..] */
  const void *src = slice_source(node, in[0], st);
  slapo__strided_copy_ref(out->ndim, out->shape, st, src, slapo_dtype_size(out->dtype),
                          slapo_tensor_data(out));
}

static void slice_fast(const slapo_node *node, const slapo_tensor *const *in,
                       slapo_tensor *out, const slapo_kernel_env *env) {
  int64_t st[SLAPO_MAX_DIMS];
  const void *src = slice_source(node, in[0], st);
  slapo__strided_copy(out->ndim, out->shape, st, src, slapo_dtype_size(out->dtype),
                      slapo_tensor_data(out));
}

static slapo_node *slice_backward_call(slapo_ctx *ctx, slapo_node *dy, const slapo_node *x,
                                       const slapo_node *slice) {
  slapo_attr a[5] = {slapo_attr_ints("shape", x->ndim, x->shape),
                     slapo_attr_int("dim", slapo_node_attr_int(slice, "dim", 0)),
                     slapo_attr_int("start", slapo_node_attr_int(slice, "start", 0)),
                     slapo_attr_int("end", slapo_node_attr_int(slice, "end", INT64_MAX)),
                     slapo_attr_int("step", slapo_node_attr_int(slice, "step", 1))};
  return slapo__call1(ctx, SLAPO_OP_DESC(slice_backward), dy, 5, a);
}

static slapo_status slice_grad(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                               const bool *need, slapo_node **dx) {
  const slapo_node *x = node->inputs[0];
  dx[0] = need[0] && x->dtype == SLAPO_DTYPE_F32 ? slice_backward_call(ctx, dy, x, node)
                                                 : NULL;
  return slapo_ctx_status(ctx);
}

/* slice_backward: dy [.., len, ..] -> dx [shape], zeros except the sliced
 * positions, which hold dy (the adjoint of slice). */
static slapo_status infer_slice_backward(slapo_node *node) {
  const slapo_node *dy = node->inputs[0];
  int n = 0;
  const int64_t *shape = NULL;
  SLAPO_TRY(read_shape_attr(node, "shape", false, &n, &shape));
  slice_spec sp = {0};
  SLAPO_TRY(read_slice(node, n, shape, &sp));
  int64_t want[SLAPO_MAX_DIMS];
  memcpy(want, shape, (size_t)n * sizeof *want);
  want[sp.dim] = sp.len;
  if (!slapo_shape_equal(dy->ndim, dy->shape, n, want)) {
    char ws[160], ss[160];
    return slapo_error(SLAPO_SHAPE,
                       "slice_backward: dy %s does not match the slice of dim %d of %s, "
                       "which is %s",
                       slapo__shape_of(dy), sp.dim, slapo_shape_str(n, shape, ss, sizeof ss),
                       slapo_shape_str(n, want, ws, sizeof ws));
  }
  return slapo_node_set_meta(node, dy->dtype, n, shape);
}

static void slice_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                               slapo_tensor *out, const slapo_kernel_env *env) {
  const slapo_tensor *dy = in[0]; /* dy [outer, len, inner] contiguous */
  slice_spec sp = {0};
  slapo_status s = read_slice(node, out->ndim, out->shape, &sp);
  SLAPO_ASSERT(s == SLAPO_OK);
  size_t esz = slapo_dtype_size(out->dtype);
  int64_t outer = slapo_shape_numel(sp.dim, out->shape);
  int64_t inner = slapo_shape_numel(out->ndim - sp.dim - 1, out->shape + sp.dim + 1);
  int64_t n = out->shape[sp.dim];
  const char *src = slapo_tensor_data(dy);
  char *dst = slapo_tensor_data(out); /* dx [outer, n, inner] */
  size_t row = (size_t)inner * esz;
#pragma omp parallel for num_threads(slapo__threads_for(outer * n * inner)) schedule(static)
  for (int64_t o = 0; o < outer; o++) {
    char *d = dst + (size_t)(o * n) * row;
    /* Zero the block, then place dy's rows: all-zero bytes are 0 in every
     * dtype we store. */
    memset(d, 0, (size_t)n * row);
    for (int64_t k = 0; k < sp.len; k++)
      memcpy(d + (size_t)(sp.start + k * sp.step) * row,
             src + (size_t)(o * sp.len + k) * row, row);
  }
}

static slapo_status slice_backward_grad(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                        const bool *need, slapo_node **dx) {
  /* slice_backward is linear; its adjoint is the slice itself. */
  slapo_attr a[4] = {slapo_attr_int("dim", slapo_node_attr_int(node, "dim", 0)),
                     slapo_attr_int("start", slapo_node_attr_int(node, "start", 0)),
                     slapo_attr_int("end", slapo_node_attr_int(node, "end", INT64_MAX)),
                     slapo_attr_int("step", slapo_node_attr_int(node, "step", 1))};
  bool want = need[0] && node->dtype == SLAPO_DTYPE_F32;
  dx[0] = want ? slapo__call1(ctx, SLAPO_OP_DESC(slice), dy, 4, a) : NULL;
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* concat                                                                    */
/* ------------------------------------------------------------------------ */

static slapo_status infer_concat(slapo_node *node) {
  const slapo_node *x0 = node->inputs[0];
  int dim;
  SLAPO_TRY(norm_dim("concat", "dim", slapo_node_attr_int(node, "dim", 0), x0->ndim,
                     x0->shape, &dim));
  int64_t shape[SLAPO_MAX_DIMS];
  memcpy(shape, x0->shape, sizeof shape);
  for (int i = 1; i < node->n_inputs; i++) {
    const slapo_node *x = node->inputs[i];
    if (x->dtype != x0->dtype)
      return slapo_error(SLAPO_DTYPE,
                         "concat: input 0 has dtype %s but input %d has %s; all inputs need "
                         "the same dtype",
                         slapo_dtype_name(x0->dtype), i, slapo_dtype_name(x->dtype));
    if (x->ndim != x0->ndim)
      return slapo_error(SLAPO_SHAPE,
                         "concat: input 0 %s has %d dims but input %d %s has %d; all inputs "
                         "need the same number of dims",
                         slapo__shape_of(x0), x0->ndim, i, slapo__shape_of(x), x->ndim);
    for (int d = 0; d < x0->ndim; d++) {
      if (d != dim && x->shape[d] != x0->shape[d])
        return slapo_error(SLAPO_SHAPE,
                           "concat: input 0 %s and input %d %s differ in dim %d (%" PRId64
                           " vs %" PRId64 "); inputs must match in every dim but the concat "
                           "dim %d",
                           slapo__shape_of(x0), i, slapo__shape_of(x), d, x0->shape[d],
                           x->shape[d], dim);
    }
    shape[dim] += x->shape[dim];
  }
  return slapo_node_set_meta(node, x0->dtype, x0->ndim, shape);
}

static void concat_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  int dim = (int)slapo_node_attr_int(node, "dim", 0);
  if (dim < 0) dim += out->ndim;
  size_t esz = slapo_dtype_size(out->dtype);
  int64_t outer = slapo_shape_numel(dim, out->shape);
  int64_t inner = slapo_shape_numel(out->ndim - dim - 1, out->shape + dim + 1);
  int64_t total = out->shape[dim];
  char *dst = slapo_tensor_data(out); /* y [outer, total, inner] */
  int n_in = node->n_inputs;
#pragma omp parallel for num_threads(slapo__threads_for(slapo_tensor_numel(out))) \
    schedule(static)
  for (int64_t o = 0; o < outer; o++) {
    int64_t at = 0; /* position along dim where input i starts */
    for (int i = 0; i < n_in; i++) {
      int64_t di = in[i]->shape[dim];
      const char *src = slapo_tensor_data(in[i]); /* x_i [outer, di, inner] contiguous */
      memcpy(dst + (size_t)((o * total + at) * inner) * esz,
             src + (size_t)(o * di * inner) * esz, (size_t)(di * inner) * esz);
      at += di;
    }
  }
}

static slapo_status concat_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  int dim = (int)slapo_node_attr_int(node, "dim", 0);
  if (dim < 0) dim += node->ndim;
  int64_t at = 0;
  for (int i = 0; i < node->n_inputs; i++) {
    const slapo_node *x = node->inputs[i];
    int64_t di = x->shape[dim];
    dx[i] = need[i] && x->dtype == SLAPO_DTYPE_F32 ? slapo_slice(ctx, dy, dim, at, at + di)
                                                   : NULL;
    at += di;
  }
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* contiguous                                                                */
/* ------------------------------------------------------------------------ */

static slapo_status infer_same(slapo_node *node) { return slapo__same_as_input(node, 0); }

static void contiguous_ref(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env) {
  /* x [..] any strides -> y [..] contiguous */
  slapo__strided_copy_ref(out->ndim, out->shape, in[0]->strides, slapo_tensor_data(in[0]),
                          slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

static void contiguous_fast(const slapo_node *node, const slapo_tensor *const *in,
                            slapo_tensor *out, const slapo_kernel_env *env) {
  slapo__strided_copy(out->ndim, out->shape, in[0]->strides, slapo_tensor_data(in[0]),
                      slapo_dtype_size(out->dtype), slapo_tensor_data(out));
}

static slapo_status identity_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                      const bool *need, slapo_node **dx) {
  dx[0] = need[0] && node->inputs[0]->dtype == SLAPO_DTYPE_F32 ? dy : NULL;
  return slapo_ctx_status(ctx);
}

/* ------------------------------------------------------------------------ */
/* full                                                                      */
/* ------------------------------------------------------------------------ */

static slapo_status infer_full(slapo_node *node) {
  int n = 0;
  const int64_t *shape = NULL;
  SLAPO_TRY(read_shape_attr(node, "shape", false, &n, &shape));
  const slapo_attr *v = slapo_node_attr(node, "value");
  if (!v || v->kind != SLAPO_ATTR_FLOAT)
    return slapo_error(SLAPO_INVALID_ARG, "full: attribute value (float) is missing");
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, n, shape);
}

static void full_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                     const slapo_kernel_env *env) {
  float v = (float)slapo_node_attr_float(node, "value", 0.0);
  float *y = slapo_tensor_data(out); /* y [shape] */
  int64_t n = slapo_tensor_numel(out);
#pragma omp parallel for num_threads(slapo__threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; i++) y[i] = v;
}

/* ------------------------------------------------------------------------ */
/* Examples for the table-driven tests                                       */
/* ------------------------------------------------------------------------ */

static slapo_node *reshape_example(slapo_ctx *ctx) {
  int64_t s[] = {2, 3, 4}, t[] = {4, -1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
  return slapo_reshape(ctx, x, 2, t);
}

static slapo_node *permute_example(slapo_ctx *ctx) {
  int64_t s[] = {2, 3, 4}, p[] = {2, 0, -2};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, s);
  return slapo_permute(ctx, x, 3, p);
}

static slapo_node *slice_example(slapo_ctx *ctx) {
  /* x[:, 1::2] with an end past the dim, clamped as in Python. */
  int64_t s[] = {3, 5};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_attr a[4] = {slapo_attr_int("dim", -1), slapo_attr_int("start", 1),
                     slapo_attr_int("end", 100), slapo_attr_int("step", 2)};
  return slapo__call1(ctx, SLAPO_OP_DESC(slice), x, 4, a);
}

static slapo_node *slice_backward_example(slapo_ctx *ctx) {
  int64_t s[] = {3, 2}, full[] = {3, 5};
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, s);
  slapo_attr a[5] = {slapo_attr_ints("shape", 2, full), slapo_attr_int("dim", 1),
                     slapo_attr_int("start", -4), slapo_attr_int("end", 100),
                     slapo_attr_int("step", 2)};
  return slapo__call1(ctx, SLAPO_OP_DESC(slice_backward), dy, 5, a);
}

static slapo_node *concat_example(slapo_ctx *ctx) {
  int64_t a[] = {2, 3}, b[] = {2, 1}, c[] = {2, 2};
  slapo_node *xs[3] = {slapo_input(ctx, "a", SLAPO_DTYPE_F32, 2, a),
                       slapo_input(ctx, "b", SLAPO_DTYPE_F32, 2, b),
                       slapo_input(ctx, "c", SLAPO_DTYPE_F32, 2, c)};
  return slapo_concat(ctx, 3, xs, -1);
}

static slapo_node *contiguous_example(slapo_ctx *ctx) {
  int64_t s[] = {3, 5};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  return slapo_contiguous(ctx, x);
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

SLAPO_OP_DESCRIPTOR(reshape) = {
    .name = "reshape",
    .n_inputs = 1,
    .infer = infer_reshape,
    .ref = reshape_ref,
    .view = reshape_view,
    .backward = reshape_backward,
    .contiguous_inputs = true,
    .doc = "y = x viewed with attr shape (one dim may be -1), sharing x's storage "
           "(torch.Tensor.view); any dtype",
    .test = {.example = reshape_example},
};

SLAPO_OP_DESCRIPTOR(permute) = {
    .name = "permute",
    .n_inputs = 1,
    .infer = infer_permute,
    .ref = permute_ref,
    .fast = permute_fast,
    .backward = permute_backward,
    .contiguous_inputs = false,
    .doc = "y.shape[i] = x.shape[perm[i]] (torch.permute), copied into a contiguous "
           "buffer; any dtype",
    .test = {.example = permute_example},
};

SLAPO_OP_DESCRIPTOR(slice) = {
    .name = "slice",
    .n_inputs = 1,
    .infer = infer_slice,
    .ref = slice_ref,
    .fast = slice_fast,
    .backward = slice_grad,
    .contiguous_inputs = false,
    .doc = "y = x[.., start:end:step, ..] along attr dim (Python clamping; step >= 1), "
           "copied; any dtype",
    .test = {.example = slice_example},
};

SLAPO_OP_DESCRIPTOR(slice_backward) = {
    .name = "slice_backward",
    .n_inputs = 1,
    .infer = infer_slice_backward,
    .ref = slice_backward_ref,
    .backward = slice_backward_grad,
    .contiguous_inputs = true,
    .doc = "dx [shape] = zeros with dy placed at [.., start:end:step, ..] of attr dim: "
           "the adjoint of slice (one pass, no zeros + scatter-add pair)",
    .test = {.example = slice_backward_example},
};

SLAPO_OP_DESCRIPTOR(concat) = {
    .name = "concat",
    .n_inputs = -1,
    .infer = infer_concat,
    .ref = concat_ref,
    .backward = concat_backward,
    .contiguous_inputs = true,
    .doc = "y = the inputs joined along attr dim (torch.cat); any dtype, all alike",
    .test = {.example = concat_example},
};

SLAPO_OP_DESCRIPTOR(contiguous) = {
    .name = "contiguous",
    .n_inputs = 1,
    .infer = infer_same,
    .ref = contiguous_ref,
    .fast = contiguous_fast,
    .backward = identity_backward,
    .contiguous_inputs = false,
    .doc = "y = a contiguous copy of x (torch.Tensor.contiguous, always copying)",
    .test = {.example = contiguous_example},
};

SLAPO_OP_DESCRIPTOR(full) = {
    .name = "full",
    .n_inputs = 0,
    .infer = infer_full,
    .ref = full_ref,
    .doc = "y [shape] f32 = attr value everywhere (torch.full)",
    .test = {.exempt = "constant: no inputs"},
};

/* ------------------------------------------------------------------------ */
/* Typed builders                                                            */
/* ------------------------------------------------------------------------ */

slapo_node *slapo_reshape(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *shape) {
  slapo_attr a = slapo_attr_ints("shape", ndim, shape);
  return slapo__call1(ctx, SLAPO_OP_DESC(reshape), x, 1, &a);
}

slapo_node *slapo_permute(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *perm) {
  slapo_attr a = slapo_attr_ints("perm", ndim, perm);
  return slapo__call1(ctx, SLAPO_OP_DESC(permute), x, 1, &a);
}

slapo_node *slapo_transpose(slapo_ctx *ctx, slapo_node *x, int dim0, int dim1) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  if (!x) {
    builder_fail(ctx, SLAPO_INVALID_ARG, "transpose: x is NULL");
    return NULL;
  }
  int d0, d1;
  slapo_status s = norm_dim("transpose", "dim0", dim0, x->ndim, x->shape, &d0);
  if (s == SLAPO_OK) s = norm_dim("transpose", "dim1", dim1, x->ndim, x->shape, &d1);
  if (s != SLAPO_OK) {
    builder_fail(ctx, s, slapo_last_error());
    return NULL;
  }
  int64_t perm[SLAPO_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return slapo_permute(ctx, x, x->ndim, perm);
}

slapo_node *slapo_slice(slapo_ctx *ctx, slapo_node *x, int dim, int64_t start, int64_t end) {
  slapo_attr a[4] = {slapo_attr_int("dim", dim), slapo_attr_int("start", start),
                     slapo_attr_int("end", end), slapo_attr_int("step", 1)};
  return slapo__call1(ctx, SLAPO_OP_DESC(slice), x, 4, a);
}

slapo_node *slapo_repeat_heads(slapo_ctx *ctx, slapo_node *x, int64_t g) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  if (!x || x->ndim != 4 || g < 1) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "repeat_heads: needs x [B, NKV, T, HS] and a group size >= 1, got %s and %lld",
             x ? slapo__shape_of(x) : "NULL", (long long)g);
    builder_fail(ctx, SLAPO_INVALID_ARG, msg);
    return NULL;
  }
  if (g == 1) return x;
  const int64_t *s = x->shape;
  int64_t one[5] = {s[0], s[1], 1, s[2], s[3]}, many[5] = {s[0], s[1], g, s[2], s[3]},
          out[4] = {s[0], s[1] * g, s[2], s[3]};
  slapo_node *r = slapo_broadcast_to(ctx, slapo_reshape(ctx, x, 5, one), 5, many);
  return slapo_reshape(ctx, r, 4, out);
}

slapo_status slapo_split(slapo_ctx *ctx, slapo_node *x, int dim, int n, const int64_t *sizes,
                         slapo_node **out) {
  for (int i = 0; i < n; i++) out[i] = NULL;
  if (slapo_ctx_status(ctx) != SLAPO_OK) return slapo_ctx_status(ctx);
  char msg[1024];
  if (!x) return builder_fail(ctx, SLAPO_INVALID_ARG, "split: x is NULL");
  int d;
  slapo_status s = norm_dim("split", "dim", dim, x->ndim, x->shape, &d);
  if (s != SLAPO_OK) return builder_fail(ctx, s, slapo_last_error());
  if (n < 1) {
    snprintf(msg, sizeof msg, "split: %d sizes given for x %s; give at least one", n,
             slapo__shape_of(x));
    return builder_fail(ctx, SLAPO_INVALID_ARG, msg);
  }
  int64_t total = 0;
  bool negative = false;
  for (int i = 0; i < n; i++) {
    negative |= sizes[i] < 0;
    /* A sum that overflows cannot match the dim: make it differ. */
    if (__builtin_add_overflow(total, sizes[i], &total)) negative = true;
  }
  if (negative || total != x->shape[d]) {
    char ss[256];
    int len = 0;
    ss[0] = '\0';
    for (int i = 0; i < n && len < (int)sizeof ss - 32; i++)
      len += snprintf(ss + len, sizeof ss - (size_t)len, "%s%" PRId64, i ? ", " : "",
                      sizes[i]);
    if (negative)
      snprintf(msg, sizeof msg,
               "split: sizes [%s] for x %s include a negative size (or overflow); each "
               "size must be >= 0",
               ss, slapo__shape_of(x));
    else
      snprintf(msg, sizeof msg,
               "split: sizes [%s] sum to %" PRId64 " but x %s has %" PRId64
               " along dim %d; the sizes must add up to that dim",
               ss, total, slapo__shape_of(x), x->shape[d], d);
    return builder_fail(ctx, SLAPO_SHAPE, msg);
  }
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    out[i] = slapo_slice(ctx, x, d, at, at + sizes[i]);
    at += sizes[i];
  }
  s = slapo_ctx_status(ctx);
  if (s != SLAPO_OK)
    for (int i = 0; i < n; i++) out[i] = NULL;
  return s;
}

slapo_node *slapo_concat(slapo_ctx *ctx, int n, slapo_node *const *xs, int dim) {
  slapo_attr a = slapo_attr_int("dim", dim);
  return slapo_op_apply(ctx, SLAPO_OP_DESC(concat), n, xs, 1, &a);
}

slapo_node *slapo_contiguous(slapo_ctx *ctx, slapo_node *x) {
  return slapo__call1(ctx, SLAPO_OP_DESC(contiguous), x, 0, NULL);
}

slapo_node *slapo_full(slapo_ctx *ctx, int ndim, const int64_t *shape, double value) {
  slapo_attr a[2] = {slapo_attr_ints("shape", ndim, shape), slapo_attr_float("value", value)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(full), 0, NULL, 2, a);
}
