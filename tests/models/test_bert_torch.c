/* tests/models/test_bert_torch.c - BERT against PyTorch (llm.c style): a
 * 2-layer, 32-wide BertForMaskedLM with fixed weights, tokens, masked-LM
 * labels and a padding mask (one row partly padded, one fully padded);
 * logits with and without the mask, the loss, every parameter gradient and
 * the losses of 5 AdamW steps must match what tools/gen_bert_fixture.py
 * computed with Debian's python3-torch. Also: Hugging Face checkpoint
 * import (the fixture's weights are in HF's layout, tied decoder included;
 * BertModel names and LayerNorm gamma/beta),
 * save -> load round trip, the refusals of the loader, and the parameter
 * count of bert-base-uncased counted by torch.
 * Tolerances: both sides compute in f32 with different summation orders
 * (oneDNN's GEMM blocking and slapo's 16-lane softmax/LayerNorm sums
 * against PyTorch's), so element errors of a few 1e-6 of the tensor's
 * scale are expected; we allow 1e-4 of the largest magnitude (logits,
 * gradients) and 1e-4 relative on losses, as the GPT-2 test does. A wrong
 * formula is far outside that: a mask bias of -10000 instead of -FLT_MAX
 * changes the fully padded row's logits by ~1e-1 of the scale, tanh GELU
 * instead of erf ~1e-3, a dropped token-type row ~1e-1. */
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

#include "common/torchfix.h"
#include "slapo/train.h"

static char g_path[4096];
static slapo_safetensors *g_fix;

static slapo_bert_config tiny_cfg(void) {
  return (slapo_bert_config){2, 2, 32, 128, 16, SLAPO_BERT_BYTE_VOCAB, 2, 0.0, 0.0, 1e-12,
                             SLAPO_BERT_BYTE_PAD, SLAPO_BERT_BYTE_MASK};
}

static slapo_tensor *fixture(const char *name) { return torchfix_get(g_fix, name); }

static int setup(void **state) {
  (void)state;
  return torchfix_open("bert_tiny_fixture.safetensors", g_path, sizeof g_path, &g_fix);
}

static int teardown(void **state) {
  (void)state;
  slapo_safetensors_free(g_fix);
  return 0;
}

static slapo_module *new_model(uint64_t seed) {
  slapo_bert_config c = tiny_cfg();
  slapo_module *m;
  assert_int_equal(slapo_bert_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, seed), SLAPO_OK);
  return m;
}

static slapo_module *load_model(void) {
  slapo_module *m = new_model(0);
  slapo_status s = slapo_bert_load(m, g_path);
  if (s != SLAPO_OK) fail_msg("load: %s", slapo_last_error());
  return m;
}

static bool all_finite(const slapo_tensor *t) {
  const float *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++)
    if (!isfinite(p[i])) return false;
  return true;
}

static void test_logits_and_loss(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *mask = fixture("attention_mask");
  slapo_tensor *want_logits = fixture("logits"), *want_nomask = fixture("logits_nomask");
  slapo_tensor *want_loss = fixture("loss");
  const slapo_tensor *out;
  /* (ids) -> logits without a mask. */
  const slapo_tensor *in1[1] = {idx};
  slapo_status s = slapo_step(r, 1, in1, SLAPO_STEP_EVAL, NULL, &out);
  if (s != SLAPO_OK) fail_msg("eval: %s", slapo_last_error());
  double e = torchfix_rel_err(out, want_nomask);
  print_message("logits without mask: max error %.3g of max |logit|\n", e);
  assert_true(e < 1e-4);
  /* (ids, mask) -> logits; the fully padded row is uniform attention, so
   * finite. */
  const slapo_tensor *in2[2] = {idx, mask};
  s = slapo_step(r, 2, in2, SLAPO_STEP_EVAL, NULL, &out);
  if (s != SLAPO_OK) fail_msg("eval with mask: %s", slapo_last_error());
  assert_true(all_finite(out));
  e = torchfix_rel_err(out, want_logits);
  print_message("logits with mask: max error %.3g of max |logit|\n", e);
  assert_true(e < 1e-4);
  /* (ids, labels, mask) -> loss over the labelled positions. */
  const slapo_tensor *in3[3] = {idx, labels, mask};
  s = slapo_step(r, 3, in3, SLAPO_STEP_TRAIN, NULL, &out);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  float loss = *(const float *)slapo_tensor_data(out);
  float want = *(const float *)slapo_tensor_data(want_loss);
  print_message("loss: %.7f vs torch %.7f\n", loss, want);
  assert_true(fabs(loss - want) <= 1e-4 * fabs(want));
  slapo_tensor_free(idx), slapo_tensor_free(labels), slapo_tensor_free(mask);
  slapo_tensor_free(want_logits), slapo_tensor_free(want_nomask), slapo_tensor_free(want_loss);
  slapo_runner_free(r);
  slapo_module_free(m);
}

