/* tests/unit/test_exec.c - the memory planner and executor: results, planned
 * peaks computed by hand, view lifetimes, outputs surviving, determinism,
 * the debug allocation mode (same results, NaN poison), binding errors,
 * plan-time errors, timing, strided inputs, and random DAGs checked against
 * an independent evaluator. Uses only the test ops of exec_test_ops.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec_test_ops.h"

/* A graph under construction with its ctx. */
typedef struct gb {
  slapo_graph *g;
  slapo_ctx *ctx;
} gb;

static gb gb_new(void) {
  gb b;
  assert_int_equal(slapo_graph_new(&b.g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(b.g, &b.ctx), SLAPO_OK);
  return b;
}

static void gb_free(gb *b) {
  slapo_ctx_free(b->ctx);
  slapo_graph_free(b->g);
}

static slapo_node *view(gb *b, const char *op, slapo_node *x) {
  return slapo_op_call(b->ctx, op, 1, &x, 0, NULL);
}

/* f32 tensor of `shape` with element i = base + i. */
static slapo_tensor *ramp(int ndim, const int64_t *shape, float base) {
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t), SLAPO_OK);
  float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) d[i] = base + (float)i;
  return t;
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Plans b's graph, binds x to "x", runs. */
static slapo_plan *plan_run(gb *b, const slapo_plan_opts *opts, const slapo_tensor *x) {
  assert_int_equal(slapo_ctx_status(b->ctx), SLAPO_OK);
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(b->g, opts, &p), SLAPO_OK);
  if (x) assert_int_equal(slapo_plan_bind_input(p, "x", x), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  return p;
}

/* Expects output i to be x + add elementwise (x read with its strides). */
static void expect_plus(const slapo_plan *p, int i, const slapo_tensor *x, float add) {
  const slapo_tensor *y = slapo_plan_output(p, i);
  assert_non_null(y);
  assert_int_equal(slapo_tensor_numel(y), slapo_tensor_numel(x));
  for (int64_t k = 0; k < slapo_tensor_numel(x); k++)
    assert_float_equal(xt_at(y, k), xt_at(x, k) + add, 0);
}

/* ------------------------------------------------------------------------ */

