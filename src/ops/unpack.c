/* ops/unpack.c - unpack: one piece of a flat packed buffer, as a view. A
 * fused op's backward (compiler/) writes every input gradient into one
 * packed output, since a node has one value; unpack reads each gradient back
 * without a copy. Layer: ops.
 *   y [shape] = x[offset : offset + numel(shape)], x [N] contiguous f32. */
#include <string.h>

#include "ops/internal.h"

static slapo_status infer_unpack(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  const slapo_attr *sh = slapo_node_attr(node, "shape");
  int64_t off = slapo_node_attr_int(node, "offset", -1);
  if (x->ndim != 1 || x->dtype != SLAPO_DTYPE_F32)
    return slapo_error(SLAPO_SHAPE, "unpack: x %s %s must be a flat f32 buffer",
                       slapo_dtype_name(x->dtype), slapo__shape_of(x));
  if (!sh || sh->kind != SLAPO_ATTR_INTS || sh->n > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "unpack: needs an ints attribute 'shape'");
  int64_t n = 1;
  for (int i = 0; i < sh->n; i++) {
    if (sh->ints[i] < 0)
      return slapo_error(SLAPO_INVALID_ARG, "unpack: negative dim %lld", (long long)sh->ints[i]);
    n *= sh->ints[i];
  }
  if (off < 0 || off + n > x->shape[0])
    return slapo_error(SLAPO_SHAPE, "unpack: [%lld, %lld) is outside x [%lld]", (long long)off,
                       (long long)(off + n), (long long)x->shape[0]);
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, sh->n, sh->ints);
}

static void unpack_view(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out) {
  const slapo_tensor *x = in[0];
  out->dtype = x->dtype;
  out->ndim = node->ndim;
  memcpy(out->shape, node->shape, sizeof out->shape);
  slapo_shape_contiguous_strides(out->ndim, out->shape, out->strides);
  out->offset = x->offset + slapo_node_attr_int(node, "offset", 0);
  out->storage = x->storage;
}

/* Copying form (the executor's choice when it wants its own buffer). */
static void unpack_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* [N] */
  memcpy(slapo_tensor_data(out), x + slapo_node_attr_int(node, "offset", 0),
         slapo_tensor_nbytes(out));
}

/* dx [N]: zeros with dy at [offset, offset + numel). */
static slapo_status unpack_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  if (!need[0]) return slapo_ctx_status(ctx);
  int64_t n = 1, off = slapo_node_attr_int(node, "offset", 0);
  for (int i = 0; i < node->ndim; i++) n *= node->shape[i];
  slapo_node *flat = slapo_reshape(ctx, dy, 1, &n);
  slapo_attr a[5] = {slapo_attr_ints("shape", 1, node->inputs[0]->shape),
                     slapo_attr_int("dim", 0), slapo_attr_int("start", off),
                     slapo_attr_int("end", off + n), slapo_attr_int("step", 1)};
  dx[0] = slapo__call1(ctx, SLAPO_OP_DESC(slice_backward), flat, 5, a);
  return slapo_ctx_status(ctx);
}

static slapo_node *unpack_example(slapo_ctx *ctx) {
  int64_t n = 20, s[2] = {3, 4};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_attr a[2] = {slapo_attr_int("offset", 5), slapo_attr_ints("shape", 2, s)};
  return slapo__call1(ctx, SLAPO_OP_DESC(unpack), x, 2, a);
}

SLAPO_OP_DESCRIPTOR(unpack) = {
    .name = "unpack",
    .n_inputs = 1,
    .infer = infer_unpack,
    .ref = unpack_ref,
    .view = unpack_view,
    .backward = unpack_backward,
    .contiguous_inputs = true,
    .doc = "y [shape] = x[offset : offset + numel(shape)] of a flat f32 x, a view (a "
           "fused op's packed gradients)",
    .test = {.example = unpack_example},
};
