/* tests/fuzz/fuzz_safetensors.c - libFuzzer harness for the safetensors
 * reader: any file either is rejected with a status or is accepted, and then
 * every tensor it lists reads back (meta and data) with the byte size its
 * header promised; the header's metadata reads too. The header-only reader
 * must accept and refuse exactly the same files. Built by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/tensor.h"

static char g_path[1100];

/* The input file is rewritten for every input and removed at exit, so a
 * fuzzing run leaves nothing in the temporary directory. */
static void remove_input(void) { unlink(g_path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_path[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/slapo-fuzz-st-%d.safetensors", tmp && tmp[0] ? tmp : "/tmp",
             (int)getpid());
    atexit(remove_input);
  }
  FILE *f = fopen(g_path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  /* The header-only reader accepts exactly the files the full one does. */
  slapo_safetensors *st = NULL, *hdr = NULL;
  slapo_status full = slapo_safetensors_read(g_path, &st);
  slapo_status head = slapo_safetensors_read_header(g_path, &hdr);
  if (full != head && full != SLAPO_NOMEM && head != SLAPO_NOMEM) {
    fprintf(stderr, "whole read %s, header-only read %s\n", slapo_status_name(full),
            slapo_status_name(head));
    abort();
  }
  if (hdr && st && slapo_safetensors_count(hdr) != slapo_safetensors_count(st)) abort();
  slapo_safetensors_free(hdr);
  if (full == SLAPO_OK) {
    int n = slapo_safetensors_count(st);
    for (int i = 0; i < n; i++) {
      const char *name = slapo_safetensors_name(st, i);
      slapo_tensor *meta = NULL, *t = NULL;
      if (slapo_safetensors_meta(st, name, &meta) != SLAPO_OK) {
        fprintf(stderr, "accepted file: tensor '%s' has no meta: %s\n", name, slapo_last_error());
        abort();
      }
      if (slapo_safetensors_get(st, name, &t) != SLAPO_OK) {
        fprintf(stderr, "accepted file: tensor '%s' does not read: %s\n", name, slapo_last_error());
        abort();
      }
      if (slapo_tensor_nbytes(t) != slapo_tensor_nbytes(meta)) abort();
      slapo_tensor_free(meta);
      slapo_tensor_free(t);
    }
    (void)slapo_safetensors_metadata(st, "format");
    slapo_safetensors_free(st);
  }
  return 0;
}
