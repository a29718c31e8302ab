/* tests/unit/test_ops_elementwise.c - the elementwise op group (binary.c,
 * scalar.c, unary.c, activation.c): values against hand-computed results
 * (broadcasting [2, 3]+[3], [2, 1]+[1, 3], scalar []), GELU's two forms
 * against known values, strided inputs, fast vs reference kernels on larger
 * shapes, and every backward rule against central differences. Kernels run
 * directly (node->op->ref / fast) through a small in-test interpreter. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/opfix.h"
#include "slapo/ops.h"


/* ---- helpers ---- */

/* Evaluates every call_op node of g with reference kernels, placeholders
 * bound by name to `vals` (borrowed). Results live in node->aux until
 * free_values. */
static void eval_graph(slapo_graph *g, int n, const char *const *names,
                       slapo_tensor *const *vals) {
  for (slapo_node *nd = slapo_graph_first(g); nd; nd = nd->next) {
    nd->aux = NULL;
    if (nd->kind == SLAPO_NODE_PLACEHOLDER) {
      for (int i = 0; i < n; i++)
        if (!strcmp(names[i], nd->target))
          assert_ok(slapo_tensor_view(vals[i], (slapo_tensor **)&nd->aux));
      assert_non_null(nd->aux);
    } else if (nd->kind == SLAPO_NODE_CALL_OP) {
      const slapo_tensor *in[8];
      assert_true(nd->n_inputs <= 8);
      for (int i = 0; i < nd->n_inputs; i++) in[i] = nd->inputs[i]->aux;
      nd->aux = opfix_run(nd, in, false);
    }
  }
}

static void free_values(slapo_graph *g) {
  for (slapo_node *nd = slapo_graph_first(g); nd; nd = nd->next) {
    slapo_tensor_free(nd->aux);
    nd->aux = NULL;
  }
}

/* Both kernels of op node y (every op of the group has a fast one) on `in`
 * against want [n], to within tol. */
static void check_op(const slapo_node *y, const slapo_tensor *const *in, const float *want,
                     int64_t n, float tol) {
  assert_non_null(y);
  assert_non_null(y->op->fast);
  opfix_check_kernels(y, in, n, want, tol, 0);
}

/* ---- binary ops ---- */

static void test_binary_same_shape(void **state) {
  opfix *f = *state;
  const int64_t s[] = {2, 3};
  slapo_node *a = slapo_input(f->ctx, "a", SLAPO_DTYPE_F32, 2, s);
  slapo_node *b = slapo_input(f->ctx, "b", SLAPO_DTYPE_F32, 2, s);
  slapo_node *add = slapo_add(f->ctx, a, b), *sub = slapo_sub(f->ctx, a, b);
  slapo_node *mul = slapo_mul(f->ctx, a, b), *dv = slapo_div(f->ctx, a, b);
  assert_ok(slapo_ctx_status(f->ctx));
  assert_int_equal(add->ndim, 2);
  assert_int_equal(add->shape[1], 3);
  slapo_tensor *ta = opfix_tensor(2, s, (const float[]){1, 2, 3, 4, 5, 6});
  slapo_tensor *tb = opfix_tensor(2, s, (const float[]){2, 4, 8, -1, -2, 0.5f});
  const slapo_tensor *in[] = {ta, tb};
  check_op(add, in, (const float[]){3, 6, 11, 3, 3, 6.5f}, 6, 0);
  check_op(sub, in, (const float[]){-1, -2, -5, 5, 7, 5.5f}, 6, 0);
  check_op(mul, in, (const float[]){2, 8, 24, -4, -10, 3}, 6, 0);
  check_op(dv, in, (const float[]){0.5f, 0.5f, 0.375f, -4, -2.5f, 12}, 6, 0);
  slapo_tensor_free(ta);
  slapo_tensor_free(tb);
}

