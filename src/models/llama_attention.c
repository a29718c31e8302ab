/* models/llama_attention.c - LLaMA's attention (Hugging Face LlamaAttention,
 * modeling_llama.py of transformers 4.40): q, k, v projections without
 * bias, rotary positions on q and k (rotate-half layout), grouped-query
 * heads (k and v have n_kv_head heads, each shared by n_head / n_kv_head
 * query heads), causal softmax, o_proj. Two module types share the
 * projections: "LlamaAttention", the composite (k and v heads repeated, as
 * Hugging Face's repeat_kv does), and its replacement "LlamaFlashAttention"
 * (the fused flash_attention op reads the grouped heads without repeating
 * them), made by the "FlashAttention" factory. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

static const slapo_llama_config *cfg_of(const slapo_module *m) { return m->config; }

/* y [B, T, n HS] -> [B, n, T, HS]. */
static slapo_node *split_heads(slapo_ctx *ctx, slapo_node *y, int64_t n, int64_t HS) {
  int64_t bthd[4] = {y->shape[0], y->shape[1], n, HS}, perm[4] = {0, 2, 1, 3};
  return slapo_permute(ctx, slapo_reshape(ctx, y, 4, bthd), 4, perm);
}

/* This rank's heads: all of them, or under tensor parallelism the ones its
 * q_proj / k_proj weight rows hold (q heads from head0 of n_head). */
typedef struct heads {
  int64_t HS, NH, NKV, head0;
} heads;

static bool heads_of(slapo_ctx *ctx, const slapo_module *self, heads *h) {
  const slapo_llama_config *c = cfg_of(self);
  *h = (heads){c->hidden / c->n_head, c->n_head, c->n_kv_head, 0};
  int64_t kv0;
  return slapo__local_heads(ctx, self, "q_proj", h->HS, c->n_head, "n_head", &h->NH, &h->head0) &&
         slapo__local_heads(ctx, self, "k_proj", h->HS, c->n_kv_head, "n_kv_head", &h->NKV, &kv0);
}

/* q [B, NH, T, HS] and k, v [B, NKV, T, HS] of x [B, T, C], rotary applied
 * to q and k at positions P .. P + T - 1 (P cached ones when decoding).
 * Returns false on error (recorded on ctx). */
static bool project(slapo_ctx *ctx, slapo_module *self, const heads *h, int n_in,
                    slapo_node *const *in, slapo_node **q, slapo_node **k, slapo_node **v) {
  const slapo_llama_config *c = cfg_of(self);
  const char *origin = slapo_ctx_origin(ctx);
  if (n_in != 1 || in[0]->ndim != 3 || in[0]->shape[2] != c->hidden) {
    char s[128] = "";
    if (n_in == 1) slapo_shape_str(in[0]->ndim, in[0]->shape, s, sizeof s);
    slapo_ctx_fail(ctx, SLAPO_SHAPE, "%s: %s expects one input x [B, T, %lld], got %d input(s)%s%s",
                   origin[0] ? origin : "(root)", self->type->name, (long long)c->hidden, n_in,
                   n_in == 1 ? " x " : "", s);
    return false;
  }
  const slapo_parameter *kw = slapo_module_param_at(self, "k_proj.weight");
  int64_t k_rows = kw && kw->value->ndim == 2 ? kw->value->shape[0] : h->NKV * h->HS;
  if (k_rows % h->HS || h->NKV == 0 || h->NH * c->n_kv_head != h->NKV * c->n_head) {
    slapo_ctx_fail(ctx, SLAPO_SHAPE, "%s: this rank's k_proj keeps %lld rows (%lld key/value "
                   "heads of %lld) for %lld query heads: a rank must keep whole key/value "
                   "heads and their %d query heads each, so the tensor-parallel size must "
                   "divide n_kv_head = %d and q_proj, k_proj, v_proj be sharded alike", origin,
                   (long long)k_rows, (long long)(k_rows / h->HS), (long long)h->HS,
                   (long long)h->NH, c->n_head / c->n_kv_head, c->n_kv_head);
    return false;
  }
  int64_t P = slapo_decode_past(ctx) > 0 ? slapo_decode_past(ctx) : 0;
  /* One call per statement: C leaves argument evaluation order open, and
   * the call order fixes the graph's node order. */
  slapo_node *qp = slapo_call1(ctx, self, "q_proj", in[0]);
  slapo_node *kp = slapo_call1(ctx, self, "k_proj", in[0]);
  slapo_node *vp = slapo_call1(ctx, self, "v_proj", in[0]);
  if (!qp || !kp || !vp) return false;
  *q = slapo_rotary(ctx, split_heads(ctx, qp, h->NH, h->HS), c->rope_theta, P);
  *k = slapo_rotary(ctx, split_heads(ctx, kp, h->NKV, h->HS), c->rope_theta, P);
  *v = split_heads(ctx, vp, h->NKV, h->HS);
  return *q && *k && *v;
}

