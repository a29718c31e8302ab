/* tests/unit/test_ops_reduce.c - the reduce op group (src/ops/reduce.c):
 * sum and mean over one or several axes (negative axes, keepdim, all axes,
 * no axes, empty dims), sum_to ([2, 3, 4] -> [3, 1], bias-style [N, C] ->
 * [C]), broadcast_to (also from a strided input), fast kernels against the
 * reference on shapes that take every fast path, and the shapes of the
 * gradient graphs the backward rules build. Kernels run directly
 * (node->op->ref / fast); one case runs through slapo_eager. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>

#include "common/opfix.h"
#include "slapo/exec.h"
#include "slapo/ops.h"


/* Both kernels of node (ref, and fast where there is one) on `in` against
 * want [n], to 1e-5 (1 + |want|). */
static void check_both(const slapo_node *node, const slapo_tensor *const *in, int n,
                       const float *want) {
  opfix_check_kernels(node, in, n, want, 1e-5f, 1e-5f);
}

/* ---- sum / mean ---- */

/* x = arange([2, 3, 4]), so x[i, j, k] = 12 i + 4 j + k. */
static void test_sum_one_axis(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {1};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 1, ax, false);
  assert_non_null(y);
  opfix_assert_shape(y, 2, (int64_t[]){2, 4});
  assert_string_equal(y->target, "sum");
  slapo_tensor *xt = opfix_arange(3, s);
  /* sum_j = 36 i + 12 + 3 k */
  float want[] = {12, 15, 18, 21, 48, 51, 54, 57};
  check_both(y, (const slapo_tensor *[]){xt}, 8, want);

  slapo_node *yk = slapo_sum(f->ctx, x, 1, ax, true);
  opfix_assert_shape(yk, 3, (int64_t[]){2, 1, 4});
  check_both(yk, (const slapo_tensor *[]){xt}, 8, want);
  slapo_tensor_free(xt);
}

static void test_sum_negative_axes(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {-1, 0};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 2, ax, false);
  opfix_assert_shape(y, 1, (int64_t[]){3});
  slapo_tensor *xt = opfix_arange(3, s);
  /* sum over i, k of 12 i + 4 j + k = 60 + 32 j */
  float want[] = {60, 92, 124};
  check_both(y, (const slapo_tensor *[]){xt}, 3, want);
  slapo_node *yk = slapo_sum(f->ctx, x, 2, ax, true);
  opfix_assert_shape(yk, 3, (int64_t[]){1, 3, 1});
  check_both(yk, (const slapo_tensor *[]){xt}, 3, want);
  slapo_tensor_free(xt);
}

static void test_sum_all_and_no_axes(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {0, 1, 2};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_tensor *xt = opfix_arange(3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 3, ax, false);
  assert_int_equal(y->ndim, 0);
  check_both(y, (const slapo_tensor *[]){xt}, 1, (float[]){276});
  slapo_node *yk = slapo_sum(f->ctx, x, 3, ax, true);
  opfix_assert_shape(yk, 3, (int64_t[]){1, 1, 1});
  check_both(yk, (const slapo_tensor *[]){xt}, 1, (float[]){276});
  /* The sum over no axes is x itself. */
  slapo_node *y0 = slapo_sum(f->ctx, x, 0, NULL, false);
  opfix_assert_shape(y0, 3, s);
  float want[24];
  for (int i = 0; i < 24; i++) want[i] = (float)i;
  check_both(y0, (const slapo_tensor *[]){xt}, 24, want);
  slapo_tensor_free(xt);
}

static void test_mean(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {-1};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *y = slapo_mean(f->ctx, x, 1, ax, true);
  opfix_assert_shape(y, 3, (int64_t[]){2, 3, 1});
  slapo_tensor *xt = opfix_arange(3, s);
  float want[6];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) want[3 * i + j] = 12.0f * i + 4.0f * j + 1.5f;
  check_both(y, (const slapo_tensor *[]){xt}, 6, want);
  /* Several axes: mean over i and j of 12 i + 4 j + k = 6 + 4 + k. */
  slapo_node *y2 = slapo_mean(f->ctx, x, 2, (int64_t[]){0, 1}, false);
  check_both(y2, (const slapo_tensor *[]){xt}, 4, (float[]){10, 11, 12, 13});
  slapo_tensor_free(xt);
}