static void test_binary_broadcast(void **state) {
  opfix *f = *state;
  const int64_t s23[] = {2, 3}, s3[] = {3}, s21[] = {2, 1}, s13[] = {1, 3};
  slapo_node *a = slapo_input(f->ctx, "a", SLAPO_DTYPE_F32, 2, s23);
  slapo_node *r = slapo_input(f->ctx, "r", SLAPO_DTYPE_F32, 1, s3);
  slapo_node *c = slapo_input(f->ctx, "c", SLAPO_DTYPE_F32, 2, s21);
  slapo_node *d = slapo_input(f->ctx, "d", SLAPO_DTYPE_F32, 2, s13);
  slapo_node *z = slapo_input(f->ctx, "z", SLAPO_DTYPE_F32, 0, NULL);
  slapo_tensor *ta = opfix_tensor(2, s23, (const float[]){1, 2, 3, 4, 5, 6});
  slapo_tensor *tr = opfix_tensor(1, s3, (const float[]){10, 20, 30});
  slapo_tensor *tc = opfix_tensor(2, s21, (const float[]){100, 200});
  slapo_tensor *td = opfix_tensor(2, s13, (const float[]){1, 2, 3});
  slapo_tensor *tz = opfix_tensor(0, NULL, (const float[]){2});

  /* [2, 3] + [3]: the bias-add row broadcast (fast row loop). */
  slapo_node *y = slapo_add(f->ctx, a, r);
  assert_non_null(y);
  assert_int_equal(y->ndim, 2);
  check_op(y, (const slapo_tensor *[]){ta, tr}, (const float[]){11, 22, 33, 14, 25, 36}, 6, 0);
  /* [3] - [2, 3]: the row operand on the left; order matters for sub. */
  y = slapo_sub(f->ctx, r, a);
  check_op(y, (const slapo_tensor *[]){tr, ta}, (const float[]){9, 18, 27, 6, 15, 24}, 6, 0);
  /* [2, 1] + [1, 3] -> [2, 3]: both operands broadcast (general path). */
  y = slapo_add(f->ctx, c, d);
  assert_int_equal(y->ndim, 2);
  assert_int_equal(y->shape[0], 2);
  assert_int_equal(y->shape[1], 3);
  check_op(y, (const slapo_tensor *[]){tc, td}, (const float[]){101, 102, 103, 201, 202, 203},
           6, 0);
  /* [2, 3] / [2, 1]: a column broadcast. */
  y = slapo_div(f->ctx, a, c);
  check_op(y, (const slapo_tensor *[]){ta, tc},
           (const float[]){0.01f, 0.02f, 0.03f, 0.02f, 0.025f, 0.03f}, 6, 1e-9f);
  /* scalar [] on either side. */
  y = slapo_mul(f->ctx, z, a);
  check_op(y, (const slapo_tensor *[]){tz, ta}, (const float[]){2, 4, 6, 8, 10, 12}, 6, 0);
  y = slapo_div(f->ctx, a, z);
  check_op(y, (const slapo_tensor *[]){ta, tz}, (const float[]){0.5f, 1, 1.5f, 2, 2.5f, 3}, 6,
           0);
  /* [] op [] stays a scalar. */
  y = slapo_sub(f->ctx, z, z);
  assert_int_equal(y->ndim, 0);
  check_op(y, (const slapo_tensor *[]){tz, tz}, (const float[]){0}, 1, 0);
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(ta);
  slapo_tensor_free(tr);
  slapo_tensor_free(tc);
  slapo_tensor_free(td);
  slapo_tensor_free(tz);
}

/* Inputs may be strided views (contiguous_inputs = false). */
static void test_strided_inputs(void **state) {
  opfix *f = *state;
  const int64_t s32[] = {3, 2}, s23[] = {2, 3}, s3[] = {3};
  const int perm[] = {1, 0};
  /* base [3, 2] = {1..6}; its transpose [2, 3] = {1, 3, 5, 2, 4, 6}. */
  slapo_tensor *base = opfix_tensor(2, s32, (const float[]){1, 2, 3, 4, 5, 6});
  slapo_tensor *tt;
  assert_ok(slapo_tensor_permute(base, perm, &tt));
  assert_false(slapo_tensor_is_contiguous(tt));
  slapo_tensor *tr = opfix_tensor(1, s3, (const float[]){10, 20, 30});
  slapo_node *a = slapo_input(f->ctx, "a", SLAPO_DTYPE_F32, 2, s23);
  slapo_node *r = slapo_input(f->ctx, "r", SLAPO_DTYPE_F32, 1, s3);
  check_op(slapo_add(f->ctx, a, r), (const slapo_tensor *[]){tt, tr},
           (const float[]){11, 23, 35, 12, 24, 36}, 6, 0);
  check_op(slapo_mul(f->ctx, r, a), (const slapo_tensor *[]){tr, tt},
           (const float[]){10, 60, 150, 20, 80, 180}, 6, 0);
  check_op(slapo_neg(f->ctx, a), (const slapo_tensor *[]){tt},
           (const float[]){-1, -3, -5, -2, -4, -6}, 6, 0);
  /* Two strided operands of the same shape (the fused backward ops). */
  slapo_node *in2[] = {a, a};
  check_op(slapo_op_call(f->ctx, "relu_backward", 2, in2, 0, NULL),
           (const slapo_tensor *[]){tt, tt}, (const float[]){1, 3, 5, 2, 4, 6}, 6, 0);
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(base);
  slapo_tensor_free(tt);
  slapo_tensor_free(tr);
}