/* a -> b -> c -> d: buffers are reused, peak = 2 buffers, not 4. */
static void test_chain_reuses_buffers(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t n = 100; /* 400 bytes -> 448 rounded */
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *v = x;
  for (int i = 0; i < 4; i++) v = xt_call1(b.ctx, "test_add1", v, 1.0);
  slapo_output(b.ctx, 1, &v);
  slapo_tensor *xt = ramp(1, &n, 0);
  slapo_plan *p = plan_run(&b, NULL, xt);
  assert_int_equal(slapo_plan_peak_nbytes(p), 2 * 448);
  assert_int_equal(slapo_plan_measured_peak_nbytes(p), 2 * 448);
  assert_int_equal(slapo_plan_output_count(p), 1);
  expect_plus(p, 0, xt, 4);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* An early value that is also an output is not overwritten by later nodes. */
static void test_outputs_survive(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t n = 100;
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *a = xt_call1(b.ctx, "test_add1", x, 1.0);
  slapo_node *v = a;
  for (int i = 0; i < 3; i++) v = xt_call1(b.ctx, "test_add1", v, 10.0);
  slapo_node *outs[3] = {v, a, x};
  slapo_output(b.ctx, 3, outs);
  slapo_tensor *xt = ramp(1, &n, 0);
  slapo_plan *p = plan_run(&b, NULL, xt);
  /* a lives to the end; b and d share a slot, c takes a third. */
  assert_int_equal(slapo_plan_peak_nbytes(p), 3 * 448);
  expect_plus(p, 0, xt, 31);
  expect_plus(p, 1, xt, 1);
  assert_ptr_equal(slapo_plan_output(p, 2), xt); /* a bound value is its tensor */
  assert_null(slapo_plan_output(p, 3));
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* a's storage must outlive its view v until d reads v. A planner that
 * freed a after its last *direct* use (the view) would hand a's slot to c,
 * and d would read x + 100 + 1 instead of x + 2. */
static void build_view_lifetime(gb *b) {
  int64_t s[2] = {4, 8};
  slapo_node *x = slapo_input(b->ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *a = xt_call1(b->ctx, "test_add1", x, 1.0);
  slapo_node *v = view(b, "test_flat", a);
  slapo_node *c = xt_call1(b->ctx, "test_add1", x, 100.0);
  slapo_node *d = xt_call1(b->ctx, "test_add1", v, 1.0);
  slapo_node *outs[2] = {d, c};
  slapo_output(b->ctx, 2, outs);
}

static void test_view_extends_base_lifetime(void **state) {
  (void)state;
  gb b = gb_new();
  build_view_lifetime(&b);
  int64_t s[2] = {4, 8};
  slapo_tensor *xt = ramp(2, s, 0);
  slapo_plan *p = plan_run(&b, NULL, xt);
  assert_int_equal(slapo_plan_peak_nbytes(p), 3 * round64(4 * 8 * 4));
  expect_plus(p, 0, xt, 2);
  expect_plus(p, 1, xt, 100);
  assert_int_equal(slapo_plan_output(p, 0)->ndim, 1);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* A view that is an output keeps its base alive; a view of a bound tensor
 * aliases the caller's storage. */
static void test_view_outputs(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t s[2] = {3, 5};
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *a = xt_call1(b.ctx, "test_add1", x, 1.0);
  slapo_node *at = view(&b, "test_t", a);
  slapo_node *c = xt_call1(b.ctx, "test_add1", x, 7.0);
  slapo_node *xtv = view(&b, "test_t", x);
  slapo_node *outs[3] = {at, c, xtv};
  slapo_output(b.ctx, 3, outs);
  slapo_tensor *xt = ramp(2, s, 0);
  slapo_plan *p = plan_run(&b, NULL, xt);
  const slapo_tensor *y0 = slapo_plan_output(p, 0);
  assert_int_equal(y0->shape[0], 5);
  assert_int_equal(y0->shape[1], 3);
  assert_false(slapo_tensor_is_contiguous(y0));
  for (int64_t i = 0; i < 5; i++)
    for (int64_t j = 0; j < 3; j++) {
      int64_t ij[2] = {i, j}, ji[2] = {j, i};
      assert_float_equal(slapo_tensor_get(y0, ij), slapo_tensor_get(xt, ji) + 1, 0);
    }
  expect_plus(p, 1, xt, 7);
  const slapo_tensor *y2 = slapo_plan_output(p, 2);
  assert_ptr_equal(y2->storage, xt->storage);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* Two runs give byte-identical outputs; so does the debug allocation mode,
 * switched on by opts or by SLAPO_DEBUG_MEM=1. */
static void test_deterministic_and_debug_mode(void **state) {
  (void)state;
  gb b = gb_new();
  build_view_lifetime(&b);
  int64_t s[2] = {4, 8};
  slapo_tensor *xt = ramp(2, s, 0.5f);

  slapo_plan *p = plan_run(&b, NULL, xt);
  slapo_tensor *first[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(slapo_tensor_contiguous(slapo_plan_output(p, i), &first[i]), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  for (int i = 0; i < 2; i++) assert_true(slapo_tensor_equal(slapo_plan_output(p, i), first[i]));
  slapo_plan_free(p);

  slapo_plan_opts dbg = {.debug_alloc = true};
  p = plan_run(&b, &dbg, xt);
  for (int i = 0; i < 2; i++) assert_true(slapo_tensor_equal(slapo_plan_output(p, i), first[i]));
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK); /* frees and reallocates */
  for (int i = 0; i < 2; i++) assert_true(slapo_tensor_equal(slapo_plan_output(p, i), first[i]));
  /* Three buffers are live at once when d runs: a, c and d. */
  assert_int_equal(slapo_plan_measured_peak_nbytes(p), 3 * 128);
  slapo_plan_free(p);

  setenv("SLAPO_DEBUG_MEM", "1", 1);
  p = plan_run(&b, NULL, xt);
  unsetenv("SLAPO_DEBUG_MEM");
  for (int i = 0; i < 2; i++) {
    assert_true(slapo_tensor_equal(slapo_plan_output(p, i), first[i]));
    slapo_tensor_free(first[i]);
  }
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* In debug mode a buffer is NaN once its last reader ran: test_add1c records
 * the address of its input a, which is dead after it. */
static void test_debug_poisons_dead_buffers(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t n = 10;
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *a = xt_call1(b.ctx, "test_add1", x, 1.0);
  slapo_node *c = xt_call1(b.ctx, "test_add1c", a, 1.0);
  slapo_node *d = xt_call1(b.ctx, "test_add1", c, 1.0);
  slapo_output(b.ctx, 1, &d);
  slapo_tensor *xt = ramp(1, &n, 0);
  slapo_plan_opts dbg = {.debug_alloc = true};
  slapo_plan *p = plan_run(&b, &dbg, xt);
  expect_plus(p, 0, xt, 3);
  const float *dead = g_add1c_in;
  assert_int_equal(g_add1c_in_nbytes, 40);
  for (int i = 0; i < 16; i++) { /* the whole 64-byte block */
    uint32_t bits;
    memcpy(&bits, &dead[i], 4);
    assert_int_equal(bits, 0x7fc00000u);
    assert_true(isnan(dead[i]));
  }
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

static void test_unbound_placeholder(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t s[2] = {2, 3};
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *y = slapo_input(b.ctx, "tokens", SLAPO_DTYPE_F32, 2, s);
  slapo_node *w = slapo_param(b.ctx, "h.0.mlp.weight", SLAPO_DTYPE_F32, 2, s);
  slapo_node *z = xt_call2(b.ctx, "test_addb", xt_call2(b.ctx, "test_addb", x, y), w);
  slapo_output(b.ctx, 1, &z);
  assert_int_equal(slapo_ctx_status(b.ctx), SLAPO_OK);
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_OK);
  slapo_tensor *xt = ramp(2, s, 0);
  assert_int_equal(slapo_plan_bind_input(p, "x", xt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "placeholder 'tokens'"));
  assert_non_null(strstr(slapo_last_error(), "slapo_plan_bind_input"));
  assert_null(slapo_plan_output(p, 0));
  assert_int_equal(slapo_plan_bind_input(p, "tokens", xt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "param 'h.0.mlp.weight'"));
  assert_int_equal(slapo_plan_bind_param(p, "h.0.mlp.weight", xt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  const slapo_tensor *out = slapo_plan_output(p, 0);
  for (int64_t i = 0; i < 6; i++) assert_float_equal(xt_at(out, i), 3.0f * (float)i, 0);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

static void test_bind_errors(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t s[2] = {2, 3}, st[2] = {3, 2};
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *y = xt_call1(b.ctx, "test_add1", x, 1.0);
  slapo_output(b.ctx, 1, &y);
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_OK);
  slapo_tensor *wrong = ramp(2, st, 0), *meta, *ints;
  assert_int_equal(slapo_plan_bind_input(p, "x", wrong), SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "[2, 3]"));
  assert_non_null(strstr(slapo_last_error(), "[3, 2]"));
  assert_non_null(strstr(slapo_last_error(), "'x'"));
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, s, &ints), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "x", ints), SLAPO_DTYPE);
  assert_non_null(strstr(slapo_last_error(), "f32[2, 3]"));
  assert_non_null(strstr(slapo_last_error(), "i32[2, 3]"));
  assert_int_equal(slapo_plan_bind_input(p, "nope", wrong), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "'nope'"));
  assert_int_equal(slapo_plan_bind_param(p, "x", wrong), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "param"));
  assert_int_equal(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, s, &meta), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "x", meta), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "meta tensor"));
  /* Nothing was bound by the failures. */
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_STATE);
  slapo_plan_free(p);
  slapo_tensor_free(wrong);
  slapo_tensor_free(meta);
  slapo_tensor_free(ints);
  gb_free(&b);
}

