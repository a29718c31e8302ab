/* models/gpt2.c - GPT-2 (Radford et al. 2019, "Language Models are
 * Unsupervised Multitask Learners") as a module tree with Hugging Face's
 * GPT2LMHeadModel names; forward written with op and child calls.
 * Reference implementations: Hugging Face transformers' modeling_gpt2.py and
 * Karpathy's llm.c train_gpt2.py. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

/* The named configs: one list of names (the registry's, slapo models')
 * and their hyper-parameters in the same order. */
const char *const slapo__gpt2_config_names[] = {"tiny", "small", "124M", "355M", "774M", "1.5B",
                                                NULL};
static const slapo_gpt2_config k_configs[] = {
    {4, 4, 128, 64, 256, 0.0, 1e-5},         /* tiny: bytes   */
    {6, 6, 384, 256, 256, 0.0, 1e-5},        /* small: bytes  */
    {12, 12, 768, 1024, 50257, 0.1, 1e-5},   /* 124M          */
    {24, 16, 1024, 1024, 50257, 0.1, 1e-5},  /* 355M          */
    {36, 20, 1280, 1024, 50257, 0.1, 1e-5},  /* 774M          */
    {48, 25, 1600, 1024, 50257, 0.1, 1e-5},  /* 1.5B          */
};
_Static_assert(SLAPO_ARRAY_LEN(k_configs) + 1 == SLAPO_ARRAY_LEN(slapo__gpt2_config_names),
               "one name per config");

slapo_status slapo_gpt2_config_named(const char *name, slapo_gpt2_config *out) {
  int i = slapo__config_index("gpt2", slapo__gpt2_config_names, name);
  if (i < 0) return SLAPO_NOT_FOUND;
  *out = k_configs[i];
  return SLAPO_OK;
}

/* Every GPT-2 module keeps a pointer to the shared config. */
static const slapo_gpt2_config *cfg_of(const slapo_module *m) { return m->config; }

/* ---- GPT2Attention ---- */

/* x [B, T, C] -> [B, T, C]: causal multi-head self-attention. */
static slapo_node *attn_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  const slapo_gpt2_config *c = cfg_of(self);
  slapo_node *x = in[0];
  (void)n_in;
  int64_t B = x->shape[0], T = x->shape[1], HS = c->n_embd / c->n_head, NH, head0;
  /* Under tensor parallelism c_attn holds this rank's heads (its weight
   * sharded with parts=3): C and NH are the local ones. */
  if (!slapo__local_heads(ctx, self, "c_attn", 3 * HS, c->n_head, "n_head", &NH, &head0))
    return NULL;
  int64_t C = NH * HS;
  slapo_node *qkv = slapo_call1(ctx, self, "c_attn", x); /* [B, T, 3C] */
  slapo_node *parts[3];
  int64_t sizes[3] = {C, C, C};
  if (slapo_split(ctx, qkv, 2, 3, sizes, parts) != SLAPO_OK) return NULL;
  int64_t bthd[4] = {B, T, NH, HS}, perm[4] = {0, 2, 1, 3};
  slapo_node *heads[3];
  for (int i = 0; i < 3; i++) /* [B, NH, T, HS] */
    heads[i] = slapo_permute(ctx, slapo_reshape(ctx, parts[i], 4, bthd), 4, perm);
  slapo_node *y; /* [B, NH, T, HS] */
  if (slapo_decode_past(ctx) >= 0) {
    y = slapo__attend_decoding(ctx, heads[0], heads[1], heads[2]);
  } else {
    /* att [B, NH, T, T] = q k^T / sqrt(HS) */
    slapo_node *att = slapo_matmul(ctx, heads[0], heads[1], false, true);
    att = slapo_mul_scalar(ctx, att, 1.0 / sqrt((double)HS));
    att = slapo_softmax(ctx, att, true);
    /* Under tensor parallelism att's layout (split on the heads axis, from
     * c_attn's shard) makes the dropout draw the unsharded model's mask in
     * this rank's heads (ops/layout.c). */
    att = slapo_call1(ctx, self, "attn_dropout", att);
    y = slapo_matmul(ctx, att, heads[2], false, false);
  }
  int64_t btc[3] = {B, T, C};
  y = slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, btc);
  y = slapo_call1(ctx, self, "c_proj", y);
  return slapo_call1(ctx, self, "resid_dropout", y);
}