typedef struct grad_check {
  int n;
  double worst;
  char worst_path[256];
} grad_check;

/* Largest |x| of an f32 tensor. */
static double max_abs(const slapo_tensor *t) {
  const float *p = slapo_tensor_data(t);
  double m = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) m = fmax(m, fabs(p[i]));
  return m;
}

/* The error of a gradient relative to its scale, with a floor: the key
 * biases' gradients are exactly zero in exact arithmetic (adding q.b_k to
 * every score of a query row leaves its softmax unchanged), so both sides
 * hold rounding noise of ~1e-9 there, and relative to that noise any two
 * computations differ by O(1). The floor 1e-2 (the gradients here are
 * O(1e-1..1)) keeps the 1e-4 bound meaningful everywhere else. */
static void check_grad(slapo_parameter *p, const char *path, void *ud) {
  grad_check *g = ud;
  char name[512];
  snprintf(name, sizeof name, "grad.%s", path);
  slapo_tensor *want = fixture(name);
  double scale = max_abs(want);
  double e = torchfix_rel_err(p->grad, want) * scale / fmax(scale, 1e-2);
  if (e > g->worst) g->worst = e, snprintf(g->worst_path, sizeof g->worst_path, "%s", path);
  if (strstr(path, "key.bias")) assert_true(scale < 1e-6 && max_abs(p->grad) < 1e-6);
  g->n++;
  slapo_tensor_free(want);
}

static void test_gradients(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *mask = fixture("attention_mask");
  const slapo_tensor *in[3] = {idx, labels, mask};
  slapo_module_zero_grad(m);
  slapo_status s = slapo_step(r, 3, in, SLAPO_STEP_TRAIN, NULL, NULL);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  grad_check g = {0};
  assert_int_equal(slapo_module_visit_params(m, check_grad, &g), SLAPO_OK);
  print_message("%d gradients: worst %.3g (%s)\n", g.n, g.worst, g.worst_path);
  /* embeddings 3 + LayerNorm 2, 16 per layer, head: bias, dense 2, LayerNorm 2
   * (the decoder's weight and bias are tied, so counted once). */
  assert_int_equal(g.n, 5 + 16 * 2 + 5);
  assert_true(g.worst < 1e-4);
  slapo_tensor_free(idx), slapo_tensor_free(labels), slapo_tensor_free(mask);
  slapo_runner_free(r);
  slapo_module_free(m);
}

