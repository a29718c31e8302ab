/* tests/unit/test_autocast_conv.c - conv2d under autocast, forward and
 * backward (dx, dw, db), with groups, stride, padding and dilation away
 * from their defaults: BF16 (to_bf16 casts, bf16 operands widened by the
 * kernels) matches BF16_EMULATED (round_bf16 in f32) at the f32 tolerance
 * with fast and reference kernels, and plain f32 within bf16's bound while
 * differing from it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>

#include "slapo/autograd.h"
#include "slapo/exec.h"
#include "slapo/ops.h"
#include "slapo/tensor.h"

enum { N_IN = 4, N_OUT = 4 };
static const char *const NAMES[N_IN] = {"x", "w", "b", "dy"};
static const int NDIM[N_IN] = {4, 4, 1, 4};
/* x [2, 4, 7, 6], w [6, 2, 3, 3] (groups 2), stride (2, 1), padding (1, 1),
 * dilation (1, 2) -> y [2, 6, 4, 4]. */
static const int64_t SHAPE[N_IN][4] = {{2, 4, 7, 6}, {6, 2, 3, 3}, {6}, {2, 6, 4, 4}};
static float *g_data[N_IN];

static int64_t numel(int i) {
  int64_t n = 1;
  for (int d = 0; d < NDIM[i]; d++) n *= SHAPE[i][d];
  return n;
}

/* y = conv2d(x, w, b), then dx, dw, db for the cotangent dy; outputs
 * copied to out[] (owned by the caller); the count of cast nodes too. */
static void run(slapo_autocast mode, bool reference, slapo_tensor **out, int *n_casts) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *in[N_IN], *outs[N_OUT];
  for (int i = 0; i < N_IN; i++) in[i] = slapo_input(ctx, NAMES[i], SLAPO_DTYPE_F32, NDIM[i], SHAPE[i]);
  slapo_ctx_set_autocast(ctx, mode);
  outs[0] = slapo_conv2d(ctx, in[0], in[1], in[2], (int64_t[]){2, 1}, (int64_t[]){1, 1},
                         (int64_t[]){1, 2}, 2);
  slapo_ctx_set_autocast(ctx, SLAPO_AUTOCAST_OFF);
  OK(slapo_ctx_status(ctx));
  OK(slapo_backward(ctx, outs[0], in[3], 3, in, outs + 1));
  assert_non_null(slapo_output(ctx, N_OUT, outs));
  OK(slapo_ctx_status(ctx));
  *n_casts = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next)
    *n_casts += n->op == slapo_op_find("to_bf16") || n->op == slapo_op_find("round_bf16");
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  slapo_tensor *t[N_IN];
  for (int i = 0; i < N_IN; i++) {
    OK(slapo_tensor_wrap(SLAPO_DTYPE_F32, NDIM[i], SHAPE[i], g_data[i], &t[i]));
    OK(slapo_plan_bind_input(p, NAMES[i], t[i]));
  }
  slapo_kernel_env env = {0};
  OK(slapo_plan_run(p, &env));
  for (int i = 0; i < N_OUT; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &out[i]));
  slapo_plan_free(p);
  for (int i = 0; i < N_IN; i++) slapo_tensor_free(t[i]);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

/* Over every output: max |a - b| / max |b| (scaled) and whether every
 * element is within atol + rtol |b|. */
static double compare(slapo_tensor **a, slapo_tensor **b, double atol, double rtol, bool *within) {
  double worst = 0;
  *within = true;
  for (int i = 0; i < N_OUT; i++) {
    const float *x = slapo_tensor_data(a[i]), *y = slapo_tensor_data(b[i]);
    double d = 0, m = 0;
    for (int64_t j = 0; j < slapo_tensor_numel(a[i]); j++) {
      double e = fabs((double)x[j] - (double)y[j]);
      *within &= e <= atol + rtol * fabs((double)y[j]);
      d = fmax(d, e), m = fmax(m, fabs((double)y[j]));
    }
    worst = fmax(worst, d / m);
  }
  return worst;
}

static void free_all(slapo_tensor **t) {
  for (int i = 0; i < N_OUT; i++) slapo_tensor_free(t[i]);
}

static void conv_bf16_matches_emulation(void **state) {
  (void)state;
  slapo_tensor *emu[N_OUT], *f32[N_OUT], *bf[N_OUT];
  int casts;
  bool within;
  run(SLAPO_AUTOCAST_BF16_EMULATED, false, emu, &casts);
  assert_int_equal(casts, 3); /* x, w and dy rounded */
  run(SLAPO_AUTOCAST_OFF, false, f32, &casts);
  assert_int_equal(casts, 0);
  double sd = compare(emu, f32, 0, 0, &within);
  print_message("emulated bf16 vs f32: max |diff| / max |f32| = %.3g\n", sd);
  assert_true(sd > 1e-4 && sd < 1e-2);
  for (int ref = 0; ref < 2; ref++) {
    run(SLAPO_AUTOCAST_BF16, ref, bf, &casts);
    assert_int_equal(casts, 3); /* x, w, dy (w is an input: only parameters are cast again) */
    compare(bf, emu, 1e-5, 1e-4, &within);
    if (!within) fail_msg("%s kernels: bf16 vs emulated beyond 1e-5 + 1e-4 |b|", ref ? "reference" : "fast");
    free_all(bf);
  }
  free_all(emu);
  free_all(f32);
}

static int setup(void **state) {
  (void)state;
  uint64_t s = 0xc0417;
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

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(conv_bf16_matches_emulation)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
