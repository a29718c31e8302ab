/* slapo/models.h - the model zoo: GPT-2 and BERT with Hugging Face
 * parameter names, their configs, and checkpoint import/export in the
 * Hugging Face layout.
 * Layer: models (depends on apply and everything below). */
#ifndef SLAPO_MODELS_H
#define SLAPO_MODELS_H

#include "slapo/apply.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the zoo's replacement modules with the primitives layer
 * ("FlashAttention"), so schedule files can name them. Idempotent; call it
 * once before applying schedules. Errors: NOMEM. */
slapo_status slapo_models_init(void);

/* ------------------------------------------------------------------------ */
/* The model registry: one entry per family                                  */
/* ------------------------------------------------------------------------ */

/* What a family trains for: the meaning of its forward (idx, targets). */
typedef enum slapo_objective {
  SLAPO_OBJECTIVE_CAUSAL_LM, /* next-token cross-entropy over every position */
  /* Masked LM (BERT): the trainer corrupts a share of the input positions
   * (slapo_mlm_mask) and targets hold the original ids there, -100
   * elsewhere; the forward's (idx, targets) is the cross-entropy over the
   * corrupted positions only. Nothing is generated left to right, so the
   * trainer skips sampling. */
  SLAPO_OBJECTIVE_MASKED_LM,
} slapo_objective;

/* What a family says about one of its configs. */
typedef struct slapo_model_dims {
  int64_t n_ctx;       /* longest sequence (positions)                       */
  int64_t vocab_size;  /* 256 for byte-level configs                         */
  double dropout;      /* the config's default dropout probability           */
  int64_t eos_token;   /* end-of-text token id, -1 when there is none        */
  int n_layer;         /* blocks (for MFU's attention term 12 L T C)         */
  int64_t width;       /* hidden size C                                      */
  /* Masked LM only (read when the family's objective is
   * SLAPO_OBJECTIVE_MASKED_LM): the [MASK] id the trainer substitutes and
   * the [PAD] id, -1 when there is none. */
  int64_t mask_token;
  int64_t pad_token;
  /* The tokenizer the config's vocabulary was made for: "bytes" (one token
   * a byte, the byte-level configs), "gpt2" (GPT-2's byte-level BPE, 50257
   * tokens), "llama" (LLaMA's SentencePiece model, 32000). */
  const char *tokenizer;
  char summary[128];   /* "12 layers, 768 wide, 12 heads, context 1024"      */
} slapo_model_dims;

/* Overrides of a config when a family builds a model (slapo_model_family
 * .create). A zero-initialized struct overrides nothing except dropout: set
 * dropout to -1 to keep the config's. */
typedef struct slapo_model_opts {
  double dropout;     /* every dropout probability of the family; < 0: the config's */
  int64_t vocab_size; /* the vocabulary (embedding and head rows); 0: the config's  */
} slapo_model_opts;

/* The options that keep a config as it is. */
#define SLAPO_MODEL_OPTS_DEFAULT ((slapo_model_opts){.dropout = -1, .vocab_size = 0})

/* A model family (GPT-2, later LLaMA, BERT): everything the trainer and the
 * CLI need, so neither names a model. Entries are static and listed in
 * models/families.def; adding a family is its own files plus one line
 * there. */
