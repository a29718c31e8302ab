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

#include "common/check.h"

#include "common/opfix.h"
#include "slapo/ops.h"


static void test_reshape_numel(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){4, 2}), SLAPO_SHAPE, 1,
                    OPFIX_SUBS("reshape: cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)",
                               "must stay the same"));
  /* Sticky: a valid call after the failure returns NULL and adds nothing. */
  assert_null(slapo_reshape(f->ctx, x, 1, (int64_t[]){6}));
  assert_int_equal(slapo_graph_count(f->g), 1);
  assert_int_equal(slapo_ctx_status(f->ctx), SLAPO_SHAPE);
}

static void test_reshape_minus_one_not_inferable(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){4, -1}), SLAPO_SHAPE, 1,
                    OPFIX_SUBS("reshape: cannot reshape [2, 3] (6 elements) to [4, -1]",
                               "-1 dim cannot be inferred"));
}

static void test_reshape_two_minus_one(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_reshape(f->ctx, x, 3, (int64_t[]){-1, 3, -1}), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("reshape: shape [-1, 3, -1] has more than one -1",
                               "at most one dim can be inferred"));
}

static void test_reshape_negative_dim(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){-2, -3}), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("reshape: shape [-2, -3] has a negative dim -2", "or a single -1"));
}

/* The module path prefixes the message. */
static void test_origin_in_message(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  OK(slapo_ctx_push_origin(f->ctx, "transformer.h.0.attn"));
  opfix_expect_fail(
      f, slapo_reshape(f->ctx, x, 1, (int64_t[]){5}), SLAPO_SHAPE, 1,
      OPFIX_SUBS("transformer.h.0.attn: reshape: cannot reshape [2, 3] (6 elements) to [5] "
                 "(5 elements)"));
  slapo_ctx_pop_origin(f->ctx);
}

static void test_permute_repeat(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(
      f, slapo_permute(f->ctx, x, 3, (int64_t[]){0, 2, -1}), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("permute: perm [0, 2, -1] is not a permutation of the dims of x [2, 3, 4]",
                 "entry 2 (-1) repeats a dim", "exactly once"));
}

static void test_permute_out_of_range(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(
      f, slapo_permute(f->ctx, x, 3, (int64_t[]){0, 3, 1}), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("permute: perm [0, 3, 1]", "entry 1 (3) is out of range", "[-3, 2]"));
}

static void test_permute_wrong_length(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(f, slapo_permute(f->ctx, x, 2, (int64_t[]){1, 0}), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("permute: perm [1, 0] has 2 entries but x [2, 3, 4] has 3 dims"));
}

static void test_transpose_dim(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(
      f, slapo_transpose(f->ctx, x, 0, 2), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("transpose: dim1 2 is out of range for x [2, 3]; it must be in [-2, 1]"));
}

static void test_sum_axis_out_of_range(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(
      f, slapo_sum(f->ctx, x, 2, (int64_t[]){0, 3}, false), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("sum: axis 3 is out of range for x [2, 3, 4]; axes must be in [-3, 2]"));
}

static void test_mean_axis_negative_out_of_range(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_mean(f->ctx, x, 1, (int64_t[]){-3}, true), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("mean: axis -3 is out of range for x [2, 3]"));
}

static void test_sum_scalar_axis(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 0, NULL);
  opfix_expect_fail(f, slapo_sum(f->ctx, x, 1, (int64_t[]){0}, false), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("sum: x [] is 0-d and has no axis 0; pass no axes"));
}

static void test_sum_repeated_axis(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(f, slapo_sum(f->ctx, x, 2, (int64_t[]){1, -2}, false), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("sum: axis -2 (dim 1) is given twice for x [2, 3, 4]"));
}

static void test_sum_dtype(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input_dt(f, "ids", SLAPO_DTYPE_I64, 1, (int64_t[]){4});
  opfix_expect_fail(f, slapo_sum(f->ctx, x, 1, (int64_t[]){0}, false), SLAPO_DTYPE, 1,
                    OPFIX_SUBS("sum: input 0 (ids) has dtype i64, expected f32"));
}

static void test_slice_dim(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(
      f, slapo_slice(f->ctx, x, -3, 0, 1), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("slice: dim -3 is out of range for x [2, 3]; it must be in [-2, 1]"));
}

static void test_slice_step(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  slapo_attr a[2] = {slapo_attr_int("dim", 0), slapo_attr_int("step", 0)};
  opfix_expect_fail(f, slapo_op_call(f->ctx, "slice", 1, &x, 2, a), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("slice: step 0 must be >= 1"));
}

static void test_slice_scalar(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 0, NULL);
  opfix_expect_fail(f, slapo_slice(f->ctx, x, 0, 0, 1), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("slice: x [] is 0-d and has no dim 0"));
}

static void test_concat_shape_mismatch(void **state) {
  opfix *f = *state;
  slapo_node *xs[3] = {opfix_input(f, "a", 2, (int64_t[]){2, 3}),
                       opfix_input(f, "b", 2, (int64_t[]){2, 1}),
                       opfix_input(f, "c", 2, (int64_t[]){3, 4})};
  opfix_expect_fail(f, slapo_concat(f->ctx, 3, xs, 1), SLAPO_SHAPE, 3,
                    OPFIX_SUBS("concat: input 0 [2, 3] and input 2 [3, 4] differ in dim 0 (2 vs 3)",
                               "every dim but the concat dim 1"));
}

