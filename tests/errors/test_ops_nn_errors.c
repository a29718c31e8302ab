/* tests/errors/test_ops_nn_errors.c - nn op calls that must fail at build
 * time with a given status and a message naming the op, the shapes, the rule
 * and the fix; a failed call leaves the graph clean and the error sticky. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "slapo/ops.h"

typedef struct fx {
  slapo_graph *g;
  slapo_ctx *ctx;
  int n_nodes; /* after the inputs were declared */
} fx;

static fx fx_new(void) {
  fx f;
  assert_int_equal(slapo_graph_new(&f.g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(f.g, &f.ctx), SLAPO_OK);
  f.n_nodes = 0;
  return f;
}

static slapo_node *in(fx *f, const char *name, slapo_dtype dt, int ndim, const int64_t *shape) {
  slapo_node *n = slapo_input(f->ctx, name, dt, ndim, shape);
  assert_non_null(n);
  f->n_nodes = slapo_graph_count(f->g);
  return n;
}

/* Checks that the call returned NULL with status `s` and a message that
 * contains every one of the NULL-terminated fragments; then that the graph
 * kept only the inputs and that later calls fail fast. */
static void expect(fx *f, slapo_node *result, slapo_status s, ...) {
  assert_null(result);
  assert_int_equal(slapo_ctx_status(f->ctx), s);
  const char *msg = slapo_ctx_message(f->ctx);
  assert_string_equal(slapo_last_error(), msg);
  va_list ap;
  va_start(ap, s);
  for (const char *frag; (frag = va_arg(ap, const char *));)
    if (!strstr(msg, frag)) fail_msg("message \"%s\" lacks \"%s\"", msg, frag);
  va_end(ap);
  assert_int_equal(slapo_graph_count(f->g), f->n_nodes);
  assert_int_equal(slapo_graph_lint(f->g), SLAPO_OK);
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
}

static const int64_t s23[2] = {2, 3}, s35[2] = {3, 5}, s4[1] = {4}, s3[1] = {3}, s5[1] = {5};

static void test_layer_norm_weight_shape(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23);
  slapo_node *w = in(&f, "w", SLAPO_DTYPE_F32, 1, s4), *b = in(&f, "b", SLAPO_DTYPE_F32, 1, s3);
  expect(&f, slapo_layer_norm(f.ctx, x, w, b, 1e-5), SLAPO_SHAPE, "layer_norm", "weight [4]",
         "x [2, 3]", "expected [3]", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23);
  w = in(&f, "w", SLAPO_DTYPE_F32, 1, s3), b = in(&f, "b", SLAPO_DTYPE_F32, 2, s23);
  expect(&f, slapo_layer_norm(f.ctx, x, w, b, 1e-5), SLAPO_SHAPE, "bias [2, 3]", "expected [3]",
         NULL);
}

static void test_layer_norm_arity_and_attrs(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23), *w = in(&f, "w", SLAPO_DTYPE_F32, 1, s3);
  expect(&f, slapo_layer_norm(f.ctx, x, w, NULL, 1e-5), SLAPO_INVALID_ARG, "layer_norm",
         "weight is given but bias is NULL", "pass both or neither", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23), w = in(&f, "w", SLAPO_DTYPE_F32, 1, s3);
  slapo_node *xw[2] = {x, w};
  expect(&f, slapo_op_call(f.ctx, "layer_norm", 2, xw, 0, NULL), SLAPO_INVALID_ARG,
         "layer_norm: expects 1 input (x) or 3 (x, weight, bias), got 2", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23);
  expect(&f, slapo_layer_norm(f.ctx, x, NULL, NULL, -1.0), SLAPO_INVALID_ARG, "layer_norm",
         "eps = -1", ">= 0", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_I32, 2, s23);
  expect(&f, slapo_layer_norm(f.ctx, x, NULL, NULL, 1e-5), SLAPO_DTYPE, "layer_norm",
         "dtype i32, expected f32", NULL);
}

static void test_layer_norm_message_has_module_path(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23);
  slapo_node *w = in(&f, "w", SLAPO_DTYPE_F32, 1, s4), *b = in(&f, "b", SLAPO_DTYPE_F32, 1, s4);
  assert_int_equal(slapo_ctx_push_origin(f.ctx, "h.0.ln_1"), SLAPO_OK);
  slapo_node *y = slapo_layer_norm(f.ctx, x, w, b, 1e-5);
  assert_true(strncmp(slapo_ctx_message(f.ctx), "h.0.ln_1: layer_norm: ", 22) == 0);
  /* Sticky: a later valid call fails fast and keeps the first message. */
  assert_null(slapo_softmax(f.ctx, x, false));
  slapo_ctx_pop_origin(f.ctx);
  expect(&f, y, SLAPO_SHAPE, "h.0.ln_1: layer_norm: weight [4]", NULL);
}

static void test_rms_norm_errors(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23), *w = in(&f, "w", SLAPO_DTYPE_F32, 1, s5);
  expect(&f, slapo_rms_norm(f.ctx, x, w, 1e-6), SLAPO_SHAPE, "rms_norm", "weight [5]",
         "x [2, 3]", "expected [3]", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 0, NULL);
  expect(&f, slapo_rms_norm(f.ctx, x, NULL, 1e-6), SLAPO_SHAPE, "rms_norm", "x [] is a scalar",
         NULL);
}

