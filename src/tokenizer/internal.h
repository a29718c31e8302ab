/* src/tokenizer/internal.h - the tokenizer's tables, shared by its loader,
 * encoder and trainer. Private to the tokenizer layer. */
#ifndef SLAPO_TOKENIZER_INTERNAL_H
#define SLAPO_TOKENIZER_INTERNAL_H

#include "slapo/tokenizer.h"

/* The pre-tokens cache: direct-mapped, one slot per hash, overwritten on
 * collision. Pre-tokens of at most CACHE_KEY bytes that encode to at most
 * CACHE_IDS tokens are cached (nearly every English word). */
enum { SLAPO__CACHE_SLOTS = 1 << 15, SLAPO__CACHE_KEY = 22, SLAPO__CACHE_IDS = 8 };
typedef struct slapo__cache_slot {
  uint8_t key_len, n_ids; /* key_len 0: empty */
  uint8_t key[SLAPO__CACHE_KEY];
  int32_t ids[SLAPO__CACHE_IDS];
} slapo__cache_slot;

struct slapo_tokenizer {
  int32_t n_vocab;
  uint32_t *tok_off;   /* [n_vocab + 1]: token i's bytes are tok_bytes[off[i], off[i+1]) */
  uint8_t *tok_bytes;
  uint32_t *tok_slot;  /* open-addressed index bytes -> id: ids + 1, 0 empty */
  size_t tok_mask;
  int32_t byte_id[256]; /* the id of each one-byte token */
  /* Merges: open-addressed (left, right) -> rank, merged id. */
  uint64_t *pair_key;  /* (uint64_t)left << 32 | right, UINT64_MAX empty */
  uint32_t *pair_rank;
  int32_t *pair_out;
  size_t pair_mask, n_merges;
  int32_t *merge_left, *merge_right; /* [n_merges], by rank: for saving */
  int32_t *special;    /* [n_special] ids whose text is a special token */
  int n_special;
  slapo__cache_slot *cache; /* [SLAPO__CACHE_SLOTS], allocated on first use */
  void *spm; /* a SentencePiece model (spm.cc): it encodes; no tables but
                the tokens' bytes */
};

/* GPT-2's byte-level alphabet (bytes_to_unicode in encoder.py): byte b is
 * written as the code point slapo__byte_char(b); printable bytes as
 * themselves, the others as U+0100 onwards. slapo__char_byte inverts it
 * (-1 for a code point that is no byte's). */
uint32_t slapo__byte_char(uint8_t b);
int slapo__char_byte(uint32_t cp);

/* Builds the tables from n tokens' bytes (token i = bytes[off[i],
 * off[i+1])): checks that the 256 one-byte tokens are present and no
 * token's bytes repeat (naming `src` and the ids). t->n_vocab = n. */
slapo_status slapo__tok_build(slapo_tokenizer *t, const uint32_t *off, const uint8_t *bytes,
                              int32_t n, const char *src);
/* The id of the token with bytes b[0..n), or -1. */
int32_t slapo__tok_find(const slapo_tokenizer *t, const uint8_t *b, size_t n);
/* Adds merge number t->n_merges (its rank) of tokens left and right; the
 * merged token (their bytes concatenated) must exist. Errors: SLAPO_PARSE
 * (a merged token not in the vocabulary, a repeated merge; `where` names
 * the file and entry), SLAPO_NOMEM. Call slapo__merges_reserve first. */
slapo_status slapo__merge_add(slapo_tokenizer *t, int32_t left, int32_t right, const char *where);
slapo_status slapo__merges_reserve(slapo_tokenizer *t, size_t n);
/* The rank and merged id of pair (left, right); false when no merge. */
bool slapo__merge_find(const slapo_tokenizer *t, int32_t left, int32_t right, uint32_t *rank,
                       int32_t *out);

/* The end of the pre-token that starts at s[i] (i < n), by the GPT-2
 * pattern (slapo/tokenizer.h); > i. */
size_t slapo__pretok_next(const uint8_t *s, size_t n, size_t i);

/* Appends to out the BPE tokens of one pre-token s[0..n), n >= 1. */
slapo_status slapo__bpe_word(slapo_tokenizer *t, const uint8_t *s, size_t n, slapo_token_ids *out);

/* Where b[0..m) (m >= 1) first occurs in s[0..n), or n: special tokens'
 * texts in the encoder and in BPE learning. */
size_t slapo__find_bytes(const uint8_t *s, size_t n, const uint8_t *b, size_t m);

slapo_status slapo__ids_push(slapo_token_ids *o, int32_t id);
slapo_status slapo__bytes_append(slapo_bytes *b, const void *p, size_t n);

#endif