static void test_empty_reductions(void **state) {
  opfix *f = *state;
  int64_t s[] = {3, 0}, ax[] = {1};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_tensor *xt = opfix_tensor(2, s, NULL);
  slapo_node *ys = slapo_sum(f->ctx, x, 1, ax, false);
  check_both(ys, (const slapo_tensor *[]){xt}, 3, (float[]){0, 0, 0});
  slapo_node *ym = slapo_mean(f->ctx, x, 1, ax, false);
  for (int fast = 0; fast < 2; fast++) {
    slapo_tensor *y = opfix_run(ym, (const slapo_tensor *[]){xt}, fast);
    for (int i = 0; i < 3; i++) assert_true(isnan(((float *)slapo_tensor_data(y))[i]));
    slapo_tensor_free(y);
  }
  slapo_tensor_free(xt);
}

/* ---- sum_to / broadcast_to ---- */

static void test_sum_to(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_tensor *xt = opfix_arange(3, s);
  slapo_node *y = slapo_sum_to(f->ctx, x, 2, (int64_t[]){3, 1});
  assert_non_null(y);
  opfix_assert_shape(y, 2, (int64_t[]){3, 1});
  check_both(y, (const slapo_tensor *[]){xt}, 3, (float[]){60, 92, 124});
  /* Bias style: sum over the leading dims. */
  slapo_node *yb = slapo_sum_to(f->ctx, x, 1, (int64_t[]){4});
  check_both(yb, (const slapo_tensor *[]){xt}, 4, (float[]){60, 66, 72, 78});
  slapo_node *y1 = slapo_sum_to(f->ctx, x, 3, (int64_t[]){1, 3, 4});
  float want[12];
  for (int j = 0; j < 3; j++)
    for (int k = 0; k < 4; k++) want[4 * j + k] = 12.0f + 8.0f * j + 2.0f * k;
  check_both(y1, (const slapo_tensor *[]){xt}, 12, want);
  slapo_node *ys = slapo_sum_to(f->ctx, x, 0, NULL);
  assert_int_equal(ys->ndim, 0);
  check_both(ys, (const slapo_tensor *[]){xt}, 1, (float[]){276});
  slapo_tensor_free(xt);
}

static void test_broadcast_to(void **state) {
  opfix *f = *state;
  int64_t s[] = {3, 1}, t[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_node *y = slapo_broadcast_to(f->ctx, x, 3, t);
  opfix_assert_shape(y, 3, t);
  slapo_tensor *xt = opfix_arange(2, s);
  float want[24];
  for (int i = 0; i < 24; i++) want[i] = (float)((i / 4) % 3);
  check_both(y, (const slapo_tensor *[]){xt}, 24, want);
  slapo_tensor_free(xt);

  /* A strided input: the transpose of a [4, 3] arange, read as [3, 4] and
   * broadcast to [2, 3, 4]. */
  int64_t s2[] = {4, 3};
  slapo_tensor *base = opfix_arange(2, s2), *tr;
  assert_ok(slapo_tensor_permute(base, (int[]){1, 0}, &tr));
  slapo_node *x2 = opfix_input(f, "x2", 2, (int64_t[]){3, 4});
  slapo_node *y2 = slapo_broadcast_to(f->ctx, x2, 3, t);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) want[12 * i + 4 * j + k] = (float)(3 * k + j);
  check_both(y2, (const slapo_tensor *[]){tr}, 24, want);
  slapo_tensor_free(tr);
  slapo_tensor_free(base);
}

/* ---- fast vs reference ---- */

static double max_rel_diff(const slapo_tensor *a, const slapo_tensor *b) {
  const float *p = slapo_tensor_data(a), *q = slapo_tensor_data(b);
  double m = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
    double d = fabs((double)p[i] - q[i]) / (1.0 + fabs((double)q[i]));
    if (!(d <= m)) m = d;
  }
  return m;
}