static void test_plan_errors(void **state) {
  (void)state;
  int64_t s[1] = {4};
  slapo_plan *p = (slapo_plan *)1;

  /* No output node. */
  gb b = gb_new();
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, s);
  xt_call1(b.ctx, "test_add1", x, 1.0);
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_STATE);
  assert_null(p);
  assert_non_null(strstr(slapo_last_error(), "no output node"));
  gb_free(&b);

  /* A call_module node left in the graph. */
  b = gb_new();
  x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_node *m;
  assert_int_equal(slapo_graph_add_call_module(b.g, "h.0.mlp", 1, &x, &m), SLAPO_OK);
  slapo_output(b.ctx, 1, &m);
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "call_module node 'h_0_mlp' (module 'h.0.mlp')"));
  assert_non_null(strstr(slapo_last_error(), "must be inlined before planning"));
  gb_free(&b);

  /* A multi-result op read through getitem. */
  b = gb_new();
  x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, s);
  assert_int_equal(slapo_graph_add_call_op(b.g, "test_add1", slapo_op_find("test_add1"), 1, &x,
                                           0, NULL, &m),
                   SLAPO_OK);
  assert_int_equal(slapo_node_set_n_results(m, 2), SLAPO_OK);
  slapo_node *gi;
  assert_int_equal(slapo_graph_add_getitem(b.g, m, 1, &gi), SLAPO_OK);
  slapo_output(b.ctx, 1, &gi);
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "node 'test_add1' (op 'test_add1') returns 2 results"));
  gb_free(&b);

  /* A call_op node without a descriptor. */
  b = gb_new();
  x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, s);
  assert_int_equal(slapo_graph_add_call_op(b.g, "mystery", NULL, 1, &x, 0, NULL, &m), SLAPO_OK);
  slapo_output(b.ctx, 1, &m);
  assert_int_equal(slapo_plan_new(b.g, NULL, &p), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "'mystery'"));
  gb_free(&b);

  assert_int_equal(slapo_plan_new(NULL, NULL, &p), SLAPO_INVALID_ARG);
  slapo_plan_free(NULL);
}

