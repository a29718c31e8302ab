/* tests/errors/test_ops_elementwise_errors.c - elementwise op calls that must
 * fail at build time, each with its status and message: shapes that do not
 * broadcast, non-f32 inputs, bad or missing attributes, mismatched x/dy of
 * the fused backward ops; and the error is sticky on the ctx. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>

#include "common/opfix.h"
#include "slapo/ops.h"


static void test_no_broadcast(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s4[] = {4};
  slapo_node *a = opfix_input(f, "a", 2, s23);
  slapo_node *b = opfix_input(f, "b", 1, s4);
  /* The failed node is not left in the graph: it holds a and b only. */
  opfix_expect_fail(f, slapo_add(f->ctx, a, b), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("add: shapes [2, 3] and [4] do not broadcast"));
}

static void test_no_broadcast_each_op(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s32[] = {3, 2};
  slapo_node *a = opfix_input(f, "a", 2, s23);
  slapo_node *b = opfix_input(f, "b", 2, s32);
  const char *ops[] = {"sub", "mul", "div"};
  slapo_node *(*fns[])(slapo_ctx *, slapo_node *, slapo_node *) = {slapo_sub, slapo_mul,
                                                                   slapo_div};
  for (int i = 0; i < 3; i++) {
    slapo_ctx_free(f->ctx);
    assert_ok(slapo_ctx_new(f->g, &f->ctx));
    char want[128];
    snprintf(want, sizeof want, "%s: shapes [2, 3] and [3, 2] do not broadcast", ops[i]);
    opfix_expect_fail(f, fns[i](f->ctx, a, b), SLAPO_SHAPE, 2, OPFIX_SUBS(want));
  }
}

/* The module path that emitted the op prefixes the message. */
static void test_message_names_module(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s5[] = {5};
  slapo_node *a = opfix_input(f, "a", 2, s23);
  slapo_node *b = opfix_input(f, "b", 1, s5);
  assert_ok(slapo_ctx_push_origin(f->ctx, "transformer.h.0.mlp"));
  opfix_expect_fail(f, slapo_mul(f->ctx, a, b), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("transformer.h.0.mlp: mul: shapes [2, 3] and [5] do not broadcast"));
  slapo_ctx_pop_origin(f->ctx);
}

static void test_wrong_dtype(void **state) {
  opfix *f = *state;
  const int64_t s[] = {4};
  slapo_node *i = opfix_input_dt(f, "ids", SLAPO_DTYPE_I32, 1, s);
  opfix_expect_fail(f, slapo_exp(f->ctx, i), SLAPO_DTYPE, 1,
                    OPFIX_SUBS("exp: input 0 (ids) has dtype i32, expected f32"));
}

static void test_wrong_dtype_binary(void **state) {
  opfix *f = *state;
  const int64_t s[] = {4};
  slapo_node *x = opfix_input(f, "x", 1, s);
  slapo_node *h = opfix_input_dt(f, "h", SLAPO_DTYPE_BF16, 1, s);
  opfix_expect_fail(f, slapo_add(f->ctx, x, h), SLAPO_DTYPE, 2,
                    OPFIX_SUBS("add: input 1 (h) has dtype bf16, expected f32"));
}

/* After a failure every later op returns NULL and the first error stays. */
static void test_sticky(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s4[] = {4};
  slapo_node *a = opfix_input(f, "a", 2, s23);
  slapo_node *b = opfix_input(f, "b", 1, s4);
  slapo_node *i = opfix_input_dt(f, "i", SLAPO_DTYPE_I64, 1, s4);
  opfix_expect_fail(f, slapo_add(f->ctx, a, b), SLAPO_SHAPE, 3,
                    OPFIX_SUBS("add: shapes [2, 3] and [4]"));
  char first[1024];
  snprintf(first, sizeof first, "%s", slapo_ctx_message(f->ctx));
  int count = slapo_graph_count(f->g);
  /* A valid call, and one that would fail differently: both return NULL. */
  assert_null(slapo_exp(f->ctx, a));
  assert_null(slapo_gelu(f->ctx, i, true));
  assert_null(slapo_mul_scalar(f->ctx, a, 2.0));
  assert_int_equal(slapo_ctx_status(f->ctx), SLAPO_SHAPE);
  assert_string_equal(slapo_ctx_message(f->ctx), first);
  assert_int_equal(slapo_graph_count(f->g), count);
}

/* A failed op's NULL result fed to the next op is reported once, not as a
 * second error. */
static void test_null_chain(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s4[] = {4};
  slapo_node *a = opfix_input(f, "a", 2, s23);
  slapo_node *b = opfix_input(f, "b", 1, s4);
  slapo_node *y = slapo_relu(f->ctx, slapo_tanh(f->ctx, slapo_div(f->ctx, a, b)));
  opfix_expect_fail(f, y, SLAPO_SHAPE, 2,
                    OPFIX_SUBS("div: shapes [2, 3] and [4] do not broadcast"));
}

static void test_bad_gelu_attr(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = opfix_input(f, "x", 1, s);
  slapo_attr a = slapo_attr_str("approximate", "fast");
  opfix_expect_fail(
      f, slapo_op_call(f->ctx, "gelu", 1, &x, 1, &a), SLAPO_INVALID_ARG, 1,
      OPFIX_SUBS("gelu: attribute 'approximate' must be the string \"tanh\" or \"none\", got "
                 "\"fast\""));
}

static void test_bad_gelu_attr_kind(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = opfix_input(f, "x", 1, s);
  slapo_node *dy = opfix_input(f, "dy", 1, s);
  slapo_attr a = slapo_attr_int("approximate", 1);
  slapo_node *in[] = {x, dy};
  opfix_expect_fail(f, slapo_op_call(f->ctx, "gelu_backward", 2, in, 1, &a), SLAPO_INVALID_ARG, 2,
                    OPFIX_SUBS("gelu_backward: attribute 'approximate' must be the string"));
}

static void test_missing_scalar_attr(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = opfix_input(f, "x", 1, s);
  opfix_expect_fail(f, slapo_op_call(f->ctx, "add_scalar", 1, &x, 0, NULL), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("add_scalar: needs a numeric attribute 'value'"));
}

static void test_wrong_scalar_attr_kind(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = opfix_input(f, "x", 1, s);
  slapo_attr a = slapo_attr_str("exponent", "two");
  opfix_expect_fail(f, slapo_op_call(f->ctx, "pow", 1, &x, 1, &a), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("pow: needs a numeric attribute 'exponent'"));
}

static void test_fused_backward_shapes(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s3[] = {3};
  slapo_node *x = opfix_input(f, "x", 2, s23);
  slapo_node *dy = opfix_input(f, "dy", 1, s3);
  slapo_node *in[] = {x, dy};
  opfix_expect_fail(f, slapo_op_call(f->ctx, "silu_backward", 2, in, 0, NULL), SLAPO_SHAPE, 2,
                    OPFIX_SUBS("silu_backward: x [2, 3] and dy [3] must have the same shape"));
}

static void test_arity(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = opfix_input(f, "x", 1, s);
  opfix_expect_fail(f, slapo_op_call(f->ctx, "mul", 1, &x, 0, NULL), SLAPO_INVALID_ARG, 1,
                    OPFIX_SUBS("mul: expects 2 inputs, got 1"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_no_broadcast, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_no_broadcast_each_op, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_message_names_module, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_wrong_dtype, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_wrong_dtype_binary, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sticky, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_null_chain, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_bad_gelu_attr, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_bad_gelu_attr_kind, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_missing_scalar_attr, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_wrong_scalar_attr_kind, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fused_backward_shapes, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_arity, opfix_setup, opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
