/* tests/unit/test_tensor.c - dtypes, shapes and strides, storage sharing,
 * views (reshape, permute, slice), copies, dtype conversion with bf16/f16
 * rounding, meta tensors, equality and printing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/tensor.h"

#define assert_msg(sub)                                                        \
  do {                                                                         \
    if (!strstr(slapo_last_error(), (sub)))                                    \
      fail_msg("message '%s' lacks '%s'", slapo_last_error(), (sub));          \
  } while (0)

/* f32 tensor of `shape` holding 0, 1, 2, ... in row-major order. */
static slapo_tensor *arange(int ndim, const int64_t *shape) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = (float)i;
  return t;
}

static void test_dtype_table(void **state) {
  (void)state;
  assert_int_equal(slapo_dtype_size(SLAPO_DTYPE_F32), 4);
  assert_int_equal(slapo_dtype_size(SLAPO_DTYPE_BF16), 2);
  assert_int_equal(slapo_dtype_size(SLAPO_DTYPE_I64), 8);
  assert_int_equal(slapo_dtype_size(SLAPO_DTYPE_BOOL), 1);
  assert_string_equal(slapo_dtype_name(SLAPO_DTYPE_BF16), "bf16");
  assert_string_equal(slapo_dtype_st_name(SLAPO_DTYPE_U8), "U8");
  slapo_dtype dt;
  for (int i = 0; i < SLAPO_DTYPE_COUNT; i++) {
    assert_ok(slapo_dtype_from_st_name(slapo_dtype_st_name((slapo_dtype)i), &dt));
    assert_int_equal(dt, i);
  }
  assert_int_equal(slapo_dtype_from_st_name("X9", &dt), SLAPO_DTYPE);
  assert_msg("'X9'");
}

static void test_shape_helpers(void **state) {
  (void)state;
  char buf[64];
  int64_t s[] = {2, 3, 4};
  assert_string_equal(slapo_shape_str(3, s, buf, sizeof buf), "[2, 3, 4]");
  assert_string_equal(slapo_shape_str(0, s, buf, sizeof buf), "[]");
  assert_string_equal(slapo_shape_str(3, s, buf, 5), "[2, "); /* truncated, terminated */
  assert_int_equal(slapo_shape_numel(3, s), 24);
  assert_int_equal(slapo_shape_numel(0, NULL), 1);
  int64_t st[3];
  slapo_shape_contiguous_strides(3, s, st);
  assert_int_equal(st[0], 12);
  assert_int_equal(st[1], 4);
  assert_int_equal(st[2], 1);
  int64_t z[] = {2, 0, 3};
  slapo_shape_contiguous_strides(3, z, st);
  assert_int_equal(st[0], 3); /* size-0 dims count as 1, as in PyTorch */
  assert_true(slapo_shape_equal(3, s, 3, s));
  assert_false(slapo_shape_equal(3, s, 2, s));
  assert_false(slapo_shape_equal(3, s, 3, z));
}

static void test_new(void **state) {
  (void)state;
  int64_t s[] = {2, 3, 4};
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 3, s, &t));
  assert_int_equal(slapo_tensor_numel(t), 24);
  assert_int_equal(slapo_tensor_nbytes(t), 96);
  assert_int_equal(t->strides[0], 12);
  assert_int_equal(t->strides[2], 1);
  assert_true(slapo_tensor_is_contiguous(t));
  assert_false(slapo_tensor_is_meta(t));
  assert_int_equal((uintptr_t)slapo_tensor_data(t) % 64, 0);
  for (int i = 0; i < 24; i++) assert_true(((float *)slapo_tensor_data(t))[i] == 0.0f);
  int64_t idx[] = {1, 2, 3};
  slapo_tensor_set(t, idx, 7.5);
  assert_true(slapo_tensor_get(t, idx) == 7.5);
  assert_true(((float *)slapo_tensor_data(t))[23] == 7.5f);
  slapo_tensor_free(t);

  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I64, 0, NULL, &t)); /* a scalar */
  assert_int_equal(slapo_tensor_numel(t), 1);
  slapo_tensor_set(t, NULL, -3);
  assert_true(slapo_tensor_get(t, NULL) == -3);
  slapo_tensor_free(t);

  int64_t z[] = {2, 0};
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, z, &t));
  assert_int_equal(slapo_tensor_nbytes(t), 0);
  assert_non_null(slapo_tensor_data(t));
  slapo_tensor_free(t);
  slapo_tensor_free(NULL);
}

