/* models/bert_attention.c - BERT's self-attention (Hugging Face's
 * BertSelfAttention, eager path) as its own module type, written as the
 * composite q k^T / sqrt(HS) + mask bias, softmax, dropout, @ v, so a
 * schedule can later `replace` it with a fused attention module; and the
 * additive padding-mask bias every layer shares. Math: Vaswani et al. 2017
 * eq. 1; the mask convention of transformers' get_extended_attention_mask.
 * Layer: models. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "core/assert.h"
#include "models/internal.h"

slapo_node *slapo__bert_mask_bias(slapo_ctx *ctx, slapo_node *mask) {
  if (!mask) return NULL;
  int64_t B = mask->shape[0], T = mask->shape[1];
  /* (mask - 1) * FLT_MAX is Hugging Face's (1 - mask) * finfo(f32).min:
   * exactly 0 where mask is 1, -FLT_MAX where it is 0. A score plus
   * -FLT_MAX rounds to -FLT_MAX (its ulp is 2^104), so every padded key of
   * a row has the same score and a row with no real key is uniform (the
   * softmax subtracts the row maximum, -FLT_MAX, giving e^0 everywhere)
   * rather than 0/0. An infinite bias would give NaN there instead. */
  slapo_node *bias = slapo_mul_scalar(ctx, slapo_add_scalar(ctx, mask, -1.0), (double)FLT_MAX);
  int64_t b11t[4] = {B, 1, 1, T};
  return slapo_reshape(ctx, bias, 4, b11t); /* [B, 1, 1, T], broadcast over heads, queries */
}

/* (x [B, T, C]) or (x, bias [B, 1, 1, T]) -> context [B, T, C], before
 * attention.output.dense. */
static slapo_node *self_attn_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                     slapo_node *const *in) {
  const slapo_bert_config *c = self->config;
  if (n_in < 1 || n_in > 2 || !in[0] || in[0]->ndim != 3 || in[0]->shape[2] != c->n_embd) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: BertSelfAttention expects (hidden [B, T, %lld]) "
                   "or (hidden, mask bias [B, 1, 1, T]), got %d inputs", slapo_ctx_origin(ctx),
                   (long long)c->n_embd, n_in);
    return NULL;
  }
  slapo_node *x = in[0], *bias = n_in == 2 ? in[1] : NULL;
  int64_t B = x->shape[0], T = x->shape[1], C = c->n_embd, NH = c->n_head, HS = C / NH;
  int64_t bthd[4] = {B, T, NH, HS}, perm[4] = {0, 2, 1, 3};
  static const char *const names[3] = {"query", "key", "value"};
  slapo_node *heads[3]; /* q, k, v [B, NH, T, HS] */
  for (int i = 0; i < 3; i++)
    heads[i] = slapo_permute(ctx, slapo_reshape(ctx, slapo_call1(ctx, self, names[i], x), 4, bthd),
                             4, perm);
  /* att [B, NH, T, T] = q k^T / sqrt(HS) (+ bias): HF divides by sqrt(HS);
   * multiplying by its reciprocal is exact for the power-of-two head sizes
   * of every config here (16, 32, 64). */
  slapo_node *att = slapo_matmul(ctx, heads[0], heads[1], false, true);
  att = slapo_mul_scalar(ctx, att, 1.0 / sqrt((double)HS));
  if (bias) att = slapo_add(ctx, att, bias);
  att = slapo_softmax(ctx, att, false);
  att = slapo_call1(ctx, self, "dropout", att);
  slapo_node *y = slapo_matmul(ctx, att, heads[2], false, false); /* [B, NH, T, HS] */
  int64_t btc[3] = {B, T, C};
  return slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, btc);
}

static void self_attn_describe(const slapo_module *self, char *buf, size_t cap) {
  const slapo_bert_config *c = self->config;
  snprintf(buf, cap, "n_head=%d, bidirectional", c->n_head);
}

static const slapo_module_type k_self_attn = {"BertSelfAttention", self_attn_forward,
                                              self_attn_describe, NULL, NULL};

slapo_status slapo__bert_self_attention_new(const slapo_bert_config *c, slapo_module **out) {
  *out = NULL;
  slapo_bert_config *d = slapo_malloc(sizeof *d);
  if (!d) return slapo_error(SLAPO_NOMEM, "bert: out of memory");
  *d = *c;
  slapo_module *m;
  SLAPO_TRY(slapo_module_new(&k_self_attn, d, &m));
  static const char *const names[3] = {"query", "key", "value"};
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < 3 && s == SLAPO_OK; i++) {
    slapo_module *lin = NULL;
    s = slapo_linear_new(c->n_embd, c->n_embd, true, 0.02f, &lin);
    if (s == SLAPO_OK) s = slapo_module_add_child(m, names[i], lin);
  }
  slapo_module *drop = NULL;
  if (s == SLAPO_OK) s = slapo_dropout_new(c->attn_dropout, &drop);
  if (s == SLAPO_OK) s = slapo_module_add_child(m, "dropout", drop);
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}
