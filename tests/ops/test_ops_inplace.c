/* tests/ops/test_ops_inplace.c - every op flagged inplace runs over its
 * input 0's buffer with the bits it gives out of place: each such op's
 * example is run once with input 0 a bound tensor (out of place: the
 * planner never writes over the caller's tensors) and once with input 0
 * copied by a kernel first (x * 1, exact), whose buffer the op then takes
 * over; outputs byte-identical, with fast and with reference kernels, and
 * the planned peak shows the sharing (the copy costs no buffer). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "common/gradcheck.h"
#include "slapo/tensor.h"

#define SEED 91u

static void run_case(const slapo_op *op, bool copy, bool reference, slapo_tensor **out,
                     size_t *peak) {
  char rep[1024];
  gc_case *c;
  if (gc_case_new(op, SEED, false, &c, rep, sizeof rep) != SLAPO_OK) fail_msg("%s", rep);
  if (copy && gc_case_copy_input0(c, rep, sizeof rep) != SLAPO_OK) fail_msg("%s", rep);
  /* Peak from a plan without debug allocation (the reference plan has it). */
  slapo_plan_opts o = {0};
  assert_int_equal(slapo_plan_estimate(gc_case_graph(c), &o, peak), SLAPO_OK);
  if (gc_case_plan(c, reference, rep, sizeof rep) != SLAPO_OK) fail_msg("%s", rep);
  if (gc_case_run(c, rep, sizeof rep) != SLAPO_OK) fail_msg("%s", rep);
  assert_int_equal(slapo_tensor_contiguous(gc_case_output(c, 0), out), SLAPO_OK);
  gc_case_free(c);
}

static void test_op(void **state) {
  const slapo_op *op = *(const slapo_op *const *)*state;
  for (int reference = 0; reference < 2; reference++) {
    slapo_tensor *apart, *over;
    size_t peak_apart, peak_over;
    run_case(op, false, reference, &apart, &peak_apart);
    run_case(op, true, reference, &over, &peak_over);
    if (!slapo_tensor_equal(apart, over))
      fail_msg("op '%s' (%s kernels): in place differs from out of place", op->name,
               reference ? "reference" : "fast");
    if (peak_over != peak_apart)
      fail_msg("op '%s': planned peak %zu bytes with input 0 copied, %zu without: the copy's "
               "buffer was not taken over",
               op->name, peak_over, peak_apart);
    slapo_tensor_free(apart);
    slapo_tensor_free(over);
  }
}

int main(void) {
  int n = slapo_op_count(), k = 0;
  struct CMUnitTest *tests = calloc((size_t)n + 1, sizeof *tests);
  const slapo_op **ops = calloc((size_t)n + 1, sizeof *ops);
  if (!tests || !ops) return 1;
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->inplace) continue;
    if (!op->test.example) {
      fprintf(stderr, "op '%s' is inplace but has no test.example\n", op->name);
      return 1;
    }
    ops[k] = op;
    tests[k] = (struct CMUnitTest){.name = op->name, .test_func = test_op, .initial_state = &ops[k]};
    k++;
  }
  int rc = _cmocka_run_group_tests("ops_inplace", tests, (size_t)k, NULL, NULL);
  free(tests);
  free(ops);
  return rc;
}
