/* models/internal.h - what GPT-2's attention and its FlashAttention
 * replacement share. Layer: models (internal). */
#ifndef SLAPO_MODELS_INTERNAL_H
#define SLAPO_MODELS_INTERNAL_H

#include "slapo/models.h"

/* While decoding with a KV cache (slapo_decode_past >= 0): q, k, v [B, NH,
 * T, HS] of the new positions; exchanges k, v with the cache and returns the
 * attention output [B, NH, T, HS] over every cached position and the new
 * ones, as the composite (q k^T / sqrt(HS), softmax, @ v; no dropout: eval).
 * The new tokens of a step with cached positions must be one (T == 1): the
 * causal mask is then all ones; a first step (no cache) is causal. NULL on
 * error (recorded on ctx). */
slapo_node *slapo__attend_decoding(slapo_ctx *ctx, slapo_node *q, slapo_node *k, slapo_node *v);

/* GPT-2's config names, NULL-terminated (gpt2.c; the registry entry's list). */
extern const char *const slapo__gpt2_config_names[];

#endif
