/* tests/errors/test_ir_errors.c - IR calls that must fail: each case checks
 * the status, that the message names the node(s) and rule, and that the
 * graph is exactly as before (same text form, same count, lint clean). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/ir.h"


/* x, y -> a = neg(x) -> b = add(a, x) -> c = mul(b, b) -> output(c) */
typedef struct fixture {
  slapo_graph *g;
  slapo_node *x, *y, *a, *b, *c, *out;
  char *before; /* text form at setup */
} fixture;

static char *text_of(const slapo_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  slapo_graph_print(g, f);
  fclose(f);
  return buf;
}

static slapo_node *op2(slapo_graph *g, const char *name, slapo_node *p, slapo_node *q) {
  slapo_node *in[2] = {p, q}, *n;
  OK(slapo_graph_add_call_op(g, name, NULL, 2, in, 0, NULL, &n));
  return n;
}

static int setup(void **state) {
  static fixture f;
  memset(&f, 0, sizeof f);
  OK(slapo_graph_new(&f.g));
  OK(slapo_graph_add_placeholder(f.g, "x", SLAPO_DTYPE_F32, 0, NULL, &f.x));
  OK(slapo_graph_add_placeholder(f.g, "y", SLAPO_DTYPE_F32, 0, NULL, &f.y));
  OK(slapo_graph_add_call_op(f.g, "neg", NULL, 1, &f.x, 0, NULL, &f.a));
  f.b = op2(f.g, "add", f.a, f.x);
  f.c = op2(f.g, "mul", f.b, f.b);
  OK(slapo_graph_add_output(f.g, 1, &f.c, &f.out));
  OK(slapo_graph_lint(f.g));
  f.before = text_of(f.g);
  *state = &f;
  return 0;
}

/* The graph must be unchanged by the failed call. */
static int teardown(void **state) {
  fixture *f = *state;
  OK(slapo_graph_lint(f->g));
  assert_int_equal(slapo_graph_count(f->g), 6);
  char *after = text_of(f->g);
  assert_string_equal(after, f->before);
  free(after);
  free(f->before);
  slapo_graph_free(f->g);
  return 0;
}

static void expect(slapo_status got, slapo_status want, const char *s1, const char *s2) {
  assert_int_equal(got, want);
  const char *msg = slapo_last_error();
  if (!strstr(msg, s1) || (s2 && !strstr(msg, s2)))
    fail_msg("message \"%s\" lacks \"%s\"%s%s", msg, s1, s2 ? " or " : "", s2 ? s2 : "");
}

static void test_erase_with_users(void **state) {
  fixture *f = *state;
  expect(slapo_graph_erase(f->g, f->a), SLAPO_STATE, "erase: %neg still has 1 user",
         "(first: %add)");
  expect(slapo_graph_erase(f->g, f->b), SLAPO_STATE, "%add still has 2 users", "first: %mul");
  expect(slapo_graph_erase(f->g, f->x), SLAPO_STATE, "%x", "first: %neg");
  assert_int_equal(f->x->n_users, 2);
  assert_non_null(f->a->graph);
}

static void test_erase_foreign(void **state) {
  fixture *f = *state;
  expect(slapo_graph_erase(f->g, NULL), SLAPO_INVALID_ARG, "erase: node is NULL", NULL);
  slapo_graph *other;
  slapo_node *z;
  OK(slapo_graph_new(&other));
  OK(slapo_graph_add_placeholder(other, "z", SLAPO_DTYPE_F32, 0, NULL, &z));
  expect(slapo_graph_erase(f->g, z), SLAPO_INVALID_ARG, "erase: %z is not a node of this graph",
         NULL);
  slapo_graph_free(other);
}

/* The replacement comes after a user of the node it replaces. */
static void test_replace_order_violation(void **state) {
  fixture *f = *state;
  /* c = mul(b, b) comes after a's user b. */
  expect(slapo_node_replace_all_uses(f->a, f->c), SLAPO_STATE,
         "replace_all_uses %neg: replacement %mul does not come before %neg's user %add",
         "defined before it is used");
  assert_ptr_equal(f->b->inputs[0], f->a);
  assert_int_equal(f->a->n_users, 1);
  assert_int_equal(f->c->n_users, 1);
  /* A user of x as its replacement would use itself. */
  expect(slapo_node_replace_all_uses(f->x, f->a), SLAPO_STATE,
         "replacement %neg does not come before %x's user %neg", NULL);
  assert_ptr_equal(f->a->inputs[0], f->x);
}

