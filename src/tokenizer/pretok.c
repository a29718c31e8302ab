/* src/tokenizer/pretok.c - GPT-2's pre-tokenizer, the pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (gpt-2 encoder.py) written out as the regex engine runs it: at each
 * position the first alternative that matches, each greedy. A byte that is
 * not valid UTF-8 matches no class: it is a pre-token of its own, and the
 * text on either side of it is split as if the input ended (or began)
 * there (docs/tokenizers.md). */
#include "tokenizer/internal.h"
#include "tokenizer/unicode.h"

enum { INVALID = 4, END = 5 };

/* The class of the code point at s[i] and its length in *len; END at n,
 * INVALID (len 1) for a byte that does not start valid UTF-8. */
static int class_at(const uint8_t *s, size_t n, size_t i, int *len) {
  if (i >= n) return *len = 0, END;
  if (s[i] < 0x80) return *len = 1, slapo__uc_ascii[s[i]];
  uint32_t cp;
  *len = slapo__utf8_decode(s + i, n - i, &cp);
  if (*len == 0) return *len = 1, INVALID;
  return (int)slapo__uc_class_of(cp);
}

/* The end of the run of class c that starts at i (s[i] is of class c). */
static size_t run_of(const uint8_t *s, size_t n, size_t i, int c) {
  int len;
  while (class_at(s, n, i, &len) == c) i += (size_t)len;
  return i;
}

/* 's 't 'm 'd 're 've 'll at s[i] (lowercase only, as the pattern): its
 * length, else 0. */
static size_t contraction(const uint8_t *s, size_t n, size_t i) {
  if (s[i] != '\'' || i + 1 >= n) return 0;
  uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

size_t slapo__pretok_next(const uint8_t *s, size_t n, size_t i) {
  size_t k = contraction(s, n, i);
  if (k) return i + k;
  int len, c = class_at(s, n, i, &len);
  if (c == INVALID) return i + 1;
  if (c != SLAPO__UC_SPACE) return run_of(s, n, i, c); /* \p{L}+, \p{N}+, [^\s\p{L}\p{N}]+ */
  if (s[i] == ' ') { /* ' ?' before a letter, number or other run */
    int c1 = class_at(s, n, i + 1, &len);
    if (c1 == SLAPO__UC_LETTER || c1 == SLAPO__UC_NUMBER || c1 == SLAPO__UC_OTHER)
      return run_of(s, n, i + 1, c1);
  }
  /* \s+(?!\S): the whole run when the text (or valid text) ends after it;
   * else all but its last character, if that leaves one; else \s+. */
  size_t last = i, j = i;
  while ((c = class_at(s, n, j, &len)) == SLAPO__UC_SPACE) last = j, j += (size_t)len;
  if (c == END || c == INVALID || last == i) return j;
  return last;
}
