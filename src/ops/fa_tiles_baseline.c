/* ops/fa_tiles_baseline.c - the FlashAttention tile kernels for the baseline level
 * (ops/fa_tiles.h). Only called after slapo_isa_active() says the CPU runs
 * it. Layer: ops. */
#define FA_NAME(f) slapo__fa_##f##_baseline
#include "ops/fa_tiles.h"
