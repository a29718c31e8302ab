/* tests/unit/test_exec_accumulate.c - accumulated outputs of the executor
 * (slapo_plan_opts.accumulate_from, slapo_plan_bind_accumulator), which
 * slapo_step uses for parameter gradients: values computed by kernels,
 * views and bound inputs are added into their accumulators on every run
 * (bitwise acc + value), a value still read by later nodes stays alive for
 * them, accumulated values leave the planned peak, slapo_plan_output gives
 * NULL for them, and binding or running wrongly fails with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "slapo/exec.h"
#include "slapo/ops.h"

#define assert_ok(expr) assert_int_equal((expr), SLAPO_OK)

enum { N = 1000 };

/* outputs: 0 y = (2x) + (x + 3) [kept]; 1 g1 = 2x (also read by y, after
 * g2 is computed); 2 g2 = reshape(x + 3, [10, 100]) (a view); 3 x itself. */
static slapo_graph *build(void) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t n = N, s2[2] = {10, 100};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *g1 = slapo_mul_scalar(ctx, x, 2.0);
  slapo_node *x3 = slapo_add_scalar(ctx, x, 3.0);
  slapo_node *g2 = slapo_reshape(ctx, x3, 2, s2);
  slapo_node *y = slapo_add(ctx, g1, x3);
  slapo_node *outs[4] = {y, g1, g2, x};
  assert_non_null(slapo_output(ctx, 4, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

static slapo_tensor *filled(int ndim, const int64_t *shape, float v0, float step) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) d[i] = v0 + step * (float)i;
  return t;
}

static void test_values_accumulate_every_run(void **state) {
  (void)state;
  slapo_graph *g = build();
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(g, &opts, &p));
  int64_t n = N, s2[2] = {10, 100};
  slapo_tensor *x = filled(1, &n, 0.5f, 0.25f);
  slapo_tensor *a1 = filled(1, &n, 1.0f, 0.0f), *a2 = filled(2, s2, 0.0f, 1.0f);
  slapo_tensor *a3 = filled(1, &n, -1.0f, 0.0f);
  assert_ok(slapo_plan_bind_input(p, "x", x));
  assert_ok(slapo_plan_bind_accumulator(p, 1, a1));
  assert_ok(slapo_plan_bind_accumulator(p, 2, a2));
  assert_ok(slapo_plan_bind_accumulator(p, 3, a3));
  for (int run = 0; run < 2; run++) assert_ok(slapo_plan_run(p, NULL));
  const float *xp = slapo_tensor_data(x), *y = slapo_tensor_data(slapo_plan_output(p, 0));
  const float *p1 = slapo_tensor_data(a1), *p2 = slapo_tensor_data(a2);
  const float *p3 = slapo_tensor_data(a3);
  for (int i = 0; i < N; i++) {
    float g1 = xp[i] * 2.0f, x3 = xp[i] + 3.0f;
    assert_true(y[i] == g1 + x3);
    assert_true(p1[i] == (1.0f + g1) + g1);
    assert_true(p2[i] == ((float)i + x3) + x3);
    assert_true(p3[i] == (-1.0f + xp[i]) + xp[i]);
  }
  for (int i = 1; i < 4; i++) assert_null(slapo_plan_output(p, i));
  slapo_plan_free(p);
  slapo_tensor_free(x);
  slapo_tensor_free(a1);
  slapo_tensor_free(a2);
  slapo_tensor_free(a3);
  slapo_graph_free(g);
}

/* Four gradients of x computed one after another and a scalar loss: kept,
 * all four live until the next run (4 buffers + the loss's 64 bytes);
 * accumulated, each is added into its tensor and freed at once, so the
 * next one (and then the loss) reuses its buffer: 1 buffer. */
static void test_planned_peak(void **state) {
  (void)state;
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t n = N;
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *outs[5];
  for (int i = 1; i < 5; i++) outs[i] = slapo_mul_scalar(ctx, x, (double)i);
  int64_t ax = 0;
  outs[0] = slapo_sum(ctx, x, 1, &ax, false);
  assert_non_null(slapo_output(ctx, 5, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_plan *kept, *acc;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(g, NULL, &kept));
  assert_ok(slapo_plan_new(g, &opts, &acc));
  size_t buf = (N * sizeof(float) + 63) & ~(size_t)63;
  assert_int_equal(slapo_plan_peak_nbytes(kept), 4 * buf + 64);
  assert_int_equal(slapo_plan_peak_nbytes(acc), buf);
  slapo_plan_free(kept);
  slapo_plan_free(acc);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void test_binding_errors(void **state) {
  (void)state;
  slapo_graph *g = build();
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 2};
  assert_ok(slapo_plan_new(g, &opts, &p));
  int64_t n = N, bad[1] = {7};
  slapo_tensor *x = filled(1, &n, 0, 1), *a = filled(1, &n, 0, 0), *w = filled(1, bad, 0, 0);
  assert_int_equal(slapo_plan_bind_accumulator(p, 1, a), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "output 1 is not accumulated"));
  assert_int_equal(slapo_plan_bind_accumulator(p, 3, w), SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "[1000]"));
  assert_non_null(strstr(slapo_last_error(), "[7]"));
  assert_ok(slapo_plan_bind_input(p, "x", x));
  assert_ok(slapo_plan_bind_accumulator(p, 3, a));
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "slapo_plan_bind_accumulator(plan, 2"));
  slapo_plan_free(p);
  slapo_tensor_free(x);
  slapo_tensor_free(a);
  slapo_tensor_free(w);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values_accumulate_every_run),
      cmocka_unit_test(test_planned_peak),
      cmocka_unit_test(test_binding_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
