/* tests/unit/test_ops_matmul.c - the matmul group ("matmul", "linear"):
 * shape inference, the reference GEMM against an independent per-element
 * oracle, the oneDNN fast path against the reference on GPT-2-like and odd
 * shapes, every trans combination, broadcast batch dims, strided views,
 * linear with and without bias, the primitive cache, and finite-difference
 * gradient checks of every trans/broadcast combination through the
 * table-driven harness (tests/common/gradcheck.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/gradcheck.h"
#include "slapo/ops/gemm.h"
#include "slapo/exec.h"
#include "slapo/ops.h"


/* ---- helpers ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1) from a 64-bit LCG (deterministic across runs). */
static float urand(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(g_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static slapo_tensor *rand_tensor(int ndim, const int64_t *shape) {
  slapo_tensor *t;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = urand();
  return t;
}

/* One op node over placeholders shaped like `in`, built in its own graph. */
typedef struct built {
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_node *node;
} built;

static built build(const char *op, int n, slapo_tensor *const *in, bool ta, bool tb) {
  built b;
  OK(slapo_graph_new(&b.g));
  OK(slapo_ctx_new(b.g, &b.ctx));
  slapo_node *x[3];
  for (int i = 0; i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    x[i] = slapo_input(b.ctx, name, SLAPO_DTYPE_F32, in[i]->ndim, in[i]->shape);
  }
  if (!strcmp(op, "matmul")) b.node = slapo_matmul(b.ctx, x[0], x[1], ta, tb);
  else b.node = slapo_linear(b.ctx, x[0], x[1], n == 3 ? x[2] : NULL);
  if (!b.node) fail_msg("build %s: %s", op, slapo_ctx_message(b.ctx));
  return b;
}

static void built_free(built *b) {
  slapo_ctx_free(b->ctx);
  slapo_graph_free(b->g);
}

/* Runs the node's reference or fast kernel directly on `in`. */
static slapo_tensor *run_kernel(const built *b, slapo_tensor *const *in, bool fast) {
  slapo_tensor *out;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, b->node->ndim, b->node->shape, &out));
  /* Poison: kernels must write every element. */
  float *p = slapo_tensor_data(out);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) p[i] = NAN;
  slapo_kernel_env env = {0};
  const slapo_tensor *const *cin = (const slapo_tensor *const *)in;
  if (fast) b->node->op->fast(b->node, cin, out, &env);
  else b->node->op->ref(b->node, cin, out, &env);
  return out;
}

/* Element (bi.., m, n) of op(a) @ op(b) (+ bias) computed from multi-index
 * reads, independent of ops/gemm: the oracle for the reference kernel. */
static double oracle(const slapo_tensor *a, bool ta, const slapo_tensor *b, bool tb,
                     const slapo_tensor *bias, int nd, const int64_t *idx) {
  int na = a->ndim, nb = b->ndim;
  int64_t K = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t ia[SLAPO_MAX_DIMS], ib[SLAPO_MAX_DIMS];
  for (int i = 0; i < na - 2; i++) {
    int j = i + (nd - na);
    ia[i] = a->shape[i] == 1 ? 0 : idx[j];
  }
  for (int i = 0; i < nb - 2; i++) {
    int j = i + (nd - nb);
    ib[i] = b->shape[i] == 1 ? 0 : idx[j];
  }
  int64_t m = idx[nd - 2], n = idx[nd - 1];
  double acc = 0;
  for (int64_t k = 0; k < K; k++) {
    ia[na - 2] = ta ? k : m, ia[na - 1] = ta ? m : k;
    ib[nb - 2] = tb ? n : k, ib[nb - 1] = tb ? k : n;
    acc += slapo_tensor_get(a, ia) * slapo_tensor_get(b, ib);
  }
  if (bias) acc += slapo_tensor_get(bias, &n);
  return acc;
}

/* Checks every element of `out` against the oracle to f32 rounding. */
static void check_oracle(const slapo_tensor *out, const slapo_tensor *a, bool ta,
                         const slapo_tensor *b, bool tb, const slapo_tensor *bias) {
  int nd = out->ndim;
  int64_t idx[SLAPO_MAX_DIMS] = {0};
  for (int64_t e = 0; e < slapo_tensor_numel(out); e++) {
    int64_t r = e;
    for (int d = nd - 1; d >= 0; d--) idx[d] = r % out->shape[d], r /= out->shape[d];
    double want = oracle(a, ta, b, tb, bias, nd, idx);
    double got = slapo_tensor_get(out, idx);
    if (fabs(got - want) > 1e-6 * (1 + fabs(want)))
      fail_msg("element %lld: got %.9g, want %.9g", (long long)e, got, want);
  }
}