/* y [B, NH, T, HS] -> o_proj(y as [B, T, NH HS]). */
static slapo_node *merge(slapo_ctx *ctx, slapo_module *self, slapo_node *y) {
  if (!y) return NULL;
  int64_t perm[4] = {0, 2, 1, 3}, btc[3] = {y->shape[0], y->shape[2], y->shape[1] * y->shape[3]};
  y = slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, btc);
  return slapo_call1(ctx, self, "o_proj", y);
}

/* Decoding with a KV cache: the cache holds the repeated heads (the
 * composite's shapes); one new query needs no tiling. */
static slapo_node *decode(slapo_ctx *ctx, const heads *h, slapo_node *q, slapo_node *k,
                          slapo_node *v) {
  int64_t G = h->NH / h->NKV;
  return slapo__attend_decoding(ctx, q, slapo_repeat_heads(ctx, k, G),
                                slapo_repeat_heads(ctx, v, G));
}

/* x [B, T, C] -> [B, T, C]. */
static slapo_node *attn_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  heads h;
  slapo_node *q, *k, *v;
  if (!heads_of(ctx, self, &h) || !project(ctx, self, &h, n_in, in, &q, &k, &v)) return NULL;
  if (slapo_decode_past(ctx) >= 0) return merge(ctx, self, decode(ctx, &h, q, k, v));
  int64_t G = h.NH / h.NKV;
  k = slapo_repeat_heads(ctx, k, G); /* [B, NH, T, HS] */
  v = slapo_repeat_heads(ctx, v, G);
  slapo_node *att = slapo_matmul(ctx, q, k, false, true); /* [B, NH, T, T] */
  att = slapo_softmax(ctx, slapo_mul_scalar(ctx, att, 1.0 / sqrt((double)h.HS)), true);
  /* A rank's heads draw the unsharded model's dropout mask in those heads:
   * att's layout (split on the heads axis, from q_proj's and k_proj's
   * shards) says which (ops/layout.c). */
  att = slapo_call1(ctx, self, "attn_dropout", att);
  return merge(ctx, self, slapo_matmul(ctx, att, v, false, false));
}

/* The same, with the four middle ops fused and the grouped heads read in
 * place. The fused dropout reuses the stream of the replaced module's
 * `<path>.attn_dropout` (its first random op, in this call's ordinal), so
 * train-mode masks equal the composite's. */
static slapo_node *flash_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const slapo_llama_config *c = cfg_of(self);
  heads h;
  slapo_node *qkv[3];
  if (!heads_of(ctx, self, &h) || !project(ctx, self, &h, n_in, in, &qkv[0], &qkv[1], &qkv[2]))
    return NULL;
  if (slapo_decode_past(ctx) >= 0) return merge(ctx, self, decode(ctx, &h, qkv[0], qkv[1], qkv[2]));
  slapo_node *y = slapo__flash_attention(ctx, SLAPO_OP_DESC(flash_attention), 3, qkv,
                                         "attn_dropout", true, 1.0 / sqrt((double)h.HS),
                                         c->attn_dropout, h.NH, h.head0, c->n_head, 0);
  return merge(ctx, self, y);
}

static void attn_describe(const slapo_module *self, char *buf, size_t cap) {
  const slapo_llama_config *c = cfg_of(self);
  snprintf(buf, cap, "num_heads=%d, num_key_value_heads=%d, rope_theta=%g", c->n_head,
           c->n_kv_head, c->rope_theta);
}

static const slapo_module_type k_attn = {"LlamaAttention", attn_forward, attn_describe, NULL,
                                         NULL};
static const slapo_module_type k_flash = {"LlamaFlashAttention", flash_forward, attn_describe,
                                          NULL, NULL};

static const char *const k_linears[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};

/* An attention of type t with c's config (copied) and, when `from` is
 * given, Linears tied to its; otherwise fresh ones initialized N(0, 0.02). */
static slapo_status attention_new(const slapo_module_type *t, const slapo_llama_config *c,
                                  const slapo_module *from, slapo_module **out) {
  *out = NULL;
  slapo_module *m;
  SLAPO_TRY(slapo__module_with_config(t, c, sizeof *c, &m));
  int64_t C = c->hidden, HS = c->hidden / c->n_head;
  int64_t outs[4] = {C, c->n_kv_head * HS, c->n_kv_head * HS, C};
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < 4 && s == SLAPO_OK; i++) {
    slapo_module *l;
    s = from ? slapo__tied_linear(from, k_linears[i], &l)
             : slapo_linear_new(C, outs[i], false, 0.02f, &l);
    if (s == SLAPO_OK) s = slapo_module_add_child(m, k_linears[i], l);
  }
  slapo_module *drop;
  if (s == SLAPO_OK) s = slapo_dropout_new(c->attn_dropout, &drop);
  if (s == SLAPO_OK) s = slapo_module_add_child(m, "attn_dropout", drop);
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}

slapo_status slapo__llama_attention_new(const slapo_llama_config *c, slapo_module **out) {
  return attention_new(&k_attn, c, NULL, out);
}

slapo_status slapo__llama_flash_attention_new(const slapo_module *replaced, slapo_module **out) {
  return attention_new(&k_flash, cfg_of(replaced), replaced, out);
}