typedef struct slapo_model_family {
  const char *name;             /* --model: "gpt2"                            */
  const char *hf_class;         /* Hugging Face class: "GPT2LMHeadModel"      */
  const char *const *configs;   /* named configs, NULL-terminated             */
  const char *default_config;   /* --config default                           */
  slapo_objective objective;
  /* The peak learning rate `slapo train` uses for this family when --lr is
   * not given (0: the trainer's 1e-3); the final one is a tenth of it. */
  float lr;
  /* The schedule file (in the repository's schedules/) that `--schedule
   * default` names; NULL: none. Without --schedule a model trains
   * unscheduled. */
  const char *default_schedule;
  /* Fills *out for `config`. Errors: SLAPO_NOT_FOUND listing the configs. */
  slapo_status (*dims)(const char *config, slapo_model_dims *out);
  /* Builds the model with meta parameters, the config changed by opts
   * (NULL: SLAPO_MODEL_OPTS_DEFAULT). *out owned. Errors: SLAPO_NOT_FOUND
   * (config), SLAPO_INVALID_ARG (an override out of range), NOMEM. */
  slapo_status (*create)(const char *config, const slapo_model_opts *opts, slapo_module **out);
  /* Hugging Face safetensors import into a materialized model, and atomic
   * export with extra metadata pairs (the family's layout and names). */
  slapo_status (*load)(slapo_module *model, const char *path);
  slapo_status (*save)(slapo_module *model, const char *path, int n_meta,
                       const char *const *keys, const char *const *values);
  /* True for parameters the Hugging Face file stores transposed; optimizer
   * state is written in the same layout (slapo_adamw_save). May be NULL. */
  bool (*stored_transposed)(const char *param_path);
  /* The tensor-parallel schedule (in schedules/, on top of the default
   * one), or NULL: named where --tp shards nothing. */
  const char *tp_schedule;
  /* The family's attention module type ("GPT2Attention") and the factory
   * of its FlashAttention replacement: a module computing the same through
   * the fused flash_attention op, with the replaced module's parameters
   * tied (same objects and paths) and its dropout streams reused. The
   * "FlashAttention" replacement dispatches to it on the replaced module's
   * type. NULL: the family has none. */
  const char *attention_type;
  slapo_status (*flash_attention_new)(const slapo_module *replaced, slapo_module **out);
} slapo_model_family;

/* The family named `name`. Errors: SLAPO_NOT_FOUND listing the families. */
slapo_status slapo_model_find(const char *name, const slapo_model_family **out);
/* Registered families, in families.def order. Static entries. */
int slapo_model_count(void);
const slapo_model_family *slapo_model_at(int i);
/* Builds `family`'s `config` with meta parameters and materializes it with
 * `seed` (each value a function of seed, path and index). *out owned.
 * Errors: those of create and slapo_module_materialize. */
slapo_status slapo_model_new(const slapo_model_family *family, const char *config, double dropout,
                             uint64_t seed, slapo_module **out);

/* GPT-2 hyper-parameters (Radford et al. 2019; Hugging Face GPT2Config
 * names in comments). */
typedef struct slapo_gpt2_config {
  int n_layer;        /* n_layer                                   */
  int n_head;         /* n_head                                    */
  int64_t n_embd;     /* n_embd (C)                                */
  int64_t n_ctx;      /* n_positions: longest sequence             */
  int64_t vocab_size; /* 256 for the byte configs, 50257 for GPT-2 */
  double dropout;     /* embd_pdrop = attn_pdrop = resid_pdrop     */
  double ln_eps;      /* layer_norm_epsilon (1e-5)                 */
} slapo_gpt2_config;

/* Fills `out` for a named config: "tiny" (4 layers, 128 wide, 4 heads,
 * context 64, bytes), "small" (6, 384, 6, 256, bytes), and the released
 * GPT-2 sizes "124M", "355M", "774M", "1.5B" (context 1024, vocab 50257).
 * Byte configs use dropout 0, the GPT-2 sizes 0.1 (as Hugging Face).
 * Errors: SLAPO_NOT_FOUND listing the known names. */
slapo_status slapo_gpt2_config_named(const char *name, slapo_gpt2_config *out);

/* Builds GPT2LMHeadModel as a module tree with meta parameters:
 *   transformer.{wte, wpe, drop, h.N.{ln_1, attn.{c_attn, c_proj,
 *   attn_dropout, resid_dropout}, ln_2, mlp.{c_fc, act, c_proj, dropout}},
 *   ln_f}, lm_head (weight tied to transformer.wte.weight).
 * Linear weights are [out, in] (PyTorch nn.Linear; Hugging Face's Conv1D
 * stores [in, out]: checkpoint import/export transposes). Init as GPT-2:
 * N(0, 0.02), residual projections (c_proj) N(0, 0.02/sqrt(2 n_layer)),
 * biases 0, LayerNorm weight 1.
 * Forward: (idx [B, T] i32) -> logits [B, T, V]; (idx, targets [B, T] i32)
 * -> mean cross-entropy loss [] (targets equal to -100, PyTorch's
 * ignore_index, are skipped).
 * Errors: SLAPO_INVALID_ARG (n_embd not divisible by n_head, sizes <= 0),
 * NOMEM. *out owned. */
slapo_status slapo_gpt2_new(const slapo_gpt2_config *cfg, slapo_module **out);

