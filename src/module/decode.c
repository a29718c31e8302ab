/* module/decode.c - decoding with a KV cache: a step that runs only the new
 * tokens, its attention modules reading the cached keys and values of the
 * earlier positions (graph inputs) and recording the grown ones (graph
 * outputs), which are copied back into the cache after the run. The graph's
 * shapes grow with the cache, so each call builds and plans its own; that
 * costs far less than recomputing the whole window per token.
 * Layer: module. */
#include <stdio.h>
#include <string.h>

#include "module/internal.h"
#include "slapo/rewrite.h"

struct slapo_kv_cache {
  int64_t len;       /* positions held */
  int n;             /* entries: one per attention module */
  char **paths;      /* module path of each entry (owned) */
  slapo_tensor **kv; /* [2 n]: keys, values [B, NH, len, HS] (owned) */
};

slapo_status slapo_kv_cache_new(slapo_kv_cache **out) {
  *out = slapo_calloc(1, sizeof **out);
  return *out ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "kv_cache: out of memory");
}

void slapo_kv_cache_free(slapo_kv_cache *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) {
    slapo_free(c->paths[i]);
    slapo_tensor_free(c->kv[2 * i]);
    slapo_tensor_free(c->kv[2 * i + 1]);
  }
  slapo_free(c->paths);
  slapo_free(c->kv);
  slapo_free(c);
}

int64_t slapo_kv_cache_len(const slapo_kv_cache *c) { return c->len; }

static int cache_find(const slapo_kv_cache *c, const char *path) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->paths[i], path)) return i;
  return -1;
}

static slapo__decode_state *decode_of(slapo_ctx *ctx) {
  slapo__build_state *bs = slapo_ctx_user(ctx);
  return bs ? bs->decode : NULL;
}

int64_t slapo_decode_past(slapo_ctx *ctx) {
  slapo__build_state *bs = slapo_ctx_user(ctx);
  /* A traced forward that asks is only valid without a cache (trace.c). */
  if (bs && bs->trace) bs->trace->decode_sensitive = true;
  slapo__decode_state *d = decode_of(ctx);
  return d ? d->cache->len : -1;
}

/* The past keys or values of `path` as a graph input (named by path). */
static slapo_node *past_input(slapo_ctx *ctx, const slapo_tensor *t, const char *what,
                              const char *path) {
  char name[1100];
  snprintf(name, sizeof name, "past_%s:%s", what, path);
  return slapo_input(ctx, name, t->dtype, t->ndim, t->shape);
}

static slapo_status record(slapo_ctx *ctx, slapo__decode_state *d, const char *path,
                           slapo_node *k, slapo_node *v) {
  if (d->n == d->cap) {
    int cap = d->cap ? 2 * d->cap : 16;
    char **p = slapo_realloc(d->paths, (size_t)cap * sizeof *p);
    if (p) d->paths = p;
    slapo_node **kk = p ? slapo_realloc(d->k, (size_t)cap * sizeof *kk) : NULL;
    if (kk) d->k = kk;
    slapo_node **vv = kk ? slapo_realloc(d->v, (size_t)cap * sizeof *vv) : NULL;
    if (vv) d->v = vv;
    if (!vv) return slapo_ctx_fail(ctx, SLAPO_NOMEM, "decode: out of memory");
    d->cap = cap;
  }
  if (!(d->paths[d->n] = slapo_strdup(path))) return slapo_ctx_fail(ctx, SLAPO_NOMEM, "decode: out of memory");
  d->k[d->n] = k, d->v[d->n++] = v;
  return SLAPO_OK;
}

slapo_status slapo_decode_kv(slapo_ctx *ctx, slapo_node *k, slapo_node *v, slapo_node **k_all,
                             slapo_node **v_all) {
  *k_all = k, *v_all = v;
  slapo__decode_state *d = decode_of(ctx);
  if (slapo_ctx_status(ctx) != SLAPO_OK || !d || !k || !v) return slapo_ctx_status(ctx);
  const char *path = slapo_ctx_origin(ctx);
  int i = cache_find(d->cache, path);
  if (d->cache->len > 0) {
    if (i < 0)
      return slapo_ctx_fail(ctx, SLAPO_STATE, "decode: %s has no cached keys and values",
                            path[0] ? path : "(root)");
    slapo_node *pk[2] = {past_input(ctx, d->cache->kv[2 * i], "k", path), k};
    slapo_node *pv[2] = {past_input(ctx, d->cache->kv[2 * i + 1], "v", path), v};
    *k_all = slapo_concat(ctx, 2, pk, 2);
    *v_all = slapo_concat(ctx, 2, pv, 2);
  }
  if (slapo_ctx_status(ctx) != SLAPO_OK) return slapo_ctx_status(ctx);
  return record(ctx, d, path, *k_all, *v_all);
}

static void decode_state_clear(slapo__decode_state *d) {
  for (int i = 0; i < d->n; i++) slapo_free(d->paths[i]);
  slapo_free(d->paths);
  slapo_free(d->k);
  slapo_free(d->v);
}

