/* tests/common/expect.c - see expect.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/expect.h"
#include "slapo/core.h"

void assert_last_error_has(const char *needle) {
  const char *msg = slapo_last_error();
  if (!strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
}

void copy_file_or_fail(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  assert_non_null(a), assert_non_null(b);
  char buf[65536];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, a)) > 0) assert_int_equal(fwrite(buf, 1, k, b), k);
  fclose(a);
  assert_int_equal(fclose(b), 0);
}
