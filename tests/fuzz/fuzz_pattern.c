/* tests/fuzz/fuzz_pattern.c - libFuzzer harness for text patterns
 * (src/pattern/parse.c, print.c): any input either parses or fails with a
 * status (never a crash, hang, leak or unbounded allocation); what parses
 * prints, the printed text parses again and prints the same (the printer's
 * canonical-form promise). Built by `make fuzz` (clang,
 * -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_text.h"
#include "slapo/pattern.h"

static void print_pattern_to(const void *obj, FILE *f) { slapo_pattern_print(obj, f); }

static char *print_pattern(const slapo_pattern *obj) { return fuzz_capture(print_pattern_to, obj); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  if (!text) return 0;
  slapo_pattern *p = NULL;
  if (slapo_pattern_parse(text, &p) == SLAPO_OK) {
    char *once = print_pattern(p);
    slapo_pattern *again = NULL;
    if (slapo_pattern_parse(once, &again) != SLAPO_OK) {
      fprintf(stderr, "printed pattern does not parse: %s\n%s\n", slapo_last_error(), once);
      abort();
    }
    char *twice = print_pattern(again);
    if (strcmp(once, twice) != 0) {
      fprintf(stderr, "print -> parse -> print differs:\n%s\n---\n%s\n", once, twice);
      abort();
    }
    free(once);
    free(twice);
    slapo_pattern_free(again);
  }
  slapo_pattern_free(p);
  free(text);
  return 0;
}
