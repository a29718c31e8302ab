/* tests/unit/test_train_resume.c - the training loop end to end on a small
 * repeated-English corpus with the "tiny" GPT-2: a run resumed from a
 * mid-run checkpoint reproduces the uninterrupted run byte for byte
 * (losses, metrics lines, final weights and optimizer state); checkpoints
 * are Hugging Face safetensors (Conv1D [in, out], no lm_head); checkpoint
 * import errors (missing tensor, wrong shape, malformed file); and the
 * validation loss falls with training. */
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

#include "common/expect.h"
#include "common/stfiles.h"
#include "slapo/train.h"

static char g_dir[256];
static char g_corpus[512];

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Reads the whole of a small text file into a NUL-terminated buffer. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *buf = calloc(1, 1 << 16);
  assert_non_null(buf);
  size_t n = fread(buf, 1, (1 << 16) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Records what the loop reports. */
typedef struct record {
  int n;
  double loss[64], lr[64], grad_norm[64], val_loss[64];
  bool has_val[64];
  int64_t step[64];
  /* Copies the checkpoint files when step `copy_at` is reported. */
  int64_t copy_at;
  const char *save, *copy_to;
} record;

static void optim_sibling(const char *model, char *out, size_t cap) {
  size_t n = strlen(model) - strlen(".safetensors");
  snprintf(out, cap, "%.*s.optim.safetensors", (int)n, model);
}

static void on_event(const slapo_train_event *e, void *ud) {
  record *r = ud;
  if (e->message || e->sample) return;
  assert_true(r->n < 64);
  r->step[r->n] = e->step;
  r->loss[r->n] = e->loss;
  r->lr[r->n] = e->lr;
  r->grad_norm[r->n] = e->grad_norm;
  r->has_val[r->n] = e->has_val;
  r->val_loss[r->n] = e->val_loss;
  r->n++;
  if (r->copy_to && e->step == r->copy_at) {
    char a[600], b[600];
    copy_file_or_fail(r->save, r->copy_to);
    optim_sibling(r->save, a, sizeof a);
    optim_sibling(r->copy_to, b, sizeof b);
    copy_file_or_fail(a, b);
  }
}

static slapo_train_config base_config(void) {
  slapo_train_config c;
  slapo_train_config_default(&c);
  c.model_config = "tiny";
  c.data = g_corpus;
  c.steps = 6;
  c.batch = 2;
  c.seq = 16;
  c.warmup = 2; /* the cosine part depends on the total step count */
  c.lr = 3e-3f;
  c.val_every = 2;
  c.val_batches = 1;
  c.sample_tokens = 0;
  /* One thread: on the 2-core test machine, with other tests running,
   * OpenMP's spinning workers slow these small steps tenfold. Resume is
   * bitwise exact at any fixed thread count. */
  c.threads = 1;
  return c;
}

static void train_ok(const slapo_train_config *c, record *r) {
  slapo_status s = slapo_train(c, on_event, r);
  if (s != SLAPO_OK) fail_msg("train: %s: %s", slapo_status_name(s), slapo_last_error());
}

/* The value of "key": in a JSON line, as the text the loop wrote. */
static void json_field(const char *line, const char *key, char *out, size_t cap) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(line, k);
  if (!p) fail_msg("no %s in '%s'", key, line);
  p += strlen(k);
  size_t n = strcspn(p, ",}");
  snprintf(out, cap, "%.*s", (int)n, p);
}

/* Line `i` (0-based) of a text buffer, into out. */
static void nth_line(const char *text, int i, char *out, size_t cap) {
  const char *p = text;
  for (int k = 0; k < i; k++) {
    p = strchr(p, '\n');
    if (!p) fail_msg("fewer than %d lines", i + 1);
    p++;
  }
  size_t n = strcspn(p, "\n");
  snprintf(out, cap, "%.*s", (int)n, p);
}

static int count_lines(const char *text) {
  int n = 0;
  for (const char *p = text; *p; p++) n += *p == '\n';
  return n;
}

