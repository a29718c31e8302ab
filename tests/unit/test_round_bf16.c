/* tests/unit/test_round_bf16.c - the round_bf16 op: on edge bit patterns
 * (ties to even both ways, the largest finite values that round to inf,
 * subnormals, signed zeros, infinities, NaNs with payloads) and random
 * ones, its reference kernel and its fast kernel at every ISA level the
 * host runs give exactly slapo_f32_to_bf16's rounding read back as f32;
 * its gradient is dy itself (straight through). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <string.h>

#include "slapo/autograd.h"
#include "slapo/core.h"
#include "slapo/exec.h"
#include "slapo/ops.h"
#include "slapo/tensor.h"


enum { N_EDGE = 16, N = 4096 };

static const uint32_t EDGE[N_EDGE] = {
    0x3f808000u, /* 1 + 2^-8: a tie, kept bit 0 -> down */
    0x3f818000u, /* a tie, kept bit 1 -> up */
    0x3f808001u, /* just above a tie -> up */
    0x3f807fffu, /* just below -> down */
    0x7f7f8000u, /* a tie at the top: rounds to even, which is inf */
    0x7f7fffffu, /* FLT_MAX -> inf */
    0xff7fffffu, /* -FLT_MAX -> -inf */
    0x00000001u, /* the smallest subnormal -> 0 */
    0x00008000u, /* a subnormal tie -> 0 (kept bit 0) */
    0x80000000u, /* -0 */
    0x00000000u, /* +0 */
    0x7f800000u, /* inf */
    0xff800000u, /* -inf */
    0x7fc00000u, /* quiet NaN */
    0x7f800001u, /* signalling NaN, payload in the low bits only */
    0xffbfffffu, /* negative NaN, payload that rounding would carry */
};

/* The inputs: the edge patterns, then pseudo-random bit patterns. */
static void fill(float *x) {
  for (int i = 0; i < N_EDGE; i++) x[i] = bits_f32(EDGE[i]);
  uint64_t s = 0x9e3779b97f4a7c15u;
  for (int i = N_EDGE; i < N; i++) {
    s = s * 6364136223846793005u + 1442695040888963407u;
    x[i] = bits_f32((uint32_t)(s >> 32));
  }
}

/* Runs round_bf16 on x with the reference or fast kernels into y. */
static void run(const float *x, float *y, bool reference) {
  static const int64_t shape[1] = {N};
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *in = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, shape);
  slapo_node *r = slapo_op_call(ctx, "round_bf16", 1, &in, 0, NULL);
  assert_non_null(slapo_output(ctx, 1, &r));
  OK(slapo_ctx_status(ctx));
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  slapo_tensor *t;
  OK(slapo_tensor_wrap(SLAPO_DTYPE_F32, 1, shape, (float *)x, &t));
  OK(slapo_plan_bind_input(p, "x", t));
  slapo_kernel_env env = {0};
  OK(slapo_plan_run(p, &env));
  memcpy(y, slapo_tensor_data(slapo_plan_output(p, 0)), sizeof(float) * N);
  slapo_plan_free(p);
  slapo_tensor_free(t);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void check(const float *x, const float *y, const char *what) {
  int bad = 0;
  for (int i = 0; i < N; i++) {
    uint32_t want = (uint32_t)slapo_f32_to_bf16(x[i]) << 16, got = f32_bits(y[i]);
    if (want != got && bad++ < 5)
      print_message("%s: x = 0x%08x: got 0x%08x, want 0x%08x\n", what, f32_bits(x[i]), got,
                    want);
  }
  if (bad) fail_msg("%s: %d of %d values differ from slapo_f32_to_bf16", what, bad, N);
}

static void test_values(void **state) {
  (void)state;
  static float x[N], y[N];
  fill(x);
  run(x, y, true);
  check(x, y, "reference");
  slapo_isa host = slapo_isa_host();
  for (int l = SLAPO_ISA_BASELINE; l <= (int)host; l++) {
    slapo_isa_set_max((slapo_isa)l);
    run(x, y, false);
    check(x, y, slapo_isa_name((slapo_isa)l));
  }
  slapo_isa_set_max(host);
}

static void test_gradient_is_dy(void **state) {
  (void)state;
  static const int64_t shape[2] = {3, 5};
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, shape);
  slapo_node *y = slapo_op_call(ctx, "round_bf16", 1, &x, 0, NULL);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 2, shape);
  slapo_node *dx = NULL;
  OK(slapo_backward(ctx, y, dy, 1, &x, &dx));
  assert_ptr_equal(dx, dy);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_gradient_is_dy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
