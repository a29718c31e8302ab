/* tests/apply/test_verify.c - slapo_verify on a tiny GPT-2 (dropout 0.1):
 * the FlashAttention schedule passes entry by entry within tolerance, a
 * checkpoint schedule passes bitwise, and a deliberately wrong replacement
 * ("BrokenAttention": FlashAttention with its output scaled by 1.01,
 * registered here) is caught: SLAPO_VERIFY naming its step, file:line and
 * where it differs, found per entry, by bisection (step 4 of 5) and skipped
 * when disabled. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"

/* ---- BrokenAttention: FlashAttention, output x 1.01 ---- */

static const slapo_module_type *g_flash_type;

static slapo_node *broken_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  slapo_node *y = g_flash_type->forward(ctx, self, n_in, in); /* [B, T, C] */
  return y ? slapo_mul_scalar(ctx, y, 1.01) : NULL;
}

static slapo_module_type k_broken = {"BrokenAttention", broken_forward, NULL, NULL, NULL};

/* The FlashAttention module built from `old` (same children, tied
 * parameters, so parameter paths are kept) with the broken forward. */
static slapo_status broken_new(const slapo_module *old, slapo_module **out) {
  slapo_status s = slapo_flash_attention_new(old, out);
  if (s != SLAPO_OK) return s;
  g_flash_type = (*out)->type;
  k_broken.describe = g_flash_type->describe;
  k_broken.free_config = g_flash_type->free_config;
  (*out)->type = &k_broken;
  return SLAPO_OK;
}

/* ---- BrokenBf16Linear: a Linear that drops its bias when it runs in bf16 ---- */

static slapo_node *bf16_linear_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                       slapo_node *const *in) {
  (void)n_in;
  slapo_node *w = slapo_weight(ctx, self, "weight"), *b = slapo_weight(ctx, self, "bias");
  bool bf16 = slapo_ctx_autocast(ctx) == SLAPO_AUTOCAST_BF16;
  return slapo_linear(ctx, in[0], w, bf16 ? NULL : b);
}

static slapo_module_type k_broken_linear = {"BrokenBf16Linear", bf16_linear_forward, NULL, NULL,
                                            NULL};

static slapo_status broken_linear_new(const slapo_module *old, slapo_module **out) {
  slapo_parameter *w = slapo_module_param(old, "weight"), *b = slapo_module_param(old, "bias");
  slapo_status s = slapo_linear_new(w->value->shape[1], w->value->shape[0], true, 0.02f, out);
  if (s == SLAPO_OK) s = slapo_module_tie_param(*out, "weight", w);
  if (s == SLAPO_OK) s = slapo_module_tie_param(*out, "bias", b);
  if (s == SLAPO_OK) (*out)->type = &k_broken_linear;
  return s;
}

static int setup(void **state) {
  (void)state;
  if (slapo_models_init() != SLAPO_OK) return -1;
  if (slapo_module_register("BrokenBf16Linear", "Linear without its bias in bf16 (a test's bug)",
                            broken_linear_new) != SLAPO_OK)
    return -1;
  return slapo_module_register("BrokenAttention", "FlashAttention x 1.01 (a test's bug)",
                               broken_new) == SLAPO_OK
             ? 0
             : -1;
}

/* ---- harness ---- */

static slapo_status build(void *ud, slapo_module **out) {
  const slapo_gpt2_config *cfg = ud;
  slapo_status s = slapo_gpt2_new(cfg, out);
  if (s == SLAPO_OK && (s = slapo_module_materialize(*out, PT_SEED)) != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  /* Biases start at zero; one that is not shows a dropped bias. */
  slapo_parameter *b = s == SLAPO_OK ? slapo_module_param_at(*out, "transformer.h.0.mlp.c_fc.bias")
                                     : NULL;
  for (int64_t i = 0; b && i < b->value->shape[0]; i++)
    slapo_tensor_set(b->value, &i, 0.05 * (double)(i % 7) - 0.15);
  return s;
}

#define MAX_CHECKS 16

typedef struct checks {
  size_t n;
  slapo_verify_check c[MAX_CHECKS];
} checks;

static void on_check(const slapo_verify_check *c, const slapo_sched_steps *steps, void *ud) {
  checks *k = ud;
  assert_true(k->n < MAX_CHECKS);
  assert_non_null(steps);
  k->c[k->n++] = *c;
  print_message("steps 1-%zu: %s %s, worst %.3g at %s\n", c->upto,
                c->bitwise ? "bitwise" : "tolerance", c->ok ? "ok" : "FAILS", c->worst, c->what);
}

typedef struct run {
  slapo_tensor *in[2];
  slapo_sched_log *log;
  slapo_verify_opts o;
  checks k;
  size_t first_bad;
} run;

static void run_init(run *r, const char *text, const char *file) {
  memset(r, 0, sizeof *r);
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, r->in);
  OK(slapo_sched_parse(text, file, &r->log));
  r->o = (slapo_verify_opts){.n_in = 2, .in = (const slapo_tensor *const *)r->in, .seed = 1337,
                             .step = 1, .per_entry = true};
}

