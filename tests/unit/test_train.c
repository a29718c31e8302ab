/* tests/unit/test_train.c - the training pieces one at a time: the warmup +
 * cosine learning-rate schedule, gradient clipping, one AdamW step against
 * the closed form (decay vs no-decay parameters, tied weights updated once),
 * optimizer state save/load, data sets (text, llm.c token files, directories
 * and their errors), batches, gradient accumulation equal to one big batch,
 * and sampling. Models are a 2-layer, 32-wide GPT-2 (context 16). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/expect.h"
#include "common/stfiles.h"
#include "slapo/train.h"

static char g_dir[256];

static slapo_gpt2_config tiny_cfg(void) {
  return (slapo_gpt2_config){2, 4, 32, 16, 256, 0.0, 1e-5};
}

static slapo_module *new_model(const slapo_gpt2_config *c, uint64_t seed) {
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, seed), SLAPO_OK);
  return m;
}

static slapo_parameter *param_at(slapo_module *m, const char *mod, const char *name) {
  slapo_module *x;
  assert_int_equal(slapo_module_at(m, mod, &x), SLAPO_OK);
  slapo_parameter *p = slapo_module_param(x, name);
  assert_non_null(p);
  return p;
}

static void tmp_path(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* Deterministic, non-trivial gradient values: g = amp * sin(i * 0.37 + k). */
typedef struct fill_state {
  double amp;
  int k;
} fill_state;

static void fill_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  fill_state *st = ud;
  float *g = slapo_tensor_data(p->grad);
  for (int64_t i = 0; i < slapo_tensor_numel(p->grad); i++)
    g[i] = (float)(st->amp * sin((double)i * 0.37 + st->k));
  st->k++;
}

static void sumsq_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  const float *g = slapo_tensor_data(p->grad);
  for (int64_t i = 0; i < slapo_tensor_numel(p->grad); i++) *(double *)ud += (double)g[i] * g[i];
}

static double grad_norm(slapo_module *m) {
  double s = 0;
  assert_int_equal(slapo_module_visit_params(m, sumsq_grad, &s), SLAPO_OK);
  return sqrt(s);
}

/* ---- learning-rate schedule ---- */

static void test_lr_schedule(void **state) {
  (void)state;
  const float max = 1e-3f, min = 1e-4f;
  /* Warmup: step s (0-based) gets max (s + 1) / warmup. */
  assert_float_equal(slapo_lr_at(0, 10, 110, max, min), max / 10, 1e-9);
  assert_float_equal(slapo_lr_at(4, 10, 110, max, min), max / 2, 1e-9);
  assert_float_equal(slapo_lr_at(9, 10, 110, max, min), max, 1e-9);
  for (int64_t s = 1; s < 10; s++)
    assert_true(slapo_lr_at(s, 10, 110, max, min) > slapo_lr_at(s - 1, 10, 110, max, min));
  /* Cosine: max at the end of warmup, midpoint (max + min) / 2, min at total. */
  assert_float_equal(slapo_lr_at(10, 10, 110, max, min), max, 1e-9);
  assert_float_equal(slapo_lr_at(60, 10, 110, max, min), (max + min) / 2, 1e-9);
  assert_float_equal(slapo_lr_at(110, 10, 110, max, min), min, 1e-12);
  assert_float_equal(slapo_lr_at(500, 10, 110, max, min), min, 1e-12);
  float prev = max;
  for (int64_t s = 11; s <= 110; s++) {
    float lr = slapo_lr_at(s, 10, 110, max, min);
    assert_true(lr <= prev && lr >= min);
    prev = lr;
  }
  /* A quarter of the way: min + (max - min) (1 + cos(pi / 4)) / 2. */
  double q = min + (max - min) * 0.5 * (1 + cos(M_PI / 4));
  assert_float_equal(slapo_lr_at(35, 10, 110, max, min), q, 1e-9);
  /* No warmup: the first step has the peak rate. */
  assert_float_equal(slapo_lr_at(0, 0, 100, max, min), max, 1e-9);
  assert_float_equal(slapo_lr_at(50, 0, 100, max, min), (max + min) / 2, 1e-9);
}

/* ---- gradient clipping ---- */

static void test_clip_grad_norm(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 1);
  fill_state fs = {0.01, 0};
  assert_int_equal(slapo_module_visit_params(m, fill_grad, &fs), SLAPO_OK);
  double want = grad_norm(m);
  assert_true(want > 1.0);
  /* max_norm <= 0 measures only. */
  assert_float_equal(slapo_clip_grad_norm(m, 0), want, 1e-9 * want);
  assert_float_equal(grad_norm(m), want, 0);
  /* Above: returns the norm before clipping, leaves grads untouched. */
  float before = ((float *)slapo_tensor_data(param_at(m, "transformer.wte", "weight")->grad))[7];
  assert_float_equal(slapo_clip_grad_norm(m, 2 * want), want, 1e-9 * want);
  assert_float_equal(grad_norm(m), want, 0);
  /* Below: returns the old norm, the new norm is max_norm (PyTorch's
   * max_norm / (norm + 1e-6) factor, so equal up to 1e-6 / norm). */
  assert_float_equal(slapo_clip_grad_norm(m, 0.5), want, 1e-9 * want);
  assert_float_equal(grad_norm(m), 0.5, 1e-6);
  float after = ((float *)slapo_tensor_data(param_at(m, "transformer.wte", "weight")->grad))[7];
  assert_float_equal(after, before * 0.5 / want, 1e-6 * fabs(before));
  slapo_module_free(m);
}

/* ---- AdamW ---- */

/* Closed form of torch.optim.AdamW for one element, in double. */
typedef struct adam_ref {
  double w, m, v;
} adam_ref;

static void adam_ref_step(adam_ref *r, double g, int t, double lr, double wd) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
  r->m = b1 * r->m + (1 - b1) * g;
  r->v = b2 * r->v + (1 - b2) * g * g;
  double mh = r->m / (1 - pow(b1, t)), vh = r->v / (1 - pow(b2, t));
  r->w = r->w * (1 - lr * wd) - lr * mh / (sqrt(vh) + eps);
}

typedef struct probe {
  const char *mod, *name;
  int64_t index;
  bool decays;
} probe;

