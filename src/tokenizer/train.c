/* src/tokenizer/train.c - learning a byte-level BPE from text (Sennrich et
 * al. 2016, "Neural Machine Translation of Rare Words with Subword Units",
 * algorithm 1, on bytes as GPT-2 does): the text is split into GPT-2
 * pre-tokens and counted; starting from the 256 bytes, the most frequent
 * adjacent pair over all pre-tokens (weighted by their counts) becomes a
 * new token, until the vocabulary is full or no pair occurs twice. Pair
 * counts are kept incrementally: a merge re-counts only the distinct
 * pre-tokens that contain its pair. Ties go to the pair of smaller ids, so
 * a run is deterministic. */
#include <string.h>

#include "core/assert.h"
#include "tokenizer/internal.h"

/* ---- growable arrays ---- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void *q = slapo_realloc(*p, c * elem);
  if (!q) return false;
  *p = q, *cap = c;
  return true;
}

/* ---- distinct pre-tokens and their counts ---- */

typedef struct word {
  uint32_t off, len; /* symbols sym[off, off + len) */
  int64_t count;
} word;

typedef struct pair_info {
  uint64_t key; /* left << 32 | right */
  int64_t count;
  uint32_t *words; /* words that had this pair when it was counted (may repeat) */
  size_t n_words, cap_words;
  bool merged;     /* already a merge: never again */
} pair_info;

typedef struct trainer {
  const uint8_t *text;
  word *words;
  size_t n_words, cap_words;
  uint32_t *wslot; /* pre-token index: word id + 1, 0 empty */
  size_t wmask;
  int32_t *sym; /* every word's symbols */
  size_t n_sym, cap_sym;
  uint32_t *wtext; /* word i's first byte in text */
  size_t cap_wtext;
  pair_info *pairs;
  size_t n_pairs, cap_pairs;
  uint32_t *pslot; /* pair index: pair id + 1 */
  size_t pmask;
  uint32_t *seen; /* per word: the merge number that last visited it */
  struct heap_item { int64_t count; uint64_t key; } *heap;
  size_t n_heap, cap_heap;
  uint64_t *touched; /* pairs whose count changed since the last queueing */
  size_t n_touched, cap_touched;
} trainer;

static uint64_t hash64(const void *p, size_t n) { return slapo_hash64(p, n, 0xb9e); }

/* Counts pre-token text[i, j). */
static slapo_status count_word(trainer *tr, size_t i, size_t j) {
  const uint8_t *s = tr->text + i;
  size_t n = j - i;
  size_t h = hash64(s, n) & tr->wmask;
  for (;; h = (h + 1) & tr->wmask) {
    uint32_t v = tr->wslot[h];
    if (!v) break;
    word *w = &tr->words[v - 1];
    if (w->len == n && memcmp(tr->text + tr->wtext[v - 1], s, n) == 0) return w->count++, SLAPO_OK;
  }
  if (!grow((void **)&tr->words, &tr->cap_words, tr->n_words + 1, sizeof *tr->words) ||
      !grow((void **)&tr->wtext, &tr->cap_wtext, tr->n_words + 1, sizeof *tr->wtext) ||
      !grow((void **)&tr->sym, &tr->cap_sym, tr->n_sym + n, sizeof *tr->sym))
    return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory for %zu pre-tokens", tr->n_words + 1);
  tr->words[tr->n_words] = (word){(uint32_t)tr->n_sym, (uint32_t)n, 1};
  tr->wtext[tr->n_words] = (uint32_t)i;
  for (size_t k = 0; k < n; k++) tr->sym[tr->n_sym + k] = s[k]; /* byte b is token b */
  tr->n_sym += n;
  tr->wslot[h] = (uint32_t)++tr->n_words;
  if (2 * tr->n_words > tr->wmask) { /* rehash at half full */
    size_t m = 2 * (tr->wmask + 1);
    uint32_t *ns = slapo_calloc(m, sizeof *ns);
    if (!ns) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    for (size_t w = 0; w < tr->n_words; w++) {
      size_t k = hash64(tr->text + tr->wtext[w], tr->words[w].len) & (m - 1);
      while (ns[k]) k = (k + 1) & (m - 1);
      ns[k] = (uint32_t)w + 1;
    }
    slapo_free(tr->wslot);
    tr->wslot = ns, tr->wmask = m - 1;
  }
  return SLAPO_OK;
}

/* ---- pairs ---- */

static size_t pair_hash(uint64_t key, size_t mask) { return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 17) & mask; }