static void test_new_errors(void **state) {
  (void)state;
  slapo_tensor *t = (slapo_tensor *)1;
  int64_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 9, s, &t), SLAPO_INVALID_ARG);
  assert_null(t);
  assert_msg("ndim 9 is outside [0, 8]");
  int64_t neg[] = {2, -1};
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, neg, &t), SLAPO_INVALID_ARG);
  assert_msg("tensor_new: shape [2, -1] has negative dim 1 (-1)");
  int64_t huge[] = {INT64_MAX / 2, 4};
  assert_int_equal(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, huge, &t), SLAPO_INVALID_ARG);
  assert_msg("too large");
  assert_int_equal(slapo_tensor_new((slapo_dtype)99, 0, NULL, &t), SLAPO_INVALID_ARG);
  assert_msg("99 is not a dtype");
  assert_int_equal(slapo_tensor_from_data(SLAPO_DTYPE_F32, 0, NULL, NULL, &t), SLAPO_INVALID_ARG);
  assert_msg("data is NULL");
}

static void test_from_data_and_wrap(void **state) {
  (void)state;
  int32_t v[] = {1, -2, 3, -4, 5, -6};
  int64_t s[] = {2, 3};
  slapo_tensor *t, *w;
  assert_ok(slapo_tensor_from_data(SLAPO_DTYPE_I32, 2, s, v, &t));
  v[0] = 100; /* copied, not referenced */
  int64_t i01[] = {0, 1}, i00[] = {0, 0};
  assert_true(slapo_tensor_get(t, i01) == -2);
  assert_true(slapo_tensor_get(t, i00) == 1);
  assert_ok(slapo_tensor_wrap(SLAPO_DTYPE_I32, 2, s, v, &w));
  assert_true(w->storage->external);
  assert_ptr_equal(slapo_tensor_data(w), v);
  slapo_tensor_set(w, i01, 42);
  assert_int_equal(v[1], 42);
  slapo_tensor_free(w); /* must not free v */
  assert_int_equal(v[1], 42);
  slapo_tensor_free(t);
}

static void test_views_share_storage(void **state) {
  (void)state;
  int64_t s[] = {2, 3};
  slapo_tensor *t = arange(2, s), *v, *r;
  assert_ok(slapo_tensor_view(t, &v));
  assert_ptr_equal(v->storage, t->storage);
  assert_int_equal(t->storage->refcount, 2);
  int64_t rs[] = {3, 2};
  assert_ok(slapo_tensor_reshape(t, 2, rs, &r));
  assert_int_equal(t->storage->refcount, 3);
  int64_t i11[] = {1, 1};
  slapo_tensor_set(r, i11, 99); /* element 3 of t */
  int64_t i10[] = {1, 0};
  assert_true(slapo_tensor_get(t, i10) == 99);
  slapo_tensor_free(t); /* the views keep the storage alive */
  assert_int_equal(r->storage->refcount, 2);
  assert_true(slapo_tensor_get(v, i10) == 99);
  slapo_tensor_free(v);
  assert_int_equal(r->storage->refcount, 1);
  slapo_tensor_free(r);
}