static void test_adamw_closed_form(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 3);
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_adamw *o;
  assert_int_equal(slapo_adamw_new(m, &ac, &o), SLAPO_OK);
  assert_int_equal(slapo_adamw_steps(o), 0);
  /* 2-D weights decay; biases and LayerNorm weights (1-D) do not. wte is
   * tied to lm_head.weight: updated once per step, not twice. */
  const probe probes[] = {
      {"transformer.h.0.attn.c_attn", "weight", 37, true},
      {"transformer.h.1.mlp.c_proj", "weight", 1000, true},
      {"transformer.wte", "weight", 5 * 32 + 3, true},
      {"transformer.h.0.attn.c_attn", "bias", 11, false},
      {"transformer.h.1.ln_2", "weight", 4, false},
      {"transformer.ln_f", "bias", 0, false},
  };
  enum { NP = sizeof probes / sizeof probes[0] };
  adam_ref ref[NP];
  for (int i = 0; i < NP; i++) {
    slapo_parameter *p = param_at(m, probes[i].mod, probes[i].name);
    assert_int_equal(p->no_weight_decay, !probes[i].decays);
    ref[i] = (adam_ref){((float *)slapo_tensor_data(p->value))[probes[i].index], 0, 0};
  }
  /* LayerNorm weights start at 1 and biases at 0: nudge them so decay would
   * show (a no-decay bug at w = 0 is invisible). */
  for (int i = 0; i < NP; i++) {
    slapo_parameter *p = param_at(m, probes[i].mod, probes[i].name);
    float *w = slapo_tensor_data(p->value);
    w[probes[i].index] += 0.75f;
    ref[i].w = w[probes[i].index];
  }
  const float lrs[3] = {1e-2f, 5e-3f, 2e-2f};
  for (int t = 1; t <= 3; t++) {
    fill_state fs = {0.1 * t, t};
    assert_int_equal(slapo_module_visit_params(m, fill_grad, &fs), SLAPO_OK);
    for (int i = 0; i < NP; i++) {
      slapo_parameter *p = param_at(m, probes[i].mod, probes[i].name);
      double g = ((float *)slapo_tensor_data(p->grad))[probes[i].index];
      adam_ref_step(&ref[i], g, t, lrs[t - 1], probes[i].decays ? 0.1 : 0.0);
    }
    slapo_adamw_step(o, lrs[t - 1]);
    assert_int_equal(slapo_adamw_steps(o), t);
    for (int i = 0; i < NP; i++) {
      slapo_parameter *p = param_at(m, probes[i].mod, probes[i].name);
      double got = ((float *)slapo_tensor_data(p->value))[probes[i].index];
      if (fabs(got - ref[i].w) > 1e-6 * (1 + fabs(ref[i].w)))
        fail_msg("step %d %s.%s[%lld]: %.9g, closed form %.9g", t, probes[i].mod, probes[i].name,
                 (long long)probes[i].index, got, ref[i].w);
    }
  }
  slapo_adamw_free(o);
  slapo_module_free(m);
}

static void steps_with_grads(slapo_module *m, slapo_adamw *o, int n) {
  for (int t = 0; t < n; t++) {
    fill_state fs = {0.05 * (t + 1), 7 * t};
    assert_int_equal(slapo_module_visit_params(m, fill_grad, &fs), SLAPO_OK);
    slapo_adamw_step(o, 1e-3f);
  }
}

static void test_adamw_save_load(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_module *m1 = new_model(&c, 5), *m2 = new_model(&c, 5);
  slapo_adamw *o1, *o2;
  assert_int_equal(slapo_adamw_new(m1, &ac, &o1), SLAPO_OK);
  assert_int_equal(slapo_adamw_new(m2, &ac, &o2), SLAPO_OK);
  steps_with_grads(m1, o1, 2);
  char a[512], b[512];
  tmp_path(a, sizeof a, "opt_a.safetensors");
  tmp_path(b, sizeof b, "opt_b.safetensors");
  assert_int_equal(slapo_adamw_save(o1, a, NULL), SLAPO_OK);
  {
    slapo_safetensors *f;
    assert_int_equal(slapo_safetensors_read(a, &f), SLAPO_OK);
    assert_string_equal(slapo_safetensors_metadata(f, "step"), "2");
    slapo_tensor *t;
    assert_int_equal(slapo_safetensors_meta(f, "transformer.h.0.attn.c_attn.weight.exp_avg_sq", &t),
                     SLAPO_OK);
    assert_int_equal(t->shape[0], 96), assert_int_equal(t->shape[1], 32);
    slapo_tensor_free(t);
    assert_int_equal(slapo_safetensors_count(f), 2 * (4 + 12 * 2));
    slapo_safetensors_free(f);
  }
  /* Load into a fresh optimizer: same t, same state (saved again equal). */
  assert_int_equal(slapo_adamw_load(o2, a, NULL), SLAPO_OK);
  assert_int_equal(slapo_adamw_steps(o2), 2);
  assert_int_equal(slapo_adamw_save(o2, b, NULL), SLAPO_OK);
  assert_safetensors_files_equal(a, b, "step");
  /* Copy m1's weights into m2 (through a model checkpoint); a further step
   * with equal grads gives equal weights and equal states. */
  char w[512];
  tmp_path(w, sizeof w, "weights.safetensors");
  assert_int_equal(slapo_gpt2_save(m1, w, 0, NULL, NULL), SLAPO_OK);
  assert_int_equal(slapo_gpt2_load(m2, w), SLAPO_OK);
  steps_with_grads(m1, o1, 1);
  steps_with_grads(m2, o2, 1);
  assert_int_equal(slapo_adamw_steps(o2), 3);
  assert_int_equal(slapo_adamw_save(o1, a, NULL), SLAPO_OK);
  assert_int_equal(slapo_adamw_save(o2, b, NULL), SLAPO_OK);
  assert_safetensors_files_equal(a, b, "step");
  char w2[512];
  tmp_path(w2, sizeof w2, "weights2.safetensors");
  assert_int_equal(slapo_gpt2_save(m1, w, 0, NULL, NULL), SLAPO_OK);
  assert_int_equal(slapo_gpt2_save(m2, w2, 0, NULL, NULL), SLAPO_OK);
  {
    slapo_safetensors *fa, *fb;
    assert_int_equal(slapo_safetensors_read(w, &fa), SLAPO_OK);
    assert_int_equal(slapo_safetensors_read(w2, &fb), SLAPO_OK);
    for (int i = 0; i < slapo_safetensors_count(fa); i++) {
      slapo_tensor *x, *y;
      assert_int_equal(slapo_safetensors_get(fa, slapo_safetensors_name(fa, i), &x), SLAPO_OK);
      assert_int_equal(slapo_safetensors_get(fb, slapo_safetensors_name(fa, i), &y), SLAPO_OK);
      assert_true(slapo_tensor_equal(x, y));
      slapo_tensor_free(x), slapo_tensor_free(y);
    }
    slapo_safetensors_free(fa), slapo_safetensors_free(fb);
  }
  slapo_adamw_free(o1), slapo_adamw_free(o2);
  slapo_module_free(m1), slapo_module_free(m2);
}

/* Tensors a checkpoint has and the model does not are not read. The load
 * warns about them through the log hook, naming layers past the model's
 * (a 4-layer file into a 2-layer config), but not about the attn.bias
 * buffers that Hugging Face GPT-2 files hold. */
static int g_warns;
static char g_warn[1024];