/* ---- one-input ops: values ---- */

/* Builds op(x) on x [n] with the given attributes and checks both kernels. */
static void check_unary(opfix *f, const char *op, int n_attrs, const slapo_attr *attrs, int n,
                        const float *x, const float *want, float tol) {
  const int64_t s[] = {n};
  slapo_node *xn = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_node *y = slapo_op_call(f->ctx, op, 1, &xn, n_attrs, attrs);
  if (!y) fail_msg("%s: %s", op, slapo_ctx_message(f->ctx));
  slapo_tensor *tx = opfix_tensor(1, s, x);
  check_op(y, (const slapo_tensor *[]){tx}, want, n, tol);
  slapo_tensor_free(tx);
}

static void test_scalar_ops(void **state) {
  opfix *f = *state;
  const int64_t s[] = {4};
  slapo_node *x = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_tensor *tx = opfix_tensor(1, s, (const float[]){-2, 0, 0.5f, 4});
  const slapo_tensor *in[] = {tx};
  slapo_node *y = slapo_add_scalar(f->ctx, x, 1.5);
  assert_non_null(y);
  assert_true(slapo_node_attr_float(y, "value", 0) == 1.5);
  check_op(y, in, (const float[]){-0.5f, 1.5f, 2, 5.5f}, 4, 0);
  check_op(slapo_mul_scalar(f->ctx, x, -3), in, (const float[]){6, 0, -1.5f, -12}, 4, 0);
  y = slapo_pow(f->ctx, x, 2.0);
  assert_true(slapo_node_attr_float(y, "exponent", 0) == 2.0);
  check_op(y, in, (const float[]){4, 0, 0.25f, 16}, 4, 0);
  check_op(slapo_pow(f->ctx, x, 3.0), in, (const float[]){-8, 0, 0.125f, 64}, 4, 0);
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(tx);
  /* Non-integer exponents on positive inputs: 2^2.5, 3^-1.5, 4^0.5. */
  slapo_attr e = slapo_attr_float("exponent", 2.5);
  check_unary(f, "pow", 1, &e, 2, (const float[]){2, 1}, (const float[]){5.6568542f, 1}, 1e-6f);
  e = slapo_attr_float("exponent", -1.5);
  check_unary(f, "pow", 1, &e, 1, (const float[]){3}, (const float[]){0.19245009f}, 1e-7f);
  /* An integer attribute is accepted as a number. */
  e = slapo_attr_int("exponent", 2);
  check_unary(f, "pow", 1, &e, 1, (const float[]){3}, (const float[]){9}, 0);
}

static void test_unary_values(void **state) {
  opfix *f = *state;
  check_unary(f, "neg", 0, NULL, 3, (const float[]){1, -2, 0},
              (const float[]){-1, 2, 0}, 0);
  check_unary(f, "exp", 0, NULL, 3, (const float[]){0, 1, -1},
              (const float[]){1, 2.7182818f, 0.36787944f}, 3e-7f);
  check_unary(f, "log", 0, NULL, 3, (const float[]){1, 2.7182818f, 2},
              (const float[]){0, 1, 0.69314718f}, 2e-7f);
  check_unary(f, "tanh", 0, NULL, 3, (const float[]){0, 0.5f, -0.5f},
              (const float[]){0, 0.46211716f, -0.46211716f}, 1e-7f);
  check_unary(f, "sqrt", 0, NULL, 3, (const float[]){4, 2, 0},
              (const float[]){2, 1.4142135f, 0}, 1e-7f);
  check_unary(f, "rsqrt", 0, NULL, 3, (const float[]){4, 2, 0.25f},
              (const float[]){0.5f, 0.70710678f, 2}, 1e-7f);
  /* IEEE edge values pass through (no error at build or run time). */
  const int64_t s[] = {1};
  slapo_node *x = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_tensor *tz = opfix_tensor(1, s, (const float[]){0});
  slapo_tensor *out = opfix_run(slapo_log(f->ctx, x), (const slapo_tensor *[]){tz}, true);
  assert_true(isinf(((float *)slapo_tensor_data(out))[0]));
  slapo_tensor_free(out);
  slapo_tensor_free(tz);
}

static void test_activation_values(void **state) {
  opfix *f = *state;
  check_unary(f, "relu", 0, NULL, 4, (const float[]){-1, 0, 2, -0.0f},
              (const float[]){0, 0, 2, 0}, 0);
  check_unary(f, "sigmoid", 0, NULL, 3, (const float[]){0, 1, -1},
              (const float[]){0.5f, 0.7310586f, 0.2689414f}, 1e-7f);
  check_unary(f, "silu", 0, NULL, 4, (const float[]){0, 1, -1, 2},
              (const float[]){0, 0.7310586f, -0.2689414f, 1.7615942f}, 2e-7f);
  /* Large inputs saturate instead of overflowing to nan. */
  check_unary(f, "sigmoid", 0, NULL, 2, (const float[]){-200, 200}, (const float[]){0, 1}, 0);
  check_unary(f, "silu", 0, NULL, 2, (const float[]){-200, 200}, (const float[]){0, 200}, 0);
}

