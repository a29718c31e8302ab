/* tests/compiler/test_cc_cache.c - the cc backend's kernel cache trusts
 * only what nobody else can write: directories it creates are 0700; a
 * cache or parent writable by group or others, a symbolic link in place of
 * an object, a loose object, and (as root) a directory or object owned by
 * `nobody` are refused with the path; a corrupt, truncated or undigested
 * object is compiled again, not loaded; without HOME the cache is
 * /tmp/slapo-cache-<uid>; two objects loaded one after the other are each
 * their own (the loader's /proc/self/fd names are never reused); without
 * /proc nothing is loaded. Builds run in child processes, so that nothing
 * this process loaded hides what the cache holds. */
#define _GNU_SOURCE /* unshare, CLONE_NEWNS */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/internal.h"

static char g_cache[256];

static int setup(void **state) {
  (void)state;
  snprintf(g_cache, sizeof g_cache, "/tmp/slapo-test-cccache-XXXXXX");
  return mkdtemp(g_cache) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
  return system(cmd) == 0 ? 0 : -1;
}

/* A kernel whose forward writes `tag` into y[0]: what was loaded shows. */
static void source_of(int tag, char *src, size_t cap) {
  snprintf(src, cap,
           "#include <stdint.h>\n"
           "void slapo_cc_fwd(int64_t N, int64_t C, const float *const *in, float *y,\n"
           "                  const uint64_t *k, uint64_t s, int t) {\n"
           "  (void)N, (void)C, (void)in, (void)k, (void)s, (void)t; y[0] = %d.0f;\n}\n"
           "void slapo_cc_bwd(void) {}\n",
           tag);
}

typedef struct result {
  slapo_status status;
  int compiled, hits;
  float y[2]; /* the tags of the kernels loaded */
  char msg[1024];
  char so[1100]; /* the object's path */
} result;

static void build_one(const char *src, result *r, int k) {
  slapo__cc_fwd_fn f;
  slapo__cc_bwd_fn b;
  char key[17], dir[1024];
  r->status = slapo__cc_build(src, &f, &b, key);
  if (r->status != SLAPO_OK) {
    snprintf(r->msg, sizeof r->msg, "%s", slapo_last_error());
    return;
  }
  f(1, 1, NULL, &r->y[k], NULL, 0, 0);
  slapo_compiler_cache_dir(dir, sizeof dir);
  snprintf(r->so, sizeof r->so, "%s/%s-%s.so", dir, key, slapo_isa_name(slapo_isa_active()));
}

/* Builds the kernels tagged tag0 (and tag1 when >= 0, after it) in a child
 * process. */