static void attn_describe(const slapo_module *self, char *buf, size_t cap) {
  snprintf(buf, cap, "n_head=%d", cfg_of(self)->n_head);
}

static const slapo_module_type k_attn = {"GPT2Attention", attn_forward, attn_describe, NULL, NULL};

/* ---- GPT2MLP ---- */

static slapo_node *mlp_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  slapo_node *h = slapo_call1(ctx, self, "c_fc", in[0]); /* [B, T, 4C] */
  h = slapo_call1(ctx, self, "act", h);
  h = slapo_call1(ctx, self, "c_proj", h); /* [B, T, C] */
  return slapo_call1(ctx, self, "dropout", h);
}

static const slapo_module_type k_mlp = {"GPT2MLP", mlp_forward, NULL, NULL, NULL};

/* ---- GPT2Block ---- */

static slapo_node *block_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  (void)n_in;
  slapo_node *x = in[0]; /* [B, T, C] */
  x = slapo_add(ctx, x, slapo_call1(ctx, self, "attn", slapo_call1(ctx, self, "ln_1", x)));
  x = slapo_add(ctx, x, slapo_call1(ctx, self, "mlp", slapo_call1(ctx, self, "ln_2", x)));
  return x;
}

static const slapo_module_type k_block = {"GPT2Block", block_forward, NULL, NULL, NULL};

/* ---- GPT2Model ---- */

/* idx [B, T] -> hidden states [B, T, C] */
static slapo_node *model_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const slapo_gpt2_config *c = cfg_of(self);
  slapo_node *idx = in[0];
  (void)n_in;
  /* Positions P .. P + T - 1: P cached ones when decoding, else 0. */
  int64_t P = slapo_decode_past(ctx) > 0 ? slapo_decode_past(ctx) : 0;
  if (idx->ndim != 2 || P + idx->shape[1] > c->n_ctx) {
    char s[64];
    slapo_ctx_fail(ctx, SLAPO_SHAPE,
                   "transformer: input ids have shape %s after %lld cached positions; expected "
                   "[B, T] with T + cached <= n_ctx = %lld",
                   slapo_shape_str(idx->ndim, idx->shape, s, sizeof s), (long long)P,
                   (long long)c->n_ctx);
    return NULL;
  }
  int64_t T = idx->shape[1];
  slapo_node *tok = slapo_call1(ctx, self, "wte", idx); /* [B, T, C] */
  /* Positions P..P+T-1 are rows of wpe: a slice, not a gather. */
  slapo_module *wpe = slapo_module_child(self, "wpe");
  SLAPO_ASSERT(wpe);
  /* Pop only a frame that was pushed: a failed push (out of memory) leaves
   * the stack as it was, and popping would take the caller's frame. */
  if (slapo_ctx_push_origin(ctx, "transformer.wpe") != SLAPO_OK) return NULL;
  slapo_node *pos = slapo_slice(ctx, slapo_weight(ctx, wpe, "weight"), 0, P, P + T); /* [T, C] */
  slapo_ctx_pop_origin(ctx);
  slapo_node *x = slapo_call1(ctx, self, "drop", slapo_add(ctx, tok, pos));
  x = slapo__call_layers(ctx, self, "h", c->n_layer, 1, &x);
  return slapo_call1(ctx, self, "ln_f", x);
}

static const slapo_module_type k_model = {"GPT2Model", model_forward, NULL, NULL, NULL};

/* ---- GPT2LMHeadModel ---- */

static slapo_node *lm_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  return slapo__causal_lm_forward(ctx, self, "GPT2LMHeadModel", "transformer", n_in, in);
}

static const slapo_module_type k_lm = {"GPT2LMHeadModel", lm_forward, NULL, NULL, NULL};

/* ---- construction ---- */

static slapo_status with_cfg(const slapo_module_type *t, const slapo_gpt2_config *c,
                             slapo_module **out) {
  return slapo__module_with_config(t, c, sizeof *c, out);
}

#define ADD SLAPO__ADD
#define CHILD SLAPO__CHILD

