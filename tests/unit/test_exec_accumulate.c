/* tests/unit/test_exec_accumulate.c - accumulated outputs of the executor
 * (slapo_plan_opts.accumulate_from, slapo_plan_bind_accumulator), which
 * slapo_step uses for parameter gradients: values computed by kernels,
 * views and bound inputs are added into their accumulators on every run
 * (bitwise acc + value), a value still read by later nodes stays alive for
 * them, accumulated values leave the planned peak, slapo_plan_output gives
 * NULL for them, and binding or running wrongly fails with a message.
 * The accumulation flags: SLAPO_ACC_WRITE overwrites accumulators (bitwise
 * the value, whatever they held; written by the kernel itself when the
 * accumulator is aligned, copied when not), SLAPO_ACC_MEASURE records each
 * sum of squares; in-place ops (index_add) share their input's buffer only
 * when it has no later reader, also when the shared buffer is written
 * straight into an accumulator; one tensor bound to two outputs and unknown
 * flags are errors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <string.h>

#include "slapo/exec.h"
#include "slapo/ops.h"


enum { N = 1000, V = 40, C = 48, NI = 6 };

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

static double naive_sumsq(const slapo_tensor *t) {
  const float *d = slapo_tensor_data(t);
  double s = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) s += (double)d[i] * d[i];
  return s;
}

/* outputs: 0 y = sum(x) [kept]; 1 g1 = 2x (a kernel); 2 g2 = reshape(x + 3)
 * (a view of a kernel's buffer); 3 x itself (a bound input). */
static slapo_graph *build_grads(void) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t n = N, s2[2] = {10, 100}, ax = 0;
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *g1 = slapo_mul_scalar(ctx, x, 2.0);
  slapo_node *g2 = slapo_reshape(ctx, slapo_add_scalar(ctx, x, 3.0), 2, s2);
  slapo_node *outs[4] = {slapo_sum(ctx, x, 1, &ax, false), g1, g2, x};
  assert_non_null(slapo_output(ctx, 4, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

/* Accumulators full of NaN: a WRITE run leaves exactly the values, an ADD
 * run after it adds them once more, MEASURE gives each sum of squares. `off`
 * 1 makes g1's accumulator start 4 bytes past an aligned block, so its
 * kernel cannot write it directly and it is copied instead. */
static void write_then_add(int off) {
  slapo_graph *g = build_grads();
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(g, &opts, &p));
  int64_t n = N, n1 = N + 1, s2[2] = {10, 100};
  slapo_tensor *x = filled(1, &n, 0.5f, 0.25f), *whole = filled(1, &n1, NAN, 0), *a1;
  assert_ok(slapo_tensor_slice(whole, 0, off, off + N, 1, &a1));
  slapo_tensor *a2 = filled(2, s2, NAN, 0), *a3 = filled(1, &n, NAN, 0);
  assert_ok(slapo_plan_bind_input(p, "x", x));
  assert_ok(slapo_plan_bind_accumulator(p, 1, a1));
  assert_ok(slapo_plan_bind_accumulator(p, 2, a2));
  assert_ok(slapo_plan_bind_accumulator(p, 3, a3));
  assert_ok(slapo_plan_run_acc(p, NULL, SLAPO_ACC_WRITE | SLAPO_ACC_MEASURE));
  const float *xp = slapo_tensor_data(x), *p1 = slapo_tensor_data(a1);
  const float *p2 = slapo_tensor_data(a2), *p3 = slapo_tensor_data(a3);
  for (int i = 0; i < N; i++) {
    assert_true(p1[i] == xp[i] * 2.0f);
    assert_true(p2[i] == xp[i] + 3.0f);
    assert_true(p3[i] == xp[i]);
  }
  const slapo_tensor *acc[3] = {a1, a2, a3};
  for (int i = 1; i < 4; i++) {
    double want = naive_sumsq(acc[i - 1]), got = slapo_plan_accumulator_sumsq(p, i);
    assert_true(fabs(got - want) <= 1e-12 * want);
  }
  assert_true(isnan(slapo_plan_accumulator_sumsq(p, 0))); /* not accumulated */
  assert_ok(slapo_plan_run(p, NULL));
  assert_true(isnan(slapo_plan_accumulator_sumsq(p, 1))); /* that run did not measure */
  for (int i = 0; i < N; i++) {
    assert_true(p1[i] == xp[i] * 2.0f + xp[i] * 2.0f);
    assert_true(p3[i] == xp[i] + xp[i]);
  }
  slapo_plan_free(p);
  slapo_tensor_free(x);
  slapo_tensor_free(a1);
  slapo_tensor_free(whole);
  slapo_tensor_free(a2);
  slapo_tensor_free(a3);
  slapo_graph_free(g);
}

static void test_write_aligned(void **state) {
  (void)state;
  write_then_add(0);
}

static void test_write_misaligned(void **state) {
  (void)state;
  write_then_add(1);
}

/* base = 2 w [V, C]; y = index_add(base, idx, src). With `base_kept` base
 * is also an output kept until the next run, so index_add must not write
 * over it; with `base_acc` base is an accumulated output itself (added
 * before index_add changes the buffer). */
typedef struct scatter_graph {
  slapo_graph *g;
  int n_out;
} scatter_graph;

static scatter_graph build_scatter(bool base_kept, bool base_acc) {
  scatter_graph sg = {0};
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&sg.g));
  assert_ok(slapo_ctx_new(sg.g, &ctx));
  int64_t ws[2] = {V, C}, is[1] = {NI}, ss[2] = {NI, C}, ax[2] = {0, 1};
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, ws);
  slapo_node *idx = slapo_input(ctx, "idx", SLAPO_DTYPE_I32, 1, is);
  slapo_node *src = slapo_input(ctx, "src", SLAPO_DTYPE_F32, 2, ss);
  slapo_node *base = slapo_mul_scalar(ctx, w, 2.0);
  slapo_node *y = slapo_index_add(ctx, base, idx, src);
  slapo_node *sum = slapo_sum(ctx, w, 2, ax, false);
  slapo_node *outs[3] = {sum, y, base}; /* base_acc: base accumulated as output 2 */
  if (base_kept) outs[0] = base, outs[2] = sum;
  sg.n_out = base_kept || base_acc ? 3 : 2;
  assert_non_null(slapo_output(ctx, sg.n_out, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return sg;
}

static void scatter_inputs(slapo_tensor **w, slapo_tensor **idx, slapo_tensor **src) {
  int64_t ws[2] = {V, C}, is[1] = {NI}, ss[2] = {NI, C};
  *w = filled(2, ws, -1.0f, 0.001f);
  *src = filled(2, ss, 0.5f, 0.01f);
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 1, is, idx));
  int32_t rows[NI] = {3, 7, 3, 39, 0, 7}; /* repeats: sums in index order */
  memcpy(slapo_tensor_data(*idx), rows, sizeof rows);
}

