/* tests/unit/test_op_desc.c - op identity by descriptor (include/slapo/ops.h):
 * every line of slapo/ops.def names a descriptor SLAPO_OP_DESC(x) that the
 * registry finds under its own name, in list order; slapo_node_is_op compares
 * by descriptor, not by name or kind; and among the elementwise binary ops
 * exactly add and mul carry the commutative flag the pattern matcher reads. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/opfix.h"
#include "slapo/ops.h"

typedef struct entry {
  const char *name;
  const slapo_op *op;
} entry;

/* The whole list, through the same X-macro the registry uses. */
static const entry k_all[] = {
#define SLAPO_OP(name) {#name, SLAPO_OP_DESC(name)},
#include "slapo/ops.def"
#undef SLAPO_OP
};
#define N_ALL ((int)(sizeof k_all / sizeof k_all[0]))

/* The elementwise group alone (slapo/ops/elementwise.def). */
static const entry k_elementwise[] = {
#define SLAPO_OP(name) {#name, SLAPO_OP_DESC(name)},
#include "slapo/ops/elementwise.def"
#undef SLAPO_OP
};
#define N_ELEMENTWISE ((int)(sizeof k_elementwise / sizeof k_elementwise[0]))

static void test_names_round_trip(void **state) {
  (void)state;
  /* Run-time ops (none here) would come after the built-ins. */
  assert_true(slapo_op_count() >= N_ALL);
  for (int i = 0; i < N_ALL; i++) {
    const entry *e = &k_all[i];
    assert_non_null(e->op);
    /* The descriptor's own name is the one on its ops.def line ... */
    assert_string_equal(e->op->name, e->name);
    /* ... the registry finds that very descriptor by it ... */
    assert_ptr_equal(slapo_op_find(e->name), e->op);
    /* ... and lists it at the line's position. */
    assert_ptr_equal(slapo_op_at(i), e->op);
    for (int j = 0; j < i; j++) assert_ptr_not_equal(k_all[j].op, e->op);
  }
}

/* add's descriptor under another name: the same fields, another identity. */
static slapo_op add_twin;

static void test_node_is_op(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_node *y = slapo_add(f->ctx, x, x);
  assert_non_null(y);
  assert_true(slapo_node_is_op(y, SLAPO_OP_DESC(add)));
  assert_ptr_equal(y->op, SLAPO_OP_DESC(add));
  /* Wrong op, including one with add's very fields. */
  assert_false(slapo_node_is_op(y, SLAPO_OP_DESC(mul)));
  add_twin = *SLAPO_OP_DESC(add);
  add_twin.name = "test_add_twin";
  slapo_node *in[2] = {x, x};
  slapo_node *t = slapo_op_apply(f->ctx, &add_twin, 2, in, 0, NULL);
  assert_non_null(t);
  assert_true(slapo_node_is_op(t, &add_twin));
  assert_false(slapo_node_is_op(t, SLAPO_OP_DESC(add)));
  /* Wrong kind: a placeholder whose target spells an op's name. */
  slapo_node *p = opfix_input(f, "add", 2, s);
  assert_string_equal(p->target, "add");
  assert_false(slapo_node_is_op(p, SLAPO_OP_DESC(add)));
  assert_false(slapo_node_is_op(x, SLAPO_OP_DESC(add)));
  /* NULL on either side. */
  assert_false(slapo_node_is_op(NULL, SLAPO_OP_DESC(add)));
  assert_false(slapo_node_is_op(y, NULL));
  assert_int_equal(slapo_ctx_status(f->ctx), SLAPO_OK);
}

static bool is_add_or_mul(const slapo_op *op) {
  return op == SLAPO_OP_DESC(add) || op == SLAPO_OP_DESC(mul);
}

static void test_commutative(void **state) {
  (void)state;
  assert_true(SLAPO_OP_DESC(add)->commutative);
  assert_true(SLAPO_OP_DESC(mul)->commutative);
  assert_false(SLAPO_OP_DESC(sub)->commutative);
  assert_false(SLAPO_OP_DESC(div)->commutative);
  /* Every elementwise op of two inputs (the fused backwards read x and dy,
   * which must not swap) is commutative exactly when it is add or mul ... */
  int n_binary = 0;
  for (int i = 0; i < N_ELEMENTWISE; i++) {
    const slapo_op *op = k_elementwise[i].op;
    if (op->n_inputs != 2) continue;
    n_binary++;
    if (op->commutative != is_add_or_mul(op))
      fail_msg("%s: commutative is %d", op->name, op->commutative);
  }
  assert_true(n_binary >= 4);
  /* ... and no other built-in op claims the flag. */
  for (int i = 0; i < N_ALL; i++)
    if (k_all[i].op->commutative && !is_add_or_mul(k_all[i].op))
      fail_msg("%s is marked commutative", k_all[i].name);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_round_trip),
      cmocka_unit_test_setup_teardown(test_node_is_op, opfix_setup, opfix_teardown),
      cmocka_unit_test(test_commutative),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
