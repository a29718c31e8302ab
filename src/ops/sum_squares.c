/* ops/sum_squares.c - the sum of squares of a float array in double, in a
 * fixed order: the gradient norm for clipping (train/schedule.c) and the
 * executor's measure of each gradient as it is final (exec/run.c) are the
 * same function, so both give the same bits for one gradient. Layer: ops. */
#include <omp.h>

#include "ops/internal.h"
#include "slapo/ops/vmath.h"

/* LANES interleaved partial sums (element i goes to lane i % LANES), added
 * in lane order at the end: a fixed order, so the result is reproducible,
 * and one the compiler vectorizes (AVX-512 where the CPU has it: the
 * float-to-double conversions make this loop compute-bound at SSE width),
 * where a single running sum waits on the previous add for every element. */
SLAPO__SIMD_FN(double, sum_sq, (const float *x, int64_t n), (x, n)) {
  enum { LANES = 16 };
  double acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; l++) acc[l] += (double)x[i + l] * x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * x[i];
  double s = 0;
  for (int l = 0; l < LANES; l++) s += acc[l];
  return s;
}

double slapo__sum_squares(const float *x, int64_t n) {
  /* Fixed chunks summed in order (an OpenMP reduction combines partial sums
   * in arrival order, which is not bitwise reproducible). */
  enum { CHUNKS = 64 };
  double part[CHUNKS] = {0};
  int64_t per = (n + CHUNKS - 1) / CHUNKS;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int c = 0; c < CHUNKS; c++) {
    int64_t begin = c * per, end = (c + 1) * per < n ? (c + 1) * per : n;
    part[c] = begin < end ? sum_sq(x + begin, end - begin) : 0.0;
  }
  double sq = 0;
  for (int c = 0; c < CHUNKS; c++) sq += part[c];
  return sq;
}
