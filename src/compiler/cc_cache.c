/* compiler/cc_cache.c - whether the kernel cache can be trusted, and
 * loading an object from it without a check-then-load race.
 *
 * Loading a cached object runs its code, and its name (a hash of source,
 * compiler and flags) is easy to compute, so the cache must be writable by
 * nobody but the user, as ssh demands of ~/.ssh: the cache directory is
 * owned by the effective user and not writable by group or others; every
 * directory above it, up to and including $HOME (or up to / for a cache
 * outside the home), is owned by the user or root and not writable by group
 * or others unless sticky (/tmp: nobody can rename or remove what another
 * user made there). The check walks the resolved path (realpath) and the
 * caller then uses that path, so a symbolic link retargeted after the check
 * leads nowhere new. Objects are opened with O_NOFOLLOW, checked through
 * their descriptor (regular, owned by the user, not group/other-writable),
 * and loaded through /proc/self/fd/N: the file checked is the file mapped.
 * Layer: compiler. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/internal.h"

#define HOW_TO_FIX "or set SLAPO_CACHE_DIR to a directory of your own"

/* Creates dir and any missing parents, each 0700: nobody else may list or
 * fill what slapo makes. An existing directory is left as it is (it is
 * checked next). */
static slapo_status make_dirs(const char *dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return slapo_error(SLAPO_IO, "cc: the kernel cache's path is too long: %s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(path, 0700); /* an existing parent is fine; a failure shows below */
    *p = '/';
  }
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return slapo_error(SLAPO_IO, "cc: cannot create the kernel cache %s: %s (SLAPO_CACHE_DIR)",
                       dir, strerror(errno));
  return SLAPO_OK;
}

/* One directory of the cache's path. The cache itself must be the user's;
 * a parent may also be root's, and may be writable by others when sticky. */