/* With bf16: --precision bf16 (GEMMs with bf16 operands, widened to f32
 * where the CPU has no bf16 units) and AdamW state in bf16 with stochastic
 * rounding; the checkpoint still holds f32 weights in the Hugging Face
 * layout and the resumed run is still bit-identical. */
static void resume_exact(bool bf16) {
  char save_a[512], ckpt3[512], metrics_a[512], save_b[512], metrics_b[512];
  tmp_path(save_a, sizeof save_a, "a.safetensors");
  tmp_path(ckpt3, sizeof ckpt3, "a_step3.safetensors");
  tmp_path(metrics_a, sizeof metrics_a, "a.jsonl");
  tmp_path(save_b, sizeof save_b, "b.safetensors");
  tmp_path(metrics_b, sizeof metrics_b, "b.jsonl");
  /* A fresh start (the other precision's run used these names). */
  const char *fresh[] = {save_a, ckpt3, metrics_a, save_b, metrics_b};
  for (size_t i = 0; i < sizeof fresh / sizeof fresh[0]; i++) {
    char o[600];
    optim_sibling(fresh[i], o, sizeof o);
    unlink(fresh[i]), unlink(o);
  }

  /* Run A: 6 steps, checkpoints at 3 (copied aside) and 6. */
  slapo_train_config a = base_config();
  if (bf16) a.precision = "bf16", a.optimizer_state_bf16 = true;
  a.save = save_a;
  a.save_every = 3;
  a.metrics = metrics_a;
  record ra = {.copy_at = 3, .save = save_a, .copy_to = ckpt3};
  train_ok(&a, &ra);
  assert_int_equal(ra.n, 6);

  /* Run B: resume from step 3 with the same total. */
  slapo_train_config b = base_config();
  if (bf16) b.precision = "bf16", b.optimizer_state_bf16 = true;
  b.resume = ckpt3;
  b.save = save_b;
  b.metrics = metrics_b;
  record rb = {0};
  train_ok(&b, &rb);
  assert_int_equal(rb.n, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(rb.step[i], 4 + i);
    /* Exactly equal doubles, not approximately. */
    if (memcmp(&rb.loss[i], &ra.loss[3 + i], sizeof(double)) ||
        memcmp(&rb.grad_norm[i], &ra.grad_norm[3 + i], sizeof(double)) ||
        rb.lr[i] != ra.lr[3 + i])
      fail_msg("step %d: resumed loss %.9g grad_norm %.9g lr %.9g vs %.9g %.9g %.9g", 4 + i,
               rb.loss[i], rb.grad_norm[i], rb.lr[i], ra.loss[3 + i], ra.grad_norm[3 + i],
               ra.lr[3 + i]);
    assert_int_equal(rb.has_val[i], ra.has_val[3 + i]);
    if (rb.has_val[i]) assert_memory_equal(&rb.val_loss[i], &ra.val_loss[3 + i], sizeof(double));
  }
  /* The metrics files: A has 6 lines, B 3, and B's loss, lr, grad_norm
   * and val_loss text equals A's for steps 4-6. */
  char *ta = slurp(metrics_a), *tb = slurp(metrics_b);
  assert_int_equal(count_lines(ta), 6);
  assert_int_equal(count_lines(tb), 3);
  for (int i = 0; i < 3; i++) {
    char la[512], lb[512], fa[64], fb[64];
    nth_line(ta, 3 + i, la, sizeof la);
    nth_line(tb, i, lb, sizeof lb);
    const char *keys[] = {"step", "loss", "lr", "grad_norm"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      json_field(la, keys[k], fa, sizeof fa);
      json_field(lb, keys[k], fb, sizeof fb);
      assert_string_equal(fa, fb);
    }
    assert_int_equal(strstr(la, "val_loss") != NULL, strstr(lb, "val_loss") != NULL);
    if (strstr(la, "val_loss")) {
      json_field(la, "val_loss", fa, sizeof fa);
      json_field(lb, "val_loss", fb, sizeof fb);
      assert_string_equal(fa, fb);
    }
  }
  free(ta), free(tb);
  /* Final weights and optimizer state are bitwise equal. */
  assert_safetensors_files_equal(save_a, save_b, NULL);
  char oa[600], ob[600];
  optim_sibling(save_a, oa, sizeof oa);
  optim_sibling(save_b, ob, sizeof ob);
  assert_safetensors_files_equal(oa, ob, NULL);

  /* The step-3 checkpoint: Hugging Face names and layout, metadata. */
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(ckpt3, &f), SLAPO_OK);
  assert_int_equal(slapo_safetensors_count(f), 4 + 12 * 4); /* tiny: 4 blocks */
  for (int i = 0; i < slapo_safetensors_count(f); i++)
    assert_int_equal(strncmp(slapo_safetensors_name(f, i), "transformer.", 12), 0);
  slapo_tensor *t;
  assert_int_equal(slapo_safetensors_meta(f, "transformer.h.0.attn.c_attn.weight", &t), SLAPO_OK);
  assert_int_equal(t->ndim, 2);
  assert_int_equal(t->dtype, SLAPO_DTYPE_F32); /* master weights, also from a bf16 run */
  assert_int_equal(t->shape[0], 128), assert_int_equal(t->shape[1], 384);
  slapo_tensor_free(t);
  assert_int_equal(slapo_safetensors_meta(f, "transformer.h.3.mlp.c_proj.weight", &t), SLAPO_OK);
  assert_int_equal(t->shape[0], 512), assert_int_equal(t->shape[1], 128);
  slapo_tensor_free(t);
  assert_int_equal(slapo_safetensors_meta(f, "lm_head.weight", &t), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_safetensors_metadata(f, "format"), "pt");
  assert_string_equal(slapo_safetensors_metadata(f, "slapo_step"), "3");
  assert_string_equal(slapo_safetensors_metadata(f, "slapo_config"), "tiny");
  slapo_safetensors_free(f);
  char o3[600];
  optim_sibling(ckpt3, o3, sizeof o3);
  assert_int_equal(slapo_safetensors_read(o3, &f), SLAPO_OK);
  assert_string_equal(slapo_safetensors_metadata(f, "step"), "3");
  assert_int_equal(slapo_safetensors_meta(f, "transformer.h.0.attn.c_attn.weight.exp_avg_sq", &t),
                   SLAPO_OK);
  assert_int_equal(t->dtype, bf16 ? SLAPO_DTYPE_BF16 : SLAPO_DTYPE_F32);
  slapo_tensor_free(t);
  slapo_safetensors_free(f);
}