/* The pair's record, created when absent; NULL when out of memory. */
static pair_info *pair_get(trainer *tr, uint64_t key) {
  size_t h = pair_hash(key, tr->pmask);
  for (;; h = (h + 1) & tr->pmask) {
    uint32_t v = tr->pslot[h];
    if (!v) break;
    if (tr->pairs[v - 1].key == key) return &tr->pairs[v - 1];
  }
  if (!grow((void **)&tr->pairs, &tr->cap_pairs, tr->n_pairs + 1, sizeof *tr->pairs)) return NULL;
  tr->pairs[tr->n_pairs] = (pair_info){.key = key};
  tr->pslot[h] = (uint32_t)++tr->n_pairs;
  if (2 * tr->n_pairs > tr->pmask) {
    size_t m = 2 * (tr->pmask + 1);
    uint32_t *ns = slapo_calloc(m, sizeof *ns);
    if (!ns) return NULL;
    for (size_t p = 0; p < tr->n_pairs; p++) {
      size_t k = pair_hash(tr->pairs[p].key, m - 1);
      while (ns[k]) k = (k + 1) & (m - 1);
      ns[k] = (uint32_t)p + 1;
    }
    slapo_free(tr->pslot);
    tr->pslot = ns, tr->pmask = m - 1;
    return pair_get(tr, key);
  }
  return &tr->pairs[tr->n_pairs - 1];
}

/* Heap order: the larger count first; ties to the smaller key. */
static bool above(struct heap_item a, struct heap_item b) {
  return a.count != b.count ? a.count > b.count : a.key < b.key;
}

static bool heap_push(trainer *tr, int64_t count, uint64_t key) {
  if (!grow((void **)&tr->heap, &tr->cap_heap, tr->n_heap + 1, sizeof *tr->heap)) return false;
  struct heap_item it = {count, key};
  size_t i = tr->n_heap++;
  for (; i && above(it, tr->heap[(i - 1) / 2]); i = (i - 1) / 2) tr->heap[i] = tr->heap[(i - 1) / 2];
  tr->heap[i] = it;
  return true;
}

static struct heap_item heap_pop(trainer *tr) {
  struct heap_item top = tr->heap[0], last = tr->heap[--tr->n_heap];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= tr->n_heap) break;
    if (c + 1 < tr->n_heap && above(tr->heap[c + 1], tr->heap[c])) c++;
    if (!above(tr->heap[c], last)) break;
    tr->heap[i] = tr->heap[c], i = c;
  }
  if (tr->n_heap) tr->heap[i] = last;
  return top;
}

/* Adds `sign` times word w's count to each of its pairs and notes them as
 * touched; with sign > 0 also records w under each pair. */
static slapo_status count_pairs(trainer *tr, uint32_t w, int sign) {
  const word *wd = &tr->words[w];
  const int32_t *s = tr->sym + wd->off;
  for (uint32_t k = 0; k + 1 < wd->len; k++) {
    uint64_t key = (uint64_t)(uint32_t)s[k] << 32 | (uint32_t)s[k + 1];
    pair_info *p = pair_get(tr, key);
    if (!p || !grow((void **)&tr->touched, &tr->cap_touched, tr->n_touched + 1, sizeof *tr->touched))
      return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory for pairs");
    p->count += sign * wd->count;
    tr->touched[tr->n_touched++] = key;
    if (sign > 0) {
      if (!grow((void **)&p->words, &p->cap_words, p->n_words + 1, sizeof *p->words))
        return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory for pairs");
      p->words[p->n_words++] = w;
    }
  }
  return SLAPO_OK;
}

/* Queues the current count of every touched pair (the heap keeps older
 * entries; a popped entry whose count is no longer current is skipped). */
static slapo_status queue_touched(trainer *tr) {
  for (size_t k = 0; k < tr->n_touched; k++) {
    pair_info *p = pair_get(tr, tr->touched[k]);
    if (!p || (p->count > 0 && !p->merged && !heap_push(tr, p->count, p->key)))
      return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory for pairs");
  }
  tr->n_touched = 0;
  return SLAPO_OK;
}

/* Merges (left, right) into `id` in word w, left to right. */
static void merge_word(trainer *tr, uint32_t w, int32_t left, int32_t right, int32_t id) {
  word *wd = &tr->words[w];
  int32_t *s = tr->sym + wd->off;
  uint32_t o = 0;
  for (uint32_t k = 0; k < wd->len; k++) {
    if (k + 1 < wd->len && s[k] == left && s[k + 1] == right) s[o++] = id, k++;
    else s[o++] = s[k];
  }
  wd->len = o;
}