static slapo_status check_dir(const char *cache, const char *path, bool is_cache) {
  struct stat st;
  uid_t me = geteuid();
  if (lstat(path, &st) != 0)
    return slapo_error(SLAPO_IO, "cc: refusing the kernel cache %s: cannot inspect %s: %s", cache,
                       path, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return slapo_error(SLAPO_IO, "cc: refusing the kernel cache %s: %s is not a directory",
                       cache, path);
  bool owner_ok = st.st_uid == me || (!is_cache && st.st_uid == 0);
  if (!owner_ok)
    return slapo_error(SLAPO_IO,
                       "cc: refusing the kernel cache %s: %s is owned by uid %u, not by you "
                       "(uid %u)%s; remove it " HOW_TO_FIX,
                       cache, path, (unsigned)st.st_uid, (unsigned)me,
                       is_cache ? "" : " or root");
  bool sticky = !is_cache && (st.st_mode & S_ISVTX);
  if ((st.st_mode & 022) && !sticky)
    return slapo_error(SLAPO_IO,
                       "cc: refusing the kernel cache %s: %s is writable by group or others "
                       "(mode %04o); run chmod go-w %s " HOW_TO_FIX,
                       cache, path, (unsigned)(st.st_mode & 07777), path);
  return SLAPO_OK;
}

/* Where the walk up from the cache stops: the resolved $HOME when the cache
 * lies inside it (as ssh stops at the home directory), else "/". */
static void walk_stop(const char *real, char *stop, size_t cap) {
  const char *home = getenv("HOME");
  char rhome[PATH_MAX];
  snprintf(stop, cap, "/");
  if (!home || !home[0] || !realpath(home, rhome)) return;
  size_t n = strlen(rhome);
  if (n > 1 && !strncmp(real, rhome, n) && (real[n] == '/' || real[n] == '\0'))
    snprintf(stop, cap, "%s", rhome);
}

/* Checks real (resolved) and its parents up to stop. */
static slapo_status check_chain(const char *real) {
  char stop[PATH_MAX], path[PATH_MAX];
  walk_stop(real, stop, sizeof stop);
  snprintf(path, sizeof path, "%s", real);
  SLAPO_TRY(check_dir(real, path, true));
  while (strcmp(path, stop) != 0 && strcmp(path, "/") != 0) {
    char *slash = strrchr(path, '/');
    if (slash == path) slash[1] = '\0';
    else *slash = '\0';
    SLAPO_TRY(check_dir(real, path, false));
  }
  return SLAPO_OK;
}

slapo_status slapo__cc_cache_dir(const char *dir, char *real, size_t cap) {
  struct stat st;
  if (stat(dir, &st) != 0) SLAPO_TRY(make_dirs(dir));
  char rp[PATH_MAX];
  if (!realpath(dir, rp))
    return slapo_error(SLAPO_IO, "cc: cannot resolve the kernel cache %s: %s", dir,
                       strerror(errno));
  if (strlen(rp) >= cap)
    return slapo_error(SLAPO_IO, "cc: the kernel cache's path is too long: %s", rp);
  SLAPO_TRY(check_chain(rp));
  snprintf(real, cap, "%s", rp);
  return SLAPO_OK;
}

slapo_status slapo__cc_cache_check_fd(const char *path, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return slapo_error(SLAPO_IO, "cc: cannot inspect %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return slapo_error(SLAPO_IO, "cc: refusing %s: not a regular file; remove it", path);
  if (st.st_uid != geteuid())
    return slapo_error(SLAPO_IO,
                       "cc: refusing %s: owned by uid %u, not by you (uid %u); remove it",
                       path, (unsigned)st.st_uid, (unsigned)geteuid());
  if (st.st_mode & 022)
    return slapo_error(SLAPO_IO,
                       "cc: refusing %s: writable by group or others (mode %04o); remove it",
                       path, (unsigned)(st.st_mode & 07777));
  return SLAPO_OK;
}

slapo_status slapo__cc_cache_open(const char *path, int *fd) {
  *fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (*fd < 0 && errno == ENOENT) return SLAPO_OK;
  if (*fd < 0 && errno == ELOOP)
    return slapo_error(SLAPO_IO, "cc: refusing %s: a symbolic link, not followed; remove it",
                       path);
  if (*fd < 0) return slapo_error(SLAPO_IO, "cc: cannot open %s: %s", path, strerror(errno));
  slapo_status s = slapo__cc_cache_check_fd(path, *fd);
  if (s != SLAPO_OK) {
    close(*fd);
    *fd = -1;
  }
  return s;
}

/* The descriptor's name under /proc, checked to be that same file: without
 * /proc mounted there is no way to load exactly what was checked. */
static slapo_status proc_name(const char *path, int fd, char *name, size_t cap) {
  struct stat a, b;
  snprintf(name, cap, "/proc/self/fd/%d", fd);
  if (fstat(fd, &a) != 0 || stat(name, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)
    return slapo_error(SLAPO_IO,
                       "cc: cannot load %s safely: %s does not name the verified file (is /proc "
                       "mounted?); the cc backend loads kernels only through /proc/self/fd",
                       path, name);
  return SLAPO_OK;
}

/* Objects loaded by this process, by cache path. The loader knows an
 * object by the name it was opened under (/proc/self/fd/N) and returns a
 * loaded one for a matching name without opening the file, so a
 * descriptor stays open while its object is loaded (for the process) and
 * its number is never reused; a second load of the same path is served
 * from here, with no second descriptor. Callers serialize (cc_build.c's
 * lock). Reachable from g_loaded until exit, like the objects. */
typedef struct loaded {
  struct loaded *next;
  void *handle;
  char path[];
} loaded;
static loaded *g_loaded;

void *slapo__cc_cache_loaded(const char *path) {
  for (loaded *l = g_loaded; l; l = l->next)
    if (!strcmp(l->path, path)) return l->handle;
  return NULL;
}

static slapo_status remember(const char *path, void *handle) {
  size_t n = strlen(path) + 1;
  loaded *l = slapo_malloc(sizeof *l + n);
  if (!l) return slapo_error(SLAPO_NOMEM, "cc: out of memory loading %s", path);
  l->handle = handle;
  memcpy(l->path, path, n);
  l->next = g_loaded;
  g_loaded = l;
  return SLAPO_OK;
}

slapo_status slapo__cc_cache_load(const char *path, int fd, void **handle) {
  char name[64];
  slapo_status s = proc_name(path, fd, name, sizeof name);
  if (s == SLAPO_OK && !(*handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)))
    s = slapo_error(SLAPO_COMPILE, "cc: cannot load %s: %s", path, dlerror());
  if (s != SLAPO_OK) {
    close(fd);
    return s;
  }
  /* Not remembered (out of memory): the descriptor stays open all the
   * same, and a later call loads the path again under another name. */
  return remember(path, *handle);
}
