/* tests/unit/test_autocast.c - GEMMs under autocast (slapo_ctx_set_autocast):
 * two linears sharing x and w, then an attention-like batched product
 * q @ k^T, forward and backward, built OFF (f32), BF16 (to_bf16 casts,
 * bf16 GEMMs) and BF16_EMULATED (round_bf16 in f32). BF16 must match the
 * emulated form at the f32 tolerance (the same rounding points; only the
 * order of the f32 sums differs), with fast and reference kernels and at
 * every ISA cap; and plain f32 within bf16's loose bound, while differing
 * from it (the rounding is really there). The graph casts each value once,
 * and a bf16 value's gradient is f32. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <string.h>

#include "slapo/autograd.h"
#include "slapo/core.h"
#include "slapo/exec.h"
#include "slapo/ops.h"
#include "slapo/tensor.h"

enum { B = 3, T = 5, C = 32, H = 24, N_IN = 4, N_OUT = 4 };

static const char *const IN_NAMES[N_IN] = {"x", "w", "b", "dy"};
static const int IN_NDIM[N_IN] = {3, 2, 1, 3};
static const int64_t IN_SHAPE[N_IN][3] = {{B, T, C}, {H, C}, {H}, {B, T, T}};

static int64_t numel(int i) {
  int64_t n = 1;
  for (int d = 0; d < IN_NDIM[i]; d++) n *= IN_SHAPE[i][d];
  return n;
}

/* Outputs: s = linear(x, w, b) @ linear(x, w)^T [B, T, T], then dx, dw, db
 * for the cotangent dy. */
typedef struct result {
  slapo_tensor *out[N_OUT];
  int n_to_bf16, n_round;
} result;

static slapo_node *build(slapo_ctx *ctx, slapo_autocast mode, slapo_node **in) {
  for (int i = 0; i < N_IN; i++)
    in[i] = slapo_input(ctx, IN_NAMES[i], SLAPO_DTYPE_F32, IN_NDIM[i], IN_SHAPE[i]);
  slapo_ctx_set_autocast(ctx, mode);
  slapo_node *q = slapo_linear(ctx, in[0], in[1], in[2]);
  slapo_node *k = slapo_linear(ctx, in[0], in[1], NULL);
  slapo_node *s = slapo_matmul(ctx, q, k, false, true);
  slapo_ctx_set_autocast(ctx, SLAPO_AUTOCAST_OFF);
  return s;
}

static void run(slapo_autocast mode, bool reference, float *const *data, result *r) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *in[N_IN], *outs[N_OUT];
  outs[0] = build(ctx, mode, in);
  OK(slapo_backward(ctx, outs[0], in[3], 3, in, outs + 1));
  assert_non_null(slapo_output(ctx, N_OUT, outs));
  OK(slapo_ctx_status(ctx));
  for (int i = 1; i < N_OUT; i++) assert_int_equal(outs[i]->dtype, SLAPO_DTYPE_F32);
  r->n_to_bf16 = r->n_round = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (n->op == slapo_op_find("to_bf16")) r->n_to_bf16++;
    if (n->op == slapo_op_find("round_bf16")) r->n_round++;
  }
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  slapo_tensor *t[N_IN];
  for (int i = 0; i < N_IN; i++) {
    OK(slapo_tensor_wrap(SLAPO_DTYPE_F32, IN_NDIM[i], IN_SHAPE[i], data[i], &t[i]));
    OK(slapo_plan_bind_input(p, IN_NAMES[i], t[i]));
  }
  slapo_kernel_env env = {0};
  OK(slapo_plan_run(p, &env));
  for (int i = 0; i < N_OUT; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &r->out[i]));
  slapo_plan_free(p);
  for (int i = 0; i < N_IN; i++) slapo_tensor_free(t[i]);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void result_free(result *r) {
  for (int i = 0; i < N_OUT; i++) slapo_tensor_free(r->out[i]);
}

/* max |a - b| - (atol + rtol |b|) over every output: <= 0 means within. */
static double excess(const result *a, const result *b, double atol, double rtol,
                     double *max_diff) {
  double worst = -INFINITY;
  *max_diff = 0;
  for (int i = 0; i < N_OUT; i++) {
    const float *x = slapo_tensor_data(a->out[i]), *y = slapo_tensor_data(b->out[i]);
    for (int64_t j = 0; j < slapo_tensor_numel(a->out[i]); j++) {
      double d = fabs((double)x[j] - (double)y[j]);
      if (d > *max_diff) *max_diff = d;
      double e = d - (atol + rtol * fabs((double)y[j]));
      if (e > worst) worst = e;
    }
  }
  return worst;
}

