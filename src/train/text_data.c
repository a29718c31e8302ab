/* train/text_data.c - text through a tokenizer into a dataset, for
 * `slapo train --tokenizer`: the split on text bytes, then the tokenizer
 * opened (or learned on the training split: "bpe:N"), then both splits
 * encoded. Nothing is cached: encoding runs at ~20 MB/s and learning a
 * 4,096-token BPE on the 2.6 MB fortunes corpus takes ~3 s
 * (docs/tokenizers.md), less than building a model; every rank of a
 * distributed run does the same work and gets the same ids. Layer: train. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "train/internal.h"

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "bpe:N": *n = N; false when spec is not of that form. */
static bool bpe_spec(const char *spec, long *n) {
  if (strncmp(spec, "bpe:", 4) != 0) return false;
  char *end;
  *n = strtol(spec + 4, &end, 10);
  return end != spec + 4 && !*end;
}

slapo_status slapo__text_dataset(const char *data, const char *spec, double val_fraction,
                                 slapo_tokenizer **tok, slapo_dataset **out, char *note,
                                 size_t cap) {
  *tok = NULL, *out = NULL;
  char *text = NULL;
  size_t len = 0;
  SLAPO_TRY(slapo_text_read(data, &text, &len));
  slapo_status s = SLAPO_OK;
  int32_t magic = 0;
  if (len >= 4) memcpy(&magic, text, 4);
  long n = 0;
  bool learn = bpe_spec(spec, &n);
  if (magic == 20240520) { /* llm.c's token files start with it: already tokens */
    slapo_free(text);
    if (learn)
      return slapo_error(SLAPO_INVALID_ARG, "train: %s is an llm.c token file, already tokens; "
                                            "--tokenizer %s learns from text", data, spec);
    SLAPO_TRY(slapo_tokenizer_open(spec, tok));
    s = slapo_dataset_load(data, val_fraction, out);
    if (s != SLAPO_OK) {
      slapo_tokenizer_free(*tok);
      *tok = NULL;
      return s;
    }
    snprintf(note, cap, "tokenizer: %s (%d ids) decodes the token file's samples", spec,
             slapo_tokenizer_vocab_size(*tok));
    return SLAPO_OK;
  }
  if (len == 0) s = slapo_error(SLAPO_IO, "data: %s is empty", data);
  size_t cut = s == SLAPO_OK ? slapo_text_val_cut(text, len, val_fraction) : 0;
  double t0 = seconds();
  if (s == SLAPO_OK && learn && (n < 258 || n > (1 << 20)))
    s = slapo_error(SLAPO_INVALID_ARG, "train: --tokenizer %s: a learned BPE needs 258 to "
                                       "1048576 tokens (the 256 bytes and 2 special tokens "
                                       "first)", spec);
  static const char *const specials[2] = {"<|endoftext|>", "<|mask|>"};
  slapo_bpe_train_opts o = {(int32_t)n, specials, 2, 2};
  if (s == SLAPO_OK)
    s = learn ? slapo_tokenizer_train(text, cut, &o, tok) : slapo_tokenizer_open(spec, tok);
  double t1 = seconds();
  if (s == SLAPO_OK) s = slapo_dataset_from_text(text, len, cut, *tok, out);
  double t2 = seconds();
  if (s == SLAPO_OK) {
    int64_t nt = slapo_dataset_tokens(*out, false) + slapo_dataset_tokens(*out, true);
    snprintf(note, cap, "tokenizer: %s%s, %d tokens; %zu bytes of text to %lld tokens (%.2f "
             "bytes a token) in %.1f s%s",
             learn ? "learned " : "", spec, slapo_tokenizer_vocab_size(*tok), len, (long long)nt,
             nt ? (double)len / (double)nt : 0.0, t2 - t0, learn ? "" : "");
    if (learn) {
      size_t k = strlen(note);
      snprintf(note + k, cap - k, " (learning %.1f s, on the training split's %zu bytes)", t1 - t0, cut);
    }
  } else {
    slapo_tokenizer_free(*tok);
    *tok = NULL;
  }
  slapo_free(text);
  return s;
}
