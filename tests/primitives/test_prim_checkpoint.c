/* tests/primitives/test_prim_checkpoint.c - the `checkpoint` primitive on a
 * tiny GPT-2 (dropout 0.1): loss, logits and gradients stay bitwise equal
 * (the recompute repeats the same kernels and dropout masks); ratio=0.5 on
 * transformer.h of a 4-layer model checkpoints exactly h.0 and h.1 and lowers
 * the planned activation peak; the log line is the .sched form and replays;
 * each documented precondition fails with its status and message and
 * changes no checkpoint flag. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"

static void expect_ckpt(slapo_module *m, const char *want) {
  char *got = pt_capture(pt_print_ckpt, m);
  assert_string_equal(got, want);
  free(got);
}

static void test_outputs_and_grads_bitwise_equal(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_checkpoint(pt_at(root, "transformer.h.0"), 0));
  OK(slapo_checkpoint(pt_at(root, "transformer.h.1.mlp"), 0));
  OK(slapo_checkpoint(pt_at(root, "transformer.h.1.attn"), 0));
  expect_ckpt(m, "transformer.h.0\ntransformer.h.1.attn\ntransformer.h.1.mlp\n");
  pt_result a, b;
  pt_run_both(root, &k_tiny, PT_T, &a, &b);
  pt_expect_bitwise(&b, &a);
  pt_result_free(&a), pt_result_free(&b);
  pt_sched_free(root);
}

static void test_ratio_half_of_four_layers(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny4);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_checkpoint(pt_at(root, "transformer.h"), 0.5));
  expect_ckpt(m, "transformer.h.0\ntransformer.h.1\n");
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h checkpoint ratio=0.5");
  free(line);
  pt_result a, b;
  pt_run_both(root, &k_tiny4, 24, &a, &b);
  pt_expect_bitwise(&b, &a);
  print_message("planned activation peak of a train step: %zu B plain, %zu B with h.0 and h.1 "
                "checkpointed\n",
                a.peak_train, b.peak_train);
  assert_true(b.peak_train < a.peak_train);
  pt_result_free(&a), pt_result_free(&b);
  pt_sched_free(root);
}

static void test_log_lines_are_sched_form_and_replay(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny4);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_checkpoint(pt_at(root, "transformer.h.3.mlp"), 0));
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.3.mlp checkpoint");
  free(line);
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.3.mlp checkpoint");
  free(line);
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.h   checkpoint   ratio=0.75\n"
                       "transformer.h.3.attn checkpoint\n",
                       "c.sched", &src));
  OK(slapo_primitive_apply(pt_at(root, "transformer.h"), slapo_sched_log_entry(src, 0)));
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h checkpoint ratio=0.75");
  free(line);
  OK(slapo_primitive_apply(pt_at(root, "transformer.h.3.attn"), slapo_sched_log_entry(src, 1)));
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.3.attn checkpoint");
  free(line);
  const slapo_sched_entry *e = slapo_sched_log_entry(slapo_sched_log_of(root), 2);
  assert_string_equal(e->file, "c.sched");
  assert_int_equal(e->line, 2);
  expect_ckpt(m, "transformer.h.0\ntransformer.h.1\ntransformer.h.2\ntransformer.h.3.attn\n"
                 "transformer.h.3.mlp\n");
  pt_expect_replays(root, &k_tiny4);
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

/* ---- preconditions ---- */

static void test_fail_root(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_checkpoint(root, 0), SLAPO_INVALID_ARG,
                    "checkpoint: ", "cannot checkpoint the root module");
  pt_sched_free(root);
}

static void test_fail_ratio_out_of_range(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h"), 1.5), SLAPO_INVALID_ARG,
                    "checkpoint: transformer.h: ratio=1.5 is not in (0, 1]");
  /* The text form: 0 and a non-number are refused too. */
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.h checkpoint ratio=0\n"
                       "transformer.h checkpoint ratio=abc\n"
                       "transformer.h checkpoint ratio=0.5 depth=2\n",
                       "r.sched", &src));
  const char *want[3] = {"ratio=0 is not in (0, 1]", "ratio", "depth"};
  for (size_t i = 0; i < 3; i++) {
    char loc[32];
    snprintf(loc, sizeof loc, "r.sched:%zu: ", i + 1);
    PT_EXPECT_REFUSED(
        root, slapo_primitive_apply(pt_at(root, "transformer.h"), slapo_sched_log_entry(src, i)),
        SLAPO_INVALID_ARG, loc, want[i]);
  }
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

static void test_fail_ratio_without_children(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h.0.mlp.c_fc"), 0.5),
                    SLAPO_INVALID_ARG,
                    "checkpoint: transformer.h.0.mlp.c_fc (a Linear) has no children for ratio=0.5",
                    "drop the ratio");
  pt_sched_free(root);
}

static void test_fail_ratio_selects_none(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h"), 0.1), SLAPO_INVALID_ARG,
                    "checkpoint: transformer.h: ratio=0.1 of 2 children selects none");
  pt_sched_free(root);
}

static void test_fail_already_checkpointed(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny4);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_checkpoint(pt_at(root, "transformer.h.1"), 0));
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h.1"), 0), SLAPO_STATE,
                    "checkpoint: transformer.h.1 is already checkpointed");
  /* A ratio reaching h.1 fails whole: h.0 stays as it was. */
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h"), 0.5), SLAPO_STATE,
                    "checkpoint: transformer.h.1 is already checkpointed");
  expect_ckpt(m, "transformer.h.1\n");
  /* One that stops before it succeeds. */
  OK(slapo_checkpoint(pt_at(root, "transformer.h"), 0.25));
  expect_ckpt(m, "transformer.h.0\ntransformer.h.1\n");
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outputs_and_grads_bitwise_equal),
      cmocka_unit_test(test_ratio_half_of_four_layers),
      cmocka_unit_test(test_log_lines_are_sched_form_and_replay),
      cmocka_unit_test(test_fail_root),
      cmocka_unit_test(test_fail_ratio_out_of_range),
      cmocka_unit_test(test_fail_ratio_without_children),
      cmocka_unit_test(test_fail_ratio_selects_none),
      cmocka_unit_test(test_fail_already_checkpointed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
