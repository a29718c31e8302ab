/* tests/errors/test_ops_shape_errors.c - reduce and shape op calls that must
 * fail at build time: reshape element-count mismatch and two -1s, bad
 * permutations, axes and dims out of range, repeated axes, concat shape,
 * rank and dtype mismatches, an axis of a 0-d value, sum_to and broadcast_to targets that are not
 * broadcast-compatible, split sizes that do not add up, full with a negative
 * dim, slice_backward with a dy of the wrong shape. Each case checks the
 * status, the message (op, shapes, rule) in both the ctx and the thread's
 * error, that the failed node left the graph, and that the error is sticky. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "slapo/ops.h"

#define OK(expr) assert_int_equal((expr), SLAPO_OK)

typedef struct fx {
  slapo_graph *g;
  slapo_ctx *ctx;
} fx;

static int setup(void **state) {
  fx *f = test_malloc(sizeof *f);
  OK(slapo_graph_new(&f->g));
  OK(slapo_ctx_new(f->g, &f->ctx));
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
  test_free(f);
  return 0;
}

static slapo_node *in_dt(fx *f, const char *name, slapo_dtype dt, int ndim,
                         const int64_t *shape) {
  slapo_node *n = slapo_input(f->ctx, name, dt, ndim, shape);
  assert_non_null(n);
  return n;
}

static slapo_node *in(fx *f, const char *name, int ndim, const int64_t *shape) {
  return in_dt(f, name, SLAPO_DTYPE_F32, ndim, shape);
}

/* The ctx failed with `s`, its message and the thread's contain every
 * string of `subs` (NULL-terminated), the graph holds only `n_nodes` nodes
 * (the inputs) and lints clean. */
static void expect_fail(fx *f, slapo_status got, slapo_status s, int n_nodes,
                        const char *const *subs) {
  assert_int_equal(got, s);
  assert_int_equal(slapo_ctx_status(f->ctx), s);
  for (int i = 0; subs[i]; i++) {
    if (!strstr(slapo_ctx_message(f->ctx), subs[i]))
      fail_msg("ctx message '%s' lacks '%s'", slapo_ctx_message(f->ctx), subs[i]);
    if (!strstr(slapo_last_error(), subs[i]))
      fail_msg("last error '%s' lacks '%s'", slapo_last_error(), subs[i]);
  }
  assert_int_equal(slapo_graph_count(f->g), n_nodes);
  OK(slapo_graph_lint(f->g));
}

/* A builder returning a node failed: NULL and the ctx status. */
static slapo_status st(fx *f, slapo_node *n) {
  assert_null(n);
  return slapo_ctx_status(f->ctx);
}

#define SUBS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_reshape_numel(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){4, 2})), SLAPO_SHAPE, 1,
              SUBS("reshape: cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)",
                   "must stay the same"));
  /* Sticky: a valid call after the failure returns NULL and adds nothing. */
  assert_null(slapo_reshape(f->ctx, x, 1, (int64_t[]){6}));
  assert_int_equal(slapo_graph_count(f->g), 1);
  assert_int_equal(slapo_ctx_status(f->ctx), SLAPO_SHAPE);
}

static void test_reshape_minus_one_not_inferable(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){4, -1})), SLAPO_SHAPE, 1,
              SUBS("reshape: cannot reshape [2, 3] (6 elements) to [4, -1]",
                   "-1 dim cannot be inferred"));
}

static void test_reshape_two_minus_one(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_reshape(f->ctx, x, 3, (int64_t[]){-1, 3, -1})),
              SLAPO_INVALID_ARG, 1,
              SUBS("reshape: shape [-1, 3, -1] has more than one -1",
                   "at most one dim can be inferred"));
}

static void test_reshape_negative_dim(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){-2, -3})), SLAPO_INVALID_ARG, 1,
              SUBS("reshape: shape [-2, -3] has a negative dim -2", "or a single -1"));
}

/* The module path prefixes the message. */
static void test_origin_in_message(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  OK(slapo_ctx_push_origin(f->ctx, "transformer.h.0.attn"));
  expect_fail(f, st(f, slapo_reshape(f->ctx, x, 1, (int64_t[]){5})), SLAPO_SHAPE, 1,
              SUBS("transformer.h.0.attn: reshape: cannot reshape [2, 3] (6 elements) to [5] "
                   "(5 elements)"));
  slapo_ctx_pop_origin(f->ctx);
}

