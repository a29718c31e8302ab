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

/* This rank's heads: all n_head, or under tensor parallelism those its
 * query, key and value weights hold (NH from head0), which must agree. */
typedef struct heads {
  int64_t NH, head0;
} heads;

static bool heads_of(slapo_ctx *ctx, const slapo_module *self, heads *h) {
  const slapo_bert_config *c = self->config;
  int64_t HS = c->n_embd / c->n_head, nk, k0, nv, v0;
  if (!slapo__local_heads(ctx, self, "query", HS, c->n_head, "n_head", &h->NH, &h->head0) ||
      !slapo__local_heads(ctx, self, "key", HS, c->n_head, "n_head", &nk, &k0) ||
      !slapo__local_heads(ctx, self, "value", HS, c->n_head, "n_head", &nv, &v0))
    return false;
  if (nk == h->NH && nv == h->NH && k0 == h->head0 && v0 == h->head0) return true;
  slapo_ctx_fail(ctx, SLAPO_SHAPE, "%s: this rank's query, key and value hold heads %lld.., "
                 "%lld.. and %lld.. (%lld, %lld and %lld of %d): shard the three alike "
                 "(weight and bias axis=0)", slapo_ctx_origin(ctx), (long long)h->head0,
                 (long long)k0, (long long)v0, (long long)h->NH, (long long)nk, (long long)nv,
                 c->n_head);
  return false;
}

/* Checks (x [B, T, C]) or (x, bias [B, 1, 1, T]); q, k, v [B, NH, T, HS]
 * from the query, key and value Linears (NH: this rank's heads). False on
 * error (on ctx). */
static bool project(slapo_ctx *ctx, slapo_module *self, const heads *h, int n_in,
                    slapo_node *const *in, slapo_node **qkv) {
  const slapo_bert_config *c = self->config;
  if (n_in < 1 || n_in > 2 || !in[0] || in[0]->ndim != 3 || in[0]->shape[2] != c->n_embd) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: %s expects (hidden [B, T, %lld]) or (hidden, "
                   "mask bias [B, 1, 1, T]), got %d inputs", slapo_ctx_origin(ctx),
                   self->type->name, (long long)c->n_embd, n_in);
    return false;
  }
  slapo_node *x = in[0];
  int64_t B = x->shape[0], T = x->shape[1], HS = c->n_embd / c->n_head;
  int64_t bthd[4] = {B, T, h->NH, HS}, perm[4] = {0, 2, 1, 3};
  static const char *const names[3] = {"query", "key", "value"};
  for (int i = 0; i < 3; i++)
    qkv[i] = slapo_permute(ctx, slapo_reshape(ctx, slapo_call1(ctx, self, names[i], x), 4, bthd),
                           4, perm);
  return qkv[0] && qkv[1] && qkv[2];
}

/* y [B, NH, T, HS] -> [B, T, C]. */
static slapo_node *merge(slapo_ctx *ctx, slapo_node *y) {
  if (!y) return NULL;
  int64_t perm[4] = {0, 2, 1, 3}, btc[3] = {y->shape[0], y->shape[2], y->shape[1] * y->shape[3]};
  return slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, btc);
}

/* (x [B, T, C]) or (x, bias [B, 1, 1, T]) -> context [B, T, C], before
 * attention.output.dense. */
static slapo_node *self_attn_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                     slapo_node *const *in) {
  const slapo_bert_config *c = self->config;
  heads h;
  slapo_node *qkv[3]; /* q, k, v [B, NH, T, HS] */
  if (!heads_of(ctx, self, &h) || !project(ctx, self, &h, n_in, in, qkv)) return NULL;
  slapo_node *bias = n_in == 2 ? in[1] : NULL;
  /* att [B, NH, T, T] = q k^T / sqrt(HS) (+ bias): HF divides by sqrt(HS);
   * multiplying by its reciprocal is exact for the power-of-two head sizes
   * of every config here (16, 32, 64). */
  slapo_node *att = slapo_matmul(ctx, qkv[0], qkv[1], false, true);
  att = slapo_mul_scalar(ctx, att, 1.0 / sqrt((double)(c->n_embd / c->n_head)));
  if (bias) att = slapo_add(ctx, att, bias);
  att = slapo_softmax(ctx, att, false);
  /* Under tensor parallelism the dropout masks are the unsharded model's
   * in this rank's heads: att's layout (split on the heads axis, from the
   * query and key shards) says which (ops/layout.c). */
  att = slapo_call1(ctx, self, "dropout", att);
  return merge(ctx, slapo_matmul(ctx, att, qkv[2], false, false));
}

/* The same through the fused flash_attention op: the bias [B, 1, 1, T] is
 * its additive key mask [B, T] (a view), and its dropout uses the stream of
 * the replaced module's `<path>.dropout` (this call's ordinal), so masks
 * and numbers equal the composite's to rounding. */
static slapo_node *flash_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const slapo_bert_config *c = self->config;
  heads h;
  slapo_node *args[4]; /* q, k, v [B, NH, T, HS], mask [B, T] */
  if (!heads_of(ctx, self, &h) || !project(ctx, self, &h, n_in, in, args)) return NULL;
  int n = 3;
  if (n_in == 2) {
    int64_t bt[2] = {in[0]->shape[0], in[0]->shape[1]};
    args[n++] = slapo_reshape(ctx, in[1], 2, bt);
  }
  return merge(ctx, slapo__flash_attention(ctx, SLAPO_OP_DESC(flash_attention), n, args, "dropout",
                                           false, 1.0 / sqrt((double)(c->n_embd / c->n_head)),
                                           c->attn_dropout, h.NH, h.head0, c->n_head, 0));
}

static void self_attn_describe(const slapo_module *self, char *buf, size_t cap) {
  const slapo_bert_config *c = self->config;
  snprintf(buf, cap, "n_head=%d, bidirectional", c->n_head);
}

static const slapo_module_type k_self_attn = {"BertSelfAttention", self_attn_forward,
                                              self_attn_describe, NULL, NULL};
static const slapo_module_type k_flash = {"BertFlashAttention", flash_forward,
                                          self_attn_describe, NULL, NULL};

/* A self-attention of type t with c's config (copied) and, when `from` is
 * given, Linears tied to its; otherwise fresh ones. */
static slapo_status attention_new(const slapo_module_type *t, const slapo_bert_config *c,
                                  const slapo_module *from, slapo_module **out) {
  *out = NULL;
  slapo_module *m;
  SLAPO_TRY(slapo__module_with_config(t, c, sizeof *c, &m));
  static const char *const names[3] = {"query", "key", "value"};
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < 3 && s == SLAPO_OK; i++) {
    slapo_module *lin = NULL;
    s = from ? slapo__tied_linear(from, names[i], &lin)
             : slapo_linear_new(c->n_embd, c->n_embd, true, 0.02f, &lin);
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

slapo_status slapo__bert_flash_attention_new(const slapo_module *replaced, slapo_module **out) {
  return attention_new(&k_flash, replaced->config, replaced, out);
}

slapo_status slapo__bert_self_attention_new(const slapo_bert_config *c, slapo_module **out) {
  return attention_new(&k_self_attn, c, NULL, out);
}