static void warn_sink(int level, const char *msg, void *ud) {
  (void)ud;
  if (level != SLAPO_LOG_WARN) return;
  g_warns++;
  snprintf(g_warn, sizeof g_warn, "%s", msg);
}

static void assert_warned(const char *needle) {
  assert_int_equal(g_warns, 1);
  if (!strstr(g_warn, needle)) fail_msg("warning '%s' lacks '%s'", g_warn, needle);
  g_warns = 0;
}

/* Writes the tensors of file `from` plus the extra names (each a copy of
 * the file's first tensor) to `to`. */
static void write_with_extra(const char *from, const char *to, int n_extra,
                             const char *const *extra) {
  slapo_safetensors *f;
  assert_int_equal(slapo_safetensors_read(from, &f), SLAPO_OK);
  int n = slapo_safetensors_count(f);
  const char *names[64];
  slapo_tensor *ts[64];
  assert_true(n + n_extra <= 64);
  for (int i = 0; i < n + n_extra; i++) {
    names[i] = i < n ? slapo_safetensors_name(f, i) : extra[i - n];
    assert_int_equal(slapo_safetensors_get(f, slapo_safetensors_name(f, i < n ? i : 0), &ts[i]),
                     SLAPO_OK);
  }
  assert_int_equal(slapo_safetensors_write(to, n + n_extra, names,
                                           (const slapo_tensor *const *)ts, 0, NULL, NULL),
                   SLAPO_OK);
  for (int i = 0; i < n + n_extra; i++) slapo_tensor_free(ts[i]);
  slapo_safetensors_free(f);
}

static void test_load_warns_unused(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg(), c4 = tiny_cfg();
  c4.n_layer = 4;
  slapo_module *m = new_model(&c, 1), *big = new_model(&c4, 2);
  char two[512], four[512], extra[512];
  tmp_path(two, sizeof two, "two_layers.safetensors");
  tmp_path(four, sizeof four, "four_layers.safetensors");
  tmp_path(extra, sizeof extra, "extra.safetensors");
  assert_int_equal(slapo_gpt2_save(m, two, 0, NULL, NULL), SLAPO_OK);
  assert_int_equal(slapo_gpt2_save(big, four, 0, NULL, NULL), SLAPO_OK);
  slapo_set_log(warn_sink, NULL);
  g_warns = 0;
  assert_int_equal(slapo_gpt2_load(m, two), SLAPO_OK);
  assert_int_equal(g_warns, 0);
  /* Layers 0-1 load; 2-3 (12 tensors each) are named. */
  assert_int_equal(slapo_gpt2_load(m, four), SLAPO_OK);
  assert_warned("24 tensors of the file are not used by the model: transformer.h.2.attn.c_attn.bias, ");
  if (!strstr(g_warn, "the file has layers transformer.h.0-3, the model only transformer.h.0-1: is the config right?"))
    fail_msg("warning '%s' lacks the layers", g_warn);
  assert_true(slapo_tensor_equal(param_at(m, "transformer.h.1.mlp.c_fc", "weight")->value,
                                 param_at(big, "transformer.h.1.mlp.c_fc", "weight")->value));
  /* Hugging Face's buffers are not parameters and not worth a warning; an
   * unknown tensor is, alone. */
  const char *buffers[] = {"h.0.attn.bias", "h.1.attn.masked_bias"};
  write_with_extra(two, extra, 2, buffers);
  assert_int_equal(slapo_gpt2_load(m, extra), SLAPO_OK);
  assert_int_equal(g_warns, 0);
  const char *unknown[] = {"h.0.attn.bias", "h.0.mlp.gate.weight"};
  write_with_extra(two, extra, 2, unknown);
  assert_int_equal(slapo_gpt2_load(m, extra), SLAPO_OK);
  assert_warned("1 tensor of the file is not used by the model: h.0.mlp.gate.weight");
  assert_null(strstr(g_warn, "layers"));
  slapo_set_log(NULL, NULL);
  slapo_module_free(m), slapo_module_free(big);
}

/* A load that fails on a missing tensor copies nothing (every tensor is
 * checked first); one into a model that is not materialized names the
 * first parameter in tree order. */
static void test_load_checks_before_copying(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg(), c4 = tiny_cfg();
  c4.n_layer = 4;
  slapo_module *m = new_model(&c, 1), *big = new_model(&c4, 2), *meta;
  char two[512];
  tmp_path(two, sizeof two, "two_layers_only.safetensors");
  assert_int_equal(slapo_gpt2_save(m, two, 0, NULL, NULL), SLAPO_OK);
  slapo_tensor *before;
  slapo_parameter *w = param_at(big, "transformer.h.0.attn.c_attn", "weight");
  assert_int_equal(slapo_tensor_contiguous(w->value, &before), SLAPO_OK);
  assert_int_equal(slapo_gpt2_load(big, two), SLAPO_NOT_FOUND);
  assert_last_error_has("no tensor 'transformer.h.2.");
  assert_true(slapo_tensor_equal(w->value, before));
  assert_int_equal(slapo_gpt2_new(&c, &meta), SLAPO_OK);
  assert_int_equal(slapo_gpt2_load(meta, two), SLAPO_STATE);
  assert_last_error_has("gpt2 load: parameter transformer.wte.weight is not materialized");
  slapo_tensor_free(before);
  slapo_module_free(m), slapo_module_free(big), slapo_module_free(meta);
}

static void test_adamw_load_mismatch(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_module *m = new_model(&c, 5);
  slapo_adamw *o;
  assert_int_equal(slapo_adamw_new(m, &ac, &o), SLAPO_OK);
  steps_with_grads(m, o, 1);
  char a[512];
  tmp_path(a, sizeof a, "opt_mismatch.safetensors");
  assert_int_equal(slapo_adamw_save(o, a, NULL), SLAPO_OK);

  /* Wider model: the first parameter (wte) does not fit. */
  slapo_gpt2_config wide = c;
  wide.n_embd = 64;
  slapo_module *mw = new_model(&wide, 5);
  slapo_adamw *ow;
  assert_int_equal(slapo_adamw_new(mw, &ac, &ow), SLAPO_OK);
  assert_int_equal(slapo_adamw_load(ow, a, NULL), SLAPO_SHAPE);
  assert_last_error_has("transformer.wte.weight.exp_avg");
  assert_last_error_has("[256, 32]");
  assert_last_error_has("[256, 64]");
  assert_int_equal(slapo_adamw_steps(ow), 0);
  slapo_adamw_free(ow);
  slapo_module_free(mw);

  /* Deeper model: block 2's state is missing. */
  slapo_gpt2_config deep = c;
  deep.n_layer = 3;
  slapo_module *md = new_model(&deep, 5);
  slapo_adamw *od;
  assert_int_equal(slapo_adamw_new(md, &ac, &od), SLAPO_OK);
  assert_int_equal(slapo_adamw_load(od, a, NULL), SLAPO_NOT_FOUND);
  assert_last_error_has("transformer.h.2.ln_1.weight");
  assert_int_equal(slapo_adamw_steps(od), 0);
  slapo_adamw_free(od);
  slapo_module_free(md);

  /* A safetensors file without the step count; a file that is not one. */
  const char *names[1] = {"x"};
  slapo_tensor *t;
  int64_t shape[1] = {4};
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 1, shape, &t), SLAPO_OK);
  const slapo_tensor *ts[1] = {t};
  assert_int_equal(slapo_safetensors_write(a, 1, names, ts, 0, NULL, NULL), SLAPO_OK);
  slapo_tensor_free(t);
  assert_int_equal(slapo_adamw_load(o, a, NULL), SLAPO_IO);
  assert_last_error_has("step");
  write_file(a, "not a safetensors file", 22);
  assert_int_equal(slapo_adamw_load(o, a, NULL), SLAPO_IO);
  assert_int_equal(slapo_adamw_steps(o), 1);
  slapo_adamw_free(o);
  slapo_module_free(m);
}

