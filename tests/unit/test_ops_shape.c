/* tests/unit/test_ops_shape.c - the shape op group (src/ops/shape.c):
 * reshape with -1 and as a view sharing storage through the executor,
 * permute of a 4-d value (and transpose), slice with negative and clamped
 * bounds and steps, slice_backward, split, concat of 3 inputs, contiguous of
 * a strided input, full, fast kernels against the reference (f32, i64, f16
 * bytes), and the gradient graphs the backward rules build. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include "common/opfix.h"
#include "slapo/exec.h"
#include "slapo/ops.h"


/* Both kernels of node (ref, and fast where there is one) on `in` against
 * want [n], exactly: these ops only move values. */
static void check_both(const slapo_node *node, const slapo_tensor *const *in, int n,
                       const float *want) {
  opfix_check_kernels(node, in, n, want, 0, 0);
}

/* ---- reshape ---- */

static void test_reshape_minus_one(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *y = slapo_reshape(f->ctx, x, 2, (int64_t[]){4, -1});
  assert_non_null(y);
  opfix_assert_shape(y, 2, (int64_t[]){4, 6});
  assert_true(y->op->view != NULL);
  assert_true(y->op->contiguous_inputs);
  slapo_tensor *xt = opfix_arange(3, s);
  float want[24];
  for (int i = 0; i < 24; i++) want[i] = (float)i;
  check_both(y, (const slapo_tensor *[]){xt}, 24, want);
  opfix_assert_shape(slapo_reshape(f->ctx, x, 3, (int64_t[]){-1, 1, 2}), 3, (int64_t[]){12, 1, 2});
  opfix_assert_shape(slapo_reshape(f->ctx, x, 1, (int64_t[]){-1}), 1, (int64_t[]){24});
  /* Zero-size: a -1 next to a known 0 cannot be inferred, but [0] -> [0, 5] works. */
  slapo_node *z = opfix_input(f, "z", 1, (int64_t[]){0});
  opfix_assert_shape(slapo_reshape(f->ctx, z, 2, (int64_t[]){0, 5}), 2, (int64_t[]){0, 5});
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(xt);
}

/* The view function shares x's storage at x's offset. */
static void test_reshape_view_fn(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 6};
  slapo_node *y = slapo_reshape(f->ctx, opfix_input(f, "x", 2, s), 3, (int64_t[]){3, 2, 2});
  slapo_tensor *base = opfix_arange(2, (int64_t[]){4, 6}), *x;
  assert_ok(slapo_tensor_slice(base, 0, 1, 3, 1, &x)); /* rows 1..2: offset 6 */
  slapo_tensor v = {0};
  y->op->view(y, (const slapo_tensor *[]){x}, &v);
  assert_ptr_equal(v.storage, x->storage);
  assert_int_equal(v.offset, 6);
  assert_int_equal(v.ndim, 3);
  assert_int_equal(v.strides[0], 4);
  assert_int_equal(v.strides[2], 1);
  int64_t idx[] = {2, 1, 1};
  assert_float_equal(slapo_tensor_get(&v, idx), 17, 0);
  slapo_tensor_free(x);
  slapo_tensor_free(base);
}

/* Through the executor: the reshape of a kernel's output aliases that
 * output's buffer; the reshape of a bound (possibly strided) input runs the
 * reference kernel into a buffer of its own, so a transposed input reshapes
 * correctly. */
