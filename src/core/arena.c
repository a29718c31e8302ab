/* core/arena.c - growable arenas: bump allocation in a chain of blocks,
 * freed all at once. Blocks double in size; an oversized request gets a block
 * of its own. Layer: core. */
#include <stdio.h>
#include <string.h>

#include "slapo/core.h"

typedef struct block {
  struct block *next;
  size_t cap;  /* usable bytes after the header */
  size_t used;
  max_align_t data[]; /* the header is padded so data starts max-aligned */
} block;

struct slapo_arena {
  block *head;       /* current block (most recent) */
  block *first;      /* kept across reset */
  size_t next_cap;
  size_t used_total;
};

static block *block_new(size_t cap) {
  block *b = slapo_malloc(sizeof(block) + cap);
  if (!b) return NULL;
  b->next = NULL;
  b->cap = cap;
  b->used = 0;
  return b;
}

slapo_status slapo_arena_new(size_t block_nbytes, slapo_arena **out) {
  *out = NULL;
  slapo_arena *a = slapo_malloc(sizeof *a);
  if (!a) return slapo_error(SLAPO_NOMEM, "arena: out of memory");
  a->next_cap = block_nbytes ? block_nbytes : 4096;
  a->first = a->head = block_new(a->next_cap);
  if (!a->first) {
    slapo_free(a);
    return slapo_error(SLAPO_NOMEM, "arena: out of memory for a %zu-byte block", block_nbytes);
  }
  a->used_total = 0;
  *out = a;
  return SLAPO_OK;
}

static void free_chain(block *b, block *stop) {
  while (b && b != stop) {
    block *n = b->next;
    slapo_free(b);
    b = n;
  }
}

void slapo_arena_free(slapo_arena *a) {
  if (!a) return;
  free_chain(a->head, NULL);
  slapo_free(a);
}

void slapo_arena_reset(slapo_arena *a) {
  free_chain(a->head, a->first);
  a->first->next = NULL;
  a->first->used = 0;
  a->head = a->first;
  a->used_total = 0;
  /* Blocks double from the first one's size again: kept across resets, the
   * doubling went on use after use (a schedule file resets per line, and
   * ~20 lines that each spilled past the first block asked for 2 GB). */
  a->next_cap = a->first->cap;
}

void *slapo_arena_alloc(slapo_arena *a, size_t nbytes, size_t align) {
  if (!align) align = 16;
  if (align & (align - 1) || align > 4096) {
    slapo_error(SLAPO_INVALID_ARG, "arena: alignment %zu is not a power of two <= 4096", align);
    return NULL;
  }
  block *b = a->head;
  uintptr_t base = (uintptr_t)b->data;
  size_t off = ((base + b->used + align - 1) & ~(uintptr_t)(align - 1)) - base;
  if (off + nbytes > b->cap) {
    /* New block: large enough for this request with worst-case padding. */
    size_t cap = a->next_cap * 2;
    if (cap < nbytes + align) cap = nbytes + align;
    block *nb = block_new(cap);
    if (!nb) {
      slapo_error(SLAPO_NOMEM, "arena: out of memory allocating %zu bytes", nbytes);
      return NULL;
    }
    a->next_cap = cap;
    nb->next = a->head;
    a->head = b = nb;
    base = (uintptr_t)b->data;
    off = ((base + align - 1) & ~(uintptr_t)(align - 1)) - base;
  }
  void *p = (char *)b->data + off;
  memset(p, 0, nbytes);
  b->used = off + nbytes;
  a->used_total += nbytes;
  return p;
}

char *slapo_arena_strdup(slapo_arena *a, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = slapo_arena_alloc(a, n, 1);
  if (d) memcpy(d, s, n);
  return d;
}

char *slapo_arena_printf(slapo_arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *d = n < 0 ? NULL : slapo_arena_alloc(a, (size_t)n + 1, 1);
  if (d) vsnprintf(d, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return d;
}

size_t slapo_arena_used(const slapo_arena *a) { return a->used_total; }