static result build2(int tag0, int tag1, bool no_proc) {
  int fds[2];
  result r = {0};
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    char src[512];
    if (no_proc && (unshare(CLONE_NEWNS) != 0 ||
                    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
                    umount2("/proc", MNT_DETACH) != 0))
      _exit(77);
    source_of(tag0, src, sizeof src);
    build_one(src, &r, 0);
    if (r.status == SLAPO_OK && tag1 >= 0) source_of(tag1, src, sizeof src), build_one(src, &r, 1);
    r.compiled = slapo_cc_stats_get().compiled, r.hits = slapo_cc_stats_get().cache_hits;
    _exit(write(fds[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fds[1]);
  int st = 0;
  ssize_t n = read(fds[0], &r, sizeof r);
  close(fds[0]);
  waitpid(pid, &st, 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
    r.status = (slapo_status)-1;
    return r;
  }
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(n, sizeof r);
  return r;
}

static result build(int tag) { return build2(tag, -1, false); }

/* Uses dir (under the test's cache) as the cache; path receives it. */
static void use_cache(const char *sub, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", g_cache, sub);
  setenv("SLAPO_CACHE_DIR", path, 1);
}

static void expect_ok(result r, int tag, int compiled, int hits) {
  if (r.status != SLAPO_OK) print_message("%s\n", r.msg);
  assert_int_equal(r.status, SLAPO_OK);
  assert_true(r.y[0] == (float)tag);
  assert_int_equal(r.compiled, compiled);
  assert_int_equal(r.hits, hits);
}

static void expect_refused(result r, const char *a, const char *b) {
  print_message("%s\n", r.msg);
  assert_int_equal(r.status, SLAPO_IO);
  assert_non_null(strstr(r.msg, a));
  assert_non_null(strstr(r.msg, b));
}

static mode_t mode_of(const char *path) {
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  return st.st_mode & 07777;
}

static void fresh_cache_is_private(void **state) {
  (void)state;
  char dir[400], p[1200];
  use_cache("a/b/c", dir, sizeof dir);
  umask(0);
  expect_ok(build(1), 1, 1, 0);
  umask(022);
  const char *made[] = {"a", "a/b", "a/b/c"}; /* the parents slapo made too */
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", g_cache, made[i]);
    assert_int_equal(mode_of(p), 0700);
  }
  result r = build(1); /* found: nothing compiled */
  expect_ok(r, 1, 0, 1);
  assert_int_equal(mode_of(r.so) & 022, 0); /* made the user's under umask 0 too */
  snprintf(p, sizeof p, "%s.xxh3", r.so);
  FILE *f = fopen(p, "r");
  assert_non_null(f);
  char line[80] = "";
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_int_equal(strncmp(line, "xxh3-64 ", 8), 0);
}

static void loose_permissions_refused(void **state) {
  (void)state;
  char dir[400], parent[400];
  use_cache("loose", dir, sizeof dir);
  result r = build(2);
  expect_ok(r, 2, 1, 0);
  chmod(dir, 0777);
  expect_refused(build(2), dir, "is writable by group or others (mode 0777)");
  chmod(dir, 0770);
  expect_refused(build(2), dir, "(mode 0770); run chmod go-w");
  chmod(dir, 0700);
  chmod(r.so, 0666);
  expect_refused(build(2), r.so, "writable by group or others (mode 0666)");
  chmod(r.so, 0755);
  expect_ok(build(2), 2, 0, 1);
  /* A parent writable by others: refused, naming the parent... */
  snprintf(parent, sizeof parent, "%s/open", g_cache);
  use_cache("open/cache", dir, sizeof dir);
  expect_ok(build(2), 2, 1, 0);
  chmod(parent, 0777);
  result p = build(2);
  expect_refused(p, parent, "is writable by group or others");
  assert_null(strstr(p.msg, "open/cache is")); /* the cache itself is fine */
  /* ...unless sticky, like /tmp: nobody can rename what is ours there. */
  chmod(parent, 01777);
  expect_ok(build(2), 2, 0, 1);
}

/* Replaces path by its content with byte `at` flipped (at >= 0) or cut to
 * half its length (at < 0): a new file, so the old one is left alone. */
static void corrupt(const char *path, long at) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  assert_true(n > 0 && n < sizeof buf);
  if (at >= 0) buf[(size_t)at % n] ^= 0x20;
  else n /= 2;
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.corrupt", path);
  f = fopen(tmp, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
  chmod(tmp, 0755);
  assert_int_equal(rename(tmp, path), 0);
}

static void corrupt_object_recompiled(void **state) {
  (void)state;
  char dir[400], digest[1200];
  use_cache("corrupt", dir, sizeof dir);
  result r = build(3);
  expect_ok(r, 3, 1, 0);
  snprintf(digest, sizeof digest, "%s.xxh3", r.so);
  corrupt(r.so, 4000); /* a flipped byte */
  expect_ok(build(3), 3, 1, 0);
  expect_ok(build(3), 3, 0, 1); /* the recompiled object matches its digest */
  corrupt(r.so, -1); /* truncated */
  expect_ok(build(3), 3, 1, 0);
  unlink(digest); /* no digest */
  expect_ok(build(3), 3, 1, 0);
  FILE *f = fopen(digest, "w"); /* another digest */
  assert_non_null(f);
  fputs("xxh3-64 0123456789abcdef 1\n", f);
  fclose(f);
  chmod(digest, 0644);
  expect_ok(build(3), 3, 1, 0);
  expect_ok(build(3), 3, 0, 1);
}

static void symlinked_object_refused(void **state) {
  (void)state;
  char dir[400], real[1200];
  use_cache("symlink", dir, sizeof dir);
  result r = build(4);
  expect_ok(r, 4, 1, 0);
  snprintf(real, sizeof real, "%s.real", r.so);
  assert_int_equal(rename(r.so, real), 0);
  assert_int_equal(symlink(real, r.so), 0);
  expect_refused(build(4), r.so, "a symbolic link, not followed");
}

/* Two kernels loaded one after the other in one process: each its own. */
static void objects_loaded_are_their_own(void **state) {
  (void)state;
  char dir[400];
  use_cache("two", dir, sizeof dir);
  expect_ok(build(5), 5, 1, 0);
  expect_ok(build(6), 6, 1, 0);
  result r = build2(5, 6, false); /* both found in the cache */
  expect_ok(r, 5, 0, 2);
  assert_true(r.y[1] == 6.0f);
}

static void no_home_uses_tmp(void **state) {
  (void)state;
  char want[64], got[1024];
  snprintf(want, sizeof want, "/tmp/slapo-cache-%u", (unsigned)geteuid());
  unsetenv("SLAPO_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
  unsetenv("HOME");
  slapo_compiler_cache_dir(got, sizeof got);
  assert_string_equal(got, want);
  struct stat st;
  bool existed = lstat(want, &st) == 0;
  struct passwd *nobody = getpwnam("nobody");
  /* Made first by another user: refused. */
  if (!existed && geteuid() == 0 && nobody) {
    assert_int_equal(mkdir(want, 0700), 0);
    assert_int_equal(chown(want, nobody->pw_uid, nobody->pw_gid), 0);
    expect_refused(build(7), want, "is owned by uid");
    assert_int_equal(rmdir(want), 0);
  }
  result r = build(7);
  if (home) setenv("HOME", home, 1), free(home);
  if (r.status != SLAPO_OK) print_message("%s\n", r.msg);
  assert_int_equal(r.status, SLAPO_OK);
  assert_true(r.y[0] == 7.0f);
  assert_int_equal(mode_of(want) & 022, 0);
  if (!existed) { /* made by this test: 0700, and removed again */
    assert_int_equal(mode_of(want), 0700);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", want);
    assert_int_equal(system(cmd), 0);
  }
}

/* ---- another user's files: as root, chown'ed to nobody ---- */

static struct passwd *as_root_with_nobody(void) {
  struct passwd *nobody = getpwnam("nobody");
  if (geteuid() != 0 || !nobody) return NULL;
  return nobody;
}

static void other_owner_refused(void **state) {
  (void)state;
  struct passwd *nobody = as_root_with_nobody();
  if (!nobody) skip();
  uid_t u = nobody->pw_uid;
  gid_t g = nobody->pw_gid;
  char dir[400], digest[1200], parent[400];
  /* A cache directory made by another user. */
  use_cache("theirs", dir, sizeof dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(chown(dir, u, g), 0);
  expect_refused(build(8), dir, "is owned by uid 65534, not by you (uid 0)");
  /* An object planted in our own cache. */
  use_cache("planted", dir, sizeof dir);
  result r = build(8);
  expect_ok(r, 8, 1, 0);
  assert_int_equal(chown(r.so, u, g), 0);
  expect_refused(build(8), r.so, "owned by uid 65534, not by you (uid 0)");
  assert_int_equal(chown(r.so, 0, 0), 0);
  snprintf(digest, sizeof digest, "%s.xxh3", r.so);
  assert_int_equal(chown(digest, u, g), 0);
  expect_refused(build(8), digest, "owned by uid 65534");
  assert_int_equal(chown(digest, 0, 0), 0);
  expect_ok(build(8), 8, 0, 1);
  /* A parent of the cache owned by another user. */
  snprintf(parent, sizeof parent, "%s/their-parent", g_cache);
  use_cache("their-parent/cache", dir, sizeof dir);
  expect_ok(build(8), 8, 1, 0);
  assert_int_equal(chown(parent, u, g), 0);
  expect_refused(build(8), parent, "is owned by uid 65534, not by you (uid 0) or root");
}

/* Without /proc the checked descriptor cannot be named: nothing is loaded
 * (as root, in a mount namespace of the child's own). */
static void no_proc_refused(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  char dir[400];
  use_cache("noproc", dir, sizeof dir);
  result r = build2(9, -1, true);
  if ((int)r.status == -1) skip(); /* no mount namespace here */
  expect_refused(r, "cannot load", "is /proc mounted?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fresh_cache_is_private),
      cmocka_unit_test(loose_permissions_refused),
      cmocka_unit_test(corrupt_object_recompiled),
      cmocka_unit_test(symlinked_object_refused),
      cmocka_unit_test(objects_loaded_are_their_own),
      cmocka_unit_test(no_home_uses_tmp),
      cmocka_unit_test(other_owner_refused),
      cmocka_unit_test(no_proc_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
