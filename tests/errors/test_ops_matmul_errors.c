/* tests/errors/test_ops_matmul_errors.c - matmul and linear calls that must
 * fail at build time: each case checks the status, that the message names
 * the op, both shapes and the rule, and that the failed node left the graph
 * (the ctx error is sticky; nothing half-built remains). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <string.h>

#include "common/opfix.h"
#include "slapo/exec.h"
#include "slapo/ops.h"


static void test_inner_dims(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 2, (int64_t[]){2, 3}),
             *b = opfix_input(f, "b", 2, (int64_t[]){4, 5});
  opfix_expect_fail(f, slapo_matmul(f->ctx, a, b, false, false), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("matmul: a [2, 3] and b [4, 5]: inner dims 3 and 4 differ",
                               "a is [.., M, K], b is [.., K, N]"));
  /* Sticky: a valid call after the failure returns NULL and adds nothing. */
  assert_null(slapo_matmul(f->ctx, a, a, false, true));
  assert_int_equal(slapo_graph_count(f->g), 2);
}

static void test_inner_dims_trans(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 3, (int64_t[]){7, 2, 3}),
             *b = opfix_input(f, "b", 2, (int64_t[]){3, 5});
  /* b stored [N, K] = [3, 5] gives K = 5 against a's 3. */
  opfix_expect_fail(f, slapo_matmul(f->ctx, a, b, false, true), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("matmul: a [7, 2, 3] and b [3, 5]: inner dims 3 and 5 differ",
                               "b is [.., N, K] with trans_b=1"));
}

static void test_batch_not_broadcastable(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 4, (int64_t[]){2, 3, 4, 5}),
             *b = opfix_input(f, "b", 3, (int64_t[]){4, 5, 6});
  opfix_expect_fail(f, slapo_matmul(f->ctx, a, b, false, false), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("matmul: a [2, 3, 4, 5] and b [4, 5, 6]",
                               "batch dims [2, 3] and [4]", "do not broadcast (3 vs 4)"));
}

static void test_vector_operand(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 1, (int64_t[]){3}),
             *b = opfix_input(f, "b", 2, (int64_t[]){3, 5});
  opfix_expect_fail(
      f, slapo_matmul(f->ctx, a, b, false, false), SLAPO_SHAPE, 2,
      OPFIX_SUBS("matmul: a [3] and b [3, 5]", "at least 2 dims", "reshape a vector"));
}

static void test_dtype(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input_dt(f, "a", SLAPO_DTYPE_I32, 2, (int64_t[]){2, 3});
  slapo_node *b = opfix_input(f, "b", 2, (int64_t[]){3, 5});
  opfix_expect_fail(f, slapo_matmul(f->ctx, a, b, false, false), SLAPO_DTYPE, 2,
                    OPFIX_SUBS("matmul: operands a (i32) and b (f32): a GEMM or convolution takes two f32 or "
                               "two bf16 operands"));
}

/* autocast's bf16 operands come in pairs: one bf16 and one f32 is refused
 * (oneDNN has no such matmul), and a linear's bias stays f32. */
static void test_mixed_bf16(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  slapo_node *w = opfix_input_dt(f, "w", SLAPO_DTYPE_BF16, 2, (int64_t[]){5, 3});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, NULL), SLAPO_DTYPE, 2,
                    OPFIX_SUBS("linear: operands x (f32) and w (bf16): a GEMM or convolution takes two f32 or "
                               "two bf16 operands",
                               "cast with to_bf16, or let autocast do it"));
}

static void test_bf16_bias(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input_dt(f, "x", SLAPO_DTYPE_BF16, 2, (int64_t[]){2, 3});
  slapo_node *w = opfix_input_dt(f, "w", SLAPO_DTYPE_BF16, 2, (int64_t[]){5, 3});
  slapo_node *b = opfix_input_dt(f, "b", SLAPO_DTYPE_BF16, 1, (int64_t[]){5});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, b), SLAPO_DTYPE, 3,
                    OPFIX_SUBS("linear: input 2 (b) has dtype bf16, expected f32"));
}