/* max |fast - ref| <= tol * (1 + max |ref|), both contiguous. */
static void check_close(const slapo_tensor *fast, const slapo_tensor *ref, double tol,
                        const char *what) {
  double diff = 0, mag = 0;
  const float *f = slapo_tensor_data(fast), *r = slapo_tensor_data(ref);
  for (int64_t i = 0; i < slapo_tensor_numel(ref); i++) {
    double d = fabs((double)f[i] - (double)r[i]);
    if (!(d <= diff)) diff = d; /* NaN sticks */
    if (fabs(r[i]) > mag) mag = fabs(r[i]);
  }
  if (!(diff <= tol * (1 + mag)))
    fail_msg("%s: max |fast - ref| = %g (max |ref| %g, tol %g)", what, diff, mag, tol);
}

/* matmul of fresh random a and b: ref against the oracle (when `oracle_too`)
 * and fast against ref. */
static void check_matmul(int na, const int64_t *sa, int nb, const int64_t *sb, bool ta, bool tb,
                         bool oracle_too, double tol) {
  slapo_tensor *in[2] = {rand_tensor(na, sa), rand_tensor(nb, sb)};
  built b = build("matmul", 2, in, ta, tb);
  slapo_tensor *ref = run_kernel(&b, in, false), *fast = run_kernel(&b, in, true);
  if (oracle_too) check_oracle(ref, in[0], ta, in[1], tb, NULL);
  char sa_s[64], sb_s[64], what[200];
  snprintf(what, sizeof what, "matmul %s%s @ %s%s", slapo_shape_str(na, sa, sa_s, 64),
           ta ? "^T" : "", slapo_shape_str(nb, sb, sb_s, 64), tb ? "^T" : "");
  check_close(fast, ref, tol, what);
  slapo_tensor_free(ref);
  slapo_tensor_free(fast);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
  built_free(&b);
}

/* Large problems: the fast kernel computes all of C, the reference only
 * every `step`-th row of it (through a strided row slice of the operand
 * holding M: a's dim -2, or its dim -1 when trans_a), and the two are
 * compared on those rows. `op` is "matmul" or "linear" (then in[1] is w and
 * in[2] the optional bias). Keeps the GPT-2-sized checks fast under ASan. */
static void check_sampled(const char *op, int n_in, slapo_tensor *const *in, bool ta, bool tb,
                          int64_t step, double tol, const char *what) {
  built full = build(op, n_in, in, ta, tb);
  slapo_tensor *fast = run_kernel(&full, in, true);
  int dim = in[0]->ndim - (ta ? 1 : 2);
  slapo_tensor *rows, *part_in[3] = {NULL, in[1], n_in == 3 ? in[2] : NULL};
  OK(slapo_tensor_slice(in[0], dim, 0, in[0]->shape[dim], step, &rows));
  part_in[0] = rows;
  built part = build(op, n_in, part_in, ta, tb);
  slapo_tensor *ref = run_kernel(&part, part_in, false);
  int nd = ref->ndim;
  int64_t ms = ref->shape[nd - 2], m = fast->shape[nd - 2], n = ref->shape[nd - 1];
  int64_t nbatch = slapo_tensor_numel(ref) / (ms * n > 0 ? ms * n : 1);
  const float *f = slapo_tensor_data(fast), *r = slapo_tensor_data(ref);
  double diff = 0, mag = 0;
  for (int64_t bi = 0; bi < nbatch; bi++)
    for (int64_t i = 0; i < ms; i++)
      for (int64_t j = 0; j < n; j++) {
        double rv = r[(bi * ms + i) * n + j], fv = f[(bi * m + i * step) * n + j];
        double d = fabs(fv - rv);
        if (!(d <= diff)) diff = d;
        if (fabs(rv) > mag) mag = fabs(rv);
      }
  if (!(diff <= tol * (1 + mag)))
    fail_msg("%s: max |fast - ref| = %g on sampled rows (max |ref| %g, tol %g)", what, diff, mag,
             tol);
  slapo_tensor_free(fast);
  slapo_tensor_free(ref);
  slapo_tensor_free(rows);
  built_free(&full);
  built_free(&part);
}

static void check_matmul_sampled(int na, const int64_t *sa, int nb, const int64_t *sb, bool ta,
                                 bool tb, int64_t step, const char *what) {
  slapo_tensor *in[2] = {rand_tensor(na, sa), rand_tensor(nb, sb)};
  check_sampled("matmul", 2, in, ta, tb, step, 1e-5, what);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
}