static void test_cross_entropy_targets_shape(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *l = in(&f, "logits", SLAPO_DTYPE_F32, 2, s35);
  slapo_node *t = in(&f, "t", SLAPO_DTYPE_I64, 1, s4);
  expect(&f, slapo_cross_entropy(f.ctx, l, t, -100), SLAPO_SHAPE, "cross_entropy",
         "targets [4]", "logits [3, 5]", "expected targets [3]", NULL);
  f = fx_new();
  l = in(&f, "logits", SLAPO_DTYPE_F32, 2, s35);
  t = in(&f, "t", SLAPO_DTYPE_F32, 1, s3);
  expect(&f, slapo_cross_entropy(f.ctx, l, t, -100), SLAPO_DTYPE, "cross_entropy",
         "dtype f32, expected i32 or i64", NULL);
  f = fx_new();
  l = in(&f, "logits", SLAPO_DTYPE_F32, 2, s35);
  t = in(&f, "t", SLAPO_DTYPE_I64, 1, s3);
  slapo_node *dl = in(&f, "dl", SLAPO_DTYPE_F32, 1, s3);
  slapo_node *bin[3] = {l, t, dl};
  expect(&f, slapo_op_call(f.ctx, "cross_entropy_backward", 3, bin, 0, NULL), SLAPO_SHAPE,
         "cross_entropy_backward: dloss [3] must be a scalar []", NULL);
}

static void test_embedding_errors(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *w = in(&f, "w", SLAPO_DTYPE_F32, 2, s35);
  slapo_node *idx = in(&f, "idx", SLAPO_DTYPE_F32, 1, s4);
  expect(&f, slapo_embedding(f.ctx, w, idx), SLAPO_DTYPE, "embedding", "input 1 (idx)",
         "dtype f32, expected i32 or i64", NULL);
  f = fx_new();
  w = in(&f, "w", SLAPO_DTYPE_F32, 1, s5);
  idx = in(&f, "idx", SLAPO_DTYPE_I32, 1, s4);
  expect(&f, slapo_embedding(f.ctx, w, idx), SLAPO_SHAPE, "embedding: weight [5] must be 2-d",
         NULL);
}

static void test_index_add_errors(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *base = in(&f, "base", SLAPO_DTYPE_F32, 2, s35);
  slapo_node *idx = in(&f, "idx", SLAPO_DTYPE_I64, 1, s4);
  slapo_node *src = in(&f, "src", SLAPO_DTYPE_F32, 2, s23);
  expect(&f, slapo_index_add(f.ctx, base, idx, src), SLAPO_SHAPE, "index_add", "base [3, 5]",
         "idx [4]", "src [2, 3]", "expected base [V, C], idx [N], src [N, C]", NULL);
}

static void test_softmax_and_dropout_errors(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 1, s5);
  expect(&f, slapo_softmax(f.ctx, x, true), SLAPO_SHAPE, "softmax: causal softmax needs",
         "x [5]", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_I64, 2, s35);
  expect(&f, slapo_softmax(f.ctx, x, false), SLAPO_DTYPE, "softmax", "expected f32", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 2, s35);
  expect(&f, slapo_dropout(f.ctx, x, 1.5), SLAPO_INVALID_ARG, "dropout: p = 1.5",
         "outside [0, 1]", NULL);
  f = fx_new();
  x = in(&f, "x", SLAPO_DTYPE_F32, 2, s35);
  slapo_attr a[2] = {slapo_attr_float("p", 0.1), slapo_attr_int("offset", -4)};
  expect(&f, slapo_op_call(f.ctx, "dropout", 1, &x, 2, a), SLAPO_INVALID_ARG,
         "dropout: offset = -4", NULL);
}

/* The fused norm backwards' residual input r (residual = 1): x's shape. */
static void test_norm_backward_residual_errors(void **state) {
  (void)state;
  const char *ops[2] = {"layer_norm_backward", "rms_norm_backward"};
  for (int i = 0; i < 2; i++) {
    fx f = fx_new();
    slapo_node *x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23), *w = in(&f, "w", SLAPO_DTYPE_F32, 1, s3);
    slapo_node *dy = in(&f, "dy", SLAPO_DTYPE_F32, 2, s23);
    slapo_node *r = in(&f, "r", SLAPO_DTYPE_F32, 2, s35);
    slapo_node *args[4] = {x, w, dy, r};
    slapo_attr a = slapo_attr_int("residual", 1);
    expect(&f, slapo_op_call(f.ctx, ops[i], 4, args, 1, &a), SLAPO_SHAPE, ops[i], "x [2, 3]",
           "r [3, 5]", "one shape", NULL);
    f = fx_new();
    x = in(&f, "x", SLAPO_DTYPE_F32, 2, s23);
    slapo_node *one[1] = {x};
    expect(&f, slapo_op_call(f.ctx, ops[i], 1, one, 1, &a), SLAPO_INVALID_ARG, ops[i],
           "and r (residual = 1), got 1 inputs", NULL);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layer_norm_weight_shape),
      cmocka_unit_test(test_layer_norm_arity_and_attrs),
      cmocka_unit_test(test_layer_norm_message_has_module_path),
      cmocka_unit_test(test_rms_norm_errors),
      cmocka_unit_test(test_norm_backward_residual_errors),
      cmocka_unit_test(test_cross_entropy_targets_shape),
      cmocka_unit_test(test_embedding_errors),
      cmocka_unit_test(test_index_add_errors),
      cmocka_unit_test(test_softmax_and_dropout_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
