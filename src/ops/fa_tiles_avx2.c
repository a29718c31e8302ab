/* ops/fa_tiles_avx2.c - the FlashAttention tile kernels for the avx2 level
 * (ops/fa_tiles.h). Only called after slapo_isa_active() says the CPU runs
 * it. Layer: ops. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx2,fma")
#endif
#define FA_NAME(f) slapo__fa_##f##_avx2
#include "ops/fa_tiles.h"
