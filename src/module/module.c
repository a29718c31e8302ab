/* module/module.c - module instances: children, parameters (refcounted, so
 * tied weights share one value and one gradient), dotted paths, parameter
 * visiting, materialization of meta parameters, and the PyTorch-style repr.
 * Layer: module. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "module/internal.h"

slapo_status slapo_module_new(const slapo_module_type *type, void *config, slapo_module **out) {
  *out = NULL;
  slapo_module *m = slapo_calloc(1, sizeof *m);
  char *name = slapo_strdup("");
  if (!m || !name) {
    slapo_free(m);
    slapo_free(name);
    /* The message first: `type` may live inside `config` (a fused module's
     * type does), so it is gone once the config is freed. */
    slapo_status s = slapo_error(SLAPO_NOMEM, "module: out of memory creating a %s", type->name);
    if (type->free_config) type->free_config(config);
    else slapo_free(config);
    return s;
  }
  m->type = type;
  m->name = name;
  m->config = config;
  *out = m;
  return SLAPO_OK;
}

static void free_tags(slapo_map *tags) {
  if (!tags) return;
  for (size_t i = 0; i < slapo_map_count(tags); i++) slapo_free(slapo_map_value_at(tags, i));
  slapo_map_free(tags);
}

static void param_unref(slapo_parameter *p) {
  if (!p || --p->refcount > 0) return;
  free_tags(p->tags);
  slapo__param_free_shard(p);
  slapo_tensor_free(p->value);
  slapo_tensor_free(p->grad);
  slapo_free(p->path);
  slapo_free(p);
}

void slapo_module_free(slapo_module *m) {
  if (!m) return;
  for (int i = 0; i < m->n_children; i++) slapo_module_free(m->children[i]);
  for (int i = 0; i < m->n_params; i++) {
    param_unref(m->params[i]);
    slapo_free(m->param_names[i]);
  }
  slapo_free(m->children);
  slapo_free(m->params);
  slapo_free(m->param_names);
  if (m->type->free_config) m->type->free_config(m->config);
  else slapo_free(m->config);
  slapo__trace_free(m->trace);
  slapo_free(m->syncs);
  for (int i = 0; i < m->n_example; i++) slapo_tensor_free(m->example[i]);
  slapo_free(m->example);
  slapo_free(m->name);
  slapo_free(m);
}

slapo_module *slapo_module_child(const slapo_module *m, const char *name) {
  for (int i = 0; i < m->n_children; i++)
    if (!strcmp(m->children[i]->name, name)) return m->children[i];
  return NULL;
}

slapo_parameter *slapo_module_param(const slapo_module *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (!strcmp(m->param_names[i], name)) return m->params[i];
  return NULL;
}

slapo_status slapo_module_add_child(slapo_module *m, const char *name, slapo_module *child) {
  if (!name[0] || strchr(name, '.') || slapo_module_child(m, name) || slapo_module_param(m, name)) {
    slapo_module_free(child);
    return slapo_error(SLAPO_INVALID_ARG,
                       "module: cannot add child '%s' to a %s: the name is empty, contains "
                       "'.', or is taken",
                       name, m->type->name);
  }
  char *n = slapo_strdup(name);
  slapo_module **c = slapo_realloc(m->children, (size_t)(m->n_children + 1) * sizeof *c);
  if (c) m->children = c;
  if (!n || !c) {
    slapo_free(n);
    slapo_module_free(child);
    return slapo_error(SLAPO_NOMEM, "module: out of memory adding child '%s'", name);
  }
  slapo_free(child->name);
  child->name = n;
  child->parent = m;
  m->children[m->n_children++] = child;
  return SLAPO_OK;
}

