/* models/llama_family.c - LLaMA's registry entry: its configs and dims, its
 * constructor, Hugging Face import/export, the causal-LM objective and its
 * default schedule. Layer: models. */
#include <stdio.h>

#include "core/assert.h"
#include "models/internal.h"

static slapo_status llama_dims(const char *config, slapo_model_dims *out) {
  slapo_llama_config c;
  SLAPO_TRY(slapo_llama_config_named(config, &c));
  *out = (slapo_model_dims){.n_ctx = c.n_ctx, .vocab_size = c.vocab_size,
                            .dropout = c.attn_dropout, .eos_token = c.vocab_size == 32000 ? 2 : -1,
                            .mask_token = -1, .pad_token = -1,
                            .n_layer = c.n_layer, .width = c.hidden,
                            .tokenizer = c.vocab_size == 32000 ? "llama" : "bytes"};
  snprintf(out->summary, sizeof out->summary,
           "%d layers, %lld wide, %d heads (%d kv), SwiGLU %lld, context %lld", c.n_layer,
           (long long)c.hidden, c.n_head, c.n_kv_head, (long long)c.intermediate,
           (long long)c.n_ctx);
  return SLAPO_OK;
}

/* A dropout override sets attention_dropout, LLaMA's only dropout. */
static slapo_status llama_create(const char *config, const slapo_model_opts *opts,
                                 slapo_module **out) {
  slapo_llama_config c;
  slapo_model_opts o;
  SLAPO_TRY(slapo_llama_config_named(config, &c));
  SLAPO_TRY(slapo__model_opts_of("llama", opts, &o));
  if (o.dropout >= 0) c.attn_dropout = o.dropout;
  if (o.vocab_size) c.vocab_size = o.vocab_size;
  return slapo_llama_new(&c, out);
}

const slapo_model_family slapo__family_llama = {
    .name = "llama",
    .hf_class = "LlamaForCausalLM",
    .configs = slapo__llama_config_names,
    .default_config = "small",
    .objective = SLAPO_OBJECTIVE_CAUSAL_LM,
    .default_schedule = "llama.sched",
    .dims = llama_dims,
    .create = llama_create,
    .load = slapo_llama_load,
    .save = slapo_llama_save,
    .tp_schedule = "llama_tp.sched",
    .attention_type = "LlamaAttention",
    .flash_attention_new = slapo__llama_flash_attention_new,
};
