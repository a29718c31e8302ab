/* models/bert_checkpoint.c - BERT's Hugging Face file layout (read and
 * written by models/hf_checkpoint.c). BERT uses nn.Linear, so nothing is
 * transposed; the decoder's weight and bias are tied (to the word
 * embeddings and to cls.predictions.bias), omitted on save as
 * save_pretrained does, and accepted on load only when equal to what they
 * are tied to. Names follow BertForMaskedLM; BertModel files lack the
 * "bert." prefix, and files converted from the TensorFlow release name
 * LayerNorm's parameters gamma/beta. Layer: models. */
#include "models/internal.h"

static const slapo__hf_layout k_bert_layout = {
    .family = "bert",
    .optional_prefix = "bert.",
    .renamed = (const char *const[][2]){{"LayerNorm.weight", "LayerNorm.gamma"},
                                        {"LayerNorm.bias", "LayerNorm.beta"},
                                        {NULL, NULL}},
    .tied = (const char *const[][2]){{"cls.predictions.decoder.weight",
                                      "bert.embeddings.word_embeddings.weight"},
                                     {"cls.predictions.decoder.bias", "cls.predictions.bias"},
                                     {NULL, NULL}},
    .ignored = (const char *const[]){"*position_ids", "*token_type_ids", "*pooler.*",
                                     "cls.seq_relationship.*", NULL},
};

slapo_status slapo_bert_load(slapo_module *model, const char *path) {
  return slapo__hf_load(model, path, &k_bert_layout);
}

slapo_status slapo_bert_save(slapo_module *model, const char *path, int n_meta,
                             const char *const *keys, const char *const *values) {
  return slapo__hf_save(model, path, &k_bert_layout, n_meta, keys, values);
}
