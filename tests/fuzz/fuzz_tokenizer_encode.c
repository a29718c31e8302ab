/* tests/fuzz/fuzz_tokenizer_encode.c - libFuzzer harness for the encoder:
 * GPT-2's real vocabulary (tests/data/tokenizer/gpt2, or under
 * $SLAPO_TEST_DATA) encodes any bytes, with special tokens allowed or not,
 * to ids in range that decode to exactly the input, and a streamed decode
 * gives the same bytes. Built by `make fuzz` (run from the repository
 * root, as tools/run_fuzz.sh does). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/tokenizer.h"

static slapo_tokenizer *g_tok;

static void free_tok(void) { slapo_tokenizer_free(g_tok); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_tok) {
    const char *d = getenv("SLAPO_TEST_DATA");
    char v[1100], m[1100];
    snprintf(v, sizeof v, "%s/tokenizer/gpt2/encoder.json", d ? d : "tests/data");
    snprintf(m, sizeof m, "%s/tokenizer/gpt2/vocab.bpe", d ? d : "tests/data");
    if (slapo_tokenizer_load_bpe(v, m, &g_tok) != SLAPO_OK) {
      fprintf(stderr, "fuzz_tokenizer_encode: %s\n", slapo_last_error());
      abort();
    }
    atexit(free_tok);
  }
  bool special = size && (data[0] & 1);
  slapo_token_ids ids = {0};
  slapo_bytes back = {0}, streamed = {0};
  slapo_decode_state st = {0};
  if (slapo_tokenizer_encode(g_tok, (const char *)data, size, special, &ids) != SLAPO_OK) abort();
  if (slapo_tokenizer_decode(g_tok, ids.ids, ids.n, &back) != SLAPO_OK) abort();
  if (back.n != size || (size && memcmp(back.data, data, size) != 0)) abort();
  for (size_t i = 0; i < ids.n; i++)
    if (slapo_tokenizer_decode_next(g_tok, ids.ids[i], &st, &streamed) != SLAPO_OK) abort();
  if (slapo_decode_flush(&st, &streamed) != SLAPO_OK) abort();
  if (streamed.n != size || (size && memcmp(streamed.data, data, size) != 0)) abort();
  slapo_token_ids_free(&ids);
  slapo_bytes_free(&back);
  slapo_bytes_free(&streamed);
  return 0;
}
