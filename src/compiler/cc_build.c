/* compiler/cc_build.c - compiling generated kernels with the system C
 * compiler into a cache, and loading them.
 *
 * The cache key hashes the source, the compiler's identity (its --version
 * line), and the flags, which name the target ISA explicitly: the level the
 * run-time dispatcher chose, capped by SLAPO_MAX_ISA like every kernel
 * (never -march=native), so an object built on an AVX-512 machine is never
 * loaded on an AVX2 one, and a different cap misses the cache. Kernels take
 * element counts as arguments, so a new batch size reuses the object. The
 * object is written to a temporary file in the cache directory and renamed
 * into place, so concurrent processes filling the cache never see a partial
 * file; a hit compiles nothing. The cache is trusted only when nobody else
 * can write it, objects are loaded through the descriptor that was checked
 * (cc_cache.c), and one that does not match its digest (cc_digest.c) is
 * compiled again. SLAPO_CC names the compiler (default cc);
 * SLAPO_DEBUG=4 logs the generated source. Layer: compiler. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compiler/internal.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static slapo_cc_stats g_stats;

slapo_cc_stats slapo_cc_stats_get(void) {
  pthread_mutex_lock(&g_lock);
  slapo_cc_stats s = g_stats;
  pthread_mutex_unlock(&g_lock);
  return s;
}

static const char *compiler_cmd(void) {
  const char *cc = getenv("SLAPO_CC");
  return cc && cc[0] ? cc : "cc";
}

/* Flags for the active ISA level: explicit -m options. */
static const char *isa_flags(void) {
  switch (slapo_isa_active()) {
  case SLAPO_ISA_AVX512_BF16: /* generated kernels have no bf16 operands */
  case SLAPO_ISA_AVX512: return "-mavx2 -mfma -mavx512f -mavx512bw -mavx512vl -mavx512dq";
  case SLAPO_ISA_AVX2: return "-mavx2 -mfma";
  default: return "-march=x86-64";
  }
}

/* -fno-trapping-math: no kernel runs with floating-point traps enabled, and
 * without it GCC will not turn a compare-and-select (relu's z <= 0 ? 0 : z,
 * its mask in the backward) into a vector blend, so a region holding one
 * ran scalar: relu + 1 over 3.1M floats took 4.8 ms against 1.75 ms. The
 * arithmetic is unchanged (it allows no reassociation or contraction). */
#define BASE_FLAGS "-std=c99 -O3 -ffp-contract=off -fno-trapping-math -fPIC -shared -fopenmp " \
                   "-fno-math-errno"

/* Runs `cmd` through sh with its stderr joined to its stdout, keeping the
 * first cap - 1 bytes of that output in out (NUL-terminated). A pipe, not
 * a temporary file: a process killed meanwhile (the other ranks of a
 * failing MPI run are) leaves nothing behind. Returns the exit status, 127
 * when the shell could not run the command. */
static int run_capture(const char *cmd, char *out, size_t cap) {
  char full[6100];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  out[0] = '\0';
  FILE *p = popen(full, "r");
  if (!p) return 127;
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  while (fgetc(p) != EOF) {
  } /* the rest, so the command is not cut off by SIGPIPE */
  int st = pclose(p);
  return st == -1 ? 127 : WIFEXITED(st) ? WEXITSTATUS(st) : 126;
}

/* A single-quoted shell word for s. */
static void quote(const char *s, char *buf, size_t cap) {
  size_t n = 0;
  if (cap < 3) return;
  buf[n++] = '\'';
  for (; *s && n + 5 < cap; s++) {
    if (*s == '\'') n += (size_t)snprintf(buf + n, cap - n, "'\\''");
    else buf[n++] = *s;
  }
  buf[n++] = '\'';
  buf[n] = '\0';
}

/* The compiler's first --version line (its identity in the key), once per
 * SLAPO_CC. Nothing is written for it, so a read-only cache of compiled
 * objects still serves hits. */