slapo_status slapo_module_replace_child(slapo_module *m, const char *name, slapo_module *child,
                                        slapo_module **old) {
  if (old) *old = NULL;
  if (!child)
    return slapo_error(SLAPO_INVALID_ARG, "module: replacing child '%s' of a %s with NULL",
                       name, m->type->name);
  int at = -1;
  for (int i = 0; i < m->n_children && at < 0; i++)
    if (!strcmp(m->children[i]->name, name)) at = i;
  if (at < 0) {
    char kids[512] = "";
    for (int i = 0; i < m->n_children; i++) slapo_list_append(kids, sizeof kids, m->children[i]->name);
    slapo_module_free(child);
    return slapo_error(SLAPO_NOT_FOUND,
                       "module: a %s has no child '%s' to replace; its children: %s",
                       m->type->name, name, m->n_children ? kids : "(none)");
  }
  slapo_module *prev = m->children[at];
  if (!child->n_syncs) { /* syncs belong to the position (the original's hooks carry over) */
    child->syncs = prev->syncs, child->n_syncs = prev->n_syncs;
    prev->syncs = NULL, prev->n_syncs = 0;
  }
  /* The two swap name strings instead of copying `name`: nothing is
   * allocated, so a caller can always undo a replace by replacing back. */
  char *n = prev->name;
  prev->name = child->name;
  child->name = n;
  child->parent = m;
  m->children[at] = child;
  prev->parent = NULL;
  if (old) *old = prev;
  else slapo_module_free(prev);
  return SLAPO_OK;
}

slapo_status slapo_module_remove_child(slapo_module *m, const char *name) {
  for (int i = 0; i < m->n_children; i++) {
    if (strcmp(m->children[i]->name, name)) continue;
    slapo_module_free(m->children[i]);
    memmove(m->children + i, m->children + i + 1,
            (size_t)(m->n_children - i - 1) * sizeof *m->children);
    m->n_children--;
    return SLAPO_OK;
  }
  return slapo_error(SLAPO_NOT_FOUND, "module: a %s has no child '%s' to remove", m->type->name,
                     name);
}

void slapo_module_unique_name(const slapo_module *m, const char *base, char *buf, size_t cap) {
  for (int k = 0;; k++) {
    snprintf(buf, cap, "%s_%d", base, k);
    if (!slapo_module_child(m, buf) && !slapo_module_param(m, buf)) return;
  }
}

/* Appends (name, p) taking one reference to p. */
static slapo_status append_param(slapo_module *m, const char *name, slapo_parameter *p) {
  char *n = slapo_strdup(name);
  slapo_parameter **ps = slapo_realloc(m->params, (size_t)(m->n_params + 1) * sizeof *ps);
  if (ps) m->params = ps;
  char **ns = slapo_realloc(m->param_names, (size_t)(m->n_params + 1) * sizeof *ns);
  if (ns) m->param_names = ns;
  if (!n || !ps || !ns) {
    slapo_free(n);
    return slapo_error(SLAPO_NOMEM, "module: out of memory adding parameter '%s'", name);
  }
  m->params[m->n_params] = p;
  m->param_names[m->n_params++] = n;
  p->refcount++;
  return SLAPO_OK;
}

slapo_status slapo_module_add_param(slapo_module *m, const char *name, int ndim,
                                    const int64_t *shape, slapo_init_kind init, float std) {
  if (slapo_module_param(m, name) || slapo_module_child(m, name))
    return slapo_error(SLAPO_INVALID_ARG, "module: a %s already has a member named '%s'",
                       m->type->name, name);
  slapo_parameter *p = slapo_calloc(1, sizeof *p);
  if (!p) return slapo_error(SLAPO_NOMEM, "module: out of memory adding parameter '%s'", name);
  slapo_status s = slapo_tensor_new_meta(SLAPO_DTYPE_F32, ndim, shape, &p->value);
  if (s == SLAPO_OK) {
    p->init = init;
    p->std = std;
    p->no_weight_decay = ndim < 2;
    s = append_param(m, name, p);
  }
  if (s != SLAPO_OK) {
    slapo_tensor_free(p->value);
    slapo_free(p);
  }
  return s;
}

