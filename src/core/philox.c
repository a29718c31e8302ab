/* core/philox.c - Philox4x32-10 counter-based RNG and the uniform/normal
 * helpers random ops use. Layer: core.
 * Source: Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
 * SC'11, Figure 2 and Table 2 (multipliers and Weyl key increments);
 * checked against Random123's kat_vectors. */
#include <math.h>

#include "slapo/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void slapo_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Key = (seed, stream) mixed so that nearby seeds and streams give unrelated
 * keys; counter = (block index, step). */
uint64_t slapo_rng_key(uint64_t seed, uint64_t stream) { return slapo_hash_combine(seed, stream); }

static void block_with_key(uint64_t k, uint64_t step, uint64_t block, uint32_t out[4]) {
  uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
  uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)step,
                     (uint32_t)(step >> 32)};
  slapo_philox4x32_10(ctr, key, out);
}

static void block_at(uint64_t seed, uint64_t stream, uint64_t step, uint64_t block,
                     uint32_t out[4]) {
  block_with_key(slapo_rng_key(seed, stream), step, block, out);
}

/* Top 24 bits: every value is exactly representable in a float. */
static float to_unit(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

float slapo_rng_uniform(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index) {
  uint32_t w[4];
  block_at(seed, stream, step, index >> 2, w);
  return to_unit(w[index & 3]);
}

void slapo_rng_uniform4(uint64_t key, uint64_t step, uint64_t block, float out[4]) {
  uint32_t w[4];
  block_with_key(key, step, block, w);
  for (int j = 0; j < 4; j++) out[j] = to_unit(w[j]);
}

float slapo_rng_normal(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index) {
  uint32_t w[4];
  block_at(seed, stream, step, index >> 1, w);
  const uint32_t *p = w + 2 * (index & 1);
  /* u1 in (0, 1] so the log is finite; u2 in [0, 1). */
  double u1 = ((double)p[0] + 1.0) * (1.0 / 4294967296.0);
  double u2 = (double)p[1] * (1.0 / 4294967296.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
