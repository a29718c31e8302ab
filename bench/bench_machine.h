/* bench/bench_machine.h - the line every benchmark prints first, so two runs
 * can be told apart: the CPU model, the kernels that ran (slapo's vector
 * level and oneDNN's ISA, both after any SLAPO_MAX_ISA / ONEDNN_MAX_CPU_ISA
 * cap) and the OpenMP thread count. Absolute times are comparable only
 * between runs whose lines match. */
#ifndef SLAPO_BENCH_MACHINE_H
#define SLAPO_BENCH_MACHINE_H

#include <omp.h>
#include <stdio.h>

#include "slapo/ops.h"

static inline void bench_print_machine(FILE *f, const char *bench) {
  char cpu[256], kernels[256];
  slapo_cpu_model(cpu, sizeof cpu);
  slapo_kernels_describe(kernels, sizeof kernels);
  fprintf(f, "# %s: %s; %s; %d OpenMP threads\n", bench, cpu, kernels, omp_get_max_threads());
}

#endif