static void test_adamw_losses(void **state) {
  (void)state;
  slapo_module *m = load_model();
  slapo_runner *r;
  slapo_adamw *opt;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  assert_int_equal(slapo_adamw_new(m, &ac, &opt), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *mask = fixture("attention_mask"), *want = fixture("adamw_losses");
  const float *w = slapo_tensor_data(want);
  const slapo_tensor *in[3] = {idx, labels, mask}, *out;
  for (int step = 0; step <= 5; step++) {
    slapo_module_zero_grad(m);
    assert_int_equal(slapo_step(r, 3, in, SLAPO_STEP_TRAIN, NULL, &out), SLAPO_OK);
    float loss = *(const float *)slapo_tensor_data(out);
    if (step > 0) {
      print_message("adamw step %d: loss %.6f vs torch %.6f\n", step, loss, w[step - 1]);
      assert_true(fabs(loss - w[step - 1]) <= 1e-4 * fabs(w[step - 1]) + 1e-5);
    }
    slapo_clip_grad_norm(m, 1.0);
    slapo_adamw_step(opt, 1e-2f);
  }
  slapo_tensor_free(idx), slapo_tensor_free(labels), slapo_tensor_free(mask);
  slapo_tensor_free(want);
  slapo_adamw_free(opt);
  slapo_runner_free(r);
  slapo_module_free(m);
}

/* The registry's base config has bert-base-uncased's parameter count as
 * torch counts BertForMaskedLM without pooler (meta tensors: no memory). */
static void test_base_parameter_count(void **state) {
  (void)state;
  const char *want = slapo_safetensors_metadata(g_fix, "base_parameters");
  assert_non_null(want);
  const slapo_model_family *f;
  assert_int_equal(slapo_model_find("bert", &f), SLAPO_OK);
  assert_int_equal(f->objective, SLAPO_OBJECTIVE_MASKED_LM);
  slapo_module *m;
  assert_int_equal(f->create("base", NULL, &m), SLAPO_OK);
  print_message("base: %lld parameters, torch %s\n", (long long)slapo_module_numel(m), want);
  assert_int_equal(slapo_module_numel(m), strtoll(want, NULL, 10));
  assert_int_equal(slapo_module_numel(m), 109514298);
  slapo_module_free(m);
}

typedef struct compare_state {
  slapo_module *other;
  int n, differ;
} compare_state;

static void compare_param(slapo_parameter *p, const char *path, void *ud) {
  compare_state *c = ud;
  char *dot = strrchr(path, '.');
  slapo_module *owner;
  char mod[512];
  snprintf(mod, sizeof mod, "%.*s", (int)(dot - path), path);
  assert_int_equal(slapo_module_at(c->other, mod, &owner), SLAPO_OK);
  slapo_parameter *q = slapo_module_param(owner, dot + 1);
  assert_non_null(q);
  c->n++;
  if (memcmp(slapo_tensor_data(p->value), slapo_tensor_data(q->value),
             (size_t)slapo_tensor_numel(p->value) * sizeof(float)))
    c->differ++;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, cap, "%s/slapo_bert_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
}

/* save -> load gives the same bytes; the file holds HF's names without the
 * tied decoder, and the family's save/load are these functions. */
static void test_save_load_round_trip(void **state) {
  (void)state;
  slapo_module *a = load_model(), *b = new_model(7);
  char path[4200];
  tmp_path(path, sizeof path, "rt.safetensors");
  const char *k[1] = {"note"}, *v[1] = {"round trip"};
  assert_int_equal(slapo_bert_save(a, path, 1, k, v), SLAPO_OK);
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(path, &f), SLAPO_OK);
  slapo_tensor *t = NULL;
  assert_int_equal(slapo_safetensors_get(f, "cls.predictions.bias", &t), SLAPO_OK);
  slapo_tensor_free(t);
  assert_int_equal(slapo_safetensors_meta(f, "cls.predictions.decoder.weight", &t),
                   SLAPO_NOT_FOUND);
  assert_string_equal(slapo_safetensors_metadata(f, "note"), "round trip");
  assert_string_equal(slapo_safetensors_metadata(f, "format"), "pt");
  assert_int_equal(slapo_safetensors_count(f), 5 + 16 * 2 + 5);
  slapo_safetensors_free(f);
  const slapo_model_family *fam;
  assert_int_equal(slapo_model_find("bert", &fam), SLAPO_OK);
  assert_int_equal(fam->load(b, path), SLAPO_OK);
  compare_state c = {b, 0, 0};
  assert_int_equal(slapo_module_visit_params(a, compare_param, &c), SLAPO_OK);
  assert_int_equal(c.n, 5 + 16 * 2 + 5);
  assert_int_equal(c.differ, 0);
  /* Tying survives loading: the decoder reads the word embeddings. */
  slapo_module *dec, *wte;
  assert_int_equal(slapo_module_at(b, "cls.predictions.decoder", &dec), SLAPO_OK);
  assert_int_equal(slapo_module_at(b, "bert.embeddings.word_embeddings", &wte), SLAPO_OK);
  assert_ptr_equal(slapo_module_param(dec, "weight"), slapo_module_param(wte, "weight"));
  unlink(path);
  slapo_module_free(a);
  slapo_module_free(b);
}