/* ---- shape inference ---- */

static void test_infer(void **state) {
  (void)state;
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *a = slapo_input(ctx, "a", SLAPO_DTYPE_F32, 4, (int64_t[]){2, 1, 3, 4});
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 3, (int64_t[]){5, 4, 6});
  slapo_node *bt = slapo_input(ctx, "bt", SLAPO_DTYPE_F32, 2, (int64_t[]){6, 4});
  slapo_node *at = slapo_input(ctx, "at", SLAPO_DTYPE_F32, 2, (int64_t[]){4, 3});
  slapo_node *c = slapo_matmul(ctx, a, b, false, false);
  assert_non_null(c);
  assert_true(slapo_shape_equal(c->ndim, c->shape, 4, (int64_t[]){2, 5, 3, 6}));
  /* Only set flags become attributes. */
  assert_int_equal(c->n_attrs, 0);
  slapo_node *d = slapo_matmul(ctx, a, bt, false, true);
  assert_true(slapo_shape_equal(d->ndim, d->shape, 4, (int64_t[]){2, 1, 3, 6}));
  assert_int_equal(slapo_node_attr_int(d, "trans_b", 0), 1);
  assert_null(slapo_node_attr(d, "trans_a"));
  slapo_node *e = slapo_matmul(ctx, at, bt, true, true);
  assert_true(slapo_shape_equal(e->ndim, e->shape, 2, (int64_t[]){3, 6}));

  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
  slapo_node *x1 = slapo_input(ctx, "x1", SLAPO_DTYPE_F32, 1, (int64_t[]){4});
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, (int64_t[]){7, 4});
  slapo_node *bias = slapo_input(ctx, "bias", SLAPO_DTYPE_F32, 1, (int64_t[]){7});
  slapo_node *y = slapo_linear(ctx, x, w, bias);
  assert_true(slapo_shape_equal(y->ndim, y->shape, 3, (int64_t[]){2, 3, 7}));
  assert_int_equal(y->n_inputs, 3);
  slapo_node *y2 = slapo_linear(ctx, x1, w, NULL);
  assert_string_equal(y2->target, "linear");
  assert_int_equal(y2->n_inputs, 2);
  assert_true(slapo_shape_equal(y2->ndim, y2->shape, 1, (int64_t[]){7}));
  OK(slapo_ctx_status(ctx));
  OK(slapo_graph_lint(g));
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

/* ---- reference GEMM against the oracle, fast against reference ---- */

static void test_trans_combos(void **state) {
  (void)state;
  /* M=7, K=13, N=5 in every storage order, plain and batched. */
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      int64_t sa[2] = {ta ? 13 : 7, ta ? 7 : 13}, sb[2] = {tb ? 5 : 13, tb ? 13 : 5};
      check_matmul(2, sa, 2, sb, ta, tb, true, 1e-5);
      int64_t sa3[3] = {3, sa[0], sa[1]}, sb3[3] = {3, sb[0], sb[1]};
      check_matmul(3, sa3, 3, sb3, ta, tb, true, 1e-5);
      check_matmul(3, sa3, 2, sb, ta, tb, true, 1e-5);
      check_matmul(2, sa, 3, sb3, ta, tb, true, 1e-5);
    }
  }
}

static void test_batch_broadcast(void **state) {
  (void)state;
  /* Batch dims that broadcast from either side, with and without trans. */
  check_matmul(4, (int64_t[]){2, 3, 4, 5}, 3, (int64_t[]){3, 5, 6}, false, false, true, 1e-5);
  check_matmul(3, (int64_t[]){1, 4, 5}, 3, (int64_t[]){2, 5, 6}, false, false, true, 1e-5);
  check_matmul(4, (int64_t[]){2, 1, 4, 5}, 4, (int64_t[]){1, 3, 6, 5}, false, true, true, 1e-5);
  check_matmul(2, (int64_t[]){5, 4}, 4, (int64_t[]){2, 3, 5, 6}, true, false, true, 1e-5);
  check_matmul(5, (int64_t[]){2, 1, 3, 1, 4}, 3, (int64_t[]){3, 4, 6}, false, false, true,
               1e-5);
  /* M, N or K of 1 (vector-like operands). */
  check_matmul(3, (int64_t[]){3, 1, 9}, 2, (int64_t[]){9, 4}, false, false, true, 1e-5);
  check_matmul(3, (int64_t[]){3, 9, 1}, 2, (int64_t[]){4, 9}, true, true, true, 1e-5);
  check_matmul(2, (int64_t[]){6, 1}, 2, (int64_t[]){1, 7}, false, false, true, 1e-5);
  check_matmul(2, (int64_t[]){6, 9}, 3, (int64_t[]){2, 9, 1}, false, false, true, 1e-5);
}

