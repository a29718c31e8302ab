/* tests/unit/test_ir_lint.c - slapo_graph_lint on deliberately broken graphs:
 * each case corrupts one invariant (through move_before or by writing node
 * fields directly), checks SLAPO_STATE and the message naming the node and
 * rule, then repairs the graph so that it frees cleanly. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <string.h>

#include "slapo/ir.h"


/* x -> a = neg(x) -> b = add(a, x) -> split(b) (2 results) -> getitem 1 -> output */
typedef struct fixture {
  slapo_graph *g;
  slapo_node *x, *a, *b, *split, *gi, *out;
} fixture;

static int setup(void **state) {
  static fixture f;
  memset(&f, 0, sizeof f);
  OK(slapo_graph_new(&f.g));
  OK(slapo_graph_add_placeholder(f.g, "x", SLAPO_DTYPE_F32, 0, NULL, &f.x));
  OK(slapo_graph_add_call_op(f.g, "neg", NULL, 1, &f.x, 0, NULL, &f.a));
  slapo_node *in[2] = {f.a, f.x};
  OK(slapo_graph_add_call_op(f.g, "add", NULL, 2, in, 0, NULL, &f.b));
  OK(slapo_graph_add_call_op(f.g, "split", NULL, 1, &f.b, 0, NULL, &f.split));
  OK(slapo_node_set_n_results(f.split, 2));
  OK(slapo_graph_add_getitem(f.g, f.split, 1, &f.gi));
  OK(slapo_graph_add_output(f.g, 1, &f.gi, &f.out));
  OK(slapo_graph_lint(f.g));
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  OK(slapo_graph_lint(f->g)); /* every case repairs what it broke */
  slapo_graph_free(f->g);
  return 0;
}

/* Lint must fail with SLAPO_STATE and a message containing each string. */
static void expect_broken(const slapo_graph *g, const char *s1, const char *s2) {
  assert_int_equal(slapo_graph_lint(g), SLAPO_STATE);
  const char *msg = slapo_last_error();
  if (!strstr(msg, s1) || (s2 && !strstr(msg, s2)))
    fail_msg("lint message \"%s\" lacks \"%s\"%s%s", msg, s1, s2 ? " or " : "", s2 ? s2 : "");
}

static void test_user_before_input(void **state) {
  fixture *f = *state;
  OK(slapo_graph_move_before(f->g, f->b, f->a)); /* add(a, x) now precedes a */
  expect_broken(f->g, "node %add: input %neg comes after it", "inputs come before");
  OK(slapo_graph_move_before(f->g, f->a, f->b));
}

static void test_self_use(void **state) {
  fixture *f = *state;
  f->a->inputs[0] = f->a;
  expect_broken(f->g, "node %neg: input %neg is the node itself", "inputs come before");
  f->a->inputs[0] = f->x;
}

static void test_forged_user(void **state) {
  fixture *f = *state;
  assert_true(f->x->n_users < f->x->cap_users);
  f->x->users[f->x->n_users++] = f->split; /* split does not use x */
  expect_broken(f->g, "node %x: lists %split as a user but %split does not use it",
                "user lists match inputs");
  f->x->n_users--;
}

static void test_missing_user(void **state) {
  fixture *f = *state;
  slapo_node *saved = f->a->users[0];
  f->a->n_users = 0; /* add uses neg but neg forgot */
  expect_broken(f->g, "node %add: uses %neg 1 time but appears 0 times", "user lists");
  f->a->n_users = 1;
  f->a->users[0] = saved;
}

static void test_wrong_multiplicity(void **state) {
  fixture *f = *state;
  f->b->inputs[0] = f->x; /* add(x, x), but x lists add once and neg lists it */
  expect_broken(f->g, "node %add: uses %x 2 times but appears 1 time", NULL);
  f->b->inputs[0] = f->a;
}

static void test_duplicate_name(void **state) {
  fixture *f = *state;
  const char *saved = f->b->name;
  f->b->name = f->a->name;
  expect_broken(f->g, "node %neg: its name is not unique", "unique names");
  f->b->name = saved;
}

static void test_getitem_out_of_range(void **state) {
  fixture *f = *state;
  f->split->n_results = 1; /* getitem reads item 1 */
  expect_broken(f->g, "node %getitem: getitem reads item 1 of %split, which has 1 results",
                "n_results > item");
  f->split->n_results = 0;
  expect_broken(f->g, "getitem reads item 1 of %split, which has 0 results", NULL);
  f->split->n_results = 2;
}

static void test_output_not_last(void **state) {
  fixture *f = *state;
  f->b->kind = SLAPO_NODE_OUTPUT;
  expect_broken(f->g, "node %add: the output node is followed by %split",
                "output node is last");
  f->b->kind = SLAPO_NODE_CALL_OP;
}

static void test_output_used(void **state) {
  fixture *f = *state;
  f->gi->inputs[0] = f->out; /* also: out comes after the getitem */
  expect_broken(f->g, "node %getitem: input %output comes after it", NULL);
  f->gi->inputs[0] = f->split;
}

static void test_empty_op_name(void **state) {
  fixture *f = *state;
  const char *saved = f->a->target;
  f->a->target = "";
  expect_broken(f->g, "node %neg: call_op has an empty op name", "call_op names its op");
  f->a->target = saved;
}

static void test_input_of_other_graph(void **state) {
  fixture *f = *state;
  slapo_graph *other;
  slapo_node *y;
  OK(slapo_graph_new(&other));
  OK(slapo_graph_add_placeholder(other, "y", SLAPO_DTYPE_F32, 0, NULL, &y));
  f->a->inputs[0] = y;
  expect_broken(f->g, "node %neg: input 0 (%y) is not in the graph", "inputs are nodes");
  f->a->inputs[0] = f->x;
  slapo_graph_free(other);
}

static void test_placeholder_with_input(void **state) {
  fixture *f = *state;
  f->x->kind = SLAPO_NODE_PARAM;
  OK(slapo_graph_lint(f->g)); /* a param is fine where a placeholder was */
  f->a->kind = SLAPO_NODE_PLACEHOLDER;
  expect_broken(f->g, "node %neg: a placeholder has 1 inputs", "no inputs");
  f->a->kind = SLAPO_NODE_CALL_OP;
  f->x->kind = SLAPO_NODE_PLACEHOLDER;
}

static void test_bad_ndim(void **state) {
  fixture *f = *state;
  f->a->ndim = SLAPO_MAX_DIMS + 1;
  expect_broken(f->g, "node %neg: ndim 9 is outside [0, 8]", NULL);
  f->a->ndim = 0;
}

static void test_null_graph(void **state) {
  (void)state;
  assert_int_equal(slapo_graph_lint(NULL), SLAPO_INVALID_ARG);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_user_before_input),  T(test_self_use),           T(test_forged_user),
      T(test_missing_user),       T(test_wrong_multiplicity), T(test_duplicate_name),
      T(test_getitem_out_of_range), T(test_output_not_last),  T(test_output_used),
      T(test_empty_op_name),      T(test_input_of_other_graph), T(test_placeholder_with_input),
      T(test_bad_ndim),           cmocka_unit_test(test_null_graph),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
