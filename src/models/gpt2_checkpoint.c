/* models/gpt2_checkpoint.c - GPT-2 weights from and to Hugging Face
 * safetensors files. Hugging Face's GPT-2 uses Conv1D layers whose weights
 * are stored [in, out] (transposed relative to nn.Linear), so those four
 * weights per block are transposed on the way in and out; lm_head is tied to
 * wte and omitted, as save_pretrained does. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/models.h"

bool slapo_gpt2_is_conv1d_weight(const char *path) {
  static const char *const suffixes[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                         ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
  size_t n = strlen(path);
  for (size_t i = 0; i < SLAPO_ARRAY_LEN(suffixes); i++) {
    size_t k = strlen(suffixes[i]);
    if (n >= k && !strcmp(path + n - k, suffixes[i])) return true;
  }
  return false;
}

typedef struct load_state {
  const slapo_safetensors *f;
  const char *file;
  slapo_status status;
} load_state;

static void load_one(slapo_parameter *p, const char *path, void *ud) {
  load_state *st = ud;
  if (st->status != SLAPO_OK) return;
  /* Hugging Face files name GPT2Model's tensors with or without the
   * "transformer." prefix depending on which class saved them. */
  const char *name = path;
  slapo_tensor *meta = NULL, *t = NULL, *f32 = NULL, *view = NULL;
  if (slapo_safetensors_meta(st->f, name, &meta) != SLAPO_OK &&
      !strncmp(path, "transformer.", 12)) {
    name = path + 12;
    if (slapo_safetensors_meta(st->f, name, &meta) != SLAPO_OK) name = NULL;
  }
  if (!name || !meta) {
    st->status = slapo_error(SLAPO_NOT_FOUND, "gpt2 load: %s: no tensor '%s'", st->file, path);
    return;
  }
  bool conv = slapo_gpt2_is_conv1d_weight(path);
  const slapo_tensor *v = p->value;
  int64_t want[2] = {v->ndim == 2 && conv ? v->shape[1] : v->shape[0],
                     v->ndim == 2 && conv ? v->shape[0] : (v->ndim > 1 ? v->shape[1] : 0)};
  const int64_t *want_shape = conv ? want : v->shape;
  if (!slapo_shape_equal(meta->ndim, meta->shape, v->ndim, want_shape)) {
    char a[96], b[96];
    st->status = slapo_error(
        SLAPO_SHAPE, "gpt2 load: %s: tensor '%s' has shape %s, the model expects %s%s", st->file,
        name, slapo_shape_str(meta->ndim, meta->shape, a, sizeof a),
        slapo_shape_str(v->ndim, want_shape, b, sizeof b),
        conv ? " (Conv1D layout [in, out])" : "");
    slapo_tensor_free(meta);
    return;
  }
  slapo_tensor_free(meta);
  slapo_status s = slapo_safetensors_get(st->f, name, &t);
  if (s == SLAPO_OK && t->dtype != SLAPO_DTYPE_F32) s = slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &f32);
  const slapo_tensor *src = f32 ? f32 : t;
  if (s == SLAPO_OK && conv) {
    int perm[2] = {1, 0};
    s = slapo_tensor_permute(src, perm, &view);
    src = view;
  }
  if (s == SLAPO_OK) s = slapo_tensor_copy(p->value, src);
  if (s != SLAPO_OK) st->status = s;
  slapo_tensor_free(view);
  slapo_tensor_free(f32);
  slapo_tensor_free(t);
}

static void unmaterialized(slapo_parameter *p, const char *path, void *ud) {
  if (slapo_tensor_is_meta(p->value) && !*(const char **)ud) *(const char **)ud = path;
}

/* The model ties lm_head.weight to transformer.wte.weight, so a file whose
 * lm_head.weight is a different matrix cannot be loaded without losing one
 * of the two; checked before anything is copied. */
