/* dist/agree.c - ranks agreeing on their arguments. An MPI launch can give
 * ranks different command lines (`mpirun -np 1 A : -np 1 B`, wrapper
 * scripts); ranks that then build different models or batches call
 * collectives of different sizes, which corrupts memory or hangs. Before
 * any such collective every rank packs a digest and a short printable form
 * of each value into one record of a fixed size, the world all-gathers the
 * records, and every rank compares them all, so every rank reaches the same
 * verdict and none is left waiting. Layer: dist. */
#include <stdio.h>
#include <string.h>

#include "dist/internal.h"

typedef struct agree_entry {
  uint64_t digest;
  char name[SLAPO_DIST_FIELD_NAME];
  char shown[SLAPO_DIST_FIELD_SHOWN];
} agree_entry;

/* One rank's record: the same size on every rank whatever it was given. */
typedef struct agree_record {
  uint64_t n;
  agree_entry e[SLAPO_DIST_AGREE_MAX];
} agree_record;

static void pack(const slapo_dist_field *fields, int n, agree_record *r) {
  memset(r, 0, sizeof *r); /* no stray bytes: records are compared whole */
  r->n = (uint64_t)n;
  for (int i = 0; i < n; i++) {
    r->e[i].digest = fields[i].digest;
    snprintf(r->e[i].name, sizeof r->e[i].name, "%s", fields[i].name ? fields[i].name : "");
    snprintf(r->e[i].shown, sizeof r->e[i].shown, "%s", fields[i].shown ? fields[i].shown : "");
  }
}

static bool same(const agree_entry *a, const agree_entry *b) {
  return a->digest == b->digest && !strcmp(a->name, b->name);
}

/* Entry i of a record, or NULL past its fields. */
static const agree_entry *entry(const agree_record *r, int i) {
  return (uint64_t)i < r->n ? &r->e[i] : NULL;
}

static slapo_status mismatch(const agree_entry *a, const agree_entry *b, int rank) {
  const char *name = a ? a->name : b->name;
  if (!a || !b || strcmp(a->name, b->name))
    return slapo_error(SLAPO_INVALID_ARG,
                       "the ranks were started with different commands or arguments: rank 0 "
                       "checks %s, rank %d %s%s (every rank must run the same command with "
                       "the same arguments)",
                       a ? a->name : "nothing more", rank, b ? "checks " : "checks nothing more",
                       b ? b->name : "");
  /* The printable forms may agree where the values do not (a file's
   * content, a number beyond the digits shown): then the digests tell. */
  char da[40] = "", db[40] = "";
  if (!strcmp(a->shown, b->shown)) {
    snprintf(da, sizeof da, " (digest %016llx)", (unsigned long long)a->digest);
    snprintf(db, sizeof db, " (digest %016llx)", (unsigned long long)b->digest);
  }
  return slapo_error(SLAPO_INVALID_ARG,
                     "the ranks were started with different arguments: %s: rank 0 has %s%s, "
                     "rank %d has %s%s (every rank must be given the same %s; README.md, "
                     "\"What may differ between ranks\")",
                     name, a->shown, da, rank, b->shown, db, name);
}

/* The first field, in order, on which some rank differs from rank 0. */
static slapo_status compare(const agree_record *all, int size) {
  uint64_t most = 0;
  for (int r = 0; r < size; r++) most = all[r].n > most ? all[r].n : most;
  for (int i = 0; (uint64_t)i < most; i++)
    for (int r = 1; r < size; r++) {
      const agree_entry *a = entry(&all[0], i), *b = entry(&all[r], i);
      if (!a || !b || !same(a, b)) return mismatch(a, b, r);
    }
  return SLAPO_OK;
}

slapo_status slapo_dist_agree(const slapo_dist_field *fields, int n) {
  if (n < 0 || n > SLAPO_DIST_AGREE_MAX)
    return slapo_error(SLAPO_LIMIT, "dist_agree: %d fields (at most %d)", n,
                       SLAPO_DIST_AGREE_MAX);
  if (n > 0) SLAPO_NEED(fields, "dist_agree");
  int size = slapo_dist_size(SLAPO_GROUP_WORLD);
  if (!slapo_dist_active() || size == 1) return SLAPO_OK;
  agree_record *all = slapo_calloc((size_t)size + 1, sizeof *all);
  if (!all) return slapo_error(SLAPO_NOMEM, "dist_agree: out of memory for %d records", size);
  agree_record *mine = &all[size];
  pack(fields, n, mine);
  slapo_status s = slapo_dist_all_gather_bytes(SLAPO_GROUP_WORLD, mine, all, sizeof *mine);
  if (s == SLAPO_OK) s = compare(all, size);
  slapo_free(all);
  return s;
}
