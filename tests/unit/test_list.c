/* tests/unit/test_list.c - slapo_list_append, behind every "known: a, b"
 * list of an error message: names joined by ", "; a name that does not fit
 * ends the list with ", ..." once and nothing after it is added; the
 * buffer is always a string within its capacity. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "slapo/core.h"

static void joins(void **state) {
  (void)state;
  char b[64] = "";
  slapo_list_append(b, sizeof b, "gpt2");
  slapo_list_append(b, sizeof b, "llama");
  slapo_list_append(b, sizeof b, "bert");
  assert_string_equal(b, "gpt2, llama, bert");
}

static void cuts_once(void **state) {
  (void)state;
  char b[16] = "";
  slapo_list_append(b, sizeof b, "alpha");   /* "alpha" */
  slapo_list_append(b, sizeof b, "beta");    /* "alpha, beta" would leave no room */
  slapo_list_append(b, sizeof b, "c");
  assert_string_equal(b, "alpha, ...");
  char one[8] = "";
  slapo_list_append(one, sizeof one, "a_long_name");
  assert_string_equal(one, "...");
  /* Every capacity from the smallest: a string, never past cap. */
  for (size_t cap = 6; cap <= 24; cap++) {
    char buf[32];
    memset(buf, 'x', sizeof buf);
    buf[0] = '\0';
    for (int i = 0; i < 10; i++) slapo_list_append(buf, cap, i % 2 ? "ab" : "cdef");
    assert_true(strlen(buf) < cap);
    assert_int_equal(buf[cap], 'x');
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(joins),
      cmocka_unit_test(cuts_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
