/* tests/common/gradcheck.h - the table-driven op checks: finite-difference
 * gradient checks, fast-vs-reference kernel comparison, and the example
 * "cases" (an op's test.example, optionally with its backward, planned and
 * run) they and the determinism test share.
 * These live in tests, not in autograd/: running a graph needs exec/, and
 * autograd/ must not depend on exec/ (DESIGN.md §2). */
#ifndef SLAPO_TESTS_GRADCHECK_H
#define SLAPO_TESTS_GRADCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slapo/exec.h"
#include "slapo/ops.h"

/* op->test with the defaults documented in ops.h filled in: [lo, hi] =
 * [-1, 1], fd_eps = 1e-3, atol = rtol = 1e-2, fast_atol = 1e-5; int_high
 * 0 means 1 (all-zero indices, always valid; index ops should set it). */
typedef struct gc_settings {
  float lo, hi;
  int64_t int_high;
  float fd_eps, atol, rtol, fast_atol;
} gc_settings;
gc_settings gc_settings_of(const slapo_op *op);

/* An op's example built in a fresh graph: inputs filled from Philox with
 * `seed` (f32 uniform in [lo, hi], integers in [0, int_high)); with
 * `backward`, also a cotangent input R (uniform in [-1, 1], y's shape) and
 * slapo_backward(y, R) w.r.t. every f32 input. Outputs: y, then one
 * gradient per f32 input in graph order. */
typedef struct gc_case gc_case;

/* Builds the case. On failure writes the reason (status, ctx message) to
 * report and returns the status; *out is NULL. report may be NULL. */
slapo_status gc_case_new(const slapo_op *op, uint64_t seed, bool backward, gc_case **out,
                         char *report, size_t cap);
void gc_case_free(gc_case *c); /* NULL is fine */
/* (Re)plans the case: reference kernels only, or fast where they exist. */
slapo_status gc_case_plan(gc_case *c, bool reference, char *report, size_t cap);
/* Binds the inputs and runs the plan (env: seed, step 0, training). */
slapo_status gc_case_run(gc_case *c, char *report, size_t cap);
const slapo_graph *gc_case_graph(const gc_case *c);
/* Routes input 0 of the example's op node through a copy kernel (x * 1,
 * exact) inserted before it, so that the planner may run an in-place op
 * (op->inplace) over that kernel's buffer. Re-plan afterwards. Errors: the
 * ctx's (report says so). */
slapo_status gc_case_copy_input0(gc_case *c, char *report, size_t cap);
int gc_case_output_count(const gc_case *c);
/* Output i of the last run (borrowed: until the next run or free). */
const slapo_tensor *gc_case_output(const gc_case *c, int i);
/* Name of output i: "y" or "d<input name>". Borrowed. */
const char *gc_case_output_name(const gc_case *c, int i);

/* Gradient check of op's example: analytic gradients (slapo_backward with a
 * random cotangent R) against central differences of L(x) = sum(y(x) * R)
 * computed in double from forward runs, each element of each f32 input
 * perturbed by +-fd_eps (a fixed, evenly spaced subset of 2000 elements
 * for larger inputs). Passes when |a - n| <= atol + rtol * |n| everywhere,
 * with reference kernels and again with fast kernels. report gets one line:
 * the worst element (input, index, analytic, numeric) and the max error.
 * Returns SLAPO_OK, SLAPO_VERIFY (mismatch), or the status of a build, plan
 * or run failure (report says which). */
slapo_status gradcheck_op(const slapo_op *op, uint64_t seed, char *report, size_t cap);

/* Runs op's example (with its backward when the op has a rule) with
 * reference and with fast kernels and compares every output: max |fast -
 * ref| <= fast_atol * max |ref|. *skipped (may be NULL) is set when no node
 * of the case has a fast kernel (nothing to compare; returns SLAPO_OK). */
slapo_status fastcheck_op(const slapo_op *op, uint64_t seed, bool *skipped, char *report,
                          size_t cap);

/* Runs op's example (with its backward) with fast kernels at the host's ISA
 * level, then at each lower level (slapo_isa_set_max), and checks that
 * every output is byte-identical to the host level's: the ISA variants of a
 * kernel must round alike (slapo/ops/vmath.h). Leaves the cap at the host level.
 * Returns SLAPO_OK, SLAPO_VERIFY (report names the levels and output), or a
 * build, plan or run failure. */
slapo_status isacheck_op(const slapo_op *op, uint64_t seed, char *report, size_t cap);

/* Largest |a - b| over two f32 tensors of one shape (any strides) and the
 * largest |a|; used by the checks above and by tests. */
void gc_max_diff(const slapo_tensor *a, const slapo_tensor *b, double *max_diff,
                 double *max_abs_a);

/* Sets used[i] (i a registry index, 0 <= i < slapo_op_count()) for every op
 * with a node in op's case: its example, plus its backward when `backward`.
 * Returns the case's build status (used untouched on failure). */
slapo_status gc_mark_ops_used(const slapo_op *op, bool backward, bool *used);

#endif
