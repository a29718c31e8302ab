/* compiler/cc_digest.c - the digest stored beside each cached object
 * (<object>.xxh3: "xxh3-64 <16 hex digits> <size in bytes>"), so that a
 * corrupt or truncated object (a full disk, a crash, a bad copy of the
 * cache) is found before it is loaded and recompiled instead. XXH3 catches
 * accidents, not attackers: those are kept out by the cache's ownership
 * and permissions (cc_cache.c). The digest file is written atomically
 * (core/atomic_file.c). Layer: compiler. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/internal.h"

#define DIGEST_LINE_MAX 64

/* The digest line of the open file's whole content into line
 * [DIGEST_LINE_MAX]. Read through the descriptor: the bytes hashed are the
 * bytes the loader will map. */
static slapo_status digest_line(const char *path, int fd, char *line) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return slapo_error(SLAPO_IO, "cc: cannot inspect %s: %s", path, strerror(errno));
  size_t n = (size_t)st.st_size, got = 0;
  unsigned char *buf = slapo_malloc(n);
  if (!buf) return slapo_error(SLAPO_NOMEM, "cc: %s: out of memory for its digest", path);
  while (got < n) {
    ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  uint64_t h = slapo_hash64(buf, got, 0);
  slapo_free(buf);
  if (got != n)
    return slapo_error(SLAPO_IO, "cc: cannot read %s: %zu of %zu bytes", path, got, n);
  snprintf(line, DIGEST_LINE_MAX, "xxh3-64 %016llx %llu\n", (unsigned long long)h,
           (unsigned long long)n);
  return SLAPO_OK;
}

static void digest_path(const char *path, char *out, size_t cap) {
  snprintf(out, cap, "%s.xxh3", path);
}

/* The stored digest line into line [DIGEST_LINE_MAX]; "" when there is
 * none. The digest file is held to the object's trust rules. */
static slapo_status stored_line(const char *dpath, char *line) {
  int fd;
  line[0] = '\0';
  SLAPO_TRY(slapo__cc_cache_open(dpath, &fd));
  if (fd < 0) return SLAPO_OK;
  ssize_t r = read(fd, line, DIGEST_LINE_MAX - 1);
  close(fd);
  line[r > 0 ? r : 0] = '\0';
  return SLAPO_OK;
}

slapo_status slapo__cc_digest_check(const char *path, int fd, bool *match) {
  char dpath[PATH_MAX], want[DIGEST_LINE_MAX], have[DIGEST_LINE_MAX];
  digest_path(path, dpath, sizeof dpath);
  SLAPO_TRY(stored_line(dpath, have));
  SLAPO_TRY(digest_line(path, fd, want));
  *match = !strcmp(want, have);
  if (!*match)
    slapo_logf(1, "cc: %s %s its digest %s; recompiling", path,
               have[0] ? "does not match" : "has no digest", dpath);
  return SLAPO_OK;
}

static slapo_status put_line(FILE *fp, const char *tmp, void *ud) {
  const char *line = ud;
  if (fputs(line, fp) == EOF)
    return slapo_error(SLAPO_IO, "cc: writing %s failed: %s", tmp, strerror(errno));
  return SLAPO_OK;
}

slapo_status slapo__cc_digest_write(const char *path, int fd) {
  char dpath[PATH_MAX], line[DIGEST_LINE_MAX];
  digest_path(path, dpath, sizeof dpath);
  SLAPO_TRY(digest_line(path, fd, line));
  return slapo_write_atomic(dpath, "cc", put_line, line);
}
