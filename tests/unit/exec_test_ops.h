/* tests/unit/exec_test_ops.h - tiny ops registered at run time for the exec
 * tests (test_exec.c, test_exec_nomem.c), so those tests depend on no op
 * group: test_add1 (x + v, reads strided inputs), test_add1c (x + v, needs
 * contiguous inputs and reads them linearly; records its input pointer),
 * test_addb (a + b), test_t (2-d transpose view), test_flat (flatten view),
 * test_fastop (x + 1 with a fast kernel that counts its calls). */
#ifndef SLAPO_TESTS_EXEC_TEST_OPS_H
#define SLAPO_TESTS_EXEC_TEST_OPS_H

#include <string.h>

#include "slapo/exec.h"

#define XT_UNUSED __attribute__((unused))

/* Last input data pointer and byte count seen by test_add1c. */
static XT_UNUSED const void *g_add1c_in;
static XT_UNUSED size_t g_add1c_in_nbytes;
/* Calls of test_fastop's fast kernel. */
static XT_UNUSED int g_fast_calls;

/* Element `linear` (row-major logical index) of a possibly strided f32 t. */
static XT_UNUSED float xt_at(const slapo_tensor *t, int64_t linear) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (linear % t->shape[d]) * t->strides[d];
    linear /= t->shape[d];
  }
  return ((const float *)slapo_tensor_data(t))[off];
}

static XT_UNUSED slapo_status xt_infer_same(slapo_node *n) {
  const slapo_node *x = n->inputs[0];
  if (x->dtype != SLAPO_DTYPE_F32)
    return slapo_error(SLAPO_DTYPE, "%s: input has dtype %s, expected f32", n->target,
                       slapo_dtype_name(x->dtype));
  return slapo_node_set_meta(n, x->dtype, x->ndim, x->shape);
}

static XT_UNUSED slapo_status xt_infer_addb(slapo_node *n) {
  const slapo_node *a = n->inputs[0], *b = n->inputs[1];
  if (!slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape))
    return slapo_error(SLAPO_SHAPE, "test_addb: shapes differ");
  return slapo_node_set_meta(n, a->dtype, a->ndim, a->shape);
}

static XT_UNUSED slapo_status xt_infer_t(slapo_node *n) {
  const slapo_node *x = n->inputs[0];
  if (x->ndim != 2) {
    char b[64];
    return slapo_error(SLAPO_SHAPE, "test_t: x %s is not 2-d",
                       slapo_shape_str(x->ndim, x->shape, b, sizeof b));
  }
  int64_t s[2] = {x->shape[1], x->shape[0]};
  return slapo_node_set_meta(n, x->dtype, 2, s);
}

static XT_UNUSED slapo_status xt_infer_flat(slapo_node *n) {
  const slapo_node *x = n->inputs[0];
  int64_t s[1] = {slapo_shape_numel(x->ndim, x->shape)};
  return slapo_node_set_meta(n, x->dtype, 1, s);
}

/* out [N] = x [N] + v, x any strides. */
static XT_UNUSED void xt_add1(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  float v = (float)slapo_node_attr_float(node, "v", 1.0);
  float *y = slapo_tensor_data(out);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) y[i] = xt_at(in[0], i) + v;
}

/* out [N] = x [N] + v with x read as a flat contiguous array. */
static XT_UNUSED void xt_add1c(const slapo_node *node, const slapo_tensor *const *in,
                               slapo_tensor *out, const slapo_kernel_env *env) {
  float v = (float)slapo_node_attr_float(node, "v", 1.0);
  const float *x = slapo_tensor_data(in[0]);
  float *y = slapo_tensor_data(out);
  g_add1c_in = x;
  g_add1c_in_nbytes = slapo_tensor_nbytes(in[0]);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) y[i] = x[i] + v;
}

/* out [N] = a [N] + b [N], any strides. */
static XT_UNUSED void xt_addb(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  float *y = slapo_tensor_data(out);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) y[i] = xt_at(in[0], i) + xt_at(in[1], i);
}

static XT_UNUSED void xt_fast(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  g_fast_calls++;
  xt_add1(node, in, out, env);
}

/* out [b, a] = view of x [a, b] with swapped strides. */
static XT_UNUSED void xt_view_t(const slapo_node *node, const slapo_tensor *const *in,
                                slapo_tensor *out) {
  out->shape[0] = in[0]->shape[1];
  out->shape[1] = in[0]->shape[0];
  out->strides[0] = in[0]->strides[1];
  out->strides[1] = in[0]->strides[0];
  out->offset = in[0]->offset;
}

/* out [N] = view of a contiguous x. */
static XT_UNUSED void xt_view_flat(const slapo_node *node, const slapo_tensor *const *in,
                                   slapo_tensor *out) {
  out->strides[0] = 1;
  out->offset = in[0]->offset;
}

static const slapo_op xt_op_add1 = {.name = "test_add1", .n_inputs = 1,
                                    .infer = xt_infer_same, .ref = xt_add1};
static const slapo_op xt_op_add1c = {.name = "test_add1c", .n_inputs = 1,
                                     .infer = xt_infer_same, .ref = xt_add1c,
                                     .contiguous_inputs = true};
static const slapo_op xt_op_addb = {.name = "test_addb", .n_inputs = 2,
                                    .infer = xt_infer_addb, .ref = xt_addb};
static const slapo_op xt_op_t = {.name = "test_t", .n_inputs = 1, .infer = xt_infer_t,
                                 .view = xt_view_t};
static const slapo_op xt_op_flat = {.name = "test_flat", .n_inputs = 1,
                                    .infer = xt_infer_flat, .view = xt_view_flat};
static const slapo_op xt_op_fast = {.name = "test_fastop", .n_inputs = 1,
                                    .infer = xt_infer_same, .ref = xt_add1, .fast = xt_fast};

/* Registers the test ops once per process (cmocka group setup). */
static XT_UNUSED int xt_register(void **state) {
  (void)state;
  const slapo_op *ops[] = {&xt_op_add1, &xt_op_add1c, &xt_op_addb,
                           &xt_op_t,    &xt_op_flat,  &xt_op_fast};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (!slapo_op_find(ops[i]->name) && slapo_op_register(ops[i]) != SLAPO_OK) return -1;
  return 0;
}

/* Shorthands over slapo_op_call. */
static XT_UNUSED slapo_node *xt_call1(slapo_ctx *ctx, const char *op, slapo_node *x, double v) {
  slapo_attr a = slapo_attr_float("v", v);
  return slapo_op_call(ctx, op, 1, &x, 1, &a);
}

static XT_UNUSED slapo_node *xt_call2(slapo_ctx *ctx, const char *op, slapo_node *a,
                                      slapo_node *b) {
  slapo_node *in[2] = {a, b};
  return slapo_op_call(ctx, op, 2, in, 0, NULL);
}

#endif