static void test_reshape(void **state) {
  (void)state;
  int64_t s[] = {2, 3, 4};
  slapo_tensor *t = arange(3, s), *r = NULL, *p;
  int64_t a[] = {-1, 4};
  assert_ok(slapo_tensor_reshape(t, 2, a, &r));
  assert_int_equal(r->shape[0], 6);
  assert_int_equal(r->shape[1], 4);
  assert_int_equal(r->strides[0], 4);
  int64_t i51[] = {5, 1};
  assert_true(slapo_tensor_get(r, i51) == 21);
  slapo_tensor_free(r);

  assert_ok(slapo_tensor_reshape(t, 1, (int64_t[]){-1}, &r));
  assert_int_equal(r->shape[0], 24);
  slapo_tensor_free(r);

  int64_t bad[] = {5, -1};
  assert_int_equal(slapo_tensor_reshape(t, 2, bad, &r), SLAPO_SHAPE);
  assert_null(r);
  assert_msg("cannot reshape [2, 3, 4] (24 elements) into [5, -1]");
  int64_t two[] = {-1, -1};
  assert_int_equal(slapo_tensor_reshape(t, 2, two, &r), SLAPO_INVALID_ARG);
  assert_msg("[-1, -1] has more than one -1");
  int64_t neg[] = {-2, 12};
  assert_int_equal(slapo_tensor_reshape(t, 2, neg, &r), SLAPO_INVALID_ARG);
  assert_msg("invalid dim 0 (-2)");
  int64_t wrong[] = {5, 5};
  assert_int_equal(slapo_tensor_reshape(t, 2, wrong, &r), SLAPO_SHAPE);
  assert_msg("cannot reshape [2, 3, 4] (24 elements) into [5, 5] (25 elements)");

  assert_ok(slapo_tensor_permute(t, (int[]){2, 0, 1}, &p));
  int64_t flat[] = {24};
  assert_int_equal(slapo_tensor_reshape(p, 1, flat, &r), SLAPO_SHAPE);
  assert_msg("cannot reshape non-contiguous [4, 2, 3] into [24]");
  slapo_tensor_free(p);

  /* -1 next to a 0 dim is ambiguous. */
  slapo_tensor *e;
  int64_t es[] = {0, 3};
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, es, &e));
  int64_t ez[] = {0, -1};
  assert_int_equal(slapo_tensor_reshape(e, 2, ez, &r), SLAPO_SHAPE);
  assert_msg("cannot be inferred");
  slapo_tensor_free(e);

  /* To and from a scalar. */
  slapo_tensor *one, *sc;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){1, 1}, &one));
  assert_ok(slapo_tensor_reshape(one, 0, NULL, &sc));
  assert_int_equal(sc->ndim, 0);
  slapo_tensor_free(sc);
  slapo_tensor_free(one);
  slapo_tensor_free(t);
}

static void test_permute(void **state) {
  (void)state;
  int64_t s[] = {2, 3, 4};
  slapo_tensor *t = arange(3, s), *p = NULL;
  assert_ok(slapo_tensor_permute(t, (int[]){2, 0, 1}, &p));
  assert_int_equal(p->shape[0], 4);
  assert_int_equal(p->shape[1], 2);
  assert_int_equal(p->shape[2], 3);
  assert_int_equal(p->strides[0], 1);
  assert_int_equal(p->strides[1], 12);
  assert_int_equal(p->strides[2], 4);
  assert_false(slapo_tensor_is_contiguous(p));
  for (int64_t i = 0; i < 4; i++)
    for (int64_t j = 0; j < 2; j++)
      for (int64_t k = 0; k < 3; k++)
        assert_true(slapo_tensor_get(p, (int64_t[]){i, j, k}) == j * 12 + k * 4 + i);
  slapo_tensor_free(p);
  p = NULL;
  assert_int_equal(slapo_tensor_permute(t, (int[]){0, 0, 1}, &p), SLAPO_INVALID_ARG);
  assert_null(p);
  assert_msg("permute: [0, 0, 1] is not a permutation of 0..2 for shape [2, 3, 4]");
  assert_int_equal(slapo_tensor_permute(t, (int[]){0, 1, 3}, &p), SLAPO_INVALID_ARG);
  slapo_tensor_free(t);
}

static void expect_slice(const slapo_tensor *t, int64_t start, int64_t end, int64_t step,
                         int64_t n, const float *want) {
  slapo_tensor *v;
  assert_ok(slapo_tensor_slice(t, 0, start, end, step, &v));
  assert_int_equal(v->shape[0], n);
  for (int64_t i = 0; i < n; i++) assert_true(slapo_tensor_get(v, &i) == want[i]);
  slapo_tensor_free(v);
}

