/* bench/bench_elementwise.c - memory bandwidth of slapo's elementwise add
 * (same-shape f32 tensors of 64 MB each, a planned one-node graph re-run,
 * dispatch included) against a plain C STREAM triad a[i] = b[i] + s*c[i]
 * (McCalpin's STREAM, OpenMP parallel for) on arrays of the same size.
 * Both move three arrays per pass and are reported as 3 * bytes / median
 * time of 9 alternating runs after a warm-up (STREAM's convention: write-allocate traffic not
 * counted). OMP_NUM_THREADS defaults to the number of processors. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "slapo/exec.h"
#include "slapo/ops.h"
#include "bench_machine.h"

#define RUNS 9

#define CHECK(expr)                                                            \
  do {                                                                         \
    int s_ = (int)(expr);                                                      \
    if (s_ != 0) {                                                             \
      fprintf(stderr, "bench_elementwise: %s failed: %s\n", #expr,             \
              slapo_last_error());                                             \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(omp_get_num_procs());
  bench_print_machine(stdout, "bench_elementwise");
  const int64_t n = 16 * 1024 * 1024; /* 64 MB of f32 per array */
  const double bytes = 3.0 * (double)n * sizeof(float);

  /* slapo: y = add(a, b) through a plan. */
  slapo_tensor *a, *b;
  CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 1, &n, &a));
  CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 1, &n, &b));
  float *pa = slapo_tensor_data(a), *pb = slapo_tensor_data(b);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) pa[i] = (float)(i % 7), pb[i] = (float)(i % 5);
  slapo_graph *g;
  slapo_ctx *ctx;
  CHECK(slapo_graph_new(&g));
  CHECK(slapo_ctx_new(g, &ctx));
  slapo_node *na = slapo_input(ctx, "a", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *nb = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, &n);
  slapo_node *y = slapo_add(ctx, na, nb);
  slapo_output(ctx, 1, &y);
  CHECK(slapo_ctx_status(ctx));
  slapo_plan *p;
  CHECK(slapo_plan_new(g, NULL, &p));
  CHECK(slapo_plan_bind_input(p, "a", a));
  CHECK(slapo_plan_bind_input(p, "b", b));
  CHECK(slapo_plan_run(p, NULL)); /* warm-up: first touch of the output */

  /* STREAM triad on arrays of the same size, first-touched in parallel
   * like STREAM does. */
  float *x = aligned_alloc(64, (size_t)n * sizeof(float));
  float *u = aligned_alloc(64, (size_t)n * sizeof(float));
  float *v = aligned_alloc(64, (size_t)n * sizeof(float));
  if (!x || !u || !v) return 1;
  const float s = 3.0f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] = 0.0f, u[i] = (float)(i % 7), v[i] = (float)(i % 5);
  /* Alternate the two so that both see the same machine load. */
  double ts[RUNS], tt[RUNS];
  for (int r = 0; r < RUNS; r++) {
    double t0 = bench_now_s();
    CHECK(slapo_plan_run(p, NULL));
    ts[r] = bench_now_s() - t0;
    t0 = bench_now_s();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] = u[i] + s * v[i];
    tt[r] = bench_now_s() - t0;
  }
  const float *py = slapo_tensor_data(slapo_plan_output(p, 0));
  int bad = py[12345] != (float)(12345 % 7 + 12345 % 5);
  bad |= x[12345] != (float)(12345 % 7) + s * (float)(12345 % 5);

  double gs = bytes / bench_median(ts, RUNS) * 1e-9, gt = bytes / bench_median(tt, RUNS) * 1e-9;
  printf("bench_elementwise: f32, %lld elements (%.0f MB per array), %d threads, median of %d "
         "runs\n",
         (long long)n, (double)n * 4 / 1e6, omp_get_max_threads(), RUNS);
  printf("%-28s %10.2f GB/s\n", "slapo add (planned graph)", gs);
  printf("%-28s %10.2f GB/s\n", "C STREAM triad", gt);
  printf("%-28s %10.3f\n", "ratio slapo / triad", gs / gt);
  if (bad) printf("WARNING: wrong result\n");
  free(x);
  free(u);
  free(v);
  slapo_plan_free(p);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  return bad;
}
