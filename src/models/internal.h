/* models/internal.h - what GPT-2's attention and its FlashAttention
 * replacement share, and what BERT's files share. Layer: models
 * (internal). */
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

/* BERT's config names, NULL-terminated (bert.c; the registry entry's list). */
extern const char *const slapo__bert_config_names[];

/* The additive attention bias of a Hugging Face attention_mask (bert_attention.c):
 * mask [B, T] f32 (1 keep, 0 padding) -> (mask - 1) * FLT_MAX as [B, 1, 1, T]
 * (0 where kept, -FLT_MAX at padded keys). NULL for a NULL mask or on error
 * (recorded on ctx). */
slapo_node *slapo__bert_mask_bias(slapo_ctx *ctx, slapo_node *mask);

/* A BertSelfAttention module (query, key, value Linear [C, C] with bias,
 * N(0, 0.02); dropout with c->attn_dropout): (hidden [B, T, C][, bias
 * [B, 1, 1, T]]) -> context [B, T, C]. c is copied; *out owned. Errors:
 * NOMEM. */
slapo_status slapo__bert_self_attention_new(const slapo_bert_config *c, slapo_module **out);

#endif
