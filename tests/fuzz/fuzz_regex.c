/* tests/fuzz/fuzz_regex.c - libFuzzer harness for module regexes
 * (src/pattern/regex.c), structure-aware: each input byte picks one ERE
 * token (atoms, anchors, back-references, glibc's repetitions {,n} {m,}
 * {m,n}, groups, '|'), so the fuzzer explores nesting and repetition
 * instead of spelling syntax. The regex goes through a text pattern,
 * mod('<regex>')(), whose parser compiles it with regcomp after the hazard
 * scan: a regex the scan lets through that takes regcomp seconds is a
 * timeout here (what CI's pattern fuzzer found with {,n}, and a random
 * generator with back-references). Built by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/pattern.h"

static const char *const tokens[] = {
    "a", "b", ".", "[ab]", "[^a]", "\\.", "\\w", "\\b", "\\<", "\\`", "^", "$", "\\1", "\\2",
    "(", "(", "(", ")", ")", ")", "|", "*", "+", "?", "{2}", "{,3}", "{3,}", "{0,5}", "{5,9}",
    "{,}", "{1}", "{20}", "{,40}", "{40,}", "{0}", "{00,7}", "{99}"};
enum { N_TOKENS = sizeof tokens / sizeof *tokens, MAX_TOKENS = 512 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > MAX_TOKENS) return 0;
  char *text = malloc(16 + size * 8);
  if (!text) return 0;
  char *w = stpcpy(text, "mod('");
  for (size_t i = 0; i < size; i++) w = stpcpy(w, tokens[data[i] % N_TOKENS]);
  strcpy(w, "')()");
  slapo_pattern *p = NULL;
  (void)slapo_pattern_parse(text, &p); /* either outcome; only time and memory count */
  slapo_pattern_free(p);
  free(text);
  return 0;
}
