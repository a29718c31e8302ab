/* core/atomic_file.c - writing a file so that readers never see it half
 * written: a temporary file in the same directory, filled by the caller,
 * flushed to disk, renamed over the target, and the rename made durable. A
 * failed write leaves an existing file untouched. Layer: core. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/assert.h"
#include "slapo/core.h"

/* The directory of path into dir [PATH_MAX]: "." without a '/', "/" for a
 * file in the root. False when the name does not fit. */
static bool parent_dir(const char *path, char *dir) {
  const char *slash = strrchr(path, '/');
  size_t len = !slash || slash == path ? 1 : (size_t)(slash - path);
  if (len >= PATH_MAX) return false;
  memcpy(dir, slash ? path : ".", len);
  dir[len] = '\0';
  return true;
}

/* Makes the rename durable. Best effort: some file systems refuse fsync on
 * directories, and the file's own data is already on disk. No allocation,
 * so an allocation failure cannot be mistaken for an I/O error here. */
static void sync_parent_dir(const char *path) {
  char dir[PATH_MAX];
  if (!parent_dir(path, dir)) return; /* cannot happen: the rename succeeded */
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

/* Runs the writer on the open temporary file, then flushes and closes it. */
static slapo_status fill(FILE *fp, const char *op, const char *tmp, slapo_write_fn write,
                         void *ud) {
  slapo_status s = write(fp, tmp, ud);
  if (s == SLAPO_OK && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
    s = slapo_error(SLAPO_IO, "%s: %s: flush failed: %s", op, tmp, strerror(errno));
  if (fclose(fp) != 0 && s == SLAPO_OK)
    s = slapo_error(SLAPO_IO, "%s: %s: close failed: %s", op, tmp, strerror(errno));
  return s;
}

static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
         : S_ISFIFO(m)                                          ? "a FIFO"
         : S_ISSOCK(m)                                          ? "a socket"
                                                                : "not a regular file";
}

/* Only `path` itself: the directory's writability shows when mkstemp runs. */
static slapo_status check_target(const char *path, const char *op) {
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return slapo_error(SLAPO_IO, "%s: %s is %s; give the path of a file to write", op, path,
                       kind_of(st.st_mode));
  return SLAPO_OK;
}

slapo_status slapo_check_write_target(const char *path, const char *op) {
  if (!path || !path[0]) return slapo_error(SLAPO_INVALID_ARG, "%s: path is empty", op);
  SLAPO_TRY(check_target(path, op));
  char dir[PATH_MAX];
  if (!parent_dir(path, dir))
    return slapo_error(SLAPO_IO, "%s: %s: the directory's name is too long", op, path);
  /* access(W_OK) passes a writable regular file: a path under a file
   * (afile/ckpt) would otherwise fail only when mkstemp runs, after the
   * work. */
  struct stat st;
  if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
    return slapo_error(SLAPO_IO, "%s: cannot write %s: %s is %s, not a directory (%s)", op,
                       path, dir, S_ISREG(st.st_mode) ? "a regular file" : kind_of(st.st_mode),
                       strerror(ENOTDIR));
  if (access(dir, W_OK) != 0)
    return slapo_error(SLAPO_IO, "%s: cannot write %s: directory %s: %s", op, path, dir,
                       strerror(errno));
  return SLAPO_OK;
}

slapo_status slapo_write_atomic(const char *path, const char *op, slapo_write_fn write,
                                void *ud) {
  if (!path || !path[0]) return slapo_error(SLAPO_INVALID_ARG, "%s: path is empty", op);
  SLAPO_TRY(check_target(path, op));
  size_t plen = strlen(path);
  char *tmp = slapo_malloc(plen + sizeof ".tmp-XXXXXX");
  if (!tmp) return slapo_error(SLAPO_NOMEM, "%s: %s: out of memory", op, path);
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp-XXXXXX", sizeof ".tmp-XXXXXX");
  slapo_status s = SLAPO_OK;
  int fd = mkstemp(tmp);
  FILE *fp = NULL;
  if (fd < 0) {
    s = slapo_error(SLAPO_IO, "%s: %s: cannot create a temporary file: %s", op, path,
                    strerror(errno));
    slapo_free(tmp);
    return s;
  }
  /* mkstemp creates 0600; these are ordinary readable files. */
  if (fchmod(fd, 0644) != 0 || !(fp = fdopen(fd, "wb"))) {
    s = slapo_error(SLAPO_IO, "%s: %s: cannot open the temporary file: %s", op, tmp,
                    strerror(errno));
    close(fd);
  }
  if (s == SLAPO_OK) s = fill(fp, op, tmp, write, ud);
  if (s == SLAPO_OK && rename(tmp, path) != 0)
    s = slapo_error(SLAPO_IO, "%s: %s: cannot rename %s over it: %s", op, path, tmp,
                    strerror(errno));
  if (s == SLAPO_OK) sync_parent_dir(path);
  else unlink(tmp);
  slapo_free(tmp);
  return s;
}
