/* tests/apply/test_apply_nomem.c - allocation-failure sweep over a whole
 * scheduled run: a 3-layer tiny GPT-2 is built and materialized, a schedule
 * like schedules/gpt2.sched (FlashAttention, decompose, flattened trace, two
 * fuses with compiler=none, checkpoint) is parsed and applied, then one
 * train step runs and the weights are saved and loaded back. For
 * k = 0, 1, 2, ... allocation k and every later one fail: each run must
 * return SLAPO_NOMEM (never abort or crash) and leave nothing allocated;
 * once k passes the run's allocation count it succeeds. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/failalloc.h"
#include "slapo/apply.h"
#include "slapo/models.h"

/* n_layer, n_head, n_embd, n_ctx, vocab, dropout, ln_eps. */
static const slapo_gpt2_config k_cfg = {3, 2, 16, 16, 64, 0.1, 1e-5};

/* gpt2.sched with compiler=none (no C compiler in the loop) and the
 * checkpoint line enabled. */
static const char k_sched[] =
    "transformer.h.*.attn          replace     FlashAttention\n"
    "transformer.h.*.attn.c_proj   decompose\n"
    "transformer.h.*.mlp.c_fc      decompose\n"
    "transformer.h.*.mlp.c_proj    decompose\n"
    "transformer.h.*               trace       flatten=true\n"
    "transformer.h.*               fuse        pattern=\"gelu(add(x, b))\" compiler=none "
    "name=FusedBiasGeLU\n"
    "transformer.h.*               fuse        pattern=\"add(x, dropout(add(y, b)))\" "
    "compiler=none name=FusedBiasDropoutResidual all=true\n"
    "transformer.h                 checkpoint  ratio=0.5\n";

static char g_dir[256], g_weights[512];
/* Allocation attempts up to the schedule's end (the latest run's). */
static long g_sched_attempts;

/* idx and targets [2, 8] i32 token ids below the vocabulary size. */
static slapo_status make_inputs(slapo_tensor *in[2]) {
  int64_t bt[2] = {2, 8};
  for (int j = 0; j < 2; j++) {
    slapo_status s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &in[j]);
    if (s != SLAPO_OK) return s;
    int32_t *d = slapo_tensor_data(in[j]); /* [2, 8] */
    for (int i = 0; i < 16; i++) d[i] = (int32_t)((i * 37 + j * 11 + 5) % k_cfg.vocab_size);
  }
  return SLAPO_OK;
}

/* Applies k_sched to a fresh materialized model (*model and *root owned by
 * the caller, also on error). */
static slapo_status build_scheduled(slapo_module **model, slapo_sched **root) {
  slapo_sched_log *log = NULL;
  slapo_status s = slapo_gpt2_new(&k_cfg, model);
  if (s == SLAPO_OK) s = slapo_module_materialize(*model, 7);
  if (s == SLAPO_OK) s = slapo_sched_create(*model, root);
  if (s == SLAPO_OK) s = slapo_sched_parse(k_sched, "nomem.sched", &log);
  if (s == SLAPO_OK) s = slapo_apply_schedule(*root, log, NULL, 0, 0, NULL);
  slapo_sched_log_free(log);
  return s;
}

/* The whole run; frees everything. Returns the first failure. */
static slapo_status scenario(void) {
  slapo_module *model = NULL;
  slapo_sched *root = NULL;
  slapo_runner *run = NULL;
  slapo_tensor *in[2] = {NULL, NULL};
  slapo_status s = build_scheduled(&model, &root);
  g_sched_attempts = failalloc_attempts();
  if (s == SLAPO_OK) s = make_inputs(in);
  if (s == SLAPO_OK) s = slapo_runner_new(model, NULL, &run);
  if (s == SLAPO_OK) {
    slapo_kernel_env env = {.seed = 2024, .step = 1, .training = true};
    const slapo_tensor *loss;
    s = slapo_step(run, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, &loss);
  }
  if (s == SLAPO_OK) s = slapo_gpt2_save(model, g_weights, 0, NULL, NULL);
  if (s == SLAPO_OK) s = slapo_gpt2_load(model, g_weights);
  slapo_runner_free(run);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
  slapo_sched_free(root);
  slapo_module_free(model);
  return s;
}

/* One run with allocation `fail_at` and every later one failing (-1: none);
 * fails the test on a leak or a status other than OK / NOMEM. Returns the
 * status and the run's allocation attempts. */
static slapo_status run_failing_at(long fail_at, long *attempts) {
  failalloc_install(fail_at);
  slapo_status s = scenario();
  long live = failalloc_live();
  *attempts = failalloc_attempts();
  failalloc_uninstall();
  if (live != 0)
    fail_msg("fail_at %ld: %ld blocks leaked (status %s: %s)", fail_at, live,
             slapo_status_name(s), s == SLAPO_OK ? "" : slapo_last_error());
  if (s != SLAPO_OK && s != SLAPO_NOMEM)
    fail_msg("fail_at %ld: status %s (%s), expected nomem", fail_at, slapo_status_name(s),
             slapo_last_error());
  return s;
}

/* The run makes about 5400 allocations and a sweep is quadratic in that
 * (a full one takes ~11 s optimized, minutes under ASan). So every index is
 * failed while the model is built and the schedule applies (~4000: trace,
 * find, fuse, replace, where the bugs this test was written for were), and
 * every 7th after it (step, save, load: each still hit hundreds of times);
 * ~6 s optimized. SLAPO_NOMEM_STRIDE=1 sweeps every index (run it after
 * changing an error path). */
static void test_nomem_scheduled_run(void **state) {
  (void)state;
  /* A first run without the hook performs the library's one-time set-up
   * (op and compiler registries), which a later libc free must not see. */
  assert_int_equal(scenario(), SLAPO_OK);
  long total;
  assert_int_equal(run_failing_at(-1, &total), SLAPO_OK);
  assert_true(total > 100);
  const char *env = getenv("SLAPO_NOMEM_STRIDE");
  long stride = env && atol(env) > 0 ? atol(env) : 7;
  long attempts, sched = g_sched_attempts;
  for (long k = 0; k < total; k += k < sched ? 1 : stride)
    assert_int_equal(run_failing_at(k, &attempts), SLAPO_NOMEM);
  /* Failing past the last allocation changes nothing. */
  assert_int_equal(run_failing_at(total, &attempts), SLAPO_OK);
  assert_int_equal(attempts, total);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/slapo_test_apply_nomem_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_weights, sizeof g_weights, "%s/weights.safetensors", g_dir);
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nomem_scheduled_run),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