/* y[v, c] = 2 w[v, c] plus src rows added in index order. */
static void check_scatter(const slapo_tensor *y, const slapo_tensor *w, const slapo_tensor *idx,
                          const slapo_tensor *src) {
  const float *yp = slapo_tensor_data(y), *wp = slapo_tensor_data(w), *sp = slapo_tensor_data(src);
  const int32_t *ip = slapo_tensor_data(idx);
  for (int v = 0; v < V; v++)
    for (int c = 0; c < C; c++) {
      float want = wp[v * C + c] * 2.0f;
      for (int k = 0; k < NI; k++)
        if (ip[k] == v) want += sp[k * C + c];
      assert_true(yp[v * C + c] == want);
    }
}

/* Unshared, base and y are two [V, C] buffers; shared, one. Fast and
 * reference kernels, planned and debug allocation. */
static void test_inplace_shares_only_a_dead_input(void **state) {
  (void)state;
  size_t buf = ((size_t)V * C * sizeof(float) + 63) & ~(size_t)63;
  for (int kept = 0; kept < 2; kept++)
    for (int mode = 0; mode < 4; mode++) {
      bool debug = mode & 1;
      scatter_graph sg = build_scatter(kept, false);
      slapo_plan *p;
      slapo_plan_opts opts = {.debug_alloc = debug, .reference = mode & 2};
      assert_ok(slapo_plan_new(sg.g, &opts, &p));
      if (!debug) assert_int_equal(slapo_plan_peak_nbytes(p), (kept ? 2 : 1) * buf + 64);
      slapo_tensor *w, *idx, *src;
      scatter_inputs(&w, &idx, &src);
      assert_ok(slapo_plan_bind_input(p, "w", w));
      assert_ok(slapo_plan_bind_input(p, "idx", idx));
      assert_ok(slapo_plan_bind_input(p, "src", src));
      for (int run = 0; run < 2; run++) {
        assert_ok(slapo_plan_run(p, NULL));
        check_scatter(slapo_plan_output(p, 1), w, idx, src);
        if (kept) {
          const float *b = slapo_tensor_data(slapo_plan_output(p, 0));
          const float *wp = slapo_tensor_data(w);
          for (int i = 0; i < V * C; i++) assert_true(b[i] == wp[i] * 2.0f);
        }
      }
      slapo_plan_free(p);
      slapo_tensor_free(w);
      slapo_tensor_free(idx);
      slapo_tensor_free(src);
      slapo_graph_free(sg.g);
    }
}

