/* train/sample.c - autoregressive text sampling with temperature and top-k
 * (Fan et al. 2018). The model runs in eval mode on a fixed window of n_ctx
 * tokens, right-padded: causal attention makes the logits at the last real
 * position independent of the padding, and one window shape means one
 * cached step graph for the whole sample. Layer: train. */
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

slapo_status slapo_sample(slapo_runner *r, int64_t n_ctx, int32_t *tokens, int64_t *n,
                          int64_t n_new, float temperature, int top_k, uint64_t seed) {
  if (*n < 1) return slapo_error(SLAPO_INVALID_ARG, "sample: the prompt is empty");
  if (!(temperature > 0)) return slapo_error(SLAPO_INVALID_ARG, "sample: temperature %g must be > 0", temperature);
  int64_t shape[2] = {1, n_ctx};
  slapo_tensor *idx;
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx));
  cand *c = NULL;
  slapo_status s = SLAPO_OK;
  for (int64_t k = 0; k < n_new && s == SLAPO_OK; k++) {
    int64_t len = *n < n_ctx ? *n : n_ctx;
    int32_t *w = slapo_tensor_data(idx); /* [1, n_ctx] */
    memset(w, 0, (size_t)n_ctx * sizeof *w);
    memcpy(w, tokens + *n - len, (size_t)len * sizeof *w);
    const slapo_tensor *logits; /* [1, n_ctx, V] */
    const slapo_tensor *in[1] = {idx};
    slapo_kernel_env env = {seed, 0, false};
    s = slapo_step(r, 1, in, SLAPO_STEP_EVAL, &env, &logits);
    if (s != SLAPO_OK) break;
    int V = (int)logits->shape[2];
    if (!c && !(c = slapo_malloc((size_t)V * sizeof *c))) {
      s = slapo_error(SLAPO_NOMEM, "sample: out of memory");
      break;
    }
    const float *row = (const float *)slapo_tensor_data(logits) + (len - 1) * V; /* [V] */
    for (int v = 0; v < V; v++) c[v] = (cand){row[v] / temperature, v};
    qsort(c, (size_t)V, sizeof *c, by_logit_desc);
    int K = top_k > 0 && top_k < V ? top_k : V;
    double z = 0;
    for (int i = 0; i < K; i++) z += exp((double)(c[i].logit - c[0].logit));
    double u = slapo_rng_uniform(seed, 0x5a4d9e, (uint64_t)k, 0) * z, acc = 0;
    int pick = c[K - 1].id;
    for (int i = 0; i < K; i++) {
      acc += exp((double)(c[i].logit - c[0].logit));
      if (u < acc) {
        pick = c[i].id;
        break;
      }
    }
    tokens[(*n)++] = pick;
  }
  slapo_free(c);
  slapo_tensor_free(idx);
  return s;
}
