/* tests/common/failalloc.c - see failalloc.h. Live blocks are counted with a
 * small header so frees of blocks made before install are recognised. */
#include "common/failalloc.h"

#include <stdint.h>
#include <stdlib.h>

#include "slapo/core.h"

#define MAGIC 0x5a5a1234deadbeefULL

typedef struct hdr {
  uint64_t magic;
  uint64_t pad;
} hdr;

static long g_fail_at = -1, g_attempts, g_live;

static void *fa_malloc(size_t n, void *ud) {
  (void)ud;
  long k = g_attempts++;
  if (g_fail_at >= 0 && k >= g_fail_at) return NULL;
  hdr *h = malloc(sizeof(hdr) + n);
  if (!h) return NULL;
  h->magic = MAGIC;
  g_live++;
  return h + 1;
}

static void fa_free(void *p, void *ud) {
  (void)ud;
  if (!p) return;
  hdr *h = (hdr *)p - 1;
  if (h->magic != MAGIC) abort(); /* a block from before install: a test bug */
  h->magic = 0;
  g_live--;
  free(h);
}

static void *fa_realloc(void *p, size_t n, void *ud) {
  if (!p) return fa_malloc(n, ud);
  long k = g_attempts++;
  if (g_fail_at >= 0 && k >= g_fail_at) return NULL;
  hdr *h = (hdr *)p - 1;
  if (h->magic != MAGIC) abort();
  hdr *nh = realloc(h, sizeof(hdr) + n);
  if (!nh) return NULL;
  return nh + 1;
}

void failalloc_install(long fail_at) {
  g_fail_at = fail_at;
  g_attempts = 0;
  g_live = 0;
  slapo_allocator a = {fa_malloc, fa_realloc, fa_free, NULL};
  slapo_set_allocator(&a);
}

void failalloc_uninstall(void) { slapo_set_allocator(NULL); }
long failalloc_live(void) { return g_live; }
long failalloc_attempts(void) { return g_attempts; }