/* Loads a Hugging Face GPT-2 safetensors file into a materialized model:
 * accepts names with or without the "transformer." prefix, transposes the
 * Conv1D weights, ignores the attention-mask buffers (attn.bias,
 * attn.masked_bias) and lm_head.weight when it equals wte (tied). Other
 * tensors the model does not have are not read, and rank 0 warns about
 * them (slapo_logf SLAPO_LOG_WARN: the first few names, and layers past the
 * model's), as Hugging Face's from_pretrained does. Every model parameter
 * must be present with the right shape, and lm_head.weight (when present)
 * equal to wte: all checked before anything is copied, so such an error
 * leaves the model as it was (an I/O error or out of memory while copying
 * can leave it part-loaded). Errors: SLAPO_IO (unreadable or malformed
 * file), SLAPO_NOT_FOUND (missing tensor, named), SLAPO_SHAPE (wrong shape,
 * both shapes named), SLAPO_PRECOND (an untied lm_head.weight: both names
 * and the largest difference), SLAPO_STATE (model not materialized), NOMEM. */
slapo_status slapo_gpt2_load(slapo_module *model, const char *path);
/* True for the parameters Hugging Face's GPT-2 stores transposed (its
 * Conv1D weights, [in, out]): attn.c_attn, attn.c_proj, mlp.c_fc and
 * mlp.c_proj weights. Files in that layout (the model's, and the optimizer
 * state beside it) transpose exactly these. Pure function of `path`. */
bool slapo_gpt2_is_conv1d_weight(const char *path);
/* Saves the model's parameters to `path` atomically in the Hugging Face
 * layout (names "transformer.…", Conv1D weights [in, out], lm_head omitted
 * as tied, metadata format=pt) plus the given extra metadata pairs. */
slapo_status slapo_gpt2_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values);

/* ------------------------------------------------------------------------ */
/* LLaMA (Touvron et al. 2023; Hugging Face LlamaForCausalLM)                */
/* ------------------------------------------------------------------------ */

/* LLaMA hyper-parameters (Hugging Face LlamaConfig names in comments). */
typedef struct slapo_llama_config {
  int n_layer;          /* num_hidden_layers                              */
  int n_head;           /* num_attention_heads                            */
  int n_kv_head;        /* num_key_value_heads (divides n_head; GQA)      */
  int64_t hidden;       /* hidden_size (C)                                */
  int64_t intermediate; /* intermediate_size (SwiGLU width)               */
  int64_t n_ctx;        /* max_position_embeddings                        */
  int64_t vocab_size;   /* 256 for the byte configs, 32000 for Llama      */
  double rms_eps;       /* rms_norm_eps                                   */
  double rope_theta;    /* rope_theta (10000)                             */
  double attn_dropout;  /* attention_dropout (0 in Hugging Face)          */
  bool tie_embeddings;  /* tie_word_embeddings (false)                    */
} slapo_llama_config;

/* Fills `out` for a named config: "tiny" (4 layers, 128 wide, 4 heads over 2
 * kv heads, SwiGLU 352, context 64, bytes), "small" (6, 384, 6 over 2, 1024,
 * 256, bytes): GPT-2 tiny's and small's width, depth and context; "1.1B"
 * (TinyLlama-1.1B: 22, 2048, 32 over 4, 5632, 2048, vocab 32000) and "7B"
 * (Llama-2-7B: 32, 4096, 32 over 32, 11008, 4096, 32000). Errors:
 * SLAPO_NOT_FOUND listing the known names. */
slapo_status slapo_llama_config_named(const char *name, slapo_llama_config *out);

/* Builds LlamaForCausalLM with meta parameters:
 *   model.{embed_tokens, layers.N.{input_layernorm, self_attn.{q_proj, k_proj,
 *   v_proj, o_proj, attn_dropout}, post_attention_layernorm, mlp.{gate_proj,
 *   up_proj, down_proj, act_fn}}, norm}, lm_head (untied unless
 *   tie_embeddings). No biases; RMSNorm; rotary positions on q and k;
 *   SwiGLU MLP down(silu(gate(x)) * up(x)); k and v heads shared by groups
 *   of n_head / n_kv_head query heads. Init as Hugging Face: N(0, 0.02)
 *   weights, RMSNorm weight 1.
 * Forward: (idx [B, T] i32) -> logits [B, T, V]; (idx, targets) -> mean
 * cross-entropy [] over targets != -100. Decodes with a KV cache.
 * Errors: SLAPO_INVALID_ARG (sizes <= 0, hidden not divisible by n_head,
 * n_head not divisible by n_kv_head, odd head size), NOMEM. */