static void test_slice(void **state) {
  (void)state;
  int64_t s[] = {10};
  slapo_tensor *t = arange(1, s), *v = NULL;
  expect_slice(t, 2, 8, 3, 2, (float[]){2, 5});
  expect_slice(t, -3, INT64_MAX, 1, 3, (float[]){7, 8, 9});
  expect_slice(t, -100, 100, 4, 3, (float[]){0, 4, 8});
  expect_slice(t, 1, -1, 7, 2, (float[]){1, 8});
  expect_slice(t, 8, 2, 1, 0, NULL);
  expect_slice(t, 10, 20, 1, 0, NULL);
  expect_slice(t, 3, 4, INT64_MAX, 1, (float[]){3});
  assert_int_equal(slapo_tensor_slice(t, 0, 0, 5, 0, &v), SLAPO_INVALID_ARG);
  assert_msg("step 0 must be >= 1");
  assert_int_equal(slapo_tensor_slice(t, 1, 0, 5, 1, &v), SLAPO_INVALID_ARG);
  assert_msg("dim 1 is out of range for shape [10]");
  assert_null(v);
  slapo_tensor_free(t);

  /* Along an inner dim of a 2-D tensor: a strided, non-contiguous view. */
  int64_t s2[] = {3, 4};
  t = arange(2, s2);
  assert_ok(slapo_tensor_slice(t, 1, 1, 4, 2, &v));
  assert_int_equal(v->shape[0], 3);
  assert_int_equal(v->shape[1], 2);
  assert_int_equal(v->strides[1], 2);
  assert_int_equal(v->offset, 1);
  assert_false(slapo_tensor_is_contiguous(v));
  assert_true(slapo_tensor_get(v, (int64_t[]){2, 1}) == 11);
  slapo_tensor *c;
  assert_ok(slapo_tensor_contiguous(v, &c));
  const float want[] = {1, 3, 5, 7, 9, 11};
  assert_memory_equal(slapo_tensor_data(c), want, sizeof want);
  slapo_tensor_free(c);
  slapo_tensor_free(v);
  slapo_tensor_free(t);
}

static void test_contiguous_and_copy(void **state) {
  (void)state;
  int64_t s[] = {2, 3};
  slapo_tensor *t = arange(2, s), *p, *c;
  assert_ok(slapo_tensor_permute(t, (int[]){1, 0}, &p));
  assert_ok(slapo_tensor_contiguous(p, &c));
  assert_ptr_not_equal(c->storage, t->storage);
  assert_true(slapo_tensor_is_contiguous(c));
  assert_int_equal(c->strides[0], 2);
  const float want[] = {0, 3, 1, 4, 2, 5};
  assert_memory_equal(slapo_tensor_data(c), want, sizeof want);
  assert_true(slapo_tensor_equal(c, p));

  /* Copy into a strided destination: write c back transposed into t. */
  slapo_tensor *z;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &z));
  slapo_tensor *zp;
  assert_ok(slapo_tensor_permute(z, (int[]){1, 0}, &zp));
  assert_ok(slapo_tensor_copy(zp, c));
  assert_true(slapo_tensor_equal(z, t));

  /* A bigger 4-D case against element-by-element reads. */
  int64_t s4[] = {3, 4, 5, 6};
  slapo_tensor *big = arange(4, s4), *bp, *bs, *bc;
  assert_ok(slapo_tensor_permute(big, (int[]){3, 1, 0, 2}, &bp));
  assert_ok(slapo_tensor_slice(bp, 2, 1, 3, 1, &bs));
  assert_ok(slapo_tensor_contiguous(bs, &bc));
  const float *d = slapo_tensor_data(bc);
  int64_t k = 0;
  for (int64_t a = 0; a < bs->shape[0]; a++)
    for (int64_t b = 0; b < bs->shape[1]; b++)
      for (int64_t e = 0; e < bs->shape[2]; e++)
        for (int64_t f = 0; f < bs->shape[3]; f++)
          assert_true(d[k++] == slapo_tensor_get(bs, (int64_t[]){a, b, e, f}));
  assert_int_equal(k, 6 * 4 * 2 * 5);

  /* Errors. */
  slapo_tensor *i32, *m, *o = NULL;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, s, &i32));
  assert_int_equal(slapo_tensor_copy(i32, t), SLAPO_DTYPE);
  assert_msg("dst dtype i32 != src dtype f32");
  assert_int_equal(slapo_tensor_copy(z, c), SLAPO_SHAPE);
  assert_msg("dst shape [2, 3] != src shape [3, 2]");
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, s, &m));
  assert_int_equal(slapo_tensor_copy(m, t), SLAPO_STATE);
  assert_int_equal(slapo_tensor_contiguous(m, &o), SLAPO_STATE);
  assert_null(o);
  slapo_tensor *all[] = {t, p, c, z, zp, big, bp, bs, bc, i32, m};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) slapo_tensor_free(all[i]);
}

