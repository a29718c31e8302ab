/* tests/unit/test_safetensors.c - safetensors round trips (several dtypes,
 * non-contiguous input, metadata, a header-only read), the on-disk layout
 * the format requires,
 * and atomic writing (no temporary left behind, an existing file untouched
 * when a write fails). Malformed files: tests/errors/. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/tensor.h"

#define assert_msg(sub)                                                        \
  do {                                                                         \
    if (!strstr(slapo_last_error(), (sub)))                                    \
      fail_msg("message '%s' lacks '%s'", slapo_last_error(), (sub));          \
  } while (0)

static char g_dir[64];

static int make_dir(void **state) {
  (void)state;
  strcpy(g_dir, "/tmp/slapo-st-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

/* Removes the directory and the files in it. */
static int remove_dir(void **state) {
  (void)state;
  DIR *d = opendir(g_dir);
  if (!d) return -1;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  return rmdir(g_dir);
}

static char *path_of(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  return p;
}

/* Number of entries in the test directory (a leaked temporary shows up). */
static int dir_entries(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* Whole file in a malloc'd buffer (test helper, libc allocation). */
static unsigned char *slurp(const char *p, size_t *n) {
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n + 1);
  assert_int_equal(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

/* A tensor with deterministic non-zero bytes. */
static slapo_tensor *filled(slapo_dtype dt, int ndim, const int64_t *shape) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(dt, ndim, shape, &t));
  unsigned char *p = slapo_tensor_data(t);
  for (size_t i = 0; i < slapo_tensor_nbytes(t); i++) p[i] = (unsigned char)(i * 37 + dt);
  return t;
}

static void test_round_trip(void **state) {
  (void)state;
  slapo_tensor *ts[] = {
      filled(SLAPO_DTYPE_F32, 2, (int64_t[]){2, 3}),
      filled(SLAPO_DTYPE_I64, 1, (int64_t[]){4}),
      filled(SLAPO_DTYPE_I32, 2, (int64_t[]){2, 2}),
      filled(SLAPO_DTYPE_BF16, 1, (int64_t[]){3}),
      filled(SLAPO_DTYPE_U8, 1, (int64_t[]){5}),
      filled(SLAPO_DTYPE_F32, 0, NULL),              /* a scalar */
      filled(SLAPO_DTYPE_F16, 2, (int64_t[]){0, 3}), /* empty */
  };
  const char *names[] = {"h.0.w", "ids", "c.b", "z.bf", "bytes", "scalar", "empty"};
  const int n = 7;
  const char *p = path_of("rt.safetensors");
  assert_ok(slapo_safetensors_write(p, n, names, (const slapo_tensor *const *)ts, 0, NULL, NULL));
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(p, &f));
  assert_int_equal(slapo_safetensors_count(f), n);
  const char *sorted[] = {"bytes", "c.b", "empty", "h.0.w", "ids", "scalar", "z.bf"};
  for (int i = 0; i < n; i++) assert_string_equal(slapo_safetensors_name(f, i), sorted[i]);
  for (int i = 0; i < n; i++) {
    slapo_tensor *got, *meta;
    assert_ok(slapo_safetensors_get(f, names[i], &got));
    assert_true(slapo_tensor_equal(got, ts[i]));
    assert_int_equal((uintptr_t)slapo_tensor_data(got) % 64, 0);
    assert_ok(slapo_safetensors_meta(f, names[i], &meta));
    assert_true(slapo_tensor_is_meta(meta));
    assert_int_equal(meta->dtype, ts[i]->dtype);
    assert_true(slapo_shape_equal(meta->ndim, meta->shape, ts[i]->ndim, ts[i]->shape));
    slapo_tensor_free(meta);
    slapo_tensor_free(got);
  }
  slapo_tensor *none = (slapo_tensor *)1;
  assert_int_equal(slapo_safetensors_get(f, "nope", &none), SLAPO_NOT_FOUND);
  assert_null(none);
  assert_msg("rt.safetensors: no tensor 'nope'");
  assert_int_equal(slapo_safetensors_meta(f, "nope", &none), SLAPO_NOT_FOUND);
  assert_null(slapo_safetensors_metadata(f, "format"));
  slapo_safetensors_free(f);
  for (int i = 0; i < n; i++) slapo_tensor_free(ts[i]);
}

