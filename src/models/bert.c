/* models/bert.c - BERT (Devlin et al. 2019, "BERT: Pre-training of Deep
 * Bidirectional Transformers for Language Understanding") as
 * BertForMaskedLM without pooler, with Hugging Face's module names; the
 * named configs and construction. Forward written with op and child calls;
 * self-attention lives in bert_attention.c. Reference implementation:
 * transformers' models/bert/modeling_bert.py (post-LayerNorm blocks, erf
 * GELU, LayerNorm eps 1e-12, decoder tied to the word embeddings).
 * Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

/* The named configs: names (the registry's list) and hyper-parameters in
 * the same order. tiny and small have GPT-2's tiny and small widths, depths
 * and contexts, so the two families compare at one budget. */
const char *const slapo__bert_config_names[] = {"tiny", "small", "base", NULL};
static const slapo_bert_config k_configs[] = {
    /* L, NH, C, inner, ctx, V, types, dropout, attn dropout, eps, pad, mask */
    {4, 4, 128, 512, 64, SLAPO_BERT_BYTE_VOCAB, 2, 0.0, 0.0, 1e-12, SLAPO_BERT_BYTE_PAD,
     SLAPO_BERT_BYTE_MASK},
    {6, 6, 384, 1536, 256, SLAPO_BERT_BYTE_VOCAB, 2, 0.0, 0.0, 1e-12, SLAPO_BERT_BYTE_PAD,
     SLAPO_BERT_BYTE_MASK},
    /* bert-base-uncased's config.json: [PAD] 0, [MASK] 103 in its vocab.txt. */
    {12, 12, 768, 3072, 512, 30522, 2, 0.1, 0.1, 1e-12, 0, 103},
};
_Static_assert(SLAPO_ARRAY_LEN(k_configs) + 1 == SLAPO_ARRAY_LEN(slapo__bert_config_names),
               "one name per config");

slapo_status slapo_bert_config_named(const char *name, slapo_bert_config *out) {
  int i = slapo__config_index("bert", slapo__bert_config_names, name);
  if (i < 0) return SLAPO_NOT_FOUND;
  *out = k_configs[i];
  return SLAPO_OK;
}

/* Every BERT module keeps its own copy of the config. */
static const slapo_bert_config *cfg_of(const slapo_module *m) { return m->config; }

/* ---- BertEmbeddings ---- */

/* One parameter of child `name` as a node, its origin the child's path. */
static slapo_node *child_weight(slapo_ctx *ctx, slapo_module *self, const char *name) {
  slapo_module *m = slapo_module_child(self, name);
  SLAPO_ASSERT(m);
  char path[512];
  const char *here = slapo_ctx_origin(ctx);
  snprintf(path, sizeof path, "%s%s%s", here, *here ? "." : "", name);
  if (slapo_ctx_push_origin(ctx, path) != SLAPO_OK) return NULL;
  slapo_node *w = slapo_weight(ctx, m, "weight");
  slapo_ctx_pop_origin(ctx);
  return w;
}

/* input_ids [B, T] -> LayerNorm(word + token_type + position) [B, T, C]. */
static slapo_node *embeddings_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                      slapo_node *const *in) {
  (void)n_in;
  slapo_node *ids = in[0];
  int64_t T = ids->shape[1];
  slapo_node *x = slapo_call1(ctx, self, "word_embeddings", ids); /* [B, T, C] */
  /* Token type ids are all 0 (HF's default buffer): row 0 of the table,
   * broadcast; its gradient is the sum over every position, as a gather
   * of zeros would give. Positions 0..T-1 are rows of the position table:
   * a slice, not a gather. HF adds word + type, then position. */
  slapo_node *type0 = slapo_slice(ctx, child_weight(ctx, self, "token_type_embeddings"), 0, 0, 1);
  slapo_node *pos = slapo_slice(ctx, child_weight(ctx, self, "position_embeddings"), 0, 0, T);
  x = slapo_add(ctx, slapo_add(ctx, x, type0), pos);
  x = slapo_call1(ctx, self, "LayerNorm", x);
  return slapo_call1(ctx, self, "dropout", x);
}

static const slapo_module_type k_embeddings = {"BertEmbeddings", embeddings_forward, NULL, NULL,
                                               NULL};

/* ---- BertSelfOutput / BertOutput: LayerNorm(dropout(dense(h)) + residual) ---- */

static slapo_node *output_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  SLAPO_ASSERT(n_in == 2);
  slapo_node *h = slapo_call1(ctx, self, "dense", in[0]);
  h = slapo_call1(ctx, self, "dropout", h);
  return slapo_call1(ctx, self, "LayerNorm", slapo_add(ctx, h, in[1]));
}

