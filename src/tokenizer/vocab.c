/* src/tokenizer/vocab.c - the vocabulary and merge tables of a byte-level
 * BPE: token bytes by id, id by bytes, (left, right) -> (rank, merged id),
 * and GPT-2's byte-level alphabet. */
#include <string.h>

#include "core/assert.h"
#include "tokenizer/internal.h"

/* bytes_to_unicode (gpt-2 encoder.py): the bytes '!'..'~', U+00A1..U+00AC
 * and U+00AE..U+00FF stand for themselves; the other 68 bytes, in order,
 * for U+0100 onwards. */
static bool printable(int b) { return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae; }

uint32_t slapo__byte_char(uint8_t b) {
  if (printable(b)) return b;
  uint32_t k = 0; /* b's rank among the non-printable bytes */
  for (int x = 0; x < b; x++) k += !printable(x);
  return 0x100 + k;
}

int slapo__char_byte(uint32_t cp) {
  if (cp < 0x100) return printable((int)cp) ? (int)cp : -1;
  if (cp >= 0x100 + 68) return -1;
  uint32_t k = 0;
  for (int b = 0; b < 256; b++)
    if (!printable(b) && k++ == cp - 0x100) return b;
  return -1;
}

static uint64_t hash_bytes(const uint8_t *b, size_t n) { return slapo_hash64(b, n, 0x7a3b); }

static size_t pow2_at_least(size_t n) {
  size_t m = 16;
  while (m < n) m <<= 1;
  return m;
}

int32_t slapo__tok_find(const slapo_tokenizer *t, const uint8_t *b, size_t n) {
  for (size_t h = hash_bytes(b, n) & t->tok_mask;; h = (h + 1) & t->tok_mask) {
    uint32_t v = t->tok_slot[h];
    if (!v) return -1;
    int32_t id = (int32_t)v - 1;
    uint32_t o = t->tok_off[id], m = t->tok_off[id + 1] - o;
    if (m == n && memcmp(t->tok_bytes + o, b, n) == 0) return id;
  }
}

/* A token's bytes shown for a message: printable ASCII as is, the rest \xNN. */
static void show(const uint8_t *b, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 5 < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, b[i] >= 0x20 && b[i] < 0x7f && b[i] != '\\' ? "%c" : "\\x%02x", b[i]);
  out[k] = '\0';
}

slapo_status slapo__tok_build(slapo_tokenizer *t, const uint32_t *off, const uint8_t *bytes,
                              int32_t n, const char *src) {
  t->n_vocab = n;
  t->tok_off = slapo_malloc(((size_t)n + 1) * sizeof *t->tok_off);
  t->tok_bytes = slapo_malloc(off[n] ? off[n] : 1);
  t->tok_mask = pow2_at_least(2 * (size_t)n) - 1;
  t->tok_slot = slapo_calloc(t->tok_mask + 1, sizeof *t->tok_slot);
  if (!t->tok_off || !t->tok_bytes || !t->tok_slot) return slapo_error(SLAPO_NOMEM, "%s: out of memory", src);
  memcpy(t->tok_off, off, ((size_t)n + 1) * sizeof *off);
  memcpy(t->tok_bytes, bytes, off[n]);
  for (int32_t id = 0; id < n; id++) {
    const uint8_t *b = bytes + off[id];
    size_t m = off[id + 1] - off[id];
    if (m == 0) return slapo_error(SLAPO_PARSE, "%s: token %d is empty", src, id);
    int32_t other = slapo__tok_find(t, b, m);
    if (other >= 0) {
      char txt[64];
      show(b, m, txt, sizeof txt);
      return slapo_error(SLAPO_PARSE, "%s: tokens %d and %d are both \"%s\"", src, other, id, txt);
    }
    size_t h = hash_bytes(b, m) & t->tok_mask;
    while (t->tok_slot[h]) h = (h + 1) & t->tok_mask;
    t->tok_slot[h] = (uint32_t)id + 1;
  }
  for (int b = 0; b < 256; b++) {
    uint8_t c = (uint8_t)b;
    t->byte_id[b] = slapo__tok_find(t, &c, 1);
    if (t->byte_id[b] < 0)
      return slapo_error(SLAPO_PARSE,
                         "%s: the vocabulary has no token for byte 0x%02x (a byte-level BPE needs "
                         "all 256; written \"\\u%04x\" in tokenizer files)",
                         src, b, slapo__byte_char(c));
  }
  return SLAPO_OK;
}