static void test_noncontiguous_and_metadata(void **state) {
  (void)state;
  slapo_tensor *t = filled(SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4}), *p, *s, *pc, *sc;
  assert_ok(slapo_tensor_permute(t, (int[]){2, 0, 1}, &p));
  assert_ok(slapo_tensor_slice(t, 2, 1, 4, 2, &s));
  assert_ok(slapo_tensor_contiguous(p, &pc));
  assert_ok(slapo_tensor_contiguous(s, &sc));
  const char *names[] = {"perm", "slice"};
  const slapo_tensor *ts[] = {p, s};
  const char *keys[] = {"format", "step"}, *vals[] = {"pt", "1200"};
  const char *path = path_of("nc.safetensors");
  assert_ok(slapo_safetensors_write(path, 2, names, ts, 2, keys, vals));
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(path, &f));
  slapo_tensor *a, *b;
  assert_ok(slapo_safetensors_get(f, "perm", &a));
  assert_ok(slapo_safetensors_get(f, "slice", &b));
  assert_true(slapo_tensor_equal(a, pc));
  assert_memory_equal(slapo_tensor_data(a), slapo_tensor_data(pc), slapo_tensor_nbytes(pc));
  assert_memory_equal(slapo_tensor_data(b), slapo_tensor_data(sc), slapo_tensor_nbytes(sc));
  assert_string_equal(slapo_safetensors_metadata(f, "format"), "pt");
  assert_string_equal(slapo_safetensors_metadata(f, "step"), "1200");
  assert_null(slapo_safetensors_metadata(f, "missing"));
  slapo_safetensors_free(f);
  /* Header-only: the names, shapes and metadata, and no data to get. */
  assert_ok(slapo_safetensors_read_header(path, &f));
  assert_int_equal(slapo_safetensors_count(f), 2);
  assert_string_equal(slapo_safetensors_metadata(f, "step"), "1200");
  slapo_tensor *m, *none = NULL;
  assert_ok(slapo_safetensors_meta(f, "slice", &m));
  assert_true(slapo_shape_equal(m->ndim, m->shape, sc->ndim, sc->shape));
  assert_int_equal(slapo_safetensors_get(f, "perm", &none), SLAPO_STATE);
  assert_null(none);
  assert_msg("read header-only; tensor 'perm' has no data");
  slapo_safetensors_free(f);
  slapo_tensor_free(m);
  slapo_tensor *all[] = {t, p, s, pc, sc, a, b};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) slapo_tensor_free(all[i]);
}

/* The bytes on disk follow the format: header length, a JSON object padded
 * with spaces to a multiple of 8, data ranges in name order tiling the rest. */
static void test_file_layout(void **state) {
  (void)state;
  slapo_tensor *x = filled(SLAPO_DTYPE_F32, 1, (int64_t[]){3});
  slapo_tensor *y = filled(SLAPO_DTYPE_U8, 1, (int64_t[]){5});
  const char *names[] = {"y", "x"};
  const slapo_tensor *ts[] = {y, x};
  const char *keys[] = {"k"}, *vals[] = {"v"};
  const char *path = path_of("layout.safetensors");
  assert_ok(slapo_safetensors_write(path, 2, names, ts, 1, keys, vals));
  size_t n;
  unsigned char *b = slurp(path, &n);
  assert_true(n >= 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i]; /* little-endian */
  assert_int_equal(hlen % 8, 0);
  assert_int_equal(n, 8 + hlen + 12 + 5);
  assert_int_equal(b[8], '{');
  size_t last = 8 + hlen - 1;
  while (b[last] == ' ') last--;
  assert_int_equal(b[last], '}');
  assert_true(8 + hlen - 1 - last < 8); /* padding only to the next multiple of 8 */
  json_error_t err;
  json_t *root = json_loadb((const char *)b + 8, hlen, JSON_REJECT_DUPLICATES, &err);
  assert_non_null(root);
  assert_true(json_is_object(root));
  assert_string_equal(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "k")), "v");
  json_t *jx = json_object_get(root, "x"), *jy = json_object_get(root, "y");
  assert_string_equal(json_string_value(json_object_get(jx, "dtype")), "F32");
  assert_string_equal(json_string_value(json_object_get(jy, "dtype")), "U8");
  assert_int_equal(json_integer_value(json_array_get(json_object_get(jx, "shape"), 0)), 3);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(jx, "data_offsets"), 0)), 0);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(jx, "data_offsets"), 1)), 12);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(jy, "data_offsets"), 0)), 12);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(jy, "data_offsets"), 1)), 17);
  json_decref(root);
  assert_memory_equal(b + 8 + hlen, slapo_tensor_data(x), 12);
  assert_memory_equal(b + 8 + hlen + 12, slapo_tensor_data(y), 5);
  free(b);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
}

