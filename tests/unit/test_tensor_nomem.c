/* tests/unit/test_tensor_nomem.c - allocation-failure sweep over the tensor
 * layer: for every public entry point that allocates, failing allocation k
 * (k = 0, 1, 2, ...) must give SLAPO_NOMEM and leak nothing, until the call
 * needs no more than k allocations and succeeds. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/failalloc.h"
#include "slapo/tensor.h"


/* One call under test. It runs with the failing allocator installed and must
 * free whatever it got back (under the same allocator) before returning.
 * `ctx` holds inputs made beforehand with the libc allocator. */
typedef slapo_status (*call_fn)(void *ctx);

typedef struct ctx {
  slapo_tensor *t;      /* f32 [4, 6], contiguous */
  slapo_tensor *perm;   /* t permuted (non-contiguous) */
  slapo_tensor *meta;   /* meta f32 [3, 5] */
  slapo_safetensors *f; /* a file with "a" and "b" */
  char dir[64];
  char path[128];       /* a file with "a" and "b" */
  char out[128];        /* written by the write sweep */
} ctx;

static ctx g;

static void sweep(const char *what, call_fn fn) {
  long k = 0;
  for (;; k++) {
    failalloc_install(k);
    slapo_status s = fn(&g);
    long live = failalloc_live();
    failalloc_uninstall();
    if (live != 0) fail_msg("%s: %ld allocation(s) leaked when allocation %ld failed", what, live, k);
    if (s == SLAPO_OK) break;
    if (s != SLAPO_NOMEM)
      fail_msg("%s: allocation %ld failed: status %s (%s), want nomem", what, k,
               slapo_status_name(s), slapo_last_error());
    if (k > 1000) fail_msg("%s: still failing after %ld allocations", what, k);
  }
  if (k == 0) fail_msg("%s: made no allocation", what);
}

static slapo_status call_new(void *c) {
  (void)c;
  slapo_tensor *t;
  slapo_status s = slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){3, 7}, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_new_meta(void *c) {
  (void)c;
  slapo_tensor *t;
  slapo_status s = slapo_tensor_new_meta(SLAPO_DTYPE_BF16, 1, (int64_t[]){9}, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_from_data(void *c) {
  (void)c;
  slapo_tensor *t;
  const int32_t v[] = {1, 2, 3};
  slapo_status s = slapo_tensor_from_data(SLAPO_DTYPE_I32, 1, (int64_t[]){3}, v, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_wrap(void *c) {
  (void)c;
  static float v[6];
  slapo_tensor *t;
  slapo_status s = slapo_tensor_wrap(SLAPO_DTYPE_F32, 2, (int64_t[]){2, 3}, v, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_reshape(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_reshape(((ctx *)c)->t, 2, (int64_t[]){-1, 8}, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_permute(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_permute(((ctx *)c)->t, (int[]){1, 0}, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_slice(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_slice(((ctx *)c)->t, 1, 1, -1, 2, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_view(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_view(((ctx *)c)->meta, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_contiguous(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_contiguous(((ctx *)c)->perm, &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_to_dtype(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_tensor_to_dtype(((ctx *)c)->perm, SLAPO_DTYPE_BF16, &t);
  slapo_tensor_free(t);
  return s;
}

/* Materializes a fresh meta tensor (made under the failing allocator too,
 * so the sweep also covers the meta constructor path). */
static slapo_status call_materialize(void *c) {
  (void)c;
  slapo_tensor *t;
  slapo_status s = slapo_tensor_new_meta(SLAPO_DTYPE_F32, 1, (int64_t[]){100}, &t);
  if (s == SLAPO_OK) s = slapo_tensor_materialize(t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_st_read(void *c) {
  slapo_safetensors *f;
  slapo_status s = slapo_safetensors_read(((ctx *)c)->path, &f);
  slapo_safetensors_free(f);
  return s;
}

static slapo_status call_st_get(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_safetensors_get(((ctx *)c)->f, "b", &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_st_meta(void *c) {
  slapo_tensor *t;
  slapo_status s = slapo_safetensors_meta(((ctx *)c)->f, "a", &t);
  slapo_tensor_free(t);
  return s;
}

static slapo_status call_st_write(void *c) {
  ctx *x = c;
  const char *names[] = {"t", "perm"}, *keys[] = {"format"}, *vals[] = {"pt"};
  const slapo_tensor *ts[] = {x->t, x->perm};
  return slapo_safetensors_write(x->out, 2, names, ts, 1, keys, vals);
}

static int count_dir(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

static int setup(void **state) {
  (void)state;
  int64_t s[] = {4, 6};
  if (slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &g.t)) return -1;
  float *p = slapo_tensor_data(g.t);
  for (int i = 0; i < 24; i++) p[i] = (float)i * 0.25f;
  if (slapo_tensor_permute(g.t, (int[]){1, 0}, &g.perm)) return -1;
  if (slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, (int64_t[]){3, 5}, &g.meta)) return -1;
  strcpy(g.dir, "/tmp/slapo-nomem-XXXXXX");
  if (!mkdtemp(g.dir)) return -1;
  snprintf(g.path, sizeof g.path, "%s/in.safetensors", g.dir);
  snprintf(g.out, sizeof g.out, "%s/out.safetensors", g.dir);
  const char *names[] = {"a", "b"}, *keys[] = {"k"}, *vals[] = {"v"};
  const slapo_tensor *ts[] = {g.t, g.perm};
  if (slapo_safetensors_write(g.path, 2, names, ts, 1, keys, vals)) return -1;
  return slapo_safetensors_read(g.path, &g.f) ? -1 : 0;
}

static int teardown(void **state) {
  (void)state;
  slapo_safetensors_free(g.f);
  slapo_tensor_free(g.meta);
  slapo_tensor_free(g.perm);
  slapo_tensor_free(g.t);
  unlink(g.path);
  unlink(g.out);
  return rmdir(g.dir);
}

static void test_tensor_constructors(void **state) {
  (void)state;
  sweep("tensor_new", call_new);
  sweep("tensor_new_meta", call_new_meta);
  sweep("tensor_from_data", call_from_data);
  sweep("tensor_wrap", call_wrap);
  sweep("tensor_materialize", call_materialize);
}

static void test_views_and_copies(void **state) {
  (void)state;
  sweep("tensor_reshape", call_reshape);
  sweep("tensor_permute", call_permute);
  sweep("tensor_slice", call_slice);
  sweep("tensor_view", call_view);
  sweep("tensor_contiguous", call_contiguous);
  sweep("tensor_to_dtype", call_to_dtype);
  /* Failed calls dropped the references they took: g.t and g.perm hold the
   * only two. */
  assert_int_equal(g.t->storage->refcount, 2); /* g.t and g.perm */
}

static void test_safetensors(void **state) {
  (void)state;
  sweep("safetensors_read", call_st_read);
  sweep("safetensors_get", call_st_get);
  sweep("safetensors_meta", call_st_meta);
  sweep("safetensors_write", call_st_write);
  /* Failed writes removed their temporaries: only in and out remain. */
  assert_int_equal(count_dir(g.dir), 2);
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(g.out, &f));
  slapo_tensor *perm;
  assert_ok(slapo_safetensors_get(f, "perm", &perm));
  assert_true(slapo_tensor_equal(perm, g.perm));
  slapo_tensor_free(perm);
  slapo_safetensors_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensor_constructors),
      cmocka_unit_test(test_views_and_copies),
      cmocka_unit_test(test_safetensors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