static void trainer_free(trainer *tr) {
  slapo_free(tr->words);
  slapo_free(tr->wslot);
  slapo_free(tr->sym);
  slapo_free(tr->wtext);
  for (size_t p = 0; p < tr->n_pairs; p++) slapo_free(tr->pairs[p].words);
  slapo_free(tr->pairs);
  slapo_free(tr->pslot);
  slapo_free(tr->seen);
  slapo_free(tr->heap);
  slapo_free(tr->touched);
}

/* ---- the vocabulary learned ---- */

typedef struct learned {
  uint8_t *bytes; /* token i's bytes at off[i] */
  uint32_t *off;
  size_t n, cap, nbytes, cap_bytes, cap_off;
  int32_t *ml, *mr; /* merges */
  size_t n_merges, cap_ml, cap_mr;
} learned;

static bool add_token(learned *v, const uint8_t *b, size_t n) {
  if (!grow((void **)&v->off, &v->cap_off, v->n + 2, sizeof *v->off) ||
      !grow((void **)&v->bytes, &v->cap_bytes, v->nbytes + n + 1, 1))
    return false;
  if (v->n == 0) v->off[0] = 0;
  memcpy(v->bytes + v->nbytes, b, n);
  v->nbytes += n;
  v->off[++v->n] = (uint32_t)v->nbytes;
  return true;
}

/* Splits text at the special tokens' texts (never learned from) and counts
 * the pre-tokens of the rest. */
static slapo_status count_text(trainer *tr, const uint8_t *s, size_t len,
                               const slapo_bpe_train_opts *o) {
  size_t i = 0;
  while (i < len) {
    size_t stop = len, skip = 0;
    for (int k = 0; k < o->n_specials; k++) {
      size_t m = strlen(o->specials[k]);
      size_t p = i + slapo__find_bytes(s + i, len - i, (const uint8_t *)o->specials[k], m);
      if (p < len && (p < stop || (p == stop && m > skip))) stop = p, skip = m;
    }
    while (i < stop) {
      size_t j = slapo__pretok_next(s, stop, i);
      SLAPO_TRY(count_word(tr, i, j));
      i = j;
    }
    i += skip;
  }
  return SLAPO_OK;
}

static slapo_status learn(trainer *tr, learned *v, const slapo_bpe_train_opts *o) {
  int32_t n_merges = o->vocab_size - 256 - o->n_specials;
  tr->seen = slapo_calloc(tr->n_words ? tr->n_words : 1, sizeof *tr->seen);
  if (!tr->seen) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
  for (uint32_t w = 0; w < tr->n_words; w++) {
    SLAPO_TRY(count_pairs(tr, w, +1));
    tr->n_touched = 0; /* each pair is queued once below */
  }
  for (size_t k = 0; k < tr->n_pairs; k++)
    if (!heap_push(tr, tr->pairs[k].count, tr->pairs[k].key))
      return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory for pairs");
  int64_t min_count = o->min_frequency > 0 ? o->min_frequency : 2;
  for (int32_t m = 0; m < n_merges && tr->n_heap;) {
    struct heap_item top = heap_pop(tr);
    pair_info *p = pair_get(tr, top.key);
    if (!p) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    if (p->merged || p->count != top.count) continue; /* stale */
    if (p->count < min_count) break;
    p->merged = true;
    int32_t left = (int32_t)(top.key >> 32), right = (int32_t)(uint32_t)top.key;
    int32_t id = (int32_t)v->n;
    uint32_t lo = v->off[left], ln = v->off[left + 1] - lo, ro = v->off[right], rn = v->off[right + 1] - ro;
    uint8_t buf[1024];
    uint8_t *cat = ln + rn <= sizeof buf ? buf : slapo_malloc(ln + rn);
    if (!cat) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    memcpy(cat, v->bytes + lo, ln);
    memcpy(cat + ln, v->bytes + ro, rn);
    bool ok = add_token(v, cat, ln + rn) && grow((void **)&v->ml, &v->cap_ml, v->n_merges + 1, sizeof *v->ml) &&
              grow((void **)&v->mr, &v->cap_mr, v->n_merges + 1, sizeof *v->mr);
    if (cat != buf) slapo_free(cat);
    if (!ok) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    v->ml[v->n_merges] = left, v->mr[v->n_merges++] = right;
    m++;
    /* Re-count the words that hold the pair: out with the old pairs, merge,
     * in with the new. The list is copied: counting may grow it. */
    size_t nw = p->n_words;
    uint32_t *ws = slapo_malloc((nw ? nw : 1) * sizeof *ws);
    if (!ws) return slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    memcpy(ws, p->words, nw * sizeof *ws);
    p->n_words = 0;
    slapo_status st = SLAPO_OK;
    for (size_t k = 0; k < nw && st == SLAPO_OK; k++) {
      uint32_t w = ws[k];
      if (tr->seen[w] == (uint32_t)m) continue;
      tr->seen[w] = (uint32_t)m;
      st = count_pairs(tr, w, -1);
      if (st == SLAPO_OK) merge_word(tr, w, left, right, id);
      if (st == SLAPO_OK) st = count_pairs(tr, w, +1);
    }
    slapo_free(ws);
    SLAPO_TRY(st);
    SLAPO_TRY(queue_touched(tr));
  }
  return SLAPO_OK;
}

