/* tests/common/opfix.c - see opfix.h. Kernels run here directly
 * (node->op->ref / fast), without the planner, so a test pins down one
 * kernel at a time. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/opfix.h"

void opfix_init(opfix *f) {
  assert_int_equal(slapo_graph_new(&f->g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(f->g, &f->ctx), SLAPO_OK);
}

void opfix_deinit(opfix *f) {
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
}

int opfix_setup(void **state) {
  opfix *f = test_malloc(sizeof *f);
  opfix_init(f);
  *state = f;
  return 0;
}

int opfix_teardown(void **state) {
  opfix *f = *state;
  opfix_deinit(f);
  test_free(f);
  return 0;
}

slapo_node *opfix_input_dt(opfix *f, const char *name, slapo_dtype dt, int ndim,
                           const int64_t *shape) {
  slapo_node *n = slapo_input(f->ctx, name, dt, ndim, shape);
  if (!n) fail_msg("input %s: %s", name, slapo_ctx_message(f->ctx));
  return n;
}

slapo_node *opfix_input(opfix *f, const char *name, int ndim, const int64_t *shape) {
  return opfix_input_dt(f, name, SLAPO_DTYPE_F32, ndim, shape);
}

/* ---- tensors ---- */

slapo_tensor *opfix_tensor(int ndim, const int64_t *shape, const float *data) {
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t), SLAPO_OK);
  if (data) memcpy(slapo_tensor_data(t), data, slapo_tensor_nbytes(t));
  return t;
}

slapo_tensor *opfix_arange_dt(slapo_dtype dt, int ndim, const int64_t *shape) {
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(dt, ndim, shape, &t), SLAPO_OK);
  int64_t idx[SLAPO_MAX_DIMS] = {0};
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) {
    slapo_tensor_set(t, idx, (double)(dt == SLAPO_DTYPE_F32 ? i : i % 251));
    for (int k = ndim - 1; k >= 0 && ++idx[k] == shape[k]; k--) idx[k] = 0;
  }
  return t;
}

slapo_tensor *opfix_arange(int ndim, const int64_t *shape) {
  return opfix_arange_dt(SLAPO_DTYPE_F32, ndim, shape);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

/* Uniform in [lo, hi) from a 64-bit LCG (Knuth's MMIX constants); the top
 * 24 bits make the float. */
static float uniform(float lo, float hi) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)((g_rng >> 40) * 0x1p-24);
}

slapo_tensor *opfix_random(int ndim, const int64_t *shape, float lo, float hi) {
  slapo_tensor *t = opfix_tensor(ndim, shape, NULL);
  float *p = slapo_tensor_data(t); /* [numel] */
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = uniform(lo, hi);
  return t;
}

/* ---- running one node ---- */

slapo_tensor *opfix_run(const slapo_node *node, const slapo_tensor *const *in, bool fast) {
  assert_non_null(node);
  slapo_tensor *out;
  assert_int_equal(slapo_tensor_new(node->dtype, node->ndim, node->shape, &out), SLAPO_OK);
  memset(slapo_tensor_data(out), 0xff, slapo_tensor_nbytes(out)); /* NaN in f32 */
  slapo_kernel_env env = {0};
  slapo_kernel_fn k = fast ? node->op->fast : node->op->ref;
  if (!k) fail_msg("%s: op %s has no %s kernel", node->name, node->target, fast ? "fast" : "ref");
  k(node, in, out, &env);
  return out;
}

void opfix_backward(opfix *f, slapo_node *y, slapo_node **dx) {
  assert_non_null(y);
  assert_non_null(y->op->backward);
  slapo_node *dy = opfix_input(f, "dy", y->ndim, y->shape);
  bool need[16];
  assert_true(y->n_inputs <= 16);
  for (int i = 0; i < y->n_inputs; i++) need[i] = true;
  assert_int_equal(y->op->backward(f->ctx, y, dy, need, dx), SLAPO_OK);
}

/* ---- checks ---- */

void opfix_assert_shape(const slapo_node *n, int ndim, const int64_t *shape) {
  assert_non_null(n);
  char a[128], b[128];
  if (!slapo_shape_equal(n->ndim, n->shape, ndim, shape))
    fail_msg("%s: shape %s, expected %s", n->name, slapo_shape_str(n->ndim, n->shape, a, sizeof a),
             slapo_shape_str(ndim, shape, b, sizeof b));
}

/* Whether t [n] matches want [n] (see opfix_assert_values); if not, why
 * gets the first element that does not. */
static bool values_match(const slapo_tensor *t, int64_t n, const float *want, float atol,
                         float rtol, char *why, size_t cap) {
  if (slapo_tensor_numel(t) != n) {
    snprintf(why, cap, "%lld elements, expected %lld", (long long)slapo_tensor_numel(t),
             (long long)n);
    return false;
  }
  const float *p = slapo_tensor_data(t); /* [n] */
  for (int64_t i = 0; i < n; i++)
    if (!(p[i] == want[i] || fabsf(p[i] - want[i]) <= atol + rtol * fabsf(want[i]))) {
      snprintf(why, cap, "element %lld: got %.9g, want %.9g (atol %g, rtol %g)", (long long)i, p[i],
               want[i], atol, rtol);
      return false;
    }
  return true;
}

void opfix_assert_values(const slapo_tensor *t, int64_t n, const float *want, float atol,
                         float rtol) {
  char why[256];
  if (!values_match(t, n, want, atol, rtol, why, sizeof why)) fail_msg("%s", why);
}

void opfix_check_kernels(const slapo_node *node, const slapo_tensor *const *in, int64_t n,
                         const float *want, float atol, float rtol) {
  assert_non_null(node);
  for (int fast = 0; fast < 2; fast++) {
    if (fast && !node->op->fast) continue;
    slapo_tensor *y = opfix_run(node, in, fast);
    char why[256];
    bool ok = values_match(y, n, want, atol, rtol, why, sizeof why);
    slapo_tensor_free(y);
    if (!ok)
      fail_msg("%s (%s), %s kernel: %s", node->name, node->target, fast ? "fast" : "ref", why);
  }
}

void opfix_expect_fail_status(opfix *f, slapo_status got, slapo_status want, int n_nodes,
                              const char *const *subs) {
  assert_int_equal(got, want);
  assert_int_equal(slapo_ctx_status(f->ctx), want);
  const char *msg = slapo_ctx_message(f->ctx);
  assert_string_equal(slapo_last_error(), msg);
  for (int i = 0; subs[i]; i++)
    if (!strstr(msg, subs[i])) fail_msg("message '%s' lacks '%s'", msg, subs[i]);
  assert_int_equal(slapo_graph_count(f->g), n_nodes);
  assert_int_equal(slapo_graph_lint(f->g), SLAPO_OK);
}

void opfix_expect_fail(opfix *f, const slapo_node *got, slapo_status want, int n_nodes,
                       const char *const *subs) {
  assert_null(got);
  opfix_expect_fail_status(f, slapo_ctx_status(f->ctx), want, n_nodes, subs);
}
