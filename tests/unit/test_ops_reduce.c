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

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "slapo/exec.h"
#include "slapo/ops.h"

#define assert_ok(expr) assert_int_equal((expr), SLAPO_OK)

/* ---- helpers ---- */

typedef struct fixture {
  slapo_graph *g;
  slapo_ctx *ctx;
} fixture;

static int setup(void **state) {
  static fixture f;
  assert_ok(slapo_graph_new(&f.g));
  assert_ok(slapo_ctx_new(f.g, &f.ctx));
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
  return 0;
}

static slapo_tensor *tensor(int ndim, const int64_t *shape) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  return t;
}

/* f32 tensor holding 0, 1, 2, ... in row-major order. */
static slapo_tensor *arange(int ndim, const int64_t *shape) {
  slapo_tensor *t = tensor(ndim, shape);
  float *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = (float)i;
  return t;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)((g_rng >> 40) * 0x1p-24);
}

static slapo_tensor *random_tensor(int ndim, const int64_t *shape) {
  slapo_tensor *t = tensor(ndim, shape);
  float *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = uniform(-1, 1);
  return t;
}

/* Runs node's reference (fast = false) or fast kernel; owned result. The
 * output is poisoned with NaN first: kernels must write every element. */
static slapo_tensor *run(const slapo_node *node, const slapo_tensor *const *in, bool fast) {
  assert_non_null(node);
  slapo_tensor *out;
  assert_ok(slapo_tensor_new(node->dtype, node->ndim, node->shape, &out));
  if (node->dtype == SLAPO_DTYPE_F32) {
    float *o = slapo_tensor_data(out);
    for (int64_t i = 0; i < slapo_tensor_numel(out); i++) o[i] = NAN;
  }
  slapo_kernel_env env = {0};
  slapo_kernel_fn k = fast ? node->op->fast : node->op->ref;
  assert_non_null(k);
  k(node, in, out, &env);
  return out;
}

static void assert_shape(const slapo_node *n, int ndim, const int64_t *shape) {
  char a[128], b[128];
  if (!slapo_shape_equal(n->ndim, n->shape, ndim, shape))
    fail_msg("shape %s, expected %s", slapo_shape_str(n->ndim, n->shape, a, sizeof a),
             slapo_shape_str(ndim, shape, b, sizeof b));
}

static void assert_values(const slapo_tensor *t, int n, const float *want) {
  assert_int_equal(slapo_tensor_numel(t), n);
  const float *p = slapo_tensor_data(t);
  for (int i = 0; i < n; i++)
    if (!(fabsf(p[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i]))))
      fail_msg("element %d: %g, expected %g", i, p[i], want[i]);
}

/* Runs both kernels of node on `in` and checks each against want [n]. */
static void check_both(const slapo_node *node, const slapo_tensor *const *in, int n,
                       const float *want) {
  for (int fast = 0; fast < 2; fast++) {
    if (fast && !node->op->fast) continue;
    slapo_tensor *y = run(node, in, fast);
    assert_values(y, n, want);
    slapo_tensor_free(y);
  }
}

static slapo_node *input(fixture *f, const char *name, int ndim, const int64_t *shape) {
  slapo_node *x = slapo_input(f->ctx, name, SLAPO_DTYPE_F32, ndim, shape);
  assert_non_null(x);
  return x;
}

/* ---- sum / mean ---- */

/* x = arange([2, 3, 4]), so x[i, j, k] = 12 i + 4 j + k. */
static void test_sum_one_axis(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {1};
  slapo_node *x = input(f, "x", 3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 1, ax, false);
  assert_non_null(y);
  assert_shape(y, 2, (int64_t[]){2, 4});
  assert_string_equal(y->target, "sum");
  slapo_tensor *xt = arange(3, s);
  /* sum_j = 36 i + 12 + 3 k */
  float want[] = {12, 15, 18, 21, 48, 51, 54, 57};
  check_both(y, (const slapo_tensor *[]){xt}, 8, want);

  slapo_node *yk = slapo_sum(f->ctx, x, 1, ax, true);
  assert_shape(yk, 3, (int64_t[]){2, 1, 4});
  check_both(yk, (const slapo_tensor *[]){xt}, 8, want);
  slapo_tensor_free(xt);
}

static void test_sum_negative_axes(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {-1, 0};
  slapo_node *x = input(f, "x", 3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 2, ax, false);
  assert_shape(y, 1, (int64_t[]){3});
  slapo_tensor *xt = arange(3, s);
  /* sum over i, k of 12 i + 4 j + k = 60 + 32 j */
  float want[] = {60, 92, 124};
  check_both(y, (const slapo_tensor *[]){xt}, 3, want);
  slapo_node *yk = slapo_sum(f->ctx, x, 2, ax, true);
  assert_shape(yk, 3, (int64_t[]){1, 3, 1});
  check_both(yk, (const slapo_tensor *[]){xt}, 3, want);
  slapo_tensor_free(xt);
}

