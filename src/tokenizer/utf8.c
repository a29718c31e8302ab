/* src/tokenizer/utf8.c - strict UTF-8 decoding and the code point class
 * lookup of the pre-tokenizer (unicode.h). */
#include "tokenizer/unicode.h"

slapo__uc_class slapo__uc_class_of(uint32_t cp) {
  if (cp < 128) return (slapo__uc_class)slapo__uc_ascii[cp];
  size_t lo = 0, hi = slapo__uc_n_ranges; /* binary search over [lo, hi) */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cp < slapo__uc_ranges[mid].lo)
      hi = mid;
    else if (cp > slapo__uc_ranges[mid].hi)
      lo = mid + 1;
    else
      return (slapo__uc_class)slapo__uc_ranges[mid].cls;
  }
  return SLAPO__UC_OTHER;
}

/* The range the second byte of a sequence led by b must fall in (RFC 3629's
 * table, which rules out overlong forms, surrogates and > U+10FFFF), and the
 * sequence's length; 0 for a byte that cannot lead. */
static int lead(uint8_t b, uint8_t *lo, uint8_t *hi) {
  *lo = 0x80, *hi = 0xbf;
  if (b < 0x80) return 1;
  if (b < 0xc2) return 0;
  if (b < 0xe0) return 2;
  if (b < 0xf0) {
    if (b == 0xe0) *lo = 0xa0;
    if (b == 0xed) *hi = 0x9f;
    return 3;
  }
  if (b < 0xf5) {
    if (b == 0xf0) *lo = 0x90;
    if (b == 0xf4) *hi = 0x8f;
    return 4;
  }
  return 0;
}

/* How many bytes of s[0..n) continue the sequence led by s[0] validly
 * (at most len - 1). */
static int valid_tail(const uint8_t *s, size_t n, int len, uint8_t lo, uint8_t hi) {
  int k = 1;
  for (; k < len && (size_t)k < n; k++) {
    uint8_t b = s[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) break;
  }
  return k - 1;
}

int slapo__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
  uint8_t lo, hi;
  int len = lead(s[0], &lo, &hi);
  if (len == 1) {
    *cp = s[0];
    return 1;
  }
  if (len == 0 || valid_tail(s, n, len, lo, hi) != len - 1) return 0;
  uint32_t v = s[0] & (0x7f >> len);
  for (int k = 1; k < len; k++) v = v << 6 | (s[k] & 0x3f);
  *cp = v;
  return len;
}

int slapo__utf8_incomplete(const uint8_t *s, size_t n) {
  uint8_t lo, hi;
  int len = lead(s[0], &lo, &hi);
  if (len < 2 || n >= (size_t)len) return 0;
  return valid_tail(s, n, len, lo, hi) == (int)n - 1 ? (int)n : 0;
}