static void test_replace_bad_args(void **state) {
  fixture *f = *state;
  expect(slapo_node_replace_all_uses(f->a, NULL), SLAPO_INVALID_ARG, "replacement node is NULL",
         NULL);
  expect(slapo_node_replace_all_uses(f->c, f->out), SLAPO_INVALID_ARG,
         "the output node %output has no value to use", NULL);
}

static void test_second_output(void **state) {
  fixture *f = *state;
  slapo_node *o2 = (slapo_node *)1;
  expect(slapo_graph_add_output(f->g, 1, &f->b, &o2), SLAPO_INVALID_ARG,
         "output: the graph already has an output node %output", "at most one");
  assert_null(o2);
  assert_int_equal(f->b->n_users, 2);
}

static void test_getitem_of_non_tuple(void **state) {
  fixture *f = *state;
  slapo_node *gi;
  expect(slapo_graph_add_getitem(f->g, f->b, 0, &gi), SLAPO_INVALID_ARG,
         "getitem: %add is not a tuple (n_results 0)", NULL);
  assert_null(gi);
  expect(slapo_graph_add_getitem(f->g, f->b, -1, &gi), SLAPO_INVALID_ARG,
         "getitem: item -1 is negative", NULL);
  f->b->n_results = 2; /* pretend add were a two-result op, for the range check */
  expect(slapo_graph_add_getitem(f->g, f->b, 2, &gi), SLAPO_INVALID_ARG,
         "getitem: item 2 of %add is out of range (2 results)", NULL);
  f->b->n_results = 0;
  expect(slapo_graph_add_getitem(f->g, NULL, 0, &gi), SLAPO_INVALID_ARG, "source node is NULL",
         NULL);
}

