/* core/alloc.c - the allocator hook every library allocation goes through,
 * so tests can inject failures and embedders can route memory.
 * Layer: core. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/core.h"

static void *libc_malloc(size_t n, void *ud) { (void)ud; return malloc(n); }
static void *libc_realloc(void *p, size_t n, void *ud) { (void)ud; return realloc(p, n); }
static void libc_free(void *p, void *ud) { (void)ud; free(p); }

static slapo_allocator g_alloc = {libc_malloc, libc_realloc, libc_free, NULL};

void slapo_set_allocator(const slapo_allocator *a) {
  if (a) g_alloc = *a;
  else g_alloc = (slapo_allocator){libc_malloc, libc_realloc, libc_free, NULL};
}

void *slapo_malloc(size_t nbytes) {
  /* malloc(0) may return NULL legitimately; ask for one byte instead so NULL
   * always means failure. */
  return g_alloc.malloc(nbytes ? nbytes : 1, g_alloc.ud);
}

void *slapo_calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = slapo_malloc(n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

void *slapo_realloc(void *ptr, size_t nbytes) {
  return g_alloc.realloc(ptr, nbytes ? nbytes : 1, g_alloc.ud);
}

void slapo_free(void *ptr) {
  if (ptr) g_alloc.free(ptr, g_alloc.ud);
}

char *slapo_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = slapo_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* Aligned blocks store the raw pointer just before the aligned address. */
#define ALIGN 64

void *slapo_aligned_alloc(size_t nbytes) {
  if (nbytes > SIZE_MAX - ALIGN - sizeof(void *)) return NULL;
  char *raw = slapo_malloc(nbytes + ALIGN + sizeof(void *));
  if (!raw) return NULL;
  uintptr_t p = ((uintptr_t)raw + sizeof(void *) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
  ((void **)p)[-1] = raw;
  return (void *)p;
}

void slapo_aligned_free(void *ptr) {
  if (ptr) slapo_free(((void **)ptr)[-1]);
}
