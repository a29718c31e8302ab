/* core/map.c - string -> pointer hash map with insertion-order iteration:
 * a dense entry array (order) plus an open-addressing index (lookup).
 * Layer: core. */
#include <string.h>

#include "slapo/core.h"

typedef struct entry {
  char *key;
  void *value;
  uint64_t hash;
} entry;

struct slapo_map {
  entry *entries; /* dense, insertion order */
  size_t count, cap;
  int64_t *index; /* slot -> entry index, -1 empty */
  size_t nslots;  /* power of two, >= 2 * cap */
};

slapo_status slapo_map_new(slapo_map **out) {
  *out = NULL;
  slapo_map *m = slapo_calloc(1, sizeof *m);
  if (!m) return slapo_error(SLAPO_NOMEM, "map: out of memory");
  *out = m;
  return SLAPO_OK;
}

void slapo_map_free(slapo_map *m) {
  if (!m) return;
  for (size_t i = 0; i < m->count; i++) slapo_free(m->entries[i].key);
  slapo_free(m->entries);
  slapo_free(m->index);
  slapo_free(m);
}

/* Slot holding `key`, or the empty slot where it would go. */
static size_t find_slot(const slapo_map *m, const char *key, uint64_t h) {
  size_t mask = m->nslots - 1, s = (size_t)h & mask;
  for (;;) {
    int64_t e = m->index[s];
    if (e < 0) return s;
    if (m->entries[e].hash == h && !strcmp(m->entries[e].key, key)) return s;
    s = (s + 1) & mask;
  }
}

static slapo_status rebuild_index(slapo_map *m, size_t nslots) {
  int64_t *idx = slapo_malloc(nslots * sizeof *idx);
  if (!idx) return slapo_error(SLAPO_NOMEM, "map: out of memory");
  memset(idx, 0xff, nslots * sizeof *idx);
  slapo_free(m->index);
  m->index = idx;
  m->nslots = nslots;
  for (size_t i = 0; i < m->count; i++) {
    size_t s = find_slot(m, m->entries[i].key, m->entries[i].hash);
    m->index[s] = (int64_t)i;
  }
  return SLAPO_OK;
}

slapo_status slapo_map_set(slapo_map *m, const char *key, void *value) {
  uint64_t h = slapo_hash_str(key);
  if (m->nslots) {
    size_t s = find_slot(m, key, h);
    if (m->index[s] >= 0) {
      m->entries[m->index[s]].value = value;
      return SLAPO_OK;
    }
  }
  if (m->count == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 8;
    entry *e = slapo_realloc(m->entries, cap * sizeof *e);
    if (!e) return slapo_error(SLAPO_NOMEM, "map: out of memory");
    m->entries = e;
    m->cap = cap;
  }
  if (m->nslots < 2 * m->cap) {
    slapo_status st = rebuild_index(m, 2 * m->cap);
    if (st) return st;
  }
  char *k = slapo_strdup(key);
  if (!k) return slapo_error(SLAPO_NOMEM, "map: out of memory");
  size_t s = find_slot(m, key, h);
  m->entries[m->count] = (entry){k, value, h};
  m->index[s] = (int64_t)m->count++;
  return SLAPO_OK;
}

void *slapo_map_get(const slapo_map *m, const char *key) {
  if (!m->count) return NULL;
  size_t s = find_slot(m, key, slapo_hash_str(key));
  return m->index[s] >= 0 ? m->entries[m->index[s]].value : NULL;
}

bool slapo_map_has(const slapo_map *m, const char *key) {
  if (!m->count) return false;
  return m->index[find_slot(m, key, slapo_hash_str(key))] >= 0;
}

bool slapo_map_remove(slapo_map *m, const char *key) {
  if (!m->count) return false;
  size_t s = find_slot(m, key, slapo_hash_str(key));
  int64_t e = m->index[s];
  if (e < 0) return false;
  slapo_free(m->entries[e].key);
  memmove(m->entries + e, m->entries + e + 1, (m->count - (size_t)e - 1) * sizeof *m->entries);
  m->count--;
  /* Rebuilding in place cannot fail: reuse the existing slot array. */
  memset(m->index, 0xff, m->nslots * sizeof *m->index);
  for (size_t i = 0; i < m->count; i++)
    m->index[find_slot(m, m->entries[i].key, m->entries[i].hash)] = (int64_t)i;
  return true;
}

size_t slapo_map_count(const slapo_map *m) { return m->count; }
const char *slapo_map_key_at(const slapo_map *m, size_t i) { return m->entries[i].key; }
void *slapo_map_value_at(const slapo_map *m, size_t i) { return m->entries[i].value; }