static void test_resume_is_exact(void **state) {
  (void)state;
  resume_exact(false);
}

static void test_resume_is_exact_bf16(void **state) {
  (void)state;
  resume_exact(true);
}

/* ---- checkpoint import ---- */

static slapo_gpt2_config small_cfg(void) {
  return (slapo_gpt2_config){2, 4, 32, 16, 256, 0.0, 1e-5};
}

static slapo_module *new_model(uint64_t seed) {
  slapo_gpt2_config c = small_cfg();
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, seed), SLAPO_OK);
  return m;
}

static slapo_parameter *param_at(slapo_module *m, const char *mod, const char *name) {
  slapo_module *x;
  assert_int_equal(slapo_module_at(m, mod, &x), SLAPO_OK);
  return slapo_module_param(x, name);
}

/* Rewrites `from` into `to`: tensor `drop` left out, `replace` swapped for
 * `with` (may be NULL), names optionally without "transformer.", and an
 * extra tensor `extra` added when non-NULL. */
static void rewrite(const char *from, const char *to, const char *drop, const char *replace,
                    const slapo_tensor *with, bool strip_prefix, const char *extra) {
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(from, &f), SLAPO_OK);
  int n = slapo_safetensors_count(f), k = 0;
  const char *names[80];
  char owned[80][128];
  slapo_tensor *ts[80];
  for (int i = 0; i < n; i++) {
    const char *name = slapo_safetensors_name(f, i);
    if (drop && !strcmp(name, drop)) continue;
    assert_int_equal(slapo_safetensors_get(f, name, &ts[k]), SLAPO_OK);
    if (replace && !strcmp(name, replace)) {
      slapo_tensor_free(ts[k]);
      assert_int_equal(slapo_tensor_view(with, &ts[k]), SLAPO_OK);
    }
    snprintf(owned[k], sizeof owned[k], "%s",
             strip_prefix && !strncmp(name, "transformer.", 12) ? name + 12 : name);
    names[k] = owned[k];
    k++;
  }
  slapo_tensor *bias = NULL;
  if (extra) {
    int64_t shape[4] = {1, 1, 16, 16};
    assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 4, shape, &bias), SLAPO_OK);
    ts[k] = bias;
    names[k++] = extra;
  }
  assert_int_equal(slapo_safetensors_write(to, k, names, (const slapo_tensor *const *)ts, 0, NULL,
                                           NULL),
                   SLAPO_OK);
  for (int i = 0; i < k; i++) slapo_tensor_free(ts[i]);
  slapo_safetensors_free(f);
}

