/* tests/errors/test_safetensors_malformed.c - malformed safetensors files
 * that slapo_safetensors_read must reject with SLAPO_IO and a message naming
 * the file, the tensor and the offending value; one test per rule. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/tensor.h"

static char g_path[64];

static int make_file(void **state) {
  (void)state;
  strcpy(g_path, "/tmp/slapo-bad-XXXXXX");
  int fd = mkstemp(g_path);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

static int remove_file(void **state) {
  (void)state;
  return unlink(g_path);
}

/* Writes raw bytes to the test file. */
static void write_bytes(const void *b, size_t n) {
  FILE *f = fopen(g_path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* Writes a file whose header length field says `hlen`, then `header`, then
 * `data_nbytes` zero bytes. */
static void write_file_hlen(uint64_t hlen, const char *header, size_t data_nbytes) {
  size_t h = strlen(header), n = 8 + h + data_nbytes;
  unsigned char *b = calloc(1, n);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
  memcpy(b + 8, header, h);
  write_bytes(b, n);
  free(b);
}

static void write_file(const char *header, size_t data_nbytes) {
  write_file_hlen(strlen(header), header, data_nbytes);
}

/* Reads the test file expecting SLAPO_IO with the path and `sub` in the
 * message, whole and header-only (which must refuse the same files). */
static void expect_io(const char *sub) {
  slapo_status (*readers[2])(const char *, slapo_safetensors **) = {
      slapo_safetensors_read, slapo_safetensors_read_header};
  for (int r = 0; r < 2; r++) {
    slapo_safetensors *f = (slapo_safetensors *)1;
    slapo_status s = readers[r](g_path, &f);
    if (s != SLAPO_IO)
      fail_msg("reader %d: status %s (%s), want io", r, slapo_status_name(s), slapo_last_error());
    assert_null(f);
    const char *m = slapo_last_error();
    if (!strstr(m, g_path) || !strstr(m, sub))
      fail_msg("reader %d: message '%s' lacks '%s'", r, m, sub);
  }
}

static void test_short_file(void **state) {
  (void)state;
  write_bytes("\x05\0\0\0\0", 5);
  expect_io("file is 5 bytes, shorter than the 8-byte header length");
}

static void test_header_longer_than_file(void **state) {
  (void)state;
  write_file_hlen(1000, "{}", 4);
  expect_io("header length 1000 exceeds the 6 bytes after it");
}

static void test_header_not_json(void **state) {
  (void)state;
  write_file("{\"w\": [", 0);
  expect_io("header is not valid JSON");
}

static void test_header_not_object(void **state) {
  (void)state;
  write_file("[1, 2]  ", 0);
  expect_io("header is not a JSON object");
}

static void test_entry_not_object(void **state) {
  (void)state;
  write_file("{\"w\": 3}", 0);
  expect_io("tensor 'w' entry is not a JSON object");
}

static void test_missing_dtype(void **state) {
  (void)state;
  write_file("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' has no 'dtype'");
}

static void test_missing_shape(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' has no 'shape'");
}

static void test_missing_offsets(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4);
  expect_io("tensor 'w' has no 'data_offsets'");
}

static void test_unknown_dtype(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' has unknown dtype 'X9'");
}

static void test_negative_dim(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' shape dim 1 is negative (-2)");
}

static void test_non_integer_dim(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' shape dim 0 is not an integer");
}

static void test_too_many_dims(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4);
  expect_io("tensor 'w' has 9 dims; at most 8 are supported");
}

static void test_offsets_out_of_range(void **state) {
  (void)state;
  write_file("{\"h.0.w\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}", 64);
  expect_io("tensor 'h.0.w' data_offsets [0, 100] exceed data size 64");
  char want[256];
  snprintf(want, sizeof want,
           "safetensors: %s: tensor 'h.0.w' data_offsets [0, 100] exceed data size 64", g_path);
  assert_string_equal(slapo_last_error(), want);
}

static void test_offsets_malformed(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4);
  expect_io("tensor 'w' data_offsets is not an array of two integers");
}

static void test_negative_offsets(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4);
  expect_io("tensor 'w' data_offsets [-4, 0] are negative");
}

static void test_begin_after_end(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8);
  expect_io("tensor 'w' data_offsets [8, 4] have begin > end");
}

static void test_size_mismatch(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20);
  expect_io("tensor 'w' dtype F32 shape [2, 3] needs 24 bytes but data_offsets [0, 20] span 20");
}

