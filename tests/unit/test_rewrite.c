/* tests/unit/test_rewrite.c - the rewrite driver (src/rewrite/driver.c):
 * a rule reaches its fixpoint (neg(neg(x)) -> x on a chain of four negs
 * takes two rewrites, the second one found only after the first); rules
 * run in their table's order within a sweep; a guard keeps a rule off a
 * graph; rules that undo each other end with SLAPO_STATE naming the last
 * one instead of looping; a failing rewrite's status names the rule; and
 * the step's table lists its rules in order, each findable by name. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <string.h>

#include "slapo/core.h"
#include "slapo/ir.h"
#include "core/assert.h"
#include "slapo/rewrite.h"


/* ---- rules for the test ---- */

/* neg(neg(x)) -> x, anchored at the outer neg. */
static bool neg2_match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  (void)env;
  m->node[0] = n;
  return slapo_node_is_op(n->inputs[0], SLAPO_OP_DESC(neg)) && n->inputs[0]->n_users == 1;
}
static slapo_status neg2_rewrite(slapo_graph *g, const slapo_rewrite_match *m,
                                 slapo_node **resume) {
  slapo_node *outer = m->node[0], *inner = outer->inputs[0];
  *resume = NULL;
  SLAPO_TRY(slapo_node_replace_all_uses(outer, inner->inputs[0]));
  SLAPO_TRY(slapo_graph_erase(g, outer));
  return slapo_graph_erase(g, inner);
}
static const slapo_rewrite_rule k_neg2 = {"neg2", "neg(neg(x)) -> x", SLAPO_OP_DESC(neg), NULL,
                                          neg2_match, neg2_rewrite};

static bool training_only(const slapo_rewrite_env *env) { return env->training; }
static const slapo_rewrite_rule k_neg2_training = {"neg2_training", "", SLAPO_OP_DESC(neg),
                                                   training_only, neg2_match, neg2_rewrite};

/* add(a, b) -> add(b, a): never a fixpoint. */
static bool any_match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  (void)env;
  m->node[0] = n;
  return true;
}
static slapo_status swap_rewrite(slapo_graph *g, const slapo_rewrite_match *m,
                                 slapo_node **resume) {
  slapo_node *n = m->node[0], *ins[2] = {n->inputs[1], n->inputs[0]}, *out;
  SLAPO_TRY(slapo_rewrite_emit_before(g, n, n->op, 2, ins, 0, NULL, n, &out));
  SLAPO_TRY(slapo_node_replace_all_uses(n, out));
  *resume = out;
  return slapo_graph_erase(g, n);
}
static const slapo_rewrite_rule k_swap = {"swap", "", SLAPO_OP_DESC(add), NULL, any_match,
                                          swap_rewrite};

static slapo_status fail_rewrite(slapo_graph *g, const slapo_rewrite_match *m,
                                 slapo_node **resume) {
  (void)g, (void)m, (void)resume;
  return slapo_error(SLAPO_NOMEM, "out of memory (injected)");
}
static const slapo_rewrite_rule k_fail = {"fails", "", SLAPO_OP_DESC(add), NULL, any_match,
                                          fail_rewrite};

/* Records the order rules fire in. */
static char g_order[64];
static slapo_status note_a(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **r) {
  strcat(g_order, "a");
  return neg2_rewrite(g, m, r);
}
static slapo_status note_b(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **r) {
  strcat(g_order, "b");
  return neg2_rewrite(g, m, r);
}
static const slapo_rewrite_rule k_a = {"a", "", SLAPO_OP_DESC(neg), NULL, neg2_match, note_a};
static const slapo_rewrite_rule k_b = {"b", "", SLAPO_OP_DESC(neg), NULL, neg2_match, note_b};

/* ---- graphs ---- */

/* y = neg^k(x) + x, the output. */
static slapo_graph *chain(int k) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t s[1] = {4};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, s), *y = x;
  for (int i = 0; i < k; i++) y = slapo_neg(ctx, y);
  y = slapo_add(ctx, y, x);
  assert_non_null(slapo_output(ctx, 1, &y));
  slapo_ctx_free(ctx);
  return g;
}

static int count(const slapo_graph *g, const slapo_op *op) {
  int n = 0;
  for (slapo_node *x = slapo_graph_first(g); x; x = x->next) n += slapo_node_is_op(x, op);
  return n;
}

static const slapo_rewrite_env k_train = {.training = true};

static void fixpoint(void **state) {
  (void)state;
  slapo_graph *g = chain(4);
  const slapo_rewrite_rule *rules[1] = {&k_neg2};
  int n = 0;
  OK(slapo_rewrite_run(g, rules, 1, &k_train, &n));
  assert_int_equal(n, 2);
  assert_int_equal(count(g, SLAPO_OP_DESC(neg)), 0);
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
  g = chain(3); /* one neg is left */
  OK(slapo_rewrite_run(g, rules, 1, &k_train, &n));
  assert_int_equal(n, 1);
  assert_int_equal(count(g, SLAPO_OP_DESC(neg)), 1);
  slapo_graph_free(g);
}

static void order_and_guard(void **state) {
  (void)state;
  slapo_graph *g = chain(4);
  const slapo_rewrite_rule *rules[2] = {&k_b, &k_a};
  int n[2];
  g_order[0] = '\0';
  OK(slapo_rewrite_run(g, rules, 2, &k_train, n));
  assert_string_equal(g_order, "bb"); /* b first: it takes both */
  assert_int_equal(n[0], 2);
  assert_int_equal(n[1], 0);
  slapo_graph_free(g);
  g = chain(2);
  const slapo_rewrite_rule *guarded[1] = {&k_neg2_training};
  OK(slapo_rewrite_run(g, guarded, 1, &(slapo_rewrite_env){.training = false}, n));
  assert_int_equal(n[0], 0);
  assert_int_equal(count(g, SLAPO_OP_DESC(neg)), 2);
  slapo_graph_free(g);
}

static void no_fixpoint_and_failure(void **state) {
  (void)state;
  slapo_graph *g = chain(0);
  const slapo_rewrite_rule *swap[1] = {&k_swap}, *fail[1] = {&k_fail};
  assert_int_equal(slapo_rewrite_run(g, swap, 1, &k_train, NULL), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "(last: swap)"));
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_rewrite_run(g, fail, 1, &k_train, NULL), SLAPO_NOMEM);
  assert_non_null(strstr(slapo_last_error(), "rewrite fails: out of memory (injected)"));
  slapo_graph_free(g);
}

static void step_table(void **state) {
  (void)state;
  int n;
  const slapo_rewrite_rule *const *r = slapo_rewrite_step_rules(&n);
  const char *want[] = {"fold_split_grads", "fold_index_add", "fold_norm_add", "drop_identity"};
  assert_int_equal(n, 4);
  for (int i = 0; i < n; i++) {
    assert_string_equal(r[i]->name, want[i]);
    assert_ptr_equal(slapo_rewrite_rule_find(want[i]), r[i]);
    assert_non_null(r[i]->summary);
  }
  assert_null(slapo_rewrite_rule_find("no_such_rule"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fixpoint),
      cmocka_unit_test(order_and_guard),
      cmocka_unit_test(no_fixpoint_and_failure),
      cmocka_unit_test(step_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
