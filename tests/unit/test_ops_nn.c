/* tests/unit/test_ops_nn.c - the nn op group (softmax, layer_norm, rms_norm,
 * embedding, index_add, dropout, cross_entropy and their fused backward ops)
 * run through their kernels directly: hand-computed values, masks and edge
 * rows, numerical stability, dropout mask properties, fast == ref, and each
 * fused backward kernel against central differences of its forward's
 * reference kernel. Outputs are pre-filled with NaN so an unwritten element
 * shows up. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "slapo/ops.h"


static const slapo_kernel_env k_train = {.seed = 1234, .step = 7, .training = true};

/* ---- helpers ---- */

typedef struct fx {
  slapo_graph *g;
  slapo_ctx *ctx;
} fx;

static fx fx_new(void) {
  fx f;
  OK(slapo_graph_new(&f.g));
  OK(slapo_ctx_new(f.g, &f.ctx));
  return f;
}

static void fx_free(fx *f) {
  assert_int_equal(slapo_ctx_status(f->ctx), SLAPO_OK);
  OK(slapo_graph_lint(f->g));
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
}

static slapo_node *in_f32(fx *f, const char *name, int ndim, const int64_t *shape) {
  slapo_node *n = slapo_input(f->ctx, name, SLAPO_DTYPE_F32, ndim, shape);
  assert_non_null(n);
  return n;
}

static slapo_tensor *tensor(slapo_dtype dt, int ndim, const int64_t *shape, const void *data) {
  slapo_tensor *t;
  if (data) OK(slapo_tensor_from_data(dt, ndim, shape, data, &t));
  else OK(slapo_tensor_new(dt, ndim, shape, &t));
  return t;
}

/* Deterministic pseudo-random f32 tensor with values in [lo, hi). */
static slapo_tensor *random_f32(int ndim, const int64_t *shape, float lo, float hi,
                                uint64_t stream) {
  slapo_tensor *t = tensor(SLAPO_DTYPE_F32, ndim, shape, NULL);
  float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++)
    d[i] = lo + (hi - lo) * slapo_rng_uniform(99, stream, 0, (uint64_t)i);
  return t;
}

static float *F(const slapo_tensor *t) { return slapo_tensor_data(t); }

/* Runs node's reference (fast = false) or fast kernel on `in` into a new
 * NaN-filled output of the node's shape. Owned result. */
static slapo_tensor *run(const slapo_node *n, slapo_tensor *const *in, bool fast,
                         const slapo_kernel_env *env) {
  slapo_tensor *out = tensor(n->dtype, n->ndim, n->shape, NULL);
  memset(slapo_tensor_data(out), 0xff, slapo_tensor_nbytes(out)); /* NaN */
  slapo_kernel_fn k = fast && n->op->fast ? n->op->fast : n->op->ref;
  k(n, (const slapo_tensor *const *)in, out, env);
  return out;
}

/* Reference output, after checking that the fast kernel agrees within
 * atol + rtol * |ref| and writes every element. */
static slapo_tensor *run_both(const slapo_node *n, slapo_tensor *const *in, double atol,
                              const slapo_kernel_env *env) {
  slapo_tensor *ref = run(n, in, false, env);
  slapo_tensor *fast = run(n, in, true, env);
  for (int64_t i = 0; i < slapo_tensor_numel(ref); i++) {
    double r = F(ref)[i], q = F(fast)[i];
    if (!(fabs(r - q) <= atol * (1 + fabs(r))))
      fail_msg("%s: element %lld: ref %.9g fast %.9g", n->target, (long long)i, r, q);
  }
  slapo_tensor_free(fast);
  return ref;
}

static void free_all(slapo_tensor **ts, int n) {
  for (int i = 0; i < n; i++) slapo_tensor_free(ts[i]);
}

static void assert_close(double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) fail_msg("got %.9g, want %.9g (tol %g)", got, want, tol);
}

/* Central-difference gradient of sum(fwd(in) * g) w.r.t. in[which], with the
 * forward's reference kernel; the step actually taken is measured in f32. */
static void fd_grad(const slapo_node *fwd, slapo_tensor *const *in, int which, const float *g,
                    const slapo_kernel_env *env, double *grad) {
  float *x = F(in[which]);
  for (int64_t j = 0; j < slapo_tensor_numel(in[which]); j++) {
    float save = x[j];
    double lp = 0, lm = 0;
    x[j] = save + 1e-3f;
    float xp = x[j];
    slapo_tensor *o = run(fwd, in, false, env);
    for (int64_t i = 0; i < slapo_tensor_numel(o); i++) lp += (double)F(o)[i] * g[i];
    slapo_tensor_free(o);
    x[j] = save - 1e-3f;
    float xm = x[j];
    o = run(fwd, in, false, env);
    for (int64_t i = 0; i < slapo_tensor_numel(o); i++) lm += (double)F(o)[i] * g[i];
    slapo_tensor_free(o);
    x[j] = save;
    grad[j] = (lp - lm) / ((double)xp - xm);
  }
}