slapo_status slapo_tokenizer_train(const char *text, size_t len, const slapo_bpe_train_opts *o,
                                   slapo_tokenizer **out) {
  SLAPO_NEED(o, "slapo_tokenizer_train");
  SLAPO_NEED(out, "slapo_tokenizer_train");
  *out = NULL;
  if (len && !text) return slapo_error(SLAPO_INVALID_ARG, "slapo_tokenizer_train: text is NULL");
  if (len > UINT32_MAX)
    return slapo_error(SLAPO_LIMIT, "tokenizer train: %zu bytes of text; at most 4 GiB", len);
  if (o->n_specials < 0 || (o->n_specials && !o->specials))
    return slapo_error(SLAPO_INVALID_ARG, "tokenizer train: %d special tokens, list NULL", o->n_specials);
  if (o->vocab_size < 256 + o->n_specials)
    return slapo_error(SLAPO_INVALID_ARG,
                       "tokenizer train: vocabulary size %d is below the 256 bytes plus %d special "
                       "token(s)",
                       o->vocab_size, o->n_specials);
  for (int k = 0; k < o->n_specials; k++)
    if (!o->specials[k] || !o->specials[k][0])
      return slapo_error(SLAPO_INVALID_ARG, "tokenizer train: special token %d is empty", k);
  trainer tr = {.text = (const uint8_t *)text, .wmask = 1023, .pmask = 4095};
  learned v = {0};
  tr.wslot = slapo_calloc(tr.wmask + 1, sizeof *tr.wslot);
  tr.pslot = slapo_calloc(tr.pmask + 1, sizeof *tr.pslot);
  slapo_status st = tr.wslot && tr.pslot ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
  /* Ids: the bytes 0..255 (id = byte), the special tokens, then merges. */
  for (int b = 0; b < 256 && st == SLAPO_OK; b++) {
    uint8_t c = (uint8_t)b;
    if (!add_token(&v, &c, 1)) st = slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
  }
  for (int k = 0; k < o->n_specials && st == SLAPO_OK; k++)
    if (!add_token(&v, (const uint8_t *)o->specials[k], strlen(o->specials[k])))
      st = slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
  if (st == SLAPO_OK) st = count_text(&tr, tr.text, len, o);
  if (st == SLAPO_OK) st = learn(&tr, &v, o);
  trainer_free(&tr);
  slapo_tokenizer *t = NULL;
  if (st == SLAPO_OK) {
    t = slapo_calloc(1, sizeof *t);
    if (!t) st = slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
  }
  if (st == SLAPO_OK) st = slapo__tok_build(t, v.off, v.bytes, (int32_t)v.n, "tokenizer train");
  if (st == SLAPO_OK) {
    t->special = slapo_malloc((size_t)o->n_specials * sizeof *t->special + 1);
    if (!t->special) st = slapo_error(SLAPO_NOMEM, "tokenizer train: out of memory");
    for (int k = 0; st == SLAPO_OK && k < o->n_specials; k++) t->special[t->n_special++] = 256 + k;
  }
  if (st == SLAPO_OK) st = slapo__merges_reserve(t, v.n_merges);
  for (size_t m = 0; st == SLAPO_OK && m < v.n_merges; m++)
    st = slapo__merge_add(t, v.ml[m], v.mr[m], "tokenizer train");
  slapo_free(v.bytes);
  slapo_free(v.off);
  slapo_free(v.ml);
  slapo_free(v.mr);
  if (st != SLAPO_OK) return slapo_tokenizer_free(t), st;
  *out = t;
  return SLAPO_OK;
}