static void test_gelu_values(void **state) {
  opfix *f = *state;
  const float x[] = {1, -1, 2, -0.5f, 0, 3};
  /* Python: 0.5*x*(1+math.tanh(math.sqrt(2/math.pi)*(x+0.044715*x**3))). */
  const float want_tanh[] = {0.8411920f, -0.1588080f, 1.9545977f, -0.1542860f, 0, 2.9963626f};
  /* Python: 0.5*x*(1+math.erf(x/math.sqrt(2))), = torch F.gelu(x). */
  const float want_erf[] = {0.8413447f, -0.1586553f, 1.9544997f, -0.1542688f, 0, 2.9959503f};
  slapo_attr a = slapo_attr_str("approximate", "tanh");
  check_unary(f, "gelu", 1, &a, 6, x, want_tanh, 3e-7f);
  a = slapo_attr_str("approximate", "none");
  check_unary(f, "gelu", 1, &a, 6, x, want_erf, 3e-7f);
  /* No attribute: the exact form, PyTorch's default. */
  check_unary(f, "gelu", 0, NULL, 6, x, want_erf, 3e-7f);

  /* The typed builder sets the attribute. */
  const int64_t s[] = {1};
  slapo_node *xn = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  assert_string_equal(slapo_node_attr_str(slapo_gelu(f->ctx, xn, true), "approximate", ""),
                      "tanh");
  assert_string_equal(slapo_node_attr_str(slapo_gelu(f->ctx, xn, false), "approximate", ""),
                      "none");
}

/* The fused backward ops against hand-computed derivatives. */
static void test_fused_backward_values(void **state) {
  opfix *f = *state;
  const int64_t s[] = {4};
  slapo_node *x = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_node *dy = slapo_input(f->ctx, "dy", SLAPO_DTYPE_F32, 1, s);
  slapo_node *in[] = {x, dy};
  slapo_tensor *tx = opfix_tensor(1, s, (const float[]){-1, 0, 1, 2});
  slapo_tensor *tdy = opfix_tensor(1, s, (const float[]){2, 2, 2, 0.5f});
  const slapo_tensor *tin[] = {tx, tdy};
  /* relu'(0) = 0, as in PyTorch. */
  check_op(slapo_op_call(f->ctx, "relu_backward", 2, in, 0, NULL), tin,
           (const float[]){0, 0, 2, 0.5f}, 4, 0);
  /* silu'(x) = s(1 + x(1 - s)): 0.0723295, 0.5, 0.9276705, 1.0907842. */
  check_op(slapo_op_call(f->ctx, "silu_backward", 2, in, 0, NULL), tin,
           (const float[]){0.1446590f, 1.0f, 1.8553410f, 0.5453921f}, 4, 1e-6f);
  /* Exact gelu'(x) = Phi(x) + x phi(x) at -1, 0, 1, 2:
   * -0.0833155, 0.5, 1.0833155, 1.0852318 (times dy). */
  slapo_attr a = slapo_attr_str("approximate", "none");
  check_op(slapo_op_call(f->ctx, "gelu_backward", 2, in, 1, &a), tin,
           (const float[]){-0.1666309f, 1.0f, 2.1666309f, 0.5426159f}, 4, 1e-6f);
  /* tanh form: -0.0829641, 0.5, 1.0829641, 1.0860992 (agrees with a
   * central difference of the Python expression above). */
  a = slapo_attr_str("approximate", "tanh");
  check_op(slapo_op_call(f->ctx, "gelu_backward", 2, in, 1, &a), tin,
           (const float[]){-0.1659282f, 1.0f, 2.1659282f, 0.5430496f}, 4, 1e-6f);
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(tx);
  slapo_tensor_free(tdy);
}

/* ---- the group in the registry ---- */

static const char *const k_ops[] = {
    "add",  "sub", "mul",   "div",  "add_scalar", "mul_scalar", "pow",
    "neg",  "exp", "log",   "tanh", "sqrt",       "rsqrt",      "relu",
    "sigmoid", "silu", "gelu", "relu_backward", "silu_backward", "gelu_backward"};