static void test_odd_shapes(void **state) {
  (void)state;
  /* Sizes around SIMD and tile widths, the reference's 256-column tile. */
  int64_t ms[] = {1, 17, 63}, ks[] = {31, 130}, ns[] = {1, 33, 257};
  for (size_t i = 0; i < 3; i++)
    for (size_t j = 0; j < 2; j++)
      for (size_t l = 0; l < 3; l++)
        check_matmul(2, (int64_t[]){ms[i], ks[j]}, 2, (int64_t[]){ks[j], ns[l]}, false, false,
                     ms[i] * ns[l] < 2000, 1e-5);
  check_matmul(3, (int64_t[]){5, 37, 129}, 3, (int64_t[]){5, 41, 129}, false, true, false, 1e-5);
}

/* GPT-2 small shapes (B*T = 4*64 rows, C = 768, NH = 12 heads of HS = 64):
 * c_attn, c_proj, c_fc as trans_b products the way a Linear stores its
 * weight [out, in], the attention scores and values, and a weight gradient
 * x^T @ dy. The reference checks every 16th row or every 8th attention
 * row (check_sampled). */
static void test_gpt2_shapes(void **state) {
  (void)state;
  check_matmul_sampled(2, (int64_t[]){256, 768}, 2, (int64_t[]){2304, 768}, false, true, 16,
                       "c_attn [256, 768] @ [2304, 768]^T");
  check_matmul_sampled(3, (int64_t[]){4, 64, 768}, 2, (int64_t[]){768, 768}, false, false, 16,
                       "c_proj [4, 64, 768] @ [768, 768]");
  check_matmul_sampled(2, (int64_t[]){256, 768}, 2, (int64_t[]){3072, 768}, false, true, 16,
                       "c_fc [256, 768] @ [3072, 768]^T");
  check_matmul_sampled(4, (int64_t[]){4, 12, 64, 64}, 4, (int64_t[]){4, 12, 64, 64}, false, true,
                       8, "q @ k^T [4, 12, 64, 64]");
  check_matmul_sampled(4, (int64_t[]){4, 12, 64, 64}, 4, (int64_t[]){4, 12, 64, 64}, false,
                       false, 8, "att @ v [4, 12, 64, 64]");
  check_matmul_sampled(2, (int64_t[]){256, 768}, 2, (int64_t[]){256, 512}, true, false, 16,
                       "dW = x^T @ dy [256, 768]^T @ [256, 512]");
}

/* Strided inputs: views made by permute and slice go into the kernels as is
 * (contiguous_inputs is false). */
static void test_strided_views(void **state) {
  (void)state;
  /* q, k [B, T, NH, HS] viewed as [B, NH, T, HS]: batch strides that are
   * not the dense ones, inner stride 1. */
  int64_t s4[4] = {2, 9, 3, 8};
  slapo_tensor *qs = rand_tensor(4, s4), *ks = rand_tensor(4, s4), *q, *k;
  OK(slapo_tensor_permute(qs, (int[]){0, 2, 1, 3}, &q));
  OK(slapo_tensor_permute(ks, (int[]){0, 2, 1, 3}, &k));
  /* A column slice: rows of stride 8 holding 5 elements. */
  slapo_tensor *ws = rand_tensor(2, (int64_t[]){8, 8}), *w, *wt;
  OK(slapo_tensor_slice(ws, 1, 1, 6, 1, &w)); /* [8, 5] */
  /* A transposed view where neither inner stride is 1 after a step slice. */
  slapo_tensor *wstep;
  OK(slapo_tensor_slice(ws, 1, 0, 8, 2, &wstep)); /* [8, 4], strides [8, 2] */
  OK(slapo_tensor_permute(w, (int[]){1, 0}, &wt)); /* [5, 8] */

  struct {
    slapo_tensor *a, *b;
    bool ta, tb;
  } cases[] = {{q, k, false, true}, {q, w, false, false}, {q, wt, false, true},
               {wt, ws, false, false}, {q, wstep, false, false}, {wstep, q, true, true}};
  for (size_t i = 0; i < (sizeof cases / sizeof cases[0]); i++) {
    slapo_tensor *in[2] = {cases[i].a, cases[i].b};
    built b = build("matmul", 2, in, cases[i].ta, cases[i].tb);
    slapo_tensor *ref = run_kernel(&b, in, false), *fast = run_kernel(&b, in, true);
    check_oracle(ref, in[0], cases[i].ta, in[1], cases[i].tb, NULL);
    check_close(fast, ref, 1e-5, "strided view");
    slapo_tensor_free(ref);
    slapo_tensor_free(fast);
    built_free(&b);
  }
  slapo_tensor *all[] = {qs, ks, q, k, ws, w, wt, wstep};
  for (size_t i = 0; i < (sizeof all / sizeof all[0]); i++) slapo_tensor_free(all[i]);
}