/* y and base both accumulated, base's buffer shared by index_add: a WRITE
 * run puts the buffer in y's accumulator, so base is copied out of it
 * before index_add adds the rows; ADD then adds both once more. */
static void test_inplace_into_accumulator(void **state) {
  (void)state;
  scatter_graph sg = build_scatter(false, true);
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(sg.g, &opts, &p));
  slapo_tensor *w, *idx, *src;
  scatter_inputs(&w, &idx, &src);
  int64_t ws[2] = {V, C};
  slapo_tensor *ay = filled(2, ws, NAN, 0), *ab = filled(2, ws, NAN, 0);
  assert_ok(slapo_plan_bind_input(p, "w", w));
  assert_ok(slapo_plan_bind_input(p, "idx", idx));
  assert_ok(slapo_plan_bind_input(p, "src", src));
  assert_ok(slapo_plan_bind_accumulator(p, 1, ay));
  assert_ok(slapo_plan_bind_accumulator(p, 2, ab));
  assert_ok(slapo_plan_run_acc(p, NULL, SLAPO_ACC_WRITE));
  check_scatter(ay, w, idx, src);
  const float *wp = slapo_tensor_data(w), *bp = slapo_tensor_data(ab);
  for (int i = 0; i < V * C; i++) assert_true(bp[i] == wp[i] * 2.0f);
  slapo_tensor *y1;
  assert_ok(slapo_tensor_contiguous(ay, &y1));
  assert_ok(slapo_plan_run(p, NULL));
  const float *yp = slapo_tensor_data(ay), *y1p = slapo_tensor_data(y1);
  for (int i = 0; i < V * C; i++) {
    assert_true(yp[i] == y1p[i] + y1p[i]);
    assert_true(bp[i] == wp[i] * 2.0f + wp[i] * 2.0f);
  }
  slapo_plan_free(p);
  slapo_tensor_free(y1);
  slapo_tensor_free(ay);
  slapo_tensor_free(ab);
  slapo_tensor_free(w);
  slapo_tensor_free(idx);
  slapo_tensor_free(src);
  slapo_graph_free(sg.g);
}

static void test_write_errors(void **state) {
  (void)state;
  slapo_graph *g = build_grads();
  slapo_plan *p;
  slapo_plan_opts opts = {.accumulate_from = 1};
  assert_ok(slapo_plan_new(g, &opts, &p));
  int64_t n = N;
  slapo_tensor *a = filled(1, &n, 0, 0), *x = filled(1, &n, 0, 1);
  assert_ok(slapo_plan_bind_accumulator(p, 1, a));
  assert_int_equal(slapo_plan_bind_accumulator(p, 3, a), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "shares memory with output 1"));
  assert_int_equal(slapo_plan_run_acc(p, NULL, 4), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "unknown accumulation flags 0x4"));
  slapo_plan_free(p);
  slapo_tensor_free(a);
  slapo_tensor_free(x);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values_accumulate_every_run),
      cmocka_unit_test(test_planned_peak),
      cmocka_unit_test(test_binding_errors),
      cmocka_unit_test(test_write_aligned),
      cmocka_unit_test(test_write_misaligned),
      cmocka_unit_test(test_inplace_shares_only_a_dead_input),
      cmocka_unit_test(test_inplace_into_accumulator),
      cmocka_unit_test(test_write_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