slapo_status slapo_llama_new(const slapo_llama_config *cfg, slapo_module **out);

/* Hugging Face safetensors import/export (names as above, Linear weights
 * [out, in] as stored; a tied lm_head omitted on save and, on load, equal
 * to embed_tokens or refused; rotary_emb.inv_freq buffers ignored, other
 * tensors the model lacks warned about). Errors as slapo_gpt2_load / _save. */
slapo_status slapo_llama_load(slapo_module *model, const char *path);
slapo_status slapo_llama_save(slapo_module *model, const char *path, int n_meta,
                              const char *const *keys, const char *const *values);

/* ------------------------------------------------------------------------ */
/* BERT (BertForMaskedLM)                                                    */
/* ------------------------------------------------------------------------ */

/* The special ids of the byte-level BERT configs: the 256 bytes are ids
 * 0..255, then these four; the vocabulary is padded to 264 (a multiple of
 * 8, so the decoder's rows stay 32-byte aligned), ids 260..263 unused. */
#define SLAPO_BERT_BYTE_PAD 256
#define SLAPO_BERT_BYTE_CLS 257
#define SLAPO_BERT_BYTE_SEP 258
#define SLAPO_BERT_BYTE_MASK 259
#define SLAPO_BERT_BYTE_VOCAB 264

/* BERT hyper-parameters (Devlin et al. 2019; Hugging Face BertConfig names
 * in comments). */
typedef struct slapo_bert_config {
  int n_layer;          /* num_hidden_layers                                */
  int n_head;           /* num_attention_heads                              */
  int64_t n_embd;       /* hidden_size (C)                                  */
  int64_t n_inner;      /* intermediate_size (4 C)                          */
  int64_t n_ctx;        /* max_position_embeddings                          */
  int64_t vocab_size;   /* 264 for the byte configs, 30522 for base         */
  int64_t type_vocab;   /* type_vocab_size (2)                              */
  double dropout;       /* hidden_dropout_prob                              */
  double attn_dropout;  /* attention_probs_dropout_prob                     */
  double ln_eps;        /* layer_norm_eps (1e-12)                           */
  int64_t pad_token;    /* pad_token_id                                     */
  int64_t mask_token;   /* the tokenizer's [MASK] id                        */
} slapo_bert_config;

/* Fills `out` for a named config: "tiny" (4 layers, 128 wide, 4 heads,
 * context 64) and "small" (6, 384, 6, 256), byte-level (vocabulary
 * SLAPO_BERT_BYTE_VOCAB, dropout 0: GPT-2's tiny and small budgets), and
 * "base", bert-base-uncased (12, 768, 12, intermediate 3072, 512
 * positions, vocabulary 30522, [PAD] 0, [MASK] 103, dropout 0.1).
 * Errors: SLAPO_NOT_FOUND listing the known names. */
slapo_status slapo_bert_config_named(const char *name, slapo_bert_config *out);