static void test_registry(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++) {
    const slapo_op *op = slapo_op_find(k_ops[i]);
    if (!op) fail_msg("op %s is not registered", k_ops[i]);
    assert_string_equal(op->name, k_ops[i]);
    assert_non_null(op->infer);
    assert_non_null(op->ref);
    assert_non_null(op->fast);
    assert_null(op->view);
    assert_false(op->random);
    assert_non_null(op->doc);
    assert_non_null(op->test.example);
    assert_null(op->test.exempt);
    if (strstr(op->name, "_backward")) {
      /* Backward-only: checked through the forward op's gradient. */
      assert_null(op->backward);
      assert_non_null(op->test.checked_by);
      assert_non_null(slapo_op_find(op->test.checked_by));
      assert_non_null(strstr(op->doc, "Fused because"));
    } else {
      assert_non_null(op->backward);
      assert_null(op->test.checked_by);
    }
    /* The example builds. */
    slapo_graph *g;
    slapo_ctx *ctx;
    assert_ok(slapo_graph_new(&g));
    assert_ok(slapo_ctx_new(g, &ctx));
    slapo_node *y = op->test.example(ctx);
    if (!y) fail_msg("%s example: %s", op->name, slapo_ctx_message(ctx));
    assert_ptr_equal(y->op, op);
    slapo_ctx_free(ctx);
    slapo_graph_free(g);
  }
}

/* ---- fast vs reference ---- */

/* Largest |fast - ref| / max(1, |ref|) over the elements. */
static double max_rel_diff(const slapo_tensor *a, const slapo_tensor *b) {
  assert_int_equal(slapo_tensor_numel(a), slapo_tensor_numel(b));
  const float *p = slapo_tensor_data(a), *q = slapo_tensor_data(b);
  double m = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
    double d = fabs((double)p[i] - q[i]) / fmax(1.0, fabs((double)q[i]));
    if (!(d <= m)) m = d; /* also catches nan */
  }
  return m;
}

static void compare_fast_ref(const slapo_node *y, const slapo_tensor *const *in) {
  slapo_tensor *r = opfix_run(y, in, false), *q = opfix_run(y, in, true);
  double d = max_rel_diff(q, r);
  /* The default fast_atol (1e-5 relative): float libm vs double libm
   * differ by a few ulp (~1e-7 relative). */
  if (!(d <= 1e-5)) fail_msg("%s: fast and reference differ by %g", y->target, d);
  slapo_tensor_free(r);
  slapo_tensor_free(q);
}

/* [128, 257] = 32896 elements: above slapo__threads_for's threshold, so the
 * fast loops run in parallel; 257 is odd so vector loops have a tail. */
#define FR_R 128
#define FR_C 257

static void test_fast_vs_ref_unary(void **state) {
  opfix *f = *state;
  const int64_t s[] = {FR_R, FR_C};
  slapo_tensor *sym = opfix_random(2, s, -4, 4);   /* x [R, C] */
  slapo_tensor *pos = opfix_random(2, s, 0.1f, 4); /* x [R, C] > 0 */
  slapo_node *x = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 2, s);
  struct {
    const char *op;
    slapo_attr attr;
    int n_attrs;
    bool positive;
  } cases[] = {
      {"neg", {0}, 0, false},
      {"exp", {0}, 0, false},
      {"log", {0}, 0, true},
      {"tanh", {0}, 0, false},
      {"sqrt", {0}, 0, true},
      {"rsqrt", {0}, 0, true},
      {"relu", {0}, 0, false},
      {"sigmoid", {0}, 0, false},
      {"silu", {0}, 0, false},
      {"gelu", slapo_attr_str("approximate", "tanh"), 1, false},
      {"gelu", slapo_attr_str("approximate", "none"), 1, false},
      {"add_scalar", slapo_attr_float("value", 0.1), 1, false},
      {"mul_scalar", slapo_attr_float("value", -0.3), 1, false},
      {"pow", slapo_attr_float("exponent", 2.5), 1, true},
      {"pow", slapo_attr_float("exponent", 2.0), 1, false},
      {"pow", slapo_attr_float("exponent", 3.0), 1, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    slapo_node *y = slapo_op_call(f->ctx, cases[i].op, 1, &x, cases[i].n_attrs, &cases[i].attr);
    compare_fast_ref(y, (const slapo_tensor *[]){cases[i].positive ? pos : sym});
  }
  /* A strided input takes the fast kernels' row-offset path. */
  const int perm[] = {1, 0};
  const int64_t st[] = {FR_C, FR_R};
  slapo_tensor *tt;
  assert_ok(slapo_tensor_permute(pos, perm, &tt));
  slapo_node *xt = slapo_input(f->ctx, "xt", SLAPO_DTYPE_F32, 2, st);
  compare_fast_ref(slapo_log(f->ctx, xt), (const slapo_tensor *[]){tt});
  compare_fast_ref(slapo_gelu(f->ctx, xt, true), (const slapo_tensor *[]){tt});
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(tt);
  slapo_tensor_free(sym);
  slapo_tensor_free(pos);
}