/* ---- data ---- */

static const char k_text[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness. ";

/* Writes `n` bytes of repeated k_text to `path`. */
static void write_text(const char *path, size_t n) {
  char *buf = malloc(n);
  assert_non_null(buf);
  for (size_t i = 0; i < n; i++) buf[i] = k_text[i % (sizeof k_text - 1)];
  write_file(path, buf, n);
  free(buf);
}

static slapo_tensor *i32_2d(int64_t B, int64_t T) {
  int64_t shape[2] = {B, T};
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &t), SLAPO_OK);
  return t;
}

static void test_dataset_text(void **state) {
  (void)state;
  char p[512];
  tmp_path(p, sizeof p, "text.txt");
  write_text(p, 1000);
  slapo_dataset *d;
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_OK);
  assert_int_equal(slapo_dataset_tokens(d, false), 900);
  assert_int_equal(slapo_dataset_tokens(d, true), 100);
  assert_int_equal(slapo_dataset_vocab(d), 256);
  assert_false(slapo_dataset_gpt2_tokens(d));
  /* Each row is a window of the bytes; targets are the next bytes. */
  slapo_tensor *x = i32_2d(3, 20), *y = i32_2d(3, 20);
  for (int val = 0; val < 2; val++) {
    assert_int_equal(slapo_dataset_batch(d, val, 9, 4, x, y), SLAPO_OK);
    const int32_t *xs = slapo_tensor_data(x), *ys = slapo_tensor_data(y);
    for (int b = 0; b < 3; b++) {
      char row[21];
      for (int t = 0; t < 20; t++) row[t] = (char)xs[b * 20 + t];
      row[20] = '\0';
      /* k_text is periodic; the window must appear in two copies of it. */
      char twice[2 * sizeof k_text];
      snprintf(twice, sizeof twice, "%s%s", k_text, k_text);
      assert_non_null(strstr(twice, row));
      for (int t = 0; t + 1 < 20; t++) assert_int_equal(ys[b * 20 + t], xs[b * 20 + t + 1]);
    }
  }
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
  /* val_fraction out of range. */
  assert_int_equal(slapo_dataset_load(p, 1.0, &d), SLAPO_INVALID_ARG);
  assert_null(d);
}

enum { HDR = 256 };

/* Writes an llm.c token file: header (magic, version, count) then uint16
 * tokens little-endian; `n_written` tokens actually follow. */
static void write_tokens(const char *path, int32_t version, int32_t count, const uint16_t *tok,
                         int n_written) {
  size_t nbytes = HDR * 4 + (size_t)n_written * 2;
  unsigned char *buf = calloc(1, nbytes);
  assert_non_null(buf);
  int32_t h[3] = {20240520, version, count};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) buf[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
  for (int i = 0; i < n_written; i++) {
    buf[HDR * 4 + 2 * i] = (unsigned char)(tok[i] & 0xff);
    buf[HDR * 4 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
  }
  write_file(path, buf, nbytes);
  free(buf);
}

static void test_dataset_llmc(void **state) {
  (void)state;
  enum { N = 500 };
  uint16_t tok[N];
  for (int i = 0; i < N; i++) tok[i] = (uint16_t)(1000 + i); /* window start visible */
  tok[N - 1] = 60000;                                         /* > INT16_MAX: unsigned */
  char p[512];
  tmp_path(p, sizeof p, "tokens.bin");
  write_tokens(p, 1, N, tok, N);
  slapo_dataset *d;
  assert_int_equal(slapo_dataset_load(p, 0.0, &d), SLAPO_OK);
  assert_int_equal(slapo_dataset_tokens(d, false), N);
  assert_int_equal(slapo_dataset_tokens(d, true), 0);
  assert_int_equal(slapo_dataset_vocab(d), 60001);
  assert_true(slapo_dataset_gpt2_tokens(d));
  slapo_tensor *x = i32_2d(4, 16), *y = i32_2d(4, 16);
  assert_int_equal(slapo_dataset_batch(d, false, 1, 0, x, y), SLAPO_OK);
  const int32_t *xs = slapo_tensor_data(x), *ys = slapo_tensor_data(y);
  for (int b = 0; b < 4; b++) {
    int32_t s = xs[b * 16];
    assert_true(s >= 1000 && s + 16 < 1000 + N);
    for (int t = 0; t < 16; t++) {
      int32_t want_x = s + t, want_y = s + t + 1;
      if (want_y == 1000 + N - 1) want_y = 60000;
      assert_int_equal(xs[b * 16 + t], want_x);
      assert_int_equal(ys[b * 16 + t], want_y);
    }
  }
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
  /* The validation split is the tail. */
  assert_int_equal(slapo_dataset_load(p, 0.2, &d), SLAPO_OK);
  assert_int_equal(slapo_dataset_tokens(d, false), 400);
  assert_int_equal(slapo_dataset_tokens(d, true), 100);
  x = i32_2d(1, 99), y = i32_2d(1, 99);
  assert_int_equal(slapo_dataset_batch(d, true, 1, 0, x, y), SLAPO_OK);
  assert_int_equal(((int32_t *)slapo_tensor_data(x))[0], 1400); /* the only window */
  assert_int_equal(((int32_t *)slapo_tensor_data(y))[98], 60000);
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
}

static void test_dataset_errors(void **state) {
  (void)state;
  uint16_t tok[400] = {0};
  char p[512];
  slapo_dataset *d = (slapo_dataset *)1;
  /* Truncated: the header says 500 tokens, 400 follow. */
  tmp_path(p, sizeof p, "short.bin");
  write_tokens(p, 1, 500, tok, 400);
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_IO);
  assert_null(d);
  assert_last_error_has(p);
  assert_last_error_has("500 tokens");
  assert_last_error_has("2024 bytes"); /* expected: 1024 + 2 x 500 */
  assert_last_error_has("1824 bytes"); /* actual: 1024 + 2 x 400 */
  /* Unknown version. */
  write_tokens(p, 7, 400, tok, 400);
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_IO);
  assert_last_error_has("version 7");
  /* Empty file. */
  tmp_path(p, sizeof p, "empty.txt");
  write_file(p, "", 0);
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_IO);
  assert_last_error_has(p);
  assert_last_error_has("is empty");
  /* Missing file. */
  tmp_path(p, sizeof p, "no_such_file.txt");
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_IO);
  assert_last_error_has(p);
  /* Empty directory. */
  tmp_path(p, sizeof p, "emptydir");
  assert_int_equal(mkdir(p, 0755), 0);
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_IO);
  assert_last_error_has("has no text files");
  assert_null(d);
}

