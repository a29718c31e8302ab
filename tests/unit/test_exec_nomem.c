/* tests/unit/test_exec_nomem.c - allocation-failure sweeps over the exec
 * layer: building, planning, binding and running a graph (normal, debug
 * allocation and timing modes, with scratch copies for strided inputs) and
 * slapo_eager. Every failing allocation must give SLAPO_NOMEM and leak
 * nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "common/failalloc.h"
#include "exec_test_ops.h"

/* Builds x -> a -> transpose view -> add1c (scratch copy) -> addb with a
 * param, outputs (c, a); plans, binds a strided x and the param, runs twice
 * and checks the result. Frees everything. Returns the first failure. */
static slapo_status scenario(const slapo_plan_opts *opts) {
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo_plan *p = NULL;
  slapo_tensor *base = NULL, *xt = NULL, *w = NULL;
  int64_t s[2] = {4, 4};
  slapo_status st = slapo_graph_new(&g);
  if (st == SLAPO_OK) st = slapo_ctx_new(g, &ctx);
  if (st == SLAPO_OK) {
    slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
    slapo_node *pw = slapo_param(ctx, "h.0.w", SLAPO_DTYPE_F32, 2, s);
    slapo_node *a = xt_call1(ctx, "test_add1", x, 1.0);
    slapo_node *at = slapo_op_call(ctx, "test_t", 1, &a, 0, NULL);
    slapo_node *b = xt_call1(ctx, "test_add1c", at, 1.0);
    slapo_node *c = xt_call2(ctx, "test_addb", b, pw);
    slapo_node *d = xt_call1(ctx, "test_add1c", x, 0.0);
    slapo_node *outs[3] = {c, a, d};
    slapo_output(ctx, 3, outs);
    st = slapo_ctx_status(ctx);
  }
  if (st == SLAPO_OK) st = slapo_plan_new(g, opts, &p);
  if (st == SLAPO_OK) st = slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &base);
  if (st == SLAPO_OK) st = slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &w);
  if (st == SLAPO_OK) {
    int perm[2] = {1, 0};
    st = slapo_tensor_permute(base, perm, &xt);
  }
  if (st == SLAPO_OK) st = slapo_plan_bind_input(p, "x", xt);
  if (st == SLAPO_OK) st = slapo_plan_bind_param(p, "h.0.w", w);
  if (st == SLAPO_OK) {
    float *bd = slapo_tensor_data(base), *wd = slapo_tensor_data(w);
    for (int i = 0; i < 16; i++) bd[i] = (float)i, wd[i] = 100.0f;
    st = slapo_plan_run(p, NULL);
  }
  if (st == SLAPO_OK) st = slapo_plan_run(p, NULL);
  if (st == SLAPO_OK) {
    /* c[i][j] = (x[j][i] + 1) + 1 + 100 with x[j][i] = base[i][j]. */
    const slapo_tensor *c = slapo_plan_output(p, 0);
    for (int i = 0; i < 16; i++) assert_float_equal(xt_at(c, i), (float)i + 102.0f, 0);
    const slapo_tensor *d = slapo_plan_output(p, 2);
    for (int i = 0; i < 16; i++) assert_float_equal(xt_at(d, i), xt_at(xt, i), 0);
  }
  slapo_tensor_free(xt);
  slapo_tensor_free(base);
  slapo_tensor_free(w);
  slapo_plan_free(p);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return st;
}