/* A failed write leaves an existing file exactly as it was, and no write
 * leaves a temporary file behind. */
static void test_atomic_write(void **state) {
  (void)state;
  slapo_tensor *x = filled(SLAPO_DTYPE_F32, 1, (int64_t[]){3}), *m;
  const char *path = path_of("atomic.safetensors");
  int before = dir_entries();
  const char *one[] = {"x"};
  assert_ok(slapo_safetensors_write(path, 1, one, (const slapo_tensor *const[]){x}, 0, NULL, NULL));
  assert_int_equal(dir_entries(), before + 1);
  size_t n0, n1;
  unsigned char *b0 = slurp(path, &n0);

  const char *dup[] = {"a", "b", "a"};
  const slapo_tensor *three[] = {x, x, x};
  assert_int_equal(slapo_safetensors_write(path, 3, dup, three, 0, NULL, NULL), SLAPO_INVALID_ARG);
  assert_msg("duplicate tensor name 'a'");
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 1, (int64_t[]){2}, &m));
  const char *mn[] = {"m"};
  assert_int_equal(slapo_safetensors_write(path, 1, mn, (const slapo_tensor *const[]){m}, 0, NULL,
                                           NULL), SLAPO_INVALID_ARG);
  assert_msg("tensor 'm' is a meta tensor");
  const char *empty[] = {""};
  assert_int_equal(slapo_safetensors_write(path, 1, empty, (const slapo_tensor *const[]){x}, 0,
                                           NULL, NULL), SLAPO_INVALID_ARG);
  assert_msg("empty name");
  const char *reserved[] = {"__metadata__"};
  assert_int_equal(slapo_safetensors_write(path, 1, reserved, (const slapo_tensor *const[]){x},
                                           0, NULL, NULL), SLAPO_INVALID_ARG);
  const char *k2[] = {"k", "k"}, *v2[] = {"1", "2"};
  assert_int_equal(slapo_safetensors_write(path, 1, one, (const slapo_tensor *const[]){x}, 2, k2,
                                           v2), SLAPO_INVALID_ARG);
  assert_msg("duplicate metadata key 'k'");

  unsigned char *b1 = slurp(path, &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(b0, b1, n0);
  assert_int_equal(dir_entries(), before + 1);

  /* Overwriting replaces the file whole. */
  const char *two[] = {"x", "y"};
  assert_ok(slapo_safetensors_write(path, 2, two, (const slapo_tensor *const[]){x, x}, 0, NULL,
                                    NULL));
  assert_int_equal(dir_entries(), before + 1);
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(path, &f));
  assert_int_equal(slapo_safetensors_count(f), 2);
  slapo_safetensors_free(f);

  /* I/O errors name the path and the reason. */
  const char *bad = path_of("no/such/dir/x.safetensors");
  assert_int_equal(slapo_safetensors_write(bad, 1, one, (const slapo_tensor *const[]){x}, 0, NULL,
                                           NULL), SLAPO_IO);
  assert_msg("no/such/dir/x.safetensors");
  assert_msg("No such file or directory");
  assert_int_equal(slapo_safetensors_read(bad, &f), SLAPO_IO);
  assert_msg("cannot open");
  assert_null(f);
  free(b0);
  free(b1);
  slapo_tensor_free(m);
  slapo_tensor_free(x);
}

static void test_empty_file(void **state) {
  (void)state;
  const char *path = path_of("none.safetensors");
  assert_ok(slapo_safetensors_write(path, 0, NULL, NULL, 0, NULL, NULL));
  size_t n;
  unsigned char *b = slurp(path, &n);
  assert_int_equal(n, 16); /* "{}" padded to 8 */
  free(b);
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(path, &f));
  assert_int_equal(slapo_safetensors_count(f), 0);
  slapo_safetensors_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_noncontiguous_and_metadata),
      cmocka_unit_test(test_file_layout),
      cmocka_unit_test(test_atomic_write),
      cmocka_unit_test(test_empty_file),
  };
  return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