static void test_reshape_is_view_in_executor(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_node *n = slapo_neg(f->ctx, x);
  slapo_node *y = slapo_reshape(f->ctx, n, 1, (int64_t[]){-1});
  slapo_node *z = slapo_reshape(f->ctx, x, 1, (int64_t[]){-1});
  assert_non_null(slapo_output(f->ctx, 3, (slapo_node *[]){n, y, z}));
  slapo_plan *p;
  assert_ok(slapo_plan_new(f->g, NULL, &p));
  slapo_tensor *base = opfix_arange(2, (int64_t[]){3, 2}), *xt;
  assert_ok(slapo_tensor_permute(base, (int[]){1, 0}, &xt)); /* [2, 3], strided */
  assert_ok(slapo_plan_bind_input(p, "x", xt));
  assert_ok(slapo_plan_run(p, NULL));
  const slapo_tensor *on = slapo_plan_output(p, 0), *oy = slapo_plan_output(p, 1);
  const slapo_tensor *oz = slapo_plan_output(p, 2);
  assert_ptr_equal(oy->storage, on->storage);
  assert_ptr_equal(slapo_tensor_data(oy), slapo_tensor_data(on));
  assert_int_equal(oy->ndim, 1);
  assert_int_equal(oy->shape[0], 6);
  /* x = base^T = [[0, 2, 4], [1, 3, 5]] flattened row-major. */
  const float want[6] = {0, 2, 4, 1, 3, 5};
  for (int i = 0; i < 6; i++) {
    assert_float_equal(((const float *)slapo_tensor_data(oz))[i], want[i], 0);
    assert_float_equal(((const float *)slapo_tensor_data(oy))[i], -want[i], 0);
  }
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  slapo_tensor_free(base);
}

/* ---- permute / transpose ---- */

static void test_permute_4d(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4, 5}, perm[] = {0, 2, -1, 1};
  slapo_node *x = opfix_input(f, "x", 4, s);
  slapo_node *y = slapo_permute(f->ctx, x, 4, perm);
  assert_non_null(y);
  opfix_assert_shape(y, 4, (int64_t[]){2, 4, 5, 3});
  slapo_tensor *xt = opfix_arange(4, s);
  float want[120];
  int n = 0;
  for (int a = 0; a < 2; a++)
    for (int c = 0; c < 4; c++)
      for (int d = 0; d < 5; d++)
        for (int b = 0; b < 3; b++) want[n++] = (float)(60 * a + 20 * b + 5 * c + d);
  check_both(y, (const slapo_tensor *[]){xt}, 120, want);

  /* A strided input: permute a transposed view back. */
  slapo_tensor *tv;
  assert_ok(slapo_tensor_permute(xt, (int[]){0, 2, 3, 1}, &tv));
  slapo_node *x2 = opfix_input(f, "x2", 4, (int64_t[]){2, 4, 5, 3});
  slapo_node *back = slapo_permute(f->ctx, x2, 4, (int64_t[]){0, 3, 1, 2});
  float ident[120];
  for (int i = 0; i < 120; i++) ident[i] = (float)i;
  check_both(back, (const slapo_tensor *[]){tv}, 120, ident);
  slapo_tensor_free(tv);
  slapo_tensor_free(xt);
}

static void test_transpose(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *y = slapo_transpose(f->ctx, x, -1, 0);
  assert_non_null(y);
  assert_string_equal(y->target, "permute");
  const slapo_attr *a = slapo_node_attr(y, "perm");
  assert_non_null(a);
  assert_int_equal(a->n, 3);
  assert_int_equal(a->ints[0], 2);
  assert_int_equal(a->ints[1], 1);
  assert_int_equal(a->ints[2], 0);
  opfix_assert_shape(y, 3, (int64_t[]){4, 3, 2});
}

/* ---- slice / split / slice_backward ---- */