static void test_bf16_rounding(void **state) {
  (void)state;
  assert_int_equal(slapo_f32_to_bf16(1.0f), 0x3f80);
  /* Exactly halfway cases round to the even neighbour. */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0x3f808000)), 0x3f80); /* 1 + 2^-8 -> 1 */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0x3f818000)), 0x3f82); /* odd -> up */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0x3f808001)), 0x3f81); /* above half */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0x3f807fff)), 0x3f80); /* below half */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0xbf818000)), 0xbf82); /* negative */
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0x7f7fffff)), 0x7f80); /* FLT_MAX -> inf */
  assert_int_equal(slapo_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(slapo_f32_to_bf16(-INFINITY), 0xff80);
  /* NaN stays NaN, even one whose payload lies only in the dropped bits. */
  uint16_t n = slapo_f32_to_bf16(bits_f32(0x7f800001));
  assert_true(isnan(slapo_bf16_to_f32(n)));
  assert_true(isnan(slapo_bf16_to_f32(slapo_f32_to_bf16(NAN))));
  assert_int_equal(slapo_f32_to_bf16(bits_f32(0xff800001)) & 0x8000, 0x8000);
  /* Every non-NaN bf16 survives bf16 -> f32 -> bf16. */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = slapo_bf16_to_f32((uint16_t)h);
    assert_int_equal(f32_bits(f), h << 16);
    if (!isnan(f)) assert_int_equal(slapo_f32_to_bf16(f), h);
  }
}

