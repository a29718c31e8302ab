/* tests/primitives/test_prim_annotate.c - the `annotate` primitive on a tiny
 * GPT-2 (2 layers, dropout 0.1): loss, logits and gradients stay bitwise
 * equal; the log line is the .sched form (weight_decay=0, not "0") and
 * replays; tags survive `replace`; AdamW reads weight_decay; each documented
 * precondition fails with its status and message and sets no tag. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"
#include "slapo/train.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static slapo_parameter *param(slapo_sched *root, const char *mod, const char *name) {
  slapo_parameter *p = slapo_module_param(slapo_sched_module(pt_at(root, mod)), name);
  assert_non_null(p);
  return p;
}

static void test_outputs_and_grads_bitwise_equal(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_annotate(pt_at(root, "transformer.wte"), "weight", "weight_decay", "0"));
  OK(slapo_annotate(pt_at(root, "transformer.h.0.attn.c_attn"), "weight", "weight_decay", "0.05"));
  OK(slapo_annotate(pt_at(root, "transformer.h.1.ln_2"), "bias", "note", "kept"));
  pt_result a, b;
  pt_run_both(root, &k_tiny, PT_T, &a, &b);
  pt_expect_bitwise(&b, &a);
  pt_result_free(&a), pt_result_free(&b);
  pt_sched_free(root);
}

static void test_log_line_is_sched_form_and_replays(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  struct {
    const char *mod, *param, *key, *value, *line;
  } cases[] = {
      {"transformer.wte", "weight", "weight_decay", "0",
       "transformer.wte annotate weight weight_decay=0"},
      {"transformer.wpe", "weight", "weight_decay", "0.0",
       "transformer.wpe annotate weight weight_decay=0.0"},
      {"transformer.h.0.ln_1", "bias", "group", "norms",
       "transformer.h.0.ln_1 annotate bias group=norms"},
      {"transformer.h.0.ln_2", "bias", "frozen", "true",
       "transformer.h.0.ln_2 annotate bias frozen=true"},
      {"transformer.h.1.ln_1", "weight", "note", "two words",
       "transformer.h.1.ln_1 annotate weight note=\"two words\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    OK(slapo_annotate(pt_at(root, cases[i].mod), cases[i].param, cases[i].key, cases[i].value));
    slapo_parameter *p = param(root, cases[i].mod, cases[i].param);
    assert_string_equal(slapo_parameter_tag(p, cases[i].key), cases[i].value);
    char *line = pt_last_line(root);
    assert_string_equal(line, cases[i].line);
    free(line);
    line = pt_last_printed_line(root);
    assert_string_equal(line, cases[i].line);
    free(line);
  }
  /* The text form logs its arguments as written, with its source. */
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.h.1.ln_2   annotate  weight  weight_decay=0  note=\"x y\"\n",
                       "a.sched", &src));
  OK(slapo_primitive_apply(pt_at(root, "transformer.h.1.ln_2"), slapo_sched_log_entry(src, 0)));
  char *line = pt_last_printed_line(root);
  assert_string_equal(line, "transformer.h.1.ln_2 annotate weight weight_decay=0 note=\"x y\"");
  free(line);
  assert_string_equal(slapo_parameter_tag(param(root, "transformer.h.1.ln_2", "weight"), "note"),
                      "x y");
  const slapo_sched_log *log = slapo_sched_log_of(root);
  assert_string_equal(slapo_sched_log_entry(log, slapo_sched_log_count(log) - 1)->file, "a.sched");
  pt_expect_replays(root, &k_tiny);
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

/* An entry made in C: number and boolean arguments carry no text (the log
 * formats them); the adapter still reads their values. */
static void test_entry_made_in_c(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_arg args[4] = {slapo_sched_arg_word(NULL, "weight"),
                             slapo_sched_arg_int("weight_decay", 0),
                             slapo_sched_arg_float("lr_scale", 0.5),
                             slapo_sched_arg_bool("frozen", false)};
  slapo_sched_entry e = {.path = "transformer.wpe", .primitive = "annotate", .n_args = 4,
                         .args = args, .replayable = true};
  OK(slapo_primitive_apply(pt_at(root, "transformer.wpe"), &e));
  slapo_parameter *p = param(root, "transformer.wpe", "weight");
  assert_string_equal(slapo_parameter_tag(p, "weight_decay"), "0");
  assert_string_equal(slapo_parameter_tag(p, "lr_scale"), "0.5");
  assert_string_equal(slapo_parameter_tag(p, "frozen"), "false");
  assert_true(p->no_weight_decay);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.wpe annotate weight weight_decay=0 lr_scale=0.5 "
                            "frozen=false");
  free(line);
  pt_sched_free(root);
}

