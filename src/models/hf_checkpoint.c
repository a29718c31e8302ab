/* models/hf_checkpoint.c - model parameters from and to Hugging Face
 * safetensors files, for every family: a tensor per parameter, named by the
 * parameter's path (the families use Hugging Face's names), converted to f32
 * on the way in, optionally stored transposed (GPT-2's Conv1D weights), and
 * a tied output head omitted on the way out, as save_pretrained does. What
 * differs between families is a slapo__hf_layout. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

typedef struct load_state {
  const slapo_safetensors *f;
  const char *file;
  const slapo__hf_layout *layout;
  slapo_status status;
} load_state;

/* The file's name for the parameter at `path`: the path itself, or without
 * the layout's optional prefix (GPT-2 files name GPT2Model's tensors with or
 * without "transformer." depending on which class saved them). NULL when
 * neither is in the file; *meta then NULL. */
static const char *file_name(const load_state *st, const char *path, slapo_tensor **meta) {
  if (slapo_safetensors_meta(st->f, path, meta) == SLAPO_OK) return path;
  const char *pre = st->layout->optional_prefix;
  size_t n = pre ? strlen(pre) : 0;
  if (n && !strncmp(path, pre, n) && slapo_safetensors_meta(st->f, path + n, meta) == SLAPO_OK)
    return path + n;
  slapo_error_clear();
  *meta = NULL;
  return NULL;
}

static bool transposed(const slapo__hf_layout *l, const char *path) {
  return l->transposed && l->transposed(path);
}

/* Shape check before anything is read: the file's shape is the parameter's,
 * reversed for a transposed 2-d weight. */
static slapo_status check_shape(const load_state *st, const char *name, const char *path,
                                const slapo_tensor *meta, const slapo_tensor *v) {
  bool tr = transposed(st->layout, path) && v->ndim == 2;
  int64_t rev[2] = {tr ? v->shape[1] : 0, tr ? v->shape[0] : 0};
  const int64_t *want = tr ? rev : v->shape;
  if (slapo_shape_equal(meta->ndim, meta->shape, v->ndim, want)) return SLAPO_OK;
  char a[96], b[96];
  return slapo_error(SLAPO_SHAPE, "%s load: %s: tensor '%s' has shape %s, the model expects %s%s",
                     st->layout->family, st->file, name,
                     slapo_shape_str(meta->ndim, meta->shape, a, sizeof a),
                     slapo_shape_str(v->ndim, want, b, sizeof b),
                     tr ? " (stored transposed, [in, out])" : "");
}

