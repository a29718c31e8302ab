/* tests/primitives/test_prim_replace_all.c - the `replace_all` primitive on
 * a tiny GPT-2 (2 layers, dropout 0.1): every GPT2Attention becomes
 * FlashAttention with logits, train-mode loss and gradients within 1e-5 +
 * 1e-4 |x|, parameter objects and paths kept; one log line in the .sched
 * form that replays; each documented precondition fails with its status and
 * message and changes nothing, including a factory error on a later match
 * (all replacements are built before any is swapped in). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static const char *type_at(slapo_sched *root, const char *path) {
  return slapo_sched_module(pt_at(root, path))->type->name;
}

static void test_outputs_and_grads_equal_after_replace_all(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_parameter *w1 =
      slapo_module_param(slapo_sched_module(pt_at(root, "transformer.h.1.attn.c_attn")), "weight");
  OK(slapo_replace_all(root, "GPT2Attention", "FlashAttention"));
  assert_string_equal(type_at(root, "transformer.h.0.attn"), "FlashAttention");
  assert_string_equal(type_at(root, "transformer.h.1.attn"), "FlashAttention");
  /* Same parameter objects under the new modules. */
  assert_ptr_equal(
      slapo_module_param(slapo_sched_module(pt_at(root, "transformer.h.1.attn.c_attn")), "weight"),
      w1);
  pt_result a, b;
  pt_run_both(root, &k_tiny, PT_T, &a, &b);
  pt_expect_close(&b, &a, 1e-5, 1e-4);
  pt_result_free(&a), pt_result_free(&b);
  pt_sched_free(root);
}

/* Below a subtree only that subtree's matches change. */
static void test_subtree_only(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_replace_all(pt_at(root, "transformer.h.1"), "GPT2Attention", "FlashAttention"));
  assert_string_equal(type_at(root, "transformer.h.0.attn"), "GPT2Attention");
  assert_string_equal(type_at(root, "transformer.h.1.attn"), "FlashAttention");
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1 replace_all GPT2Attention FlashAttention");
  free(line);
  pt_sched_free(root);
}

static void test_log_line_is_sched_form_and_replays(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_replace_all(root, "GPT2Attention", "FlashAttention"));
  /* One primitive, one line. */
  assert_int_equal(slapo_sched_log_count(slapo_sched_log_of(root)), 1);
  char *line = pt_last_line(root);
  assert_string_equal(line, ". replace_all GPT2Attention FlashAttention");
  free(line);
  line = pt_last_printed_line(root);
  assert_string_equal(line, ". replace_all GPT2Attention FlashAttention");
  free(line);
  assert_true(slapo_sched_log_entry(slapo_sched_log_of(root), 0)->replayable);
  pt_expect_replays(root, &k_tiny);
  pt_sched_free(root);
}

static void test_fail_no_module_of_type(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace_all(root, "BertAttention", "FlashAttention"),
                    SLAPO_NO_MATCH, "replace_all", "no BertAttention module below .");
  PT_EXPECT_REFUSED(
      root,
      slapo_replace_all(pt_at(root, "transformer.h.0.mlp"), "GPT2Attention", "FlashAttention"),
      SLAPO_NO_MATCH, "no GPT2Attention module below transformer.h.0.mlp");
  pt_sched_free(root);
}

static void test_fail_unregistered_name(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace_all(root, "GPT2Attention", "SlowAttention"),
                    SLAPO_NOT_FOUND, "replace_all", "no module is registered as 'SlowAttention'",
                    "registered: ", "FlashAttention");
  pt_sched_free(root);
}

/* Every Linear is a match; FlashAttention refuses the first, so nothing is
 * swapped (not even matches it could have taken). */
static void test_fail_factory_changes_nothing(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(
      root, slapo_replace_all(root, "Linear", "FlashAttention"), SLAPO_INVALID_ARG,
      "replace_all: transformer.h.0.attn.c_attn: ", "(GPT2Attention, LlamaAttention, BertSelfAttention) only, got Linear");
  pt_sched_free(root);
}

static void test_fail_text_form_arguments(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_log *src;
  OK(slapo_sched_parse(". replace_all GPT2Attention\n"
                       ". replace_all GPT2Attention FlashAttention Extra\n",
                       "bad.sched", &src));
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(root, slapo_sched_log_entry(src, 0)),
                    SLAPO_INVALID_ARG,
                    "bad.sched:1: ", "expected a module type and a registered module name");
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(root, slapo_sched_log_entry(src, 1)),
                    SLAPO_INVALID_ARG, "bad.sched:2: ");
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outputs_and_grads_equal_after_replace_all),
      cmocka_unit_test(test_subtree_only),
      cmocka_unit_test(test_log_line_is_sched_form_and_replays),
      cmocka_unit_test(test_fail_no_module_of_type),
      cmocka_unit_test(test_fail_unregistered_name),
      cmocka_unit_test(test_fail_factory_changes_nothing),
      cmocka_unit_test(test_fail_text_form_arguments),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
