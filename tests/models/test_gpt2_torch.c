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

#include "common/modelfix.h"
#include "common/torchfix.h"
#include "slapo/train.h"

static char g_path[4096];
static slapo_safetensors *g_fix;

static slapo_gpt2_config tiny_cfg(void) {
  return (slapo_gpt2_config){2, 4, 32, 16, 256, 0.0, 1e-5};
}


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

static bool conv1d(const char *path) { return slapo_gpt2_is_conv1d_weight(path); }

static modelfix fix_of(slapo_module *m) {
  return (modelfix){m, g_fix, 2, {"input_ids", "labels"}, conv1d};
}

static void test_logits_and_loss(void **state) {
  (void)state;
  slapo_module *m = load_model();
  modelfix c = fix_of(m);
  modelfix_logits_and_loss(&c, 1e-4);
  slapo_module_free(m);
}

static void test_gradients(void **state) {
  (void)state;
  slapo_module *m = load_model();
  modelfix c = fix_of(m);
  modelfix_gradients(&c, 4 + 12 * 2, 1e-4); /* wte, wpe, ln_f.{w,b}, 12 per block */
  slapo_module_free(m);
}

static void test_adamw_losses(void **state) {
  (void)state;
  slapo_module *m = load_model();
  modelfix c = fix_of(m);
  modelfix_adamw(&c, 1e-4);
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