slapo_status slapo_module_tie_param(slapo_module *m, const char *name, slapo_parameter *p) {
  for (int i = 0; i < m->n_params; i++) {
    if (!strcmp(m->param_names[i], name)) {
      p->refcount++;
      param_unref(m->params[i]);
      m->params[i] = p;
      return SLAPO_OK;
    }
  }
  return append_param(m, name, p);
}

char *slapo_module_path(const slapo_module *m) {
  /* Segments joined by '.': sum of (length + 1) covers the dots and the NUL. */
  size_t n = 0;
  for (const slapo_module *x = m; x->parent; x = x->parent) n += strlen(x->name) + 1;
  char *s = slapo_malloc(n ? n : 1);
  if (!s) return NULL;
  size_t end = n ? n - 1 : 0;
  s[end] = '\0';
  for (const slapo_module *x = m; x->parent; x = x->parent) {
    size_t k = strlen(x->name);
    end -= k;
    memcpy(s + end, x->name, k);
    if (x->parent->parent) s[--end] = '.';
  }
  return s;
}

slapo_parameter *slapo_module_param_at(const slapo_module *m, const char *path) {
  const char *dot = strrchr(path, '.');
  if (!dot) return slapo_module_param(m, path);
  char mod[1024];
  if ((size_t)(dot - path) >= sizeof mod) return NULL;
  memcpy(mod, path, (size_t)(dot - path));
  mod[dot - path] = '\0';
  slapo_module *owner = NULL;
  if (slapo_module_at(m, mod, &owner) != SLAPO_OK) {
    slapo_error_clear();
    return NULL;
  }
  return slapo_module_param(owner, dot + 1);
}

slapo_status slapo_module_at(const slapo_module *m, const char *path, slapo_module **out) {
  *out = NULL;
  SLAPO_NEED(m, "module_at");
  SLAPO_NEED(path, "module_at");
  const slapo_module *cur = m;
  const char *p = path;
  char seg[256];
  while (*p) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len >= sizeof seg) len = sizeof seg - 1;
    memcpy(seg, p, len);
    seg[len] = '\0';
    const slapo_module *next = slapo_module_child(cur, seg);
    if (!next) {
      char kids[512] = "";
      for (int i = 0; i < cur->n_children; i++)
        slapo_list_append(kids, sizeof kids, cur->children[i]->name);
      int prefix = (int)(p - path) - (p > path ? 1 : 0);
      return slapo_error(SLAPO_NOT_FOUND,
                         "no module '%s': '%.*s' (a %s) has no child '%s'; its children: %s",
                         path, prefix, path, cur->type->name, seg,
                         cur->n_children ? kids : "(none)");
    }
    cur = next;
    p = dot ? dot + 1 : p + len;
  }
  *out = (slapo_module *)cur;
  return SLAPO_OK;
}

/* ---- parameter visiting ---- */

typedef struct visit_state {
  slapo_parameter **seen;
  int n_seen, cap_seen;
  slapo_param_visit_fn fn;
  void *ud;
  slapo_status status;
} visit_state;

static bool seen_before(visit_state *v, slapo_parameter *p) {
  for (int i = 0; i < v->n_seen; i++)
    if (v->seen[i] == p) return true;
  if (v->n_seen == v->cap_seen) {
    int cap = v->cap_seen ? 2 * v->cap_seen : 64;
    slapo_parameter **s = slapo_realloc(v->seen, (size_t)cap * sizeof *s);
    if (!s) {
      v->status = slapo_error(SLAPO_NOMEM, "module: out of memory visiting parameters");
      return true;
    }
    v->seen = s;
    v->cap_seen = cap;
  }
  v->seen[v->n_seen++] = p;
  return false;
}

