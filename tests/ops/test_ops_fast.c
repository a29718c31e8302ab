/* tests/ops/test_ops_fast.c - every fast kernel agrees with its reference:
 * each op's example (with its backward, so fused backward ops run too) is
 * run with reference and with fast kernels and every output compared within
 * test.fast_atol relative to max |ref|; an op whose fast kernel no example
 * runs fails the coverage test. One cmocka test per op and per ISA variant
 * the host can execute ("gelu@avx2", capped with slapo_isa_set_max, so an
 * AVX-512 machine tests the AVX2 and baseline code too), and one per op
 * checking that the variants give byte-identical outputs ("gelu@isa"). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "common/gradcheck.h"

#define SEED 77u

/* One test's state: the op and the ISA level its fast kernels run at (-1:
 * the byte-identity check across levels). */
typedef struct isa_case {
  const slapo_op *op;
  int isa;
  char name[64];
} isa_case;

static void test_op(void **state) {
  const isa_case *tc = *state;
  char rep[2048];
  bool skipped = false;
  slapo_isa_set_max((slapo_isa)tc->isa);
  slapo_status s = fastcheck_op(tc->op, SEED, &skipped, rep, sizeof rep);
  slapo_isa_set_max(slapo_isa_host());
  print_message("%-28s %s\n", tc->name, rep);
  if (s != SLAPO_OK)
    fail_msg("op '%s': fast vs reference (%s): %s", tc->name, slapo_status_name(s), rep);
}

static void test_isa_identical(void **state) {
  const isa_case *tc = *state;
  char rep[2048];
  slapo_status s = isacheck_op(tc->op, SEED, rep, sizeof rep);
  print_message("%-28s %s\n", tc->name, rep);
  if (s != SLAPO_OK) fail_msg("op '%s' (%s): %s", tc->name, slapo_status_name(s), rep);
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
  int n = slapo_op_count(), k = 0, levels = (int)slapo_isa_host() + 1;
  size_t max_tests = (size_t)n * (size_t)(levels + 1) + 1;
  struct CMUnitTest *tests = calloc(max_tests, sizeof *tests);
  isa_case *cases = calloc(max_tests, sizeof *cases);
  if (!tests || !cases) return 1;
  print_message("host ISA %s: fast kernels tested at every level up to it\n",
                slapo_isa_name(slapo_isa_host()));
  for (int i = 0; i < n; i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->test.example) continue;
    for (int lv = -1; lv < levels; lv++) {
      isa_case *tc = &cases[k];
      *tc = (isa_case){.op = op, .isa = lv};
      snprintf(tc->name, sizeof tc->name, "%s@%s", op->name,
               lv < 0 ? "isa" : slapo_isa_name((slapo_isa)lv));
      tests[k++] = (struct CMUnitTest){.name = tc->name,
                                       .test_func = lv < 0 ? test_isa_identical : test_op,
                                       .initial_state = tc};
    }
  }
  tests[k++] = (struct CMUnitTest){.name = "every_fast_kernel_is_exercised",
                                   .test_func = test_every_fast_kernel_is_exercised};
  int rc = _cmocka_run_group_tests("ops_fast", tests, (size_t)k, NULL, NULL);
  free(tests);
  free(cases);
  return rc;
}
