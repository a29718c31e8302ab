/* models/hf_checkpoint.c - model parameters from and to Hugging Face
 * safetensors files, for every family: a tensor per parameter, named by the
 * parameter's path (the families use Hugging Face's names), converted to f32
 * on the way in, optionally stored transposed (GPT-2's Conv1D weights), and
 * a tied output head omitted on the way out, as save_pretrained does. What
 * differs between families is a slapo__hf_layout. Layer: models. */
#include <ctype.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"
#include "slapo/dist.h"

typedef struct load_state {
  const slapo_safetensors *f;
  const char *file;
  const slapo__hf_layout *layout;
  bool *used; /* [slapo_safetensors_count(f)]: the tensors read (or checked) */
  slapo_status status;
} load_state;

/* Marks the file's tensor `name` as read; names are in strcmp order. */
static void mark_used(const load_state *st, const char *name) {
  int lo = 0, hi = slapo_safetensors_count(st->f) - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(name, slapo_safetensors_name(st->f, mid));
    if (c == 0) {
      st->used[mid] = true;
      return;
    }
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
}

/* The names the parameter at `path` may have in a file, most likely first:
 * the path, without the layout's optional prefix (GPT-2 files name
 * GPT2Model's tensors with or without "transformer." depending on the class
 * that saved them), and each with its older component names. */
enum { MAX_NAMES = 8, NAME_CAP = 512 };
static int candidates(const slapo__hf_layout *l, const char *path, char out[MAX_NAMES][NAME_CAP]) {
  int n = 0;
  size_t np = l->optional_prefix ? strlen(l->optional_prefix) : 0;
  const char *bases[2] = {path, np && !strncmp(path, l->optional_prefix, np) ? path + np : NULL};
  for (int i = 0; i < 2; i++) {
    if (!bases[i]) continue;
    snprintf(out[n++], NAME_CAP, "%s", bases[i]);
    size_t len = strlen(bases[i]);
    for (int k = 0; l->renamed && l->renamed[k][0] && n < MAX_NAMES; k++) {
      size_t kl = strlen(l->renamed[k][0]);
      if (len >= kl && !strcmp(bases[i] + len - kl, l->renamed[k][0]))
        snprintf(out[n++], NAME_CAP, "%.*s%s", (int)(len - kl), bases[i], l->renamed[k][1]);
    }
  }
  return n;
}

/* The file's name for the parameter at `path` (into buf [NAME_CAP]) and its
 * metadata (*meta, owned). Errors: NOT_FOUND naming the parameter when the
 * file has none of its names (*meta then NULL), NOMEM. */