static const slapo_module_type k_self_output = {"BertSelfOutput", output_forward, NULL, NULL,
                                                NULL};
static const slapo_module_type k_output = {"BertOutput", output_forward, NULL, NULL, NULL};

/* ---- BertAttention: (x[, bias]) -> output(self(x[, bias]), x) ---- */

static slapo_node *attention_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                     slapo_node *const *in) {
  slapo_node *ctx_layer = slapo_call(ctx, self, "self", n_in, in); /* [B, T, C] */
  slapo_node *args[2] = {ctx_layer, in[0]};
  return slapo_call(ctx, self, "output", 2, args);
}

static const slapo_module_type k_attention = {"BertAttention", attention_forward, NULL, NULL,
                                              NULL};

/* ---- BertIntermediate: act(dense(x)) [B, T, inner] ---- */

static slapo_node *intermediate_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                        slapo_node *const *in) {
  (void)n_in;
  slapo_node *h = slapo_call1(ctx, self, "dense", in[0]);
  return slapo_call1(ctx, self, "intermediate_act_fn", h);
}

static const slapo_module_type k_intermediate = {"BertIntermediate", intermediate_forward, NULL,
                                                 NULL, NULL};

/* ---- BertLayer (post-LN): a = attention(x), output(intermediate(a), a) ---- */

static slapo_node *layer_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  slapo_node *a = slapo_call(ctx, self, "attention", n_in, in); /* [B, T, C] */
  slapo_node *args[2] = {slapo_call1(ctx, self, "intermediate", a), a};
  return slapo_call(ctx, self, "output", 2, args);
}

static const slapo_module_type k_layer = {"BertLayer", layer_forward, NULL, NULL, NULL};

/* ---- BertEncoder: the layers in order, each given the same mask bias ---- */

static slapo_node *encoder_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                   slapo_node *const *in) {
  const slapo_bert_config *c = cfg_of(self);
  slapo_node *args[2] = {in[0], n_in > 1 ? in[1] : NULL};
  return slapo__call_layers(ctx, self, "layer", c->n_layer, n_in, args);
}

static const slapo_module_type k_encoder = {"BertEncoder", encoder_forward, NULL, NULL, NULL};

/* ---- BertModel (no pooler): (ids[, mask]) -> hidden states [B, T, C] ---- */

static slapo_node *model_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const slapo_bert_config *c = cfg_of(self);
  if (slapo_decode_past(ctx) >= 0) {
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED, "%s: BERT attends in both directions, so it cannot "
                   "decode with a KV cache (generation needs a causal LM)",
                   slapo_ctx_origin(ctx));
    return NULL;
  }
  slapo_node *ids = in[0];
  if (ids->ndim != 2 || ids->shape[1] > c->n_ctx) {
    char s[64];
    slapo_ctx_fail(ctx, SLAPO_SHAPE, "%s: input ids have shape %s; expected [B, T] with T <= "
                   "max_position_embeddings = %lld", slapo_ctx_origin(ctx),
                   slapo_shape_str(ids->ndim, ids->shape, s, sizeof s), (long long)c->n_ctx);
    return NULL;
  }
  slapo_node *args[2] = {slapo_call1(ctx, self, "embeddings", ids), NULL};
  /* The bias is built once here and shared by every layer, as HF's
   * get_extended_attention_mask does in BertModel.forward. */
  if (n_in > 1) args[1] = slapo__bert_mask_bias(ctx, in[1]);
  return slapo_call(ctx, self, "encoder", n_in > 1 ? 2 : 1, args);
}

static const slapo_module_type k_model = {"BertModel", model_forward, NULL, NULL, NULL};

/* ---- the MLM head: decoder(LayerNorm(act(dense(x)))) + bias ---- */

static slapo_node *transform_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                     slapo_node *const *in) {
  (void)n_in;
  slapo_node *h = slapo_call1(ctx, self, "dense", in[0]);
  h = slapo_call1(ctx, self, "transform_act_fn", h);
  return slapo_call1(ctx, self, "LayerNorm", h);
}

static const slapo_module_type k_transform = {"BertPredictionHeadTransform", transform_forward,
                                              NULL, NULL, NULL};

/* The decoder Linear's bias is this module's own `bias` parameter (tied),
 * so the GEMM adds it as HF's decoder does. */
static slapo_node *predictions_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                       slapo_node *const *in) {
  (void)n_in;
  return slapo_call1(ctx, self, "decoder", slapo_call1(ctx, self, "transform", in[0]));
}