static slapo_status run_verify(run *r) {
  memset(&r->k, 0, sizeof r->k);
  r->first_bad = 99;
  return slapo_verify(build, (void *)&k_tiny, r->log, &r->o, on_check, &r->k, &r->first_bad);
}

static void run_deinit(run *r) {
  pt_inputs_free(r->in);
  slapo_sched_log_free(r->log);
}

/* ---- passing schedules ---- */

static void test_flash_attention_schedule_passes_per_entry(void **state) {
  (void)state;
  run r;
  /* schedules/gpt2_flash_attention.sched */
  run_init(&r, "# Replace every GPT-2 attention by FlashAttention, then checkpoint blocks.\n"
               "transformer.h.*.attn   replace      FlashAttention\n"
               "transformer.h          checkpoint   ratio=1.0\n",
           "fa.sched");
  OK(run_verify(&r));
  assert_int_equal(r.first_bad, 0);
  assert_int_equal(r.k.n, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(r.k.c[i].upto, i + 1);
    assert_true(r.k.c[i].ok);
    assert_false(r.k.c[i].bitwise); /* a replace is in every prefix */
    assert_true(r.k.c[i].worst <= 1.0);
  }
  run_deinit(&r);
}

static void test_checkpoint_schedule_passes_bitwise(void **state) {
  (void)state;
  run r;
  run_init(&r, "transformer.h checkpoint ratio=0.5\n"
               "transformer.h.1.mlp checkpoint\n"
               "transformer.wte annotate weight weight_decay=0\n",
           "ck.sched");
  OK(run_verify(&r));
  assert_int_equal(r.first_bad, 0);
  assert_int_equal(r.k.n, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_true(r.k.c[i].ok);
    assert_true(r.k.c[i].bitwise);
    assert_true(r.k.c[i].worst == 0);
  }
  run_deinit(&r);
}

/* ---- a broken step ---- */

static const char k_broken_text[] =
    "transformer.h.0.attn  replace     FlashAttention\n"     /* step 1 */
    "transformer.wte       annotate    weight weight_decay=0\n" /* step 2 */
    "transformer.h.0.mlp   checkpoint\n"                     /* step 3 */
    "transformer.h.1.attn  replace     BrokenAttention\n"    /* step 4 */
    "transformer.h.1.mlp   checkpoint\n";                    /* step 5 */

static void expect_step4_message(void) {
  const char *msg = slapo_last_error();
  print_message("%s\n", msg);
  const char *needles[] = {"step 4 (", "broken.sched:4", "transformer.h.1.attn replace"};
  for (size_t i = 0; i < 3; i++)
    if (!strstr(msg, needles[i])) fail_msg("message '%s' lacks '%s'", msg, needles[i]);
  if (!strstr(msg, "grad") && !strstr(msg, "logits"))
    fail_msg("message '%s' names neither a gradient nor the logits", msg);
}

static void test_broken_step_found_per_entry(void **state) {
  (void)state;
  run r;
  run_init(&r, k_broken_text, "broken.sched");
  assert_int_equal(run_verify(&r), SLAPO_VERIFY);
  expect_step4_message();
  assert_int_equal(r.first_bad, 4);
  /* Steps 1-3 pass; the check stops at the first failure. */
  assert_int_equal(r.k.n, 4);
  for (size_t i = 0; i < 3; i++) assert_true(r.k.c[i].ok);
  assert_false(r.k.c[3].ok);
  assert_true(r.k.c[3].worst > 1.0);
  run_deinit(&r);
}

