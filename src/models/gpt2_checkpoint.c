/* models/gpt2_checkpoint.c - GPT-2's Hugging Face file layout (read and
 * written by models/hf_checkpoint.c). Hugging Face's GPT-2 uses Conv1D
 * layers whose weights are stored [in, out] (transposed relative to
 * nn.Linear), so those four weights per block are transposed on the way in
 * and out; files name GPT2Model's tensors with or without "transformer.";
 * lm_head is tied to wte and omitted, as save_pretrained does.
 * Layer: models. */
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

bool slapo_gpt2_is_conv1d_weight(const char *path) {
  static const char *const suffixes[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                         ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
  size_t n = strlen(path);
  for (size_t i = 0; i < SLAPO_ARRAY_LEN(suffixes); i++) {
    size_t k = strlen(suffixes[i]);
    if (n >= k && !strcmp(path + n - k, suffixes[i])) return true;
  }
  return false;
}

static const slapo__hf_layout k_gpt2_layout = {
    .family = "gpt2",
    .optional_prefix = "transformer.",
    .transposed = slapo_gpt2_is_conv1d_weight,
    .tied = (const char *const[][2]){{"lm_head.weight", "transformer.wte.weight"}, {NULL, NULL}},
    .ignored = (const char *const[]){"*.attn.bias", "*.attn.masked_bias", NULL},
};

slapo_status slapo_gpt2_load(slapo_module *model, const char *path) {
  return slapo__hf_load(model, path, &k_gpt2_layout);
}

slapo_status slapo_gpt2_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values) {
  return slapo__hf_save(model, path, &k_gpt2_layout, n_meta, keys, values);
}