/* Tags live on the parameter objects, which the replacement shares. */
static void test_tags_survive_replace(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_annotate(pt_at(root, "transformer.h.0.attn.c_attn"), "weight", "weight_decay", "0"));
  OK(slapo_annotate(pt_at(root, "transformer.h.0.attn.c_proj"), "bias", "note", "kept"));
  OK(slapo_replace(pt_at(root, "transformer.h.0.attn"), "FlashAttention"));
  assert_string_equal(slapo_sched_module(pt_at(root, "transformer.h.0.attn"))->type->name,
                      "FlashAttention");
  slapo_parameter *w = param(root, "transformer.h.0.attn.c_attn", "weight");
  assert_string_equal(slapo_parameter_tag(w, "weight_decay"), "0");
  assert_true(w->no_weight_decay);
  slapo_parameter *b = param(root, "transformer.h.0.attn.c_proj", "bias");
  assert_string_equal(slapo_parameter_tag(b, "note"), "kept");
  /* Annotating after the replacement reaches the same object too. */
  OK(slapo_annotate(pt_at(root, "transformer.h.0.attn.c_attn"), "weight", "note", "after"));
  assert_string_equal(slapo_parameter_tag(w, "note"), "after");
  pt_sched_free(root);
}

/* ---- AdamW reads weight_decay ---- */

/* One AdamW step (weight decay 0.1) from m's current gradients. */
static void adamw_once(slapo_module *m) {
  slapo_adamw *o;
  slapo_adamw_config cfg = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  OK(slapo_adamw_new(m, &cfg, &o));
  slapo_adamw_step(o, 0.01f);
  slapo_adamw_free(o);
}

static slapo_tensor *weight_copy(slapo_module *m, const char *mod, const char *name) {
  slapo_module *x;
  OK(slapo_module_at(m, mod, &x));
  slapo_tensor *t;
  OK(slapo_tensor_contiguous(slapo_module_param(x, name)->value, &t));
  return t;
}

static void test_adamw_reads_weight_decay(void **state) {
  (void)state;
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  /* dflt: no tags; zero: weight_decay=0 on a 2-D weight and 0.5 on a 1-D
   * LayerNorm weight (ones, not decayed by default);
   * same: weight_decay=0.1 (the optimizer's default) on the weight. */
  slapo_module *dflt = pt_model(&k_tiny), *zero = pt_model(&k_tiny), *same = pt_model(&k_tiny);
  slapo_sched *rz, *rs;
  OK(slapo_sched_create(zero, &rz));
  OK(slapo_sched_create(same, &rs));
  const char *fc = "transformer.h.0.mlp.c_fc";
  OK(slapo_annotate(pt_at(rz, fc), "weight", "weight_decay", "0"));
  OK(slapo_annotate(pt_at(rz, "transformer.h.0.ln_1"), "weight", "weight_decay", "0.5"));
  OK(slapo_annotate(pt_at(rs, fc), "weight", "weight_decay", "0.1"));
  slapo_module *models[3] = {dflt, zero, same};
  pt_result r[3];
  for (int i = 0; i < 3; i++) pt_run(models[i], in, &r[i]), adamw_once(models[i]);
  pt_expect_bitwise(&r[1], &r[0]); /* the gradients the updates start from */
  slapo_tensor *w[3], *b[3], *other[3];
  for (int i = 0; i < 3; i++) {
    w[i] = weight_copy(models[i], fc, "weight");
    b[i] = weight_copy(models[i], "transformer.h.0.ln_1", "weight");
    other[i] = weight_copy(models[i], "transformer.h.1.mlp.c_fc", "weight");
  }
  assert_false(pt_same_bytes(w[1], w[0])); /* weight_decay=0: not decayed         */
  assert_true(pt_same_bytes(w[2], w[0]));  /* weight_decay=0.1: as the default     */
  assert_false(pt_same_bytes(b[1], b[0])); /* a 1-D parameter decays when tagged   */
  assert_true(pt_same_bytes(b[2], b[0]));
  for (int i = 1; i < 3; i++) assert_true(pt_same_bytes(other[i], other[0]));
  /* The difference is the decay term lr * wd * w_before = 1e-3 w_before. */
  slapo_module *fresh = pt_model(&k_tiny);
  slapo_tensor *before = weight_copy(fresh, fc, "weight");
  const float *w0 = slapo_tensor_data(before), *wz = slapo_tensor_data(w[1]),
              *wd = slapo_tensor_data(w[0]); /* [4C, C] */
  for (int64_t j = 0; j < slapo_tensor_numel(before); j++)
    assert_float_equal(wz[j] - wd[j], 1e-3f * w0[j], 1e-8f + 1e-3f * fabsf(1e-3f * w0[j]));
  slapo_tensor_free(before);
  slapo_module_free(fresh);
  for (int i = 0; i < 3; i++) {
    slapo_tensor_free(w[i]), slapo_tensor_free(b[i]), slapo_tensor_free(other[i]);
    pt_result_free(&r[i]);
  }
  slapo_sched_free(rz), slapo_sched_free(rs);
  for (int i = 0; i < 3; i++) slapo_module_free(models[i]);
  pt_inputs_free(in);
}