static void test_broken_step_found_by_bisect(void **state) {
  (void)state;
  run r;
  run_init(&r, k_broken_text, "broken.sched");
  r.o.bisect = true;
  assert_int_equal(run_verify(&r), SLAPO_VERIFY);
  expect_step4_message();
  assert_int_equal(r.first_bad, 4);
  /* All 5, then the binary search: 2 (ok), 3 (ok), 4 (fails). */
  assert_int_equal(r.k.n, 4);
  const size_t upto[4] = {5, 2, 3, 4};
  const bool ok[4] = {false, true, true, false};
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(r.k.c[i].upto, upto[i]);
    assert_int_equal(r.k.c[i].ok, ok[i]);
  }
  run_deinit(&r);
}

static void test_disabling_the_broken_step_passes(void **state) {
  (void)state;
  run r;
  run_init(&r, k_broken_text, "broken.sched");
  const size_t off[1] = {4};
  r.o.disabled = off;
  r.o.n_disabled = 1;
  r.o.bisect = true;
  OK(run_verify(&r));
  assert_int_equal(r.first_bad, 0);
  /* Per entry: every prefix passes (step 4's is the same as step 3's). */
  r.o.bisect = false;
  OK(run_verify(&r));
  assert_int_equal(r.first_bad, 0);
  assert_int_equal(r.k.n, 5);
  run_deinit(&r);
}

/* Without per-entry checks only the whole schedule is compared: the failure
 * is reported at its last step, measured against the tolerance. */
static void test_final_only_reports_last_step(void **state) {
  (void)state;
  run r;
  run_init(&r, k_broken_text, "broken.sched");
  r.o.per_entry = false;
  assert_int_equal(run_verify(&r), SLAPO_VERIFY);
  assert_int_equal(r.first_bad, 5);
  assert_int_equal(r.k.n, 1);
  assert_non_null(strstr(slapo_last_error(), "broken.sched:5"));
  assert_non_null(strstr(slapo_last_error(), "tolerance"));
  run_deinit(&r);
}

/* autocast: the whole tiny GPT-2 in bf16, then its FlashAttention and
 * checkpointed blocks: each prefix within the f32 tolerance of its own
 * emulation and of the structure's f32 run, within bf16's bound of f32. */
static void test_bf16_schedule_passes(void **state) {
  (void)state;
  run r;
  run_init(&r, ". autocast dtype=bf16\n"
               "transformer.h.*.attn replace FlashAttention\n"
               "transformer.h checkpoint ratio=0.5\n"
               "lm_head autocast dtype=f32\n",
           "bf16.sched");
  OK(run_verify(&r));
  assert_int_equal(r.first_bad, 0);
  assert_int_equal(r.k.n, 5); /* the glob is two steps */
  for (size_t i = 0; i < 5; i++) {
    assert_true(r.k.c[i].ok);
    assert_false(r.k.c[i].bitwise);
    assert_true(r.k.c[i].worst > 0 && r.k.c[i].worst <= 1.0);
  }
  run_deinit(&r);
}

/* A bf16 GEMM that drops its bias: its f32 structure is right, so only the
 * comparison with the emulated rounding catches it, at its step. */
static void test_broken_bf16_linear_found(void **state) {
  (void)state;
  run r;
  run_init(&r, ". autocast dtype=bf16\n"
               "transformer.h.0.mlp.c_fc replace BrokenBf16Linear\n",
           "bf16_broken.sched");
  assert_int_equal(run_verify(&r), SLAPO_VERIFY);
  assert_int_equal(r.first_bad, 2);
  assert_true(r.k.c[0].ok);
  assert_false(r.k.c[1].ok);
  assert_non_null(strstr(r.k.c[1].what, "bf16 vs its rounding emulated in f32"));
  assert_non_null(strstr(slapo_last_error(), "bf16_broken.sched:2"));
  run_deinit(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flash_attention_schedule_passes_per_entry),
      cmocka_unit_test(test_checkpoint_schedule_passes_bitwise),
      cmocka_unit_test(test_broken_step_found_per_entry),
      cmocka_unit_test(test_broken_step_found_by_bisect),
      cmocka_unit_test(test_disabling_the_broken_step_passes),
      cmocka_unit_test(test_final_only_reports_last_step),
      cmocka_unit_test(test_bf16_schedule_passes),
      cmocka_unit_test(test_broken_bf16_linear_found),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