static void test_dataset_directory(void **state) {
  (void)state;
  char dir[512], p[600];
  tmp_path(dir, sizeof dir, "corpus");
  assert_int_equal(mkdir(dir, 0755), 0);
  /* Regular text files count, in name order; hidden files, subdirectories,
   * symbolic links and binary files (a NUL byte, like fortunes' .dat
   * indexes) are skipped. */
  const char *files[][2] = {{"b", "BBBB"}, {"a.txt", "AAAA"}, {".hidden", "HHHH"}, {"ab", "XY"}};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
    write_file(p, files[i][1], strlen(files[i][1]));
  }
  snprintf(p, sizeof p, "%s/c.dat", dir);
  write_file(p, "CC\0C", 4);
  char target[600];
  snprintf(target, sizeof target, "%s/b", dir);
  snprintf(p, sizeof p, "%s/b.u8", dir);
  assert_int_equal(symlink(target, p), 0);
  snprintf(p, sizeof p, "%s/sub", dir);
  assert_int_equal(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/sub/z", dir);
  write_file(p, "ZZZZ", 4);
  slapo_dataset *d;
  assert_int_equal(slapo_dataset_load(dir, 0.0, &d), SLAPO_OK);
  assert_int_equal(slapo_dataset_tokens(d, false), 10);
  /* T = 9 leaves one window: the whole stream "AAAAXYBBBB". */
  slapo_tensor *x = i32_2d(1, 9), *y = i32_2d(1, 9);
  assert_int_equal(slapo_dataset_batch(d, false, 3, 0, x, y), SLAPO_OK);
  const char *want = "AAAAXYBBBB";
  for (int t = 0; t < 9; t++) {
    assert_int_equal(((int32_t *)slapo_tensor_data(x))[t], want[t]);
    assert_int_equal(((int32_t *)slapo_tensor_data(y))[t], want[t + 1]);
  }
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
}

static bool tensors_equal_i32(const slapo_tensor *a, const slapo_tensor *b) {
  return !memcmp(slapo_tensor_data(a), slapo_tensor_data(b), slapo_tensor_nbytes(a));
}

static void test_dataset_batch(void **state) {
  (void)state;
  char p[512];
  tmp_path(p, sizeof p, "batch.txt");
  /* Varied bytes, so different windows differ. */
  enum { N = 4000 };
  unsigned char buf[N];
  for (int i = 0; i < N; i++) buf[i] = (unsigned char)((i * 2654435761u) >> 13);
  write_file(p, buf, N);
  slapo_dataset *d;
  assert_int_equal(slapo_dataset_load(p, 0.025, &d), SLAPO_OK);
  assert_int_equal(slapo_dataset_tokens(d, true), 100);
  slapo_tensor *x1 = i32_2d(4, 32), *y1 = i32_2d(4, 32), *x2 = i32_2d(4, 32), *y2 = i32_2d(4, 32);
  assert_int_equal(slapo_dataset_batch(d, false, 11, 5, x1, y1), SLAPO_OK);
  const int32_t *xs = slapo_tensor_data(x1), *ys = slapo_tensor_data(y1);
  for (int b = 0; b < 4; b++) {
    /* Find the window start and check both rows against the bytes. */
    int start = -1;
    for (int s = 0; s + 33 <= N - 100 && start < 0; s++)
    {
      bool ok = true;
      for (int t = 0; t < 32 && ok; t++) ok = xs[b * 32 + t] == buf[s + t];
      if (ok) start = s;
    }
    assert_true(start >= 0);
    for (int t = 0; t < 32; t++) assert_int_equal(ys[b * 32 + t], buf[start + t + 1]);
  }
  /* Same (seed, step): same batch. */
  assert_int_equal(slapo_dataset_batch(d, false, 11, 5, x2, y2), SLAPO_OK);
  assert_true(tensors_equal_i32(x1, x2) && tensors_equal_i32(y1, y2));
  /* Another step or seed: another batch. */
  assert_int_equal(slapo_dataset_batch(d, false, 11, 6, x2, y2), SLAPO_OK);
  assert_false(tensors_equal_i32(x1, x2));
  assert_int_equal(slapo_dataset_batch(d, false, 12, 5, x2, y2), SLAPO_OK);
  assert_false(tensors_equal_i32(x1, x2));
  slapo_tensor_free(x1), slapo_tensor_free(y1), slapo_tensor_free(x2), slapo_tensor_free(y2);
  /* The validation split has 100 tokens: T = 99 fits, T = 100 does not. */
  slapo_tensor *x = i32_2d(2, 99), *y = i32_2d(2, 99);
  assert_int_equal(slapo_dataset_batch(d, true, 1, 0, x, y), SLAPO_OK);
  slapo_tensor_free(x), slapo_tensor_free(y);
  x = i32_2d(2, 100), y = i32_2d(2, 100);
  assert_int_equal(slapo_dataset_batch(d, true, 1, 0, x, y), SLAPO_INVALID_ARG);
  assert_last_error_has("validation");
  assert_last_error_has("100 tokens");
  assert_last_error_has("101");
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
}

/* ---- gradient accumulation ---- */

typedef struct grad_snap {
  int n;
  slapo_tensor *g[64];
} grad_snap;

static void snap(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  grad_snap *s = ud;
  assert_true(s->n < 64);
  assert_int_equal(slapo_tensor_contiguous(p->grad, &s->g[s->n++]), SLAPO_OK);
}