static void visit(slapo_module *m, const char *prefix, visit_state *v) {
  char path[1024];
  for (int i = 0; i < m->n_params && v->status == SLAPO_OK; i++) {
    if (seen_before(v, m->params[i])) continue;
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", m->param_names[i]);
    v->fn(m->params[i], path, v->ud);
  }
  for (int i = 0; i < m->n_children && v->status == SLAPO_OK; i++) {
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", m->children[i]->name);
    visit(m->children[i], path, v);
  }
}

slapo_status slapo_module_visit_params(slapo_module *m, slapo_param_visit_fn fn, void *ud) {
  visit_state v = {.fn = fn, .ud = ud};
  char *prefix = slapo_module_path(m);
  if (!prefix) return slapo_error(SLAPO_NOMEM, "module: out of memory");
  visit(m, prefix, &v);
  slapo_free(prefix);
  slapo_free(v.seen);
  return v.status;
}

typedef struct grad_list {
  slapo_tensor **t;
  int n, cap;
  slapo_status status;
} grad_list;

static void add_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  grad_list *g = ud;
  if (!p->grad || g->status != SLAPO_OK) return;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 256;
    slapo_tensor **t = slapo_realloc(g->t, sizeof *t * (size_t)cap);
    if (!t) {
      g->status = slapo_error(SLAPO_NOMEM, "module: out of memory listing gradients");
      return;
    }
    g->t = t, g->cap = cap;
  }
  g->t[g->n++] = p->grad;
}

slapo_status slapo_module_grads(slapo_module *m, slapo_tensor ***out, int *n) {
  grad_list g = {0};
  slapo_status s = slapo_module_visit_params(m, add_grad, &g);
  if (s == SLAPO_OK) s = g.status;
  if (s != SLAPO_OK) {
    slapo_free(g.t);
    g.t = NULL, g.n = 0;
  }
  *out = g.t, *n = g.n;
  return s;
}

static void count_numel(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  *(int64_t *)ud += slapo_tensor_numel(p->value);
}

int64_t slapo_module_numel(slapo_module *m) {
  int64_t n = 0;
  slapo_module_visit_params(m, count_numel, &n);
  return n;
}

typedef struct init_state {
  uint64_t seed;
  slapo_status status;
} init_state;

static void init_param(slapo_parameter *p, const char *path, void *ud) {
  init_state *st = ud;
  if (st->status != SLAPO_OK) return;
  if (!p->path && !(p->path = slapo_strdup(path))) {
    st->status = slapo_error(SLAPO_NOMEM, "materialize: out of memory");
    return;
  }
  if (!slapo_tensor_is_meta(p->value)) return;
  slapo_status s = slapo_tensor_materialize(p->value);
  if (s == SLAPO_OK && !p->grad)
    s = slapo_tensor_new(SLAPO_DTYPE_F32, p->value->ndim, p->value->shape, &p->grad);
  if (s != SLAPO_OK) {
    st->status = slapo_error(SLAPO_NOMEM, "materialize: out of memory for %s", path);
    return;
  }
  float *w = slapo_tensor_data(p->value); /* [numel] */
  int64_t n = slapo_tensor_numel(p->value);
  uint64_t stream = slapo_hash_str(path);
  int64_t pad_from = INT64_MAX; /* flat index where a padded shard's padding starts */
  if (p->shard) {
    int64_t orig[SLAPO_MAX_DIMS];
    slapo_shard_orig_shape(p->shard, orig);
    pad_from = slapo_shape_numel(p->shard->ndim, orig);
  }
  for (int64_t i = 0; i < n; i++) {
    /* A shard's element gets the value the unsharded parameter has there. */
    uint64_t at = (uint64_t)(p->shard ? slapo_shard_global_index(p->shard, i) : i);
    if (p->shard && (int64_t)at >= pad_from) { /* padding rows (axis 0) */
      w[i] = 0.0f;
      continue;
    }
    switch (p->init) {
    case SLAPO_INIT_ZEROS: w[i] = 0.0f; break;
    case SLAPO_INIT_ONES: w[i] = 1.0f; break;
    case SLAPO_INIT_NORMAL: w[i] = p->std * slapo_rng_normal(st->seed, stream, 0, at); break;
    case SLAPO_INIT_UNIFORM:
      w[i] = p->std * (2.0f * slapo_rng_uniform(st->seed, stream, 0, at) - 1.0f);
      break;
    }
  }
}