static void test_fast_vs_ref_binary(void **state) {
  opfix *f = *state;
  const int64_t sf[] = {FR_R, FR_C}, sr[] = {FR_C}, sc[] = {FR_R, 1}, s1r[] = {1, FR_C},
                st[] = {FR_C, FR_R};
  const int perm[] = {1, 0};
  /* Operands in [0.5, 2] so that div stays tame. */
  slapo_tensor *full = opfix_random(2, sf, 0.5f, 2), *full2 = opfix_random(2, sf, 0.5f, 2);
  slapo_tensor *row = opfix_random(1, sr, 0.5f, 2), *col = opfix_random(2, sc, 0.5f, 2);
  slapo_tensor *row1 = opfix_random(2, s1r, 0.5f, 2), *one = opfix_random(0, NULL, 0.5f, 2);
  slapo_tensor *base = opfix_random(2, st, 0.5f, 2), *tt;
  assert_ok(slapo_tensor_permute(base, perm, &tt)); /* [R, C] strided */
  slapo_node *nf = slapo_input(f->ctx, "f", SLAPO_DTYPE_F32, 2, sf);
  slapo_node *nr = slapo_input(f->ctx, "r", SLAPO_DTYPE_F32, 1, sr);
  slapo_node *nc = slapo_input(f->ctx, "c", SLAPO_DTYPE_F32, 2, sc);
  slapo_node *n1r = slapo_input(f->ctx, "r1", SLAPO_DTYPE_F32, 2, s1r);
  slapo_node *n0 = slapo_input(f->ctx, "s", SLAPO_DTYPE_F32, 0, NULL);
  struct {
    slapo_node *a, *b;
    const slapo_tensor *ta, *tb;
  } pairs[] = {
      {nf, nf, full, full2}, /* same shape */
      {nf, nr, full, row},   /* [R, C] op [C] */
      {nr, nf, row, full},   /* [C] op [R, C] */
      {nf, n1r, full, row1}, /* [R, C] op [1, C] */
      {nf, n0, full, one},   /* [R, C] op [] */
      {n0, nf, one, full},   /* [] op [R, C] */
      {nf, nc, full, col},   /* [R, C] op [R, 1]: general path */
      {nc, nr, col, row},    /* [R, 1] op [C]: both broadcast */
      {nf, nf, tt, full},    /* strided op contiguous */
      {nf, nr, tt, row},     /* strided op row */
  };
  const char *ops[] = {"add", "sub", "mul", "div"};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    for (int o = 0; o < 4; o++) {
      slapo_node *ab[] = {pairs[p].a, pairs[p].b};
      slapo_node *y = slapo_op_call(f->ctx, ops[o], 2, ab, 0, NULL);
      slapo_tensor *r = opfix_run(y, (const slapo_tensor *[]){pairs[p].ta, pairs[p].tb}, false);
      slapo_tensor *q = opfix_run(y, (const slapo_tensor *[]){pairs[p].ta, pairs[p].tb}, true);
      /* One IEEE operation: the double reference rounds to the same float. */
      if (!slapo_tensor_equal(r, q)) fail_msg("%s, case %zu: fast != reference", ops[o], p);
      slapo_tensor_free(r);
      slapo_tensor_free(q);
    }
  }
  /* The fused backward ops, same-shape and strided. */
  const char *bw[] = {"relu_backward", "silu_backward", "gelu_backward", "gelu_backward"};
  const char *approx[] = {NULL, NULL, "tanh", "none"};
  slapo_tensor *xs = opfix_random(2, sf, -4, 4);
  for (int i = 0; i < 4; i++) {
    slapo_attr a = slapo_attr_str("approximate", approx[i] ? approx[i] : "none");
    slapo_node *in[] = {nf, nf};
    slapo_node *y = slapo_op_call(f->ctx, bw[i], 2, in, approx[i] ? 1 : 0, &a);
    compare_fast_ref(y, (const slapo_tensor *[]){xs, full});
    compare_fast_ref(y, (const slapo_tensor *[]){xs, tt});
  }
  assert_ok(slapo_ctx_status(f->ctx));
  slapo_tensor_free(xs);
  slapo_tensor_free(tt);
  slapo_tensor_free(base);
  slapo_tensor_free(full);
  slapo_tensor_free(full2);
  slapo_tensor_free(row);
  slapo_tensor_free(col);
  slapo_tensor_free(row1);
  slapo_tensor_free(one);
}

