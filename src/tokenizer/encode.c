/* src/tokenizer/encode.c - encoding (special tokens, pre-tokens, BPE merges
 * by rank, a cache of encoded pre-tokens) and decoding, whole or streamed. */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "tokenizer/internal.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

slapo_status slapo__ids_push(slapo_token_ids *o, int32_t id) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 256;
    int32_t *p = slapo_realloc(o->ids, cap * sizeof *p);
    if (!p) return slapo_error(SLAPO_NOMEM, "tokenizer: out of memory for %zu token ids", cap);
    o->ids = p, o->cap = cap;
  }
  o->ids[o->n++] = id;
  return SLAPO_OK;
}

void slapo_token_ids_free(slapo_token_ids *t) {
  if (!t) return;
  slapo_free(t->ids);
  *t = (slapo_token_ids){0};
}

slapo_status slapo__bytes_append(slapo_bytes *b, const void *p, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *d = slapo_realloc(b->data, cap);
    if (!d) return slapo_error(SLAPO_NOMEM, "tokenizer: out of memory for %zu bytes of text", cap);
    b->data = d, b->cap = cap;
  }
  if (n) memcpy(b->data + b->n, p, n);
  b->n += n;
  b->data[b->n] = '\0';
  return SLAPO_OK;
}

void slapo_bytes_free(slapo_bytes *b) {
  if (!b) return;
  slapo_free(b->data);
  *b = (slapo_bytes){0};
}

/* ---- BPE of one pre-token ------------------------------------------------ */

/* A candidate merge: the pair starting at symbol `pos`, of rank `rank`,
 * into token `out`, valid while the symbols there are still (left, right). */
typedef struct cand {
  uint32_t rank, pos;
  int32_t left, right, out;
} cand;

static bool before(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(cand *h, size_t *n, cand c) {
  size_t i = (*n)++;
  for (; i && before(c, h[(i - 1) / 2]); i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
  h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
  cand top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && before(h[c + 1], h[c])) c++;
    if (!before(h[c], last)) break;
    h[i] = h[c], i = c;
  }
  if (*n) h[i] = last;
  return top;
}

/* Symbols of a pre-token as a linked list over positions 0..n-1. */
typedef struct word {
  int32_t *id, *prev, *next; /* next -1: last; id -1: merged away */
  cand *heap, *pending;
  size_t n_heap, n_pending;
} word;

static void consider(const slapo_tokenizer *t, word *w, int32_t pos, cand *to, size_t *n) {
  int32_t nx = w->next[pos];
  uint32_t rank;
  int32_t out;
  if (pos < 0 || nx < 0 || !slapo__merge_find(t, w->id[pos], w->id[nx], &rank, &out)) return;
  to[(*n)++] = (cand){rank, (uint32_t)pos, w->id[pos], w->id[nx], out};
}

/* GPT-2's rule: the lowest-ranked pair is merged at every place it occurs,
 * left to right, before any pair the merges create is considered. The
 * heap gives the places in order; the pairs a merge creates wait in
 * `pending` until the heap's next candidate has another rank. */
static void merge_all(const slapo_tokenizer *t, word *w) {
  uint32_t cur = UINT32_MAX;
  while (w->n_heap || w->n_pending) {
    if (w->n_pending && (!w->n_heap || w->heap[0].rank != cur)) {
      for (size_t k = 0; k < w->n_pending; k++) heap_push(w->heap, &w->n_heap, w->pending[k]);
      w->n_pending = 0;
    }
    cand c = heap_pop(w->heap, &w->n_heap);
    cur = c.rank;
    int32_t p = (int32_t)c.pos, nx = w->next[p];
    if (w->id[p] != c.left || nx < 0 || w->id[nx] != c.right) continue; /* stale */
    w->id[p] = c.out;
    w->id[nx] = -1;
    w->next[p] = w->next[nx];
    if (w->next[nx] >= 0) w->prev[w->next[nx]] = p;
    consider(t, w, w->prev[p], w->pending, &w->n_pending);
    consider(t, w, p, w->pending, &w->n_pending);
  }
}

