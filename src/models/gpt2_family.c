/* models/gpt2_family.c - GPT-2's registry entry: its configs and dims, its
 * constructor, Hugging Face import/export and layout, the causal-LM
 * objective and its default schedule. Layer: models. */
#include <stdio.h>

#include "core/assert.h"
#include "models/internal.h"

static slapo_status gpt2_dims(const char *config, slapo_model_dims *out) {
  slapo_gpt2_config c;
  SLAPO_TRY(slapo_gpt2_config_named(config, &c));
  *out = (slapo_model_dims){.n_ctx = c.n_ctx, .vocab_size = c.vocab_size, .dropout = c.dropout,
                            .eos_token = c.vocab_size == 50257 ? 50256 : -1, .mask_token = -1,
                            .pad_token = -1, .n_layer = c.n_layer, .width = c.n_embd,
                            .tokenizer = c.vocab_size == 50257 ? "gpt2" : "bytes"};
  snprintf(out->summary, sizeof out->summary, "%d layers, %lld wide, %d heads, context %lld",
           c.n_layer, (long long)c.n_embd, c.n_head, (long long)c.n_ctx);
  return SLAPO_OK;
}

static slapo_status gpt2_create(const char *config, const slapo_model_opts *opts,
                                slapo_module **out) {
  slapo_gpt2_config c;
  slapo_model_opts o;
  SLAPO_TRY(slapo_gpt2_config_named(config, &c));
  SLAPO_TRY(slapo__model_opts_of("gpt2", opts, &o));
  if (o.dropout >= 0) c.dropout = o.dropout;
  if (o.vocab_size) c.vocab_size = o.vocab_size;
  return slapo_gpt2_new(&c, out);
}

const slapo_model_family slapo__family_gpt2 = {
    .name = "gpt2",
    .hf_class = "GPT2LMHeadModel",
    .configs = slapo__gpt2_config_names,
    .default_config = "small",
    .objective = SLAPO_OBJECTIVE_CAUSAL_LM,
    .default_schedule = "gpt2.sched",
    .dims = gpt2_dims,
    .create = gpt2_create,
    .load = slapo_gpt2_load,
    .save = slapo_gpt2_save,
    .stored_transposed = slapo_gpt2_is_conv1d_weight,
    .tp_schedule = "gpt2_tp.sched",
    .attention_type = "GPT2Attention",
    .flash_attention_new = slapo__gpt2_flash_attention_new,
};