/* ---- preconditions ---- */

static void test_fail_unknown_parameter(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  PT_EXPECT_REFUSED(
      root,
      slapo_annotate(pt_at(root, "transformer.h.0.attn.c_attn"), "wieght", "weight_decay", "0"),
      SLAPO_NOT_FOUND, "annotate: transformer.h.0.attn.c_attn (a Linear) has no parameter 'wieght'",
      "its parameters: weight, bias");
  PT_EXPECT_REFUSED(
      root, slapo_annotate(pt_at(root, "transformer.h.0.attn"), "weight", "weight_decay", "0"),
      SLAPO_NOT_FOUND, "has no parameter 'weight'", "its parameters: (none)");
  pt_sched_free(root);
}

static void test_fail_weight_decay_not_a_number(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *wte = pt_at(root, "transformer.wte");
  const char *bad[] = {"abc", "", "0.1x", "nan", "inf"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char needle[64];
    snprintf(needle, sizeof needle, "weight_decay=%s is not a finite number", bad[i]);
    PT_EXPECT_REFUSED(root, slapo_annotate(wte, "weight", "weight_decay", bad[i]),
                      SLAPO_INVALID_ARG, "annotate: transformer.wte.weight: ", needle);
  }
  assert_null(param(root, "transformer.wte", "weight")->tags);
  /* A good tag before a bad one on the same line is not set either. */
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.wte annotate weight note=ok weight_decay=abc\n", "w.sched",
                       &src));
  PT_EXPECT_REFUSED(root, slapo_primitive_apply(wte, slapo_sched_log_entry(src, 0)),
                    SLAPO_INVALID_ARG, "w.sched:1: ", "weight_decay=abc is not a finite number");
  assert_null(slapo_parameter_tag(param(root, "transformer.wte", "weight"), "note"));
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

/* A key the log cannot hold, and text lines without a parameter or a tag. */
static void test_fail_malformed_requests(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *wte = pt_at(root, "transformer.wte");
  PT_EXPECT_REFUSED(root, slapo_annotate(wte, "weight", "bad key", "1"), SLAPO_INVALID_ARG,
                    "annotate: transformer.wte: ", "bad key");
  slapo_sched_log *src;
  OK(slapo_sched_parse("transformer.wte annotate weight\n"
                       "transformer.wte annotate weight_decay=0\n"
                       "transformer.wte annotate weight bias note=x\n",
                       "m.sched", &src));
  for (size_t i = 0; i < 3; i++) {
    char loc[32];
    snprintf(loc, sizeof loc, "m.sched:%zu: ", i + 1);
    PT_EXPECT_REFUSED(root, slapo_primitive_apply(wte, slapo_sched_log_entry(src, i)),
                      SLAPO_INVALID_ARG, loc, "annotate: ");
  }
  slapo_sched_log_free(src);
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outputs_and_grads_bitwise_equal),
      cmocka_unit_test(test_log_line_is_sched_form_and_replays),
      cmocka_unit_test(test_entry_made_in_c),
      cmocka_unit_test(test_tags_survive_replace),
      cmocka_unit_test(test_adamw_reads_weight_decay),
      cmocka_unit_test(test_fail_unknown_parameter),
      cmocka_unit_test(test_fail_weight_decay_not_a_number),
      cmocka_unit_test(test_fail_malformed_requests),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