static slapo_status file_name(const load_state *st, const char *path, char *buf,
                              slapo_tensor **meta) {
  char names[MAX_NAMES][NAME_CAP];
  int n = candidates(st->layout, path, names);
  *meta = NULL;
  for (int i = 0; i < n; i++) {
    slapo_status s = slapo_safetensors_meta(st->f, names[i], meta);
    if (s == SLAPO_OK) {
      mark_used(st, names[i]);
      memcpy(buf, names[i], NAME_CAP);
      return SLAPO_OK;
    }
    if (s != SLAPO_NOT_FOUND) return s;
  }
  return slapo_error(SLAPO_NOT_FOUND, "%s load: %s: no tensor '%s'", st->layout->family, st->file,
                     path);
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

/* The file's name for parameter p (into buf [NAME_CAP]), after checking
 * that the file has it with p's shape (a sharded parameter's unsharded
 * shape: it loads its piece, so a run resumes at any tensor-parallel size). */
static slapo_status lookup(const load_state *st, const slapo_parameter *p, const char *path,
                           char *buf) {
  slapo_tensor *meta = NULL, *full_meta = NULL;
  slapo_status s = file_name(st, path, buf, &meta);
  const slapo_tensor *want = p->value;
  if (s == SLAPO_OK && p->shard) {
    int64_t orig[SLAPO_MAX_DIMS];
    slapo_shard_orig_shape(p->shard, orig);
    s = slapo_tensor_new_meta(SLAPO_DTYPE_F32, p->shard->ndim, orig, &full_meta);
    want = full_meta;
  }
  if (s == SLAPO_OK) s = check_shape(st, buf, path, meta, want);
  slapo_tensor_free(meta);
  slapo_tensor_free(full_meta);
  return s;
}

/* The first pass: every parameter present with its shape, before any is
 * overwritten, so a wrong file leaves the model as it was. */
static void check_one(slapo_parameter *p, const char *path, void *ud) {
  load_state *st = ud;
  char buf[NAME_CAP];
  if (st->status == SLAPO_OK) st->status = lookup(st, p, path, buf);
}

static void load_one(slapo_parameter *p, const char *path, void *ud) {
  load_state *st = ud;
  /* Not materialized here: another pipeline stage's parameter, which the
   * rank holding it loads (its presence and shape checked above). */
  if (st->status != SLAPO_OK || slapo_tensor_is_meta(p->value)) return;
  slapo_tensor *t = NULL, *f32 = NULL, *view = NULL, *piece = NULL;
  char name[NAME_CAP];
  slapo_status s = lookup(st, p, path, name);
  if (s == SLAPO_OK) s = slapo_safetensors_get(st->f, name, &t);
  if (s == SLAPO_OK && t->dtype != SLAPO_DTYPE_F32) s = slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &f32);
  const slapo_tensor *src = f32 ? f32 : t;
  if (s == SLAPO_OK && transposed(st->layout, path) && p->value->ndim == 2) {
    int perm[2] = {1, 0};
    s = slapo_tensor_permute(src, perm, &view);
    src = view;
  }
  if (s == SLAPO_OK && p->shard) {
    s = slapo_shard_slice(p->shard, src, &piece);
    src = piece;
  }
  if (s == SLAPO_OK) s = slapo_tensor_copy(p->value, src);
  if (s != SLAPO_OK) st->status = s;
  slapo_tensor_free(piece);
  slapo_tensor_free(view);
  slapo_tensor_free(f32);
  slapo_tensor_free(t);
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

/* A model that ties a tensor to another (a head to its embedding) cannot
 * load a file whose copy differs without losing one of the two; checked
 * before anything is copied. A file without the copy (save_pretrained omits
 * tied ones) is fine. */
static slapo_status check_tied(const load_state *st, const char *copy, const char *kept_path) {
  const slapo__hf_layout *l = st->layout;
  slapo_tensor *a = NULL, *b = NULL, *meta = NULL;
  slapo_status s = slapo_safetensors_get(st->f, copy, &a);
  if (s == SLAPO_NOT_FOUND) {
    slapo_error_clear();
    return SLAPO_OK;
  }
  SLAPO_TRY(s); /* out of memory is not an absent copy: the check must run */
  mark_used(st, copy); /* checked below: equal, or the load fails */
  char kept[NAME_CAP];
  s = file_name(st, kept_path, kept, &meta);
  slapo_tensor_free(meta);
  if (s == SLAPO_OK) s = slapo_safetensors_get(st->f, kept, &b);
  else if (s == SLAPO_NOT_FOUND) s = SLAPO_OK, slapo_error_clear(); /* the load names it */
  char x[96], y[96];
  if (s == SLAPO_OK && b && !slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape)) {
    s = slapo_error(SLAPO_SHAPE, "%s load: %s: %s %s differs in shape from %s %s, but the model "
                    "ties them", l->family, st->file, copy,
                    slapo_shape_str(a->ndim, a->shape, x, sizeof x), kept,
                    slapo_shape_str(b->ndim, b->shape, y, sizeof y));
  } else if (s == SLAPO_OK && b) {
    double worst;
    int64_t at;
    s = max_diff(a, b, &worst, &at);
    if (s == SLAPO_OK && worst != 0)
      s = slapo_error(SLAPO_PRECOND, "%s load: %s: %s differs from %s (largest difference %.6g "
                      "at element %lld), but the model ties them; an untied copy cannot be "
                      "loaded without losing one of them", l->family, st->file, copy, kept,
                      worst, (long long)at);
  }
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  return s;
}

/* Every tied pair the model does tie. */
static slapo_status check_tied_pairs(slapo_module *model, const load_state *st) {
  const char *const (*t)[2] = st->layout->tied;
  for (int i = 0; t && t[i][0]; i++) {
    slapo_parameter *p = slapo_module_param_at(model, t[i][0]);
    if (p && p == slapo_module_param_at(model, t[i][1])) SLAPO_TRY(check_tied(st, t[i][0], t[i][1]));
  }
  return SLAPO_OK;
}

/* ---- tensors the model did not read ----
 * Like Hugging Face's from_pretrained ("Some weights of the model
 * checkpoint were not used"), a load reads the tensors the model has and
 * warns about the rest, except buffers the layout names as ignored. A
 * file with more layers than the model (a 12-layer file into a 4-layer
 * config) is the likely mistake, so the warning names the layers. */

static bool ignored(const slapo__hf_layout *l, const char *name) {
  for (int i = 0; l->ignored && l->ignored[i]; i++)
    if (fnmatch(l->ignored[i], name, 0) == 0) return true;
  return false;
}

/* The first all-digit component of a dotted name ("h.4.mlp" -> 4, with
 * *plen the length of "h." before it); -1 when none. */
static long layer_of(const char *name, size_t *plen) {
  for (const char *c = name; *c; c = strchr(c, '.') ? strchr(c, '.') + 1 : c + strlen(c)) {
    size_t k = 0;
    while (isdigit((unsigned char)c[k])) k++;
    if (k > 0 && (c[k] == '.' || !c[k])) {
      *plen = (size_t)(c - name);
      return strtol(c, NULL, 10);
    }
  }
  return -1;
}

/* Appends " (layers P.A-P.B ...)" when unused tensors are in layers past
 * the last one read under the same prefix P. */
