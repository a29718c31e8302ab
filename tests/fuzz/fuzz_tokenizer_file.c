/* tests/fuzz/fuzz_tokenizer_file.c - libFuzzer harness for the tokenizer
 * file loader (tokenizer.json): any file is refused with a status or
 * loaded, and a loaded tokenizer encodes a fixed text (and the input
 * itself) to ids that decode to exactly those bytes. Built by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/tokenizer.h"

static char g_path[1100];

static void remove_input(void) { unlink(g_path); }

static void roundtrip(slapo_tokenizer *t, const char *s, size_t n) {
  slapo_token_ids ids = {0};
  slapo_bytes back = {0};
  if (slapo_tokenizer_encode(t, s, n, true, &ids) == SLAPO_OK &&
      slapo_tokenizer_decode(t, ids.ids, ids.n, &back) == SLAPO_OK &&
      (back.n != n || (n && memcmp(back.data, s, n) != 0))) {
    fprintf(stderr, "round trip of %zu bytes gave %zu bytes back\n", n, back.n);
    abort();
  }
  slapo_token_ids_free(&ids);
  slapo_bytes_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_path[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/slapo-fuzz-tok-%d.json", tmp && tmp[0] ? tmp : "/tmp",
             (int)getpid());
    atexit(remove_input);
  }
  FILE *f = fopen(g_path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  slapo_tokenizer *t = NULL;
  if (slapo_tokenizer_load(g_path, &t) != SLAPO_OK) {
    if (t) abort(); /* refused: nothing returned */
    return 0;
  }
  static const char text[] = "Hello, world! It's 2026 \xe2\x80\x94 caf\xc3\xa9 \xff\n\n  x";
  roundtrip(t, text, sizeof text - 1);
  roundtrip(t, (const char *)data, size);
  slapo_tokenizer_free(t);
  return 0;
}