/* K = 0 gives zeros (plus the bias); an empty M or batch writes nothing. */
static void test_empty(void **state) {
  (void)state;
  slapo_tensor *in[3] = {rand_tensor(3, (int64_t[]){2, 3, 0}), rand_tensor(2, (int64_t[]){4, 0}),
                         rand_tensor(1, (int64_t[]){4})};
  built b = build("linear", 3, in, false, false);
  for (int fast = 0; fast < 2; fast++) {
    slapo_tensor *y = run_kernel(&b, in, fast);
    const float *p = slapo_tensor_data(y), *bias = slapo_tensor_data(in[2]);
    for (int i = 0; i < 24; i++) assert_true(p[i] == bias[i % 4]);
    slapo_tensor_free(y);
  }
  built_free(&b);
  built m = build("matmul", 2, in, false, true);
  for (int fast = 0; fast < 2; fast++) {
    slapo_tensor *y = run_kernel(&m, in, fast);
    const float *p = slapo_tensor_data(y);
    for (int i = 0; i < 24; i++) assert_true(p[i] == 0.0f);
    slapo_tensor_free(y);
  }
  built_free(&m);
  for (int i = 0; i < 3; i++) slapo_tensor_free(in[i]);
  check_matmul(3, (int64_t[]){0, 3, 4}, 2, (int64_t[]){4, 5}, false, false, false, 1e-5);
  check_matmul(2, (int64_t[]){0, 4}, 2, (int64_t[]){4, 5}, false, false, false, 1e-5);
}

/* ---- linear ---- */

static void check_linear(int nx, const int64_t *sx, int64_t out, bool with_bias, bool oracle_too,
                         double tol) {
  int64_t in_f = sx[nx - 1];
  slapo_tensor *in[3] = {rand_tensor(nx, sx), rand_tensor(2, (int64_t[]){out, in_f}),
                         with_bias ? rand_tensor(1, &out) : NULL};
  built b = build("linear", with_bias ? 3 : 2, in, false, false);
  slapo_tensor *ref = run_kernel(&b, in, false), *fast = run_kernel(&b, in, true);
  if (oracle_too) {
    /* x [.., in] @ w^T: a 1-d x is one row. */
    slapo_tensor *x2 = NULL, *y2 = NULL;
    const slapo_tensor *xa = in[0], *ya = ref;
    if (nx == 1) {
      OK(slapo_tensor_reshape(in[0], 2, (int64_t[]){1, in_f}, &x2));
      OK(slapo_tensor_reshape(ref, 2, (int64_t[]){1, out}, &y2));
      xa = x2, ya = y2;
    }
    check_oracle(ya, xa, false, in[1], true, in[2]);
    slapo_tensor_free(x2);
    slapo_tensor_free(y2);
  }
  check_close(fast, ref, tol, "linear");
  slapo_tensor_free(ref);
  slapo_tensor_free(fast);
  for (int i = 0; i < 3; i++) slapo_tensor_free(in[i]);
  built_free(&b);
}

static void test_linear(void **state) {
  (void)state;
  for (int bias = 0; bias < 2; bias++) {
    check_linear(3, (int64_t[]){2, 3, 4}, 5, bias, true, 1e-5);
    check_linear(2, (int64_t[]){7, 33}, 9, bias, true, 1e-5);
    check_linear(1, (int64_t[]){6}, 3, bias, true, 1e-5);
    check_linear(4, (int64_t[]){2, 2, 3, 5}, 1, bias, true, 1e-5);
    /* GPT-2 c_fc on B*T = 4*64 rows, every 16th row checked. */
    slapo_tensor *in[3] = {rand_tensor(3, (int64_t[]){4, 64, 768}),
                           rand_tensor(2, (int64_t[]){3072, 768}),
                           bias ? rand_tensor(1, (int64_t[]){3072}) : NULL};
    check_sampled("linear", bias ? 3 : 2, in, false, false, 16, 1e-5, "linear c_fc");
    for (int i = 0; i < 3; i++) slapo_tensor_free(in[i]);
  }
}