static slapo_status check_tied_head(const slapo_safetensors *f, const char *file) {
  const char *wte_name = "transformer.wte.weight";
  slapo_tensor *head = NULL, *wte = NULL;
  if (slapo_safetensors_get(f, "lm_head.weight", &head) != SLAPO_OK) {
    slapo_error_clear();
    return SLAPO_OK; /* omitted, as save_pretrained does for a tied head */
  }
  if (slapo_safetensors_get(f, wte_name, &wte) != SLAPO_OK) {
    wte_name = "wte.weight";
    if (slapo_safetensors_get(f, wte_name, &wte) != SLAPO_OK) wte = NULL;
  }
  slapo_status s = SLAPO_OK;
  if (wte) {
    char a[96], b[96];
    slapo_tensor *h32 = NULL, *w32 = NULL;
    if (!slapo_shape_equal(head->ndim, head->shape, wte->ndim, wte->shape)) {
      s = slapo_error(SLAPO_SHAPE, "gpt2 load: %s: lm_head.weight %s differs in shape from %s %s, "
                      "but the model ties them", file,
                      slapo_shape_str(head->ndim, head->shape, a, sizeof a), wte_name,
                      slapo_shape_str(wte->ndim, wte->shape, b, sizeof b));
    } else if ((s = slapo_tensor_to_dtype(head, SLAPO_DTYPE_F32, &h32)) == SLAPO_OK &&
               (s = slapo_tensor_to_dtype(wte, SLAPO_DTYPE_F32, &w32)) == SLAPO_OK) {
      const float *x = slapo_tensor_data(h32), *y = slapo_tensor_data(w32);
      double worst = 0;
      int64_t at = 0, n = slapo_tensor_numel(h32);
      for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (d > worst || d != d) worst = d, at = i;
      }
      if (worst != 0)
        s = slapo_error(SLAPO_PRECOND, "gpt2 load: %s: lm_head.weight differs from %s (largest "
                        "difference %.6g at element %lld), but the model ties lm_head to wte; "
                        "an untied head cannot be loaded without losing one of them", file,
                        wte_name, worst, (long long)at);
    }
    slapo_tensor_free(h32);
    slapo_tensor_free(w32);
  }
  slapo_tensor_free(head);
  slapo_tensor_free(wte);
  return s;
}

slapo_status slapo_gpt2_load(slapo_module *model, const char *path) {
  const char *meta_path = NULL;
  SLAPO_TRY(slapo_module_visit_params(model, unmaterialized, &meta_path));
  if (meta_path)
    return slapo_error(SLAPO_STATE, "gpt2 load: parameter %s is not materialized", meta_path);
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read(path, &f));
  slapo_status s = check_tied_head(f, path);
  if (s != SLAPO_OK) {
    slapo_safetensors_free(f);
    return s;
  }
  load_state st = {f, path, SLAPO_OK};
  s = slapo_module_visit_params(model, load_one, &st);
  slapo_safetensors_free(f);
  return s != SLAPO_OK ? s : st.status;
}

typedef struct save_state {
  int n, cap;
  char **names;
  slapo_tensor **tensors;
  slapo_status status;
} save_state;

static void save_one(slapo_parameter *p, const char *path, void *ud) {
  save_state *st = ud;
  if (st->status != SLAPO_OK) return;
  if (st->n == st->cap) {
    int cap = st->cap ? 2 * st->cap : 64;
    char **n = slapo_realloc(st->names, (size_t)cap * sizeof *n);
    if (n) st->names = n;
    slapo_tensor **t = slapo_realloc(st->tensors, (size_t)cap * sizeof *t);
    if (t) st->tensors = t;
    if (!n || !t) {
      st->status = slapo_error(SLAPO_NOMEM, "gpt2 save: out of memory");
      return;
    }
    st->cap = cap;
  }
  slapo_tensor *view = NULL;
  slapo_status s;
  if (slapo_gpt2_is_conv1d_weight(path)) {
    int perm[2] = {1, 0};
    s = slapo_tensor_permute(p->value, perm, &view);
  } else {
    s = slapo_tensor_view(p->value, &view);
  }
  char *name = s == SLAPO_OK ? slapo_strdup(path) : NULL;
  if (!name) {
    slapo_tensor_free(view);
    st->status = s != SLAPO_OK ? s : slapo_error(SLAPO_NOMEM, "gpt2 save: out of memory");
    return;
  }
  st->names[st->n] = name;
  st->tensors[st->n++] = view;
}

slapo_status slapo_gpt2_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values) {
  save_state st = {0};
  slapo_status s = slapo_module_visit_params(model, save_one, &st);
  if (s == SLAPO_OK) s = st.status;
  const char *mk[16], *mv[16];
  int nm = 0;
  mk[nm] = "format", mv[nm++] = "pt";
  for (int i = 0; i < n_meta && nm < 16; i++) mk[nm] = keys[i], mv[nm++] = values[i];
  if (s == SLAPO_OK)
    s = slapo_safetensors_write(path, st.n, (const char *const *)st.names,
                                (const slapo_tensor *const *)st.tensors, nm, mk, mv);
  for (int i = 0; i < st.n; i++) {
    slapo_free(st.names[i]);
    slapo_tensor_free(st.tensors[i]);
  }
  slapo_free(st.names);
  slapo_free(st.tensors);
  return s;
}