static void test_f16_rounding(void **state) {
  (void)state;
  assert_int_equal(slapo_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(slapo_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(slapo_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(slapo_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(slapo_f32_to_f16(65520.0f), 0x7c00); /* halfway to 2^16: to inf */
  assert_int_equal(slapo_f32_to_f16(ldexpf(1, -24)), 0x0001);
  assert_int_equal(slapo_f32_to_f16(ldexpf(1, -25)), 0x0000);  /* tie -> even 0 */
  assert_int_equal(slapo_f32_to_f16(ldexpf(3, -25)), 0x0002);  /* 1.5 ulp tie -> 2 */
  assert_int_equal(slapo_f32_to_f16(ldexpf(1, -14)), 0x0400);  /* smallest normal */
  assert_int_equal(slapo_f32_to_f16(ldexpf(1023, -24) + ldexpf(1, -25) * 1.5f), 0x0400);
  assert_int_equal(slapo_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie -> even */
  assert_int_equal(slapo_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02); /* tie -> even */
  assert_true(isnan(slapo_f16_to_f32(slapo_f32_to_f16(NAN))));
  assert_true(isinf(slapo_f16_to_f32(0x7c00)));
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = slapo_f16_to_f32((uint16_t)h);
    if (!isnan(f)) assert_int_equal(slapo_f32_to_f16(f), h);
  }
}

static void test_to_dtype(void **state) {
  (void)state;
  /* bf16 round trip through a permuted view. */
  int64_t s[] = {2, 3};
  float v[] = {1.0f, bits_f32(0x3f818000), -0.5f, 3.0e38f, bits_f32(0x3f808001), 0.0f};
  slapo_tensor *t, *p, *b, *back;
  assert_ok(slapo_tensor_from_data(SLAPO_DTYPE_F32, 2, s, v, &t));
  assert_ok(slapo_tensor_permute(t, (int[]){1, 0}, &p));
  assert_ok(slapo_tensor_to_dtype(p, SLAPO_DTYPE_BF16, &b));
  assert_int_equal(b->dtype, SLAPO_DTYPE_BF16);
  assert_true(slapo_tensor_is_contiguous(b));
  const uint16_t want[] = {0x3f80, 0x7f62, 0x3f82, 0x3f81, 0xbf00, 0x0000}; /* transposed */
  assert_memory_equal(slapo_tensor_data(b), want, sizeof want);
  assert_ok(slapo_tensor_to_dtype(b, SLAPO_DTYPE_F32, &back));
  for (int i = 0; i < 6; i++)
    assert_true(((float *)slapo_tensor_data(back))[i] == slapo_bf16_to_f32(want[i]));
  slapo_tensor *b2;
  assert_ok(slapo_tensor_to_dtype(back, SLAPO_DTYPE_BF16, &b2));
  assert_true(slapo_tensor_equal(b, b2)); /* bf16 -> f32 -> bf16 is exact */
  slapo_tensor_free(b2);

  /* Same dtype: a contiguous copy. */
  slapo_tensor *same;
  assert_ok(slapo_tensor_to_dtype(p, SLAPO_DTYPE_F32, &same));
  assert_true(slapo_tensor_equal(same, p));
  assert_ptr_not_equal(same->storage, p->storage);
  slapo_tensor_free(same);

  /* Integers wrap like C conversions; integers convert to floats. */
  int64_t iv[] = {-1, 300, 1LL << 40};
  slapo_tensor *i64, *i8, *u16, *f64, *bo;
  assert_ok(slapo_tensor_from_data(SLAPO_DTYPE_I64, 1, (int64_t[]){3}, iv, &i64));
  assert_ok(slapo_tensor_to_dtype(i64, SLAPO_DTYPE_I8, &i8));
  assert_memory_equal(slapo_tensor_data(i8), ((int8_t[]){-1, 44, 0}), 3);
  assert_ok(slapo_tensor_to_dtype(i8, SLAPO_DTYPE_U16, &u16));
  assert_memory_equal(slapo_tensor_data(u16), ((uint16_t[]){0xffff, 44, 0}), 6);
  assert_ok(slapo_tensor_to_dtype(i64, SLAPO_DTYPE_F64, &f64));
  assert_memory_equal(slapo_tensor_data(f64), ((double[]){-1, 300, 1099511627776.0}), 24);
  assert_ok(slapo_tensor_to_dtype(i8, SLAPO_DTYPE_BOOL, &bo));
  assert_memory_equal(slapo_tensor_data(bo), ((uint8_t[]){1, 1, 0}), 3);
  slapo_tensor *bad = NULL;
  assert_int_equal(slapo_tensor_to_dtype(t, SLAPO_DTYPE_I64, &bad), SLAPO_UNSUPPORTED);
  assert_null(bad);
  assert_msg("f32 -> i64 is not supported");

  slapo_tensor *all[] = {t, p, b, back, i64, i8, u16, f64, bo};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) slapo_tensor_free(all[i]);
}

static void test_meta(void **state) {
  (void)state;
  int64_t s[] = {4, 6};
  slapo_tensor *m, *v, *r, *o = NULL;
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_BF16, 2, s, &m));
  assert_true(slapo_tensor_is_meta(m));
  assert_null(slapo_tensor_data(m));
  assert_int_equal(slapo_tensor_nbytes(m), 48);
  assert_ok(slapo_tensor_permute(m, (int[]){1, 0}, &v));
  assert_true(slapo_tensor_is_meta(v));
  assert_int_equal(v->shape[0], 6);
  assert_ok(slapo_tensor_slice(v, 0, 1, 5, 2, &r));
  assert_int_equal(r->shape[0], 2);
  slapo_tensor_free(r);
  assert_ok(slapo_tensor_reshape(m, 1, (int64_t[]){-1}, &r));
  assert_int_equal(r->shape[0], 24);
  assert_true(slapo_tensor_is_meta(r));
  slapo_tensor_free(r);
  assert_int_equal(slapo_tensor_to_dtype(m, SLAPO_DTYPE_F32, &o), SLAPO_STATE);
  assert_msg("meta");
  assert_null(o);

  /* Equality on meta tensors compares shape and dtype only. */
  slapo_tensor *m2;
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_BF16, 2, s, &m2));
  assert_true(slapo_tensor_equal(m, m2));

  /* Materializing gives zeroed contiguous storage; the permuted view (its
   * own object) stays meta. */
  assert_ok(slapo_tensor_materialize(v));
  assert_false(slapo_tensor_is_meta(v));
  assert_true(slapo_tensor_is_contiguous(v));
  assert_int_equal(v->strides[0], 4);
  assert_int_equal(v->storage->nbytes, 48);
  for (int i = 0; i < 24; i++) assert_int_equal(((uint16_t *)slapo_tensor_data(v))[i], 0);
  assert_ok(slapo_tensor_materialize(v)); /* no-op */
  assert_true(slapo_tensor_is_meta(m));
  slapo_tensor *real;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_BF16, 2, s, &real));
  assert_false(slapo_tensor_equal(m, real)); /* meta never equals real data */
  slapo_tensor_free(real);
  slapo_tensor_free(v);
  slapo_tensor_free(m2);
  slapo_tensor_free(m);
}