static const slapo_module_type k_predictions = {"BertLMPredictionHead", predictions_forward, NULL,
                                                NULL, NULL};

static slapo_node *mlm_head_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                    slapo_node *const *in) {
  (void)n_in;
  return slapo_call1(ctx, self, "predictions", in[0]);
}

static const slapo_module_type k_mlm_head = {"BertOnlyMLMHead", mlm_head_forward, NULL, NULL,
                                             NULL};

/* ---- BertForMaskedLM ---- */

static bool is_int(const slapo_node *n) {
  return n->dtype == SLAPO_DTYPE_I32 || n->dtype == SLAPO_DTYPE_I64;
}

static bool same_bt(const slapo_node *a, const slapo_node *b) {
  return b->ndim == 2 && a->ndim == 2 && a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1];
}

/* Inputs: ids, then labels (integer) and/or attention_mask (f32), told
 * apart by dtype; see slapo_bert_new. */
static slapo_node *mlm_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  slapo_node *ids = n_in >= 1 ? in[0] : NULL, *labels = NULL, *mask = NULL;
  bool ok = n_in >= 1 && n_in <= 3 && ids && is_int(ids) && ids->ndim == 2;
  if (ok && n_in >= 2) {
    if (is_int(in[1])) labels = in[1];
    else mask = in[1];
  }
  if (ok && n_in == 3) {
    ok = labels != NULL;
    mask = in[2];
  }
  if (ok && labels) ok = same_bt(ids, labels);
  if (ok && mask) ok = mask->dtype == SLAPO_DTYPE_F32 && same_bt(ids, mask);
  if (!ok) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                   "BertForMaskedLM: expects (input_ids [B, T] i32) followed by labels [B, T] "
                   "i32/i64 and/or attention_mask [B, T] f32 (1 keep, 0 padding), in that order; "
                   "got %d inputs", n_in);
    return NULL;
  }
  slapo_node *args[2] = {ids, mask};
  slapo_node *h = slapo_call(ctx, self, "bert", mask ? 2 : 1, args);
  slapo_node *logits = slapo_call1(ctx, self, "cls", h); /* [B, T, V] */
  if (!labels) return logits;
  return slapo_cross_entropy(ctx, logits, labels, SLAPO_IGNORE_INDEX);
}

static const slapo_module_type k_mlm = {"BertForMaskedLM", mlm_forward, NULL, NULL, NULL};

/* ---- construction ---- */

static slapo_status with_cfg(const slapo_module_type *t, const slapo_bert_config *c,
                             slapo_module **out) {
  return slapo__module_with_config(t, c, sizeof *c, out);
}

#define ADD SLAPO__ADD
#define CHILD SLAPO__CHILD

/* dense (in -> out), dropout, LayerNorm: BertSelfOutput / BertOutput. */
static slapo_status output_new(const slapo_module_type *t, const slapo_bert_config *c, int64_t in,
                               slapo_module **out) {
  slapo_module *m;
  SLAPO_TRY(with_cfg(t, c, &m));
  ADD(m, m, "dense", slapo_linear_new(in, c->n_embd, true, 0.02f, CHILD));
  ADD(m, m, "LayerNorm", slapo_layernorm_new(c->n_embd, c->ln_eps, CHILD));
  ADD(m, m, "dropout", slapo_dropout_new(c->dropout, CHILD));
  *out = m;
  return SLAPO_OK;
}

static slapo_status layer_new(const slapo_bert_config *c, slapo_module **out) {
  slapo_module *b;
  SLAPO_TRY(with_cfg(&k_layer, c, &b));
  ADD(b, b, "attention", with_cfg(&k_attention, c, CHILD));
  ADD(b, b, "intermediate", with_cfg(&k_intermediate, c, CHILD));
  ADD(b, b, "output", output_new(&k_output, c, c->n_inner, CHILD));
  slapo_module *att = slapo_module_child(b, "attention");
  slapo_module *inter = slapo_module_child(b, "intermediate");
  ADD(b, att, "self", slapo__bert_self_attention_new(c, CHILD));
  ADD(b, att, "output", output_new(&k_self_output, c, c->n_embd, CHILD));
  ADD(b, inter, "dense", slapo_linear_new(c->n_embd, c->n_inner, true, 0.02f, CHILD));
  ADD(b, inter, "intermediate_act_fn", slapo_gelu_new(false, CHILD)); /* erf GELU ("gelu") */
  *out = b;
  return SLAPO_OK;
}

/* cls.predictions: bias [V], transform, decoder (weight tied to `wte`,
 * bias tied to the bias). */
