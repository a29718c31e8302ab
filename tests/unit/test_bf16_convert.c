/* tests/unit/test_bf16_convert.c - f32 -> bf16 over all 2^32 bit patterns:
 * the scalar slapo_f32_to_bf16 and the vector slapo_f32_to_bf16_n at every
 * ISA level the host runs against a reference that rounds by comparing
 * distances in double (round to nearest, ties to even; past the largest
 * bf16, IEEE's overflow threshold decides; NaN quieted, sign and top payload
 * kept). bf16 -> f32 is checked over all 2^16 patterns, scalar and vector.
 * Under sanitizers every 251st pattern is checked (the run would take
 * minutes); the optimized run checks them all (~30 s on one core). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <string.h>

#include "slapo/core.h"
#include "slapo/tensor.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define STRIDE 251u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRIDE 251u
#endif
#endif
#ifndef STRIDE
#define STRIDE 1u
#endif

enum { CHUNK = 1 << 16 };

/* The bf16 nearest to the f32 with bits u, found by comparing distances. */
static uint16_t reference(uint32_t u) {
  uint32_t mag = u & 0x7fffffffu, sign = u & 0x80000000u;
  if (mag > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  if (mag == 0x7f800000u) return (uint16_t)(u >> 16);
  double x = fabs((double)bits_f32(u));
  uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
  double vlo = (double)bits_f32(lo);
  /* Past the largest finite bf16 the next value up is 2^128 as far as
   * rounding goes (IEEE 754 §4.3.1): a value at or above halfway to it
   * becomes infinity, which is hi's pattern. */
  double vhi = hi == 0x7f800000u ? ldexp(1.0, 128) : (double)bits_f32(hi);
  double dlo = x - vlo, dhi = vhi - x;
  uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u) ? hi : lo;
  return (uint16_t)((sign | r) >> 16);
}

static void all_f32_patterns(void **state) {
  (void)state;
  static float x[CHUNK];
  static uint16_t y[CHUNK];
  slapo_isa host = slapo_isa_host();
  uint64_t checked = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)CHUNK * STRIDE) {
    for (int i = 0; i < CHUNK; i++) x[i] = bits_f32((uint32_t)(base + (uint64_t)i * STRIDE));
    /* Each chunk on one level, cycling through those the host runs, so
     * every level sees every class of input across the 2^16 chunks. */
    int lv = (int)((base / ((uint64_t)CHUNK * STRIDE)) % ((uint64_t)host + 1));
    slapo_isa_set_max((slapo_isa)lv);
    slapo_f32_to_bf16_n(x, y, CHUNK);
    for (int i = 0; i < CHUNK; i++) {
      uint32_t u = f32_bits(x[i]);
      uint16_t want = reference(u), got = slapo_f32_to_bf16(x[i]);
      if (got != want || y[i] != want) {
        slapo_isa_set_max(host);
        fail_msg("f32 0x%08x: reference 0x%04x, scalar 0x%04x, vector (%s) 0x%04x", u, want, got,
                 slapo_isa_name((slapo_isa)lv), y[i]);
      }
    }
    checked += CHUNK;
  }
  slapo_isa_set_max(host);
  assert_true(checked >= (1ull << 32) / STRIDE);
}

/* Widening is exact: bf16 b is the f32 with bits b << 16. */
static void all_bf16_patterns(void **state) {
  (void)state;
  static uint16_t b[CHUNK];
  static float f[CHUNK];
  for (int i = 0; i < CHUNK; i++) b[i] = (uint16_t)i;
  slapo_isa host = slapo_isa_host();
  for (int lv = 0; lv <= (int)host; lv++) {
    slapo_isa_set_max((slapo_isa)lv);
    memset(f, 0, sizeof f);
    slapo_bf16_to_f32_n(b, f, CHUNK);
    for (int i = 0; i < CHUNK; i++) {
      assert_int_equal(f32_bits(f[i]), (uint32_t)i << 16);
      assert_int_equal(f32_bits(slapo_bf16_to_f32(b[i])), (uint32_t)i << 16);
    }
  }
  slapo_isa_set_max(host);
}

/* The vector forms handle any length, including tails and zero. */
static void lengths(void **state) {
  (void)state;
  float x[37];
  uint16_t y[38];
  for (int i = 0; i < 37; i++) x[i] = (float)i * 0.337f - 3.0f;
  for (int n = 0; n <= 37; n++) {
    memset(y, 0xab, sizeof y);
    slapo_f32_to_bf16_n(x, y, n);
    for (int i = 0; i < n; i++) assert_int_equal(y[i], slapo_f32_to_bf16(x[i]));
    assert_int_equal(y[n], 0xabab); /* nothing written past n */
  }
  slapo_f32_to_bf16_n(x, y, -1); /* no-op */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(lengths),
      cmocka_unit_test(all_bf16_patterns),
      cmocka_unit_test(all_f32_patterns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
