/* tests/primitives/test_prim_replace.c - the `replace` primitive on a tiny
 * GPT-2 (2 layers, dropout 0.1): FlashAttention in place of GPT2Attention
 * keeps logits, the train-mode loss and every gradient within 1e-5 + 1e-4
 * |x|; the replacement shares the old parameter objects, so Hugging Face
 * paths and checkpoints are unchanged; the log line is the .sched form and
 * replays; a C-only module is logged as not replayable; each documented
 * precondition fails with its status and message and changes nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <unistd.h>

#include "primitives/prim_test.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

/* ---- numerics ---- */

static void test_outputs_and_grads_equal_after_replace(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_replace(pt_at(root, "transformer.h.0.attn"), "FlashAttention"));
  OK(slapo_replace(pt_at(root, "transformer.h.1.attn"), "FlashAttention"));
  assert_string_equal(slapo_sched_module(pt_at(root, "transformer.h.0.attn"))->type->name,
                      "FlashAttention");
  assert_string_equal(slapo_sched_module(pt_at(root, "transformer.h.1.attn"))->type->name,
                      "FlashAttention");
  pt_result a, b;
  pt_run_both(root, &k_tiny, PT_T, &a, &b);
  pt_expect_close(&b, &a, 1e-5, 1e-4);
  /* Dropout 0.1 really acts in the train step being compared: the same
   * batch without it gives another loss. */
  slapo_gpt2_config nodrop = k_tiny;
  nodrop.dropout = 0;
  slapo_module *plain = pt_model(&nodrop);
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  pt_result c;
  pt_run(plain, in, &c);
  assert_true(fabsf(c.loss - a.loss) > 1e-4f);
  pt_result_free(&a), pt_result_free(&b), pt_result_free(&c);
  pt_sched_free(root);
  slapo_module_free(plain);
  pt_inputs_free(in);
}

/* ---- parameters and paths ---- */

static void collect_path(slapo_parameter *p, const char *path, void *ud) {
  (void)p;
  FILE *f = ud;
  fprintf(f, "%s\n", path);
}

static void print_paths(const void *m, FILE *f) {
  OK(slapo_module_visit_params((slapo_module *)m, collect_path, f));
}

static void test_same_parameter_objects_and_paths(void **state) {
  (void)state;
  slapo_module *plain = pt_model(&k_tiny);
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_module *m = slapo_sched_module(root);
  slapo_module *old = slapo_sched_module(pt_at(root, "transformer.h.0.attn"));
  const char *lin[2] = {"c_attn", "c_proj"}, *pn[2] = {"weight", "bias"};
  slapo_parameter *before[2][2];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      before[i][j] = slapo_module_param(slapo_module_child(old, lin[i]), pn[j]);
  OK(slapo_replace(pt_at(root, "transformer.h.0.attn"), "FlashAttention"));
  slapo_module *now = slapo_sched_module(pt_at(root, "transformer.h.0.attn"));
  assert_ptr_not_equal(now, old);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      assert_non_null(before[i][j]);
      assert_ptr_equal(slapo_module_param(slapo_module_child(now, lin[i]), pn[j]), before[i][j]);
    }
  /* The schedule tree below the node was rebuilt onto the new module. */
  assert_ptr_equal(slapo_sched_module(pt_at(root, "transformer.h.0.attn.c_attn")),
                   slapo_module_child(now, "c_attn"));
  /* Every parameter path is the plain model's. */
  char *a = pt_capture(print_paths, plain), *b = pt_capture(print_paths, m);
  assert_string_equal(a, b);
  free(a), free(b);
  pt_sched_free(root);
  slapo_module_free(plain);
}

typedef struct by_path {
  slapo_module *other;
  int n;
} by_path;