static void test_equal(void **state) {
  (void)state;
  int64_t s[] = {3, 4};
  slapo_tensor *a = arange(2, s), *b = arange(2, s), *c, *p, *pc;
  assert_true(slapo_tensor_equal(a, b));
  slapo_tensor_set(b, (int64_t[]){2, 3}, -1);
  assert_false(slapo_tensor_equal(a, b));
  assert_ok(slapo_tensor_to_dtype(a, SLAPO_DTYPE_F64, &c));
  assert_false(slapo_tensor_equal(a, c)); /* dtype differs */
  assert_ok(slapo_tensor_permute(a, (int[]){1, 0}, &p));
  assert_false(slapo_tensor_equal(a, p)); /* shape differs */
  assert_ok(slapo_tensor_contiguous(p, &pc));
  assert_true(slapo_tensor_equal(p, pc)); /* layouts differ, elements do not */
  slapo_tensor_set(pc, (int64_t[]){3, 2}, 0.5);
  assert_false(slapo_tensor_equal(pc, p));
  slapo_tensor *all[] = {a, b, c, p, pc};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) slapo_tensor_free(all[i]);
}

static void test_print(void **state) {
  (void)state;
  char buf[256] = {0};
  int64_t s[] = {2, 3};
  slapo_tensor *t = arange(2, s), *m;
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  slapo_tensor_print(t, f, 3);
  fclose(f);
  assert_string_equal(buf, "f32[2, 3] {0, 1, 2, ...}");
  memset(buf, 0, sizeof buf);
  f = fmemopen(buf, sizeof buf - 1, "w");
  slapo_tensor_print(t, f, 100);
  fclose(f);
  assert_string_equal(buf, "f32[2, 3] {0, 1, 2, 3, 4, 5}");
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_I64, 1, (int64_t[]){7}, &m));
  memset(buf, 0, sizeof buf);
  f = fmemopen(buf, sizeof buf - 1, "w");
  slapo_tensor_print(m, f, 3);
  fclose(f);
  assert_string_equal(buf, "i64[7] (meta)");
  slapo_tensor_free(m);
  slapo_tensor_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_table),
      cmocka_unit_test(test_shape_helpers),
      cmocka_unit_test(test_new),
      cmocka_unit_test(test_new_errors),
      cmocka_unit_test(test_from_data_and_wrap),
      cmocka_unit_test(test_views_share_storage),
      cmocka_unit_test(test_reshape),
      cmocka_unit_test(test_permute),
      cmocka_unit_test(test_slice),
      cmocka_unit_test(test_contiguous_and_copy),
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_f16_rounding),
      cmocka_unit_test(test_to_dtype),
      cmocka_unit_test(test_meta),
      cmocka_unit_test(test_equal),
      cmocka_unit_test(test_print),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
