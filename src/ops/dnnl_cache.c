/* ops/dnnl_cache.c - the oneDNN engine and stream, and the primitive cache
 * of ops/dnnl_cache.h. Layer: ops. */
#include "slapo/ops/dnnl_cache.h"

#include <string.h>

#include "ops/internal.h"

/* ---- one engine and stream for the process, created on first use ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

static void init_engine(void) {
  dnnl_engine_t eng;
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) return;
  if (dnnl_stream_create(&g_stream, eng, dnnl_stream_default_flags) != dnnl_success) {
    g_stream = NULL;
    dnnl_engine_destroy(eng);
    return;
  }
  g_engine = eng;
}

dnnl_engine_t slapo__dnnl_engine(void) {
  pthread_once(&g_once, init_engine);
  return g_engine;
}

dnnl_stream_t slapo__dnnl_stream(void) {
  pthread_once(&g_once, init_engine);
  return g_stream;
}

/* ---- entries ---- */

void slapo__dnnl_entry_destroy(slapo__dnnl_entry *e) {
  for (int i = 0; i < SLAPO__DNNL_MAX_MEM; i++)
    if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
  if (e->prim) dnnl_primitive_destroy(e->prim);
  memset(e, 0, sizeof *e);
}

/* ---- the cache ---- */

void slapo__dnnl_cache_init(slapo__dnnl_cache *c, slapo__dnnl_entry *slots, int cap) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, NULL);
  c->slot = slots;
  c->cap = cap;
}

/* Returns a cached idle entry for the key marked busy, or NULL. */
static slapo__dnnl_entry *lookup(slapo__dnnl_cache *c, const void *key, size_t keylen,
                                 uint64_t h) {
  slapo__dnnl_entry *hit = NULL;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n; i++) {
    slapo__dnnl_entry *e = &c->slot[i];
    if (e->hash == h && !e->busy && e->keylen == keylen && !memcmp(e->key, key, keylen)) {
      e->busy = true;
      e->last_use = ++c->clock;
      hit = e;
      break;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return hit;
}

/* Moves a fresh entry into the cache (marked busy) and returns its slot, or
 * NULL when every slot is busy (the caller then uses and destroys it). The
 * evicted primitive is destroyed outside the lock. */
static slapo__dnnl_entry *insert(slapo__dnnl_cache *c, const slapo__dnnl_entry *fresh) {
  slapo__dnnl_entry evicted, *slot = NULL;
  evicted.prim = NULL;
  pthread_mutex_lock(&c->lock);
  if (c->n < c->cap) {
    slot = &c->slot[c->n++];
  } else {
    for (int i = 0; i < c->cap; i++)
      if (!c->slot[i].busy && (!slot || c->slot[i].last_use < slot->last_use)) slot = &c->slot[i];
    if (slot) evicted = *slot;
  }
  if (slot) {
    *slot = *fresh;
    slot->busy = slot->cached = true;
    slot->last_use = ++c->clock;
  }
  pthread_mutex_unlock(&c->lock);
  if (evicted.prim) slapo__dnnl_entry_destroy(&evicted);
  return slot;
}

slapo__dnnl_entry *slapo__dnnl_acquire(slapo__dnnl_cache *c, const void *key, size_t keylen,
                                       slapo__dnnl_create_fn create, const void *ud,
                                       slapo__dnnl_entry *local) {
  SLAPO_ASSERT(keylen <= SLAPO__DNNL_KEY_MAX);
  uint64_t h = slapo_hash64(key, keylen, 0);
  slapo__dnnl_entry *e = lookup(c, key, keylen, h);
  if (e) return e;
  /* Created outside the lock: creation is the slow part, and two callers
   * of one new problem may each create theirs (both end up cached). */
  memset(local, 0, offsetof(slapo__dnnl_entry, key));
  if (!create(local, ud)) {
    slapo__dnnl_entry_destroy(local);
    return NULL;
  }
  local->hash = h;
  local->keylen = keylen;
  memcpy(local->key, key, keylen);
  e = insert(c, local);
  return e ? e : local;
}

void slapo__dnnl_release(slapo__dnnl_cache *c, slapo__dnnl_entry *e) {
  if (!e->cached) {
    slapo__dnnl_entry_destroy(e);
    return;
  }
  pthread_mutex_lock(&c->lock);
  e->busy = false;
  pthread_mutex_unlock(&c->lock);
}

int slapo__dnnl_cache_count(slapo__dnnl_cache *c) {
  pthread_mutex_lock(&c->lock);
  int n = c->n;
  pthread_mutex_unlock(&c->lock);
  return n;
}