static void assert_same_params(slapo_module *a, slapo_module *b) {
  const char *mods[] = {"transformer.wte", "transformer.h.1.attn.c_attn",
                        "transformer.h.0.mlp.c_proj", "transformer.ln_f"};
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++)
    assert_true(slapo_tensor_equal(param_at(a, mods[i], "weight")->value,
                                   param_at(b, mods[i], "weight")->value));
}

static void test_checkpoint_round_trip(void **state) {
  (void)state;
  slapo_module *m = new_model(1), *m2 = new_model(2);
  char p[512], q[512];
  tmp_path(p, sizeof p, "rt.safetensors");
  tmp_path(q, sizeof q, "rt2.safetensors");
  assert_int_equal(slapo_gpt2_save(m, p, 0, NULL, NULL), SLAPO_OK);
  /* Conv1D weights are stored transposed: file[i][j] = model[j][i]. */
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(p, &f), SLAPO_OK);
  slapo_tensor *t;
  assert_int_equal(slapo_safetensors_get(f, "transformer.h.0.mlp.c_fc.weight", &t), SLAPO_OK);
  assert_int_equal(t->shape[0], 32), assert_int_equal(t->shape[1], 128);
  const slapo_tensor *w = param_at(m, "transformer.h.0.mlp.c_fc", "weight")->value; /* [128, 32] */
  for (int64_t i = 0; i < 32; i += 7)
    for (int64_t j = 0; j < 128; j += 13) {
      int64_t ij[2] = {i, j}, ji[2] = {j, i};
      assert_true(slapo_tensor_get(t, ij) == slapo_tensor_get(w, ji));
    }
  slapo_tensor_free(t);
  slapo_safetensors_free(f);
  assert_false(slapo_tensor_equal(param_at(m, "transformer.wte", "weight")->value,
                                  param_at(m2, "transformer.wte", "weight")->value));
  assert_int_equal(slapo_gpt2_load(m2, p), SLAPO_OK);
  assert_same_params(m, m2);
  /* GPT2Model-style names (no "transformer.") and the attention-mask
   * buffers Hugging Face files carry are accepted. */
  slapo_module *m3 = new_model(3);
  rewrite(p, q, NULL, NULL, NULL, true, "h.0.attn.bias");
  slapo_status s = slapo_gpt2_load(m3, q);
  if (s != SLAPO_OK) fail_msg("load without prefix: %s", slapo_last_error());
  assert_same_params(m, m3);
  slapo_module_free(m), slapo_module_free(m2), slapo_module_free(m3);
}