static void test_permute_repeat(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_permute(f->ctx, x, 3, (int64_t[]){0, 2, -1})), SLAPO_INVALID_ARG,
              1,
              SUBS("permute: perm [0, 2, -1] is not a permutation of the dims of x [2, 3, 4]",
                   "entry 2 (-1) repeats a dim", "exactly once"));
}

static void test_permute_out_of_range(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_permute(f->ctx, x, 3, (int64_t[]){0, 3, 1})), SLAPO_INVALID_ARG,
              1, SUBS("permute: perm [0, 3, 1]", "entry 1 (3) is out of range", "[-3, 2]"));
}

static void test_permute_wrong_length(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_permute(f->ctx, x, 2, (int64_t[]){1, 0})), SLAPO_INVALID_ARG, 1,
              SUBS("permute: perm [1, 0] has 2 entries but x [2, 3, 4] has 3 dims"));
}

static void test_transpose_dim(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_transpose(f->ctx, x, 0, 2)), SLAPO_INVALID_ARG, 1,
              SUBS("transpose: dim1 2 is out of range for x [2, 3]; it must be in [-2, 1]"));
}

static void test_sum_axis_out_of_range(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_sum(f->ctx, x, 2, (int64_t[]){0, 3}, false)), SLAPO_INVALID_ARG, 1,
              SUBS("sum: axis 3 is out of range for x [2, 3, 4]; axes must be in [-3, 2]"));
}

static void test_mean_axis_negative_out_of_range(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_mean(f->ctx, x, 1, (int64_t[]){-3}, true)), SLAPO_INVALID_ARG, 1,
              SUBS("mean: axis -3 is out of range for x [2, 3]"));
}

static void test_sum_scalar_axis(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 0, NULL);
  expect_fail(f, st(f, slapo_sum(f->ctx, x, 1, (int64_t[]){0}, false)), SLAPO_INVALID_ARG, 1,
              SUBS("sum: x [] is 0-d and has no axis 0; pass no axes"));
}

static void test_sum_repeated_axis(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_sum(f->ctx, x, 2, (int64_t[]){1, -2}, false)), SLAPO_INVALID_ARG, 1,
              SUBS("sum: axis -2 (dim 1) is given twice for x [2, 3, 4]"));
}

static void test_sum_dtype(void **state) {
  fx *f = *state;
  slapo_node *x = in_dt(f, "ids", SLAPO_DTYPE_I64, 1, (int64_t[]){4});
  expect_fail(f, st(f, slapo_sum(f->ctx, x, 1, (int64_t[]){0}, false)), SLAPO_DTYPE, 1,
              SUBS("sum: input 0 (ids) has dtype i64, expected f32"));
}

static void test_slice_dim(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_slice(f->ctx, x, -3, 0, 1)), SLAPO_INVALID_ARG, 1,
              SUBS("slice: dim -3 is out of range for x [2, 3]; it must be in [-2, 1]"));
}

static void test_slice_step(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  slapo_attr a[2] = {slapo_attr_int("dim", 0), slapo_attr_int("step", 0)};
  expect_fail(f, st(f, slapo_op_call(f->ctx, "slice", 1, &x, 2, a)), SLAPO_INVALID_ARG, 1,
              SUBS("slice: step 0 must be >= 1"));
}

static void test_slice_scalar(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 0, NULL);
  expect_fail(f, st(f, slapo_slice(f->ctx, x, 0, 0, 1)), SLAPO_INVALID_ARG, 1,
              SUBS("slice: x [] is 0-d and has no dim 0"));
}

static void test_concat_shape_mismatch(void **state) {
  fx *f = *state;
  slapo_node *xs[3] = {in(f, "a", 2, (int64_t[]){2, 3}), in(f, "b", 2, (int64_t[]){2, 1}),
                       in(f, "c", 2, (int64_t[]){3, 4})};
  expect_fail(f, st(f, slapo_concat(f->ctx, 3, xs, 1)), SLAPO_SHAPE, 3,
              SUBS("concat: input 0 [2, 3] and input 2 [3, 4] differ in dim 0 (2 vs 3)",
                   "every dim but the concat dim 1"));
}

static void test_concat_rank(void **state) {
  fx *f = *state;
  slapo_node *xs[2] = {in(f, "a", 2, (int64_t[]){2, 3}), in(f, "b", 1, (int64_t[]){3})};
  expect_fail(f, st(f, slapo_concat(f->ctx, 2, xs, 0)), SLAPO_SHAPE, 2,
              SUBS("concat: input 0 [2, 3] has 2 dims but input 1 [3] has 1"));
}

