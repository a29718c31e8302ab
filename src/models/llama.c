/* models/llama.c - LLaMA (Touvron et al. 2023, "LLaMA" and "Llama 2") as a
 * module tree with Hugging Face's LlamaForCausalLM names: RMSNorm before
 * attention and MLP, rotary positions, SwiGLU MLP (Shazeer 2020), grouped-
 * query attention (Ainslie et al. 2023; models/llama_attention.c), no
 * biases, untied head by default. Followed: Hugging Face transformers 4.40
 * src/transformers/models/llama/modeling_llama.py. Layer: models. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

const char *const slapo__llama_config_names[] = {"tiny", "small", "1.1B", "7B", NULL};
/* tiny/small: GPT-2 tiny's and small's width, depth and context; the SwiGLU
 * width ~8C/3 (rounded to a multiple of 32) keeps the MLP at GPT-2's 8 C^2
 * weights; 2 kv heads exercise grouped-query attention. 1.1B: TinyLlama's
 * config.json; 7B: Llama-2-7b-hf's. */
static const slapo_llama_config k_configs[] = {
    {4, 4, 2, 128, 352, 64, 256, 1e-5, 10000.0, 0.0, false},            /* tiny  */
    {6, 6, 2, 384, 1024, 256, 256, 1e-5, 10000.0, 0.0, false},          /* small */
    {22, 32, 4, 2048, 5632, 2048, 32000, 1e-5, 10000.0, 0.0, false},    /* 1.1B  */
    {32, 32, 32, 4096, 11008, 4096, 32000, 1e-5, 10000.0, 0.0, false},  /* 7B    */
};
_Static_assert(SLAPO_ARRAY_LEN(k_configs) + 1 == SLAPO_ARRAY_LEN(slapo__llama_config_names),
               "one name per config");

slapo_status slapo_llama_config_named(const char *name, slapo_llama_config *out) {
  int i = slapo__config_index("llama", slapo__llama_config_names, name);
  if (i < 0) return SLAPO_NOT_FOUND;
  *out = k_configs[i];
  return SLAPO_OK;
}

static const slapo_llama_config *cfg_of(const slapo_module *m) { return m->config; }

/* ---- LlamaMLP: down(silu(gate(x)) * up(x)) ---- */

static slapo_node *mlp_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  slapo_node *gate = slapo_call1(ctx, self, "gate_proj", in[0]); /* [B, T, I] */
  gate = slapo_call1(ctx, self, "act_fn", gate);
  slapo_node *up = slapo_call1(ctx, self, "up_proj", in[0]);
  return slapo_call1(ctx, self, "down_proj", slapo_mul(ctx, gate, up)); /* [B, T, C] */
}

static const slapo_module_type k_mlp = {"LlamaMLP", mlp_forward, NULL, NULL, NULL};

/* ---- LlamaDecoderLayer ---- */

static slapo_node *layer_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  (void)n_in;
  slapo_node *x = in[0]; /* [B, T, C] */
  slapo_node *h = slapo_call1(ctx, self, "input_layernorm", x);
  x = slapo_add(ctx, x, slapo_call1(ctx, self, "self_attn", h));
  h = slapo_call1(ctx, self, "post_attention_layernorm", x);
  return slapo_add(ctx, x, slapo_call1(ctx, self, "mlp", h));
}

static const slapo_module_type k_layer = {"LlamaDecoderLayer", layer_forward, NULL, NULL, NULL};

/* ---- LlamaModel: idx [B, T] -> hidden states [B, T, C] ---- */

static slapo_node *model_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const slapo_llama_config *c = cfg_of(self);
  slapo_node *idx = in[0];
  (void)n_in;
  int64_t P = slapo_decode_past(ctx) > 0 ? slapo_decode_past(ctx) : 0;
  if (idx->ndim != 2 || P + idx->shape[1] > c->n_ctx) {
    char s[64];
    slapo_ctx_fail(ctx, SLAPO_SHAPE,
                   "model: input ids have shape %s after %lld cached positions; expected [B, T] "
                   "with T + cached <= max_position_embeddings = %lld",
                   slapo_shape_str(idx->ndim, idx->shape, s, sizeof s), (long long)P,
                   (long long)c->n_ctx);
    return NULL;
  }
  slapo_node *x = slapo_call1(ctx, self, "embed_tokens", idx); /* [B, T, C] */
  x = slapo__call_layers(ctx, self, "layers", c->n_layer, 1, &x);
  return slapo_call1(ctx, self, "norm", x);
}

static const slapo_module_type k_model = {"LlamaModel", model_forward, NULL, NULL, NULL};

/* ---- LlamaForCausalLM ---- */

static slapo_node *lm_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  return slapo__causal_lm_forward(ctx, self, "LlamaForCausalLM", "model", n_in, in);
}

static const slapo_module_type k_lm = {"LlamaForCausalLM", lm_forward, NULL, NULL, NULL};

/* ---- construction ---- */

static slapo_status with_cfg(const slapo_module_type *t, const slapo_llama_config *c,
                             slapo_module **out) {
  return slapo__module_with_config(t, c, sizeof *c, out);
}