static void test_bad_trans_attr(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 2, (int64_t[]){2, 3}),
             *b = opfix_input(f, "b", 2, (int64_t[]){3, 5});
  slapo_attr t = slapo_attr_int("trans_a", 2);
  slapo_node *ab[2] = {a, b};
  opfix_expect_fail(f, slapo_op_call(f->ctx, "matmul", 2, ab, 1, &t), SLAPO_INVALID_ARG, 2,
                    OPFIX_SUBS("matmul: trans_a=2 and trans_b=0 must be 0 or 1"));
}

static void test_module_path_prefix(void **state) {
  opfix *f = *state;
  slapo_node *a = opfix_input(f, "a", 2, (int64_t[]){2, 3}),
             *b = opfix_input(f, "b", 2, (int64_t[]){4, 5});
  OK(slapo_ctx_push_origin(f->ctx, "transformer.h.0.attn"));
  opfix_expect_fail(f, slapo_matmul(f->ctx, a, b, false, false), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("transformer.h.0.attn: matmul: a [2, 3] and b [4, 5]"));
  slapo_ctx_pop_origin(f->ctx);
}

static void test_linear_weight_mismatch(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 3, (int64_t[]){2, 7, 3}),
             *w = opfix_input(f, "w", 2, (int64_t[]){4, 5});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, NULL), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("linear: x [2, 7, 3] and w [4, 5]",
                               "x's last dim 3 differs from w's in-features 5 (w is [out, in])"));
}

static void test_linear_weight_rank(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3}),
             *w = opfix_input(f, "w", 1, (int64_t[]){3});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, NULL), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("linear: w [3] must be 2-d [out, in]"));
}

static void test_linear_bias_mismatch(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3}),
             *w = opfix_input(f, "w", 2, (int64_t[]){4, 3});
  slapo_node *b = opfix_input(f, "b", 1, (int64_t[]){3});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, b), SLAPO_SHAPE, 3,
                    OPFIX_SUBS("linear: b [3] does not match w [4, 3]: expected [4]"));
}

static void test_linear_bias_rank(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3}),
             *w = opfix_input(f, "w", 2, (int64_t[]){4, 3});
  slapo_node *b = opfix_input(f, "b", 2, (int64_t[]){1, 4});
  opfix_expect_fail(f, slapo_linear(f->ctx, x, w, b), SLAPO_SHAPE, 3,
                    OPFIX_SUBS("linear: b [1, 4] does not match w [4, 3]: expected [4]"));
}

static void test_linear_input_count(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  slapo_node *xs[4] = {x, x, x, x};
  opfix_expect_fail(f, slapo_op_call(f->ctx, "linear", 4, xs, 0, NULL), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("linear: expects 2 or 3 inputs (x, w[, b]), got 4"));
}

static void test_linear_input_count_one(void **state) {
  opfix *f = *state;
  slapo_node *x = opfix_input(f, "x", 2, (int64_t[]){2, 3});
  opfix_expect_fail(f, slapo_op_call(f->ctx, "linear", 1, &x, 0, NULL), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("linear: expects 2 or 3 inputs (x, w[, b]), got 1"));
}

/* The eager helper reports the same error. */
static void test_eager_mismatch(void **state) {
  (void)state;
  slapo_tensor *a, *b, *y = (slapo_tensor *)&y;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){2, 3}, &a));
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){4, 5}, &b));
  const slapo_tensor *ab[2] = {a, b};
  assert_int_equal(slapo_eager("matmul", 2, ab, 0, NULL, NULL, NULL, &y), SLAPO_SHAPE);
  assert_null(y);
  if (!strstr(slapo_last_error(), "matmul: a [2, 3] and b [4, 5]: inner dims 3 and 4 differ"))
    fail_msg("message '%s'", slapo_last_error());
  slapo_tensor_free(a);
  slapo_tensor_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_inner_dims, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_inner_dims_trans, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_batch_not_broadcastable, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_vector_operand, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_dtype, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_mixed_bf16, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_bf16_bias, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_bad_trans_attr, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_module_path_prefix, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_weight_mismatch, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_weight_rank, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_bias_mismatch, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_bias_rank, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_input_count, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_input_count_one, opfix_setup, opfix_teardown),
      cmocka_unit_test(test_eager_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