static void name_param(slapo_parameter *p, const char *path, void *ud) {
  slapo_status *st = ud;
  if (*st == SLAPO_OK && !p->path && !(p->path = slapo_strdup(path)))
    *st = slapo_error(SLAPO_NOMEM, "name_params: out of memory");
}

slapo_status slapo_module_name_params(slapo_module *m) {
  slapo_status st = SLAPO_OK;
  slapo_status s = slapo_module_visit_params(m, name_param, &st);
  return s != SLAPO_OK ? s : st;
}

slapo_status slapo__param_materialize(slapo_parameter *p, const char *path, uint64_t seed) {
  init_state st = {seed, SLAPO_OK};
  init_param(p, path, &st);
  return st.status;
}

slapo_status slapo_module_materialize(slapo_module *m, uint64_t seed) {
  init_state st = {seed, SLAPO_OK};
  slapo_status s = slapo_module_visit_params(m, init_param, &st);
  return s != SLAPO_OK ? s : st.status;
}

/* The first meta parameter's path, copied: `path` lives only for the call. */
typedef struct meta_state {
  char path[512];
} meta_state;

static void first_meta(slapo_parameter *p, const char *path, void *ud) {
  meta_state *st = ud;
  if (slapo_tensor_is_meta(p->value) && !st->path[0])
    snprintf(st->path, sizeof st->path, "%s", path);
}

slapo_status slapo_module_check_materialized(slapo_module *m, const char *what) {
  meta_state st = {""};
  SLAPO_TRY(slapo_module_visit_params(m, first_meta, &st));
  if (!st.path[0]) return SLAPO_OK;
  return slapo_error(SLAPO_STATE, "%s: parameter %s is not materialized (slapo_module_materialize "
                     "allocates the parameters; a checkpoint loads into a materialized model)",
                     what, st.path);
}

static void zero_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path, (void)ud;
  if (p->grad) memset(slapo_tensor_data(p->grad), 0, slapo_tensor_nbytes(p->grad));
}

void slapo_module_zero_grad(slapo_module *m) { slapo_module_visit_params(m, zero_grad, NULL); }

/* ---- repr ---- */


static void fmt_count(int64_t n, char *buf, size_t cap) {
  if (n >= 1000000) snprintf(buf, cap, "%.2fM", (double)n / 1e6);
  else if (n >= 1000) snprintf(buf, cap, "%.1fK", (double)n / 1e3);
  else snprintf(buf, cap, "%lld", (long long)n);
}

/* Two subtrees print identically (same types, configs and shapes). */
static bool same_tree(const slapo_module *a, const slapo_module *b) {
  if (a->type != b->type || a->n_children != b->n_children || a->n_params != b->n_params)
    return false;
  char da[256] = "", db[256] = "";
  if (a->type->describe) a->type->describe(a, da, sizeof da), b->type->describe(b, db, sizeof db);
  if (strcmp(da, db)) return false;
  for (int i = 0; i < a->n_children; i++)
    if (strcmp(a->children[i]->name, b->children[i]->name) ||
        !same_tree(a->children[i], b->children[i]))
      return false;
  return true;
}

