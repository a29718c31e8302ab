/* slapo/core/simd.h - SLAPO__SIMD_FN / SLAPO__SIMD_PROC: a loop compiled for
 * AVX-512 and AVX2 as well as the baseline (the build targets plain x86-64),
 * one variant picked per call by slapo_isa_active(). In core because the
 * tensor layer's dtype conversions use it as well as the ops' kernels.
 * Layer: core; public, not stable API. */
#ifndef SLAPO_CORE_SIMD_H
#define SLAPO_CORE_SIMD_H

#include "slapo/core.h"

/* SLAPO__SIMD_FN(RET, NAME, (params), (args)) { body } defines
 * `static RET NAME(params)`: the body is compiled once per ISA level
 * (slapo_isa in core.h) and each call runs the variant slapo_isa_active()
 * names, so SLAPO_MAX_ISA can select any variant the host can execute.
 * SLAPO__SIMD_PROC(NAME, (params), (args)) is the same for void functions.
 * The variants compute the same bits: the build is ISO C (-std=c17), where
 * the compiler contracts no a * b + c into an FMA, so every variant rounds
 * every operation the same way. The per-call switch costs one predictable
 * branch; callers put a whole row or block of work behind each call. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SLAPO__TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define SLAPO__TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define SLAPO__SIMD_(RET, NAME, PARAMS, ARGS, RETURN)                          \
  SLAPO__SIMD_BODY RET NAME##__body PARAMS;                                    \
  SLAPO__TARGET_AVX512 static RET NAME##__avx512 PARAMS { RETURN NAME##__body ARGS; } \
  SLAPO__TARGET_AVX2 static RET NAME##__avx2 PARAMS { RETURN NAME##__body ARGS; } \
  static RET NAME##__baseline PARAMS { RETURN NAME##__body ARGS; }             \
  __attribute__((unused)) static RET NAME PARAMS {                             \
    slapo_isa isa_ = slapo_isa_active();                                       \
    if (isa_ >= SLAPO_ISA_AVX512) {                                            \
      RETURN NAME##__avx512 ARGS;                                              \
    } else if (isa_ == SLAPO_ISA_AVX2) {                                       \
      RETURN NAME##__avx2 ARGS;                                                \
    } else {                                                                   \
      RETURN NAME##__baseline ARGS;                                            \
    }                                                                          \
  }                                                                            \
  SLAPO__SIMD_BODY RET NAME##__body PARAMS
/* The body is inlined into each variant and compiled for its target. */
#define SLAPO__SIMD_BODY static inline __attribute__((always_inline, unused))
#else
#define SLAPO__SIMD_(RET, NAME, PARAMS, ARGS, RETURN) __attribute__((unused)) static RET NAME PARAMS
#endif
#define SLAPO__SIMD_FN(RET, NAME, PARAMS, ARGS) SLAPO__SIMD_(RET, NAME, PARAMS, ARGS, return)
#define SLAPO__SIMD_PROC(NAME, PARAMS, ARGS) SLAPO__SIMD_(void, NAME, PARAMS, ARGS, )

#endif