/* max over outputs of max|a - b| / max|b|: bf16's loose bound is on this
 * scale (elementwise, cancellation makes small entries arbitrarily off). */
static double scaled_diff(const result *a, const result *b) {
  double worst = 0;
  for (int i = 0; i < N_OUT; i++) {
    const float *x = slapo_tensor_data(a->out[i]), *y = slapo_tensor_data(b->out[i]);
    double d = 0, m = 0;
    for (int64_t j = 0; j < slapo_tensor_numel(a->out[i]); j++) {
      d = fmax(d, fabs((double)x[j] - (double)y[j]));
      m = fmax(m, fabs((double)y[j]));
    }
    worst = fmax(worst, d / m);
  }
  return worst;
}

static float *g_data[N_IN];

static int setup(void **state) {
  (void)state;
  uint64_t s = 0x5eed;
  for (int i = 0; i < N_IN; i++) {
    g_data[i] = slapo_aligned_alloc((size_t)numel(i) * sizeof(float));
    for (int64_t j = 0; j < numel(i); j++) {
      s = s * 6364136223846793005u + 1442695040888963407u;
      g_data[i][j] = (float)((double)(s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < N_IN; i++) slapo_aligned_free(g_data[i]);
  return 0;
}

static void bf16_matches_emulation(void **state) {
  (void)state;
  result emu, f32;
  run(SLAPO_AUTOCAST_BF16_EMULATED, false, g_data, &emu);
  run(SLAPO_AUTOCAST_OFF, false, g_data, &f32);
  /* The rounding points are real: emulated differs from f32, within bf16's
   * 8 significant bits over these short sums. */
  double sd = scaled_diff(&emu, &f32);
  print_message("emulated bf16 vs f32: max |diff| / max |f32| = %.3g\n", sd);
  assert_true(sd > 1e-4 && sd < 1e-2);
  double d;
  slapo_isa host = slapo_isa_host();
  for (int lv = (int)host; lv >= SLAPO_ISA_BASELINE; lv--) {
    slapo_isa_set_max((slapo_isa)lv);
    for (int ref = 0; ref < 2; ref++) {
      result bf;
      run(SLAPO_AUTOCAST_BF16, ref, g_data, &bf);
      double e = excess(&bf, &emu, 1e-5, 1e-4, &d);
      if (e > 0) {
        slapo_isa_set_max(host);
        fail_msg("%s kernels at %s: bf16 vs emulated max |diff| %g beyond 1e-5 + 1e-4 |b|",
                 ref ? "reference" : "fast", slapo_isa_name((slapo_isa)lv), d);
      }
      result_free(&bf);
    }
  }
  slapo_isa_set_max(host);
  result_free(&emu);
  result_free(&f32);
}

/* x and w, each read by two GEMMs, are cast once; q and k once each for
 * the product; dy once per GEMM backward (3). Emulated: the same operand
 * rounding (4) plus dy's, one per GEMM (3). */
static void casts_once(void **state) {
  (void)state;
  result r;
  run(SLAPO_AUTOCAST_BF16, false, g_data, &r);
  assert_int_equal(r.n_to_bf16, 4 + 3);
  assert_int_equal(r.n_round, 0);
  result_free(&r);
  run(SLAPO_AUTOCAST_BF16_EMULATED, false, g_data, &r);
  assert_int_equal(r.n_to_bf16, 0);
  assert_int_equal(r.n_round, 4 + 3);
  result_free(&r);
  run(SLAPO_AUTOCAST_OFF, false, g_data, &r);
  assert_int_equal(r.n_to_bf16 + r.n_round, 0);
  result_free(&r);
}

/* to_bf16's gradient is dy itself, f32 (straight through). */
static void cast_gradient(void **state) {
  (void)state;
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, (int64_t[]){3, 5});
  slapo_node *y = slapo_to_bf16(ctx, x);
  assert_int_equal(y->dtype, SLAPO_DTYPE_BF16);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, (int64_t[]){3, 5});
  slapo_node *dx = NULL;
  OK(slapo_backward(ctx, y, dy, 1, &x, &dx));
  assert_ptr_equal(dx, dy);
  /* A bf16 seed is refused: gradients of bf16 values are f32. */
  slapo_node *bad = slapo_to_bf16(ctx, dy);
  assert_int_equal(slapo_backward(ctx, y, bad, 1, &x, &dx), SLAPO_DTYPE);
  assert_non_null(strstr(slapo_ctx_message(ctx), "takes f32 gradients"));
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cast_gradient),
      cmocka_unit_test(casts_once),
      cmocka_unit_test(bf16_matches_emulation),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
