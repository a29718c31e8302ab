/* core/hash.c - 64-bit hashing (XXH3 from Debian's libxxhash) for kernel
 * cache keys, RNG streams and maps. Layer: core. */
#include <string.h>
#include <xxhash.h>

#include "slapo/core.h"

uint64_t slapo_hash64(const void *data, size_t nbytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, nbytes, seed);
}

uint64_t slapo_hash_str(const char *s) { return XXH3_64bits(s, strlen(s)); }

uint64_t slapo_hash_combine(uint64_t h, uint64_t v) {
  uint64_t buf[2] = {h, v};
  return XXH3_64bits(buf, sizeof buf);
}