static void test_grad_accumulation(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 21);
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  char p[512];
  tmp_path(p, sizeof p, "accum.txt");
  write_text(p, 2000);
  slapo_dataset *d;
  assert_int_equal(slapo_dataset_load(p, 0.1, &d), SLAPO_OK);
  enum { B = 4, T = 12 };
  slapo_tensor *x = i32_2d(B, T), *y = i32_2d(B, T);
  assert_int_equal(slapo_dataset_batch(d, false, 4, 0, x, y), SLAPO_OK);
  slapo_tensor *hx[2], *hy[2];
  for (int h = 0; h < 2; h++) {
    hx[h] = i32_2d(B / 2, T), hy[h] = i32_2d(B / 2, T);
    memcpy(slapo_tensor_data(hx[h]), (int32_t *)slapo_tensor_data(x) + h * (B / 2) * T,
           (size_t)(B / 2) * T * 4);
    memcpy(slapo_tensor_data(hy[h]), (int32_t *)slapo_tensor_data(y) + h * (B / 2) * T,
           (size_t)(B / 2) * T * 4);
  }
  slapo_kernel_env env = {1, 0, true};
  /* Two micro-batches accumulate, then 1/2. */
  slapo_module_zero_grad(m);
  double loss_acc = 0;
  for (int h = 0; h < 2; h++) {
    const slapo_tensor *in[2] = {hx[h], hy[h]}, *loss;
    slapo_status s = slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, &loss);
    if (s != SLAPO_OK) fail_msg("micro-batch %d: %s", h, slapo_last_error());
    loss_acc += *(const float *)slapo_tensor_data(loss) / 2;
  }
  grad_snap acc = {0};
  assert_int_equal(slapo_module_visit_params(m, snap, &acc), SLAPO_OK);
  for (int i = 0; i < acc.n; i++) {
    float *g = slapo_tensor_data(acc.g[i]);
    for (int64_t k = 0; k < slapo_tensor_numel(acc.g[i]); k++) g[k] *= 0.5f;
  }
  /* One batch of 4. */
  slapo_module_zero_grad(m);
  const slapo_tensor *in[2] = {x, y}, *loss;
  assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, &loss), SLAPO_OK);
  double loss_full = *(const float *)slapo_tensor_data(loss);
  assert_float_equal(loss_acc, loss_full, 1e-6 * loss_full);
  grad_snap full = {0};
  assert_int_equal(slapo_module_visit_params(m, snap, &full), SLAPO_OK);
  assert_int_equal(acc.n, full.n);
  double worst = 0;
  for (int i = 0; i < acc.n; i++) {
    const float *a = slapo_tensor_data(acc.g[i]), *b = slapo_tensor_data(full.g[i]);
    double diff = 0, scale = 1e-30;
    for (int64_t k = 0; k < slapo_tensor_numel(acc.g[i]); k++) {
      diff = fmax(diff, fabs((double)a[k] - b[k]));
      scale = fmax(scale, fabs((double)b[k]));
    }
    worst = fmax(worst, diff / scale);
    slapo_tensor_free(acc.g[i]), slapo_tensor_free(full.g[i]);
  }
  print_message("accumulated vs full batch: max rel error %.3g\n", worst);
  assert_true(worst < 1e-5);
  for (int h = 0; h < 2; h++) slapo_tensor_free(hx[h]), slapo_tensor_free(hy[h]);
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_dataset_free(d);
  slapo_runner_free(r);
  slapo_module_free(m);
}

/* ---- sampling ---- */

static void test_sample(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 8);
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  enum { NEW = 24 }; /* more than the context: the window slides */
  int32_t a[2 + NEW] = {72, 101}, b[2 + NEW] = {72, 101}, e[2 + NEW] = {72, 101};
  int64_t na = 2, nb = 2, ne = 2;
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 1.0f, .top_k = 0, .seed = 42}, a, &na, NEW), SLAPO_OK);
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 1.0f, .top_k = 0, .seed = 42}, b, &nb, NEW), SLAPO_OK);
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 1.0f, .top_k = 0, .seed = 43}, e, &ne, NEW), SLAPO_OK);
  assert_int_equal(na, 2 + NEW), assert_int_equal(nb, 2 + NEW), assert_int_equal(ne, 2 + NEW);
  assert_memory_equal(a, b, sizeof a);
  assert_memory_not_equal(a, e, sizeof a);
  assert_int_equal(a[0], 72), assert_int_equal(a[1], 101);
  for (int i = 0; i < 2 + NEW; i++) assert_true(a[i] >= 0 && a[i] < 256);

  /* top_k = 1 is greedy: the argmax of the logits at the last real
   * position of the unpadded sequence, whatever the seed. */
  int32_t g[6] = {10, 20, 30, 40, 50};
  int64_t ng = 5;
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 0.7f, .top_k = 1, .seed = 99}, g, &ng, 1), SLAPO_OK);
  slapo_tensor *idx = i32_2d(1, 5);
  memcpy(slapo_tensor_data(idx), g, 5 * sizeof *g);
  const slapo_tensor *in[1] = {idx}, *logits;
  assert_int_equal(slapo_step(r, 1, in, SLAPO_STEP_EVAL, NULL, &logits), SLAPO_OK);
  const float *row = (const float *)slapo_tensor_data(logits) + 4 * 256;
  int best = 0;
  for (int v = 1; v < 256; v++)
    if (row[v] > row[best]) best = v;
  assert_int_equal(g[5], best);
  slapo_tensor_free(idx);

  /* Errors. */
  int64_t zero = 0;
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 1.0f, .top_k = 0, .seed = 1}, g, &zero, 1), SLAPO_INVALID_ARG);
  ng = 1;
  assert_int_equal(slapo_sample(r, &(slapo_sample_opts){.n_ctx = 16, .temperature = 0.0f, .top_k = 0, .seed = 1}, g, &ng, 1), SLAPO_INVALID_ARG);
  assert_last_error_has("temperature");
  slapo_runner_free(r);
  slapo_module_free(m);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/slapo_test_train_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Greedy sampling (top_k 1) with the KV cache picks exactly the tokens the
 * window recomputation picks, past the context (the cache restarts), for
 * GPT-2 and for GPT-2 with FlashAttention; the cache's logits equal the
 * window's to float rounding; progress is reported per token. */
static int64_t g_progress;
static void count_progress(int64_t done, int64_t total, void *ud) {
  (void)ud;
  assert_int_equal(done, g_progress + 1);
  assert_true(done <= total);
  g_progress = done;
}

