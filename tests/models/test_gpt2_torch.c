/* tests/models/test_gpt2_torch.c - GPT-2 against PyTorch (llm.c style): a
 * 2-layer, 32-wide GPT-2 with fixed weights and tokens; logits, loss, every
 * parameter gradient and the losses of 5 AdamW steps must match the values
 * tools/gen_gpt2_fixture.py computed with Debian's python3-torch.
 * Tolerances: both sides compute in f32 with different summation orders
 * (oneDNN GEMM blocking vs PyTorch's), so element errors of a few 1e-6
 * relative to the tensor's scale are expected; we allow 1e-4 of the largest
 * magnitude (logits, gradients) and 1e-4 relative on losses, far below
 * what a wrong formula produces (a dropped term or transposed weight gives
 * errors of order 1e-1 relative). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/torchfix.h"
#include "slapo/train.h"

static char g_path[4096];
static slapo_safetensors *g_fix;

static slapo_gpt2_config tiny_cfg(void) {
  return (slapo_gpt2_config){2, 4, 32, 16, 256, 0.0, 1e-5};
}

static slapo_tensor *fixture(const char *name) { return torchfix_get(g_fix, name); }


static int setup(void **state) {
  (void)state;
  return torchfix_open("gpt2_tiny_fixture.safetensors", g_path, sizeof g_path, &g_fix);
}

static int teardown(void **state) {
  (void)state;
  slapo_safetensors_free(g_fix);
  return 0;
}

static slapo_module *load_model(void) {
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 0), SLAPO_OK);
  slapo_status s = slapo_gpt2_load(m, g_path);
  if (s != SLAPO_OK) fail_msg("load: %s", slapo_last_error());
  return m;
}

static void test_logits_and_loss(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *want_logits = fixture("logits"), *want_loss = fixture("loss");
  const slapo_tensor *in[2] = {idx, labels}, *out;
  slapo_status s = slapo_step(r, 1, in, SLAPO_STEP_EVAL, NULL, &out);
  if (s != SLAPO_OK) fail_msg("eval: %s", slapo_last_error());
  double e = torchfix_rel_err(out, want_logits);
  print_message("logits: max error %.3g of max |logit|\n", e);
  assert_true(e < 1e-4);
  s = slapo_step(r, 2, in, SLAPO_STEP_TRAIN, NULL, &out);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  float loss = *(const float *)slapo_tensor_data(out);
  float want = *(const float *)slapo_tensor_data(want_loss);
  print_message("loss: %.7f vs torch %.7f\n", loss, want);
  assert_true(fabs(loss - want) <= 1e-4 * fabs(want));
  slapo_tensor_free(idx), slapo_tensor_free(labels);
  slapo_tensor_free(want_logits), slapo_tensor_free(want_loss);
  slapo_runner_free(r);
  slapo_module_free(m);
}

typedef struct grad_check {
  int n;
  double worst;
  char worst_path[256];
} grad_check;

static bool conv1d(const char *path) {
  return strstr(path, "c_attn.weight") || strstr(path, "c_proj.weight") ||
         strstr(path, "c_fc.weight");
}

static void check_grad(slapo_parameter *p, const char *path, void *ud) {
  grad_check *g = ud;
  char name[512];
  snprintf(name, sizeof name, "grad.%s", path);
  slapo_tensor *want = fixture(name), *tmp = NULL;
  if (conv1d(path)) { /* fixture is [in, out]; ours [out, in] */
    int perm[2] = {1, 0};
    slapo_tensor *v;
    assert_int_equal(slapo_tensor_permute(want, perm, &v), SLAPO_OK);
    assert_int_equal(slapo_tensor_contiguous(v, &tmp), SLAPO_OK);
    slapo_tensor_free(v);
  }
  double e = torchfix_rel_err(p->grad, tmp ? tmp : want);
  if (e > g->worst) g->worst = e, snprintf(g->worst_path, sizeof g->worst_path, "%s", path);
  g->n++;
  slapo_tensor_free(tmp);
  slapo_tensor_free(want);
}

static void test_gradients(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  const slapo_tensor *in[2] = {idx, labels};
  slapo_module_zero_grad(m);
  slapo_status s = slapo_step(r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  grad_check g = {0};
  assert_int_equal(slapo_module_visit_params(m, check_grad, &g), SLAPO_OK);
  print_message("%d gradients: worst %.3g (%s)\n", g.n, g.worst, g.worst_path);
  assert_int_equal(g.n, 4 + 12 * 2); /* wte, wpe, ln_f.{w,b}, 12 per block */
  assert_true(g.worst < 1e-4);
  slapo_tensor_free(idx), slapo_tensor_free(labels);
  slapo_runner_free(r);
  slapo_module_free(m);
}

static void test_adamw_losses(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  slapo_adamw *opt;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f};
  assert_int_equal(slapo_adamw_new(m, &ac, &opt), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *want = fixture("adamw_losses");
  const float *w = slapo_tensor_data(want);
  const slapo_tensor *in[2] = {idx, labels}, *out;
  for (int step = 0; step <= 5; step++) {
    slapo_module_zero_grad(m);
    assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, NULL, &out), SLAPO_OK);
    float loss = *(const float *)slapo_tensor_data(out);
    if (step > 0) {
      print_message("adamw step %d: loss %.6f vs torch %.6f\n", step, loss, w[step - 1]);
      assert_true(fabs(loss - w[step - 1]) <= 1e-4 * fabs(w[step - 1]) + 1e-5);
    }
    slapo_clip_grad_norm(m, 1.0);
    slapo_adamw_step(opt, 1e-2f);
  }
  slapo_tensor_free(idx), slapo_tensor_free(labels), slapo_tensor_free(want);
  slapo_adamw_free(opt);
  slapo_runner_free(r);
  slapo_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logits_and_loss),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test(test_adamw_losses),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