static void load_one(slapo_parameter *p, const char *path, void *ud) {
  load_state *st = ud;
  if (st->status != SLAPO_OK) return;
  slapo_tensor *meta = NULL, *t = NULL, *f32 = NULL, *view = NULL;
  const char *name = file_name(st, path, &meta);
  if (!name) {
    st->status = slapo_error(SLAPO_NOT_FOUND, "%s load: %s: no tensor '%s'", st->layout->family,
                             st->file, path);
    return;
  }
  slapo_status s = check_shape(st, name, path, meta, p->value);
  slapo_tensor_free(meta);
  if (s == SLAPO_OK) s = slapo_safetensors_get(st->f, name, &t);
  if (s == SLAPO_OK && t->dtype != SLAPO_DTYPE_F32) s = slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &f32);
  const slapo_tensor *src = f32 ? f32 : t;
  if (s == SLAPO_OK && transposed(st->layout, path) && p->value->ndim == 2) {
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

/* Largest |a - b| over two same-shape tensors (any dtype), and where. */
static slapo_status max_diff(const slapo_tensor *a, const slapo_tensor *b, double *worst,
                             int64_t *at) {
  slapo_tensor *a32 = NULL, *b32 = NULL;
  slapo_status s = slapo_tensor_to_dtype(a, SLAPO_DTYPE_F32, &a32);
  if (s == SLAPO_OK) s = slapo_tensor_to_dtype(b, SLAPO_DTYPE_F32, &b32);
  *worst = 0, *at = 0;
  if (s == SLAPO_OK) {
    const float *x = slapo_tensor_data(a32), *y = slapo_tensor_data(b32);
    for (int64_t i = 0, n = slapo_tensor_numel(a32); i < n; i++) {
      double d = fabs((double)x[i] - (double)y[i]);
      if (d > *worst || d != d) *worst = d, *at = i;
    }
  }
  slapo_tensor_free(a32);
  slapo_tensor_free(b32);
  return s;
}

/* A model whose head is tied to its embedding cannot load a file whose head
 * is a different matrix without losing one of the two; checked before
 * anything is copied. A file without the head (save_pretrained omits a tied
 * one) is fine. */
static slapo_status check_tied_head(const load_state *st) {
  const slapo__hf_layout *l = st->layout;
  slapo_tensor *head = NULL, *emb = NULL, *meta = NULL;
  if (!l->head || slapo_safetensors_get(st->f, l->head, &head) != SLAPO_OK) {
    slapo_error_clear();
    return SLAPO_OK;
  }
  const char *emb_name = file_name(st, l->embedding, &meta);
  slapo_tensor_free(meta);
  slapo_status s = emb_name ? slapo_safetensors_get(st->f, emb_name, &emb) : SLAPO_OK;
  char a[96], b[96];
  if (s == SLAPO_OK && emb && !slapo_shape_equal(head->ndim, head->shape, emb->ndim, emb->shape)) {
    s = slapo_error(SLAPO_SHAPE, "%s load: %s: %s %s differs in shape from %s %s, but the model "
                    "ties them", l->family, st->file, l->head,
                    slapo_shape_str(head->ndim, head->shape, a, sizeof a), emb_name,
                    slapo_shape_str(emb->ndim, emb->shape, b, sizeof b));
  } else if (s == SLAPO_OK && emb) {
    double worst;
    int64_t at;
    s = max_diff(head, emb, &worst, &at);
    if (s == SLAPO_OK && worst != 0)
      s = slapo_error(SLAPO_PRECOND, "%s load: %s: %s differs from %s (largest difference %.6g "
                      "at element %lld), but the model ties them; an untied head cannot be "
                      "loaded without losing one of them", l->family, st->file, l->head,
                      emb_name, worst, (long long)at);
  }
  slapo_tensor_free(head);
  slapo_tensor_free(emb);
  return s;
}

/* The parameter object at a dotted path ("lm_head.weight"), or NULL. */
static slapo_parameter *param_at(slapo_module *m, const char *path) {
  const char *dot = strrchr(path, '.');
  char mod[256];
  if (!dot || (size_t)(dot - path) >= sizeof mod) return NULL;
  memcpy(mod, path, (size_t)(dot - path));
  mod[dot - path] = '\0';
  slapo_module *owner = NULL;
  if (slapo_module_at(m, mod, &owner) != SLAPO_OK) {
    slapo_error_clear();
    return NULL;
  }
  return slapo_module_param(owner, dot + 1);
}

static bool head_tied(slapo_module *m, const slapo__hf_layout *l) {
  slapo_parameter *h = l->head ? param_at(m, l->head) : NULL;
  return h && h == param_at(m, l->embedding);
}

slapo_status slapo__hf_load(slapo_module *model, const char *path, const slapo__hf_layout *l) {
  const char *meta_path = NULL;
  SLAPO_TRY(slapo_module_visit_params(model, unmaterialized, &meta_path));
  if (meta_path)
    return slapo_error(SLAPO_STATE, "%s load: parameter %s is not materialized", l->family,
                       meta_path);
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read(path, &f));
  load_state st = {f, path, l, SLAPO_OK};
  slapo_status s = head_tied(model, l) ? check_tied_head(&st) : SLAPO_OK;
  if (s == SLAPO_OK) s = slapo_module_visit_params(model, load_one, &st);
  slapo_safetensors_free(f);
  return s != SLAPO_OK ? s : st.status;
}

typedef struct save_state {
  int n, cap;
  char **names;
  slapo_tensor **tensors;
  const slapo__hf_layout *layout;
  slapo_status status;
} save_state;

static bool save_grow(save_state *st) {
  if (st->n < st->cap) return true;
  int cap = st->cap ? 2 * st->cap : 64;
  char **n = slapo_realloc(st->names, (size_t)cap * sizeof *n);
  if (n) st->names = n;
  slapo_tensor **t = slapo_realloc(st->tensors, (size_t)cap * sizeof *t);
  if (t) st->tensors = t;
  if (!n || !t) return false;
  st->cap = cap;
  return true;
}

/* Visited once per parameter object, under its first path: a tied head
 * (visited as the embedding) is omitted, as save_pretrained does. */
static void save_one(slapo_parameter *p, const char *path, void *ud) {
  save_state *st = ud;
  if (st->status != SLAPO_OK) return;
  if (!save_grow(st)) {
    st->status = slapo_error(SLAPO_NOMEM, "%s save: out of memory", st->layout->family);
    return;
  }
  slapo_tensor *view = NULL;
  slapo_status s;
  if (transposed(st->layout, path) && p->value->ndim == 2) {
    int perm[2] = {1, 0};
    s = slapo_tensor_permute(p->value, perm, &view);
  } else {
    s = slapo_tensor_view(p->value, &view);
  }
  char *name = s == SLAPO_OK ? slapo_strdup(path) : NULL;
  if (!name) {
    slapo_tensor_free(view);
    st->status = s != SLAPO_OK ? s : slapo_error(SLAPO_NOMEM, "%s save: out of memory",
                                                 st->layout->family);
    return;
  }
  st->names[st->n] = name;
  st->tensors[st->n++] = view;
}

slapo_status slapo__hf_save(slapo_module *model, const char *path, const slapo__hf_layout *l,
                            int n_meta, const char *const *keys, const char *const *values) {
  save_state st = {.layout = l};
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
