/* slapo/tokenizer.h - text to token ids and back: GPT-2's byte-level BPE
 * (Radford et al. 2019, section 2.2; the reference encoder is OpenAI's
 * gpt-2 encoder.py, as ported to JavaScript by npm gpt-3-encoder), loaded
 * from a Hugging Face tokenizer.json or a vocab.json + merges.txt pair.
 * A layer of its own on top of core: train uses it, nothing below does.
 *
 * Encoding (docs/tokenizers.md states each rule and what it is checked
 * against):
 *   1. with special tokens allowed, each occurrence of a special token's
 *      text (e.g. `<|endoftext|>`) becomes its id and splits the text;
 *      otherwise special tokens are plain text;
 *   2. the GPT-2 pre-tokenizer splits each piece into pre-tokens (the
 *      pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
 *      |\s+(?!\S)|\s+ with the Unicode classes of slapo_unicode_version());
 *      bytes that are not valid UTF-8 are each a pre-token of their own
 *      and end the text around them as the end of the input would;
 *   3. each pre-token's bytes are merged by rank: the pair of adjacent
 *      tokens with the lowest merge rank is merged everywhere in the
 *      pre-token, left to right, until no adjacent pair has a rank.
 * Decoding concatenates the tokens' bytes: encode then decode gives back
 * the input bytes exactly, valid UTF-8 or not. */
#ifndef SLAPO_TOKENIZER_H
#define SLAPO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slapo/core.h"

typedef struct slapo_tokenizer slapo_tokenizer;

/* A growable array of token ids. Zero-initialize; release with
 * slapo_token_ids_free. */
typedef struct slapo_token_ids {
  int32_t *ids;
  size_t n, cap;
} slapo_token_ids;
void slapo_token_ids_free(slapo_token_ids *t); /* NULL is fine; leaves it empty */

/* A growable byte buffer, always NUL-terminated past its n bytes (so text
 * can be printed; the bytes themselves may hold NULs). Zero-initialize;
 * release with slapo_bytes_free. */
typedef struct slapo_bytes {
  char *data;
  size_t n, cap;
} slapo_bytes;
void slapo_bytes_free(slapo_bytes *b); /* NULL is fine; leaves it empty */

/* The Unicode version the pre-tokenizer's letter/number/space classes come
 * from (the tables in src/tokenizer/unicode_tables.c), e.g. "17.0". */
const char *slapo_unicode_version(void);

/* Loads a tokenizer from `path`: a Hugging Face tokenizer.json whose model
 * is "BPE" with a "ByteLevel" pre-tokenizer (add_prefix_space false) and no
 * normalizer; its added tokens marked special are the special tokens.
 * *out owned (slapo_tokenizer_free). Errors: SLAPO_IO (cannot read),
 * SLAPO_PARSE (bad JSON, a vocabulary entry that is not byte-level text,
 * duplicate or missing ids, a vocabulary without the 256 byte tokens, a
 * merge naming an unknown token or repeated: the file and the entry
 * named), SLAPO_UNSUPPORTED ("unsupported tokenizer model X", a
 * pre-tokenizer or normalizer slapo does not implement), SLAPO_NOMEM. */
slapo_status slapo_tokenizer_load(const char *path, slapo_tokenizer **out);

/* Loads GPT-2's original pair of files: vocab.json (token text -> id, the
 * byte-level text of encoder.json) and merges.txt (vocab.bpe: an optional
 * "#version" line, then one merge "A B" per line, highest priority first).
 * `<|endoftext|>`, when the vocabulary has it, is the special token (as in
 * GPT-2). Errors: as slapo_tokenizer_load, naming the file and line. */
slapo_status slapo_tokenizer_load_bpe(const char *vocab_json, const char *merges_txt,
                                      slapo_tokenizer **out);

/* Loads a SentencePiece model (LLaMA's tokenizer.model) through Debian's
 * libsentencepiece, which encodes (its normalizer and model, byte
 * fallback). A token's bytes are its piece with U+2581 as a space and a
 * byte piece <0xAB> as that byte, so decoding concatenates them as for
 * BPE, keeping the leading space SentencePiece's own decoder drops; its
 * control pieces (<s>, </s>) are the special tokens. Not writable by
 * slapo_tokenizer_save. Errors: SLAPO_PARSE (not a model: the library's
 * message), SLAPO_NOMEM. */
slapo_status slapo_tokenizer_load_spm(const char *path, slapo_tokenizer **out);

/* The byte tokenizer: id = byte value, 256 ids, no merges, no special
 * tokens (slapo's default for text). */
slapo_status slapo_tokenizer_bytes(slapo_tokenizer **out);

