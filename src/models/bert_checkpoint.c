/* models/bert_checkpoint.c - BERT weights from and to Hugging Face
 * safetensors files. BERT uses nn.Linear, so nothing is transposed; the
 * decoder's weight and bias are tied (to the word embeddings and to
 * cls.predictions.bias) and omitted on save, as save_pretrained does, and
 * accepted on load only when equal to what they are tied to. Names follow
 * BertForMaskedLM; BertModel files lack the "bert." prefix and files
 * converted from the TensorFlow release name LayerNorm's parameters
 * gamma/beta. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/models.h"

/* The names a parameter may have in a Hugging Face file, most likely
 * first: the path, without "bert.", and each with LayerNorm's old names. */
static int candidates(const char *path, char out[4][512]) {
  int n = 0;
  const char *bases[2] = {path, !strncmp(path, "bert.", 5) ? path + 5 : NULL};
  for (int i = 0; i < 2; i++) {
    if (!bases[i]) continue;
    snprintf(out[n++], 512, "%s", bases[i]);
    size_t len = strlen(bases[i]);
    static const char *const now[2] = {"LayerNorm.weight", "LayerNorm.bias"};
    static const char *const old[2] = {"LayerNorm.gamma", "LayerNorm.beta"};
    for (int k = 0; k < 2; k++) {
      size_t kl = strlen(now[k]);
      if (len >= kl && !strcmp(bases[i] + len - kl, now[k]))
        snprintf(out[n++], 512, "%.*s%s", (int)(len - kl), bases[i], old[k]);
    }
  }
  return n;
}

/* The file's name for `path`, or NULL (into buf). */
static const char *find_name(const slapo_safetensors *f, const char *path, char *buf) {
  char names[4][512];
  int n = candidates(path, names);
  for (int i = 0; i < n; i++) {
    slapo_tensor *meta = NULL;
    if (slapo_safetensors_meta(f, names[i], &meta) == SLAPO_OK) {
      slapo_tensor_free(meta);
      memcpy(buf, names[i], 512);
      return buf;
    }
  }
  slapo_error_clear();
  return NULL;
}

typedef struct load_state {
  const slapo_safetensors *f;
  const char *file;
  slapo_status status;
} load_state;

static void load_one(slapo_parameter *p, const char *path, void *ud) {
  load_state *st = ud;
  if (st->status != SLAPO_OK) return;
  char buf[512];
  const char *name = find_name(st->f, path, buf);
  if (!name) {
    st->status = slapo_error(SLAPO_NOT_FOUND, "bert load: %s: no tensor '%s'", st->file, path);
    return;
  }
  slapo_tensor *t = NULL, *f32 = NULL;
  slapo_status s = slapo_safetensors_get(st->f, name, &t);
  const slapo_tensor *v = p->value;
  if (s == SLAPO_OK && !slapo_shape_equal(t->ndim, t->shape, v->ndim, v->shape)) {
    char a[96], b[96];
    s = slapo_error(SLAPO_SHAPE, "bert load: %s: tensor '%s' has shape %s, the model's %s is %s",
                    st->file, name, slapo_shape_str(t->ndim, t->shape, a, sizeof a), path,
                    slapo_shape_str(v->ndim, v->shape, b, sizeof b));
  }
  if (s == SLAPO_OK && t->dtype != SLAPO_DTYPE_F32)
    s = slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &f32);
  if (s == SLAPO_OK) s = slapo_tensor_copy(p->value, f32 ? f32 : t);
  if (s != SLAPO_OK) st->status = s;
  slapo_tensor_free(f32);
  slapo_tensor_free(t);
}

/* A tied tensor the file may hold (`tied`, e.g. the decoder weight) must
 * equal the one the model keeps (`kept`); checked before anything is
 * copied, as loading would silently drop one of two different matrices. */
