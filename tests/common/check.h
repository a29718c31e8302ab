/* tests/common/check.h - the assertions every test file uses: OK (the call
 * returned SLAPO_OK) and expect_status (a call failed with the status and
 * a message saying what it should; assert_last_error_has for the message
 * alone, tests/common/expect.h); a float's bits and back. Include after
 * <cmocka.h>. */
#ifndef SLAPO_TESTS_CHECK_H
#define SLAPO_TESTS_CHECK_H

#include <stdint.h>
#include <string.h>

#include "common/expect.h"
#include "slapo/core.h"

#define OK(expr) assert_int_equal((expr), SLAPO_OK)
#define assert_ok(expr) OK(expr)

/* Fails the current test unless got == want and slapo_last_error()
 * contains needle. */
#define expect_status(got, want, needle)                                       \
  do {                                                                         \
    assert_int_equal((got), (want));                                           \
    assert_last_error_has(needle);                                             \
  } while (0)

/* A float's bit pattern, and the float of one (tests of rounding). */
static inline uint32_t f32_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

#endif
