/* models/internal.h - what the families' files share: the attention
 * helpers (models/attention.c), the Hugging Face checkpoint layout, tied Linear copies for replacement
 * modules, and what BERT's files share. Layer: models (internal). */
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

/* The fused attention op `op` (flash_attention or flash_attention_qkv) on
 * its inputs, with the attributes every family's gives it: causal, scale,
 * the dropout probability p and the RNG stream of the replaced module's
 * dropout child `drop` (its first random op in this call, so masks equal
 * the composite's), n_head = n_qkv_heads when > 0 (the packed qkv form),
 * and when this rank computes `local` of the n_head heads (tensor
 * parallel), their place head0, so they draw the unsharded model's masks.
 * NULL on error (on ctx). */
slapo_node *slapo__flash_attention(slapo_ctx *ctx, const slapo_op *op, int n_in,
                                   slapo_node *const *in, const char *drop, bool causal,
                                   double scale, double p, int64_t local, int64_t head0,
                                   int64_t n_head, int64_t n_qkv_heads);

/* How a family's parameters appear in Hugging Face safetensors files
 * (models/hf_checkpoint.c): a tensor per parameter, named by its path. */
typedef struct slapo__hf_layout {
  const char *family;          /* message prefix: "gpt2"                     */
  const char *optional_prefix; /* files may name paths without it, or NULL   */
  bool (*transposed)(const char *path); /* 2-d weights stored [in, out]; NULL */
  /* Older names of a path's last components that files may use instead
   * ({"LayerNorm.weight", "LayerNorm.gamma"}); ends with {NULL, NULL}. */
  const char *const (*renamed)[2];
  /* Tied pairs {file name of the tied copy, path of the kept parameter}:
   * when the model ties them (one object), a file's copy must equal the
   * kept tensor, and save omits it; ends with {NULL, NULL}. */
  const char *const (*tied)[2];
  /* fnmatch patterns of file tensors that are not parameters (buffers
   * older files hold, heads the family has no use for), read without a
   * warning: Hugging Face's _keys_to_ignore_on_load_unexpected; NULL-ended. */
  const char *const *ignored;
} slapo__hf_layout;

/* Loads every parameter of a materialized model from the file at `path`
 * (f32 or any float dtype, converted); nothing is copied if a tied head
 * differs from the embedding. In a model materialized in part (a pipeline
 * rank's stage) the meta parameters are checked (present, right shape)
 * but not loaded. Tensors of the file that the model does not
 * have are not read; rank 0 warns about them (slapo_logf SLAPO_LOG_WARN),
 * naming the first few and any layers past the model's. Errors: SLAPO_STATE (no
 * parameter materialized), SLAPO_IO, SLAPO_NOT_FOUND (missing tensor, named),
 * SLAPO_SHAPE (both shapes named), SLAPO_PRECOND (untied head), NOMEM. */
slapo_status slapo__hf_load(slapo_module *model, const char *path, const slapo__hf_layout *l);
/* Writes every parameter object once (a tied head is omitted) atomically,
 * with metadata format=pt plus the given pairs (at most 15). */
slapo_status slapo__hf_save(slapo_module *model, const char *path, const slapo__hf_layout *l,
                            int n_meta, const char *const *keys, const char *const *values);

/* Tensor parallelism: the query heads an attention module computes on this
 * rank, read from its projection `proj`'s weight (rows_per_head rows a head:
 * 3 HS for GPT-2's fused c_attn): *local heads starting at global head
 * *head0; all n_head from 0 when the weight is whole. Returns false, with
 * SLAPO_SHAPE on ctx naming the rows, the ranks and the config's count
 * (`what`, e.g. "n_head"), when the rank's rows are not a whole, non-zero
 * number of heads (6 heads over 4 ranks): computing on them would mix
 * parts of heads. */
bool slapo__local_heads(slapo_ctx *ctx, const slapo_module *attn, const char *proj,
                        int64_t rows_per_head, int64_t n_head, const char *what, int64_t *local,
                        int64_t *head0);