/* ---- backward rules against central differences ---- */

typedef struct grad_case {
  const char *op;
  int n_in;
  int ndim[2];
  int64_t shape[2][3];
  float lo, hi;
  int n_attrs;
  slapo_attr attr;
  bool needs_sum_to; /* broadcast: the rule reduces with sum_to (reduce group) */
} grad_case;

/* Loss sum(dy * op(inputs)) in double, evaluated with the reference kernel. */
static double loss_of(const slapo_node *y, const slapo_tensor *const *in, const slapo_tensor *dy) {
  slapo_tensor *out = opfix_run(y, in, false);
  const float *o = slapo_tensor_data(out), *d = slapo_tensor_data(dy);
  double l = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) l += (double)o[i] * d[i];
  slapo_tensor_free(out);
  return l;
}

static void check_gradient(const grad_case *c) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  static const char *const names[] = {"a", "b", "dy"};
  slapo_node *x[2];
  slapo_tensor *tv[3];
  for (int i = 0; i < c->n_in; i++) {
    x[i] = slapo_input(ctx, names[i], SLAPO_DTYPE_F32, c->ndim[i], c->shape[i]);
    tv[i] = opfix_random(c->ndim[i], c->shape[i], c->lo, c->hi);
  }
  if (!strcmp(c->op, "relu")) {
    /* Keep clear of the kink so central differences are exact. */
    float *p = slapo_tensor_data(tv[0]);
    for (int64_t j = 0; j < slapo_tensor_numel(tv[0]); j++)
      if (fabsf(p[j]) < 0.05f) p[j] = p[j] < 0 ? -0.5f : 0.5f;
  }
  slapo_node *y = slapo_op_call(ctx, c->op, c->n_in, x, c->n_attrs, &c->attr);
  if (!y) fail_msg("%s: %s", c->op, slapo_ctx_message(ctx));
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, y->ndim, y->shape);
  tv[c->n_in] = opfix_random(y->ndim, y->shape, -1, 1);
  const bool need[2] = {true, true};
  slapo_node *dx[2] = {NULL, NULL};
  assert_ok(y->op->backward(ctx, y, dy, need, dx));
  const char *bind[3];
  slapo_tensor *vals[3];
  for (int i = 0; i < c->n_in; i++) bind[i] = names[i], vals[i] = tv[i];
  bind[c->n_in] = "dy", vals[c->n_in] = tv[c->n_in];
  eval_graph(g, c->n_in + 1, bind, vals);

  const float eps = 1e-3f;
  for (int i = 0; i < c->n_in; i++) {
    assert_non_null(dx[i]);
    assert_true(slapo_shape_equal(dx[i]->ndim, dx[i]->shape, x[i]->ndim, x[i]->shape));
    const float *ana = slapo_tensor_data(dx[i]->aux);
    float *p = slapo_tensor_data(tv[i]);
    for (int64_t j = 0; j < slapo_tensor_numel(tv[i]); j++) {
      float keep = p[j];
      p[j] = keep + eps;
      double lp = loss_of(y, (const slapo_tensor *const *)tv, tv[c->n_in]);
      p[j] = keep - eps;
      double lm = loss_of(y, (const slapo_tensor *const *)tv, tv[c->n_in]);
      p[j] = keep;
      double num = (lp - lm) / (2.0 * eps);
      /* f32 outputs summed in double: the difference quotient carries
       * ~n * 6e-8 * |y| / eps of rounding (observed at most 3e-4, pow 2.5). */
      if (!(fabs(num - ana[j]) <= 1e-3 + 1e-3 * fabs(num)))
        fail_msg("%s: d/d%s[%lld] analytic %.7g, numeric %.7g", c->op, names[i], (long long)j,
                 ana[j], num);
    }
  }
  free_values(g);
  for (int i = 0; i <= c->n_in; i++) slapo_tensor_free(tv[i]);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

#define S1(a, b) 1, {2}, {{a, b}}
#define SAME23 2, {2, 2}, {{2, 3}, {2, 3}}
#define BCAST 2, {3, 2}, {{2, 3, 4}, {3, 1}}
#define X234 1, {3}, {{2, 3, 4}}