static slapo_status bpe_uncached(const slapo_tokenizer *t, const uint8_t *s, size_t n,
                                 slapo_token_ids *out) {
  enum { STACK = 64 };
  int32_t sid[3 * STACK];
  cand sheap[2 * STACK + 2 * STACK];
  word w;
  void *big = NULL;
  if (n <= STACK) {
    w = (word){sid, sid + STACK, sid + 2 * STACK, sheap, sheap + 2 * STACK, 0, 0};
  } else { /* every merge adds at most 2 candidates: 3n in the heap in all */
    big = slapo_malloc(3 * n * sizeof(int32_t) + 5 * n * sizeof(cand));
    if (!big) return slapo_error(SLAPO_NOMEM, "tokenizer: out of memory for a %zu-byte pre-token", n);
    int32_t *b = big;
    cand *c = (cand *)(b + 3 * n);
    w = (word){b, b + n, b + 2 * n, c, c + 3 * n, 0, 0};
  }
  for (size_t i = 0; i < n; i++) {
    w.id[i] = t->byte_id[s[i]];
    w.prev[i] = (int32_t)i - 1;
    w.next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) consider(t, &w, (int32_t)i, w.heap, &w.n_heap);
  /* heapify what consider() appended in order */
  size_t k = w.n_heap;
  w.n_heap = 0;
  for (size_t i = 0; i < k; i++) heap_push(w.heap, &w.n_heap, w.heap[i]);
  merge_all(t, &w);
  slapo_status st = SLAPO_OK;
  for (int32_t p = 0; p >= 0 && st == SLAPO_OK; p = w.next[p]) st = slapo__ids_push(out, w.id[p]);
  slapo_free(big);
  return st;
}

static uint32_t cache_hash(const uint8_t *s, size_t n) {
  uint32_t h = 2166136261u; /* FNV-1a: short keys, called per pre-token */
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
  return h;
}

slapo_status slapo__bpe_word(slapo_tokenizer *t, const uint8_t *s, size_t n, slapo_token_ids *out) {
  if (n == 1) return slapo__ids_push(out, t->byte_id[s[0]]);
  if (n > SLAPO__CACHE_KEY) return bpe_uncached(t, s, n, out);
  if (!t->cache) t->cache = slapo_calloc(SLAPO__CACHE_SLOTS, sizeof *t->cache);
  if (!t->cache) return bpe_uncached(t, s, n, out); /* the cache is optional */
  slapo__cache_slot *c = &t->cache[cache_hash(s, n) & (SLAPO__CACHE_SLOTS - 1)];
  if (c->key_len == n && memcmp(c->key, s, n) == 0) {
    for (int k = 0; k < c->n_ids; k++) SLAPO_TRY(slapo__ids_push(out, c->ids[k]));
    return SLAPO_OK;
  }
  size_t first = out->n;
  SLAPO_TRY(bpe_uncached(t, s, n, out));
  if (out->n - first <= SLAPO__CACHE_IDS) {
    c->key_len = (uint8_t)n;
    c->n_ids = (uint8_t)(out->n - first);
    memcpy(c->key, s, n);
    memcpy(c->ids, out->ids + first, (out->n - first) * sizeof *c->ids);
  }
  return SLAPO_OK;
}

/* ---- encode / decode ----------------------------------------------------- */

static slapo_status encode_plain(slapo_tokenizer *t, const uint8_t *s, size_t n, slapo_token_ids *out) {
  if (t->spm) {
    int32_t *ids;
    size_t k;
    if (n == 0) return SLAPO_OK;
    if (slapo__spm_encode(t->spm, (const char *)s, n, &ids, &k) != 0)
      return slapo_error(SLAPO_NOMEM, "tokenizer: SentencePiece could not encode %zu bytes", n);
    slapo_status st = SLAPO_OK;
    for (size_t i = 0; i < k && st == SLAPO_OK; i++) st = slapo__ids_push(out, ids[i]);
    free(ids);
    return st;
  }
  if (t->n_merges == 0) { /* bytes: no pre-token merges anything */
    for (size_t i = 0; i < n; i++) SLAPO_TRY(slapo__ids_push(out, t->byte_id[s[i]]));
    return SLAPO_OK;
  }
  for (size_t i = 0; i < n;) {
    size_t j = slapo__pretok_next(s, n, i);
    SLAPO_TRY(slapo__bpe_word(t, s + i, j - i, out));
    i = j;
  }
  return SLAPO_OK;
}

size_t slapo__find_bytes(const uint8_t *s, size_t n, const uint8_t *b, size_t m) {
  for (const uint8_t *p = s; (size_t)(p - s) + m <= n; p++) {
    p = memchr(p, b[0], n - m + 1 - (size_t)(p - s));
    if (!p) break;
    if (memcmp(p, b, m) == 0) return (size_t)(p - s);
  }
  return n;
}

