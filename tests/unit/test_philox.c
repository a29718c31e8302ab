/* tests/unit/test_philox.c - Philox4x32-10 against the known-answer vectors
 * published with Random123 (kat_vectors, "philox4x32 10" lines), and the
 * properties random ops rely on (purity, range, moments). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "slapo/core.h"

static void check(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                  uint32_t e0, uint32_t e1, uint32_t e2, uint32_t e3) {
  uint32_t ctr[4] = {c0, c1, c2, c3}, key[2] = {k0, k1}, out[4];
  slapo_philox4x32_10(ctr, key, out);
  assert_int_equal(out[0], e0);
  assert_int_equal(out[1], e1);
  assert_int_equal(out[2], e2);
  assert_int_equal(out[3], e3);
}

static void test_known_answers(void **state) {
  (void)state;
  check(0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  check(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
        0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  check(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
        0x94fdcceb, 0x5001e420, 0x24126ea1);
}

static void test_uniform_pure_and_in_range(void **state) {
  (void)state;
  double sum = 0, sumsq = 0;
  const int n = 100000;
  for (int i = 0; i < n; i++) {
    float u = slapo_rng_uniform(42, 7, 3, (uint64_t)i);
    assert_true(u >= 0.0f && u < 1.0f);
    assert_true(u == slapo_rng_uniform(42, 7, 3, (uint64_t)i));
    sum += u;
    sumsq += (double)u * u;
  }
  double mean = sum / n, var = sumsq / n - mean * mean;
  assert_true(fabs(mean - 0.5) < 0.01);
  assert_true(fabs(var - 1.0 / 12) < 0.005);
  /* Different stream, step or seed: different values. */
  assert_true(slapo_rng_uniform(42, 7, 3, 0) != slapo_rng_uniform(42, 8, 3, 0) ||
              slapo_rng_uniform(42, 7, 3, 1) != slapo_rng_uniform(42, 8, 3, 1));
  assert_true(slapo_rng_uniform(42, 7, 3, 5) != slapo_rng_uniform(42, 7, 4, 5) ||
              slapo_rng_uniform(42, 7, 3, 6) != slapo_rng_uniform(42, 7, 4, 6));
}

static void test_uniform4_matches(void **state) {
  (void)state;
  uint64_t key = slapo_rng_key(42, 7);
  for (uint64_t b = 0; b < 100; b++) {
    float u[4];
    slapo_rng_uniform4(key, 3, b, u);
    for (int j = 0; j < 4; j++) assert_true(u[j] == slapo_rng_uniform(42, 7, 3, 4 * b + j));
  }
}

static void test_normal_moments(void **state) {
  (void)state;
  double sum = 0, sumsq = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    float z = slapo_rng_normal(1, 2, 0, (uint64_t)i);
    assert_true(isfinite(z));
    sum += z;
    sumsq += (double)z * z;
  }
  double mean = sum / n, var = sumsq / n - mean * mean;
  assert_true(fabs(mean) < 0.01);
  assert_true(fabs(var - 1.0) < 0.02);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answers),
      cmocka_unit_test(test_uniform_pure_and_in_range),
      cmocka_unit_test(test_uniform4_matches),
      cmocka_unit_test(test_normal_moments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