/* Compares the fast kernel with the reference on `node` for random x;
 * `bitwise` when the fast path must keep the reference's summation order. */
static void compare_fast(const slapo_node *node, int ndim, const int64_t *shape, bool bitwise) {
  slapo_tensor *xt = opfix_random(ndim, shape, -1, 1);
  slapo_tensor *r = opfix_run(node, (const slapo_tensor *[]){xt}, false);
  slapo_tensor *q = opfix_run(node, (const slapo_tensor *[]){xt}, true);
  if (bitwise) assert_true(slapo_tensor_equal(r, q));
  double d = max_rel_diff(q, r);
  if (d > 1e-6) fail_msg("%s: fast differs from ref by %g", node->name, d);
  slapo_tensor_free(q);
  slapo_tensor_free(r);
  slapo_tensor_free(xt);
}

static void test_fast_matches_ref_all_masks(void **state) {
  opfix *f = *state;
  int64_t s[] = {3, 5, 1, 7, 2};
  slapo_node *x = opfix_input(f, "x", 5, s);
  /* Every subset of axes, both keepdim settings, sum and mean. */
  for (int mask = 0; mask < 32; mask++) {
    int64_t ax[5];
    int n = 0;
    for (int d = 0; d < 5; d++)
      if (mask & (1 << d)) ax[n++] = d - (d & 1 ? 5 : 0); /* some negative */
    for (int keep = 0; keep < 2; keep++) {
      compare_fast(slapo_sum(f->ctx, x, n, ax, keep), 5, s, false);
      compare_fast(slapo_mean(f->ctx, x, n, ax, keep), 5, s, false);
    }
  }
  assert_ok(slapo_ctx_status(f->ctx));
}

static void test_fast_paths_large(void **state) {
  opfix *f = *state;
  /* Column sums (the bias gradient): strips of columns, same order as ref. */
  int64_t a[] = {600, 130};
  slapo_node *xa = opfix_input(f, "xa", 2, a);
  compare_fast(slapo_sum_to(f->ctx, xa, 1, (int64_t[]){130}), 2, a, true);
  /* Wide: several strips a thread, the last one shorter, none a multiple of
   * the 64-column tile. */
  int64_t aw[] = {300, 2500};
  slapo_node *xaw = opfix_input(f, "xaw", 2, aw);
  compare_fast(slapo_sum(f->ctx, xaw, 1, (int64_t[]){0}, false), 2, aw, true);
  /* Narrow and tall: row blocks. */
  int64_t b[] = {20000, 3};
  slapo_node *xb = opfix_input(f, "xb", 2, b);
  compare_fast(slapo_sum_to(f->ctx, xb, 2, (int64_t[]){1, 3}), 2, b, false);
  /* Middle axis of [B, T, C]: column sums per outer index. */
  int64_t c[] = {3, 400, 70};
  slapo_node *xc = opfix_input(f, "xc", 3, c);
  compare_fast(slapo_sum(f->ctx, xc, 1, (int64_t[]){1}, false), 3, c, true);
  /* Rows (last axis) and the full reduction in chunks. */
  int64_t d[] = {9, 40000};
  slapo_node *xd = opfix_input(f, "xd", 2, d);
  compare_fast(slapo_mean(f->ctx, xd, 1, (int64_t[]){-1}, false), 2, d, false);
  compare_fast(slapo_sum(f->ctx, xd, 2, (int64_t[]){0, 1}, false), 2, d, false);
  /* Outer and inner reduced around a kept middle dim. */
  int64_t e[] = {40, 30, 50};
  slapo_node *xe = opfix_input(f, "xe", 3, e);
  compare_fast(slapo_sum(f->ctx, xe, 2, (int64_t[]){0, 2}, true), 3, e, false);
  /* broadcast_to moves bytes: fast and ref agree exactly. */
  int64_t g[] = {30, 1};
  slapo_node *xg = opfix_input(f, "xg", 2, g);
  compare_fast(slapo_broadcast_to(f->ctx, xg, 3, e), 2, g, true);
  assert_ok(slapo_ctx_status(f->ctx));
}