static void expect_equal_weight(slapo_parameter *p, const char *path, void *ud) {
  by_path *bp = ud;
  const char *dot = strrchr(path, '.');
  char mod[512];
  snprintf(mod, sizeof mod, "%.*s", (int)(dot - path), path);
  slapo_module *x;
  OK(slapo_module_at(bp->other, mod, &x));
  slapo_parameter *q = slapo_module_param(x, dot + 1);
  assert_non_null(q);
  if (!pt_same_bytes(p->value, q->value)) fail_msg("%s differs after save and load", path);
  bp->n++;
}

/* Hugging Face checkpoints move both ways between a replaced and a plain
 * model (the plain one starts from other weights). */
static void test_checkpoint_loads_across_replace(void **state) {
  (void)state;
  char dir[] = "/tmp/slapo_prim_replace_XXXXXX", file[128];
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  slapo_module *plain, *back;
  OK(slapo_gpt2_new(&k_tiny, &plain));
  OK(slapo_module_materialize(plain, 99));
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_replace(pt_at(root, "transformer.h.0.attn"), "FlashAttention"));
  OK(slapo_replace(pt_at(root, "transformer.h.1.attn"), "FlashAttention"));
  OK(slapo_gpt2_save(m, file, 0, NULL, NULL));
  OK(slapo_gpt2_load(plain, file));
  by_path bp = {plain, 0};
  OK(slapo_module_visit_params(m, expect_equal_weight, &bp));
  assert_int_equal(bp.n, 12 * k_tiny.n_layer + 4);
  /* And back: a plain checkpoint loads into a replaced model. */
  OK(slapo_gpt2_new(&k_tiny, &back));
  OK(slapo_module_materialize(back, 123));
  slapo_sched *r2;
  OK(slapo_sched_create(back, &r2));
  OK(slapo_replace(pt_at(r2, "transformer.h.1.attn"), "FlashAttention"));
  OK(slapo_gpt2_load(back, file));
  bp = (by_path){plain, 0};
  OK(slapo_module_visit_params(back, expect_equal_weight, &bp));
  unlink(file);
  rmdir(dir);
  pt_sched_free(root), slapo_sched_free(r2);
  slapo_module_free(plain), slapo_module_free(back);
}

/* ---- the log ---- */

static void test_log_line_is_sched_form_and_replays(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_replace(pt_at(root, "transformer.h.0.attn"), "FlashAttention"));
  assert_int_equal(slapo_sched_log_count(slapo_sched_log_of(root)), 1);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.0.attn replace FlashAttention");
  free(line);
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.0.attn replace FlashAttention");
  free(line);
  const slapo_sched_entry *e = slapo_sched_log_entry(slapo_sched_log_of(root), 0);
  assert_true(e->replayable);
  assert_null(e->file);

  /* The text form logs the same line with its source. */
  slapo_sched_log *src;
  OK(slapo_sched_parse("# comment\ntransformer.h.1.attn   replace   FlashAttention\n", "r.sched",
                       &src));
  OK(slapo_primitive_apply(pt_at(root, "transformer.h.1.attn"), slapo_sched_log_entry(src, 0)));
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.1.attn replace FlashAttention");
  free(line);
  e = slapo_sched_log_entry(slapo_sched_log_of(root), 1);
  assert_string_equal(e->file, "r.sched");
  assert_int_equal(e->line, 2);
  pt_expect_replays(root, &k_tiny);
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

static void test_replace_with_c_only_module_not_replayable(void **state) {
  (void)state;
  slapo_module *relu;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_module *m = slapo_sched_module(root);
  OK(slapo_relu_new(&relu));
  OK(slapo_replace_with(pt_at(root, "transformer.h.0.mlp.act"), relu));
  assert_ptr_equal(slapo_sched_module(pt_at(root, "transformer.h.0.mlp.act")), relu);
  const slapo_sched_entry *e = slapo_sched_log_entry(slapo_sched_log_of(root), 0);
  assert_false(e->replayable);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.0.mlp.act replace ReLU # not replayable");
  free(line);
  line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.0.mlp.act replace ReLU # not replayable");
  free(line);
  /* The model still runs with the C-only module in place. */
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  pt_result r;
  pt_run(m, in, &r);
  assert_true(isfinite(r.loss));
  pt_result_free(&r);
  pt_inputs_free(in);
  pt_sched_free(root);
}

