/* tests/unit/test_gradcheck.c - the gradcheck harness checks itself: a
 * correct rule passes, a wrong rule or a NaN gradient is SLAPO_VERIFY naming
 * the element, a wrong fast kernel fails fastcheck, an op without a rule or
 * with an integer output is refused, large inputs are sampled. The ops are
 * test-only, registered at run time: y = x * x with various rules. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/gradcheck.h"

static slapo_status sq_infer(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, x->ndim, x->shape);
}

static slapo_status int_infer(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, SLAPO_DTYPE_I32, x->ndim, x->shape);
}

static void sq_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                   const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *x = slapo_tensor_data(in[0]); /* x [..] contiguous */
  float *o = slapo_tensor_data(out);         /* out [..] */
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) o[i] = x[i] * x[i];
}

/* Off by 1e-3 relative: a fast kernel that fastcheck must reject. */
static void sq_fast_wrong(const slapo_node *node, const slapo_tensor *const *in,
                          slapo_tensor *out, const slapo_kernel_env *env) {
  sq_ref(node, in, out, env);
  float *o = slapo_tensor_data(out);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) o[i] *= 1.001f;
}

static void int_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                    const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *x = slapo_tensor_data(in[0]);
  int32_t *o = slapo_tensor_data(out);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) o[i] = x[i] > 0;
}

/* dx = 2 x dy, optionally scaled wrong by `k`. */
static slapo_status sq_rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, const bool *need,
                            slapo_node **dx, double k) {
  if (need[0]) dx[0] = slapo_mul_scalar(ctx, slapo_mul(ctx, node->inputs[0], dy), 2 * k);
  return slapo_ctx_status(ctx);
}
static slapo_status good_bw(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, const bool *need,
                            slapo_node **dx) {
  return sq_rule(ctx, node, dy, need, dx, 1.0);
}
static slapo_status bad_bw(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, const bool *need,
                           slapo_node **dx) {
  return sq_rule(ctx, node, dy, need, dx, 1.1);
}
static slapo_status nan_bw(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, const bool *need,
                           slapo_node **dx) {
  return sq_rule(ctx, node, dy, need, dx, NAN);
}

static const int64_t k35[] = {3, 5};
static slapo_node *ex(slapo_ctx *ctx, const char *op, int ndim, const int64_t *shape) {
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, ndim, shape);
  return slapo_op_call(ctx, op, 1, &x, 0, NULL);
}
static slapo_node *ex_good(slapo_ctx *ctx) { return ex(ctx, "gc_good", 2, k35); }
static slapo_node *ex_bad(slapo_ctx *ctx) { return ex(ctx, "gc_bad", 2, k35); }
static slapo_node *ex_nan(slapo_ctx *ctx) { return ex(ctx, "gc_nan", 2, k35); }
static slapo_node *ex_fast(slapo_ctx *ctx) { return ex(ctx, "gc_fast", 2, k35); }
static slapo_node *ex_nobw(slapo_ctx *ctx) { return ex(ctx, "gc_nobw", 2, k35); }
static slapo_node *ex_int(slapo_ctx *ctx) { return ex(ctx, "gc_int", 2, k35); }
static slapo_node *ex_big(slapo_ctx *ctx) {
  const int64_t k[] = {45, 47};
  return ex(ctx, "gc_big", 2, k);
}

#define SQ(NAME, BW, FAST, EX)                                                 \
  {.name = NAME, .n_inputs = 1, .infer = sq_infer, .ref = sq_ref, .fast = FAST, \
   .backward = BW, .contiguous_inputs = true, .doc = "test: y = x^2",          \
   .test = {.example = EX}}
static const slapo_op k_ops[] = {
    SQ("gc_good", good_bw, NULL, ex_good),
    SQ("gc_bad", bad_bw, NULL, ex_bad),
    SQ("gc_nan", nan_bw, NULL, ex_nan),
    SQ("gc_fast", good_bw, sq_fast_wrong, ex_fast),
    SQ("gc_nobw", NULL, NULL, ex_nobw),
    SQ("gc_big", good_bw, NULL, ex_big),
    {.name = "gc_int", .n_inputs = 1, .infer = int_infer, .ref = int_ref, .backward = good_bw,
     .contiguous_inputs = true, .doc = "test: x > 0", .test = {.example = ex_int}},
};