/* Determinism: the same input gives the same bytes on a second run. */
static void test_fast_deterministic(void **state) {
  opfix *f = *state;
  int64_t b[] = {50000, 5};
  slapo_node *x = opfix_input(f, "x", 2, b);
  slapo_node *y = slapo_sum_to(f->ctx, x, 1, (int64_t[]){5});
  slapo_tensor *xt = opfix_random(2, b, -1, 1);
  slapo_tensor *r1 = opfix_run(y, (const slapo_tensor *[]){xt}, true);
  slapo_tensor *r2 = opfix_run(y, (const slapo_tensor *[]){xt}, true);
  assert_true(slapo_tensor_equal(r1, r2));
  slapo_tensor_free(r1);
  slapo_tensor_free(r2);
  slapo_tensor_free(xt);
}

/* ---- through the executor ---- */

static void test_eager_sum(void **state) {
  (void)state;
  int64_t s[] = {2, 3, 4}, ax[] = {1};
  slapo_tensor *xt = opfix_arange(3, s), *y;
  slapo_attr a[2] = {slapo_attr_ints("axes", 1, ax), slapo_attr_int("keepdim", 0)};
  for (int ref = 0; ref < 2; ref++) {
    slapo_plan_opts o = {.reference = ref};
    assert_ok(slapo_eager("sum", 1, (const slapo_tensor *[]){xt}, 2, a, NULL, &o, &y));
    opfix_assert_values(y, 8, (float[]){12, 15, 18, 21, 48, 51, 54, 57}, 1e-5f, 1e-5f);
    slapo_tensor_free(y);
  }
  slapo_tensor_free(xt);
}

/* ---- backward rules build the right nodes ---- */

/* The node y's backward rule builds for the gradient of its one input. */
static slapo_node *grad_of(opfix *f, slapo_node *y) {
  assert_non_null(y);
  assert_int_equal(y->n_inputs, 1);
  slapo_node *dx[1] = {NULL};
  opfix_backward(f, y, dx);
  assert_non_null(dx[0]);
  return dx[0];
}

static void test_backward_shapes(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 3, s);
  /* sum without keepdim: reshape to [2, 1, 4], then broadcast. */
  slapo_node *g = grad_of(f, slapo_sum(f->ctx, x, 1, (int64_t[]){-2}, false));
  assert_string_equal(g->target, "broadcast_to");
  assert_string_equal(g->inputs[0]->target, "reshape");
  opfix_assert_shape(g->inputs[0], 3, (int64_t[]){2, 1, 4});
  opfix_assert_shape(g, 3, s);
  /* mean with keepdim: scale by 1/3, then broadcast. */
  g = grad_of(f, slapo_mean(f->ctx, x, 1, (int64_t[]){1}, true));
  assert_string_equal(g->target, "broadcast_to");
  assert_string_equal(g->inputs[0]->target, "mul_scalar");
  assert_float_equal(slapo_node_attr_float(g->inputs[0], "value", 0), 1.0 / 3, 1e-12);
  /* sum_to <-> broadcast_to. */
  g = grad_of(f, slapo_sum_to(f->ctx, x, 2, (int64_t[]){3, 1}));
  assert_string_equal(g->target, "broadcast_to");
  opfix_assert_shape(g, 3, s);
  slapo_node *b = opfix_input(f, "b", 1, (int64_t[]){4});
  g = grad_of(f, slapo_broadcast_to(f->ctx, b, 3, s));
  assert_string_equal(g->target, "sum_to");
  opfix_assert_shape(g, 1, (int64_t[]){4});
  assert_ok(slapo_ctx_status(f->ctx));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sum_one_axis, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_negative_axes, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_all_and_no_axes, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_mean, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_empty_reductions, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_sum_to, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_to, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fast_matches_ref_all_masks, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fast_paths_large, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fast_deterministic, opfix_setup, opfix_teardown),
      cmocka_unit_test(test_eager_sum),
      cmocka_unit_test_setup_teardown(test_backward_shapes, opfix_setup, opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