static void test_checkpoint_errors(void **state) {
  (void)state;
  slapo_module *m = new_model(1);
  char p[512], q[512];
  tmp_path(p, sizeof p, "err.safetensors");
  tmp_path(q, sizeof q, "err2.safetensors");
  assert_int_equal(slapo_gpt2_save(m, p, 0, NULL, NULL), SLAPO_OK);
  /* Missing tensor. */
  rewrite(p, q, "transformer.h.1.mlp.c_fc.bias", NULL, NULL, false, NULL);
  assert_int_equal(slapo_gpt2_load(m, q), SLAPO_NOT_FOUND);
  assert_last_error_has("transformer.h.1.mlp.c_fc.bias");
  assert_last_error_has(q);
  /* Wrong shape of a 1-D parameter. */
  int64_t s64[1] = {64};
  slapo_tensor *bad;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 1, s64, &bad), SLAPO_OK);
  rewrite(p, q, NULL, "transformer.ln_f.weight", bad, false, NULL);
  slapo_tensor_free(bad);
  assert_int_equal(slapo_gpt2_load(m, q), SLAPO_SHAPE);
  assert_last_error_has("transformer.ln_f.weight");
  assert_last_error_has("[64]");
  assert_last_error_has("[32]");
  /* A Conv1D weight in nn.Linear layout [out, in]. */
  int64_t lin[2] = {96, 32};
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, lin, &bad), SLAPO_OK);
  rewrite(p, q, NULL, "transformer.h.0.attn.c_attn.weight", bad, false, NULL);
  slapo_tensor_free(bad);
  assert_int_equal(slapo_gpt2_load(m, q), SLAPO_SHAPE);
  assert_last_error_has("transformer.h.0.attn.c_attn.weight");
  assert_last_error_has("[96, 32]");
  assert_last_error_has("[32, 96]");
  /* Malformed and missing files. */
  FILE *f = fopen(q, "wb");
  assert_non_null(f);
  fputs("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1", f);
  fclose(f);
  assert_int_equal(slapo_gpt2_load(m, q), SLAPO_IO);
  tmp_path(q, sizeof q, "does_not_exist.safetensors");
  assert_int_equal(slapo_gpt2_load(m, q), SLAPO_IO);
  assert_last_error_has(q);
  /* A model that is not materialized. */
  slapo_gpt2_config c = small_cfg();
  slapo_module *meta;
  assert_int_equal(slapo_gpt2_new(&c, &meta), SLAPO_OK);
  assert_int_equal(slapo_gpt2_load(meta, p), SLAPO_STATE);
  slapo_module_free(meta);
  slapo_module_free(m);
}

/* An untied lm_head.weight in a file for the tied model is refused, naming
 * both tensors and the largest difference, and nothing is loaded; a head
 * equal to wte (what a tied save_pretrained writes) is accepted. */
static void test_untied_head_refused(void **state) {
  (void)state;
  slapo_module *m = new_model(1), *m2 = new_model(2);
  char p[512], q[512];
  tmp_path(p, sizeof p, "tied.safetensors");
  tmp_path(q, sizeof q, "untied.safetensors");
  assert_int_equal(slapo_gpt2_save(m, p, 0, NULL, NULL), SLAPO_OK);
  slapo_tensor *head;
  assert_int_equal(slapo_tensor_contiguous(param_at(m, "transformer.wte", "weight")->value, &head),
                   SLAPO_OK);
  /* equal head: accepted */
  {
    slapo_safetensors *f;
    assert_int_equal(slapo_safetensors_read(p, &f), SLAPO_OK);
    int n = slapo_safetensors_count(f);
    const char *names[80];
    slapo_tensor *ts[80];
    for (int i = 0; i < n; i++) {
      names[i] = slapo_safetensors_name(f, i);
      assert_int_equal(slapo_safetensors_get(f, names[i], &ts[i]), SLAPO_OK);
    }
    names[n] = "lm_head.weight";
    ts[n] = head;
    assert_int_equal(slapo_safetensors_write(q, n + 1, names, (const slapo_tensor *const *)ts, 0,
                                             NULL, NULL),
                     SLAPO_OK);
    assert_int_equal(slapo_gpt2_load(m2, q), SLAPO_OK);
    assert_same_params(m, m2);
    /* one element changed: refused, m2 untouched */
    slapo_module_free(m2);
    m2 = new_model(2);
    float *h = slapo_tensor_data(head);
    h[37] += 0.25f;
    assert_int_equal(slapo_safetensors_write(q, n + 1, names, (const slapo_tensor *const *)ts, 0,
                                             NULL, NULL),
                     SLAPO_OK);
    for (int i = 0; i < n; i++) slapo_tensor_free(ts[i]);
    slapo_safetensors_free(f);
  }
  slapo_module *fresh = new_model(2);
  assert_int_equal(slapo_gpt2_load(m2, q), SLAPO_PRECOND);
  assert_last_error_has("lm_head.weight");
  assert_last_error_has("transformer.wte.weight");
  assert_last_error_has("largest difference 0.25 at element 37");
  assert_same_params(m2, fresh);
  slapo_module_free(fresh);
  slapo_tensor_free(head);
  slapo_module_free(m2);
  slapo_module_free(m);
}

