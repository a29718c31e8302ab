/* tests/models/test_llama_torch.c - LLaMA against PyTorch: a 2-layer,
 * 32-wide LLaMA (4 query heads over 2 kv heads, SwiGLU 64, rotary, RMSNorm,
 * untied head) with fixed weights and tokens; logits, loss, every parameter
 * gradient and the losses of 5 AdamW steps must match what
 * tools/gen_llama_fixture.py computed with Debian's python3-torch (weights
 * read through the Hugging Face importer). Then: save -> load round trip;
 * FlashAttention in every layer (grouped heads read in place) gives the
 * composite's loss and gradients with attention dropout on; KV-cache
 * decoding (rotary offset, repeated kv heads in the cache) gives the full
 * window's logits, with both attentions; the op forms of RMSNorm and SiLU.
 * Tolerances: both sides compute in f32 with different summation orders
 * (oneDNN's GEMM blocking, our RMSNorm and rotary in float vs PyTorch's),
 * so errors of a few 1e-6 of the tensor's scale are expected; we allow 1e-4
 * of the largest magnitude and 1e-4 relative on losses, far below what a
 * wrong formula gives (rotate-half pairs swapped, or kv heads grouped the
 * wrong way, move the logits by ~1e-1 relative). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/modelfix.h"
#include "common/torchfix.h"
#include "slapo/models.h"

static char g_path[4096];
static slapo_safetensors *g_fix;

/* The fixture's config (tools/gen_llama_fixture.py). */
static slapo_llama_config tiny_cfg(double attn_dropout) {
  return (slapo_llama_config){2, 4, 2, 32, 64, 16, 256, 1e-5, 10000.0, attn_dropout, false};
}

static int setup(void **state) {
  (void)state;
  return torchfix_open("llama_tiny_fixture.safetensors", g_path, sizeof g_path, &g_fix);
}

static int teardown(void **state) {
  (void)state;
  slapo_safetensors_free(g_fix);
  return 0;
}

static slapo_module *load_model(double attn_dropout) {
  slapo_llama_config c = tiny_cfg(attn_dropout);
  slapo_module *m;
  assert_int_equal(slapo_llama_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 0), SLAPO_OK);
  slapo_status s = slapo_llama_load(m, g_path);
  if (s != SLAPO_OK) fail_msg("load: %s", slapo_last_error());
  return m;
}

static modelfix fix_of(slapo_module *m) {
  return (modelfix){m, g_fix, 2, {"input_ids", "labels"}, NULL};
}

enum { N_PARAMS = 3 + 9 * 2 }; /* embed_tokens, norm, lm_head; 9 per layer */

static void test_logits_and_loss(void **state) {
  (void)state;
  slapo_module *m = load_model(0);
  modelfix c = fix_of(m);
  modelfix_logits_and_loss(&c, 1e-4);
  slapo_module_free(m);
}

static void test_gradients(void **state) {
  (void)state;
  slapo_module *m = load_model(0);
  modelfix c = fix_of(m);
  modelfix_gradients(&c, N_PARAMS, 1e-4);
  slapo_module_free(m);
}

static void test_adamw_losses(void **state) {
  (void)state;
  slapo_module *m = load_model(0);
  modelfix c = fix_of(m);
  modelfix_adamw(&c, 1e-4);
  slapo_module_free(m);
}

/* Contiguous copies of every parameter's value or gradient, by path. */
typedef struct params {
  int n;
  bool grads;
  char *paths[64];
  slapo_tensor *t[64];
} params;

static void take(slapo_parameter *p, const char *path, void *ud) {
  params *ps = ud;
  assert_true(ps->n < 64);
  ps->paths[ps->n] = slapo_strdup(path);
  assert_int_equal(slapo_tensor_contiguous(ps->grads ? p->grad : p->value, &ps->t[ps->n]),
                   SLAPO_OK);
  ps->n++;
}

static params snapshot(slapo_module *m, bool grads) {
  params ps;
  memset(&ps, 0, sizeof ps);
  ps.grads = grads;
  assert_int_equal(slapo_module_visit_params(m, take, &ps), SLAPO_OK);
  return ps;
}

static void params_free(params *ps) {
  for (int i = 0; i < ps->n; i++) slapo_free(ps->paths[i]), slapo_tensor_free(ps->t[i]);
}

