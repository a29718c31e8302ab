/* tests/ops/test_ops_determinism.c - DESIGN.md §3 "Determinism": for every
 * op with an example, building, planning and running its forward + backward
 * graph twice gives byte-identical outputs and gradients (memcmp), and so
 * does running one plan twice; with reference and with fast kernels. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/gradcheck.h"

#define SEED 4242u

/* Contiguous copies of every output of c's last run. */
static slapo_tensor **snapshot(const gc_case *c) {
  int n = gc_case_output_count(c);
  slapo_tensor **t = calloc((size_t)n, sizeof *t);
  assert_non_null(t);
  for (int i = 0; i < n; i++)
    assert_int_equal(slapo_tensor_contiguous(gc_case_output(c, i), &t[i]), SLAPO_OK);
  return t;
}

static void free_snapshot(slapo_tensor **t, int n) {
  for (int i = 0; i < n; i++) slapo_tensor_free(t[i]);
  free(t);
}

static void expect_same(const slapo_op *op, const char *what, const gc_case *c,
                        slapo_tensor **a, slapo_tensor **b, bool reference) {
  for (int i = 0; i < gc_case_output_count(c); i++) {
    assert_int_equal(slapo_tensor_nbytes(a[i]), slapo_tensor_nbytes(b[i]));
    if (memcmp(slapo_tensor_data(a[i]), slapo_tensor_data(b[i]), slapo_tensor_nbytes(a[i])))
      fail_msg("op '%s': output %s differs between %s (%s kernels)", op->name,
               gc_case_output_name(c, i), what, reference ? "reference" : "fast");
  }
}

static void run_mode(const slapo_op *op, bool reference) {
  char rep[1024];
  bool bw = op->backward != NULL;
  gc_case *c1, *c2;
  assert_int_equal(gc_case_new(op, SEED, bw, &c1, rep, sizeof rep), SLAPO_OK);
  assert_int_equal(gc_case_plan(c1, reference, rep, sizeof rep), SLAPO_OK);
  assert_int_equal(gc_case_run(c1, rep, sizeof rep), SLAPO_OK);
  slapo_tensor **a = snapshot(c1);
  assert_int_equal(gc_case_run(c1, rep, sizeof rep), SLAPO_OK);
  slapo_tensor **b = snapshot(c1);
  expect_same(op, "two runs of one plan", c1, a, b, reference);

  assert_int_equal(gc_case_new(op, SEED, bw, &c2, rep, sizeof rep), SLAPO_OK);
  assert_int_equal(gc_case_plan(c2, reference, rep, sizeof rep), SLAPO_OK);
  assert_int_equal(gc_case_run(c2, rep, sizeof rep), SLAPO_OK);
  slapo_tensor **d = snapshot(c2);
  expect_same(op, "two builds and plans", c1, a, d, reference);

  int n = gc_case_output_count(c1);
  free_snapshot(a, n);
  free_snapshot(b, n);
  free_snapshot(d, n);
  gc_case_free(c1);
  gc_case_free(c2);
}

static void test_op(void **state) {
  const slapo_op *op = *state;
  char rep[1024];
  gc_case *c;
  slapo_status s = gc_case_new(op, SEED, op->backward != NULL, &c, rep, sizeof rep);
  if (s != SLAPO_OK) fail_msg("op '%s': %s", op->name, rep);
  gc_case_free(c);
  run_mode(op, true);
  run_mode(op, false);
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
  int rc = _cmocka_run_group_tests("ops_determinism", tests, (size_t)k, NULL, NULL);
  free(tests);
  return rc;
}