/* The optimizer-state file follows the weights file's layout: after one
 * AdamW step whose gradients equal the weights, exp_avg = (1 - beta1) g and
 * exp_avg_sq = (1 - beta2) g^2 elementwise, so each moment read from the
 * optimizer file must be that function of the same-named tensor of the
 * weights file, element for element, Conv1D weights ([in, out]) included;
 * the square attn.c_proj catches a transposed copy that has the right shape. */
static void test_optim_state_layout(void **state) {
  (void)state;
  slapo_module *m = new_model(3);
  const char *mods[] = {"transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
                        "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj",
                        "transformer.wte"};
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.0f, false};
  slapo_adamw *o;
  assert_int_equal(slapo_adamw_new(m, &ac, &o), SLAPO_OK);
  slapo_module_zero_grad(m);
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
    slapo_parameter *pp = param_at(m, mods[i], "weight");
    assert_int_equal(slapo_tensor_copy(pp->grad, pp->value), SLAPO_OK);
  }
  char w[512], os[512];
  tmp_path(w, sizeof w, "layout.safetensors");
  tmp_path(os, sizeof os, "layout.optim.safetensors");
  assert_int_equal(slapo_gpt2_save(m, w, 0, NULL, NULL), SLAPO_OK);
  slapo_adamw_step(o, 0.0f);
  assert_int_equal(slapo_adamw_save(o, os, slapo_gpt2_is_conv1d_weight), SLAPO_OK);
  slapo_safetensors *fw, *fo;
  assert_int_equal(slapo_safetensors_read(w, &fw), SLAPO_OK);
  assert_int_equal(slapo_safetensors_read(os, &fo), SLAPO_OK);
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
    char name[160], mname[192], vname[192];
    snprintf(name, sizeof name, "%s.weight", mods[i]);
    snprintf(mname, sizeof mname, "%s.exp_avg", name);
    snprintf(vname, sizeof vname, "%s.exp_avg_sq", name);
    slapo_tensor *tw, *tm, *tv;
    assert_int_equal(slapo_safetensors_get(fw, name, &tw), SLAPO_OK);
    assert_int_equal(slapo_safetensors_get(fo, mname, &tm), SLAPO_OK);
    assert_int_equal(slapo_safetensors_get(fo, vname, &tv), SLAPO_OK);
    assert_true(slapo_shape_equal(tw->ndim, tw->shape, tm->ndim, tm->shape));
    assert_true(slapo_shape_equal(tw->ndim, tw->shape, tv->ndim, tv->shape));
    const float *g = slapo_tensor_data(tw), *mm = slapo_tensor_data(tm), *vv = slapo_tensor_data(tv);
    for (int64_t k = 0; k < slapo_tensor_numel(tw); k++) {
      if (mm[k] != 0.1f * g[k] && fabsf(mm[k] - 0.1f * g[k]) > 1e-6f * fabsf(g[k]))
        fail_msg("%s element %lld: exp_avg %g, want %g (layout differs from the weights file)",
                 name, (long long)k, (double)mm[k], 0.1 * (double)g[k]);
      if (fabsf(vv[k] - 0.05f * g[k] * g[k]) > 1e-5f * g[k] * g[k] + 1e-12f)
        fail_msg("%s element %lld: exp_avg_sq %g, want %g", name, (long long)k, (double)vv[k],
                 0.05 * (double)g[k] * g[k]);
    }
    slapo_tensor_free(tw);
    slapo_tensor_free(tm);
    slapo_tensor_free(tv);
  }
  slapo_safetensors_free(fw);
  slapo_safetensors_free(fo);
  /* and it reads back into the same state */
  slapo_adamw *o2;
  assert_int_equal(slapo_adamw_new(m, &ac, &o2), SLAPO_OK);
  assert_int_equal(slapo_adamw_load(o2, os, slapo_gpt2_is_conv1d_weight), SLAPO_OK);
  char os2[512];
  tmp_path(os2, sizeof os2, "layout2.optim.safetensors");
  assert_int_equal(slapo_adamw_save(o2, os2, slapo_gpt2_is_conv1d_weight), SLAPO_OK);
  assert_safetensors_files_equal(os, os2, "step");
  slapo_adamw_free(o2);
  slapo_adamw_free(o);
  slapo_module_free(m);
}