/* Worst torchfix_rel_err over same-path tensors. */
static double worst_diff(const params *a, const params *b) {
  assert_int_equal(a->n, b->n);
  double worst = 0;
  for (int i = 0; i < a->n; i++) {
    assert_string_equal(a->paths[i], b->paths[i]);
    double e = torchfix_rel_err(a->t[i], b->t[i]);
    worst = e > worst ? e : worst;
  }
  return worst;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, cap, "%s/slapo_llama_%d_%s", dir ? dir : "/tmp", (int)getpid(), name);
}

/* Saved in the Hugging Face layout and loaded into a differently seeded
 * model: every value equal; a tied head is omitted from the file. */
static void test_save_load_round_trip(void **state) {
  (void)state;
  slapo_module *m = load_model(0), *m2;
  char path[512];
  tmp_path(path, sizeof path, "rt.safetensors");
  assert_int_equal(slapo_llama_save(m, path, 0, NULL, NULL), SLAPO_OK);
  slapo_llama_config c = tiny_cfg(0);
  assert_int_equal(slapo_llama_new(&c, &m2), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m2, 99), SLAPO_OK);
  assert_int_equal(slapo_llama_load(m2, path), SLAPO_OK);
  params a = snapshot(m, false), b = snapshot(m2, false);
  assert_int_equal(a.n, N_PARAMS);
  assert_true(worst_diff(&a, &b) == 0);
  params_free(&a), params_free(&b);
  slapo_module_free(m2);
  /* tied: lm_head is the embedding, not written */
  c.tie_embeddings = true;
  assert_int_equal(slapo_llama_new(&c, &m2), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m2, 3), SLAPO_OK);
  assert_int_equal(slapo_llama_save(m2, path, 0, NULL, NULL), SLAPO_OK);
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(path, &f), SLAPO_OK);
  assert_int_equal(slapo_safetensors_count(f), N_PARAMS - 1);
  slapo_safetensors_free(f);
  /* the untied fixture cannot load into the tied model */
  assert_int_equal(slapo_llama_load(m2, g_path), SLAPO_PRECOND);
  assert_non_null(strstr(slapo_last_error(), "lm_head.weight differs from model.embed_tokens.weight"));
  slapo_module_free(m2);
  slapo_module_free(m);
  remove(path);
}

/* One train step with attention dropout on -> loss; gradients in *gs. */
static float train_step(slapo_module *m, params *gs) {
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = torchfix_get(g_fix, "input_ids"), *labels = torchfix_get(g_fix, "labels");
  const slapo_tensor *in[2] = {idx, labels}, *out;
  slapo_kernel_env env = {.seed = 11, .step = 2, .training = true};
  slapo_module_zero_grad(m);
  assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, &out), SLAPO_OK);
  float loss = *(const float *)slapo_tensor_data(out);
  *gs = snapshot(m, true);
  slapo_tensor_free(idx), slapo_tensor_free(labels);
  slapo_runner_free(r);
  return loss;
}

static void apply_line(slapo_module *m, const char *line) {
  assert_int_equal(slapo_models_init(), SLAPO_OK);
  slapo_sched *root;
  slapo_sched_log *log;
  assert_int_equal(slapo_sched_create(m, &root), SLAPO_OK);
  assert_int_equal(slapo_sched_parse(line, "test", &log), SLAPO_OK);
  if (slapo_apply_schedule(root, log, NULL, 0, 0, NULL) != SLAPO_OK)
    fail_msg("%s: %s", line, slapo_last_error());
  slapo_sched_log_free(log);
  slapo_sched_free(root);
}

static void test_flash_attention_same_loss_and_grads(void **state) {
  (void)state;
  slapo_module *m = load_model(0.3);
  params before, after;
  float loss0 = train_step(m, &before);
  apply_line(m, "model.layers.*.self_attn replace FlashAttention\n");
  slapo_module *attn;
  assert_int_equal(slapo_module_at(m, "model.layers.1.self_attn", &attn), SLAPO_OK);
  assert_string_equal(attn->type->name, "LlamaFlashAttention");
  float loss1 = train_step(m, &after);
  double worst = worst_diff(&after, &before);
  print_message("train loss (attention dropout 0.3): composite %.7f, FlashAttention %.7f; "
                "gradients worst %.2e\n", loss0, loss1, worst);
  assert_true(fabs(loss0 - loss1) <= 1e-5 * fabs(loss0));
  assert_true(worst <= 1e-5);
  slapo_tensor *want = torchfix_get(g_fix, "loss");
  assert_true(fabs(loss0 - *(const float *)slapo_tensor_data(want)) > 1e-3); /* dropout acts */
  slapo_tensor_free(want);
  params_free(&before), params_free(&after);
  slapo_module_free(m);
}