/* A Linear like old's child `name` (weight [out, in], optional bias) whose
 * parameters are that child's parameter objects (tied), for replacement
 * modules that keep the replaced one's paths. Errors: SLAPO_INVALID_ARG (no
 * such Linear child), NOMEM. */
slapo_status slapo__tied_linear(const slapo_module *old, const char *name, slapo_module **out);

/* The families' FlashAttention factories (slapo_model_family
 * .flash_attention_new): GPT-2's "FlashAttention" (models/flash_attention.c),
 * BERT's (models/bert_attention.c), LLaMA's (models/llama_attention.c). */
slapo_status slapo__gpt2_flash_attention_new(const slapo_module *replaced, slapo_module **out);
slapo_status slapo__bert_flash_attention_new(const slapo_module *replaced, slapo_module **out);
slapo_status slapo__llama_flash_attention_new(const slapo_module *replaced, slapo_module **out);
/* A LlamaAttention with c's config (models/llama_attention.c). */
slapo_status slapo__llama_attention_new(const slapo_llama_config *c, slapo_module **out);

/* Building a tree: adds a freshly made child (expr fills `child_` through
 * CHILD) to `parent`; on failure frees `owner` (the top of the tree under
 * construction, which owns `parent`) and returns the status. */
#define SLAPO__ADD(owner, parent, name, expr)                              \
  do {                                                                     \
    slapo_module *child_ = NULL;                                           \
    slapo_status s_ = (expr);                                              \
    if (s_ == SLAPO_OK) s_ = slapo_module_add_child(parent, name, child_); \
    if (s_ != SLAPO_OK) {                                                  \
      slapo_module_free(owner);                                            \
      return s_;                                                           \
    }                                                                      \
  } while (0)
#define SLAPO__CHILD (&child_)

/* *out = *opts (NULL: SLAPO_MODEL_OPTS_DEFAULT), checked. Errors:
 * SLAPO_INVALID_ARG naming the family and the value (dropout >= 1 or not a
 * number, a negative vocab_size). */
slapo_status slapo__model_opts_of(const char *family, const slapo_model_opts *opts,
                                  slapo_model_opts *out);

/* Index of `name` in a family's NULL-terminated config list; -1 with
 * SLAPO_NOT_FOUND set ("<family>: unknown config 'x' (known: ...)"). */
int slapo__config_index(const char *family, const char *const *names, const char *name);

/* A causal LM's root forward: (input_ids) -> logits [B, T, V] from children
 * `body` then `lm_head`; (input_ids, labels) -> mean cross-entropy over
 * labels != -100. `cls` names the class in errors. */
slapo_node *slapo__causal_lm_forward(slapo_ctx *ctx, slapo_module *self, const char *cls,
                                     const char *body, int n_in, slapo_node *const *in);

/* A module of type t owning a copy of the `size` bytes at cfg (a family's
 * config struct, which every module of the family keeps). Errors: NOMEM,
 * those of slapo_module_new. */
slapo_status slapo__module_with_config(const slapo_module_type *t, const void *cfg, size_t size,
                                       slapo_module **out);

/* The blocks of a stack: calls self's children "<list>.0" .. "<list>.<n-1>"
 * in order, each on the previous one's output as args[0] and the same
 * args[1 .. n_in-1] (BERT's mask bias). Returns the last output, NULL on
 * error (on ctx). */
slapo_node *slapo__call_layers(slapo_ctx *ctx, slapo_module *self, const char *list, int n,
                               int n_in, slapo_node **args);

/* Sets the root's example inputs for `trace`: ids and labels [2, min(8,
 * n_ctx)] i32 (meta). Errors: NOMEM. */
slapo_status slapo__set_lm_example(slapo_module *lm, int64_t n_ctx);

/* The families' config names, NULL-terminated (the registry entries' lists). */
extern const char *const slapo__gpt2_config_names[];
extern const char *const slapo__llama_config_names[];

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