static void greedy_both_ways(slapo_module *m) {
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  enum { NEW = 40 }; /* context 16: the cache restarts */
  int32_t a[3 + NEW] = {72, 101, 108}, b[3 + NEW] = {72, 101, 108};
  int64_t na = 3, nb = 3;
  slapo_sample_opts o = {.n_ctx = 16, .temperature = 1.0f, .top_k = 1, .seed = 5,
                         .progress = count_progress};
  g_progress = 0;
  assert_int_equal(slapo_sample(r, &o, a, &na, NEW), SLAPO_OK);
  assert_int_equal(g_progress, NEW);
  o.no_cache = true, o.progress = NULL;
  assert_int_equal(slapo_sample(r, &o, b, &nb, NEW), SLAPO_OK);
  for (int i = 0; i < 3 + NEW; i++)
    if (a[i] != b[i]) fail_msg("token %d: %d with the cache, %d without", i, a[i], b[i]);
  /* the logits themselves: a prompt of 5 then one decoded token */
  slapo_kv_cache *kv;
  assert_int_equal(slapo_kv_cache_new(&kv), SLAPO_OK);
  slapo_tensor *p5 = i32_2d(1, 5), *p1 = i32_2d(1, 1), *w6 = i32_2d(1, 6);
  int32_t *q = slapo_tensor_data(w6);
  for (int i = 0; i < 6; i++) q[i] = a[i];
  memcpy(slapo_tensor_data(p5), q, 5 * sizeof *q);
  memcpy(slapo_tensor_data(p1), q + 5, sizeof *q);
  const slapo_tensor *lg;
  slapo_kernel_env env = {1, 0, false};
  assert_int_equal(slapo_step_decode(r, kv, p5, &env, &lg), SLAPO_OK);
  assert_int_equal(slapo_step_decode(r, kv, p1, &env, &lg), SLAPO_OK);
  assert_int_equal(slapo_kv_cache_len(kv), 6);
  int V = (int)lg->shape[2];
  float *dec = malloc((size_t)V * sizeof *dec);
  memcpy(dec, slapo_tensor_data(lg), (size_t)V * sizeof *dec);
  const slapo_tensor *in[1] = {w6}, *full;
  assert_int_equal(slapo_step(r, 1, in, SLAPO_STEP_EVAL, &env, &full), SLAPO_OK);
  const float *ref = (const float *)slapo_tensor_data(full) + 5 * V;
  for (int v = 0; v < V; v++)
    if (fabsf(dec[v] - ref[v]) > 1e-4f * (1 + fabsf(ref[v])))
      fail_msg("logit %d: %g decoded, %g from the window", v, (double)dec[v], (double)ref[v]);
  /* more than one new token after cached ones is refused */
  slapo_tensor *p2 = i32_2d(1, 2);
  assert_int_equal(slapo_step_decode(r, kv, p2, &env, &lg), SLAPO_UNSUPPORTED);
  assert_non_null(strstr(slapo_last_error(), "steps after the first take one token"));
  free(dec);
  slapo_tensor_free(p5), slapo_tensor_free(p1), slapo_tensor_free(w6), slapo_tensor_free(p2);
  slapo_kv_cache_free(kv);
  slapo_runner_free(r);
}

static void test_sample_kv_cache(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 8);
  greedy_both_ways(m);
  assert_int_equal(slapo_models_init(), SLAPO_OK);
  slapo_sched *root;
  slapo_sched_log *log;
  assert_int_equal(slapo_sched_create(m, &root), SLAPO_OK);
  assert_int_equal(slapo_sched_parse("transformer.h.*.attn replace FlashAttention\n", "t", &log),
                   SLAPO_OK);
  assert_int_equal(slapo_apply_schedule(root, log, NULL, 0, 0, NULL), SLAPO_OK);
  greedy_both_ways(m);
  slapo_sched_log_free(log);
  slapo_sched_free(root);
  slapo_module_free(m);
}

/* ---- micro-batches weighted by valid tokens ---- */

/* logits = table[idx] (table [2, 2]), loss = mean cross-entropy over the
 * targets that are not SLAPO_IGNORE_INDEX. */
static slapo_node *lookup_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  (void)n_in;
  slapo_node *logits = slapo_embedding(ctx, slapo_weight(ctx, self, "table"), in[0]);
  return slapo_cross_entropy(ctx, logits, in[1], SLAPO_IGNORE_INDEX);
}
static const slapo_module_type k_lookup = {"Lookup", lookup_forward, NULL, NULL, NULL};

static slapo_tensor *i32_row(int n, const int32_t *v) {
  int64_t sh[2] = {1, n};
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &t), SLAPO_OK);
  memcpy(slapo_tensor_data(t), v, (size_t)n * sizeof *v);
  return t;
}

/* Two classes, target 0, logits [0, L]: row 0 has L = ln(e^2 - 1) (loss 2),
 * row 1 L = ln(e - 1) (loss 1). Micro-batch A holds one valid token (row
 * 0), B three (row 1), both padded to 3 targets with the ignore index. The
 * step's loss is (2 + 3) / 4 = 1.25 and its gradients equal one batch of
 * all six targets; averaging the micro-batch means equally gives 1.5. */
static void test_accumulate_by_valid_tokens(void **state) {
  (void)state;
  slapo_module *m;
  assert_int_equal(slapo_module_new(&k_lookup, NULL, &m), SLAPO_OK);
  int64_t tsh[2] = {2, 2};
  assert_int_equal(slapo_module_add_param(m, "table", 2, tsh, SLAPO_INIT_ZEROS, 0), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 1), SLAPO_OK);
  float *tab = slapo_tensor_data(slapo_module_param(m, "table")->value);
  tab[0] = 0, tab[1] = 1.8545865f, tab[2] = 0, tab[3] = 0.5413249f;
  const int32_t I = SLAPO_IGNORE_INDEX;
  slapo_tensor *xa = i32_row(3, (int32_t[]){0, 0, 0}), *ya = i32_row(3, (int32_t[]){0, I, I});
  slapo_tensor *xb = i32_row(3, (int32_t[]){1, 1, 1}), *yb = i32_row(3, (int32_t[]){0, 0, 0});
  slapo_tensor *xall = i32_row(6, (int32_t[]){0, 0, 0, 1, 1, 1});
  slapo_tensor *yall = i32_row(6, (int32_t[]){0, I, I, 0, 0, 0});
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  slapo_kernel_env envs[2] = {{1, 0, true}, {1, 1, true}};

  /* one batch */
  slapo_module_zero_grad(m);
  const slapo_tensor *one[2] = {xall, yall}, *out;
  assert_int_equal(slapo_step(r, 2, one, SLAPO_STEP_TRAIN, &envs[0], &out), SLAPO_OK);
  double want = *(const float *)slapo_tensor_data(out);
  assert_true(fabs(want - 1.25) < 1e-6);
  float g_one[4];
  memcpy(g_one, slapo_tensor_data(slapo_module_param(m, "table")->grad), sizeof g_one);

  /* two micro-batches */
  slapo_module_zero_grad(m);
  const slapo_tensor *micro[4] = {xa, ya, xb, yb};
  double loss;
  int64_t n_valid;
  assert_int_equal(slapo_train_accumulate(r, 2, micro, envs, &loss, &n_valid), SLAPO_OK);
  assert_int_equal(n_valid, 4);
  if (fabs(loss - 1.25) > 1e-6) fail_msg("step loss %.7f, want 1.25", loss);
  const float *g = slapo_tensor_data(slapo_module_param(m, "table")->grad);
  for (int i = 0; i < 4; i++)
    if (fabsf(g[i] - g_one[i]) > 1e-6f)
      fail_msg("grad[%d] %.7f, one batch %.7f", i, (double)g[i], (double)g_one[i]);

  /* every target ignored: loss and gradients 0 */
  slapo_module_zero_grad(m);
  slapo_tensor *yi = i32_row(3, (int32_t[]){I, I, I});
  const slapo_tensor *none[4] = {xa, yi, xb, yi};
  assert_int_equal(slapo_train_accumulate(r, 2, none, envs, &loss, &n_valid), SLAPO_OK);
  assert_int_equal(n_valid, 0);
  assert_true(loss == 0.0);
  for (int i = 0; i < 4; i++) assert_true(g[i] == 0.0f);
  assert_int_equal(slapo_train_accumulate(r, 0, none, envs, &loss, NULL), SLAPO_INVALID_ARG);

  slapo_tensor *ts[] = {xa, ya, xb, yb, xall, yall, yi};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) slapo_tensor_free(ts[i]);
  slapo_runner_free(r);
  slapo_module_free(m);
}