/* Builds BertForMaskedLM (no pooler) as a module tree with meta parameters:
 *   bert.embeddings.{word_embeddings, position_embeddings,
 *   token_type_embeddings, LayerNorm, dropout},
 *   bert.encoder.layer.N.{attention.{self.{query, key, value, dropout},
 *   output.{dense, LayerNorm, dropout}}, intermediate.{dense,
 *   intermediate_act_fn}, output.{dense, LayerNorm, dropout}},
 *   cls.predictions.{bias, transform.{dense, transform_act_fn, LayerNorm},
 *   decoder}: decoder.weight is bert.embeddings.word_embeddings.weight and
 *   decoder.bias is cls.predictions.bias (one parameter object each, as
 *   Hugging Face ties them).
 * Init as Hugging Face's BertPreTrainedModel: weights N(0, 0.02), biases 0,
 * LayerNorm weight 1 (the [PAD] row is not zeroed: slapo's embedding has no
 * padding_idx, see docs/models.md). GELU is the erf form, LayerNorm
 * eps 1e-12, attention bidirectional; token type ids are all 0.
 * Forward inputs (B, T from input_ids [B, T] i32):
 *   (input_ids) -> logits [B, T, V];
 *   (input_ids, attention_mask [B, T] f32) -> logits;
 *   (input_ids, labels [B, T] i32/i64) -> mean cross-entropy [] over the
 *   labels that are not -100;
 *   (input_ids, labels, attention_mask) -> that loss.
 * attention_mask follows Hugging Face: 1 = attend to the position, 0 =
 * padding. Each layer adds (1 - mask) * -FLT_MAX (torch.finfo(f32).min) to
 * the scaled scores of key positions, so a padded key gets probability 0
 * (e^-87 or less from the fast softmax) and a query row whose keys are all
 * padding gets every score equal to -FLT_MAX, i.e. a uniform row, not NaN.
 * Errors: SLAPO_INVALID_ARG (n_embd not divisible by n_head, sizes <= 0),
 * NOMEM. *out owned. */
slapo_status slapo_bert_new(const slapo_bert_config *cfg, slapo_module **out);

/* Loads a Hugging Face BERT safetensors file (BertForMaskedLM,
 * BertForPreTraining or BertModel: names with or without the "bert."
 * prefix, LayerNorm weights also as the old "gamma"/"beta") into a
 * materialized model. Ignored: the pooler, cls.seq_relationship, the
 * position_ids / token_type_ids buffers, and cls.predictions.decoder.weight
 * / .bias when they equal the tensors they are tied to; other tensors the
 * model lacks are not read, with a warning as slapo_gpt2_load's. Every model
 * parameter must be present with the right shape and the tied tensors must
 * agree, all checked before anything is copied. Errors: SLAPO_IO (unreadable or malformed file),
 * SLAPO_NOT_FOUND (missing tensor, named), SLAPO_SHAPE (both shapes named),
 * SLAPO_PRECOND (an untied decoder weight or bias: both names and the
 * largest difference), SLAPO_STATE (model not materialized), NOMEM. */
slapo_status slapo_bert_load(slapo_module *model, const char *path);
/* Saves the model's parameters to `path` atomically in the Hugging Face
 * layout (BertForMaskedLM names; the tied decoder weight and bias omitted,
 * as save_pretrained does; metadata format=pt) plus the given extra
 * metadata pairs (at most 15). Errors: those of slapo_safetensors_write,
 * NOMEM. */
slapo_status slapo_bert_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values);

/* ------------------------------------------------------------------------ */
/* FlashAttention (a replacement for each family's attention)                */
/* ------------------------------------------------------------------------ */

/* Builds a "FlashAttention" module that computes what the attention module
 * `replaced` computes with the fused "flash_attention" op (Dao et al. 2022)
 * instead of the [B, NH, T, T] softmax/dropout/matmul composite, through
 * the factory of the family whose attention_type is replaced's type (GPT-2:
 * a "FlashAttention" with children c_attn and c_proj; LLaMA and BERT: their
 * own flash types). Its Linears share (tie) the replaced module's parameter
 * objects, so weights, gradients and Hugging Face paths are unchanged once
 * it takes the old module's place (slapo_module_replace_child); its
 * dropouts have the same p, and the fused one uses the RNG stream of the
 * replaced module's attention dropout, so train-mode masks are the same
 * too. `replaced` is borrowed (read only); *out owned.
 * Errors: SLAPO_INVALID_ARG (replaced NULL or of a type no family's
 * attention has, naming the types that are; missing projection weights),
 * NOMEM. */
slapo_status slapo_flash_attention_new(const slapo_module *replaced, slapo_module **out);

/* The "FusedLinear" subgraph module (models/fused_linear.c): `n` matches,
 * each one Linear call on the same input, become one Linear over the
 * concatenated weights (tied, so paths and checkpoints stay), its result the
 * n results joined along the last axis. Errors: SLAPO_UNSUPPORTED (a match
 * is not exactly one Linear), SLAPO_INVALID_ARG (in_features or bias
 * differ; n outside 1..32), NOMEM. */
slapo_status slapo_fused_linear_new(slapo_module *owner, int n, const slapo_match *matches,
                                    slapo_module **out);

#ifdef __cplusplus
}
#endif
#endif