/* linear(x, w, b) equals matmul(x, w, trans_b) plus b, through the fast
 * path too (oneDNN's bias argument). */
static void test_linear_matches_matmul(void **state) {
  (void)state;
  slapo_tensor *in[3] = {rand_tensor(3, (int64_t[]){3, 5, 40}), rand_tensor(2, (int64_t[]){24, 40}),
                         rand_tensor(1, (int64_t[]){24})};
  built l = build("linear", 3, in, false, false), m = build("matmul", 2, in, false, true);
  for (int fast = 0; fast < 2; fast++) {
    slapo_tensor *y = run_kernel(&l, in, fast), *z = run_kernel(&m, in, fast);
    const float *py = slapo_tensor_data(y), *pz = slapo_tensor_data(z),
                *pb = slapo_tensor_data(in[2]);
    for (int i = 0; i < 3 * 5 * 24; i++) assert_true(fabsf(py[i] - (pz[i] + pb[i % 24])) < 1e-5f);
    slapo_tensor_free(y);
    slapo_tensor_free(z);
  }
  built_free(&l);
  built_free(&m);
  for (int i = 0; i < 3; i++) slapo_tensor_free(in[i]);
}

/* A weight given as a transposed view (w^T stored [in, out]) and a bias
 * read with stride 2: the strides go into the GEMM, also for the bias. */
static void test_linear_strided(void **state) {
  (void)state;
  slapo_tensor *x = rand_tensor(3, (int64_t[]){2, 5, 12}), *wt = rand_tensor(2, (int64_t[]){12, 9});
  slapo_tensor *b2 = rand_tensor(1, (int64_t[]){18}), *w, *b;
  OK(slapo_tensor_permute(wt, (int[]){1, 0}, &w)); /* [9, 12], strides [1, 9] */
  OK(slapo_tensor_slice(b2, 0, 0, 18, 2, &b));      /* [9], stride 2 */
  slapo_tensor *in[3] = {x, w, b};
  built l = build("linear", 3, in, false, false);
  slapo_tensor *ref = run_kernel(&l, in, false), *fast = run_kernel(&l, in, true);
  check_oracle(ref, x, false, w, true, b);
  check_close(fast, ref, 1e-5, "linear with strided w and b");
  slapo_tensor_free(ref);
  slapo_tensor_free(fast);
  built_free(&l);
  slapo_tensor *all[] = {x, wt, b2, w, b};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) slapo_tensor_free(all[i]);
}

/* ---- the primitive cache and determinism ---- */

static void test_cache_and_determinism(void **state) {
  (void)state;
  slapo_tensor *in[2] = {rand_tensor(3, (int64_t[]){3, 50, 70}),
                         rand_tensor(2, (int64_t[]){70, 90})};
  built b = build("matmul", 2, in, false, false);
  slapo_tensor *y0 = run_kernel(&b, in, true);
  int n0 = slapo__gemm_dnnl_cache_count();
  assert_true(n0 >= 1);
  for (int i = 0; i < 3; i++) {
    slapo_tensor *y = run_kernel(&b, in, true);
    assert_true(slapo_tensor_equal(y, y0)); /* bitwise, same thread count */
    slapo_tensor_free(y);
  }
  assert_int_equal(slapo__gemm_dnnl_cache_count(), n0);
  /* [3, 50, 70] @ [70, 90] folds to one [150, 70] @ [70, 90] GEMM: the same
   * primitive serves a [150, 70] input. */
  slapo_tensor *in2[2] = {rand_tensor(2, (int64_t[]){150, 70}), in[1]};
  built b2 = build("matmul", 2, in2, false, false);
  slapo_tensor *y2 = run_kernel(&b2, in2, true);
  assert_int_equal(slapo__gemm_dnnl_cache_count(), n0);
  slapo_tensor_free(y2);
  slapo_tensor_free(in2[0]);
  built_free(&b2);
  slapo_tensor_free(y0);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
  built_free(&b);
}

/* C = op(A) @ B (+ bias) through the GEMM fast path directly, against the
 * reference, with C poisoned first: every element written, bitwise equal
 * on a rerun. */