static slapo_status head_new(slapo_module *root, const slapo_bert_config *c,
                             slapo_parameter *wte) {
  int64_t V = c->vocab_size, C = c->n_embd;
  ADD(root, root, "cls", with_cfg(&k_mlm_head, c, CHILD));
  slapo_module *cls = slapo_module_child(root, "cls");
  ADD(root, cls, "predictions", with_cfg(&k_predictions, c, CHILD));
  slapo_module *pred = slapo_module_child(cls, "predictions");
  /* Registered on the head itself before its children, so the tied bias's
   * canonical path is cls.predictions.bias (HF's name). */
  slapo_status s = slapo_module_add_param(pred, "bias", 1, &V, SLAPO_INIT_ZEROS, 0);
  if (s != SLAPO_OK) {
    slapo_module_free(root);
    return s;
  }
  ADD(root, pred, "transform", with_cfg(&k_transform, c, CHILD));
  slapo_module *tr = slapo_module_child(pred, "transform");
  ADD(root, tr, "dense", slapo_linear_new(C, C, true, 0.02f, CHILD));
  ADD(root, tr, "transform_act_fn", slapo_gelu_new(false, CHILD));
  ADD(root, tr, "LayerNorm", slapo_layernorm_new(C, c->ln_eps, CHILD));
  ADD(root, pred, "decoder", slapo_linear_new(C, V, true, 0.02f, CHILD));
  slapo_module *dec = slapo_module_child(pred, "decoder");
  s = slapo_module_tie_param(dec, "weight", wte);
  if (s == SLAPO_OK) s = slapo_module_tie_param(dec, "bias", slapo_module_param(pred, "bias"));
  if (s != SLAPO_OK) slapo_module_free(root);
  return s;
}


slapo_status slapo_bert_new(const slapo_bert_config *c, slapo_module **out) {
  *out = NULL;
  if (c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->n_inner <= 0 || c->n_ctx <= 0 ||
      c->vocab_size <= 0 || c->type_vocab <= 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "bert: sizes must be positive (n_layer=%d n_head=%d n_embd=%lld "
                       "n_inner=%lld n_ctx=%lld vocab_size=%lld type_vocab=%lld)",
                       c->n_layer, c->n_head, (long long)c->n_embd, (long long)c->n_inner,
                       (long long)c->n_ctx, (long long)c->vocab_size, (long long)c->type_vocab);
  if (c->n_embd % c->n_head)
    return slapo_error(SLAPO_INVALID_ARG, "bert: hidden size %lld is not divisible by %d heads",
                       (long long)c->n_embd, c->n_head);
  slapo_module *root;
  SLAPO_TRY(with_cfg(&k_mlm, c, &root));
  ADD(root, root, "bert", with_cfg(&k_model, c, CHILD));
  slapo_module *bert = slapo_module_child(root, "bert");
  ADD(root, bert, "embeddings", with_cfg(&k_embeddings, c, CHILD));
  slapo_module *emb = slapo_module_child(bert, "embeddings");
  ADD(root, emb, "word_embeddings", slapo_embedding_new(c->vocab_size, c->n_embd, 0.02f, CHILD));
  ADD(root, emb, "position_embeddings", slapo_embedding_new(c->n_ctx, c->n_embd, 0.02f, CHILD));
  ADD(root, emb, "token_type_embeddings",
      slapo_embedding_new(c->type_vocab, c->n_embd, 0.02f, CHILD));
  ADD(root, emb, "LayerNorm", slapo_layernorm_new(c->n_embd, c->ln_eps, CHILD));
  ADD(root, emb, "dropout", slapo_dropout_new(c->dropout, CHILD));
  ADD(root, bert, "encoder", with_cfg(&k_encoder, c, CHILD));
  slapo_module *enc = slapo_module_child(bert, "encoder");
  ADD(root, enc, "layer", slapo_modulelist_new(CHILD));
  slapo_module *layers = slapo_module_child(enc, "layer");
  for (int l = 0; l < c->n_layer; l++) {
    char name[16];
    snprintf(name, sizeof name, "%d", l);
    ADD(root, layers, name, layer_new(c, CHILD));
  }
  slapo_parameter *wte = slapo_module_param(slapo_module_child(emb, "word_embeddings"), "weight");
  SLAPO_TRY(head_new(root, c, wte)); /* frees root on error */
  slapo_status s = slapo__set_lm_example(root, c->n_ctx); /* for `trace` */
  if (s != SLAPO_OK) {
    slapo_module_free(root);
    return s;
  }
  *out = root;
  return SLAPO_OK;
}