#define ADD SLAPO__ADD
#define CHILD SLAPO__CHILD

static slapo_status layer_new(const slapo_llama_config *c, slapo_module **out) {
  int64_t C = c->hidden, I = c->intermediate;
  slapo_module *b;
  SLAPO_TRY(with_cfg(&k_layer, c, &b));
  ADD(b, b, "input_layernorm", slapo_rmsnorm_new(C, c->rms_eps, CHILD));
  ADD(b, b, "self_attn", slapo__llama_attention_new(c, CHILD));
  ADD(b, b, "post_attention_layernorm", slapo_rmsnorm_new(C, c->rms_eps, CHILD));
  ADD(b, b, "mlp", with_cfg(&k_mlp, c, CHILD));
  slapo_module *mlp = slapo_module_child(b, "mlp");
  ADD(b, mlp, "gate_proj", slapo_linear_new(C, I, false, 0.02f, CHILD));
  ADD(b, mlp, "up_proj", slapo_linear_new(C, I, false, 0.02f, CHILD));
  ADD(b, mlp, "down_proj", slapo_linear_new(I, C, false, 0.02f, CHILD));
  ADD(b, mlp, "act_fn", slapo_silu_new(CHILD));
  *out = b;
  return SLAPO_OK;
}

static slapo_status check_config(const slapo_llama_config *c) {
  if (c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 || c->hidden <= 0 ||
      c->intermediate <= 0 || c->n_ctx <= 0 || c->vocab_size <= 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "llama: sizes must be positive (layers=%d heads=%d kv_heads=%d hidden=%lld "
                       "intermediate=%lld positions=%lld vocab=%lld)",
                       c->n_layer, c->n_head, c->n_kv_head, (long long)c->hidden,
                       (long long)c->intermediate, (long long)c->n_ctx, (long long)c->vocab_size);
  if (c->hidden % c->n_head || (c->hidden / c->n_head) % 2)
    return slapo_error(SLAPO_INVALID_ARG,
                       "llama: hidden_size %lld must split into %d heads of an even size "
                       "(rotary turns pairs)",
                       (long long)c->hidden, c->n_head);
  if (c->n_head % c->n_kv_head)
    return slapo_error(SLAPO_INVALID_ARG,
                       "llama: num_attention_heads %d is not divisible by num_key_value_heads %d",
                       c->n_head, c->n_kv_head);
  if (!(c->attn_dropout >= 0 && c->attn_dropout < 1))
    return slapo_error(SLAPO_INVALID_ARG, "llama: attention_dropout %g is outside [0, 1)",
                       c->attn_dropout);
  return SLAPO_OK;
}


slapo_status slapo_llama_new(const slapo_llama_config *c, slapo_module **out) {
  *out = NULL;
  SLAPO_TRY(check_config(c));
  slapo_module *lm;
  SLAPO_TRY(with_cfg(&k_lm, c, &lm));
  ADD(lm, lm, "model", with_cfg(&k_model, c, CHILD));
  ADD(lm, lm, "lm_head", slapo_linear_new(c->hidden, c->vocab_size, false, 0.02f, CHILD));
  slapo_module *m = slapo_module_child(lm, "model");
  ADD(lm, m, "embed_tokens", slapo_embedding_new(c->vocab_size, c->hidden, 0.02f, CHILD));
  ADD(lm, m, "layers", slapo_modulelist_new(CHILD));
  slapo_module *layers = slapo_module_child(m, "layers");
  for (int l = 0; l < c->n_layer; l++) {
    char name[16];
    snprintf(name, sizeof name, "%d", l);
    ADD(lm, layers, name, layer_new(c, CHILD));
  }
  ADD(lm, m, "norm", slapo_rmsnorm_new(c->hidden, c->rms_eps, CHILD));
  slapo_status s = SLAPO_OK;
  if (c->tie_embeddings) {
    slapo_parameter *emb = slapo_module_param(slapo_module_child(m, "embed_tokens"), "weight");
    s = slapo_module_tie_param(slapo_module_child(lm, "lm_head"), "weight", emb);
  }
  if (s == SLAPO_OK) s = slapo__set_lm_example(lm, c->n_ctx); /* for `trace` */
  if (s != SLAPO_OK) {
    slapo_module_free(lm);
    return s;
  }
  *out = lm;
  return SLAPO_OK;
}

static const slapo__hf_layout k_llama_layout = {
    .family = "llama",
    .tied = (const char *const[][2]){{"lm_head.weight", "model.embed_tokens.weight"}, {NULL, NULL}},
    .ignored = (const char *const[]){"*rotary_emb.inv_freq", NULL},
};

slapo_status slapo_llama_load(slapo_module *model, const char *path) {
  return slapo__hf_load(model, path, &k_llama_layout);
}

slapo_status slapo_llama_save(slapo_module *model, const char *path, int n_meta,
                              const char *const *keys, const char *const *values) {
  return slapo__hf_save(model, path, &k_llama_layout, n_meta, keys, values);
}
