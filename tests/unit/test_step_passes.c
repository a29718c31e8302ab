/* tests/unit/test_step_passes.c - the graph rewrite rules slapo_step runs. The
 * split-gradient fold (src/rewrite/fold_split_grads.c): a value split into pieces
 * that tile a dim gets
 * its gradient from one concat, bitwise equal to the unfolded sum of
 * zero-padded slice_backwards, also when x has another user (the concat
 * is then added to that user's gradient); sums that are not such a tiling
 * (a gap, strided slices) are left alone; and a GPT-2 step folds one split
 * per attention layer. Identity dropouts (src/rewrite/drop_identity.c): a
 * GPT-2 step keeps its dropout nodes only when training with p > 0, and a
 * step without them computes the same bytes. The index_add fold
 * (src/rewrite/fold_index_add.c): a tied embedding / output weight gets its
 * gradient from one index_add into the output layer's gradient, equal to
 * the unfolded sum within float rounding. The LayerNorm fold
 * (src/rewrite/fold_norm_add.c): the add of a LayerNorm (or RMSNorm)
 * input's two gradients goes into the norm's backward op, bitwise the same
 * (fast and reference kernels; with and without the packed dw, db; either
 * operand order), not when the other gradient is computed after the
 * norm's, and a GPT-2 step folds two per block. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/rewrite.h"
#include "slapo/autograd.h"
#include "slapo/exec.h"
#include "slapo/models.h"


/* Runs the rule `name` alone on g (a training step's graph) to its
 * fixpoint; *n receives how often it rewrote. */
static slapo_status run_rule(slapo_graph *g, const char *name, int *n) {
  const slapo_rewrite_rule *r = slapo_rewrite_rule_find(name);
  assert_non_null(r);
  return slapo_rewrite_run(g, &r, 1, &(slapo_rewrite_env){.training = true}, n);
}

static int count_op(const slapo_graph *g, const char *op) {
  int n = 0;
  for (slapo_node *x = slapo_graph_first(g); x; x = x->next)
    n += x->kind == SLAPO_NODE_CALL_OP && !strcmp(x->target, op);
  return n;
}

/* How the pieces of x [2, 3, 6] are cut along dim 2. */
typedef enum cut { CUT_SPLIT, CUT_GAP, CUT_STRIDED, CUT_REUSED } cut;

/* loss = sum(p0^2) + sum(exp(p1)) + sum(3 * p2) for pieces p_i of x, and
 * dloss/dx; returns the graph (owned) with output (loss, dx). */
static slapo_graph *build(cut how) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t shape[3] = {2, 3, 6};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, shape), *p[3];
  if (how == CUT_SPLIT || how == CUT_REUSED) {
    int64_t sizes[3] = {2, 1, 3};
    assert_ok(slapo_split(ctx, x, 2, 3, sizes, p));
  } else if (how == CUT_GAP) { /* [0, 2), [2, 3), [4, 6): element 3 has no piece */
    p[0] = slapo_slice(ctx, x, 2, 0, 2);
    p[1] = slapo_slice(ctx, x, 2, 2, 3);
    p[2] = slapo_slice(ctx, x, -1, 4, 6);
  } else { /* [0, 6) step 2 and [1, 6) step 2 tile the dim but are strided */
    slapo_attr a[4] = {slapo_attr_int("dim", 2), slapo_attr_int("start", 0),
                       slapo_attr_int("end", 6), slapo_attr_int("step", 2)};
    p[0] = slapo_op_call(ctx, "slice", 1, &x, 4, a);
    a[1] = slapo_attr_int("start", 1);
    p[1] = slapo_op_call(ctx, "slice", 1, &x, 4, a);
    p[2] = slapo_slice(ctx, x, 2, 0, 1);
  }
  slapo_node *t0 = slapo_mul(ctx, p[0], p[0]);
  slapo_node *t1 = slapo_exp(ctx, p[1]);
  slapo_node *t2 = slapo_mul_scalar(ctx, p[2], 3.0);
  int64_t all[3] = {0, 1, 2};
  slapo_node *loss = slapo_add(ctx, slapo_sum(ctx, t0, 3, all, false),
                               slapo_sum(ctx, t1, 3, all, false));
  loss = slapo_add(ctx, loss, slapo_sum(ctx, t2, 3, all, false));
  /* CUT_REUSED: x also feeds the loss directly, so dx = (sum of the
   * pieces' gradients) + that user's gradient. */
  if (how == CUT_REUSED) loss = slapo_add(ctx, loss, slapo_sum(ctx, x, 3, all, false));
  slapo_node *dx = NULL;
  assert_ok(slapo_backward(ctx, loss, NULL, 1, &x, &dx));
  slapo_node *outs[2] = {loss, dx};
  assert_non_null(slapo_output(ctx, 2, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

/* Runs g on fixed x; returns an owned copy of dx. */
static slapo_tensor *run(const slapo_graph *g) {
  int64_t shape[3] = {2, 3, 6};
  slapo_tensor *x, *dx;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 3, shape, &x));
  float *xp = slapo_tensor_data(x);
  for (int i = 0; i < 36; i++) xp[i] = (float)(i % 7) * 0.25f - 0.75f;
  slapo_plan *p;
  assert_ok(slapo_plan_new(g, NULL, &p));
  assert_ok(slapo_plan_bind_input(p, "x", x));
  assert_ok(slapo_plan_run(p, NULL));
  assert_ok(slapo_tensor_contiguous(slapo_plan_output(p, 1), &dx));
  slapo_plan_free(p);
  slapo_tensor_free(x);
  return dx;
}