static void test_eager(void **state) {
  (void)state;
  int64_t s[2] = {3, 5};
  slapo_tensor *xt = ramp(2, s, 1), *y;
  const slapo_tensor *in[2] = {xt, xt};

  slapo_attr v = slapo_attr_float("v", 2.5);
  assert_int_equal(slapo_eager("test_add1", 1, in, 1, &v, NULL, NULL, &y), SLAPO_OK);
  for (int64_t i = 0; i < 15; i++) assert_float_equal(xt_at(y, i), xt_at(xt, i) + 2.5f, 0);
  slapo_tensor_free(y);

  /* A view op: the result is an owned contiguous copy, not an alias. */
  assert_int_equal(slapo_eager("test_t", 1, in, 0, NULL, NULL, NULL, &y), SLAPO_OK);
  assert_true(slapo_tensor_is_contiguous(y));
  assert_ptr_not_equal(y->storage, xt->storage);
  assert_int_equal(y->shape[0], 5);
  int64_t ij[2] = {4, 2}, ji[2] = {2, 4};
  assert_float_equal(slapo_tensor_get(y, ij), slapo_tensor_get(xt, ji), 0);
  slapo_tensor_free(y);

  slapo_plan_opts dbg = {.debug_alloc = true, .reference = true};
  assert_int_equal(slapo_eager("test_addb", 2, in, 0, NULL, NULL, &dbg, &y), SLAPO_OK);
  assert_float_equal(xt_at(y, 14), 30, 0);
  slapo_tensor_free(y);

  y = (slapo_tensor *)1;
  assert_int_equal(slapo_eager("no_such_op", 1, in, 0, NULL, NULL, NULL, &y), SLAPO_NOT_FOUND);
  assert_null(y);
  assert_non_null(strstr(slapo_last_error(), "no_such_op"));

  int64_t s3[3] = {2, 3, 4};
  slapo_tensor *x3 = ramp(3, s3, 0);
  assert_int_equal(slapo_eager("test_t", 1, (const slapo_tensor *const *)&x3, 0, NULL, NULL,
                               NULL, &y),
                   SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "test_t: x [2, 3, 4] is not 2-d"));
  assert_int_equal(slapo_eager("test_add1", 2, in, 0, NULL, NULL, NULL, &y), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "test_add1"));
  slapo_tensor_free(x3);
  slapo_tensor_free(xt);
}

static void test_fast_and_reference(void **state) {
  (void)state;
  int64_t s[1] = {7};
  slapo_tensor *xt = ramp(1, s, 0), *y;
  const slapo_tensor *in[1] = {xt};
  g_fast_calls = 0;
  assert_int_equal(slapo_eager("test_fastop", 1, in, 0, NULL, NULL, NULL, &y), SLAPO_OK);
  assert_int_equal(g_fast_calls, 1);
  slapo_tensor_free(y);
  slapo_plan_opts ref = {.reference = true};
  assert_int_equal(slapo_eager("test_fastop", 1, in, 0, NULL, NULL, &ref, &y), SLAPO_OK);
  assert_int_equal(g_fast_calls, 1);
  assert_float_equal(xt_at(y, 6), 7, 0);
  slapo_tensor_free(y);
  slapo_tensor_free(xt);
}