static slapo_tensor *ids(int n, const int32_t *v) {
  int64_t sh[2] = {1, n};
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &t), SLAPO_OK);
  memcpy(slapo_tensor_data(t), v, (size_t)n * sizeof *v);
  return t;
}

/* A prompt of 5 then one decoded token against the 6-token window. */
static void check_decode(slapo_module *m) {
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_kv_cache *kv;
  assert_int_equal(slapo_kv_cache_new(&kv), SLAPO_OK);
  const int32_t tok[6] = {72, 101, 108, 108, 111, 33};
  slapo_tensor *p5 = ids(5, tok), *p1 = ids(1, tok + 5), *w6 = ids(6, tok);
  slapo_kernel_env env = {1, 0, false};
  const slapo_tensor *lg, *full, *in[1] = {w6};
  assert_int_equal(slapo_step_decode(r, kv, p5, &env, &lg), SLAPO_OK);
  assert_int_equal(slapo_step_decode(r, kv, p1, &env, &lg), SLAPO_OK);
  int V = (int)lg->shape[2];
  float *dec = malloc((size_t)V * sizeof *dec);
  memcpy(dec, slapo_tensor_data(lg), (size_t)V * sizeof *dec);
  assert_int_equal(slapo_step(r, 1, in, SLAPO_STEP_EVAL, &env, &full), SLAPO_OK);
  const float *ref = (const float *)slapo_tensor_data(full) + 5 * V;
  for (int v = 0; v < V; v++)
    if (fabsf(dec[v] - ref[v]) > 1e-4f * (1 + fabsf(ref[v])))
      fail_msg("logit %d: %g decoded, %g from the window", v, (double)dec[v], (double)ref[v]);
  free(dec);
  slapo_tensor_free(p5), slapo_tensor_free(p1), slapo_tensor_free(w6);
  slapo_kv_cache_free(kv);
  slapo_runner_free(r);
}

static void test_decode_matches_window(void **state) {
  (void)state;
  slapo_module *m = load_model(0);
  check_decode(m);
  apply_line(m, "model.layers.*.self_attn replace FlashAttention\n");
  check_decode(m);
  slapo_module_free(m);
}

/* Pattern matching sees RMSNorm as rms_norm(x, weight) and SiLU as silu. */
static void test_op_forms(void **state) {
  (void)state;
  slapo_module *m = load_model(0), *norm, *act;
  assert_int_equal(slapo_module_at(m, "model.norm", &norm), SLAPO_OK);
  assert_int_equal(slapo_module_at(m, "model.layers.0.mlp.act_fn", &act), SLAPO_OK);
  slapo_op_form f;
  assert_true(norm->type->op_form(norm, &f));
  assert_ptr_equal(f.op, SLAPO_OP_DESC(rms_norm));
  assert_int_equal(f.n_inputs, 2);
  assert_true(act->type->op_form(act, &f));
  assert_ptr_equal(f.op, SLAPO_OP_DESC(silu));
  slapo_module_free(m);
}

static void test_config_errors(void **state) {
  (void)state;
  slapo_llama_config c = tiny_cfg(0);
  slapo_module *m;
  c.n_kv_head = 3;
  assert_int_equal(slapo_llama_new(&c, &m), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "num_attention_heads 4 is not divisible by "
                                             "num_key_value_heads 3"));
  c = tiny_cfg(0), c.hidden = 36; /* 4 heads of 9: odd */
  assert_int_equal(slapo_llama_new(&c, &m), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "heads of an even size"));
  assert_int_equal(slapo_llama_config_named("13B", &c), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "known: tiny, small, 1.1B, 7B"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logits_and_loss),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test(test_adamw_losses),
      cmocka_unit_test(test_save_load_round_trip),
      cmocka_unit_test(test_flash_attention_same_loss_and_grads),
      cmocka_unit_test(test_decode_matches_window),
      cmocka_unit_test(test_op_forms),
      cmocka_unit_test(test_config_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
