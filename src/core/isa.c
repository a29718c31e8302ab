/* core/isa.c - which instruction-set level slapo's own vector kernels run:
 * the best level the CPU (and the OS, for the AVX register state) supports,
 * capped by SLAPO_MAX_ISA or slapo_isa_set_max, so a machine with AVX-512
 * can also run and test the AVX2 and baseline variants. Layer: core.
 * The cap follows oneDNN's ONEDNN_MAX_CPU_ISA: it lowers, never raises. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "slapo/core.h"

static const char *const k_names[] = {"baseline", "avx2", "avx512", "avx512_bf16"};
#define TOP SLAPO_ISA_AVX512_BF16

/* -1: not read yet. Kernels read these inside OpenMP regions, so they are
 * atomics; computing them twice is harmless (same answer). */
static atomic_int g_host = -1;
static atomic_int g_cap = -1;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
/* AVX512_BF16 (CPUID.(EAX=7,ECX=1):EAX bit 5) or AMX-BF16
 * (CPUID.(EAX=7,ECX=0):EDX bit 22), read directly: GCC 12's
 * __builtin_cpu_supports knows neither name. The AVX-512 state check done
 * by the caller covers the registers the bf16 instructions use; AMX's own
 * tile state is requested by oneDNN, which falls back when refused. */
static bool cpu_has_bf16(void) {
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, NULL) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  bool amx_bf16 = (d >> 22) & 1u;
  unsigned subleaves = a;
  bool avx512_bf16 = false;
  if (subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512_bf16 = (a >> 5) & 1u;
  }
  return avx512_bf16 || amx_bf16;
}
#endif

static int detect_host(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  /* __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512
   * register state (XGETBV), not just the CPUID bits. The feature sets
   * match the target attributes of SLAPO__SIMD_FN (slapo/ops/vmath.h). */
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && cpu_has_bf16()) return SLAPO_ISA_AVX512_BF16;
  return avx512 ? SLAPO_ISA_AVX512 : avx2 ? SLAPO_ISA_AVX2 : SLAPO_ISA_BASELINE;
#else
  return SLAPO_ISA_BASELINE;
#endif
}

slapo_status slapo_isa_parse(const char *name, slapo_isa *out) {
  for (int i = 0; i <= TOP; i++)
    if (name && strcasecmp(name, k_names[i]) == 0) {
      *out = (slapo_isa)i;
      return SLAPO_OK;
    }
  return slapo_error(SLAPO_INVALID_ARG, "unknown ISA level '%s': expected baseline, avx2, avx512 or avx512_bf16",
                     name ? name : "(null)");
}

/* An unreadable SLAPO_MAX_ISA caps at the baseline: never run an instruction
 * set the user meant to exclude. slapo_isa_check_env reports it. */
static int env_cap(void) {
  const char *s = getenv("SLAPO_MAX_ISA");
  if (!s || !*s) return TOP;
  slapo_isa v = SLAPO_ISA_BASELINE;
  if (slapo_isa_parse(s, &v) != SLAPO_OK) {
    slapo_error_clear();
    return SLAPO_ISA_BASELINE;
  }
  return (int)v;
}

slapo_status slapo_isa_check_env(void) {
  const char *s = getenv("SLAPO_MAX_ISA");
  if (!s || !*s) return SLAPO_OK;
  slapo_isa v = SLAPO_ISA_BASELINE;
  if (slapo_isa_parse(s, &v) != SLAPO_OK)
    return slapo_error(SLAPO_INVALID_ARG, "SLAPO_MAX_ISA=%s: expected baseline, avx2, avx512 or avx512_bf16", s);
  return SLAPO_OK;
}

slapo_isa slapo_isa_host(void) {
  int h = atomic_load_explicit(&g_host, memory_order_relaxed);
  if (h < 0) {
    h = detect_host();
    atomic_store_explicit(&g_host, h, memory_order_relaxed);
  }
  return (slapo_isa)h;
}

slapo_isa slapo_isa_active(void) {
  int c = atomic_load_explicit(&g_cap, memory_order_relaxed);
  if (c < 0) {
    c = env_cap();
    atomic_store_explicit(&g_cap, c, memory_order_relaxed);
  }
  int h = (int)slapo_isa_host();
  return (slapo_isa)(c < h ? c : h);
}

void slapo_isa_set_max(slapo_isa cap) {
  int c = cap < SLAPO_ISA_BASELINE ? SLAPO_ISA_BASELINE : cap > TOP ? TOP : cap;
  atomic_store_explicit(&g_cap, c, memory_order_relaxed);
}

const char *slapo_isa_name(slapo_isa isa) {
  return isa >= SLAPO_ISA_BASELINE && isa <= TOP ? k_names[isa] : "unknown";
}

void slapo_cpu_model(char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  snprintf(buf, cap, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strcspn(v, "\n");
    snprintf(buf, cap, "%.*s", (int)n, v);
    break;
  }
  fclose(f);
}