static void check_folds(cut how) {
  slapo_graph *plain = build(how), *folded = build(how);
  int n = -1;
  assert_ok(run_rule(folded, "fold_split_grads", &n));
  assert_int_equal(n, 1);
  assert_ok(slapo_graph_lint(folded));
  assert_int_equal(count_op(plain, "slice_backward"), 3);
  assert_int_equal(count_op(folded, "slice_backward"), 0);
  assert_int_equal(count_op(folded, "concat"), 1);
  slapo_tensor *a = run(plain), *b = run(folded);
  assert_memory_equal(slapo_tensor_data(a), slapo_tensor_data(b), slapo_tensor_nbytes(a));
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  slapo_graph_free(plain);
  slapo_graph_free(folded);
}

static void test_split_gradient_becomes_concat(void **state) {
  (void)state;
  check_folds(CUT_SPLIT);
}

static void test_split_of_a_value_with_other_users(void **state) {
  (void)state;
  check_folds(CUT_REUSED);
}

static void test_other_sums_are_left_alone(void **state) {
  (void)state;
  const cut cuts[2] = {CUT_GAP, CUT_STRIDED};
  for (int i = 0; i < 2; i++) {
    slapo_graph *g = build(cuts[i]);
    int before = slapo_graph_count(g), n = -1;
    assert_ok(run_rule(g, "fold_split_grads", &n));
    assert_int_equal(n, 0);
    assert_int_equal(slapo_graph_count(g), before);
    slapo_graph_free(g);
  }
}

/* A GPT-2 train step folds the q/k/v split of every layer, and two norm
 * gradient adds a layer. */
static void test_gpt2_step_folds_every_attention_split(void **state) {
  (void)state;
  slapo_gpt2_config cfg;
  slapo_module *m;
  slapo_runner *r;
  assert_ok(slapo_gpt2_config_named("tiny", &cfg));
  cfg.n_layer = 2;
  assert_ok(slapo_gpt2_new(&cfg, &m));
  assert_ok(slapo_module_materialize(m, 1));
  assert_ok(slapo_runner_new(m, NULL, &r));
  int64_t shape[2] = {2, 8};
  slapo_tensor *x, *y;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &x));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &y));
  int32_t *xp = slapo_tensor_data(x), *yp = slapo_tensor_data(y);
  for (int i = 0; i < 16; i++) xp[i] = i * 7 % 256, yp[i] = i * 13 % 256;
  const slapo_tensor *in[2] = {x, y};
  assert_ok(slapo_step(r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL));
  const slapo_graph *g = slapo_runner_graph(r);
  assert_int_equal(count_op(g, "concat"), cfg.n_layer);
  /* The one slice_backward left is wpe's (positions 0..T-1 of n_ctx). */
  assert_int_equal(count_op(g, "slice_backward"), 1);
  /* Each block's two LayerNorm inputs are also the residual stream: two
   * gradient adds a block went into layer_norm_backward. */
  int folded = 0;
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next)
    folded += slapo_node_is_op(n, SLAPO_OP_DESC(layer_norm_backward)) &&
              slapo_node_attr_int(n, "residual", 0);
  assert_int_equal(folded, 2 * cfg.n_layer);
  slapo_runner_free(r);
  slapo_module_free(m);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
}