/* The special token whose text occurs first in s[0..n) (the longest of
 * those starting there): its id and *at, or -1 and *at = n. */
static int32_t next_special(const slapo_tokenizer *t, const uint8_t *s, size_t n, size_t *at) {
  int32_t best = -1;
  size_t best_at = n, best_len = 0;
  for (int k = 0; k < t->n_special; k++) {
    int32_t id = t->special[k];
    size_t m = t->tok_off[id + 1] - t->tok_off[id];
    size_t i = slapo__find_bytes(s, n, t->tok_bytes + t->tok_off[id], m);
    if (i < n && (i < best_at || (i == best_at && m > best_len))) best = id, best_at = i, best_len = m;
  }
  *at = best_at;
  return best;
}

slapo_status slapo_tokenizer_encode(slapo_tokenizer *t, const char *text, size_t len,
                                    bool allow_special, slapo_token_ids *out) {
  SLAPO_NEED(t, "slapo_tokenizer_encode");
  SLAPO_NEED(out, "slapo_tokenizer_encode");
  if (len && !text) return slapo_error(SLAPO_INVALID_ARG, "slapo_tokenizer_encode: text is NULL");
  const uint8_t *s = (const uint8_t *)text;
  size_t keep = out->n;
  slapo_status st = SLAPO_OK;
  while (len && st == SLAPO_OK) {
    size_t at = len;
    int32_t sp = allow_special && t->n_special ? next_special(t, s, len, &at) : -1;
    st = encode_plain(t, s, at, out);
    if (sp < 0 || st != SLAPO_OK) break;
    st = slapo__ids_push(out, sp);
    size_t m = t->tok_off[sp + 1] - t->tok_off[sp];
    s += at + m, len -= at + m;
  }
  if (st != SLAPO_OK) out->n = keep;
  return st;
}

static slapo_status check_id(const slapo_tokenizer *t, int32_t id, size_t index) {
  if (id < 0 || id >= t->n_vocab)
    return slapo_error(SLAPO_INVALID_ARG, "tokenizer: token id %d (at index %zu) is outside [0, %d)",
                       id, index, t->n_vocab);
  return SLAPO_OK;
}

slapo_status slapo_tokenizer_decode(const slapo_tokenizer *t, const int32_t *ids, size_t n,
                                    slapo_bytes *out) {
  SLAPO_NEED(t, "slapo_tokenizer_decode");
  SLAPO_NEED(out, "slapo_tokenizer_decode");
  for (size_t i = 0; i < n; i++) {
    SLAPO_TRY(check_id(t, ids[i], i));
    uint32_t o = t->tok_off[ids[i]];
    SLAPO_TRY(slapo__bytes_append(out, t->tok_bytes + o, t->tok_off[ids[i] + 1] - o));
  }
  return SLAPO_OK;
}

slapo_status slapo_tokenizer_decode_next(const slapo_tokenizer *t, int32_t id,
                                         slapo_decode_state *st, slapo_bytes *out) {
  SLAPO_NEED(t, "slapo_tokenizer_decode_next");
  SLAPO_NEED(st, "slapo_tokenizer_decode_next");
  SLAPO_NEED(out, "slapo_tokenizer_decode_next");
  SLAPO_TRY(check_id(t, id, 0));
  size_t start = out->n;
  SLAPO_TRY(slapo__bytes_append(out, st->held, (size_t)st->n_held));
  uint32_t o = t->tok_off[id];
  SLAPO_TRY(slapo__bytes_append(out, t->tok_bytes + o, t->tok_off[id + 1] - o));
  st->n_held = 0;
  /* Hold back a character started in the last 3 bytes and not finished. */
  const uint8_t *b = (const uint8_t *)out->data;
  for (size_t k = out->n > start + 3 ? out->n - 3 : start; k < out->n; k++) {
    int m = slapo__utf8_incomplete(b + k, out->n - k);
    if (m) {
      memcpy(st->held, b + k, (size_t)m);
      st->n_held = m;
      out->n = k;
      out->data[k] = '\0';
      break;
    }
  }
  return SLAPO_OK;
}

slapo_status slapo_decode_flush(slapo_decode_state *st, slapo_bytes *out) {
  SLAPO_NEED(st, "slapo_decode_flush");
  SLAPO_NEED(out, "slapo_decode_flush");
  SLAPO_TRY(slapo__bytes_append(out, st->held, (size_t)st->n_held));
  st->n_held = 0;
  return SLAPO_OK;
}
