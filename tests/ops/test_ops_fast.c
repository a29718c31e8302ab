/* tests/ops/test_ops_fast.c - every fast kernel agrees with its reference:
 * each op's example (with its backward, so fused backward ops run too) is
 * run with reference and with fast kernels and every output compared within
 * test.fast_atol relative to max |ref|; an op whose fast kernel no example
 * runs fails the coverage test. One cmocka test per op with an example. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>

#include "common/gradcheck.h"

#define SEED 77u

static void test_op(void **state) {
  const slapo_op *op = *state;
  char rep[2048];
  bool skipped = false;
  slapo_status s = fastcheck_op(op, SEED, &skipped, rep, sizeof rep);
  print_message("%-22s %s\n", op->name, rep);
  if (s != SLAPO_OK)
    fail_msg("op '%s': fast vs reference (%s): %s", op->name, slapo_status_name(s), rep);
}

static void test_every_fast_kernel_is_exercised(void **state) {
  (void)state;
  int n = slapo_op_count();
  bool *used = calloc((size_t)n, sizeof *used);
  assert_non_null(used);
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (op->test.example) gc_mark_ops_used(op, op->backward != NULL, used);
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->fast || used[i]) continue;
    print_message("op '%s' has a fast kernel but no example (or example backward) runs it\n",
                  op->name);
    bad++;
  }
  free(used);
  if (bad) fail_msg("%d fast kernel(s) are never compared with their reference", bad);
}

int main(void) {
  int n = slapo_op_count(), k = 0;
  struct CMUnitTest *tests = calloc((size_t)n + 1, sizeof *tests);
  if (!tests) return 1;
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->test.example) continue;
    tests[k++] = (struct CMUnitTest){.name = op->name, .test_func = test_op,
                                     .initial_state = (void *)op};
  }
  tests[k++] = (struct CMUnitTest){.name = "every_fast_kernel_is_exercised",
                                   .test_func = test_every_fast_kernel_is_exercised};
  int rc = _cmocka_run_group_tests("ops_fast", tests, (size_t)k, NULL, NULL);
  free(tests);
  return rc;
}