static void set_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  float v = *(const float *)ud, *g = slapo_tensor_data(p->grad);
  for (int64_t i = 0; i < slapo_tensor_numel(p->grad); i++) g[i] = v;
}

/* slapo_train_accumulate writes the grads (whatever they held, NaN here;
 * the tied wte's gradient scattered in place into lm_head's, written
 * straight into the grad) and measures their norm: bitwise the gradients of
 * zero_grad + slapo_step, the norm slapo_clip_grad_norm's to rounding; an
 * unused parameter's grad is zeroed; without a measured step the runner
 * says so and slapo_train_grad_norm falls back to the pass. */
static void test_accumulate_writes_and_measures(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *m = new_model(&c, 5);
  int64_t es[1] = {7};
  assert_int_equal(slapo_module_add_param(m, "unused", 1, es, SLAPO_INIT_ZEROS, 0), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 5), SLAPO_OK);
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  enum { B = 2, T = 8 };
  slapo_tensor *x = i32_2d(B, T), *y = i32_2d(B, T);
  for (int i = 0; i < B * T; i++)
    ((int32_t *)slapo_tensor_data(x))[i] = (i * 37) % 256,
    ((int32_t *)slapo_tensor_data(y))[i] = (i * 11 + 3) % 256;
  const slapo_tensor *in[2] = {x, y}, *out;
  slapo_kernel_env env = {1, 0, true};
  slapo_module_zero_grad(m);
  assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, &out), SLAPO_OK);
  double want_norm = slapo_clip_grad_norm(m, 0), rep, sh;
  assert_int_equal(slapo_runner_grad_sumsq(r, &rep, &sh), SLAPO_STATE);
  assert_true(fabs(slapo_train_grad_norm(r, m) - want_norm) == 0); /* the pass itself */
  grad_snap want = {0};
  assert_int_equal(slapo_module_visit_params(m, snap, &want), SLAPO_OK);

  float nan = NAN;
  assert_int_equal(slapo_module_visit_params(m, set_grad, &nan), SLAPO_OK);
  double loss;
  assert_int_equal(slapo_train_accumulate(r, 1, in, &env, &loss, NULL), SLAPO_OK);
  grad_snap got = {0};
  assert_int_equal(slapo_module_visit_params(m, snap, &got), SLAPO_OK);
  assert_int_equal(got.n, want.n);
  for (int i = 0; i < got.n; i++) {
    const float *a = slapo_tensor_data(got.g[i]), *b = slapo_tensor_data(want.g[i]);
    for (int64_t k = 0; k < slapo_tensor_numel(got.g[i]); k++)
      if (!(a[k] == b[k])) fail_msg("grad %d[%lld]: %g, want %g", i, (long long)k, a[k], b[k]);
  }
  const float *unused = slapo_tensor_data(slapo_module_param(m, "unused")->grad);
  for (int k = 0; k < 7; k++) assert_true(unused[k] == 0.0f);
  assert_int_equal(slapo_runner_grad_sumsq(r, &rep, &sh), SLAPO_OK);
  assert_true(sh == 0.0);
  double norm = slapo_train_grad_norm(r, m);
  if (!(fabs(norm - want_norm) <= 1e-12 * want_norm))
    fail_msg("measured norm %.17g, pass %.17g", norm, want_norm);
  for (int i = 0; i < got.n; i++) slapo_tensor_free(got.g[i]), slapo_tensor_free(want.g[i]);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
  slapo_runner_free(r);
  slapo_module_free(m);
}

/* The estimate plans the same graphs the run plans: its train and eval
 * peaks on a meta model equal the peaks of real steps on the materialized
 * one, and the state terms are four f32 copies of the parameters. */
static void test_memory_estimate_matches_plan(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny_cfg();
  slapo_module *meta;
  assert_int_equal(slapo_gpt2_new(&c, &meta), SLAPO_OK);
  slapo_memory_estimate e;
  assert_int_equal(slapo_memory_estimate_train(meta, 2, 16, 16, false, &e), SLAPO_OK);
  size_t n = (size_t)slapo_module_numel(meta);
  assert_int_equal(e.weights, 4 * n);
  assert_int_equal(e.optimizer, 8 * n);
  assert_true(e.activations >= e.train_activations + e.eval_activations);
  assert_true(slapo_tensor_is_meta(param_at(meta, "transformer.wte", "weight")->value));
  slapo_module *m = new_model(&c, 1);
  slapo_runner *r;
  assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
  int64_t sh[2] = {2, 16};
  slapo_tensor *x, *y;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &x), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, sh, &y), SLAPO_OK);
  const slapo_tensor *in[2] = {x, y}, *out;
  slapo_kernel_env env = {1, 0, true};
  assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, &out), SLAPO_OK);
  assert_int_equal(slapo_runner_peak_nbytes(r), e.train_activations);
  assert_int_equal(slapo_step(r, 2, in, SLAPO_STEP_EVAL, &env, &out), SLAPO_OK);
  assert_int_equal(slapo_runner_peak_nbytes(r), e.eval_activations);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
  slapo_runner_free(r);
  slapo_module_free(m);
  slapo_module_free(meta);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lr_schedule),         cmocka_unit_test(test_clip_grad_norm),
      cmocka_unit_test(test_adamw_closed_form),   cmocka_unit_test(test_adamw_save_load),
      cmocka_unit_test(test_load_warns_unused),
      cmocka_unit_test(test_load_checks_before_copying),
      cmocka_unit_test(test_adamw_load_mismatch), cmocka_unit_test(test_dataset_text),
      cmocka_unit_test(test_dataset_llmc),        cmocka_unit_test(test_dataset_errors),
      cmocka_unit_test(test_dataset_directory),   cmocka_unit_test(test_dataset_batch),
      cmocka_unit_test(test_grad_accumulation),   cmocka_unit_test(test_sample),
      cmocka_unit_test(test_accumulate_by_valid_tokens),
      cmocka_unit_test(test_accumulate_writes_and_measures),
      cmocka_unit_test(test_memory_estimate_matches_plan),
      cmocka_unit_test(test_sample_kv_cache),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
