/* tests/dist/test_agree.c - slapo_dist_agree: ranks given the same fields
 * agree; a field that differs on some rank fails on every rank alike,
 * naming the field, rank 0's value and the first differing rank's, even
 * when the printable forms are equal (the digests are then shown) or the
 * ranks pass different numbers of fields. CTest runs it alone (one process
 * agrees with itself) and under mpirun -np 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "slapo/dist.h"

static int R, N; /* this rank, world size */

static void test_same_fields_agree(void **state) {
  (void)state;
  slapo_dist_field f[2] = {{"--seq", 32, "32"}, {"--data", 0xabcdef, "corpus.txt"}};
  assert_int_equal(slapo_dist_agree(f, 2), SLAPO_OK);
  assert_int_equal(slapo_dist_agree(NULL, 0), SLAPO_OK);
}

static void test_differing_field_named(void **state) {
  (void)state;
  char shown[16];
  snprintf(shown, sizeof shown, "%d", 32 + 32 * (R == N - 1)); /* the last rank differs */
  slapo_dist_field f[3] = {{"--model", 1, "gpt2"},
                           {"--seq", (uint64_t)(32 + 32 * (R == N - 1)), shown},
                           {"--seed", (uint64_t)R, "x"}}; /* later: not the first difference */
  slapo_status s = slapo_dist_agree(f, 3);
  if (N == 1) {
    assert_int_equal(s, SLAPO_OK);
    return;
  }
  assert_int_equal(s, SLAPO_INVALID_ARG);
  char want[96];
  snprintf(want, sizeof want, "--seq: rank 0 has 32, rank %d has 64", N - 1);
  assert_non_null(strstr(slapo_last_error(), want));
}

/* Equal printable forms (one path, another content): the digests tell. */
static void test_equal_shown_digests(void **state) {
  (void)state;
  slapo_dist_field f = {"--schedule", 100 + (uint64_t)R, "tp.sched"};
  slapo_status s = slapo_dist_agree(&f, 1);
  if (N == 1) return;
  assert_int_equal(s, SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "--schedule: rank 0 has tp.sched (digest "
                                             "0000000000000064), rank 1 has tp.sched (digest "
                                             "0000000000000065)"));
}

/* Rank 0 passes one field more (another command): a mismatch, no hang. */
static void test_field_count_differs(void **state) {
  (void)state;
  slapo_dist_field f[2] = {{"command", 7, "train"}, {"--steps", 3, "3"}};
  slapo_status s = slapo_dist_agree(f, R == 0 ? 2 : 1);
  if (N == 1) {
    assert_int_equal(s, SLAPO_OK);
    return;
  }
  assert_int_equal(s, SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "rank 0 checks --steps, rank 1 checks nothing more"));
  assert_int_equal(slapo_dist_agree(f, SLAPO_DIST_AGREE_MAX + 1), SLAPO_LIMIT);
}

int main(void) {
  /* Before the groups: the world alone, as the CLI checks its arguments. */
  if (slapo_dist_start() != SLAPO_OK || slapo_dist_init(1) != SLAPO_OK) {
    fprintf(stderr, "dist init: %s\n", slapo_last_error());
    return 1;
  }
  R = slapo_dist_rank(SLAPO_GROUP_WORLD);
  N = slapo_dist_size(SLAPO_GROUP_WORLD);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_fields_agree),
      cmocka_unit_test(test_differing_field_named),
      cmocka_unit_test(test_equal_shown_digests),
      cmocka_unit_test(test_field_count_differs),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  slapo_dist_finalize();
  return rc;
}