slapo_status slapo__merges_reserve(slapo_tokenizer *t, size_t n) {
  t->pair_mask = pow2_at_least(2 * n) - 1;
  t->pair_key = slapo_malloc((t->pair_mask + 1) * sizeof *t->pair_key);
  t->pair_rank = slapo_malloc((t->pair_mask + 1) * sizeof *t->pair_rank);
  t->pair_out = slapo_malloc((t->pair_mask + 1) * sizeof *t->pair_out);
  t->merge_left = slapo_malloc((n ? n : 1) * sizeof *t->merge_left);
  t->merge_right = slapo_malloc((n ? n : 1) * sizeof *t->merge_right);
  if (!t->pair_key || !t->pair_rank || !t->pair_out || !t->merge_left || !t->merge_right)
    return slapo_error(SLAPO_NOMEM, "tokenizer: out of memory for %zu merges", n);
  memset(t->pair_key, 0xff, (t->pair_mask + 1) * sizeof *t->pair_key);
  t->n_merges = 0;
  return SLAPO_OK;
}

static size_t pair_slot(const slapo_tokenizer *t, uint64_t key) {
  size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & t->pair_mask;
  while (t->pair_key[h] != UINT64_MAX && t->pair_key[h] != key) h = (h + 1) & t->pair_mask;
  return h;
}

bool slapo__merge_find(const slapo_tokenizer *t, int32_t left, int32_t right, uint32_t *rank,
                       int32_t *out) {
  if (!t->pair_key) return false;
  size_t h = pair_slot(t, (uint64_t)(uint32_t)left << 32 | (uint32_t)right);
  if (t->pair_key[h] == UINT64_MAX) return false;
  *rank = t->pair_rank[h];
  *out = t->pair_out[h];
  return true;
}

slapo_status slapo__merge_add(slapo_tokenizer *t, int32_t left, int32_t right, const char *where) {
  SLAPO_ASSERT(2 * t->n_merges < t->pair_mask + 1);
  uint32_t lo = t->tok_off[left], ln = t->tok_off[left + 1] - lo;
  uint32_t ro = t->tok_off[right], rn = t->tok_off[right + 1] - ro;
  uint8_t stack[256], *cat = ln + rn <= sizeof stack ? stack : slapo_malloc(ln + rn);
  if (!cat) return slapo_error(SLAPO_NOMEM, "%s: out of memory", where);
  memcpy(cat, t->tok_bytes + lo, ln);
  memcpy(cat + ln, t->tok_bytes + ro, rn);
  int32_t merged = slapo__tok_find(t, cat, ln + rn);
  char txt[96];
  show(cat, ln + rn, txt, sizeof txt);
  if (cat != stack) slapo_free(cat);
  if (merged < 0)
    return slapo_error(SLAPO_PARSE, "%s: the merged token \"%s\" is not in the vocabulary", where, txt);
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  size_t h = pair_slot(t, key);
  if (t->pair_key[h] != UINT64_MAX)
    return slapo_error(SLAPO_PARSE, "%s: the merge into \"%s\" repeats merge %u", where, txt,
                       t->pair_rank[h]);
  t->pair_key[h] = key;
  t->pair_rank[h] = (uint32_t)t->n_merges;
  t->pair_out[h] = merged;
  t->merge_left[t->n_merges] = left;
  t->merge_right[t->n_merges] = right;
  t->n_merges++;
  return SLAPO_OK;
}