static void test_overlap(void **state) {
  (void)state;
  write_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
  expect_io("tensors 'a' data_offsets [0, 8] and 'b' data_offsets [4, 12] overlap");
}

static void test_gap(void **state) {
  (void)state;
  write_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12);
  expect_io("data bytes [4, 8) before tensor 'b' belong to no tensor");
}

static void test_trailing_bytes(void **state) {
  (void)state;
  write_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8);
  expect_io("tensors cover 4 of the 8 data bytes");
}

static void test_duplicate_names(void **state) {
  (void)state;
  write_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2);
  expect_io("header names tensor 'w' twice");
}

static void test_truncated_data(void **state) {
  (void)state;
  write_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10);
  expect_io("tensor 'a' data_offsets [0, 16] exceed data size 10");
}

static void test_metadata_not_string(void **state) {
  (void)state;
  write_file("{\"__metadata__\":{\"step\":12}}", 0);
  expect_io("__metadata__ value for key 'step' is not a string");
}

static void test_missing_file(void **state) {
  (void)state;
  unlink(g_path);
  expect_io("cannot open: No such file or directory");
  write_bytes("", 0); /* for the teardown */
}

/* The JSON must start right after the length: leading blanks are not the
 * format (its reference reader refuses them); trailing padding is. */
static void test_leading_whitespace(void **state) {
  (void)state;
  write_file(" {\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
  expect_io("its first byte is 0x20 (leading whitespace is not allowed");
  write_file("\n{}", 0);
  expect_io("its first byte is 0x0a");
  write_file_hlen(0, "", 0);
  expect_io("header is empty");
  /* trailing padding stays legal */
  write_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}   ", 4);
  slapo_safetensors *f = NULL;
  assert_int_equal(slapo_safetensors_read(g_path, &f), SLAPO_OK);
  slapo_safetensors_free(f);
}

/* A zero-element tensor whose strides would overflow int64 (UBSan found the
 * signed overflow in slapo_shape_contiguous_strides). */
static void test_zero_elements_huge_dims(void **state) {
  (void)state;
  write_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4611686018427387904, 8], "
             "\"data_offsets\": [0, 0]}}", 0);
  expect_io("tensor 'w' shape [0, 4611686018427387904, 8] is too large");
  /* the same shape through the tensor API */
  int64_t sh[3] = {0, (int64_t)1 << 62, 8};
  slapo_tensor *t = NULL;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 3, sh, &t), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "too large to address"));
  assert_int_equal(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, sh, &t), SLAPO_INVALID_ARG);
  /* and into a reshape of an empty tensor */
  int64_t z[1] = {0};
  slapo_tensor *e = NULL, *v = NULL;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 1, z, &e), SLAPO_OK);
  assert_int_equal(slapo_tensor_reshape(e, 3, sh, &v), SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "strides overflow"));
  slapo_tensor_free(e);
}

/* Integers past int64 are refused by the JSON parser; the message names the
 * tensor (or __metadata__) and the value. */
static void test_integer_too_big(void **state) {
  (void)state;
  write_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], "
             "\"data_offsets\": [0, 18446744073709551615]}}", 4);
  expect_io("tensor 'w' holds an integer too large for 64 bits");
  expect_io("18446744073709551615");
  write_file("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
             "\"b\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], "
             "\"data_offsets\": [4, 8]}}", 8);
  expect_io("tensor 'b' holds an integer too large");
  write_file("{\"__metadata__\": {\"n\": 99999999999999999999}}", 0);
  expect_io("__metadata__ holds an integer too large");
}

int main(void) {
#define T(name) cmocka_unit_test_setup_teardown(name, make_file, remove_file)
  const struct CMUnitTest tests[] = {
      T(test_short_file),        T(test_header_longer_than_file), T(test_header_not_json),
      T(test_header_not_object), T(test_entry_not_object),        T(test_missing_dtype),
      T(test_missing_shape),     T(test_missing_offsets),         T(test_unknown_dtype),
      T(test_negative_dim),      T(test_non_integer_dim),         T(test_too_many_dims),
      T(test_offsets_out_of_range), T(test_offsets_malformed),    T(test_negative_offsets),
      T(test_begin_after_end),   T(test_size_mismatch),           T(test_overlap),
      T(test_gap),               T(test_trailing_bytes),          T(test_duplicate_names),
      T(test_truncated_data),    T(test_metadata_not_string),     T(test_missing_file),
      T(test_leading_whitespace), T(test_zero_elements_huge_dims), T(test_integer_too_big),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