/* Runs one step of a 2-layer `tiny` GPT-2 with the given dropout; returns
 * the number of dropout nodes in the step graph and copies the output
 * (loss in train mode, logits in eval mode) to *out (owned). */
static int gpt2_dropouts(double p, slapo_step_mode mode, slapo_tensor **out) {
  slapo_gpt2_config cfg;
  slapo_module *m;
  slapo_runner *r;
  assert_ok(slapo_gpt2_config_named("tiny", &cfg));
  cfg.n_layer = 2;
  cfg.dropout = p;
  assert_ok(slapo_gpt2_new(&cfg, &m));
  assert_ok(slapo_module_materialize(m, 1));
  assert_ok(slapo_runner_new(m, NULL, &r));
  int64_t shape[2] = {2, 8};
  slapo_tensor *x, *y;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &x));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &y));
  int32_t *xp = slapo_tensor_data(x), *yp = slapo_tensor_data(y);
  for (int i = 0; i < 16; i++) xp[i] = i * 7 % 256, yp[i] = i * 13 % 256;
  const slapo_tensor *in[2] = {x, y}, *o = NULL;
  slapo_kernel_env env = {.seed = 3, .step = 1, .training = true};
  assert_ok(slapo_step(r, mode == SLAPO_STEP_TRAIN ? 2 : 1, in, mode, &env, &o));
  assert_ok(slapo_tensor_contiguous(o, out));
  int n = count_op(slapo_runner_graph(r), "dropout");
  slapo_runner_free(r);
  slapo_module_free(m);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
  return n;
}

static void test_identity_dropouts_are_removed(void **state) {
  (void)state;
  slapo_tensor *a, *b, *c;
  assert_int_equal(gpt2_dropouts(0.0, SLAPO_STEP_TRAIN, &a), 0);
  assert_true(gpt2_dropouts(0.1, SLAPO_STEP_TRAIN, &b) > 0); /* forward and backward */
  slapo_tensor_free(b);
  slapo_tensor_free(a);
  /* Eval: none left, and the logits do not depend on p. */
  assert_int_equal(gpt2_dropouts(0.1, SLAPO_STEP_EVAL, &b), 0);
  assert_int_equal(gpt2_dropouts(0.0, SLAPO_STEP_EVAL, &c), 0);
  assert_memory_equal(slapo_tensor_data(b), slapo_tensor_data(c), slapo_tensor_nbytes(b));
  slapo_tensor_free(b);
  slapo_tensor_free(c);
}

/* loss = sum(linear(embedding(W, idx), W)^2) with W [11, 6] used twice
 * (GPT-2's tied wte / lm_head); output (loss, dW). */
static slapo_graph *build_tied(void) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t ws[2] = {11, 6}, is[1] = {7};
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, ws);
  slapo_node *idx = slapo_input(ctx, "idx", SLAPO_DTYPE_I32, 1, is);
  slapo_node *logits = slapo_linear(ctx, slapo_embedding(ctx, w, idx), w, NULL); /* [7, 11] */
  int64_t all[2] = {0, 1};
  slapo_node *loss = slapo_sum(ctx, slapo_mul(ctx, logits, logits), 2, all, false);
  slapo_node *dw = NULL;
  assert_ok(slapo_backward(ctx, loss, NULL, 1, &w, &dw));
  slapo_node *outs[2] = {loss, dw};
  assert_non_null(slapo_output(ctx, 2, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

static slapo_tensor *run_tied(const slapo_graph *g) {
  int64_t ws[2] = {11, 6}, is[1] = {7};
  slapo_tensor *w, *idx, *dw;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ws, &w));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 1, is, &idx));
  float *wp = slapo_tensor_data(w);
  int32_t *ip = slapo_tensor_data(idx);
  for (int i = 0; i < 66; i++) wp[i] = (float)(i % 9) * 0.1f - 0.4f;
  for (int i = 0; i < 7; i++) ip[i] = (i * 5) % 11 % 4; /* repeated rows */
  slapo_plan *p;
  assert_ok(slapo_plan_new(g, NULL, &p));
  assert_ok(slapo_plan_bind_input(p, "w", w));
  assert_ok(slapo_plan_bind_input(p, "idx", idx));
  assert_ok(slapo_plan_run(p, NULL));
  assert_ok(slapo_tensor_contiguous(slapo_plan_output(p, 1), &dw));
  slapo_plan_free(p);
  slapo_tensor_free(w);
  slapo_tensor_free(idx);
  return dw;
}