/* A file whose decoder weight is not the word embeddings cannot be loaded
 * into the tied model: refused before anything is copied. */
static void test_load_untied_decoder(void **state) {
  (void)state;
  int n = slapo_safetensors_count(g_fix), k = 0;
  const char **names = calloc((size_t)n, sizeof *names);
  slapo_tensor **ts = calloc((size_t)n, sizeof *ts);
  for (int i = 0; i < n; i++) {
    const char *name = slapo_safetensors_name(g_fix, i);
    if (!strncmp(name, "grad.", 5)) continue;
    names[k] = name;
    ts[k] = fixture(name);
    if (!strcmp(name, "cls.predictions.decoder.weight")) ((float *)slapo_tensor_data(ts[k]))[5] += 0.5f;
    k++;
  }
  char path[4200];
  tmp_path(path, sizeof path, "untied.safetensors");
  assert_int_equal(slapo_safetensors_write(path, k, names, (const slapo_tensor *const *)ts, 0,
                                           NULL, NULL), SLAPO_OK);
  slapo_module *m = new_model(3);
  slapo_parameter *p = slapo_module_param(m->children[0]->children[0]->children[0], "weight");
  float before = ((const float *)slapo_tensor_data(p->value))[0];
  assert_int_equal(slapo_bert_load(m, path), SLAPO_PRECOND);
  print_message("%s\n", slapo_last_error());
  assert_non_null(strstr(slapo_last_error(), "cls.predictions.decoder.weight differs from "
                                             "bert.embeddings.word_embeddings.weight"));
  assert_true(((const float *)slapo_tensor_data(p->value))[0] == before);
  unlink(path);
  for (int i = 0; i < k; i++) slapo_tensor_free(ts[i]);
  free(names);
  free(ts);
  slapo_module_free(m);
}

/* Files in older or other layouts load to the same weights: BertModel's
 * names (no "bert."), LayerNorm gamma/beta (files converted from the
 * TensorFlow release), and a pooler the model does not have (ignored). */
static void test_load_legacy_names(void **state) {
  (void)state;
  int n = slapo_safetensors_count(g_fix), k = 0;
  char (*names)[256] = calloc((size_t)n + 1, sizeof *names);
  const char **np = calloc((size_t)n + 1, sizeof *np);
  slapo_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
  for (int i = 0; i < n; i++) {
    const char *name = slapo_safetensors_name(g_fix, i);
    if (strncmp(name, "bert.", 5) && strncmp(name, "cls.", 4)) continue;
    const char *base = strncmp(name, "bert.", 5) ? name : name + 5;
    size_t len = strlen(base);
    if (len > 16 && !strcmp(base + len - 16, "LayerNorm.weight"))
      snprintf(names[k], 256, "%.*sLayerNorm.gamma", (int)(len - 16), base);
    else if (len > 14 && !strcmp(base + len - 14, "LayerNorm.bias"))
      snprintf(names[k], 256, "%.*sLayerNorm.beta", (int)(len - 14), base);
    else
      snprintf(names[k], 256, "%s", base);
    np[k] = names[k];
    ts[k++] = fixture(name);
  }
  snprintf(names[k], 256, "pooler.dense.weight");
  np[k] = names[k];
  ts[k++] = fixture("bert.encoder.layer.0.attention.self.query.weight");
  char path[4200];
  tmp_path(path, sizeof path, "legacy.safetensors");
  assert_int_equal(slapo_safetensors_write(path, k, np, (const slapo_tensor *const *)ts, 0, NULL,
                                           NULL), SLAPO_OK);
  slapo_module *want = load_model(), *got = new_model(5);
  slapo_status s = slapo_bert_load(got, path);
  if (s != SLAPO_OK) fail_msg("legacy load: %s", slapo_last_error());
  compare_state c = {got, 0, 0};
  assert_int_equal(slapo_module_visit_params(want, compare_param, &c), SLAPO_OK);
  assert_int_equal(c.n, 5 + 16 * 2 + 5);
  assert_int_equal(c.differ, 0);
  unlink(path);
  for (int i = 0; i < k; i++) slapo_tensor_free(ts[i]);
  free(names), free(np), free(ts);
  slapo_module_free(want);
  slapo_module_free(got);
}