static void test_sum_all_and_no_axes(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {0, 1, 2};
  slapo_node *x = input(f, "x", 3, s);
  slapo_tensor *xt = arange(3, s);
  slapo_node *y = slapo_sum(f->ctx, x, 3, ax, false);
  assert_int_equal(y->ndim, 0);
  check_both(y, (const slapo_tensor *[]){xt}, 1, (float[]){276});
  slapo_node *yk = slapo_sum(f->ctx, x, 3, ax, true);
  assert_shape(yk, 3, (int64_t[]){1, 1, 1});
  check_both(yk, (const slapo_tensor *[]){xt}, 1, (float[]){276});
  /* The sum over no axes is x itself. */
  slapo_node *y0 = slapo_sum(f->ctx, x, 0, NULL, false);
  assert_shape(y0, 3, s);
  float want[24];
  for (int i = 0; i < 24; i++) want[i] = (float)i;
  check_both(y0, (const slapo_tensor *[]){xt}, 24, want);
  slapo_tensor_free(xt);
}

static void test_mean(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4}, ax[] = {-1};
  slapo_node *x = input(f, "x", 3, s);
  slapo_node *y = slapo_mean(f->ctx, x, 1, ax, true);
  assert_shape(y, 3, (int64_t[]){2, 3, 1});
  slapo_tensor *xt = arange(3, s);
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
  fixture *f = *state;
  int64_t s[] = {3, 0}, ax[] = {1};
  slapo_node *x = input(f, "x", 2, s);
  slapo_tensor *xt = tensor(2, s);
  slapo_node *ys = slapo_sum(f->ctx, x, 1, ax, false);
  check_both(ys, (const slapo_tensor *[]){xt}, 3, (float[]){0, 0, 0});
  slapo_node *ym = slapo_mean(f->ctx, x, 1, ax, false);
  for (int fast = 0; fast < 2; fast++) {
    slapo_tensor *y = run(ym, (const slapo_tensor *[]){xt}, fast);
    for (int i = 0; i < 3; i++) assert_true(isnan(((float *)slapo_tensor_data(y))[i]));
    slapo_tensor_free(y);
  }
  slapo_tensor_free(xt);
}

/* ---- sum_to / broadcast_to ---- */

static void test_sum_to(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = input(f, "x", 3, s);
  slapo_tensor *xt = arange(3, s);
  slapo_node *y = slapo_sum_to(f->ctx, x, 2, (int64_t[]){3, 1});
  assert_non_null(y);
  assert_shape(y, 2, (int64_t[]){3, 1});
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
  fixture *f = *state;
  int64_t s[] = {3, 1}, t[] = {2, 3, 4};
  slapo_node *x = input(f, "x", 2, s);
  slapo_node *y = slapo_broadcast_to(f->ctx, x, 3, t);
  assert_shape(y, 3, t);
  slapo_tensor *xt = arange(2, s);
  float want[24];
  for (int i = 0; i < 24; i++) want[i] = (float)((i / 4) % 3);
  check_both(y, (const slapo_tensor *[]){xt}, 24, want);
  slapo_tensor_free(xt);

  /* A strided input: the transpose of a [4, 3] arange, read as [3, 4] and
   * broadcast to [2, 3, 4]. */
  int64_t s2[] = {4, 3};
  slapo_tensor *base = arange(2, s2), *tr;
  assert_ok(slapo_tensor_permute(base, (int[]){1, 0}, &tr));
  slapo_node *x2 = input(f, "x2", 2, (int64_t[]){3, 4});
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
  slapo_tensor *xt = random_tensor(ndim, shape);
  slapo_tensor *r = run(node, (const slapo_tensor *[]){xt}, false);
  slapo_tensor *q = run(node, (const slapo_tensor *[]){xt}, true);
  if (bitwise) assert_true(slapo_tensor_equal(r, q));
  double d = max_rel_diff(q, r);
  if (d > 1e-6) fail_msg("%s: fast differs from ref by %g", node->name, d);
  slapo_tensor_free(q);
  slapo_tensor_free(r);
  slapo_tensor_free(xt);
}