static void test_timing(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t n = 64;
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *v = xt_call1(b.ctx, "test_add1", x, 1.0);
  assert_int_equal(slapo_ctx_push_origin(b.ctx, "h.0.attn"), SLAPO_OK);
  v = xt_call1(b.ctx, "test_add1", v, 1.0);
  v = xt_call1(b.ctx, "test_add1c", v, 1.0);
  slapo_ctx_pop_origin(b.ctx);
  assert_int_equal(slapo_ctx_push_origin(b.ctx, "h.0.mlp"), SLAPO_OK);
  v = xt_call1(b.ctx, "test_add1", v, 1.0);
  slapo_ctx_pop_origin(b.ctx);
  slapo_output(b.ctx, 1, &v);
  slapo_tensor *xt = ramp(1, &n, 0);
  slapo_plan_opts o = {.timing = true};
  slapo_plan *p = plan_run(&b, &o, xt);
  expect_plus(p, 0, xt, 4);
  for (slapo_node *k = slapo_graph_first(b.g); k; k = k->next)
    assert_true(slapo_plan_node_ms(p, k) >= 0);

  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  slapo_plan_print_timing(p, f);
  fclose(f);
  assert_non_null(strstr(buf, "h.0.attn"));
  assert_non_null(strstr(buf, "h.0.mlp"));
  assert_non_null(strstr(buf, "(root)"));
  assert_non_null(strstr(buf, "ms"));
  /* One line per origin after the two header lines. */
  int lines = 0;
  for (char *c = buf; *c; c++) lines += *c == '\n';
  assert_int_equal(lines, 2 + 3);
  free(buf);
  slapo_plan_free(p);

  /* Without opts.timing nothing is recorded. */
  p = plan_run(&b, NULL, xt);
  assert_true(slapo_plan_node_ms(p, slapo_graph_first(b.g)) == 0);
  f = open_memstream(&buf, &len);
  slapo_plan_print_timing(p, f);
  fclose(f);
  assert_non_null(strstr(buf, "not recorded"));
  free(buf);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

static int g_log_copies;
static void count_log(int level, const char *msg, void *ud) {
  (void)ud;
  if (level == 1 && strstr(msg, "is strided")) g_log_copies++;
}

/* A contiguous_inputs op gets contiguous copies of a strided bound input and
 * of a strided view; the copy is logged once per node. */
static void test_strided_inputs(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t s[2] = {5, 3}, st[2] = {3, 5};
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *y1 = xt_call1(b.ctx, "test_add1c", x, 1.0);     /* strided bound input */
  slapo_node *a = xt_call1(b.ctx, "test_add1", x, 0.0);       /* contiguous copy of x */
  slapo_node *at = view(&b, "test_t", a);                     /* [3, 5] strided */
  slapo_node *y2 = xt_call1(b.ctx, "test_add1c", at, 2.0);    /* strided view */
  slapo_node *y3 = xt_call1(b.ctx, "test_add1c", a, 3.0);     /* contiguous */
  slapo_node *outs[3] = {y1, y2, y3};
  slapo_output(b.ctx, 3, outs);

  slapo_tensor *base = ramp(2, st, 0), *xt;
  int perm[2] = {1, 0};
  assert_int_equal(slapo_tensor_permute(base, perm, &xt), SLAPO_OK); /* [5, 3] strided */
  assert_false(slapo_tensor_is_contiguous(xt));

  g_log_copies = 0;
  slapo_set_log(count_log, NULL);
  slapo_plan *p = plan_run(&b, NULL, xt);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  slapo_set_log(NULL, NULL);
  assert_int_equal(g_log_copies, 2); /* two nodes copy, each logged once */

  expect_plus(p, 0, xt, 1);
  expect_plus(p, 2, xt, 3);
  const slapo_tensor *y = slapo_plan_output(p, 1);
  for (int64_t i = 0; i < 3; i++)
    for (int64_t j = 0; j < 5; j++) {
      int64_t ij[2] = {i, j}, ji[2] = {j, i};
      assert_float_equal(slapo_tensor_get(y, ij), slapo_tensor_get(xt, ji) + 2, 0);
    }
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  slapo_tensor_free(base);
  gb_free(&b);
}

/* Zero-element values and a graph whose output is a bound input. */
static void test_edge_shapes(void **state) {
  (void)state;
  gb b = gb_new();
  int64_t s[2] = {0, 3};
  slapo_node *x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *a = xt_call1(b.ctx, "test_add1", x, 1.0);
  slapo_node *c = xt_call1(b.ctx, "test_add1c", view(&b, "test_t", a), 1.0);
  slapo_node *outs[2] = {c, x};
  slapo_output(b.ctx, 2, outs);
  slapo_tensor *xt = ramp(2, s, 0);
  slapo_plan *p = plan_run(&b, NULL, xt);
  assert_int_equal(slapo_plan_peak_nbytes(p), 0);
  assert_int_equal(slapo_tensor_numel(slapo_plan_output(p, 0)), 0);
  slapo_plan_free(p);
  slapo_plan_opts dbg = {.debug_alloc = true};
  p = plan_run(&b, &dbg, xt);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  gb_free(&b);
}

/* ------------------------------------------------------------------------ */
/* Random DAGs against an independent evaluator                              */
/* ------------------------------------------------------------------------ */

#define RD 4 /* values are [RD, RD] so the transpose view keeps the shape */
#define RN 40

static uint32_t rng_next(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

static void test_random_dags(void **state) {
  (void)state;
  for (uint32_t seed = 1; seed <= 40; seed++) {
    uint32_t r = seed;
    gb b = gb_new();
    int64_t s[2] = {RD, RD};
    slapo_node *nodes[RN];
    float ref[RN][RD * RD]; /* each value, row-major */
    slapo_tensor *xt = ramp(2, s, (float)seed);
    nodes[0] = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, s);
    for (int k = 0; k < RD * RD; k++) ref[0][k] = xt_at(xt, k);
    for (int i = 1; i < RN; i++) {
      /* Prefer recent values, so chains and long-lived values both occur. */
      int a = i - 1 - (int)(rng_next(&r) % (uint32_t)(i < 4 ? i : 4));
      if (rng_next(&r) % 4 == 0) a = (int)(rng_next(&r) % (uint32_t)i);
      int bb = (int)(rng_next(&r) % (uint32_t)i);
      float v = (float)(rng_next(&r) % 7);
      switch (rng_next(&r) % 5) {
      case 0:
        nodes[i] = xt_call1(b.ctx, "test_add1", nodes[a], v);
        for (int k = 0; k < RD * RD; k++) ref[i][k] = ref[a][k] + v;
        break;
      case 1:
        nodes[i] = xt_call1(b.ctx, "test_add1c", nodes[a], v);
        for (int k = 0; k < RD * RD; k++) ref[i][k] = ref[a][k] + v;
        break;
      case 2:
        nodes[i] = xt_call2(b.ctx, "test_addb", nodes[a], nodes[bb]);
        for (int k = 0; k < RD * RD; k++) ref[i][k] = ref[a][k] + ref[bb][k];
        break;
      default:
        nodes[i] = view(&b, "test_t", nodes[a]);
        for (int k = 0; k < RD * RD; k++) ref[i][k] = ref[a][(k % RD) * RD + k / RD];
        break;
      }
    }
    int outs_i[3] = {RN - 1, (int)(rng_next(&r) % RN), (int)(rng_next(&r) % RN)};
    slapo_node *outs[3];
    for (int k = 0; k < 3; k++) outs[k] = nodes[outs_i[k]];
    slapo_output(b.ctx, 3, outs);

    for (int mode = 0; mode < 2; mode++) {
      slapo_plan_opts o = {.debug_alloc = mode == 1};
      slapo_plan *p = plan_run(&b, &o, xt);
      assert_true(slapo_plan_measured_peak_nbytes(p) <= slapo_plan_peak_nbytes(p) ||
                  mode == 1);
      for (int k = 0; k < 3; k++) {
        const slapo_tensor *y = slapo_plan_output(p, k);
        for (int e = 0; e < RD * RD; e++) {
          float got = xt_at(y, e);
          if (got != ref[outs_i[k]][e])
            fail_msg("seed %u mode %d output %d elem %d: got %g want %g", seed, mode, k, e,
                     got, ref[outs_i[k]][e]);
        }
      }
      slapo_plan_free(p);
    }
    slapo_tensor_free(xt);
    gb_free(&b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain_reuses_buffers),
      cmocka_unit_test(test_outputs_survive),
      cmocka_unit_test(test_view_extends_base_lifetime),
      cmocka_unit_test(test_view_outputs),
      cmocka_unit_test(test_deterministic_and_debug_mode),
      cmocka_unit_test(test_debug_poisons_dead_buffers),
      cmocka_unit_test(test_unbound_placeholder),
      cmocka_unit_test(test_bind_errors),
      cmocka_unit_test(test_plan_errors),
      cmocka_unit_test(test_eager),
      cmocka_unit_test(test_fast_and_reference),
      cmocka_unit_test(test_timing),
      cmocka_unit_test(test_strided_inputs),
      cmocka_unit_test(test_edge_shapes),
      cmocka_unit_test(test_random_dags),
  };
  return cmocka_run_group_tests(tests, xt_register, NULL);
}
