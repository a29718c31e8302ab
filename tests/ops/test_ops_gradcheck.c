/* tests/ops/test_ops_gradcheck.c - every op in the registry has a gradient
 * check: ops with a test.example pass a finite-difference gradcheck with
 * reference and with fast kernels; backward-only ops (test.checked_by) must
 * be used by the backward of some checked example (their own example only
 * feeds the fast and determinism tests); all others must say why in
 * test.exempt. One cmocka test per op (a new op without a passing check
 * fails the suite), plus the backward-only coverage test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/gradcheck.h"

#define SEED 20240601u

static void test_op(void **state) {
  const slapo_op *op = *state;
  const slapo_op_test *t = &op->test;
  if (t->exempt) {
    assert_true(t->exempt[0] != '\0');
    print_message("%-22s exempt: %s\n", op->name, t->exempt);
    return;
  }
  if (t->checked_by) {
    /* A backward-only op has no rule of its own (no second derivatives);
     * its example serves the fast and determinism tests, and coverage is
     * asserted by test_backward_only_ops_are_used. */
    assert_true(t->checked_by[0] != '\0');
    print_message("%-22s checked through: %s\n", op->name, t->checked_by);
    return;
  }
  if (!t->example)
    fail_msg("op '%s' has no gradient check: give it a test.example, or set test.checked_by "
             "(a backward-only op) or test.exempt (why it cannot be checked)",
             op->name);
  if (!op->backward)
    fail_msg("op '%s' has no backward rule and no test.exempt saying why it needs none",
             op->name);
  char rep[2048];
  slapo_status s = gradcheck_op(op, SEED, rep, sizeof rep);
  print_message("%-22s %s\n", op->name, rep);
  if (s != SLAPO_OK)
    fail_msg("op '%s' fails gradcheck (%s): %s", op->name, slapo_status_name(s), rep);
}

/* A backward-only op replaces a composite inside some forward op's rule; it
 * is checked when that forward op's gradcheck runs through it. */
static void test_backward_only_ops_are_used(void **state) {
  (void)state;
  int n = slapo_op_count();
  bool *used = calloc((size_t)n, sizeof *used);
  assert_non_null(used);
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (op->test.example && op->backward && !op->test.exempt)
      gc_mark_ops_used(op, true, used); /* failures are reported by test_op */
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    const char *by = op->test.checked_by;
    if (!by || op->test.exempt) continue;
    const slapo_op *comp = slapo_op_find(by);
    print_message("%-22s checked_by '%s'%s: %s\n", op->name, by,
                  comp ? " (an op)" : "", used[i] ? "used by a checked backward" : "UNUSED");
    if (!by[0] || !used[i]) bad++;
  }
  free(used);
  if (bad)
    fail_msg("%d backward-only op(s) are not used by any gradient-checked example's backward "
             "(see UNUSED above): their kernels go unchecked",
             bad);
}

int main(void) {
  int n = slapo_op_count();
  struct CMUnitTest *tests = calloc((size_t)n + 1, sizeof *tests);
  if (!tests) return 1;
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    tests[i] = (struct CMUnitTest){.name = op->name, .test_func = test_op,
                                   .initial_state = (void *)op};
  }
  tests[n] = (struct CMUnitTest){.name = "backward_only_ops_are_used",
                                 .test_func = test_backward_only_ops_are_used};
  int rc = _cmocka_run_group_tests("ops_gradcheck", tests, (size_t)n + 1, NULL, NULL);
  free(tests);
  return rc;
}
