/* cli/agree.c - the fields ranks must share, as slapo_dist_agree compares
 * them: a 64-bit digest (XXH3) of each whole value and a short printable
 * form for the message. Which options are fields is each command's choice
 * (README "What may differ between ranks"). Layer: cli. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/common.h"

/* The next field, or NULL when the record is full (a programming error the
 * fixed record size makes visible: the field is left out on every rank). */
static slapo_dist_field *next(cli_fields *a, const char *name) {
  if (a->n == SLAPO_DIST_AGREE_MAX) return NULL;
  slapo_dist_field *f = &a->f[a->n];
  f->name = name;
  f->shown = a->shown[a->n];
  a->n++;
  return f;
}

/* A path's printable form: its tail when it is long (the file name tells
 * more than the directories). */
static void show_path(char *dst, const char *path) {
  size_t n = strlen(path), cap = SLAPO_DIST_FIELD_SHOWN;
  if (n < cap) snprintf(dst, cap, "%s", path);
  else snprintf(dst, cap, "...%s", path + n - (cap - 4));
}

void cli_fields_digest(cli_fields *a, const char *name, const char *shown, uint64_t digest) {
  slapo_dist_field *f = next(a, name);
  if (!f) return;
  snprintf(a->shown[a->n - 1], SLAPO_DIST_FIELD_SHOWN, "%s", shown);
  f->digest = digest;
}

void cli_fields_i64(cli_fields *a, const char *name, int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", (long long)v);
  cli_fields_digest(a, name, buf, slapo_hash64(&v, sizeof v, 0));
}

void cli_fields_f64(cli_fields *a, const char *name, double v) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.9g", v); /* the digest tells values %.9g rounds alike apart */
  cli_fields_digest(a, name, buf, slapo_hash64(&v, sizeof v, 0));
}

void cli_fields_str(cli_fields *a, const char *name, const char *s) {
  cli_fields_digest(a, name, s ? s : "(none)", s ? slapo_hash_str(s) : 0);
}

/* XXH3 chained over 1 MiB chunks of the file at path into *h: 0 or errno. */
static int file_digest(const char *path, uint64_t *h) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno ? errno : EIO;
  enum { CHUNK = 1 << 20 };
  unsigned char *buf = malloc(CHUNK);
  if (!buf) {
    fclose(f);
    return ENOMEM;
  }
  size_t k;
  *h = 0;
  while ((k = fread(buf, 1, CHUNK, f)) > 0) *h = slapo_hash_combine(*h, slapo_hash64(buf, k, 0));
  int err = ferror(f) ? EIO : 0;
  free(buf);
  fclose(f);
  return err;
}

void cli_fields_file(cli_fields *a, const char *name, const char *path) {
  if (!path) {
    cli_fields_str(a, name, NULL);
    return;
  }
  char shown[SLAPO_DIST_FIELD_SHOWN];
  show_path(shown, path);
  uint64_t h = 0;
  int err = file_digest(path, &h);
  /* A file one rank cannot read is a difference too (the load would fail
   * there alone); every rank unable to read it agrees, and the command then
   * says why. */
  if (err) h = slapo_hash_combine(slapo_hash_str("unreadable"), (uint64_t)err);
  cli_fields_digest(a, name, shown, h);
}

void cli_fields_file_size(cli_fields *a, const char *name, const char *path) {
  if (!path) {
    cli_fields_str(a, name, NULL);
    return;
  }
  char shown[SLAPO_DIST_FIELD_SHOWN];
  show_path(shown, path);
  struct stat st;
  int64_t size = stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
  cli_fields_digest(a, name, shown, slapo_hash_combine(slapo_hash_str(path), (uint64_t)size));
}