static slapo_status compiler_identity(char *buf, size_t cap) {
  static char cached[256];
  static char cached_for[256];
  const char *cc = compiler_cmd();
  if (cached[0] && !strcmp(cached_for, cc)) {
    snprintf(buf, cap, "%s", cached);
    return SLAPO_OK;
  }
  char cmd[1300], text[256];
  snprintf(cmd, sizeof cmd, "%s --version", cc);
  int rc = run_capture(cmd, text, sizeof text);
  if (rc != 0)
    return slapo_error(SLAPO_COMPILE, "cc: the compiler '%s' (SLAPO_CC) %s: %s", cc,
                       rc == 127 ? "was not found" : "does not run",
                       text[0] ? text : "(no output)");
  char *nl = strchr(text, '\n');
  if (nl) *nl = '\0';
  snprintf(cached, sizeof cached, "%s", text[0] ? text : cc);
  snprintf(cached_for, sizeof cached_for, "%s", cc);
  snprintf(buf, cap, "%s", cached);
  return SLAPO_OK;
}

static slapo_status write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return slapo_error(SLAPO_IO, "cc: cannot write %s: %s", path, strerror(errno));
  size_t n = strlen(text);
  bool ok = fwrite(text, 1, n, f) == n;
  ok = fclose(f) == 0 && ok;
  return ok ? SLAPO_OK : slapo_error(SLAPO_IO, "cc: writing %s failed", path);
}

/* Opens the freshly compiled tmp, makes it the user's alone (a umask of
 * 002 would leave it group-writable, which the loader refuses), checks it
 * and writes its digest as that of `so`. *fd: owned. */