static void test_tied_embedding_gradient_scatters_into_other(void **state) {
  (void)state;
  slapo_graph *plain = build_tied(), *folded = build_tied();
  int n = -1;
  assert_ok(run_rule(folded, "fold_index_add", &n));
  assert_int_equal(n, 1);
  assert_ok(slapo_graph_lint(folded));
  assert_int_equal(count_op(plain, "full") - count_op(folded, "full"), 1);
  assert_int_equal(count_op(plain, "add") - count_op(folded, "add"), 1);
  assert_int_equal(count_op(folded, "index_add"), 1);
  slapo_tensor *a = run_tied(plain), *b = run_tied(folded);
  const float *ap = slapo_tensor_data(a), *bp = slapo_tensor_data(b);
  for (int i = 0; i < 66; i++) assert_float_equal(ap[i], bp[i], 1e-6 * (fabs(ap[i]) + 1));
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  slapo_graph_free(plain);
  slapo_graph_free(folded);
}

/* The shapes of the LayerNorm fold's graphs. */
enum { LR = 37, LC = 19 };

/* How the LayerNorm under test is built. */
typedef enum ln_form {
  LN_PARAMS,    /* affine, dw and db wanted: the packed form */
  LN_DX_ONLY,   /* affine, only dx wanted */
  LN_PLAIN,     /* no weight */
  LN_RMS,       /* rms_norm with a weight */
  LN_SWAPPED,   /* built by hand: add(r, dx), r an input */
  LN_LATE,      /* x's other user first: its gradient comes after the LayerNorm's */
} ln_form;

/* loss = sum(layer_norm(x)^2 * k) + sum(x * x) over x [LR, LC], and the
 * gradients (of x, then w and b when LN_PARAMS). x has two users, so its
 * gradient is the sum of the LayerNorm's dx and 2x. */