static void assert_grad(const slapo_tensor *got, const double *want, double tol) {
  for (int64_t i = 0; i < slapo_tensor_numel(got); i++)
    if (!(fabs(F(got)[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("gradient element %lld: kernel %.7g, finite difference %.7g", (long long)i,
               F(got)[i], want[i]);
}

/* ---- softmax ---- */

static void test_softmax_values(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {2, 3};
  slapo_node *y = slapo_softmax(f.ctx, in_f32(&f, "x", 2, s), false);
  assert_non_null(y);
  assert_string_equal(y->op->name, "softmax");
  float xv[6] = {1, 2, 3, -1, -1, -1};
  slapo_tensor *in[1] = {tensor(SLAPO_DTYPE_F32, 2, s, xv)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train);
  const double want[6] = {0.090030573, 0.244728471, 0.665240956, 1 / 3.0, 1 / 3.0, 1 / 3.0};
  for (int i = 0; i < 6; i++) assert_close(F(o)[i], want[i], 1e-7);
  slapo_tensor_free(o);
  free_all(in, 1);
  fx_free(&f);
}

static void test_softmax_rows_sum_to_one(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[3] = {4, 16, 600}; /* 38400 elements: the fast kernel uses threads */
  slapo_node *y = slapo_softmax(f.ctx, in_f32(&f, "x", 3, s), false);
  slapo_tensor *in[1] = {random_f32(3, s, -8, 8, 1)};
  slapo_tensor *o = run_both(y, in, 1e-5, &k_train);
  for (int64_t r = 0; r < 4 * 16; r++) {
    double sum = 0;
    for (int64_t c = 0; c < 600; c++) {
      assert_true(F(o)[r * 600 + c] > 0);
      sum += F(o)[r * 600 + c];
    }
    assert_close(sum, 1.0, 1e-5);
  }
  slapo_tensor_free(o);
  free_all(in, 1);
  fx_free(&f);
}

/* Checks a causal softmax of x [B, T, S]: row t sees s <= t + S - T and its
 * visible part is the plain softmax of those entries; other entries are 0. */
static void check_causal(int64_t B, int64_t T, int64_t S) {
  fx f = fx_new();
  int64_t s[3] = {B, T, S};
  slapo_node *y = slapo_softmax(f.ctx, in_f32(&f, "x", 3, s), true);
  assert_non_null(y);
  slapo_tensor *in[1] = {random_f32(3, s, -3, 3, 2)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      const float *xr = F(in[0]) + (b * T + t) * S, *yr = F(o) + (b * T + t) * S;
      int64_t last = t + S - T; /* last visible key */
      double m = -INFINITY, se = 0;
      for (int64_t k = 0; k <= last && k < S; k++) m = fmax(m, xr[k]);
      for (int64_t k = 0; k <= last && k < S; k++) se += exp(xr[k] - m);
      for (int64_t k = 0; k < S; k++) {
        assert_false(isnan(yr[k]));
        if (k > last) assert_true(yr[k] == 0.0f);
        else assert_close(yr[k], exp(xr[k] - m) / se, 1e-6);
      }
    }
  }
  slapo_tensor_free(o);
  free_all(in, 1);
  fx_free(&f);
}

static void test_softmax_causal(void **state) {
  (void)state;
  check_causal(2, 4, 4); /* square: lower triangle */
  check_causal(2, 3, 5); /* T < S: every query also sees the S - T prefix */
  check_causal(1, 5, 3); /* T > S: the first two rows are fully masked */
  /* The fully masked rows are exactly zero. */
  fx f = fx_new();
  int64_t s[2] = {5, 3};
  slapo_node *y = slapo_softmax(f.ctx, in_f32(&f, "x", 2, s), true);
  slapo_tensor *in[1] = {random_f32(2, s, -1, 1, 3)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train);
  for (int i = 0; i < 6; i++) assert_true(F(o)[i] == 0.0f);
  assert_close(F(o)[6], 1.0, 0); /* row 2 sees only key 0 */
  slapo_tensor_free(o);
  free_all(in, 1);
  fx_free(&f);
}

static void test_softmax_stable(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {3, 3};
  slapo_node *y = slapo_softmax(f.ctx, in_f32(&f, "x", 2, s), false);
  float xv[9] = {1e4f, 1e4f - 1, -1e4f, -1e4f, -1e4f, -1e4f,
                 -INFINITY, -INFINITY, -INFINITY}; /* last row: all masked by -inf */
  slapo_tensor *in[1] = {tensor(SLAPO_DTYPE_F32, 2, s, xv)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train);
  double e = exp(-1.0);
  assert_close(F(o)[0], 1 / (1 + e), 1e-6);
  assert_close(F(o)[1], e / (1 + e), 1e-6);
  assert_true(F(o)[2] == 0.0f);
  for (int i = 3; i < 6; i++) assert_close(F(o)[i], 1 / 3.0, 1e-6);
  for (int i = 6; i < 9; i++) assert_true(F(o)[i] == 0.0f);
  slapo_tensor_free(o);
  free_all(in, 1);
  fx_free(&f);
}

static void test_softmax_backward_matches_fd(void **state) {
  (void)state;
  for (int causal = 0; causal < 2; causal++) {
    fx f = fx_new();
    int64_t s[3] = {2, 3, 5};
    slapo_node *x = in_f32(&f, "x", 3, s), *g = in_f32(&f, "g", 3, s);
    slapo_node *y = slapo_softmax(f.ctx, x, causal);
    bool need[1] = {true};
    slapo_node *dx[1];
    OK(y->op->backward(f.ctx, y, g, need, dx));
    assert_string_equal(dx[0]->op->name, "softmax_backward");
    slapo_tensor *in[2] = {random_f32(3, s, -2, 2, 4), random_f32(3, s, -1, 1, 5)};
    slapo_tensor *yv = run(y, in, false, &k_train);
    slapo_tensor *bin[2] = {yv, in[1]};
    slapo_tensor *got = run_both(dx[0], bin, 1e-6, &k_train);
    double want[30];
    fd_grad(y, in, 0, F(in[1]), &k_train, want);
    assert_grad(got, want, 2e-3);
    /* Row t = 0 sees s <= 0 + (S - T) = 2: entries 3 and 4 are masked. */
    if (causal) assert_true(F(got)[3] == 0.0f && F(got)[4] == 0.0f);
    slapo_tensor_free(got);
    slapo_tensor_free(yv);
    free_all(in, 2);
    fx_free(&f);
  }
}

/* ---- layer_norm ---- */

static void test_layer_norm_values(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {2, 4}, cs[1] = {4};
  slapo_node *x = in_f32(&f, "x", 2, s);
  slapo_node *y = slapo_layer_norm(f.ctx, x, in_f32(&f, "w", 1, cs), in_f32(&f, "b", 1, cs),
                                   1e-5);
  slapo_node *y1 = slapo_layer_norm(f.ctx, x, NULL, NULL, 1e-5);
  assert_non_null(y);
  assert_non_null(y1);
  assert_int_equal(y1->n_inputs, 1);
  float xv[8] = {1, 2, 3, 4, 5, 5, 5, 5}, wv[4] = {1, 2, 0.5f, -1}, bv[4] = {0, 1, 0, 0.5f};
  slapo_tensor *in[3] = {tensor(SLAPO_DTYPE_F32, 2, s, xv), tensor(SLAPO_DTYPE_F32, 1, cs, wv),
                         tensor(SLAPO_DTYPE_F32, 1, cs, bv)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train);
  slapo_tensor *o1 = run_both(y1, in, 1e-6, &k_train);
  /* Row 0: mean 2.5, biased variance 1.25. Row 1: variance 0, so xhat = 0
   * (eps keeps it finite) and the output is the bias. */
  double rstd = 1 / sqrt(1.25 + 1e-5);
  const double xhat[4] = {-1.5 * rstd, -0.5 * rstd, 0.5 * rstd, 1.5 * rstd};
  for (int c = 0; c < 4; c++) {
    assert_close(F(o1)[c], xhat[c], 1e-6);
    assert_close(F(o)[c], xhat[c] * wv[c] + bv[c], 1e-6);
    assert_close(F(o1)[4 + c], 0, 0);
    assert_close(F(o)[4 + c], bv[c], 1e-7);
  }
  slapo_tensor_free(o);
  slapo_tensor_free(o1);
  free_all(in, 3);
  fx_free(&f);
}

static void test_norms_fast_match_ref(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {64, 768}, cs[1] = {768};
  slapo_node *y = slapo_layer_norm(f.ctx, in_f32(&f, "x", 2, s), in_f32(&f, "w", 1, cs),
                                   in_f32(&f, "b", 1, cs), 1e-5);
  /* An offset mean (3 +- 1) checks the two-pass variance in the fast kernel. */
  slapo_tensor *in[3] = {random_f32(2, s, 2, 4, 6), random_f32(1, cs, 0.5f, 1.5f, 7),
                         random_f32(1, cs, -1, 1, 8)};
  slapo_tensor *o = run_both(y, in, 1e-5, &k_train);
  slapo_tensor_free(o);
  int64_t gs[2] = {64, 768};
  slapo_node *g = in_f32(&f, "g", 2, gs);
  bool need[3] = {true, false, false};
  slapo_node *dx[3];
  OK(y->op->backward(f.ctx, y, g, need, dx));
  assert_null(dx[1]);
  assert_null(dx[2]);
  slapo_tensor *bin[3] = {in[0], in[1], random_f32(2, s, -1, 1, 9)};
  o = run_both(dx[0], bin, 1e-4, &k_train);
  slapo_tensor_free(o);
  /* rms_norm and its backward on the same data. */
  slapo_node *r = slapo_rms_norm(f.ctx, y->inputs[0], y->inputs[1], 1e-6);
  o = run_both(r, in, 1e-5, &k_train);
  slapo_tensor_free(o);
  OK(r->op->backward(f.ctx, r, g, need, dx));
  o = run_both(dx[0], bin, 1e-4, &k_train);
  slapo_tensor_free(o);
  slapo_tensor_free(bin[2]);
  free_all(in, 3);
  fx_free(&f);
}

static void test_layer_norm_backward_matches_fd(void **state) {
  (void)state;
  for (int affine = 0; affine < 2; affine++) {
    fx f = fx_new();
    int64_t s[2] = {3, 7}, cs[1] = {7};
    slapo_node *x = in_f32(&f, "x", 2, s);
    slapo_node *w = affine ? in_f32(&f, "w", 1, cs) : NULL;
    slapo_node *b = affine ? in_f32(&f, "b", 1, cs) : NULL;
    slapo_node *g = in_f32(&f, "g", 2, s);
    slapo_node *y = slapo_layer_norm(f.ctx, x, w, b, 1e-5);
    bool need[3] = {true, false, false};
    slapo_node *dx[3];
    OK(y->op->backward(f.ctx, y, g, need, dx));
    assert_string_equal(dx[0]->op->name, "layer_norm_backward");
    assert_int_equal(dx[0]->n_inputs, affine ? 3 : 2);
    assert_true(slapo_node_attr_float(dx[0], "eps", 0) == 1e-5);
    slapo_tensor *in[3] = {random_f32(2, s, -2, 2, 10), random_f32(1, cs, -1.5f, 1.5f, 11),
                           random_f32(1, cs, -1, 1, 12)};
    slapo_tensor *gv = random_f32(2, s, -1, 1, 13);
    slapo_tensor *bin[3] = {in[0], affine ? in[1] : gv, gv};
    slapo_tensor *got = run_both(dx[0], bin, 1e-5, &k_train);
    double want[21];
    fd_grad(y, in, 0, F(gv), &k_train, want);
    assert_grad(got, want, 3e-3);
    slapo_tensor_free(got);
    slapo_tensor_free(gv);
    free_all(in, 3);
    fx_free(&f);
  }
}

/* The affine gradients are composites of other groups' ops (mul, sum_to):
 * check the rule's structure when those ops are registered. */
static void test_layer_norm_backward_affine_rule(void **state) {
  (void)state;
  if (!slapo_op_find("mul") || !slapo_op_find("sum_to")) skip();
  fx f = fx_new();
  int64_t s[3] = {2, 3, 7}, cs[1] = {7};
  slapo_node *w = in_f32(&f, "w", 1, cs), *b = in_f32(&f, "b", 1, cs);
  slapo_node *y = slapo_layer_norm(f.ctx, in_f32(&f, "x", 3, s), w, b, 1e-5);
  bool need[3] = {false, true, true};
  slapo_node *dx[3];
  OK(y->op->backward(f.ctx, y, in_f32(&f, "g", 3, s), need, dx));
  assert_null(dx[0]);
  assert_int_equal(dx[1]->ndim, 1);
  assert_int_equal(dx[1]->shape[0], 7);
  assert_int_equal(dx[2]->ndim, 1);
  assert_int_equal(dx[2]->shape[0], 7);
  fx_free(&f);
}

/* ---- rms_norm ---- */

static void test_rms_norm_values_and_backward(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {1, 4}, cs[1] = {4};
  slapo_node *x = in_f32(&f, "x", 2, s), *w = in_f32(&f, "w", 1, cs);
  slapo_node *y = slapo_rms_norm(f.ctx, x, w, 1e-6);
  slapo_node *y1 = slapo_rms_norm(f.ctx, x, NULL, 1e-6);
  float xv[4] = {1, 2, 3, 4}, wv[4] = {1, 2, 0.5f, -1};
  slapo_tensor *in[2] = {tensor(SLAPO_DTYPE_F32, 2, s, xv), tensor(SLAPO_DTYPE_F32, 1, cs, wv)};
  slapo_tensor *o = run_both(y, in, 1e-6, &k_train), *o1 = run_both(y1, in, 1e-6, &k_train);
  double rstd = 1 / sqrt(7.5 + 1e-6); /* mean of squares (1 + 4 + 9 + 16) / 4 */
  for (int c = 0; c < 4; c++) {
    assert_close(F(o1)[c], xv[c] * rstd, 1e-6);
    assert_close(F(o)[c], xv[c] * rstd * wv[c], 1e-6);
  }
  slapo_tensor_free(o);
  slapo_tensor_free(o1);
  free_all(in, 2);

  /* Fused backward against finite differences, with and without weight. */
  int64_t s2[2] = {3, 7}, c2[1] = {7};
  slapo_node *x2 = in_f32(&f, "x2", 2, s2), *w2 = in_f32(&f, "w2", 1, c2);
  slapo_node *g = in_f32(&f, "g", 2, s2);
  for (int affine = 0; affine < 2; affine++) {
    slapo_node *y2 = slapo_rms_norm(f.ctx, x2, affine ? w2 : NULL, 1e-6);
    bool need[2] = {true, false};
    slapo_node *dx[2];
    OK(y2->op->backward(f.ctx, y2, g, need, dx));
    assert_string_equal(dx[0]->op->name, "rms_norm_backward");
    slapo_tensor *in2[2] = {random_f32(2, s2, -2, 2, 14), random_f32(1, c2, -1.5f, 1.5f, 15)};
    slapo_tensor *gv = random_f32(2, s2, -1, 1, 16);
    slapo_tensor *bin[3] = {in2[0], affine ? in2[1] : gv, gv};
    slapo_tensor *got = run_both(dx[0], bin, 1e-5, &k_train);
    double want[21];
    fd_grad(y2, in2, 0, F(gv), &k_train, want);
    assert_grad(got, want, 3e-3);
    slapo_tensor_free(got);
    slapo_tensor_free(gv);
    free_all(in2, 2);
  }
  fx_free(&f);
}

/* ---- cross_entropy ---- */

/* Loss of logits [R, 3] with targets (i64) under ignore_index. */
static double ce_loss(int64_t R, const float *logits, const int64_t *targets,
                      int64_t ignore_index) {
  fx f = fx_new();
  int64_t s[2] = {R, 3}, ts[1] = {R};
  slapo_node *l = slapo_cross_entropy(f.ctx, in_f32(&f, "logits", 2, s),
                                      slapo_input(f.ctx, "t", SLAPO_DTYPE_I64, 1, ts),
                                      ignore_index);
  assert_non_null(l);
  assert_int_equal(l->ndim, 0);
  slapo_tensor *in[2] = {tensor(SLAPO_DTYPE_F32, 2, s, logits),
                         tensor(SLAPO_DTYPE_I64, 1, ts, targets)};
  slapo_tensor *o = run_both(l, in, 1e-6, &k_train);
  double v = F(o)[0];
  assert_true(isfinite(v));
  slapo_tensor_free(o);
  free_all(in, 2);
  fx_free(&f);
  return v;
}

static void test_cross_entropy_values(void **state) {
  (void)state;
  float x[6] = {1, 2, 3, 1, 1, 1};
  /* Row 0: logsumexp = 3 + log(1 + e^-1 + e^-2) = 3.4076059644, target 2.
   * Row 1: log 3 = 1.0986122887, target 0. */
  const double r0 = 0.4076059644, r1 = 1.0986122887;
  assert_close(ce_loss(2, x, (int64_t[]){2, 0}, -100), (r0 + r1) / 2, 1e-6);
  assert_close(ce_loss(2, x, (int64_t[]){2, -100}, -100), r0, 1e-6);
  assert_close(ce_loss(2, x, (int64_t[]){1, 0}, 1), r1, 1e-6);      /* custom ignore */
  assert_close(ce_loss(2, x, (int64_t[]){-100, -100}, -100), 0, 0); /* all ignored */
  assert_close(ce_loss(2, x, (int64_t[]){2, 7}, -100), r0, 1e-6);   /* stray: skipped */
  assert_close(ce_loss(2, x, (int64_t[]){-3, 0}, -100), r1, 1e-6);
  /* Large logits stay finite: logsumexp(1e4, 0, -1e4) = 1e4 (to f32). */
  float big[3] = {1e4f, 0, -1e4f};
  assert_close(ce_loss(1, big, (int64_t[]){1}, -100), 1e4, 1e-2);
  assert_close(ce_loss(1, big, (int64_t[]){0}, -100), 0, 1e-6);
}

static void test_cross_entropy_fast_and_i32(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[3] = {4, 16, 600}, ts[2] = {4, 16};
  slapo_node *l = slapo_cross_entropy(f.ctx, in_f32(&f, "logits", 3, s),
                                      slapo_input(f.ctx, "t", SLAPO_DTYPE_I32, 2, ts), 5);
  slapo_tensor *in[2] = {random_f32(3, s, -5, 5, 17), tensor(SLAPO_DTYPE_I32, 2, ts, NULL)};
  int32_t *t = slapo_tensor_data(in[1]);
  for (int i = 0; i < 64; i++) t[i] = (int32_t)((i * 37) % 600);
  slapo_tensor *o = run_both(l, in, 1e-5, &k_train);
  assert_true(F(o)[0] > 0 && isfinite(F(o)[0]));
  slapo_tensor_free(o);
  free_all(in, 2);
  fx_free(&f);
}

/* Wide logits (exp arguments below the -87 clamp), V with a tail after the
 * 16-lane blocks, an ignored row, and several thread counts: forward and
 * fused backward fast kernels stay within 1e-5 of the reference. */
static void test_cross_entropy_fast_wide(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {40, 1003}, ts[1] = {40};
  slapo_node *l = slapo_cross_entropy(f.ctx, in_f32(&f, "logits", 2, s),
                                      slapo_input(f.ctx, "t", SLAPO_DTYPE_I64, 1, ts), -100);
  slapo_node *dl = in_f32(&f, "dl", 0, NULL);
  bool need[2] = {true, true};
  slapo_node *dx[2];
  OK(l->op->backward(f.ctx, l, dl, need, dx));
  slapo_tensor *in[2] = {random_f32(2, s, -60, 60, 25), tensor(SLAPO_DTYPE_I64, 1, ts, NULL)};
  int64_t *t = slapo_tensor_data(in[1]);
  for (int i = 0; i < 40; i++) t[i] = (i * 101) % 1003;
  t[7] = -100;
  float dlv = 1.5f;
  slapo_tensor *dlt = tensor(SLAPO_DTYPE_F32, 0, NULL, &dlv);
  slapo_tensor *bin[3] = {in[0], in[1], dlt};
  int saved = omp_get_max_threads();
  const int counts[3] = {1, 2, 3};
  for (int k = 0; k < 3; k++) {
    omp_set_num_threads(counts[k]);
    slapo_tensor *o = run_both(l, in, 1e-5, &k_train);
    assert_true(F(o)[0] > 0 && isfinite(F(o)[0]));
    slapo_tensor_free(o);
    o = run_both(dx[0], bin, 1e-6, &k_train);
    slapo_tensor_free(o);
  }
  omp_set_num_threads(saved);
  slapo_tensor_free(dlt);
  free_all(in, 2);
  fx_free(&f);
}

static void test_cross_entropy_backward(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {4, 5}, ts[1] = {4};
  slapo_node *l = slapo_cross_entropy(f.ctx, in_f32(&f, "logits", 2, s),
                                      slapo_input(f.ctx, "t", SLAPO_DTYPE_I64, 1, ts), -1);
  slapo_node *dl = in_f32(&f, "dl", 0, NULL);
  bool need[2] = {true, true};
  slapo_node *dx[2];
  OK(l->op->backward(f.ctx, l, dl, need, dx));
  assert_null(dx[1]);
  assert_string_equal(dx[0]->op->name, "cross_entropy_backward");
  assert_int_equal(slapo_node_attr_int(dx[0], "ignore_index", 0), -1);
  int64_t tv[4] = {3, -1, 0, 9}; /* one ignored, one out of range: count = 2 */
  float dlv = 2.0f;
  slapo_tensor *in[2] = {random_f32(2, s, -3, 3, 18), tensor(SLAPO_DTYPE_I64, 1, ts, tv)};
  slapo_tensor *dlt = tensor(SLAPO_DTYPE_F32, 0, NULL, &dlv);
  slapo_tensor *bin[3] = {in[0], in[1], dlt};
  slapo_tensor *got = run_both(dx[0], bin, 1e-6, &k_train);
  double want[20];
  fd_grad(l, in, 0, &dlv, &k_train, want);
  assert_grad(got, want, 2e-3);
  for (int v = 0; v < 5; v++) {
    assert_true(F(got)[5 + v] == 0.0f);  /* ignored row */
    assert_true(F(got)[15 + v] == 0.0f); /* out-of-range row */
  }
  /* Hand value: row 0's entries sum to 0 and the target entry is negative. */
  double sum = 0;
  for (int v = 0; v < 5; v++) sum += F(got)[v];
  assert_close(sum, 0, 1e-6);
  assert_true(F(got)[3] < 0);
  slapo_tensor_free(got);
  /* Nothing counted: all zeros, no NaN from 0 / 0. */
  int64_t *t = slapo_tensor_data(in[1]);
  for (int i = 0; i < 4; i++) t[i] = -1;
  got = run_both(dx[0], bin, 0, &k_train);
  for (int i = 0; i < 20; i++) assert_true(F(got)[i] == 0.0f);
  slapo_tensor_free(got);
  slapo_tensor_free(dlt);
  free_all(in, 2);
  fx_free(&f);
}

/* ---- dropout ---- */

/* Runs dropout(p, offset) on ones [ndim, shape] under env; owned result. */
static slapo_tensor *dropout_ones(int ndim, const int64_t *shape, double p, int64_t offset,
                                  int64_t stream, const slapo_kernel_env *env) {
  fx f = fx_new();
  slapo_node *x = in_f32(&f, "x", ndim, shape);
  slapo_attr a[3] = {slapo_attr_float("p", p), slapo_attr_int("offset", offset),
                     slapo_attr_int("stream", stream)};
  slapo_node *y = slapo_op_call(f.ctx, "dropout", 1, &x, 3, a);
  assert_non_null(y);
  slapo_tensor *in[1] = {tensor(SLAPO_DTYPE_F32, ndim, shape, NULL)};
  for (int64_t i = 0; i < slapo_tensor_numel(in[0]); i++) F(in[0])[i] = 1.0f;
  slapo_tensor *o = run(y, in, false, env), *o2 = run(y, in, true, env);
  assert_true(slapo_tensor_equal(o, o2)); /* same formula: bitwise */
  slapo_tensor_free(o2);
  free_all(in, 1);
  fx_free(&f);
  return o;
}

static void test_dropout_fraction_and_scale(void **state) {
  (void)state;
  int64_t s[2] = {100, 1000};
  slapo_tensor *o = dropout_ones(2, s, 0.3, 0, 42, &k_train);
  int64_t kept = 0;
  float scale = (float)(1.0 / 0.7);
  for (int64_t i = 0; i < 100000; i++) {
    float v = F(o)[i];
    assert_true(v == 0.0f || v == scale);
    kept += v != 0.0f;
  }
  assert_close((double)kept / 100000, 0.7, 0.01);
  slapo_tensor_free(o);
}

static void test_dropout_mask_keys(void **state) {
  (void)state;
  int64_t s[2] = {8, 16}, s2[2] = {8, 32};
  slapo_tensor *a = dropout_ones(2, s, 0.5, 0, 42, &k_train);
  slapo_tensor *b = dropout_ones(2, s, 0.5, 0, 42, &k_train);
  assert_true(slapo_tensor_equal(a, b)); /* same keys -> same mask */
  slapo_kernel_env next = k_train;
  next.step++;
  slapo_tensor *c = dropout_ones(2, s, 0.5, 0, 42, &next);
  assert_false(slapo_tensor_equal(a, c)); /* another step -> another mask */
  slapo_tensor *d = dropout_ones(2, s, 0.5, 0, 43, &k_train);
  assert_false(slapo_tensor_equal(a, d)); /* another stream -> another mask */
  /* Element i's decision does not depend on the tensor's size: the first
   * 128 flattened elements of [8, 32] match all of [8, 16]. */
  slapo_tensor *e = dropout_ones(2, s2, 0.5, 0, 42, &k_train);
  assert_memory_equal(F(a), F(e), 128 * sizeof(float));
  /* offset k draws elements [k, k + N) of the unsharded mask. */
  slapo_tensor *g = dropout_ones(2, s, 0.5, 100, 42, &k_train);
  assert_memory_equal(F(g), F(e) + 100, 128 * sizeof(float));
  slapo_tensor *ts[6] = {a, b, c, d, e, g};
  free_all(ts, 6);
}

static void test_dropout_identity(void **state) {
  (void)state;
  int64_t s[2] = {3, 5};
  slapo_kernel_env eval = k_train;
  eval.training = false;
  slapo_tensor *a = dropout_ones(2, s, 0.5, 0, 42, &eval);
  slapo_tensor *b = dropout_ones(2, s, 0.0, 0, 42, &k_train);
  for (int i = 0; i < 15; i++) assert_true(F(a)[i] == 1.0f && F(b)[i] == 1.0f);
  slapo_tensor *c = dropout_ones(2, s, 1.0, 0, 42, &k_train); /* p = 1 drops all */
  for (int i = 0; i < 15; i++) assert_true(F(c)[i] == 0.0f);
  slapo_tensor *ts[3] = {a, b, c};
  free_all(ts, 3);
}

static void test_dropout_stream_and_backward(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t s[2] = {3, 5};
  slapo_node *x = in_f32(&f, "x", 2, s);
  slapo_node *y1 = slapo_dropout(f.ctx, x, 0.3), *y2 = slapo_dropout(f.ctx, x, 0.3);
  /* slapo_op_call keys each random op by (origin path, op index). */
  assert_non_null(slapo_node_attr(y1, "stream"));
  assert_true(slapo_node_attr_int(y1, "stream", 0) != slapo_node_attr_int(y2, "stream", 0));
  slapo_node *g = in_f32(&f, "g", 2, s);
  bool need[1] = {true};
  slapo_node *dx[1];
  OK(y1->op->backward(f.ctx, y1, g, need, dx));
  assert_string_equal(dx[0]->op->name, "dropout");
  assert_int_equal(slapo_node_attr_int(dx[0], "stream", 0), slapo_node_attr_int(y1, "stream", 0));
  /* dx = mask * scale * dy with y's own mask. */
  slapo_tensor *xin[1] = {random_f32(2, s, 1, 2, 19)}; /* never 0, so kept entries show */
  slapo_tensor *gin[1] = {random_f32(2, s, 1, 2, 20)};
  slapo_tensor *yv = run(y1, xin, true, &k_train), *dv = run(dx[0], gin, true, &k_train);
  for (int i = 0; i < 15; i++) {
    assert_true((F(yv)[i] == 0.0f) == (F(dv)[i] == 0.0f));
    if (F(dv)[i] != 0.0f) assert_true(F(dv)[i] == F(gin[0])[i] * (float)(1.0 / 0.7));
  }
  slapo_tensor_free(yv);
  slapo_tensor_free(dv);
  free_all(xin, 1);
  free_all(gin, 1);
  fx_free(&f);
}

/* ---- embedding / index_add ---- */

static void test_embedding_values(void **state) {
  (void)state;
  for (int wide = 0; wide < 2; wide++) {
    fx f = fx_new();
    int64_t ws[2] = {4, 3}, is[2] = {2, 3};
    slapo_dtype dt = wide ? SLAPO_DTYPE_I64 : SLAPO_DTYPE_I32;
    slapo_node *y = slapo_embedding(f.ctx, in_f32(&f, "w", 2, ws),
                                    slapo_input(f.ctx, "idx", dt, 2, is));
    assert_non_null(y);
    assert_int_equal(y->ndim, 3);
    assert_int_equal(y->shape[2], 3);
    float wv[12] = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};
    int64_t iv64[6] = {3, 1, 1, 0, 4, -1}; /* repeated 1; 4 and -1 are out of range */
    int32_t iv32[6] = {3, 1, 1, 0, 4, -1};
    slapo_tensor *in[2] = {tensor(SLAPO_DTYPE_F32, 2, ws, wv),
                           tensor(dt, 2, is, wide ? (void *)iv64 : (void *)iv32)};
    slapo_tensor *o = run_both(y, in, 0, &k_train);
    const float want[18] = {30, 31, 32, 10, 11, 12, 10, 11, 12, 0, 1, 2, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(F(o), want, sizeof want);
    slapo_tensor_free(o);
    free_all(in, 2);
    fx_free(&f);
  }
}

static void test_index_add_values(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t bs[2] = {3, 2}, is[1] = {5}, ss[2] = {5, 2};
  slapo_node *y = slapo_index_add(f.ctx, in_f32(&f, "base", 2, bs),
                                  slapo_input(f.ctx, "idx", SLAPO_DTYPE_I64, 1, is),
                                  in_f32(&f, "src", 2, ss));
  assert_non_null(y);
  float bv[6] = {1, 1, 1, 1, 1, 1}, sv[10] = {1, 2, 10, 20, 100, 200, 1000, 2000, 5, 5};
  int64_t iv[5] = {2, 0, 2, 2, 3}; /* row 2 three times; 3 is out of range */
  slapo_tensor *in[3] = {tensor(SLAPO_DTYPE_F32, 2, bs, bv), tensor(SLAPO_DTYPE_I64, 1, is, iv),
                         tensor(SLAPO_DTYPE_F32, 2, ss, sv)};
  slapo_tensor *o = run_both(y, in, 0, &k_train);
  const float want[6] = {11, 21, 1, 1, 1102, 2203};
  assert_memory_equal(F(o), want, sizeof want);
  slapo_tensor_free(o);

  /* Backward: d base = dy, d src = embedding(dy, idx). */
  slapo_node *g = in_f32(&f, "g", 2, bs);
  bool need[3] = {true, true, true};
  slapo_node *dx[3];
  OK(y->op->backward(f.ctx, y, g, need, dx));
  assert_ptr_equal(dx[0], g);
  assert_null(dx[1]);
  assert_string_equal(dx[2]->op->name, "embedding");
  assert_int_equal(dx[2]->shape[0], 5);
  assert_int_equal(dx[2]->shape[1], 2);
  free_all(in, 3);
  fx_free(&f);
}

static void test_index_add_fast_matches_ref(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t bs[2] = {50, 200}, is[1] = {300}, ss[2] = {300, 200};
  slapo_node *y = slapo_index_add(f.ctx, in_f32(&f, "base", 2, bs),
                                  slapo_input(f.ctx, "idx", SLAPO_DTYPE_I32, 1, is),
                                  in_f32(&f, "src", 2, ss));
  slapo_tensor *in[3] = {random_f32(2, bs, -1, 1, 21), tensor(SLAPO_DTYPE_I32, 1, is, NULL),
                         random_f32(2, ss, -1, 1, 22)};
  int32_t *iv = slapo_tensor_data(in[1]);
  for (int i = 0; i < 300; i++) iv[i] = (int32_t)((i * 7) % 50);
  /* Same summation order in both kernels: bitwise equal. */
  slapo_tensor *a = run(y, in, false, &k_train), *b = run(y, in, true, &k_train);
  assert_true(slapo_tensor_equal(a, b));
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  free_all(in, 3);
  fx_free(&f);
}

/* Column count not a multiple of the 16-float block, stray indices, and
 * thread counts that leave threads without columns: the fast kernel keeps
 * the reference's summation order, so every thread count is bitwise equal. */
static void test_index_add_fast_threads(void **state) {
  (void)state;
  fx f = fx_new();
  int64_t bs[2] = {11, 37}, is[1] = {1000}, ss[2] = {1000, 37}; /* 37k work: threaded */
  slapo_node *y = slapo_index_add(f.ctx, in_f32(&f, "base", 2, bs),
                                  slapo_input(f.ctx, "idx", SLAPO_DTYPE_I64, 1, is),
                                  in_f32(&f, "src", 2, ss));
  slapo_tensor *in[3] = {random_f32(2, bs, -1, 1, 23), tensor(SLAPO_DTYPE_I64, 1, is, NULL),
                         random_f32(2, ss, -1, 1, 24)};
  int64_t *iv = slapo_tensor_data(in[1]);
  for (int i = 0; i < 1000; i++) iv[i] = (i * 7) % 13 - 1; /* -1 .. 11: two strays */
  slapo_tensor *a = run(y, in, false, &k_train);
  int saved = omp_get_max_threads();
  const int counts[4] = {1, 2, 3, 5};
  for (int k = 0; k < 4; k++) {
    omp_set_num_threads(counts[k]);
    slapo_tensor *b = run(y, in, true, &k_train);
    assert_true(slapo_tensor_equal(a, b));
    slapo_tensor_free(b);
  }
  omp_set_num_threads(saved);
  slapo_tensor_free(a);
  free_all(in, 3);
  fx_free(&f);
}

/* The weight gradient is built from other groups' ops (reshape, full). */
static void test_embedding_backward_rule(void **state) {
  (void)state;
  if (!slapo_op_find("reshape") || !slapo_op_find("full")) skip();
  fx f = fx_new();
  int64_t ws[2] = {7, 3}, is[2] = {2, 5}, gs[3] = {2, 5, 3};
  slapo_node *y = slapo_embedding(f.ctx, in_f32(&f, "w", 2, ws),
                                  slapo_input(f.ctx, "idx", SLAPO_DTYPE_I64, 2, is));
  bool need[2] = {true, true};
  slapo_node *dx[2];
  OK(y->op->backward(f.ctx, y, in_f32(&f, "g", 3, gs), need, dx));
  assert_null(dx[1]);
  assert_string_equal(dx[0]->op->name, "index_add");
  assert_int_equal(dx[0]->shape[0], 7);
  assert_int_equal(dx[0]->shape[1], 3);
  assert_int_equal(dx[0]->inputs[1]->ndim, 1);
  assert_int_equal(dx[0]->inputs[1]->shape[0], 10);
  fx_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax_values),
      cmocka_unit_test(test_softmax_rows_sum_to_one),
      cmocka_unit_test(test_softmax_causal),
      cmocka_unit_test(test_softmax_stable),
      cmocka_unit_test(test_softmax_backward_matches_fd),
      cmocka_unit_test(test_layer_norm_values),
      cmocka_unit_test(test_norms_fast_match_ref),
      cmocka_unit_test(test_layer_norm_backward_matches_fd),
      cmocka_unit_test(test_layer_norm_backward_affine_rule),
      cmocka_unit_test(test_rms_norm_values_and_backward),
      cmocka_unit_test(test_cross_entropy_values),
      cmocka_unit_test(test_cross_entropy_fast_and_i32),
      cmocka_unit_test(test_cross_entropy_fast_wide),
      cmocka_unit_test(test_cross_entropy_backward),
      cmocka_unit_test(test_dropout_fraction_and_scale),
      cmocka_unit_test(test_dropout_mask_keys),
      cmocka_unit_test(test_dropout_identity),
      cmocka_unit_test(test_dropout_stream_and_backward),
      cmocka_unit_test(test_embedding_values),
      cmocka_unit_test(test_index_add_values),
      cmocka_unit_test(test_index_add_fast_matches_ref),
      cmocka_unit_test(test_index_add_fast_threads),
      cmocka_unit_test(test_embedding_backward_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
