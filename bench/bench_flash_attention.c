/* bench/bench_flash_attention.c - causal attention on GPT-2 small head shapes
 * [B, NH, T, HS] = [4, 6, 256, 64] (default; override with 4 arguments),
 * with dropout 0.1 (training) and without (eval): the fused "flash_attention"
 * op with its fast and its reference kernels against the unfused composite
 * (matmul, scale, causal softmax, dropout, matmul; fast kernels, oneDNN
 * GEMMs). Each variant is a planned graph, forward only and forward +
 * backward (cotangent input R); prints the median wall and process CPU time
 * of 5 runs after one warm-up (CPU time is the steadier number on a shared
 * machine) and the planned activation peak. OMP_NUM_THREADS defaults to the
 * number of processors. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slapo/autograd.h"
#include "slapo/exec.h"
#include "bench_machine.h"

#define RUNS 5

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what) {
  fprintf(stderr, "bench_flash_attention: %s failed: %s\n", what, slapo_last_error());
  exit(1);
}

#define CHECK(expr)                                                            \
  do {                                                                         \
    if ((expr) != SLAPO_OK) die(#expr);                                        \
  } while (0)

/* Attention graph over placeholders q, k, v, R [shape]: fused or composite;
 * with `backward`, outputs y, dq, dk, dv, else y (R then unused). */
static slapo_graph *build(bool flash, bool backward, const int64_t *shape) {
  slapo_graph *g;
  slapo_ctx *ctx;
  CHECK(slapo_graph_new(&g));
  CHECK(slapo_ctx_new(g, &ctx));
  const char *names[3] = {"q", "k", "v"};
  slapo_node *in[3];
  for (int i = 0; i < 3; i++) in[i] = slapo_input(ctx, names[i], SLAPO_DTYPE_F32, 4, shape);
  slapo_node *R = slapo_input(ctx, "R", SLAPO_DTYPE_F32, 4, shape);
  double scale = 1.0 / sqrt((double)shape[3]);
  slapo_node *y;
  if (flash) {
    slapo_attr a[4] = {slapo_attr_int("causal", 1), slapo_attr_float("scale", scale),
                       slapo_attr_float("dropout_p", 0.1), slapo_attr_int("stream", 7)};
    y = slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention), 3, in, 4, a);
  } else {
    slapo_node *att = slapo_matmul(ctx, in[0], in[1], false, true);
    att = slapo_softmax(ctx, slapo_mul_scalar(ctx, att, scale), true);
    slapo_attr a[2] = {slapo_attr_float("p", 0.1), slapo_attr_int("stream", 7)};
    att = slapo_op_apply(ctx, SLAPO_OP_DESC(dropout), 1, &att, 2, a);
    y = slapo_matmul(ctx, att, in[2], false, false);
  }
  slapo_node *outs[4] = {y};
  if (backward) CHECK(slapo_backward(ctx, y, R, 3, in, outs + 1));
  if (!slapo_output(ctx, backward ? 4 : 1, outs)) die("output");
  CHECK(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

static void bench(const char *label, bool flash, bool reference, bool backward, bool training,
                  slapo_tensor *const *vals, const int64_t *shape) {
  slapo_graph *g = build(flash, backward, shape);
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  CHECK(slapo_plan_new(g, &o, &p));
  const char *names[4] = {"q", "k", "v", "R"};
  for (int i = 0; i < 4; i++)
    CHECK(slapo_plan_bind_input(p, names[i], vals[i]));
  slapo_kernel_env env = {.seed = 1, .step = 0, .training = training};
  CHECK(slapo_plan_run(p, &env)); /* warm-up */
  double t[RUNS], cpu[RUNS];
  for (int r = 0; r < RUNS; r++) {
    double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    CHECK(slapo_plan_run(p, &env));
    t[r] = clock_s(CLOCK_MONOTONIC) - t0;
    cpu[r] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
  }
  qsort(t, RUNS, sizeof t[0], cmp_double);
  qsort(cpu, RUNS, sizeof cpu[0], cmp_double);
  printf("%-26s %-8s %-8s %9.2f ms wall %9.2f ms cpu   peak %6.2f MiB\n", label,
         backward ? "fwd+bwd" : "fwd", training ? "dropout" : "eval", 1e3 * t[RUNS / 2],
         1e3 * cpu[RUNS / 2],
         (double)slapo_plan_peak_nbytes(p) / (1024.0 * 1024.0));
  slapo_plan_free(p);
  slapo_graph_free(g);
}

int main(int argc, char **argv) {
  int64_t shape[4] = {4, 6, 256, 64};
  if (argc == 5)
    for (int i = 0; i < 4; i++) shape[i] = atoll(argv[i + 1]);
  bench_print_machine(stdout, "bench_flash_attention");
  printf("causal attention [B, NH, T, HS] = [%lld, %lld, %lld, %lld], dropout p = 0.1 when "
         "training, %d threads, median of %d\n",
         (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
         omp_get_max_threads(), RUNS);
  slapo_tensor *vals[4];
  for (int i = 0; i < 4; i++) {
    CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, shape, &vals[i]));
    float *d = slapo_tensor_data(vals[i]); /* [numel] */
    for (int64_t j = 0; j < slapo_tensor_numel(vals[i]); j++)
      d[j] = 2.0f * slapo_rng_uniform(3, (uint64_t)i, 0, (uint64_t)j) - 1.0f;
  }
  for (int tr = 1; tr >= 0; tr--) {
    for (int bw = 0; bw < 2; bw++) {
      bench("flash_attention (fast)", true, false, bw, tr, vals, shape);
      bench("flash_attention (ref)", true, true, bw, tr, vals, shape);
      bench("composite (fast kernels)", false, false, bw, tr, vals, shape);
    }
  }
  for (int i = 0; i < 4; i++) slapo_tensor_free(vals[i]);
  return 0;
}
