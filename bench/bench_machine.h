/* bench/bench_machine.h - the line every benchmark prints first, so two runs
 * can be told apart: the CPU model, the kernels that ran (slapo's vector
 * level and oneDNN's ISA, both after any SLAPO_MAX_ISA / ONEDNN_MAX_CPU_ISA
 * cap) and the OpenMP thread count. Absolute times are comparable only
 * between runs whose lines match. */
#ifndef SLAPO_BENCH_MACHINE_H
#define SLAPO_BENCH_MACHINE_H

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "slapo/ops.h"

static inline void bench_print_machine(FILE *f, const char *bench) {
  char cpu[256], kernels[256];
  slapo_cpu_model(cpu, sizeof cpu);
  slapo_kernels_describe(kernels, sizeof kernels);
  fprintf(f, "# %s: %s; %s; %d OpenMP threads\n", bench, cpu, kernels, omp_get_max_threads());
}

/* Exits, naming the benchmark, the call that failed and slapo's message. */
static inline void bench_die(const char *bench, const char *what) {
  fprintf(stderr, "%s: %s failed: %s\n", bench, what, slapo_last_error());
  exit(1);
}

/* expr must return SLAPO_OK, else bench_die. */
#define BENCH_CHECK(bench, expr)                                               \
  do {                                                                         \
    if ((expr) != SLAPO_OK) bench_die(bench, #expr);                           \
  } while (0)

/* A new f32 tensor [shape] of values in [-0.5, 0.5), a fixed hash of the
 * index and seed (the same bytes every run); owned. Exits on failure. */
static inline slapo_tensor *bench_filled(const char *bench, int ndim, const int64_t *shape,
                                         unsigned seed) {
  slapo_tensor *t;
  BENCH_CHECK(bench, slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *p = slapo_tensor_data(t); /* [numel] */
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++)
    p[i] = (float)((i * 2654435761u + seed) % 1000) / 1000.0f - 0.5f;
  return t;
}

/* Monotonic wall time in seconds. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of t[0..n) (sorts t). */
static inline double bench_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* n token ids in [0, vocab) into x and n into y from one LCG seeded with
 * `seed` (benchmark inputs: no tokenizer). */
static inline void bench_random_ids(uint64_t seed, int64_t vocab, int64_t n, int32_t *x,
                                    int32_t *y) {
  uint64_t lcg = seed;
  for (int64_t i = 0; i < n; i++) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (int32_t)((lcg >> 33) % (uint64_t)vocab);
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    y[i] = (int32_t)((lcg >> 33) % (uint64_t)vocab);
  }
}

#endif