/* After a run: the present keys and values become the cache. */
static slapo_status store_presents(slapo_kv_cache *c, const slapo__decode_state *d,
                                   const slapo_plan *p, int64_t T) {
  if (c->n == 0) {
    c->paths = slapo_calloc((size_t)d->n, sizeof *c->paths);
    c->kv = slapo_calloc(2 * (size_t)d->n, sizeof *c->kv);
    if (!c->paths || !c->kv) return slapo_error(SLAPO_NOMEM, "decode: out of memory");
    for (int i = 0; i < d->n; i++, c->n++)
      if (!(c->paths[i] = slapo_strdup(d->paths[i])))
        return slapo_error(SLAPO_NOMEM, "decode: out of memory");
  }
  for (int i = 0; i < d->n; i++) {
    int at = cache_find(c, d->paths[i]);
    SLAPO_ASSERT(at >= 0);
    for (int w = 0; w < 2; w++) {
      slapo_tensor *t;
      SLAPO_TRY(slapo_tensor_contiguous(slapo_plan_output(p, 1 + 2 * i + w), &t));
      slapo_tensor_free(c->kv[2 * at + w]);
      c->kv[2 * at + w] = t;
    }
  }
  c->len += T;
  return SLAPO_OK;
}

/* Binds parameters, the input ids and the cached keys and values. */
static slapo_status bind_all(slapo_plan *p, const slapo__build_state *bs, const slapo_tensor *idx,
                             const slapo_kv_cache *c) {
  for (size_t i = 0; i < slapo_map_count(bs->param_objs); i++) {
    slapo_parameter *prm = slapo_map_value_at(bs->param_objs, i);
    SLAPO_TRY(slapo_plan_bind_param(p, prm->path, prm->value));
  }
  SLAPO_TRY(slapo_plan_bind_input(p, "in0", idx));
  for (int i = 0; c->len > 0 && i < c->n; i++)
    for (int w = 0; w < 2; w++) {
      char name[1100];
      snprintf(name, sizeof name, "past_%s:%s", w ? "v" : "k", c->paths[i]);
      SLAPO_TRY(slapo_plan_bind_input(p, name, c->kv[2 * i + w]));
    }
  return SLAPO_OK;
}

/* Builds the forward on idx with the decode state, outputs: logits, then
 * each recorded module's keys and values. */
static slapo_status build_decode(slapo_module *root, slapo_ctx *ctx, const slapo_tensor *idx,
                                 slapo__build_state *bs) {
  slapo_node *in = slapo_input(ctx, "in0", idx->dtype, idx->ndim, idx->shape);
  slapo_node *y = in ? slapo__forward(ctx, root, 1, &in) : NULL;
  SLAPO_TRY(slapo_ctx_status(ctx));
  const slapo__decode_state *d = bs->decode;
  if (!y || d->n == 0)
    return slapo_error(SLAPO_UNSUPPORTED, "decode: the %s forward recorded no keys and values "
                       "(no module of it supports decoding with a KV cache)", root->type->name);
  slapo_node **outs = slapo_calloc(1 + 2 * (size_t)d->n, sizeof *outs);
  if (!outs) return slapo_error(SLAPO_NOMEM, "decode: out of memory");
  outs[0] = y;
  for (int i = 0; i < d->n; i++) outs[1 + 2 * i] = d->k[i], outs[2 + 2 * i] = d->v[i];
  slapo_status s = slapo__prune_tuples(slapo_ctx_graph(ctx), 1 + 2 * d->n, outs, bs);
  if (s == SLAPO_OK && !slapo_output(ctx, 1 + 2 * d->n, outs)) s = slapo_ctx_status(ctx);
  slapo_free(outs);
  return s;
}

slapo_status slapo_step_decode(slapo_runner *r, slapo_kv_cache *cache, const slapo_tensor *idx,
                               const slapo_kernel_env *env, const slapo_tensor **logits) {
  *logits = NULL;
  slapo_module *root = slapo__runner_root(r);
  if (idx->ndim != 2)
    return slapo_error(SLAPO_SHAPE, "decode: input ids must be [B, T], got %d dims", idx->ndim);
  slapo__decode_state d = {.cache = cache};
  slapo__build_state bs = {.decode = &d};
  slapo_graph *g = NULL;
  slapo_ctx *ctx = NULL;
  slapo_plan *p = NULL;
  slapo_status s = slapo_graph_new(&g);
  if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_nodes);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_objs);
  if (s == SLAPO_OK) {
    slapo_ctx_set_user(ctx, &bs);
    s = build_decode(root, ctx, idx, &bs);
  }
  /* The step's rules in eval mode: identity dropouts go. */
  int n_rules;
  const slapo_rewrite_rule *const *rules = slapo_rewrite_step_rules(&n_rules);
  if (s == SLAPO_OK)
    s = slapo_rewrite_run(g, rules, n_rules, &(slapo_rewrite_env){.training = false}, NULL);
  if (s == SLAPO_OK) s = slapo_plan_new(g, NULL, &p);
  if (s == SLAPO_OK) s = bind_all(p, &bs, idx, cache);
  slapo_kernel_env e = env ? *env : (slapo_kernel_env){0};
  e.training = false;
  if (s == SLAPO_OK) s = slapo_plan_run(p, &e);
  if (s == SLAPO_OK) s = store_presents(cache, &d, p, idx->shape[1]);
  if (s == SLAPO_OK) *logits = slapo_plan_output(p, 0);
  /* The plan (and so the logits) lives until the next decode step. */
  if (s == SLAPO_OK) {
    slapo__runner_keep_decode(r, g, p);
  } else {
    slapo_plan_free(p);
    slapo_graph_free(g);
  }
  decode_state_clear(&d);
  slapo_map_free(bs.param_nodes);
  slapo_map_free(bs.param_objs);
  slapo_ctx_free(ctx);
  return s;
}