static void test_slice_bounds(void **state) {
  opfix *f = *state;
  int64_t s[] = {3, 5};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_tensor *xt = opfix_arange(2, s);
  /* x[:, -3:100] -> columns 2..4 */
  slapo_node *y = slapo_slice(f->ctx, x, -1, -3, 100);
  opfix_assert_shape(y, 2, (int64_t[]){3, 3});
  check_both(y, (const slapo_tensor *[]){xt}, 9, (float[]){2, 3, 4, 7, 8, 9, 12, 13, 14});
  /* x[-100:-1] -> rows 0..1 */
  y = slapo_slice(f->ctx, x, 0, -100, -1);
  opfix_assert_shape(y, 2, (int64_t[]){2, 5});
  check_both(y, (const slapo_tensor *[]){xt}, 10, (float[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  /* Empty: start after end. */
  y = slapo_slice(f->ctx, x, 1, 4, 2);
  opfix_assert_shape(y, 2, (int64_t[]){3, 0});
  check_both(y, (const slapo_tensor *[]){xt}, 0, NULL);
  /* With a step: x[:, 1::2]. */
  slapo_attr a[4] = {slapo_attr_int("dim", 1), slapo_attr_int("start", 1),
                     slapo_attr_int("end", INT64_MAX), slapo_attr_int("step", 2)};
  y = slapo_op_call(f->ctx, "slice", 1, &x, 4, a);
  opfix_assert_shape(y, 2, (int64_t[]){3, 2});
  check_both(y, (const slapo_tensor *[]){xt}, 6, (float[]){1, 3, 6, 8, 11, 13});
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(xt);
}

static void test_slice_backward(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 2};
  slapo_node *dy = opfix_input(f, "dy", 2, s);
  slapo_attr a[5] = {slapo_attr_ints("shape", 2, (int64_t[]){2, 5}), slapo_attr_int("dim", 1),
                     slapo_attr_int("start", 1), slapo_attr_int("end", 100),
                     slapo_attr_int("step", 3)};
  slapo_node *dx = slapo_op_call(f->ctx, "slice_backward", 1, &dy, 5, a);
  assert_non_null(dx);
  opfix_assert_shape(dx, 2, (int64_t[]){2, 5});
  slapo_tensor *dyt = opfix_arange(2, s);
  check_both(dx, (const slapo_tensor *[]){dyt}, 10, (float[]){0, 0, 0, 0, 1, 0, 2, 0, 0, 3});
  slapo_tensor_free(dyt);
}

static void test_split(void **state) {
  opfix *f = *state;
  int64_t s[] = {5, 3};
  slapo_node *x = opfix_input(f, "x", 2, s);
  slapo_node *parts[3];
  assert_ok(slapo_split(f->ctx, x, -2, 3, (int64_t[]){2, 0, 3}, parts));
  opfix_assert_shape(parts[0], 2, (int64_t[]){2, 3});
  opfix_assert_shape(parts[1], 2, (int64_t[]){0, 3});
  opfix_assert_shape(parts[2], 2, (int64_t[]){3, 3});
  slapo_tensor *xt = opfix_arange(2, s);
  check_both(parts[0], (const slapo_tensor *[]){xt}, 6, (float[]){0, 1, 2, 3, 4, 5});
  check_both(parts[2], (const slapo_tensor *[]){xt}, 9,
             (float[]){6, 7, 8, 9, 10, 11, 12, 13, 14});
  slapo_node *cols[2];
  assert_ok(slapo_split(f->ctx, x, 1, 2, (int64_t[]){1, 2}, cols));
  check_both(cols[1], (const slapo_tensor *[]){xt}, 10,
             (float[]){1, 2, 4, 5, 7, 8, 10, 11, 13, 14});
  slapo_tensor_free(xt);
}

/* ---- concat ---- */

static void test_concat_three(void **state) {
  opfix *f = *state;
  int64_t a[] = {2, 3}, b[] = {2, 1}, c[] = {2, 2};
  slapo_node *xs[3] = {opfix_input(f, "a", 2, a), opfix_input(f, "b", 2, b),
                       opfix_input(f, "c", 2, c)};
  slapo_node *y = slapo_concat(f->ctx, 3, xs, -1);
  assert_non_null(y);
  opfix_assert_shape(y, 2, (int64_t[]){2, 6});
  slapo_tensor *at = opfix_arange(2, a), *bt = opfix_arange(2, b), *ct = opfix_arange(2, c);
  check_both(y, (const slapo_tensor *[]){at, bt, ct}, 12,
             (float[]){0, 1, 2, 0, 0, 1, 3, 4, 5, 1, 2, 3});
  /* Along dim 0. */
  int64_t r[] = {1, 3}, q[] = {3, 3};
  slapo_node *ys[3] = {opfix_input(f, "p", 2, a), opfix_input(f, "r", 2, r),
                       opfix_input(f, "q", 2, q)};
  slapo_node *y0 = slapo_concat(f->ctx, 3, ys, 0);
  opfix_assert_shape(y0, 2, (int64_t[]){6, 3});
  slapo_tensor *rt = opfix_arange(2, r), *qt = opfix_arange(2, q);
  check_both(y0, (const slapo_tensor *[]){at, rt, qt}, 18,
             (float[]){0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  slapo_tensor_free(at);
  slapo_tensor_free(bt);
  slapo_tensor_free(ct);
  slapo_tensor_free(rt);
  slapo_tensor_free(qt);
}

/* ---- contiguous / full ---- */

static void test_contiguous_strided(void **state) {
  opfix *f = *state;
  int64_t s[] = {3, 4};
  slapo_tensor *base = opfix_arange(2, s), *tv;
  assert_ok(slapo_tensor_permute(base, (int[]){1, 0}, &tv));
  slapo_node *y = slapo_contiguous(f->ctx, opfix_input(f, "x", 2, (int64_t[]){4, 3}));
  check_both(y, (const slapo_tensor *[]){tv}, 12, (float[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  slapo_tensor_free(tv);
  slapo_tensor_free(base);
}

static void test_full(void **state) {
  opfix *f = *state;
  slapo_node *y = slapo_full(f->ctx, 2, (int64_t[]){2, 3}, 1.5);
  assert_non_null(y);
  assert_int_equal(y->n_inputs, 0);
  assert_int_equal(y->dtype, SLAPO_DTYPE_F32);
  opfix_assert_shape(y, 2, (int64_t[]){2, 3});
  check_both(y, NULL, 6, (float[]){1.5, 1.5, 1.5, 1.5, 1.5, 1.5});
  slapo_node *s = slapo_full(f->ctx, 0, NULL, -2);
  assert_int_equal(s->ndim, 0);
  check_both(s, NULL, 1, (float[]){-2});
  assert_non_null(y->op->test.exempt);
  assert_null(y->op->backward);
}

/* ---- fast vs reference on other dtypes and larger shapes ---- */

static void compare_bytes(const slapo_node *node, const slapo_tensor *const *in) {
  slapo_tensor *r = opfix_run(node, in, false), *q = opfix_run(node, in, true);
  assert_true(slapo_tensor_equal(r, q));
  slapo_tensor_free(r);
  slapo_tensor_free(q);
}

static void test_fast_matches_ref(void **state) {
  opfix *f = *state;
  slapo_dtype dts[] = {SLAPO_DTYPE_F32, SLAPO_DTYPE_I64, SLAPO_DTYPE_F16, SLAPO_DTYPE_U8};
  int64_t s[] = {6, 70, 9, 11};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    slapo_tensor *xt = opfix_arange_dt(dts[i], 4, s);
    slapo_node *x = slapo_input(f->ctx, "x", dts[i], 4, s);
    const slapo_tensor *in[] = {xt};
    compare_bytes(slapo_permute(f->ctx, x, 4, (int64_t[]){0, 2, 1, 3}), in);
    compare_bytes(slapo_permute(f->ctx, x, 4, (int64_t[]){3, 1, 2, 0}), in);
    compare_bytes(slapo_transpose(f->ctx, x, -1, -2), in);
    compare_bytes(slapo_slice(f->ctx, x, 1, 3, -5), in);
    compare_bytes(slapo_contiguous(f->ctx, x), in);
    slapo_attr a[4] = {slapo_attr_int("dim", 3), slapo_attr_int("start", -9),
                       slapo_attr_int("end", 11), slapo_attr_int("step", 4)};
    compare_bytes(slapo_op_call(f->ctx, "slice", 1, &x, 4, a), in);
    int64_t one[] = {1, 70, 1, 11};
    slapo_tensor *ot = opfix_arange_dt(dts[i], 4, one);
    slapo_node *o = slapo_input(f->ctx, "o", dts[i], 4, one);
    compare_bytes(slapo_broadcast_to(f->ctx, o, 5, (int64_t[]){2, 6, 70, 9, 11}),
                  (const slapo_tensor *[]){ot});
    slapo_tensor_free(ot);
    slapo_tensor_free(xt);
  }
  /* One long contiguous run (parallel chunks). */
  int64_t big[] = {300000};
  slapo_tensor *bt = opfix_arange(1, big);
  slapo_node *bx = opfix_input(f, "big", 1, big);
  compare_bytes(slapo_contiguous(f->ctx, bx), (const slapo_tensor *[]){bt});
  slapo_tensor_free(bt);
  assert_ok(slapo_ctx_status(f->ctx));
}

/* ---- backward rules ---- */

static void test_backward_rules(void **state) {
  opfix *f = *state;
  int64_t s[] = {2, 3, 4};
  slapo_node *x = opfix_input(f, "x", 3, s);
  slapo_node *dx[3] = {NULL};

  opfix_backward(f, slapo_reshape(f->ctx, x, 2, (int64_t[]){-1, 4}), dx);
  assert_string_equal(dx[0]->target, "reshape");
  opfix_assert_shape(dx[0], 3, s);

  opfix_backward(f, slapo_permute(f->ctx, x, 3, (int64_t[]){1, 2, 0}), dx);
  assert_string_equal(dx[0]->target, "permute");
  const slapo_attr *p = slapo_node_attr(dx[0], "perm");
  assert_int_equal(p->ints[0], 2); /* inverse of (1, 2, 0) is (2, 0, 1) */
  assert_int_equal(p->ints[1], 0);
  assert_int_equal(p->ints[2], 1);
  opfix_assert_shape(dx[0], 3, s);

  opfix_backward(f, slapo_slice(f->ctx, x, 1, 1, 3), dx);
  assert_string_equal(dx[0]->target, "slice_backward");
  opfix_assert_shape(dx[0], 3, s);
  slapo_node *sb = dx[0];
  opfix_backward(f, sb, dx); /* slice_backward's adjoint is the slice */
  assert_string_equal(dx[0]->target, "slice");
  opfix_assert_shape(dx[0], 3, (int64_t[]){2, 2, 4});

  slapo_node *b = opfix_input(f, "b", 3, (int64_t[]){2, 3, 1});
  slapo_node *c = opfix_input(f, "c", 3, (int64_t[]){2, 3, 2});
  opfix_backward(f, slapo_concat(f->ctx, 3, (slapo_node *[]){x, b, c}, 2), dx);
  opfix_assert_shape(dx[0], 3, s);
  opfix_assert_shape(dx[1], 3, (int64_t[]){2, 3, 1});
  opfix_assert_shape(dx[2], 3, (int64_t[]){2, 3, 2});
  assert_int_equal(slapo_node_attr_int(dx[2], "start", -1), 5);
  assert_int_equal(slapo_node_attr_int(dx[2], "end", -1), 7);

  slapo_node *y = slapo_contiguous(f->ctx, x);
  opfix_backward(f, y, dx);
  assert_int_equal(dx[0]->kind, SLAPO_NODE_PLACEHOLDER); /* dy itself */
  assert_ok(slapo_ctx_status(f->ctx));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reshape_minus_one, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_view_fn, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_is_view_in_executor, opfix_setup,
                                      opfix_teardown),
      cmocka_unit_test_setup_teardown(test_permute_4d, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_transpose, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_bounds, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_slice_backward, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_split, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_concat_three, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_contiguous_strided, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_full, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fast_matches_ref, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_backward_rules, opfix_setup, opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