static slapo_status check_tied(const slapo_safetensors *f, const char *file, const char *tied,
                               const char *kept_path) {
  slapo_tensor *a = NULL, *b = NULL, *a32 = NULL, *b32 = NULL;
  if (slapo_safetensors_get(f, tied, &a) != SLAPO_OK) {
    slapo_error_clear();
    return SLAPO_OK; /* omitted, as save_pretrained does */
  }
  char buf[512];
  const char *kept = find_name(f, kept_path, buf);
  slapo_status s = SLAPO_OK;
  if (kept && (s = slapo_safetensors_get(f, kept, &b)) == SLAPO_OK) {
    char x[96], y[96];
    if (!slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape)) {
      s = slapo_error(SLAPO_SHAPE, "bert load: %s: %s %s differs in shape from %s %s, but the "
                      "model ties them", file, tied, slapo_shape_str(a->ndim, a->shape, x, sizeof x),
                      kept, slapo_shape_str(b->ndim, b->shape, y, sizeof y));
    } else if ((s = slapo_tensor_to_dtype(a, SLAPO_DTYPE_F32, &a32)) == SLAPO_OK &&
               (s = slapo_tensor_to_dtype(b, SLAPO_DTYPE_F32, &b32)) == SLAPO_OK) {
      const float *p = slapo_tensor_data(a32), *q = slapo_tensor_data(b32);
      double worst = 0;
      int64_t at = 0, n = slapo_tensor_numel(a32);
      for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)p[i] - (double)q[i]);
        if (d > worst || d != d) worst = d, at = i;
      }
      if (worst != 0)
        s = slapo_error(SLAPO_PRECOND, "bert load: %s: %s differs from %s (largest difference "
                        "%.6g at element %lld), but the model ties them; an untied decoder "
                        "cannot be loaded without losing one of them", file, tied, kept, worst,
                        (long long)at);
    }
  }
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  slapo_tensor_free(a32);
  slapo_tensor_free(b32);
  return s;
}

static void unmaterialized(slapo_parameter *p, const char *path, void *ud) {
  if (slapo_tensor_is_meta(p->value) && !*(const char **)ud) *(const char **)ud = path;
}

slapo_status slapo_bert_load(slapo_module *model, const char *path) {
  const char *meta_path = NULL;
  SLAPO_TRY(slapo_module_visit_params(model, unmaterialized, &meta_path));
  if (meta_path)
    return slapo_error(SLAPO_STATE, "bert load: parameter %s is not materialized", meta_path);
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read(path, &f));
  slapo_status s = check_tied(f, path, "cls.predictions.decoder.weight",
                              "bert.embeddings.word_embeddings.weight");
  if (s == SLAPO_OK)
    s = check_tied(f, path, "cls.predictions.decoder.bias", "cls.predictions.bias");
  load_state st = {f, path, SLAPO_OK};
  if (s == SLAPO_OK) s = slapo_module_visit_params(model, load_one, &st);
  slapo_safetensors_free(f);
  if (s == SLAPO_OK) s = st.status;
  if (s == SLAPO_OK) slapo_module_touch(model);
  return s;
}

typedef struct save_state {
  int n, cap;
  char **names;
  slapo_tensor **tensors;
  slapo_status status;
} save_state;

/* Tied parameters are visited once, at their first path: the decoder's
 * weight and bias come after the word embeddings and cls.predictions.bias,
 * so they are not written. */
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
      st->status = slapo_error(SLAPO_NOMEM, "bert save: out of memory");
      return;
    }
    st->cap = cap;
  }
  slapo_tensor *view = NULL;
  slapo_status s = slapo_tensor_view(p->value, &view);
  char *name = s == SLAPO_OK ? slapo_strdup(path) : NULL;
  if (!name) {
    slapo_tensor_free(view);
    st->status = s != SLAPO_OK ? s : slapo_error(SLAPO_NOMEM, "bert save: out of memory");
    return;
  }
  st->names[st->n] = name;
  st->tensors[st->n++] = view;
}

slapo_status slapo_bert_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values) {
  if (n_meta < 0 || n_meta > 15)
    return slapo_error(SLAPO_INVALID_ARG, "bert save: %d metadata pairs (at most 15)", n_meta);
  save_state st = {0};
  slapo_status s = slapo_module_visit_params(model, save_one, &st);
  if (s == SLAPO_OK) s = st.status;
  const char *mk[16], *mv[16];
  int nm = 0;
  mk[nm] = "format", mv[nm++] = "pt";
  for (int i = 0; i < n_meta; i++) mk[nm] = keys[i], mv[nm++] = values[i];
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