static void check_gemm_direct(int64_t M, int64_t K, int64_t N, bool ta, bool with_bias) {
  slapo_tensor *a = rand_tensor(2, ta ? (int64_t[]){K, M} : (int64_t[]){M, K});
  slapo_tensor *b = rand_tensor(2, (int64_t[]){K, N});
  slapo_tensor *bias = with_bias ? rand_tensor(1, (int64_t[]){N}) : NULL, *c[3];
  for (int i = 0; i < 3; i++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){M, N}, &c[i]));
    float *p = slapo_tensor_data(c[i]);
    for (int64_t e = 0; e < M * N; e++) p[e] = NAN;
    slapo__gemm g;
    slapo__gemm_init(&g, a, ta, b, false, bias, c[i]);
    if (i == 0) slapo__gemm_ref(&g);
    else assert_true(slapo__gemm_dnnl(&g));
  }
  char what[96];
  snprintf(what, sizeof what, "gemm M %lld K %lld N %lld%s%s with %d threads", (long long)M,
           (long long)K, (long long)N, ta ? " A^T" : "", with_bias ? " + bias" : "",
           omp_get_max_threads());
  check_close(c[1], c[0], 1e-5, what);
  assert_true(slapo_tensor_equal(c[1], c[2]));
  for (int i = 0; i < 3; i++) slapo_tensor_free(c[i]);
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  slapo_tensor_free(bias);
}

/* 2-D GEMMs that the fast path hands out to its threads, one single-thread
 * primitive each (gemm_dnnl.c): by columns (A plain, or A^T with M < N) and
 * by rows (A^T with M >= N), with shares that end short of the 16-column
 * rounding, a bias offset with the columns, and 2 and 3 threads; and the
 * forward layout, which oneDNN splits itself. */
static void test_thread_split(void **state) {
  (void)state;
  int saved = omp_get_max_threads();
  for (int t = 2; t <= 3; t++) {
    omp_set_num_threads(t);
    check_gemm_direct(200, 96, 520, false, true);  /* columns, bias */
    check_gemm_direct(150, 64, 700, true, false);  /* A^T, M < N: columns */
    check_gemm_direct(600, 96, 260, true, false);  /* A^T, M >= N: rows */
    check_gemm_direct(601, 33, 290, true, true);   /* rows, odd M, bias */
    check_matmul(2, (int64_t[]){130, 96}, 2, (int64_t[]){530, 96}, false, true, false, 1e-5);
  }
  omp_set_num_threads(saved);
}

/* More distinct problems than the cache holds: entries are evicted and
 * recreated, results stay right. */
static void test_cache_eviction(void **state) {
  (void)state;
  for (int64_t n = 1; n <= 150; n++)
    check_matmul(2, (int64_t[]){3, 4}, 2, (int64_t[]){4, n}, false, false, false, 1e-5);
  assert_true(slapo__gemm_dnnl_cache_count() <= 128);
  check_matmul(2, (int64_t[]){3, 4}, 2, (int64_t[]){4, 1}, false, false, true, 1e-5);
}

/* Several threads running the same problem at once: one gets the cached
 * primitive, the others build their own for the call; all results equal
 * the single-threaded one bit for bit. */
typedef struct worker {
  const built *b;
  slapo_tensor *const *in;
  const slapo_tensor *want;
  int bad;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  for (int i = 0; i < 20; i++) {
    slapo_tensor *out;
    if (slapo_tensor_new(SLAPO_DTYPE_F32, w->b->node->ndim, w->b->node->shape, &out) != SLAPO_OK)
      return NULL;
    slapo_kernel_env env = {0};
    w->b->node->op->fast(w->b->node, (const slapo_tensor *const *)w->in, out, &env);
    w->bad += !slapo_tensor_equal(out, w->want);
    slapo_tensor_free(out);
  }
  return NULL;
}

static void test_concurrent_callers(void **state) {
  (void)state;
  slapo_tensor *in[2] = {rand_tensor(2, (int64_t[]){33, 65}), rand_tensor(2, (int64_t[]){65, 17})};
  built b = build("matmul", 2, in, false, false);
  slapo_tensor *want = run_kernel(&b, in, true);
  worker w[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    w[i] = (worker){&b, in, want, 0};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].bad, 0);
  }
  slapo_tensor_free(want);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
  built_free(&b);
}

/* ---- eager (through the executor) ---- */