static slapo_graph *build_ln(ln_form form) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  int64_t xs[2] = {LR, LC}, cs[1] = {LC}, all[2] = {0, 1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, xs);
  slapo_node *k = slapo_input(ctx, "k", SLAPO_DTYPE_F32, 2, xs);
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 1, cs);
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, cs);
  if (form == LN_SWAPPED) {
    /* add(r, layer_norm_backward(x, w, dy)) with r = x and dy = k. */
    slapo_node *in[3] = {x, w, k};
    slapo_attr eps = slapo_attr_float("eps", 1e-5);
    slapo_node *dx = slapo_op_apply(ctx, SLAPO_OP_DESC(layer_norm_backward), 3, in, 1, &eps);
    slapo_node *outs[2] = {slapo_sum(ctx, b, 1, all, false), slapo_add(ctx, x, dx)};
    assert_non_null(slapo_output(ctx, 2, outs));
    assert_ok(slapo_ctx_status(ctx));
    slapo_ctx_free(ctx);
    return g;
  }
  slapo_node *sq = form == LN_LATE ? slapo_mul(ctx, x, x) : NULL;
  slapo_node *y = form == LN_PLAIN ? slapo_layer_norm(ctx, x, NULL, NULL, 1e-5)
                  : form == LN_RMS ? slapo_rms_norm(ctx, x, w, 1e-6)
                                   : slapo_layer_norm(ctx, x, w, b, 1e-5);
  if (!sq) sq = slapo_mul(ctx, x, x);
  slapo_node *l1 = slapo_sum(ctx, slapo_mul(ctx, slapo_mul(ctx, y, y), k), 2, all, false);
  slapo_node *loss = slapo_add(ctx, l1, slapo_sum(ctx, sq, 2, all, false));
  slapo_node *wrt[3] = {x, w, b}, *d[3] = {NULL, NULL, NULL};
  int n = form == LN_PARAMS ? 3 : 1;
  assert_ok(slapo_backward(ctx, loss, NULL, n, wrt, d));
  slapo_node *outs[4] = {loss, d[0], d[1], d[2]};
  assert_non_null(slapo_output(ctx, n + 1, outs));
  assert_ok(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

/* Runs g (fast or reference kernels); returns its outputs after the loss,
 * concatenated (owned). */
static float *run_ln(const slapo_graph *g, bool reference, int *n_out) {
  int64_t xs[2] = {LR, LC}, cs[1] = {LC};
  slapo_tensor *t[4];
  const char *names[4] = {"x", "k", "w", "b"};
  for (int i = 0; i < 4; i++) {
    assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, i < 2 ? 2 : 1, i < 2 ? xs : cs, &t[i]));
    float *p = slapo_tensor_data(t[i]);
    for (int64_t j = 0; j < slapo_tensor_numel(t[i]); j++)
      p[j] = (float)((j * 7 + i * 3) % 23) * 0.09f - 0.8f;
  }
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  assert_ok(slapo_plan_new(g, &o, &p));
  for (int i = 0; i < 4; i++) slapo_plan_bind_input(p, names[i], t[i]);
  assert_ok(slapo_plan_run(p, NULL));
  int n = slapo_plan_output_count(p), len = 0;
  float *all = NULL;
  for (int i = 1; i < n; i++) {
    slapo_tensor *c;
    assert_ok(slapo_tensor_contiguous(slapo_plan_output(p, i), &c));
    int64_t m = slapo_tensor_numel(c);
    all = realloc(all, (size_t)(len + m) * sizeof *all);
    memcpy(all + len, slapo_tensor_data(c), (size_t)m * sizeof *all);
    len += (int)m;
    slapo_tensor_free(c);
  }
  slapo_plan_free(p);
  for (int i = 0; i < 4; i++) slapo_tensor_free(t[i]);
  *n_out = len;
  return all;
}

static void test_norm_gradient_add_folds_bitwise(void **state) {
  (void)state;
  for (int form = LN_PARAMS; form <= LN_LATE; form++) {
    slapo_graph *plain = build_ln((ln_form)form), *folded = build_ln((ln_form)form);
    int n = -1;
    assert_ok(run_rule(folded, "fold_norm_add", &n));
    if (form == LN_LATE) {
      /* The kernel would have to read a value computed after it: left alone. */
      assert_int_equal(n, 0);
      slapo_graph_free(plain);
      slapo_graph_free(folded);
      continue;
    }
    assert_int_equal(n, 1);
    assert_ok(slapo_graph_lint(folded));
    assert_int_equal(count_op(plain, "add") - count_op(folded, "add"), 1);
    const char *bwd = form == LN_RMS ? "rms_norm_backward" : "layer_norm_backward";
    assert_int_equal(count_op(folded, bwd), count_op(plain, bwd));
    /* Folding twice finds nothing more. */
    assert_ok(run_rule(folded, "fold_norm_add", &n));
    assert_int_equal(n, 0);
    for (int ref = 0; ref < 2; ref++) {
      int na, nb;
      float *a = run_ln(plain, ref, &na), *b = run_ln(folded, ref, &nb);
      assert_int_equal(na, nb);
      if (memcmp(a, b, (size_t)na * sizeof *a))
        fail_msg("form %d, %s kernels: the folded graph's gradients differ", form,
                 ref ? "reference" : "fast");
      free(a);
      free(b);
    }
    slapo_graph_free(plain);
    slapo_graph_free(folded);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_gradient_becomes_concat),
      cmocka_unit_test(test_split_of_a_value_with_other_users),
      cmocka_unit_test(test_other_sums_are_left_alone),
      cmocka_unit_test(test_gpt2_step_folds_every_attention_split),
      cmocka_unit_test(test_identity_dropouts_are_removed),
      cmocka_unit_test(test_tied_embedding_gradient_scatters_into_other),
      cmocka_unit_test(test_norm_gradient_add_folds_bitwise),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