/* Opens what a user names: "bytes" (slapo_tokenizer_bytes), a
 * tokenizer.json, a SentencePiece .model, or a directory holding
 * tokenizer.json, tokenizer.model, vocab.json + merges.txt, or
 * encoder.json + vocab.bpe (GPT-2's names). Errors: those
 * of the loaders; SLAPO_IO for a directory with none of them. */
slapo_status slapo_tokenizer_open(const char *spec, slapo_tokenizer **out);

void slapo_tokenizer_free(slapo_tokenizer *t); /* NULL is fine */

/* Learning a byte-level BPE (slapo_tokenizer_train). */
typedef struct slapo_bpe_train_opts {
  int32_t vocab_size;          /* 256 bytes + special tokens + merges */
  const char *const *specials; /* special tokens' texts, ids 256, 257, ... */
  int n_specials;
  int min_frequency;           /* a pair must occur this often to merge; <= 0: 2 */
} slapo_bpe_train_opts;

/* Learns a byte-level BPE from text[0..len) (Sennrich et al. 2016 on bytes,
 * as GPT-2): the text is split at special tokens' texts (never learned
 * from) and into GPT-2 pre-tokens; from the 256 bytes (id = byte value)
 * and the special tokens (ids 256 on, fixed whatever the size), the most
 * frequent adjacent pair is merged into a new token until the vocabulary
 * has o->vocab_size tokens or no pair occurs min_frequency times (the
 * vocabulary is then smaller). Ties go to the pair of smaller ids: the
 * same text gives the same tokenizer. Pair counts are updated
 * incrementally (seconds for a few MB). *out owned. Errors:
 * SLAPO_INVALID_ARG (vocab_size below 256 + specials, an empty special
 * token), SLAPO_LIMIT (text over 4 GiB), SLAPO_NOMEM. */
slapo_status slapo_tokenizer_train(const char *text, size_t len, const slapo_bpe_train_opts *o,
                                   slapo_tokenizer **out);

/* Writes t as a Hugging Face tokenizer.json (model BPE, ByteLevel
 * pre-tokenizer and decoder, merges as "A B", special tokens in
 * added_tokens) that slapo_tokenizer_load and the tokenizers library read,
 * atomically (slapo_write_atomic). Errors: SLAPO_IO, SLAPO_NOMEM. */
slapo_status slapo_tokenizer_save(const slapo_tokenizer *t, const char *path);

/* A 64-bit hash of everything that decides t's ids (tokens, merges,
 * special tokens): equal hashes, equal encodings. 0 for NULL. */
uint64_t slapo_tokenizer_hash(const slapo_tokenizer *t);

/* Ids run over [0, vocab size). */
int32_t slapo_tokenizer_vocab_size(const slapo_tokenizer *t);

/* The number of bytes token id decodes to (0 for an id out of range). */
int32_t slapo_tokenizer_token_len(const slapo_tokenizer *t, int32_t id);

/* The id of special token `text` (e.g. "<|endoftext|>"), or -1. */
int32_t slapo_tokenizer_special_id(const slapo_tokenizer *t, const char *text);

/* Appends to *out the ids of text[0..len) (any bytes; see the file
 * comment for the rules). allow_special: recognise special tokens' text.
 * Not thread-safe on one tokenizer (it keeps a cache of encoded
 * pre-tokens); use one tokenizer per thread. Errors: SLAPO_NOMEM (out
 * keeps what it had). */
slapo_status slapo_tokenizer_encode(slapo_tokenizer *t, const char *text, size_t len,
                                    bool allow_special, slapo_token_ids *out);

/* Appends to *out the bytes of ids[0..n). Errors: SLAPO_INVALID_ARG (an id
 * outside [0, vocab size): the id and its index named), SLAPO_NOMEM. */
slapo_status slapo_tokenizer_decode(const slapo_tokenizer *t, const int32_t *ids, size_t n,
                                    slapo_bytes *out);

/* Streaming decode, one token at a time, that never splits a UTF-8
 * character: the bytes of `id` are appended to *out except for a trailing
 * character whose encoding is not complete yet, which is held in *st until
 * the next token completes it. Bytes that cannot become valid UTF-8 are
 * passed on as they are. slapo_decode_flush appends what is held (at the
 * end of a stream). Zero-initialize the state. Errors: as
 * slapo_tokenizer_decode. */
typedef struct slapo_decode_state {
  uint8_t held[4];
  int n_held;
} slapo_decode_state;
slapo_status slapo_tokenizer_decode_next(const slapo_tokenizer *t, int32_t id,
                                         slapo_decode_state *st, slapo_bytes *out);
slapo_status slapo_decode_flush(slapo_decode_state *st, slapo_bytes *out);

#endif