/* ---- preconditions ---- */

static void test_fail_root(void **state) {
  (void)state;
  slapo_module *relu;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace(root, "FlashAttention"), SLAPO_INVALID_ARG, "replace",
                    "cannot replace the root");
  /* replace_with consumes its module also on error (ASan checks the leak). */
  OK(slapo_relu_new(&relu));
  PT_EXPECT_REFUSED(root, slapo_replace_with(root, relu), SLAPO_INVALID_ARG,
                    "cannot replace the root");
  PT_EXPECT_REFUSED(root, slapo_replace_with(pt_at(root, "transformer.h.0.attn"), NULL),
                    SLAPO_INVALID_ARG, "module is NULL");
  pt_sched_free(root);
}

static void test_fail_unregistered_name(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace(pt_at(root, "transformer.h.0.attn"), "SlowAttention"),
                    SLAPO_NOT_FOUND, "transformer.h.0.attn",
                    "no module is registered as 'SlowAttention'", "registered: ", "FlashAttention");
  pt_sched_free(root);
}

static void test_fail_factory_rejects_linear(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace(pt_at(root, "transformer.h.0.mlp.c_fc"), "FlashAttention"),
                    SLAPO_INVALID_ARG, "replace: transformer.h.0.mlp.c_fc: ",
                    "(GPT2Attention, LlamaAttention, BertSelfAttention) only, got Linear");
  pt_sched_free(root);
}

/* The text form: a missing name or a stray key fails before anything
 * changes, with the entry's file:line in front. */
static void test_fail_text_form_arguments(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.h.0.attn replace\n"
                       "transformer.h.0.attn replace FlashAttention fast=true\n"
                       "transformer.h.0.attn replace \"FlashAttention\"\n",
                       "bad.sched", &src));
  slapo_sched *node = pt_at(root, "transformer.h.0.attn");
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(node, slapo_sched_log_entry(src, 0)),
                    SLAPO_INVALID_ARG, "bad.sched:1: ", "expected a registered module name");
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(node, slapo_sched_log_entry(src, 1)),
                    SLAPO_INVALID_ARG, "bad.sched:2: ", "fast");
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(node, slapo_sched_log_entry(src, 2)),
                    SLAPO_INVALID_ARG, "bad.sched:3: ");
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

/* A name the log cannot hold as a bare word fails before anything is built
 * or swapped (the log line is checked first). */
static void test_fail_name_not_loggable(void **state) {
  (void)state;
  OK(slapo_module_register("Flash Attention", "a name with a space", slapo_flash_attention_new));
  slapo_module *relu;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(root, slapo_replace(pt_at(root, "transformer.h.0.attn"), "Flash Attention"),
                    SLAPO_INVALID_ARG, "'Flash Attention' cannot be a bare word");
  /* The same for a C-only module whose type name is not a word. */
  static slapo_module_type odd;
  OK(slapo_relu_new(&relu));
  odd = *relu->type;
  odd.name = "My ReLU";
  relu->type = &odd;
  PT_EXPECT_REFUSED(root, slapo_replace_with(pt_at(root, "transformer.h.0.mlp.act"), relu),
                    SLAPO_INVALID_ARG, "'My ReLU' cannot be a bare word");
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outputs_and_grads_equal_after_replace),
      cmocka_unit_test(test_same_parameter_objects_and_paths),
      cmocka_unit_test(test_checkpoint_loads_across_replace),
      cmocka_unit_test(test_log_line_is_sched_form_and_replays),
      cmocka_unit_test(test_replace_with_c_only_module_not_replayable),
      cmocka_unit_test(test_fail_root),
      cmocka_unit_test(test_fail_unregistered_name),
      cmocka_unit_test(test_fail_factory_rejects_linear),
      cmocka_unit_test(test_fail_text_form_arguments),
      cmocka_unit_test(test_fail_name_not_loggable),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
