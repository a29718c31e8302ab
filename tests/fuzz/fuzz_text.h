/* tests/fuzz/fuzz_text.h - what the text-format harnesses share: the input
 * as a NUL-terminated string, and a printer's output captured as one
 * (header only: each harness is its own executable). */
#ifndef SLAPO_FUZZ_TEXT_H
#define SLAPO_FUZZ_TEXT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* data [size] copied and NUL-terminated (malloc'ed), or NULL. */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return NULL;
  memcpy(text, data, size);
  text[size] = '\0';
  return text;
}

/* What print(obj, f) writes, as a malloc'ed string; aborts if it cannot. */
static inline char *fuzz_capture(void (*print)(const void *obj, FILE *f), const void *obj) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) abort();
  print(obj, f);
  fclose(f);
  return buf;
}

#endif