/* A GPT-2 file is not a BERT checkpoint: the first missing tensor is named. */
static void test_load_missing_tensor(void **state) {
  (void)state;
  char path[4096];
  const char *dir = getenv("SLAPO_TEST_DATA");
  snprintf(path, sizeof path, "%s/gpt2_tiny_fixture.safetensors", dir ? dir : "tests/data");
  slapo_module *m = new_model(1);
  assert_int_equal(slapo_bert_load(m, path), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "no tensor 'bert.embeddings.word_embeddings.weight'"));
  slapo_module_free(m);
}

/* Wrong inputs are a status naming the expected signature, not an abort;
 * so is decoding, which a bidirectional model cannot do. */
static void test_bad_inputs(void **state) {
  (void)state;
  slapo_module *m = new_model(1);
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *mask = fixture("attention_mask");
  const slapo_tensor *in[3] = {idx, mask, mask};
  assert_int_equal(slapo_step(r, 3, in, SLAPO_STEP_EVAL, NULL, NULL), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "attention_mask [B, T] f32"));
  /* Generation needs a causal LM: a KV-cache step is refused, named. */
  slapo_kv_cache *kv;
  const slapo_tensor *lg;
  assert_int_equal(slapo_kv_cache_new(&kv), SLAPO_OK);
  assert_int_equal(slapo_step_decode(r, kv, idx, NULL, &lg), SLAPO_UNSUPPORTED);
  assert_non_null(strstr(slapo_last_error(), "cannot decode with a KV cache"));
  slapo_kv_cache_free(kv);
  slapo_tensor_free(idx), slapo_tensor_free(mask);
  slapo_runner_free(r);
  slapo_module_free(m);
}

/* Runs (ids, labels, mask) in TRAIN and (ids, mask) in EVAL; copies of
 * the loss, the logits and every gradient into out (owned). */
typedef struct run_out {
  float loss;
  slapo_tensor *logits;
  int n;
  slapo_tensor *grads[64];
} run_out;

static void collect_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  run_out *o = ud;
  assert_true(o->n < 64);
  assert_int_equal(slapo_tensor_contiguous(p->grad, &o->grads[o->n++]), SLAPO_OK);
}

static void run_env(slapo_module *m, const slapo_kernel_env *env, run_out *o) {
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_tensor *idx = fixture("input_ids"), *labels = fixture("labels");
  slapo_tensor *mask = fixture("attention_mask");
  const slapo_tensor *in3[3] = {idx, labels, mask}, *in2[2] = {idx, mask}, *out;
  slapo_module_zero_grad(m);
  slapo_status s = slapo_step(r, 3, in3, SLAPO_STEP_TRAIN, env, &out);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  o->loss = *(const float *)slapo_tensor_data(out);
  assert_int_equal(slapo_step(r, 2, in2, SLAPO_STEP_EVAL, NULL, &out), SLAPO_OK);
  assert_int_equal(slapo_tensor_contiguous(out, &o->logits), SLAPO_OK);
  o->n = 0;
  assert_int_equal(slapo_module_visit_params(m, collect_grad, o), SLAPO_OK);
  slapo_tensor_free(idx), slapo_tensor_free(labels), slapo_tensor_free(mask);
  slapo_runner_free(r);
}

static void run_all(slapo_module *m, run_out *o) { run_env(m, NULL, o); }

static void run_out_free(run_out *o) {
  slapo_tensor_free(o->logits);
  for (int i = 0; i < o->n; i++) slapo_tensor_free(o->grads[i]);
}

static bool same_bytes(const slapo_tensor *a, const slapo_tensor *b) {
  return slapo_tensor_numel(a) == slapo_tensor_numel(b) &&
         !memcmp(slapo_tensor_data(a), slapo_tensor_data(b),
                 (size_t)slapo_tensor_numel(a) * sizeof(float));
}

/* `trace` works on BERT (example inputs set on the root): the
 * self-attention traced on its own (then re-traced at the masked call's
 * two inputs) and the whole model flattened compute the same bytes. */