static slapo_status seal(const char *tmp, const char *so, int *fd) {
  *fd = open(tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (*fd < 0) return slapo_error(SLAPO_IO, "cc: cannot open %s: %s", tmp, strerror(errno));
  slapo_status s = SLAPO_OK;
  if (fchmod(*fd, 0755) != 0)
    s = slapo_error(SLAPO_IO, "cc: cannot chmod %s: %s", tmp, strerror(errno));
  if (s == SLAPO_OK) s = slapo__cc_cache_check_fd(tmp, *fd);
  if (s == SLAPO_OK) s = slapo__cc_digest_write(so, *fd);
  if (s != SLAPO_OK) close(*fd), *fd = -1;
  return s;
}

/* Compiles src into `so` through a temporary object renamed into place,
 * after its digest: a reader sees the old pair, a new digest with the old
 * object (a mismatch: it recompiles), or the new pair. The source reaches
 * the compiler on stdin, so no per-process file name enters the object:
 * processes filling the cache at once write the same bytes. *fd: the new
 * object, open (owned). */
static slapo_status compile_to(const char *dir, const char *key, const char *src, const char *so,
                               int *fd) {
  char c_path[1200], tmp[1200], cmd[6000], qc[1300], qt[1300], msg[4001];
  snprintf(c_path, sizeof c_path, "%s/%s.%d.c", dir, key, (int)getpid());
  snprintf(tmp, sizeof tmp, "%s/%s.%d.so.tmp", dir, key, (int)getpid());
  SLAPO_TRY(write_file(c_path, src));
  quote(c_path, qc, sizeof qc), quote(tmp, qt, sizeof qt);
  snprintf(cmd, sizeof cmd, "%s %s %s -o %s -x c - -lmvec -lm < %s", compiler_cmd(), BASE_FLAGS,
           isa_flags(), qt, qc);
  int rc = run_capture(cmd, msg, sizeof msg);
  slapo_status s = SLAPO_OK;
  if (rc != 0)
    s = slapo_error(SLAPO_COMPILE, "cc: %s failed (exit %d) on %s: %s", compiler_cmd(), rc,
                    c_path, msg[0] ? msg : "(no output)");
  if (s == SLAPO_OK) s = seal(tmp, so, fd);
  if (s == SLAPO_OK && rename(tmp, so) != 0) {
    s = slapo_error(SLAPO_IO, "cc: cannot move %s to %s: %s", tmp, so, strerror(errno));
    close(*fd), *fd = -1;
  }
  if (s == SLAPO_OK) {
    /* The source stays beside its object, for readers of the cache. */
    char kept[1200];
    snprintf(kept, sizeof kept, "%s/%s.c", dir, key);
    rename(c_path, kept);
  }
  if (s != SLAPO_OK) unlink(tmp);
  unlink(c_path);
  return s;
}

/* The cached object `so`, open and matching its digest, in *fd; -1 when
 * it is missing, corrupt or truncated (to be compiled again). */
static slapo_status find_cached(const char *so, int *fd) {
  SLAPO_TRY(slapo__cc_cache_open(so, fd));
  if (*fd < 0) return SLAPO_OK;
  bool match = false;
  slapo_status s = slapo__cc_digest_check(so, *fd, &match);
  if (s != SLAPO_OK || !match) close(*fd), *fd = -1;
  return s;
}

/* The cache key of src: source, compiler identity and flags. */
static void cache_key(const char *src, const char *id, char key[17]) {
  uint64_t h = slapo_hash_str(src);
  h = slapo_hash64(id, strlen(id), h);
  h = slapo_hash64(BASE_FLAGS, strlen(BASE_FLAGS), h);
  h = slapo_hash64(isa_flags(), strlen(isa_flags()), h);
  snprintf(key, 17, "%016llx", (unsigned long long)h);
}

/* Finds (or compiles) the object of src in the trusted cache and loads it
 * through its descriptor. Called under g_lock. */
static slapo_status find_or_compile(const char *src, char key[17], char *so, size_t cap,
                                    void **handle) {
  char raw[1024], dir[1024], id[256];
  slapo_compiler_cache_dir(raw, sizeof raw);
  SLAPO_TRY(compiler_identity(id, sizeof id));
  cache_key(src, id, key);
  SLAPO_TRY(slapo__cc_cache_dir(raw, dir, sizeof dir));
  snprintf(so, cap, "%s/%s-%s.so", dir, key, slapo_isa_name(slapo_isa_active()));
  if ((*handle = slapo__cc_cache_loaded(so))) {
    g_stats.cache_hits++; /* loaded by this process already: nothing read */
    return SLAPO_OK;
  }
  int fd = -1;
  SLAPO_TRY(find_cached(so, &fd));
  if (fd >= 0) {
    g_stats.cache_hits++;
    slapo_logf(2, "cc: kernels %s found in the cache %s", key, dir);
  } else {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    SLAPO_TRY(compile_to(dir, key, src, so, &fd));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    g_stats.compiled++;
    slapo_logf(2, "cc: kernels %s compiled in %.0f ms into %s", key,
               (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
               dir);
  }
  return slapo__cc_cache_load(so, fd, handle);
}

slapo_status slapo__cc_build(const char *src, slapo__cc_fwd_fn *fwd, slapo__cc_bwd_fn *bwd,
                             char key[17]) {
  char so[1200];
  void *h = NULL;
  slapo_logf(4, "cc: generated source:\n%s", src);
  pthread_mutex_lock(&g_lock);
  slapo_status s = find_or_compile(src, key, so, sizeof so, &h);
  pthread_mutex_unlock(&g_lock);
  if (s != SLAPO_OK) return s;
  /* The object stays loaded for the process: its op is registered. */
  *(void **)fwd = dlsym(h, "slapo_cc_fwd");
  *(void **)bwd = dlsym(h, "slapo_cc_bwd");
  if (!*fwd || !*bwd)
    return slapo_error(SLAPO_COMPILE, "cc: %s lacks slapo_cc_fwd / slapo_cc_bwd", so);
  return SLAPO_OK;
}