static void layer_hint(const load_state *st, char *buf, size_t cap) {
  const slapo_safetensors *f = st->f;
  char prefix[NAME_CAP] = "";
  long max_used = -1, max_file = -1;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < slapo_safetensors_count(f); i++) {
      const char *name = slapo_safetensors_name(f, i);
      size_t plen;
      long layer = layer_of(name, &plen);
      if (layer < 0 || (pass == 0) != st->used[i]) continue;
      if (pass == 0 && !prefix[0]) snprintf(prefix, sizeof prefix, "%.*s", (int)plen, name);
      if (strlen(prefix) != plen || strncmp(prefix, name, plen)) continue;
      if (pass == 0 && layer > max_used) max_used = layer;
      if (layer > max_file) max_file = layer;
    }
  if (prefix[0] && max_file > max_used)
    snprintf(buf + strlen(buf), cap - strlen(buf),
             "; the file has layers %s0-%ld, the model only %s0-%ld: is the config right?",
             prefix, max_file, prefix, max_used);
}

static void warn_unused(const load_state *st) {
  char list[640] = "";
  int n_unused = 0;
  for (int i = 0; i < slapo_safetensors_count(st->f); i++) {
    const char *name = slapo_safetensors_name(st->f, i);
    if (st->used[i] || ignored(st->layout, name)) continue;
    if (n_unused++ < 4)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", n_unused > 1 ? ", " : "",
               name);
  }
  if (!n_unused) return;
  if (n_unused > 4) snprintf(list + strlen(list), sizeof list - strlen(list), ", ...");
  layer_hint(st, list, sizeof list);
  slapo_logf(SLAPO_LOG_WARN, "%s load: %s: %d tensor%s of the file %s not used by the model: %s",
             st->layout->family, st->file, n_unused, n_unused == 1 ? "" : "s",
             n_unused == 1 ? "is" : "are", list);
}

static void count_materialized(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  *(int64_t *)ud += !slapo_tensor_is_meta(p->value);
}

slapo_status slapo__hf_load(slapo_module *model, const char *path, const slapo__hf_layout *l) {
  char what[64];
  snprintf(what, sizeof what, "%s load", l->family);
  /* A model with nothing materialized is a mistake; one materialized in
   * part is a pipeline rank's (slapo_pp_stage_materialize): it loads its
   * part. */
  int64_t n_materialized = 0;
  SLAPO_TRY(slapo_module_visit_params(model, count_materialized, &n_materialized));
  if (!n_materialized) SLAPO_TRY(slapo_module_check_materialized(model, what));
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read(path, &f));
  int n = slapo_safetensors_count(f);
  load_state st = {f, path, l, slapo_calloc((size_t)n + 1, sizeof(bool)), SLAPO_OK};
  slapo_status s = st.used ? check_tied_pairs(model, &st)
                           : slapo_error(SLAPO_NOMEM, "%s load: out of memory", l->family);
  if (s == SLAPO_OK) s = slapo_module_visit_params(model, check_one, &st);
  if (s == SLAPO_OK && (s = st.status) == SLAPO_OK)
    s = slapo_module_visit_params(model, load_one, &st);
  if (s == SLAPO_OK) s = st.status;
  if (s == SLAPO_OK && slapo_dist_rank(SLAPO_GROUP_WORLD) == 0) warn_unused(&st);
  slapo_free(st.used);
  slapo_safetensors_free(f);
  return s;
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

/* Visited once per parameter object, under its first path: a tied copy
 * (a head visited as its embedding) is omitted, as save_pretrained does. */
static void save_one(slapo_parameter *p, const char *path, void *ud) {
  save_state *st = ud;
  if (st->status != SLAPO_OK) return;
  if (!save_grow(st)) {
    st->status = slapo_error(SLAPO_NOMEM, "%s save: out of memory", st->layout->family);
    return;
  }
  slapo_tensor *view = NULL, *full = NULL;
  const slapo_tensor *value = p->value;
  slapo_status s = SLAPO_OK;
  /* A sharded parameter is saved gathered, in the unsharded layout, so the
   * file loads into any tensor-parallel size (every rank gathers; rank 0
   * writes). */
  if (slapo_parameter_is_sharded(p)) {
    s = slapo_dist_gather_shards((slapo_group)p->shard_group, p->shard, p->value, &full);
    value = full;
  }
  if (s == SLAPO_OK && transposed(st->layout, path) && value->ndim == 2) {
    int perm[2] = {1, 0};
    s = slapo_tensor_permute(value, perm, &view);
  } else if (s == SLAPO_OK) {
    s = slapo_tensor_view(value, &view);
  }
  slapo_tensor_free(full); /* the view holds the storage */
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
  if (n_meta < 0 || n_meta > 15)
    return slapo_error(SLAPO_INVALID_ARG, "%s save: %d metadata pairs (at most 15)", l->family,
                       n_meta);
  save_state st = {.layout = l};
  slapo_status s = slapo_module_visit_params(model, save_one, &st);
  if (s == SLAPO_OK) s = st.status;
  const char *mk[16], *mv[16];
  int nm = 0;
  mk[nm] = "format", mv[nm++] = "pt";
  for (int i = 0; i < n_meta; i++) mk[nm] = keys[i], mv[nm++] = values[i];
  if (s == SLAPO_OK && slapo_dist_rank(SLAPO_GROUP_WORLD) == 0)
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