static slapo_status block_new(const slapo_gpt2_config *c, slapo_module **out) {
  float std = 0.02f, proj_std = (float)(0.02 / sqrt(2.0 * c->n_layer));
  int64_t C = c->n_embd;
  slapo_module *b;
  SLAPO_TRY(with_cfg(&k_block, c, &b));
  ADD(b, b, "ln_1", slapo_layernorm_new(C, c->ln_eps, CHILD));
  ADD(b, b, "attn", with_cfg(&k_attn, c, CHILD));
  ADD(b, b, "ln_2", slapo_layernorm_new(C, c->ln_eps, CHILD));
  ADD(b, b, "mlp", with_cfg(&k_mlp, c, CHILD));
  slapo_module *attn = slapo_module_child(b, "attn"), *mlp = slapo_module_child(b, "mlp");
  ADD(b, attn, "c_attn", slapo_linear_new(C, 3 * C, true, std, CHILD));
  ADD(b, attn, "c_proj", slapo_linear_new(C, C, true, proj_std, CHILD));
  ADD(b, attn, "attn_dropout", slapo_dropout_new(c->dropout, CHILD));
  ADD(b, attn, "resid_dropout", slapo_dropout_new(c->dropout, CHILD));
  ADD(b, mlp, "c_fc", slapo_linear_new(C, 4 * C, true, std, CHILD));
  ADD(b, mlp, "act", slapo_gelu_new(true, CHILD));
  ADD(b, mlp, "c_proj", slapo_linear_new(4 * C, C, true, proj_std, CHILD));
  ADD(b, mlp, "dropout", slapo_dropout_new(c->dropout, CHILD));
  *out = b;
  return SLAPO_OK;
}

slapo_status slapo_gpt2_new(const slapo_gpt2_config *c, slapo_module **out) {
  *out = NULL;
  if (c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->n_ctx <= 0 ||
      c->vocab_size <= 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "gpt2: sizes must be positive (n_layer=%d n_head=%d n_embd=%lld "
                       "n_ctx=%lld vocab_size=%lld)",
                       c->n_layer, c->n_head, (long long)c->n_embd, (long long)c->n_ctx,
                       (long long)c->vocab_size);
  if (c->n_embd % c->n_head)
    return slapo_error(SLAPO_INVALID_ARG, "gpt2: n_embd %lld is not divisible by n_head %d",
                       (long long)c->n_embd, c->n_head);
  slapo_module *lm;
  SLAPO_TRY(with_cfg(&k_lm, c, &lm));
  ADD(lm, lm, "transformer", with_cfg(&k_model, c, CHILD));
  ADD(lm, lm, "lm_head", slapo_linear_new(c->n_embd, c->vocab_size, false, 0.02f, CHILD));
  slapo_module *tr = slapo_module_child(lm, "transformer");
  ADD(lm, tr, "wte", slapo_embedding_new(c->vocab_size, c->n_embd, 0.02f, CHILD));
  ADD(lm, tr, "wpe", slapo_embedding_new(c->n_ctx, c->n_embd, 0.02f, CHILD));
  ADD(lm, tr, "drop", slapo_dropout_new(c->dropout, CHILD));
  ADD(lm, tr, "h", slapo_modulelist_new(CHILD));
  slapo_module *h = slapo_module_child(tr, "h");
  for (int l = 0; l < c->n_layer; l++) {
    char name[16];
    snprintf(name, sizeof name, "%d", l);
    ADD(lm, h, name, block_new(c, CHILD));
  }
  ADD(lm, tr, "ln_f", slapo_layernorm_new(c->n_embd, c->ln_eps, CHILD));
  /* Weight tying (GPT-2; Press & Wolf 2017): lm_head reads wte's storage. */
  slapo_module *lm_head = slapo_module_child(lm, "lm_head");
  slapo_parameter *wte = slapo_module_param(slapo_module_child(tr, "wte"), "weight");
  slapo_status s = slapo_module_tie_param(lm_head, "weight", wte);
  /* What `trace` builds the model on: ids and labels [2, 8]. */
  if (s == SLAPO_OK) s = slapo__set_lm_example(lm, c->n_ctx);
  if (s != SLAPO_OK) {
    slapo_module_free(lm);
    return s;
  }
  *out = lm;
  return SLAPO_OK;
}
