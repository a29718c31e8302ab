/* models/lm_common.c - what the language-model families share: config
 * lookup by name, modules owning a config copy, the stack of blocks, the
 * causal-LM root forward (logits, or the loss with labels), the example
 * inputs `trace` builds on, the checked overrides of a config. Layer:
 * models. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"
#include "slapo/dist.h"

int slapo__config_index(const char *family, const char *const *names, const char *name) {
  char known[160] = "";
  for (int i = 0; names[i]; i++) {
    if (name && !strcmp(names[i], name)) return i;
    slapo_list_append(known, sizeof known, names[i]);
  }
  slapo_error(SLAPO_NOT_FOUND, "%s: unknown config '%s' (known: %s)", family,
              name ? name : "(null)", known);
  return -1;
}

slapo_node *slapo__causal_lm_forward(slapo_ctx *ctx, slapo_module *self, const char *cls,
                                     const char *body, int n_in, slapo_node *const *in) {
  if (n_in < 1 || n_in > 2) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                   "%s: expects (input_ids) or (input_ids, labels), got %d inputs", cls, n_in);
    return NULL;
  }
  slapo_node *h = slapo_call1(ctx, self, body, in[0]);
  slapo_node *logits = slapo_call1(ctx, self, "lm_head", h); /* [B, T, V] */
  slapo_module *head = slapo_module_child(self, "lm_head");
  const slapo_parameter *w = head ? slapo_module_param(head, "weight") : NULL;
  if (!w || !w->shard || w->shard->axis != 0 || !logits) {
    if (n_in == 1) return logits;
    return slapo_cross_entropy(ctx, logits, in[1], SLAPO_IGNORE_INDEX);
  }
  /* A vocab-parallel head (its weight split by rows): this rank's logits
   * are classes [start, start + V/n); the loss takes the global max and sum
   * (Megatron-LM), and plain logits are gathered. */
  slapo_group g = (slapo_group)w->shard_group;
  int64_t V = w->shard->valid; /* the classes past V pad the vocabulary */
  if (n_in == 1) {
    slapo_node *all = slapo_dist_all_gather(ctx, logits, -1, false, g);
    return all && all->shape[all->ndim - 1] != V ? slapo_slice(ctx, all, all->ndim - 1, 0, V)
                                                 : all;
  }
  int64_t start = slapo_shard_global_index(w->shard, 0) / w->shard->full[1];
  return slapo_dist_vocab_parallel_cross_entropy(ctx, logits, in[1], start, V,
                                                 SLAPO_IGNORE_INDEX, g);
}

slapo_status slapo__model_opts_of(const char *family, const slapo_model_opts *opts,
                                  slapo_model_opts *out) {
  *out = opts ? *opts : SLAPO_MODEL_OPTS_DEFAULT;
  if (!(out->dropout < 1))
    return slapo_error(SLAPO_INVALID_ARG, "%s: dropout %g is not below 1", family, out->dropout);
  if (out->vocab_size < 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: vocab_size %lld is negative", family,
                       (long long)out->vocab_size);
  return SLAPO_OK;
}

slapo_status slapo__set_lm_example(slapo_module *lm, int64_t n_ctx) {
  int64_t bt[2] = {2, n_ctx < 8 ? n_ctx : 8};
  slapo_tensor *ex[2] = {NULL, NULL};
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < 2 && s == SLAPO_OK; i++) s = slapo_tensor_new_meta(SLAPO_DTYPE_I32, 2, bt, &ex[i]);
  if (s == SLAPO_OK) s = slapo_module_set_example(lm, 2, (const slapo_tensor *const *)ex);
  slapo_tensor_free(ex[0]);
  slapo_tensor_free(ex[1]);
  return s;
}

slapo_status slapo__module_with_config(const slapo_module_type *t, const void *cfg, size_t size,
                                       slapo_module **out) {
  *out = NULL;
  void *d = slapo_malloc(size);
  if (!d) return slapo_error(SLAPO_NOMEM, "%s: out of memory", t->name);
  memcpy(d, cfg, size);
  return slapo_module_new(t, d, out);
}

slapo_node *slapo__call_layers(slapo_ctx *ctx, slapo_module *self, const char *list, int n,
                               int n_in, slapo_node **args) {
  char name[64];
  for (int l = 0; l < n && args[0]; l++) {
    snprintf(name, sizeof name, "%s.%d", list, l);
    args[0] = slapo_call(ctx, self, name, n_in, args);
  }
  return args[0];
}
