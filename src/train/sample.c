/* train/sample.c - autoregressive text sampling with temperature and top-k
 * (Fan et al. 2018). With a KV cache (the default, when the model decodes):
 * the prompt runs once, then each new token alone, attending to the cached
 * keys and values; once the sequence outgrows the context, each token
 * restarts the cache from the last n_ctx tokens, the window below.
 * Without one: the model runs on a fixed window of the last n_ctx tokens,
 * right-padded (causal attention makes the logits at the last real position
 * independent of the padding; one window shape means one cached graph).
 * Both give the same logits up to summation order. Layer: train. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/train.h"

typedef struct cand {
  float logit;
  int id;
} cand;

static int by_logit_desc(const void *a, const void *b) {
  float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
  if (x != y) return x < y ? 1 : -1;
  return ((const cand *)a)->id - ((const cand *)b)->id;
}

/* Draws the next token from logits row [V]; c [V] is scratch. */
static int pick_token(const float *row, int V, const slapo_sample_opts *o, int64_t k, cand *c) {
  for (int v = 0; v < V; v++) c[v] = (cand){row[v] / o->temperature, v};
  qsort(c, (size_t)V, sizeof *c, by_logit_desc);
  int K = o->top_k > 0 && o->top_k < V ? o->top_k : V;
  double z = 0;
  for (int i = 0; i < K; i++) z += exp((double)(c[i].logit - c[0].logit));
  double u = slapo_rng_uniform(o->seed, 0x5a4d9e, (uint64_t)k, 0) * z, acc = 0;
  for (int i = 0; i < K; i++) {
    acc += exp((double)(c[i].logit - c[0].logit));
    if (u < acc) return c[i].id;
  }
  return c[K - 1].id;
}

/* The logits row [V] for the next token without a cache: the last n_ctx
 * tokens, right-padded, in one fixed-shape window. */
static slapo_status next_window(slapo_runner *r, const slapo_sample_opts *o, slapo_tensor *idx,
                                const int32_t *tokens, int64_t n, const float **row, int *V) {
  int64_t len = n < o->n_ctx ? n : o->n_ctx;
  int32_t *w = slapo_tensor_data(idx); /* [1, n_ctx] */
  memset(w, 0, (size_t)o->n_ctx * sizeof *w);
  memcpy(w, tokens + n - len, (size_t)len * sizeof *w);
  const slapo_tensor *logits, *in[1] = {idx}; /* logits [1, n_ctx, V] */
  slapo_kernel_env env = {o->seed, 0, false};
  SLAPO_TRY(slapo_step(r, 1, in, SLAPO_STEP_EVAL, &env, &logits));
  *V = (int)logits->shape[2];
  *row = (const float *)slapo_tensor_data(logits) + (len - 1) * *V;
  return SLAPO_OK;
}

/* The same with the cache: only the tokens the cache has not seen run. */
static slapo_status next_cached(slapo_runner *r, const slapo_sample_opts *o, slapo_kv_cache **kv,
                                const int32_t *tokens, int64_t n, const float **row, int *V) {
  if (*kv && slapo_kv_cache_len(*kv) >= o->n_ctx) { /* full: restart from a window */
    slapo_kv_cache_free(*kv);
    *kv = NULL;
  }
  if (!*kv) SLAPO_TRY(slapo_kv_cache_new(kv));
  /* A fresh cache takes the window the no-cache path would see. */
  int64_t have = slapo_kv_cache_len(*kv);
  int64_t from = have ? n - 1 : (n > o->n_ctx ? n - o->n_ctx : 0);
  int64_t shape[2] = {1, n - from};
  slapo_tensor *idx;
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx));
  memcpy(slapo_tensor_data(idx), tokens + from, (size_t)(n - from) * sizeof *tokens);
  const slapo_tensor *logits; /* [1, n - from, V] */
  slapo_kernel_env env = {o->seed, 0, false};
  slapo_status s = slapo_step_decode(r, *kv, idx, &env, &logits);
  slapo_tensor_free(idx);
  SLAPO_TRY(s);
  *V = (int)logits->shape[2];
  *row = (const float *)slapo_tensor_data(logits) + (n - from - 1) * *V;
  return SLAPO_OK;
}

slapo_status slapo_sample(slapo_runner *r, const slapo_sample_opts *o, int32_t *tokens,
                          int64_t *n, int64_t n_new) {
  if (*n < 1) return slapo_error(SLAPO_INVALID_ARG, "sample: the prompt is empty");
  if (!(o->temperature > 0))
    return slapo_error(SLAPO_INVALID_ARG, "sample: temperature %g must be > 0", o->temperature);
  if (o->n_ctx < 2) return slapo_error(SLAPO_INVALID_ARG, "sample: n_ctx %lld < 2", (long long)o->n_ctx);
  int64_t shape[2] = {1, o->n_ctx};
  slapo_tensor *idx = NULL;
  slapo_kv_cache *kv = NULL;
  cand *c = NULL;
  bool cached = !o->no_cache;
  slapo_status s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx);
  for (int64_t k = 0; k < n_new && s == SLAPO_OK; k++) {
    const float *row = NULL;
    int V = 0;
    s = cached ? next_cached(r, o, &kv, tokens, *n, &row, &V)
               : next_window(r, o, idx, tokens, *n, &row, &V);
    if (s == SLAPO_UNSUPPORTED && cached && k == 0) { /* the model does not decode */
      slapo_error_clear();
      cached = false;
      s = next_window(r, o, idx, tokens, *n, &row, &V);
    }
    if (s == SLAPO_OK && !c && !(c = slapo_malloc((size_t)V * sizeof *c)))
      s = slapo_error(SLAPO_NOMEM, "sample: out of memory");
    if (s != SLAPO_OK) break;
    if (o->vocab > 0 && o->vocab < V) V = (int)o->vocab; /* the padding never */
    tokens[(*n)++] = pick_token(row, V, o, k, c);
    if (o->progress) o->progress(k + 1, n_new, o->ud);
  }
  slapo_free(c);
  slapo_kv_cache_free(kv);
  slapo_tensor_free(idx);
  return s;
}