static void test_concat_rank(void **state) {
  opfix *f = *state;
  slapo_node *xs[2] = {opfix_input(f, "a", 2, (int64_t[]){2, 3}),
                       opfix_input(f, "b", 1, (int64_t[]){3})};
  opfix_expect_fail(f, slapo_concat(f->ctx, 2, xs, 0), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("concat: input 0 [2, 3] has 2 dims but input 1 [3] has 1"));
}

static void test_concat_dtype(void **state) {
  opfix *f = *state;
  slapo_node *xs[2] = {opfix_input(f, "a", 1, (int64_t[]){3}),
                       opfix_input_dt(f, "b", SLAPO_DTYPE_I32, 1, (int64_t[]){3})};
  opfix_expect_fail(f, slapo_concat(f->ctx, 2, xs, 0), SLAPO_DTYPE, 2,
                    OPFIX_SUBS("concat: input 0 has dtype f32 but input 1 has i32"));
}

static void test_concat_no_inputs(void **state) {
  opfix *f = *state;
  opfix_expect_fail(f, slapo_concat(f->ctx, 0, NULL, 0), SLAPO_INVALID_ARG, 0,
                    OPFIX_SUBS("concat: expects at least 1 inputs, got 0"));
}

static void test_sum_to_incompatible(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 3, 4});
  opfix_expect_fail(
      f, slapo_sum_to(f->ctx, x, 2, (int64_t[]){5, 1}), SLAPO_SHAPE, 1,
      OPFIX_SUBS("sum_to: cannot sum x [2, 3, 4] to [5, 1]: dim -2 is 3 in x but 5 in the "
                 "target",
                 "must equal x's or be 1"));
}

static void test_sum_to_more_dims(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){3, 4});
  opfix_expect_fail(
      f, slapo_sum_to(f->ctx, x, 3, (int64_t[]){1, 3, 4}), SLAPO_SHAPE, 1,
      OPFIX_SUBS("sum_to: cannot sum x [3, 4] to [1, 3, 4]: the target has more dims (3) "
                 "than x (2)"));
}

static void test_broadcast_to_incompatible(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(
      f, slapo_broadcast_to(f->ctx, x, 2, (int64_t[]){4, 3}), SLAPO_SHAPE, 1,
      OPFIX_SUBS("broadcast_to: cannot broadcast x [2, 3] to [4, 3]: dim -2 is 2 in x but 4 "
                 "in the target"));
}

static void test_split_sizes(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){5, 3});
  slapo_node *out[2] = {x, x};
  opfix_expect_fail_status(f, slapo_split(f->ctx, x, 0, 2, (int64_t[]){2, 2}, out), SLAPO_SHAPE, 1,
                           OPFIX_SUBS("split: sizes [2, 2] sum to 4 but x [5, 3] has 5 along dim 0",
                                      "must add up to that dim"));
  assert_null(out[0]);
  assert_null(out[1]);
}

static void test_split_negative_size(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){5, 3});
  slapo_node *out[2];
  opfix_expect_fail_status(f, slapo_split(f->ctx, x, 1, 2, (int64_t[]){4, -1}, out), SLAPO_SHAPE, 1,
                           OPFIX_SUBS("split: sizes [4, -1] for x [5, 3] include a negative size"));
}

static void test_full_negative_dim(void **state) {
  opfix *f = *state;
  opfix_expect_fail(f, slapo_full(f->ctx, 2, (int64_t[]){2, -1}, 0.0), SLAPO_INVALID_ARG, 0,
                    OPFIX_SUBS("full: shape [2, -1] has a negative dim -1 at 1"));
}

static void test_slice_backward_dy_shape(void **state) {
  opfix *f = *state;
  slapo_node *dy = opfix_input(f, "dy", 2, (int64_t[]){2, 3});
  slapo_attr a[4] = {slapo_attr_ints("shape", 2, (int64_t[]){2, 5}), slapo_attr_int("dim", 1),
                     slapo_attr_int("start", 1), slapo_attr_int("end", 3)};
  opfix_expect_fail(
      f, slapo_op_call(f->ctx, "slice_backward", 1, &dy, 4, a), SLAPO_SHAPE, 1,
      OPFIX_SUBS("slice_backward: dy [2, 3] does not match the slice of dim 1 of [2, 5], "
                 "which is [2, 2]"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reshape_numel, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_minus_one_not_inferable, opfix_setup,
                                      opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_two_minus_one, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_negative_dim, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_origin_in_message, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_permute_repeat, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_permute_out_of_range, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_permute_wrong_length, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_transpose_dim, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_axis_out_of_range, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_mean_axis_negative_out_of_range, opfix_setup,
                                      opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_scalar_axis, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_repeated_axis, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_dtype, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_dim, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_step, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_scalar, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_concat_shape_mismatch, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_concat_rank, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_concat_dtype, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_concat_no_inputs, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_to_incompatible, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_to_more_dims, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_to_incompatible, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_split_sizes, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_split_negative_size, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_full_negative_dim, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_backward_dy_shape, opfix_setup, opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