static void test_eager(void **state) {
  (void)state;
  slapo_tensor *in[2] = {rand_tensor(3, (int64_t[]){2, 3, 4}), rand_tensor(2, (int64_t[]){5, 4})};
  slapo_attr tb = slapo_attr_int("trans_b", 1);
  slapo_tensor *y;
  OK(slapo_eager("matmul", 2, (const slapo_tensor *const *)in, 1, &tb, NULL, NULL, &y));
  assert_true(slapo_shape_equal(y->ndim, y->shape, 3, (int64_t[]){2, 3, 5}));
  check_oracle(y, in[0], false, in[1], true, NULL);
  slapo_tensor_free(y);
  OK(slapo_eager("linear", 2, (const slapo_tensor *const *)in, 0, NULL, NULL, NULL, &y));
  check_oracle(y, in[0], false, in[1], true, NULL);
  slapo_tensor_free(y);
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
}

/* ---- gradients: every trans combination through the harness ---- */

/* The harness checks an op through its test.example; these variants of the
 * matmul descriptor change only the example. */
static bool g_ta, g_tb;
static int g_shape_case;

static slapo_node *variant_example(slapo_ctx *ctx) {
  /* Logical a [.., 3, 4] @ b [.., 4, 5] with batch dims per case ({count,
   * dims..}): none; equal [2]; a [2, 3] against a 2-d b (the shared-weight
   * form of the backward); a [2, 1] against b [3], broadcast both ways. */
  static const int64_t batch_a[][3] = {{0}, {1, 2}, {2, 2, 3}, {2, 2, 1}};
  static const int64_t batch_b[][3] = {{0}, {1, 2}, {0}, {1, 3}};
  int64_t sa[4], sb[4];
  int na = (int)batch_a[g_shape_case][0], nb = (int)batch_b[g_shape_case][0];
  for (int i = 0; i < na; i++) sa[i] = batch_a[g_shape_case][1 + i];
  for (int i = 0; i < nb; i++) sb[i] = batch_b[g_shape_case][1 + i];
  sa[na] = g_ta ? 4 : 3, sa[na + 1] = g_ta ? 3 : 4;
  sb[nb] = g_tb ? 5 : 4, sb[nb + 1] = g_tb ? 4 : 5;
  slapo_node *a = slapo_input(ctx, "a", SLAPO_DTYPE_F32, na + 2, sa);
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, nb + 2, sb);
  return slapo_matmul(ctx, a, b, g_ta, g_tb);
}

static slapo_node *linear_nobias_example(slapo_ctx *ctx) {
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, (int64_t[]){5, 4});
  return slapo_linear(ctx, x, w, NULL);
}

static slapo_node *linear_vec_example(slapo_ctx *ctx) {
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, (int64_t[]){4});
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, (int64_t[]){5, 4});
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, (int64_t[]){5});
  return slapo_linear(ctx, x, w, b);
}

static void gradcheck_variant(const char *name, slapo_example_fn ex, const char *what) {
  slapo_op op = *slapo_op_find(name);
  op.test.example = ex;
  char report[512] = "";
  slapo_status s = gradcheck_op(&op, 7, report, sizeof report);
  /* gradcheck_op runs the check with reference and again with fast
   * kernels, so the oneDNN path of every backward product is covered. */
  if (s != SLAPO_OK) fail_msg("gradcheck %s: %s: %s", what, slapo_status_name(s), report);
}

static void test_gradcheck_matmul_variants(void **state) {
  (void)state;
  for (g_shape_case = 0; g_shape_case < 4; g_shape_case++) {
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        g_ta = ta, g_tb = tb;
        char what[64];
        snprintf(what, sizeof what, "shape case %d, trans_a=%d trans_b=%d", g_shape_case, ta, tb);
        gradcheck_variant("matmul", variant_example, what);
      }
    }
  }
}

static void test_gradcheck_linear_variants(void **state) {
  (void)state;
  gradcheck_variant("linear", linear_nobias_example, "linear without bias");
  gradcheck_variant("linear", linear_vec_example, "linear of a vector");
  gradcheck_variant("linear", slapo_op_find("linear")->test.example, "linear");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_infer),
      cmocka_unit_test(test_trans_combos),
      cmocka_unit_test(test_batch_broadcast),
      cmocka_unit_test(test_odd_shapes),
      cmocka_unit_test(test_gpt2_shapes),
      cmocka_unit_test(test_strided_views),
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_linear_matches_matmul),
      cmocka_unit_test(test_linear_strided),
      cmocka_unit_test(test_cache_and_determinism),
      cmocka_unit_test(test_thread_split),
      cmocka_unit_test(test_cache_eviction),
      cmocka_unit_test(test_concurrent_callers),
      cmocka_unit_test(test_eager),
      cmocka_unit_test(test_gradcheck_matmul_variants),
      cmocka_unit_test(test_gradcheck_linear_variants),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