/* ---- learning ---- */

static void test_val_loss_falls(void **state) {
  (void)state;
  slapo_train_config c = base_config();
  c.steps = 30;
  c.batch = 4;
  c.seq = 32;
  c.warmup = 3;
  c.val_every = 5;
  c.val_batches = 2;
  record r = {0};
  train_ok(&c, &r);
  assert_int_equal(r.n, 30);
  assert_true(r.has_val[4] && r.has_val[29]);
  print_message("val loss: step 5 %.4f, step 30 %.4f (uniform: %.4f)\n", r.val_loss[4],
                r.val_loss[29], log(256.0));
  assert_true(r.val_loss[29] < r.val_loss[4] - 0.3);
  assert_true(r.val_loss[29] < log(256.0) - 1.0);
  assert_true(r.loss[29] < r.loss[0]);
}

static void test_train_errors(void **state) {
  (void)state;
  slapo_train_config c = base_config();
  c.seq = 65; /* tiny's context is 64 */
  assert_int_equal(slapo_train(&c, NULL, NULL), SLAPO_INVALID_ARG);
  assert_last_error_has("65");
  assert_last_error_has("64");
  c = base_config();
  c.model_config = "gpt5";
  assert_int_equal(slapo_train(&c, NULL, NULL), SLAPO_NOT_FOUND);
  assert_last_error_has("gpt5");
  c = base_config();
  char p[512];
  tmp_path(p, sizeof p, "missing.safetensors");
  c.resume = p;
  assert_int_equal(slapo_train(&c, NULL, NULL), SLAPO_IO);
  assert_last_error_has(p);
  /* A validation split shorter than seq + 1 fails before the first step
   * (not after training, at the final validation, before the last save). */
  char small[512], save[512];
  tmp_path(small, sizeof small, "small.txt");
  tmp_path(save, sizeof save, "small.safetensors");
  FILE *f = fopen(small, "w");
  assert_non_null(f);
  for (int i = 0; i < 6; i++) fputs("0123456789", f); /* 54 + 6 tokens */
  fclose(f);
  c = base_config();
  c.data = small;
  c.seq = 8;
  c.save = save;
  record r = {0};
  assert_int_equal(slapo_train(&c, on_event, &r), SLAPO_INVALID_ARG);
  assert_int_equal(r.n, 0);
  assert_last_error_has("validation split");
  assert_last_error_has("6 tokens");
  assert_last_error_has("--seq + 1 = 9");
  assert_int_equal(access(save, F_OK), -1);
  c.seq = 5; /* fits both splits */
  c.steps = 1;
  train_ok(&c, &r);
  assert_int_equal(r.n, 1);
  assert_int_equal(access(save, F_OK), 0);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/slapo_test_resume_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_corpus, sizeof g_corpus, "%s/corpus.txt", g_dir);
  static const char text[] =
      "The quick brown fox jumps over the lazy dog. "
      "A journey of a thousand miles begins with a single step. "
      "All that glitters is not gold. ";
  FILE *f = fopen(g_corpus, "w");
  if (!f) return -1;
  for (int i = 0; i < 40; i++) fputs(text, f); /* about 5 KB */
  return fclose(f) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resume_is_exact),   cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_checkpoint_errors), cmocka_unit_test(test_val_loss_falls),
      cmocka_unit_test(test_train_errors),      cmocka_unit_test(test_untied_head_refused),
      cmocka_unit_test(test_optim_state_layout),
      cmocka_unit_test(test_resume_is_exact_bf16),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