static void test_concat_dtype(void **state) {
  fx *f = *state;
  slapo_node *xs[2] = {in(f, "a", 1, (int64_t[]){3}),
                       in_dt(f, "b", SLAPO_DTYPE_I32, 1, (int64_t[]){3})};
  expect_fail(f, st(f, slapo_concat(f->ctx, 2, xs, 0)), SLAPO_DTYPE, 2,
              SUBS("concat: input 0 has dtype f32 but input 1 has i32"));
}

static void test_concat_no_inputs(void **state) {
  fx *f = *state;
  expect_fail(f, st(f, slapo_concat(f->ctx, 0, NULL, 0)), SLAPO_INVALID_ARG, 0,
              SUBS("concat: expects at least 1 inputs, got 0"));
}

static void test_sum_to_incompatible(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 3, (int64_t[]){2, 3, 4});
  expect_fail(f, st(f, slapo_sum_to(f->ctx, x, 2, (int64_t[]){5, 1})), SLAPO_SHAPE, 1,
              SUBS("sum_to: cannot sum x [2, 3, 4] to [5, 1]: dim -2 is 3 in x but 5 in the "
                   "target",
                   "must equal x's or be 1"));
}

static void test_sum_to_more_dims(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){3, 4});
  expect_fail(f, st(f, slapo_sum_to(f->ctx, x, 3, (int64_t[]){1, 3, 4})), SLAPO_SHAPE, 1,
              SUBS("sum_to: cannot sum x [3, 4] to [1, 3, 4]: the target has more dims (3) "
                   "than x (2)"));
}

static void test_broadcast_to_incompatible(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){2, 3});
  expect_fail(f, st(f, slapo_broadcast_to(f->ctx, x, 2, (int64_t[]){4, 3})), SLAPO_SHAPE, 1,
              SUBS("broadcast_to: cannot broadcast x [2, 3] to [4, 3]: dim -2 is 2 in x but 4 "
                   "in the target"));
}

static void test_split_sizes(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){5, 3});
  slapo_node *out[2] = {x, x};
  expect_fail(f, slapo_split(f->ctx, x, 0, 2, (int64_t[]){2, 2}, out), SLAPO_SHAPE, 1,
              SUBS("split: sizes [2, 2] sum to 4 but x [5, 3] has 5 along dim 0",
                   "must add up to that dim"));
  assert_null(out[0]);
  assert_null(out[1]);
}

static void test_split_negative_size(void **state) {
  fx *f = *state;
  slapo_node *x = in(f, "x", 2, (int64_t[]){5, 3});
  slapo_node *out[2];
  expect_fail(f, slapo_split(f->ctx, x, 1, 2, (int64_t[]){4, -1}, out), SLAPO_SHAPE, 1,
              SUBS("split: sizes [4, -1] for x [5, 3] include a negative size"));
}

static void test_full_negative_dim(void **state) {
  fx *f = *state;
  expect_fail(f, st(f, slapo_full(f->ctx, 2, (int64_t[]){2, -1}, 0.0)), SLAPO_INVALID_ARG, 0,
              SUBS("full: shape [2, -1] has a negative dim -1 at 1"));
}

static void test_slice_backward_dy_shape(void **state) {
  fx *f = *state;
  slapo_node *dy = in(f, "dy", 2, (int64_t[]){2, 3});
  slapo_attr a[4] = {slapo_attr_ints("shape", 2, (int64_t[]){2, 5}), slapo_attr_int("dim", 1),
                     slapo_attr_int("start", 1), slapo_attr_int("end", 3)};
  expect_fail(f, st(f, slapo_op_call(f->ctx, "slice_backward", 1, &dy, 4, a)), SLAPO_SHAPE, 1,
              SUBS("slice_backward: dy [2, 3] does not match the slice of dim 1 of [2, 5], "
                   "which is [2, 2]"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reshape_numel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reshape_minus_one_not_inferable, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reshape_two_minus_one, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reshape_negative_dim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_origin_in_message, setup, teardown),
      cmocka_unit_test_setup_teardown(test_permute_repeat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_permute_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_permute_wrong_length, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transpose_dim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_axis_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mean_axis_negative_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_scalar_axis, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_repeated_axis, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slice_dim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slice_step, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slice_scalar, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concat_shape_mismatch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concat_rank, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concat_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_concat_no_inputs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_to_incompatible, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_to_more_dims, setup, teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_to_incompatible, setup, teardown),
      cmocka_unit_test_setup_teardown(test_split_sizes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_split_negative_size, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_negative_dim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slice_backward_dy_shape, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
