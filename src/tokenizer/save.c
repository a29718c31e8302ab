/* src/tokenizer/save.c - writing a tokenizer as a Hugging Face
 * tokenizer.json (model BPE, ByteLevel pre-tokenizer and decoder, merges
 * as "A B" strings, which every version of the tokenizers library reads;
 * special tokens as added_tokens), atomically; and the tokenizer's hash. */
#include <jansson.h>
#include <string.h>

#include "core/assert.h"
#include "tokenizer/internal.h"

static bool is_special(const slapo_tokenizer *t, int32_t id) {
  for (int k = 0; k < t->n_special; k++)
    if (t->special[k] == id) return true;
  return false;
}

/* Token id's text: its bytes in GPT-2's byte-level alphabet (UTF-8), or a
 * special token's own text; NUL-terminated into out (4 bytes a byte). */
static void token_text(const slapo_tokenizer *t, int32_t id, char *out) {
  const uint8_t *b = t->tok_bytes + t->tok_off[id];
  size_t n = t->tok_off[id + 1] - t->tok_off[id], k = 0;
  if (is_special(t, id)) {
    memcpy(out, b, n);
    out[n] = '\0';
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t cp = slapo__byte_char(b[i]);
    if (cp < 0x80) out[k++] = (char)cp;
    else out[k++] = (char)(0xc0 | cp >> 6), out[k++] = (char)(0x80 | (cp & 0x3f));
  }
  out[k] = '\0';
}

static size_t max_token(const slapo_tokenizer *t) {
  size_t m = 0;
  for (int32_t i = 0; i < t->n_vocab; i++)
    if (t->tok_off[i + 1] - t->tok_off[i] > m) m = t->tok_off[i + 1] - t->tok_off[i];
  return m;
}

static json_t *to_json(const slapo_tokenizer *t) {
  char *a = slapo_malloc(4 * max_token(t) + 1), *b = slapo_malloc(4 * max_token(t) + 1);
  char *line = slapo_malloc(8 * max_token(t) + 2);
  json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
  bool ok = a && b && line && vocab && merges && added;
  for (int32_t id = 0; ok && id < t->n_vocab; id++) {
    token_text(t, id, a);
    ok = json_object_set_new(vocab, a, json_integer(id)) == 0;
    if (ok && is_special(t, id))
      ok = json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", a,
                                                  "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                  "normalized", 0, "special", 1)) == 0;
  }
  for (size_t m = 0; ok && m < t->n_merges; m++) {
    token_text(t, t->merge_left[m], a);
    token_text(t, t->merge_right[m], b);
    snprintf(line, 8 * max_token(t) + 2, "%s %s", a, b);
    ok = json_array_append_new(merges, json_string(line)) == 0;
  }
  json_t *root = ok ? json_pack(
      "{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:{s:s,s:b,s:b,s:b},s:{s:s,s:b,s:b,s:b},"
      "s:{s:s,s:n,s:n,s:s,s:s,s:b,s:b,s:o,s:o}}",
      "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
      "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1,
      "post_processor", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 1,
      "decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1,
      "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "",
      "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges", merges)
                    : NULL;
  if (!root) { /* json_pack's "o" took them only on success */
    json_decref(vocab), json_decref(merges), json_decref(added);
  }
  slapo_free(a), slapo_free(b), slapo_free(line);
  return root;
}

static slapo_status write_json(FILE *fp, const char *tmp, void *ud) {
  if (json_dumpf(ud, fp, JSON_INDENT(1) | JSON_ENSURE_ASCII) != 0)
    return slapo_error(SLAPO_IO, "%s: cannot write", tmp);
  return SLAPO_OK;
}

slapo_status slapo_tokenizer_save(const slapo_tokenizer *t, const char *path) {
  SLAPO_NEED(t, "slapo_tokenizer_save");
  SLAPO_NEED(path, "slapo_tokenizer_save");
  if (t->spm)
    return slapo_error(SLAPO_UNSUPPORTED, "%s: a SentencePiece tokenizer is kept as its own "
                       "tokenizer.model; slapo writes tokenizer.json for byte-level BPE only", path);
  json_t *root = to_json(t);
  if (!root) return slapo_error(SLAPO_NOMEM, "%s: out of memory for the tokenizer's JSON", path);
  slapo_status st = slapo_write_atomic(path, "tokenizer save", write_json, root);
  json_decref(root);
  return st;
}

uint64_t slapo_tokenizer_hash(const slapo_tokenizer *t) {
  if (!t) return 0;
  uint64_t h = slapo_hash64(t->tok_off, ((size_t)t->n_vocab + 1) * sizeof *t->tok_off, 1);
  h = slapo_hash_combine(h, slapo_hash64(t->tok_bytes, t->tok_off[t->n_vocab], 2));
  h = slapo_hash_combine(h, slapo_hash64(t->merge_left, t->n_merges * sizeof *t->merge_left, 3));
  h = slapo_hash_combine(h, slapo_hash64(t->merge_right, t->n_merges * sizeof *t->merge_right, 4));
  return slapo_hash_combine(h, slapo_hash64(t->special, (size_t)t->n_special * sizeof *t->special, 5));
}