static int setup(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++)
    if (slapo_op_register(&k_ops[i]) != SLAPO_OK) return -1;
  return 0;
}

static char rep[2048];

static void test_correct_rule_passes(void **state) {
  (void)state;
  assert_int_equal(gradcheck_op(slapo_op_find("gc_good"), 1, rep, sizeof rep), SLAPO_OK);
  assert_non_null(strstr(rep, "ok: worst at dx["));
  assert_non_null(strstr(rep, "max |a-n|"));
  bool skipped = false;
  assert_int_equal(fastcheck_op(slapo_op_find("gc_good"), 1, &skipped, rep, sizeof rep),
                   SLAPO_OK);
  /* Its backward uses mul and mul_scalar, which have fast kernels. */
  assert_false(skipped);
}

static void test_wrong_rule_fails(void **state) {
  (void)state;
  assert_int_equal(gradcheck_op(slapo_op_find("gc_bad"), 1, rep, sizeof rep), SLAPO_VERIFY);
  assert_non_null(strstr(rep, "gradient mismatch"));
  assert_non_null(strstr(rep, "dx["));
  assert_non_null(strstr(rep, "(input [3, 5])"));
  assert_non_null(strstr(rep, "analytic"));
  assert_non_null(strstr(rep, "numeric"));
}

static void test_nan_gradient_fails(void **state) {
  (void)state;
  assert_int_equal(gradcheck_op(slapo_op_find("gc_nan"), 1, rep, sizeof rep), SLAPO_VERIFY);
  assert_non_null(strstr(rep, "analytic gradient dx[0, 0] is nan"));
}

static void test_wrong_fast_kernel_fails(void **state) {
  (void)state;
  bool skipped = true;
  assert_int_equal(fastcheck_op(slapo_op_find("gc_fast"), 1, &skipped, rep, sizeof rep),
                   SLAPO_VERIFY);
  assert_false(skipped);
  assert_non_null(strstr(rep, "fast and reference kernels differ on y"));
}

static void test_refusals(void **state) {
  (void)state;
  assert_int_equal(gradcheck_op(slapo_op_find("gc_nobw"), 1, rep, sizeof rep),
                   SLAPO_UNSUPPORTED);
  assert_non_null(strstr(rep, "backward failed"));
  assert_non_null(strstr(rep, "op 'gc_nobw'"));
  assert_non_null(strstr(rep, "has no backward rule"));
  assert_int_equal(gradcheck_op(slapo_op_find("gc_int"), 1, rep, sizeof rep),
                   SLAPO_UNSUPPORTED);
  assert_non_null(strstr(rep, "has dtype i32: not differentiable"));
  assert_int_equal(gradcheck_op(slapo_op_find("full"), 1, rep, sizeof rep), SLAPO_INVALID_ARG);
  assert_non_null(strstr(rep, "op 'full' has no test.example"));
}

/* 2115 elements: a subset of 2000 is differentiated numerically. */
static void test_large_input_sampled(void **state) {
  (void)state;
  assert_int_equal(gradcheck_op(slapo_op_find("gc_big"), 1, rep, sizeof rep), SLAPO_OK);
}

static void test_case_outputs(void **state) {
  (void)state;
  gc_case *c;
  assert_int_equal(gc_case_new(slapo_op_find("gc_good"), 9, true, &c, rep, sizeof rep),
                   SLAPO_OK);
  assert_int_equal(gc_case_output_count(c), 2);
  assert_string_equal(gc_case_output_name(c, 0), "y");
  assert_string_equal(gc_case_output_name(c, 1), "dx");
  assert_int_equal(gc_case_plan(c, true, rep, sizeof rep), SLAPO_OK);
  assert_int_equal(gc_case_run(c, rep, sizeof rep), SLAPO_OK);
  /* Inputs are uniform in [-1, 1] by default. */
  const slapo_tensor *y = gc_case_output(c, 0);
  double d, m;
  gc_max_diff(y, y, &d, &m);
  assert_true(d == 0 && m > 0 && m <= 1);
  gc_case_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_correct_rule_passes),
      cmocka_unit_test(test_wrong_rule_fails),
      cmocka_unit_test(test_nan_gradient_fails),
      cmocka_unit_test(test_wrong_fast_kernel_fails),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_large_input_sampled),
      cmocka_unit_test(test_case_outputs),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