static void print_rec(const slapo_module *m, FILE *f, int indent, const char *label) {
  char desc[256] = "", cnt[32];
  if (m->type->describe) m->type->describe(m, desc, sizeof desc);
  /* Distinct parameters: a tied weight counts once, where it is first seen. */
  fmt_count(slapo_module_numel((slapo_module *)m), cnt, sizeof cnt);
  fprintf(f, "%*s%s%s%s(%s)", indent, "", label, label[0] ? ": " : "", m->type->name, desc);
  if (!m->n_children) {
    fprintf(f, "  # %s params\n", cnt);
    return;
  }
  fprintf(f, "  # %s params\n", cnt);
  for (int i = 0; i < m->n_children;) {
    int j = i + 1;
    /* Fold runs of identical list entries ("0", "1", …) as PyTorch does. */
    bool indexed = m->children[i]->name[0] >= '0' && m->children[i]->name[0] <= '9';
    while (indexed && j < m->n_children && same_tree(m->children[i], m->children[j])) j++;
    char lab[128];
    if (j - i > 1) {
      snprintf(lab, sizeof lab, "(%s-%s): %d x", m->children[i]->name, m->children[j - 1]->name,
               j - i);
      fprintf(f, "%*s%s\n", indent + 2, "", lab);
      print_rec(m->children[i], f, indent + 4, "");
    } else {
      snprintf(lab, sizeof lab, "(%s)", m->children[i]->name);
      print_rec(m->children[i], f, indent + 2, lab);
    }
    i = j;
  }
}

void slapo_module_print(const slapo_module *m, FILE *f) { print_rec(m, f, 0, ""); }

/* ---- tags and versions ---- */

slapo_status slapo_parameter_set_tag(slapo_parameter *p, const char *key, const char *value) {
  bool decay_tag = !strcmp(key, "weight_decay");
  double wd = 0;
  if (decay_tag) {
    char *end;
    wd = strtod(value, &end);
    if (!value[0] || *end)
      return slapo_error(SLAPO_INVALID_ARG, "tag weight_decay=%s of %s is not a number", value,
                         p->path ? p->path : "a parameter");
  }
  if (!p->tags && slapo_map_new(&p->tags) != SLAPO_OK)
    return slapo_error(SLAPO_NOMEM, "tags: out of memory");
  char *v = slapo_strdup(value);
  if (!v) return slapo_error(SLAPO_NOMEM, "tags: out of memory");
  char *old = slapo_map_get(p->tags, key);
  if (slapo_map_set(p->tags, key, v) != SLAPO_OK) {
    slapo_free(v);
    return slapo_error(SLAPO_NOMEM, "tags: out of memory");
  }
  slapo_free(old);
  if (decay_tag) p->no_weight_decay = wd == 0;
  return SLAPO_OK;
}

const char *slapo_parameter_tag(const slapo_parameter *p, const char *key) {
  return p->tags ? slapo_map_get(p->tags, key) : NULL;
}

static slapo_module *root_of(const slapo_module *m) {
  while (m->parent) m = m->parent;
  return (slapo_module *)m;
}

void slapo_module_touch(slapo_module *m) { root_of(m)->version++; }

void slapo_module_set_autocast(slapo_module *m, bool bf16) {
  m->autocast_set = true;
  m->autocast = !bf16                       ? SLAPO_AUTOCAST_OFF
                : root_of(m)->bf16_emulated ? SLAPO_AUTOCAST_BF16_EMULATED
                                            : SLAPO_AUTOCAST_BF16;
  slapo_module_touch(m);
}

slapo_autocast slapo_module_autocast_of(const slapo_module *m) {
  for (; m; m = m->parent)
    if (m->autocast_set) return m->autocast;
  return SLAPO_AUTOCAST_OFF;
}

static int emulate(slapo_module *m) {
  int n = 0;
  if (m->autocast_set && m->autocast == SLAPO_AUTOCAST_BF16) {
    m->autocast = SLAPO_AUTOCAST_BF16_EMULATED;
    n++;
  }
  for (int i = 0; i < m->n_children; i++) n += emulate(m->children[i]);
  return n;
}

int slapo_module_autocast_emulate(slapo_module *m) {
  if (!m) return 0;
  root_of(m)->bf16_emulated = true;
  int n = emulate(m);
  if (n) slapo_module_touch(m);
  return n;
}
uint64_t slapo_module_version(const slapo_module *m) { return root_of(m)->version; }