static void test_gradients(void **state) {
  (void)state;
  const grad_case cases[] = {
      {"add", SAME23, -1, 1, 0, {0}, false},
      {"sub", SAME23, -1, 1, 0, {0}, false},
      {"mul", SAME23, -1, 1, 0, {0}, false},
      {"div", SAME23, 0.5f, 2, 0, {0}, false},
      {"add", BCAST, -1, 1, 0, {0}, true},
      {"sub", BCAST, -1, 1, 0, {0}, true},
      {"mul", BCAST, -1, 1, 0, {0}, true},
      {"div", BCAST, 0.5f, 2, 0, {0}, true},
      {"add_scalar", X234, -1, 1, 1, {.key = "value", .kind = SLAPO_ATTR_FLOAT, .f = 0.5}, false},
      {"mul_scalar", X234, -1, 1, 1, {.key = "value", .kind = SLAPO_ATTR_FLOAT, .f = -1.5}, false},
      {"pow", X234, 0.5f, 2, 1, {.key = "exponent", .kind = SLAPO_ATTR_FLOAT, .f = 2.5}, false},
      {"pow", X234, -1, 1, 1, {.key = "exponent", .kind = SLAPO_ATTR_FLOAT, .f = 2.0}, false},
      {"pow", X234, -1, 1, 1, {.key = "exponent", .kind = SLAPO_ATTR_FLOAT, .f = 1.0}, false},
      {"pow", X234, -1, 1, 1, {.key = "exponent", .kind = SLAPO_ATTR_FLOAT, .f = 0.0}, false},
      {"pow", X234, 0.5f, 2, 1, {.key = "exponent", .kind = SLAPO_ATTR_FLOAT, .f = -1.5}, false},
      {"neg", X234, -1, 1, 0, {0}, false},
      {"exp", X234, -1, 1, 0, {0}, false},
      {"log", X234, 0.5f, 2, 0, {0}, false},
      {"tanh", X234, -2, 2, 0, {0}, false},
      {"sqrt", X234, 0.5f, 2, 0, {0}, false},
      {"rsqrt", X234, 0.5f, 2, 0, {0}, false},
      {"relu", X234, -1, 1, 0, {0}, false},
      {"sigmoid", X234, -3, 3, 0, {0}, false},
      {"silu", X234, -3, 3, 0, {0}, false},
      {"gelu", X234, -3, 3, 1, {.key = "approximate", .kind = SLAPO_ATTR_STR, .s = "tanh"}, false},
      {"gelu", X234, -3, 3, 1, {.key = "approximate", .kind = SLAPO_ATTR_STR, .s = "none"}, false},
  };
  bool have_sum_to = slapo_op_find("sum_to") != NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (have_sum_to || !cases[i].needs_sum_to) check_gradient(&cases[i]);
}

/* The rules reuse the forward value and emit the documented nodes. */
static void test_backward_structure(void **state) {
  opfix *f = *state;
  const int64_t s[] = {3};
  slapo_node *x = slapo_input(f->ctx, "x", SLAPO_DTYPE_F32, 1, s);
  slapo_node *dy = slapo_input(f->ctx, "dy", SLAPO_DTYPE_F32, 1, s);
  const bool need[2] = {true, true};
  slapo_node *dx[2] = {NULL, NULL};
  slapo_node *y = slapo_gelu(f->ctx, x, true);
  assert_ok(y->op->backward(f->ctx, y, dy, need, dx));
  assert_string_equal(dx[0]->target, "gelu_backward");
  assert_ptr_equal(dx[0]->inputs[0], x);
  assert_ptr_equal(dx[0]->inputs[1], dy);
  assert_string_equal(slapo_node_attr_str(dx[0], "approximate", ""), "tanh");
  y = slapo_exp(f->ctx, x);
  assert_ok(y->op->backward(f->ctx, y, dy, need, dx));
  assert_string_equal(dx[0]->target, "mul");
  assert_ptr_equal(dx[0]->inputs[1], y);
  y = slapo_add_scalar(f->ctx, x, 2);
  assert_ok(y->op->backward(f->ctx, y, dy, need, dx));
  assert_ptr_equal(dx[0], dy);
  /* need[i] == false leaves dx[i] alone. */
  const bool need_b[2] = {false, true};
  slapo_node *b = slapo_input(f->ctx, "b", SLAPO_DTYPE_F32, 1, s);
  dx[0] = dx[1] = NULL;
  y = slapo_mul(f->ctx, x, b);
  assert_ok(y->op->backward(f->ctx, y, dy, need_b, dx));
  assert_null(dx[0]);
  assert_non_null(dx[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_binary_same_shape, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_binary_broadcast, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_strided_inputs, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_scalar_ops, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_unary_values, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_activation_values, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_gelu_values, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fused_backward_values, opfix_setup, opfix_teardown),
      cmocka_unit_test(test_registry),
      cmocka_unit_test_setup_teardown(test_fast_vs_ref_unary, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_fast_vs_ref_binary, opfix_setup, opfix_teardown),
      cmocka_unit_test(test_gradients),
      cmocka_unit_test_setup_teardown(test_backward_structure, opfix_setup, opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