/* slapo_eager on a strided input (view op and contiguous_inputs op). */
static slapo_status eager_scenario(const slapo_plan_opts *opts) {
  slapo_tensor *base = NULL, *xt = NULL, *y = NULL, *z = NULL;
  int64_t s[2] = {3, 5};
  slapo_status st = slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &base);
  if (st == SLAPO_OK) {
    int perm[2] = {1, 0};
    st = slapo_tensor_permute(base, perm, &xt);
  }
  if (st == SLAPO_OK) {
    const slapo_tensor *in[1] = {xt};
    slapo_attr v = slapo_attr_float("v", 2.0);
    st = slapo_eager("test_add1c", 1, in, 1, &v, NULL, opts, &y);
  }
  if (st == SLAPO_OK) {
    const slapo_tensor *in[1] = {xt};
    st = slapo_eager("test_t", 1, in, 0, NULL, NULL, opts, &z);
  }
  if (st == SLAPO_OK) {
    assert_float_equal(xt_at(y, 0), 2.0f, 0);
    assert_true(slapo_tensor_is_contiguous(z));
  }
  slapo_tensor_free(z);
  slapo_tensor_free(y);
  slapo_tensor_free(xt);
  slapo_tensor_free(base);
  return st;
}

/* Fails allocation k = 0, 1, ... until the scenario succeeds. */
static void sweep(slapo_status (*fn)(const slapo_plan_opts *), const slapo_plan_opts *opts) {
  long k = 0;
  for (;; k++) {
    failalloc_install(k);
    slapo_status st = fn(opts);
    long attempts = failalloc_attempts(), live = failalloc_live();
    failalloc_uninstall();
    if (live != 0) fail_msg("fail_at %ld: %ld blocks leaked (status %s)", k, live,
                            slapo_status_name(st));
    if (st == SLAPO_OK) {
      assert_true(attempts <= k);
      break;
    }
    if (st != SLAPO_NOMEM)
      fail_msg("fail_at %ld: status %s (%s), expected nomem", k, slapo_status_name(st),
               slapo_last_error());
  }
  assert_true(k > 10); /* the sweep reached the plan, not only the graph */
}

static void test_nomem_plan_run(void **state) {
  (void)state;
  sweep(scenario, NULL);
}

static void test_nomem_plan_run_debug(void **state) {
  (void)state;
  slapo_plan_opts o = {.debug_alloc = true, .timing = true};
  sweep(scenario, &o);
}

static void test_nomem_eager(void **state) {
  (void)state;
  sweep(eager_scenario, NULL);
  slapo_plan_opts o = {.debug_alloc = true};
  sweep(eager_scenario, &o);
}

/* After the first run (which sizes the scratch for strided inputs), a run
 * allocates nothing: headers and the arena are built at plan time. */
static void test_run_allocates_nothing(void **state) {
  (void)state;
  failalloc_install(-1);
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_plan *p;
  slapo_tensor *base, *xt;
  int64_t s[2] = {4, 4};
  int perm[2] = {1, 0};
  assert_int_equal(slapo_graph_new(&g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(g, &ctx), SLAPO_OK);
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, s);
  slapo_node *a = xt_call1(ctx, "test_add1c", x, 1.0); /* strided x: scratch copy */
  slapo_node *at = slapo_op_call(ctx, "test_t", 1, &a, 0, NULL);
  slapo_node *b = xt_call1(ctx, "test_add1c", at, 1.0); /* strided view: scratch copy */
  slapo_node *c = xt_call2(ctx, "test_addb", b, a);
  slapo_output(ctx, 1, &c);
  assert_int_equal(slapo_ctx_status(ctx), SLAPO_OK);
  slapo_plan_opts o = {.timing = true};
  assert_int_equal(slapo_plan_new(g, &o, &p), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &base), SLAPO_OK);
  assert_int_equal(slapo_tensor_permute(base, perm, &xt), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "x", xt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  long before = failalloc_attempts();
  for (int i = 0; i < 3; i++) assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  assert_int_equal(failalloc_attempts(), before);
  slapo_tensor_free(xt);
  slapo_tensor_free(base);
  slapo_plan_free(p);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  assert_int_equal(failalloc_live(), 0);
  failalloc_uninstall();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nomem_plan_run),
      cmocka_unit_test(test_nomem_plan_run_debug),
      cmocka_unit_test(test_nomem_eager),
      cmocka_unit_test(test_run_allocates_nothing),
  };
  return cmocka_run_group_tests(tests, xt_register, NULL);
}