static void test_fast_matches_ref_all_masks(void **state) {
  fixture *f = *state;
  int64_t s[] = {3, 5, 1, 7, 2};
  slapo_node *x = input(f, "x", 5, s);
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
  fixture *f = *state;
  /* Column sums (the bias gradient): tiles of columns, same order as ref. */
  int64_t a[] = {600, 130};
  slapo_node *xa = input(f, "xa", 2, a);
  compare_fast(slapo_sum_to(f->ctx, xa, 1, (int64_t[]){130}), 2, a, true);
  /* Narrow and tall: row blocks. */
  int64_t b[] = {20000, 3};
  slapo_node *xb = input(f, "xb", 2, b);
  compare_fast(slapo_sum_to(f->ctx, xb, 2, (int64_t[]){1, 3}), 2, b, false);
  /* Middle axis of [B, T, C]: column sums per outer index. */
  int64_t c[] = {3, 400, 70};
  slapo_node *xc = input(f, "xc", 3, c);
  compare_fast(slapo_sum(f->ctx, xc, 1, (int64_t[]){1}, false), 3, c, true);
  /* Rows (last axis) and the full reduction in chunks. */
  int64_t d[] = {9, 40000};
  slapo_node *xd = input(f, "xd", 2, d);
  compare_fast(slapo_mean(f->ctx, xd, 1, (int64_t[]){-1}, false), 2, d, false);
  compare_fast(slapo_sum(f->ctx, xd, 2, (int64_t[]){0, 1}, false), 2, d, false);
  /* Outer and inner reduced around a kept middle dim. */
  int64_t e[] = {40, 30, 50};
  slapo_node *xe = input(f, "xe", 3, e);
  compare_fast(slapo_sum(f->ctx, xe, 2, (int64_t[]){0, 2}, true), 3, e, false);
  /* broadcast_to moves bytes: fast and ref agree exactly. */
  int64_t g[] = {30, 1};
  slapo_node *xg = input(f, "xg", 2, g);
  compare_fast(slapo_broadcast_to(f->ctx, xg, 3, e), 2, g, true);
  assert_ok(slapo_ctx_status(f->ctx));
}

/* Determinism: the same input gives the same bytes on a second run. */
static void test_fast_deterministic(void **state) {
  fixture *f = *state;
  int64_t b[] = {50000, 5};
  slapo_node *x = input(f, "x", 2, b);
  slapo_node *y = slapo_sum_to(f->ctx, x, 1, (int64_t[]){5});
  slapo_tensor *xt = random_tensor(2, b);
  slapo_tensor *r1 = run(y, (const slapo_tensor *[]){xt}, true);
  slapo_tensor *r2 = run(y, (const slapo_tensor *[]){xt}, true);
  assert_true(slapo_tensor_equal(r1, r2));
  slapo_tensor_free(r1);
  slapo_tensor_free(r2);
  slapo_tensor_free(xt);
}

/* ---- through the executor ---- */

static void test_eager_sum(void **state) {
  (void)state;
  int64_t s[] = {2, 3, 4}, ax[] = {1};
  slapo_tensor *xt = arange(3, s), *y;
  slapo_attr a[2] = {slapo_attr_ints("axes", 1, ax), slapo_attr_int("keepdim", 0)};
  for (int ref = 0; ref < 2; ref++) {
    slapo_plan_opts o = {.reference = ref};
    assert_ok(slapo_eager("sum", 1, (const slapo_tensor *[]){xt}, 2, a, NULL, &o, &y));
    assert_values(y, 8, (float[]){12, 15, 18, 21, 48, 51, 54, 57});
    slapo_tensor_free(y);
  }
  slapo_tensor_free(xt);
}

/* ---- backward rules build the right nodes ---- */

static slapo_node *grad_of(fixture *f, slapo_node *y, int i) {
  slapo_node *dy = input(f, "dy", y->ndim, y->shape);
  bool need[1] = {true};
  slapo_node *dx[1] = {NULL};
  (void)i;
  assert_ok(y->op->backward(f->ctx, y, dy, need, dx));
  assert_non_null(dx[0]);
  return dx[0];
}

static void test_backward_shapes(void **state) {
  fixture *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = input(f, "x", 3, s);
  /* sum without keepdim: reshape to [2, 1, 4], then broadcast. */
  slapo_node *g = grad_of(f, slapo_sum(f->ctx, x, 1, (int64_t[]){-2}, false), 0);
  assert_string_equal(g->target, "broadcast_to");
  assert_string_equal(g->inputs[0]->target, "reshape");
  assert_shape(g->inputs[0], 3, (int64_t[]){2, 1, 4});
  assert_shape(g, 3, s);
  /* mean with keepdim: scale by 1/3, then broadcast. */
  g = grad_of(f, slapo_mean(f->ctx, x, 1, (int64_t[]){1}, true), 0);
  assert_string_equal(g->target, "broadcast_to");
  assert_string_equal(g->inputs[0]->target, "mul_scalar");
  assert_float_equal(slapo_node_attr_float(g->inputs[0], "value", 0), 1.0 / 3, 1e-12);
  /* sum_to <-> broadcast_to. */
  g = grad_of(f, slapo_sum_to(f->ctx, x, 2, (int64_t[]){3, 1}), 0);
  assert_string_equal(g->target, "broadcast_to");
  assert_shape(g, 3, s);
  slapo_node *b = input(f, "b", 1, (int64_t[]){4});
  g = grad_of(f, slapo_broadcast_to(f->ctx, b, 3, s), 0);
  assert_string_equal(g->target, "sum_to");
  assert_shape(g, 1, (int64_t[]){4});
  assert_ok(slapo_ctx_status(f->ctx));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sum_one_axis, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_negative_axes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_all_and_no_axes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mean, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_reductions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sum_to, setup, teardown),
      cmocka_unit_test_setup_teardown(test_broadcast_to, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fast_matches_ref_all_masks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fast_paths_large, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fast_deterministic, setup, teardown),
      cmocka_unit_test(test_eager_sum),
      cmocka_unit_test_setup_teardown(test_backward_shapes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
