/* tests/unit/test_exec_span.c - a plan run in spans, each in an arena of
 * its own (slapo_plan_run_span, slapo_plan_arena_new): what pipeline
 * parallelism does with a stage's joint graph. Two "micro-batches" run
 * their first spans one after the other in two arenas, then their second
 * spans, with each micro-batch's inputs bound again: every output and
 * accumulated value is bitwise a whole run's, including values the first
 * span leaves for the second (a view of a buffer among them) and a copy of
 * a bound input (the planner's form of a view of one). Errors: nodes outside the plan, spans
 * given backwards, another plan's arena, debug allocation mode. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <string.h>

#include "slapo/exec.h"
#include "slapo/ops.h"

enum { N = 4096 };

typedef struct fixture {
  slapo_graph *g;
  slapo_node *second; /* the first node of the second span */
} fixture;

/* First span: a = 2x, v = reshape(x) (a view of the bound input), b = a * a.
 * Second span (reads a, v and the input dy): y = (b + v) * dy + a, kept;
 * gacc = y * dy, accumulated. */
static fixture build(void) {
  fixture f;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&f.g));
  assert_ok(slapo_ctx_new(f.g, &ctx));
  int64_t n = N, s2[2] = {64, 64};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *a = slapo_mul_scalar(ctx, x, 2.0);
  slapo_node *v = slapo_reshape(ctx, x, 2, s2);
  slapo_node *b = slapo_mul(ctx, a, a);
  slapo_node *b2 = slapo_reshape(ctx, b, 2, s2);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, s2);
  slapo_node *t = slapo_add(ctx, b2, v);
  f.second = t;
  slapo_node *y = slapo_add(ctx, slapo_mul(ctx, t, dy), slapo_reshape(ctx, a, 2, s2));
  slapo_node *outs[2] = {y, slapo_mul(ctx, y, dy)};
  assert_non_null(slapo_output(ctx, 2, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return f;
}

static slapo_tensor *filled(int ndim, const int64_t *shape, float v0, float step) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) d[i] = v0 + step * (float)(i % 97);
  return t;
}

static void bind(slapo_plan *p, slapo_tensor *x, slapo_tensor *dy, slapo_tensor *acc) {
  assert_ok(slapo_plan_bind_input(p, "x", x));
  assert_ok(slapo_plan_bind_input(p, "dy", dy));
  assert_ok(slapo_plan_bind_accumulator(p, 1, acc));
}

static void assert_same(const slapo_tensor *a, const slapo_tensor *b) {
  assert_int_equal(slapo_tensor_nbytes(a), slapo_tensor_nbytes(b));
  assert_memory_equal(slapo_tensor_data(a), slapo_tensor_data(b), slapo_tensor_nbytes(a));
}

static void test_interleaved_spans_match_whole_runs(void **state) {
  (void)state;
  fixture f = build();
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(f.g, &opts, &p));
  int64_t n = N, s2[2] = {64, 64};
  slapo_tensor *x[2] = {filled(1, &n, 0.5f, 0.25f), filled(1, &n, -1.0f, 0.125f)};
  slapo_tensor *dy[2] = {filled(2, s2, 1.5f, -0.5f), filled(2, s2, 0.25f, 0.75f)};
  slapo_tensor *want_y[2], *want_acc[2], *acc[2];
  /* Whole runs, one micro-batch each: WRITE then ADD into one accumulator. */
  slapo_tensor *whole = filled(2, s2, 0, 0);
  for (int m = 0; m < 2; m++) {
    bind(p, x[m], dy[m], whole);
    assert_ok(slapo_plan_run_acc(p, NULL, m == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD));
    assert_ok(slapo_tensor_contiguous(slapo_plan_output(p, 0), &want_y[m]));
    assert_ok(slapo_tensor_contiguous(whole, &want_acc[m]));
  }
  /* Spans: first halves in arenas 0 and 1, then the second halves. */
  slapo_plan_arena *ar[2];
  for (int m = 0; m < 2; m++) assert_ok(slapo_plan_arena_new(p, &ar[m]));
  slapo_tensor *spanned = filled(2, s2, 7, 1); /* overwritten by WRITE */
  for (int m = 0; m < 2; m++) {
    bind(p, x[m], dy[m], spanned);
    assert_ok(slapo_plan_run_span(p, ar[m], NULL, f.second, NULL, SLAPO_ACC_ADD));
  }
  for (int m = 0; m < 2; m++) {
    bind(p, x[m], dy[m], spanned);
    assert_ok(slapo_plan_run_span(p, ar[m], f.second, NULL, NULL,
                                  m == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD));
    assert_same(slapo_plan_output(p, 0), want_y[m]);
    acc[m] = spanned;
    assert_same(acc[m], want_acc[m]);
  }
  /* The plan's own arena still runs whole afterwards. */
  bind(p, x[1], dy[1], whole);
  assert_ok(slapo_plan_run(p, NULL));
  assert_same(slapo_plan_output(p, 0), want_y[1]);
  for (int m = 0; m < 2; m++) {
    slapo_plan_arena_free(ar[m]);
    slapo_tensor_free(x[m]);
    slapo_tensor_free(dy[m]);
    slapo_tensor_free(want_y[m]);
    slapo_tensor_free(want_acc[m]);
  }
  slapo_tensor_free(spanned);
  slapo_tensor_free(whole);
  slapo_plan_free(p);
  slapo_graph_free(f.g);
}

static void test_span_errors(void **state) {
  (void)state;
  fixture f = build(), h = build();
  slapo_plan *p, *q;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(f.g, &opts, &p));
  assert_ok(slapo_plan_new(h.g, &opts, &q));
  int64_t n = N, s2[2] = {64, 64};
  slapo_tensor *x = filled(1, &n, 0, 1), *dy = filled(2, s2, 0, 1), *acc = filled(2, s2, 0, 0);
  expect_status(slapo_plan_run_span(p, NULL, NULL, NULL, NULL, 0), SLAPO_STATE, "not bound");
  bind(p, x, dy, acc);
  expect_status(slapo_plan_run_span(p, NULL, h.second, NULL, NULL, 0), SLAPO_INVALID_ARG,
                "is not in the plan");
  expect_status(slapo_plan_run_span(p, NULL, f.second, slapo_graph_first(f.g), NULL, 0),
                SLAPO_INVALID_ARG, "comes after");
  slapo_plan_arena *other;
  assert_ok(slapo_plan_arena_new(q, &other));
  expect_status(slapo_plan_run_span(p, other, NULL, NULL, NULL, 0), SLAPO_INVALID_ARG,
                "another plan");
  slapo_plan_arena_free(other);
  slapo_plan *dbg;
  slapo_plan_opts dopts = {.accumulate_from = 1, .debug_alloc = true};
  assert_ok(slapo_plan_new(h.g, &dopts, &dbg));
  slapo_plan_arena *none = NULL;
  expect_status(slapo_plan_arena_new(dbg, &none), SLAPO_UNSUPPORTED, "debug allocation");
  assert_null(none);
  slapo_plan_free(dbg);
  slapo_tensor_free(x);
  slapo_tensor_free(dy);
  slapo_tensor_free(acc);
  slapo_plan_free(p);
  slapo_plan_free(q);
  slapo_graph_free(f.g);
  slapo_graph_free(h.g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_interleaved_spans_match_whole_runs),
      cmocka_unit_test(test_span_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
