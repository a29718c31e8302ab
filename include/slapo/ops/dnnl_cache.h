/* slapo/ops/dnnl_cache.h - the oneDNN engine and stream every slapo primitive
 * runs on, and the primitive cache shared by the GEMM (ops/gemm_dnnl.c),
 * the convolutions (ops/conv.c) and the dnnl backend's fused matmuls
 * (compiler/dnnl.c). Creating a primitive takes tens of microseconds, so
 * created ones are kept, keyed by the bytes of the user's own problem
 * struct (zeroed before filling). Each user keeps its key struct and its
 * create function; this holds only the mechanics: lookup, insertion with
 * least-recently-used eviction of an idle entry, and release.
 * Thread safety: an entry's memory objects carry per-call data handles, so
 * an entry is used by one caller at a time (its busy flag, under the
 * cache's mutex); a second caller of the same problem gets its own entry.
 * Public (not stable API) because the dnnl compiler backend
 * shares the cache. Layer: ops. */
#ifndef SLAPO_OPS_DNNL_CACHE_H
#define SLAPO_OPS_DNNL_CACHE_H

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The process's CPU engine and stream, created on first call; NULL when
 * oneDNN cannot create them (callers then take their reference path). A
 * CPU stream under the OpenMP runtime executes synchronously and holds no
 * per-call state, so concurrent callers may share it. */
dnnl_engine_t slapo__dnnl_engine(void);
dnnl_stream_t slapo__dnnl_stream(void);

/* Room for the largest key (the GEMM's, 344 bytes) and for the most memory
 * objects of one primitive (a fused matmul: 4 plus one per post-op). */
#define SLAPO__DNNL_KEY_MAX 384
#define SLAPO__DNNL_MAX_MEM 12

typedef struct slapo__dnnl_entry {
  dnnl_primitive_t prim;
  dnnl_memory_t mem[SLAPO__DNNL_MAX_MEM]; /* descriptors only; handles set per call */
  /* Bookkeeping of the cache, not for the user. */
  bool busy;   /* in use by one caller (memory handles) */
  bool cached; /* in a cache slot; else the caller's own, destroyed on release */
  uint64_t hash, last_use;
  size_t keylen;
  unsigned char key[SLAPO__DNNL_KEY_MAX];
} slapo__dnnl_entry;

/* A cache over caller-provided slots. Give it static storage (or storage
 * that lives until exit, like a registered op) so LSan sees the primitives
 * as reachable: cached entries are never freed. */
typedef struct slapo__dnnl_cache {
  pthread_mutex_t lock;
  slapo__dnnl_entry *slot;
  int cap, n;
  uint64_t clock;
} slapo__dnnl_cache;

#define SLAPO__DNNL_CACHE_INIT(slots)                                                         \
  { PTHREAD_MUTEX_INITIALIZER, (slots), (int)(sizeof(slots) / sizeof((slots)[0])), 0, 0 }

/* For a cache inside heap storage. */
void slapo__dnnl_cache_init(slapo__dnnl_cache *c, slapo__dnnl_entry *slots, int cap);

/* Fills e->prim and e->mem (e arrives zeroed) for the problem ud; false
 * when oneDNN refuses (whatever it filled is destroyed). */
typedef bool (*slapo__dnnl_create_fn)(slapo__dnnl_entry *e, const void *ud);

/* An idle cached entry whose key is key[0, keylen), marked busy; else one
 * made by create(e, ud): moved into a free slot, or into the least
 * recently used idle one (its primitive destroyed), or, when every slot is
 * busy, left in *local for this call alone. NULL when create fails. */
slapo__dnnl_entry *slapo__dnnl_acquire(slapo__dnnl_cache *c, const void *key, size_t keylen,
                                       slapo__dnnl_create_fn create, const void *ud,
                                       slapo__dnnl_entry *local);

/* Ends a use of an acquired entry: a cached one goes idle, one in *local
 * is destroyed. */
void slapo__dnnl_release(slapo__dnnl_cache *c, slapo__dnnl_entry *e);

/* Destroys e's primitive and memory objects and zeroes it. */
void slapo__dnnl_entry_destroy(slapo__dnnl_entry *e);

/* Entries cached now (for tests). */
int slapo__dnnl_cache_count(slapo__dnnl_cache *c);

#endif