static void test_trace(void **state) {
  (void)state;
  slapo_module *m = load_model();
  run_out want, got;
  run_all(m, &want);
  slapo_module *att;
  assert_int_equal(slapo_module_at(m, "bert.encoder.layer.0.attention.self", &att), SLAPO_OK);
  slapo_status s = slapo_module_trace(att, NULL);
  if (s != SLAPO_OK) fail_msg("trace self-attention: %s", slapo_last_error());
  assert_non_null(slapo_module_graph(att));
  slapo_module *l1;
  assert_int_equal(slapo_module_at(m, "bert.encoder.layer.1", &l1), SLAPO_OK);
  s = slapo_module_trace(l1, &(slapo_trace_opts){.flatten = true});
  if (s != SLAPO_OK) fail_msg("trace layer 1: %s", slapo_last_error());
  run_all(m, &got);
  assert_true(got.loss == want.loss);
  assert_true(same_bytes(got.logits, want.logits));
  assert_int_equal(got.n, want.n);
  for (int i = 0; i < got.n; i++) assert_true(same_bytes(got.grads[i], want.grads[i]));
  run_out_free(&want);
  run_out_free(&got);
  slapo_module_free(m);
}

/* FlashAttention in every layer, its padding mask the op's additive key
 * mask, with attention dropout 0.3 in training: the composite's loss,
 * logits (eval, masked) and gradients to rounding. */
static void test_flash_attention_with_mask(void **state) {
  (void)state;
  slapo_bert_config c = tiny_cfg();
  c.attn_dropout = 0.3;
  slapo_module *m;
  assert_int_equal(slapo_bert_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 0), SLAPO_OK);
  assert_int_equal(slapo_bert_load(m, g_path), SLAPO_OK);
  slapo_kernel_env env = {.seed = 5, .step = 1, .training = true};
  run_out want, got;
  run_env(m, &env, &want);
  assert_int_equal(slapo_models_init(), SLAPO_OK);
  slapo_sched *root;
  slapo_sched_log *log;
  assert_int_equal(slapo_sched_create(m, &root), SLAPO_OK);
  assert_int_equal(slapo_sched_parse("bert.encoder.layer.*.attention.self replace FlashAttention\n",
                                     "t", &log), SLAPO_OK);
  assert_int_equal(slapo_apply_schedule(root, log, NULL, 0, 0, NULL), SLAPO_OK);
  slapo_module *att;
  assert_int_equal(slapo_module_at(m, "bert.encoder.layer.1.attention.self", &att), SLAPO_OK);
  assert_string_equal(att->type->name, "BertFlashAttention");
  run_env(m, &env, &got);
  /* Errors relative to the largest gradient of all: the key biases'
   * gradients are 0 in exact arithmetic (softmax ignores a per-row
   * constant), so both sides hold rounding noise there. */
  double worst = torchfix_rel_err(got.logits, want.logits), scale = 0;
  assert_int_equal(got.n, want.n);
  for (int i = 0; i < want.n; i++) scale = fmax(scale, max_abs(want.grads[i]));
  for (int i = 0; i < got.n; i++) {
    const float *a = slapo_tensor_data(got.grads[i]), *b = slapo_tensor_data(want.grads[i]);
    for (int64_t j = 0; j < slapo_tensor_numel(got.grads[i]); j++)
      worst = fmax(worst, fabs((double)a[j] - b[j]) / scale);
  }
  print_message("FlashAttention with the padding mask, dropout 0.3: loss %.7f vs %.7f, worst "
                "logit/gradient error %.2e\n", got.loss, want.loss, worst);
  assert_true(fabs(got.loss - want.loss) <= 1e-5 * fabs(want.loss));
  assert_true(worst <= 1e-5);
  slapo_sched_log_free(log);
  slapo_sched_free(root);
  run_out_free(&want);
  run_out_free(&got);
  slapo_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logits_and_loss),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test(test_adamw_losses),
      cmocka_unit_test(test_base_parameter_count),
      cmocka_unit_test(test_save_load_round_trip),
      cmocka_unit_test(test_load_untied_decoder),
      cmocka_unit_test(test_load_legacy_names),
      cmocka_unit_test(test_load_missing_tensor),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_trace),
      cmocka_unit_test(test_flash_attention_with_mask),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