static void test_null_inputs(void **state) {
  fixture *f = *state;
  slapo_node *n;
  slapo_node *in[2] = {f->a, NULL};
  expect(slapo_graph_add_call_op(f->g, "add", NULL, 2, in, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op add: input 1 is NULL", NULL);
  expect(slapo_graph_add_call_op(f->g, "add", NULL, 2, NULL, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op add: inputs is NULL with n_inputs 2", NULL);
  expect(slapo_graph_add_call_module(f->g, "h.0", -1, NULL, &n), SLAPO_INVALID_ARG,
         "call_module h.0: n_inputs is -1", NULL);
  expect(slapo_graph_add_output(f->g, 1, NULL, &n), SLAPO_INVALID_ARG, "output", NULL);
  expect(slapo_graph_add_call_op(f->g, NULL, NULL, 1, &f->a, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op: op name is NULL or empty", NULL);
  expect(slapo_graph_add_call_op(NULL, "add", NULL, 1, &f->a, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op: graph is NULL", NULL);
  expect(slapo_graph_add_placeholder(f->g, NULL, SLAPO_DTYPE_F32, 0, NULL, &n),
         SLAPO_INVALID_ARG, "placeholder: name is NULL or empty", NULL);
  expect(slapo_graph_add_param(f->g, "", SLAPO_DTYPE_F32, 0, NULL, &n), SLAPO_INVALID_ARG,
         "param: path is NULL or empty", NULL);
  assert_null(n);
}

static void test_bad_inputs(void **state) {
  fixture *f = *state;
  slapo_node *n;
  slapo_graph *other;
  slapo_node *z;
  OK(slapo_graph_new(&other));
  OK(slapo_graph_add_placeholder(other, "z", SLAPO_DTYPE_F32, 0, NULL, &z));
  slapo_node *in[2] = {f->a, z};
  expect(slapo_graph_add_call_op(f->g, "add", NULL, 2, in, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op add: input 1 (%z) is not a node of this graph", NULL);
  slapo_graph_free(other);
  expect(slapo_graph_add_call_op(f->g, "neg", NULL, 1, &f->out, 0, NULL, &n), SLAPO_INVALID_ARG,
         "call_op neg: input 0 is the output node %output", NULL);
}

static void test_bad_attrs(void **state) {
  fixture *f = *state;
  slapo_node *n;
  slapo_attr dup[2] = {slapo_attr_int("axis", 0), slapo_attr_int("axis", 1)};
  expect(slapo_graph_add_call_op(f->g, "sum", NULL, 1, &f->a, 2, dup, &n), SLAPO_INVALID_ARG,
         "call_op sum: attribute axis is given twice", NULL);
  slapo_attr nul = slapo_attr_str("mode", NULL);
  expect(slapo_graph_add_call_op(f->g, "sum", NULL, 1, &f->a, 1, &nul, &n), SLAPO_INVALID_ARG,
         "string attribute mode is NULL", NULL);
  slapo_attr ints = slapo_attr_ints("perm", 2, NULL);
  expect(slapo_graph_add_call_op(f->g, "sum", NULL, 1, &f->a, 1, &ints, &n), SLAPO_INVALID_ARG,
         "int-array attribute perm has n 2", NULL);
  slapo_attr nokey = slapo_attr_int(NULL, 1);
  expect(slapo_graph_add_call_op(f->g, "sum", NULL, 1, &f->a, 1, &nokey, &n), SLAPO_INVALID_ARG,
         "attribute 0 has a NULL or empty key", NULL);
  expect(slapo_graph_add_call_op(f->g, "sum", NULL, 1, &f->a, -1, NULL, &n), SLAPO_INVALID_ARG,
         "n_attrs is -1", NULL);
}

static void test_bad_meta(void **state) {
  fixture *f = *state;
  slapo_node *n;
  int64_t shape[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  expect(slapo_graph_add_placeholder(f->g, "p", SLAPO_DTYPE_F32, 9, shape, &n),
         SLAPO_INVALID_ARG, "placeholder p: ndim 9 is outside [0, 8]", NULL);
  int64_t neg[2] = {2, -3};
  expect(slapo_graph_add_param(f->g, "w", SLAPO_DTYPE_F32, 2, neg, &n), SLAPO_INVALID_ARG,
         "param w: dim 1 is -3", NULL);
  expect(slapo_graph_add_param(f->g, "w", SLAPO_DTYPE_COUNT, 0, NULL, &n), SLAPO_INVALID_ARG,
         "param w: unknown dtype", NULL);
  expect(slapo_node_set_meta(f->a, SLAPO_DTYPE_F32, 2, NULL), SLAPO_INVALID_ARG,
         "set_meta %neg: shape is NULL with ndim 2", NULL);
  expect(slapo_node_set_origin(f->a, NULL, 0), SLAPO_INVALID_ARG, "set_origin %neg: path is NULL",
         NULL);
  expect(slapo_node_set_n_results(f->x, 2), SLAPO_INVALID_ARG,
         "set_n_results %x: a placeholder node has one value", NULL);
}

static void test_bad_insertion_point(void **state) {
  fixture *f = *state;
  slapo_node *n;
  slapo_graph_insert_after(f->g, f->out);
  expect(slapo_graph_add_call_op(f->g, "neg", NULL, 1, &f->a, 0, NULL, &n), SLAPO_STATE,
         "call_op neg: the insertion point is after the output node %output",
         "must stay last");
  slapo_graph *other;
  slapo_node *z;
  OK(slapo_graph_new(&other));
  OK(slapo_graph_add_placeholder(other, "z", SLAPO_DTYPE_F32, 0, NULL, &z));
  slapo_graph_insert_before(f->g, z);
  expect(slapo_graph_add_call_op(f->g, "neg", NULL, 1, &f->a, 0, NULL, &n), SLAPO_INVALID_ARG,
         "the insertion point (before %z) is not a node of this graph", NULL);
  slapo_graph_free(other);
  slapo_graph_insert_at_end(f->g);
}

static void test_bad_edits(void **state) {
  fixture *f = *state;
  expect(slapo_node_set_input(f->b, 2, f->x), SLAPO_INVALID_ARG,
         "set_input %add: input 2 is out of range (2 inputs)", NULL);
  expect(slapo_node_set_input(f->b, 0, NULL), SLAPO_INVALID_ARG, "set_input %add: new input 0 is NULL",
         NULL);
  expect(slapo_node_set_input(f->b, 0, f->out), SLAPO_INVALID_ARG,
         "the output node %output has no value to use", NULL);
  expect(slapo_graph_move_before(f->g, f->out, f->a), SLAPO_INVALID_ARG,
         "move_before %output: the output node must stay last", NULL);
  expect(slapo_graph_move_before(f->g, f->a, NULL), SLAPO_INVALID_ARG, "node is NULL", NULL);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_erase_with_users),     T(test_erase_foreign),     T(test_replace_order_violation),
      T(test_replace_bad_args),     T(test_second_output),     T(test_getitem_of_non_tuple),
      T(test_null_inputs),          T(test_bad_inputs),        T(test_bad_attrs),
      T(test_bad_meta),             T(test_bad_insertion_point), T(test_bad_edits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
