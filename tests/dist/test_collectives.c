/* tests/dist/test_collectives.c - the collective ops (forward and gradient
 * rules), the vocab-parallel cross-entropy against the unsharded one, and
 * shard layouts. CTest runs it alone (one rank: collectives are copies, the
 * gradcheck covers the rules' plumbing) and under mpirun -np 2, where every
 * rank checks its values against what the definitions give for all ranks'
 * inputs (each rank knows every rank's inputs: they are functions of the
 * rank). */
#include <math.h>
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/gradcheck.h"
#include "slapo/autograd.h"
#include "slapo/dist.h"

static int R, N; /* this rank, world size */

/* x of rank r: [2N, 3], element i = 100 r + i. dy of rank r: 1 + r + i / 8. */
static float xval(int r, int64_t i) { return 100.0f * (float)r + (float)i; }
static float dyval(int r, int64_t i) { return 1.0f + (float)r + (float)i / 8.0f; }

typedef struct run_out {
  slapo_tensor *y, *dx;
} run_out;

/* y = build(x) and dx for dy on this rank; shapes from the graph. */
static run_out run_op(slapo_node *(*build)(slapo_ctx *, slapo_node *)) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_int_equal(slapo_graph_new(&g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(g, &ctx), SLAPO_OK);
  int64_t xs[2] = {2 * N, 3};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, xs);
  slapo_node *y = build(ctx, x);
  assert_non_null(y);
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, y->ndim, y->shape), *dx;
  assert_int_equal(slapo_backward(ctx, y, dy, 1, &x, &dx), SLAPO_OK);
  slapo_node *outs[2] = {y, dx};
  slapo_output(ctx, 2, outs);
  assert_int_equal(slapo_ctx_status(ctx), SLAPO_OK);
  slapo_tensor *xt, *dyt;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, xs, &xt), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, y->ndim, y->shape, &dyt), SLAPO_OK);
  float *xd = slapo_tensor_data(xt), *dyd = slapo_tensor_data(dyt);
  for (int64_t i = 0; i < slapo_tensor_numel(xt); i++) xd[i] = xval(R, i);
  for (int64_t i = 0; i < slapo_tensor_numel(dyt); i++) dyd[i] = dyval(R, i);
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(g, NULL, &p), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "x", xt), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "dy", dyt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  assert_int_equal(slapo_dist_kernel_status(), SLAPO_OK);
  run_out o;
  assert_int_equal(slapo_tensor_contiguous(slapo_plan_output(p, 0), &o.y), SLAPO_OK);
  assert_int_equal(slapo_tensor_contiguous(slapo_plan_output(p, 1), &o.dx), SLAPO_OK);
  slapo_plan_free(p);
  slapo_tensor_free(xt);
  slapo_tensor_free(dyt);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return o;
}

static void expect(const slapo_tensor *t, int64_t n, float (*want)(int64_t), const char *what) {
  assert_int_equal(slapo_tensor_numel(t), n);
  const float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < n; i++)
    if (d[i] != want(i)) fail_msg("%s[%lld] = %g, want %g (rank %d of %d)", what, (long long)i,
                                  d[i], want(i), R, N);
}

static void free_out(run_out o) {
  slapo_tensor_free(o.y);
  slapo_tensor_free(o.dx);
}

/* x has 6N elements, a dim-0 block of it 6; a block of a gathered value 6N. */
static float sum_x(int64_t i) {
  float s = 0;
  for (int r = 0; r < N; r++) s += xval(r, i);
  return s;
}
static float sum_dy(int64_t i) {
  float s = 0;
  for (int r = 0; r < N; r++) s += dyval(r, i);
  return s;
}
static float own_x(int64_t i) { return xval(R, i); }
static float own_dy(int64_t i) { return dyval(R, i); }

static slapo_node *b_all_reduce(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_all_reduce(c, x, SLAPO_GROUP_WORLD);
}
static void test_all_reduce(void **state) {
  (void)state;
  run_out o = run_op(b_all_reduce);
  expect(o.y, 6 * N, sum_x, "y");
  expect(o.dx, 6 * N, own_dy, "dx"); /* identity */
  free_out(o);
}

static slapo_node *b_reduce_grad(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_reduce_grad(c, x, SLAPO_GROUP_WORLD);
}
static void test_reduce_grad(void **state) {
  (void)state;
  run_out o = run_op(b_reduce_grad);
  expect(o.y, 6 * N, own_x, "y");
  expect(o.dx, 6 * N, sum_dy, "dx");
  free_out(o);
}

/* all_gather along dim 0: y [2N * N, 3] = x of rank 0, rank 1, ...; dx =
 * own block (6N elements) of the summed dy. */
static float gathered_x(int64_t i) { return xval((int)(i / (6 * N)), i % (6 * N)); }
static float own_block_sum_dy(int64_t i) { return sum_dy(R * 6 * N + i); }
static float own_block_dy(int64_t i) { return dyval(R, R * 6 * N + i); }
static slapo_node *b_all_gather(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_all_gather(c, x, 0, true, SLAPO_GROUP_WORLD);
}
static slapo_node *b_all_gather_noreduce(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_all_gather(c, x, 0, false, SLAPO_GROUP_WORLD);
}
static void test_all_gather(void **state) {
  (void)state;
  run_out o = run_op(b_all_gather);
  expect(o.y, 6 * N * N, gathered_x, "y");
  expect(o.dx, 6 * N, own_block_sum_dy, "dx");
  free_out(o);
  o = run_op(b_all_gather_noreduce);
  expect(o.dx, 6 * N, own_block_dy, "dx (reduce=0)");
  free_out(o);
}

/* reduce_scatter: y = own block (6 elements) of sum x; dx = every rank's dy. */
static float own_block_sum_x(int64_t i) { return sum_x(R * 6 + i); }
static float gathered_dy(int64_t i) { return dyval((int)(i / 6), i % 6); }
static slapo_node *b_reduce_scatter(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_reduce_scatter(c, x, 0, SLAPO_GROUP_WORLD);
}
static void test_reduce_scatter(void **state) {
  (void)state;
  run_out o = run_op(b_reduce_scatter);
  expect(o.y, 6, own_block_sum_x, "y");
  expect(o.dx, 6 * N, gathered_dy, "dx");
  free_out(o);
}

static float own_block_x(int64_t i) { return xval(R, R * 6 + i); }
static slapo_node *b_scatter(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_scatter(c, x, 0, SLAPO_GROUP_WORLD);
}
static void test_scatter(void **state) {
  (void)state;
  run_out o = run_op(b_scatter);
  expect(o.y, 6, own_block_x, "y");
  expect(o.dx, 6 * N, gathered_dy, "dx");
  free_out(o);
}

/* Along the last axis (a permute there and back): x [2N, 3] gathered to
 * [2N, 3N], row t = rank 0's row t, rank 1's row t, ... */
static float gathered_last(int64_t i) {
  int64_t row = i / (3 * N), col = i % (3 * N);
  return xval((int)(col / 3), row * 3 + col % 3);
}
static slapo_node *b_gather_last(slapo_ctx *c, slapo_node *x) {
  return slapo_dist_all_gather(c, x, -1, true, SLAPO_GROUP_WORLD);
}
static void test_all_gather_last_axis(void **state) {
  (void)state;
  run_out o = run_op(b_gather_last);
  expect(o.y, 6 * N * N, gathered_last, "y");
  free_out(o);
}

/* One rank: every collective is a copy, and the rules pass a gradcheck. */
static void test_gradcheck_one_rank(void **state) {
  (void)state;
  if (N != 1) skip();
  const slapo_op *ops[] = {&slapo_dist_op_all_reduce, &slapo_dist_op_reduce_grad,
                           &slapo_dist_op_all_gather, &slapo_dist_op_reduce_scatter,
                           &slapo_dist_op_scatter, &slapo_dist_op_vocab_parallel_cross_entropy};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    char report[512];
    if (gradcheck_op(ops[i], 7, report, sizeof report) != SLAPO_OK)
      fail_msg("%s: %s", ops[i]->name, report);
  }
}

/* ---- vocab-parallel cross-entropy ---- */

/* logits [R, V] of the unsharded model: a function of (row, class); each
 * rank holds classes [r V/N, (r + 1) V/N) of the padded vocabulary Vp. */
static float logit(int64_t row, int64_t c) { return (float)sin(0.37 * (double)(row * 131 + c)) * 4; }

static void vocab_parallel_case(int64_t V, int64_t rows) {
  int64_t Vp = (V + 128 * N - 1) / (128 * N) * (128 * N); /* GPT-2's padding rule */
  int64_t Vl = Vp / N, start = R * Vl;
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_int_equal(slapo_graph_new(&g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(g, &ctx), SLAPO_OK);
  int64_t ls[2] = {rows, Vl}, fs[2] = {rows, V};
  slapo_node *xl = slapo_input(ctx, "xl", SLAPO_DTYPE_F32, 2, ls);
  slapo_node *xf = slapo_input(ctx, "xf", SLAPO_DTYPE_F32, 2, fs);
  slapo_node *t = slapo_input(ctx, "t", SLAPO_DTYPE_I32, 1, ls);
  slapo_node *lv = slapo_dist_vocab_parallel_cross_entropy(ctx, xl, t, start, V, -100,
                                                           SLAPO_GROUP_WORLD);
  slapo_node *lf = slapo_cross_entropy(ctx, xf, t, -100);
  slapo_node *dl, *df;
  assert_int_equal(slapo_backward(ctx, lv, NULL, 1, &xl, &dl), SLAPO_OK);
  assert_int_equal(slapo_backward(ctx, lf, NULL, 1, &xf, &df), SLAPO_OK);
  slapo_node *outs[4] = {lv, lf, dl, df};
  slapo_output(ctx, 4, outs);
  assert_int_equal(slapo_ctx_status(ctx), SLAPO_OK);
  slapo_tensor *txl, *txf, *tt;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ls, &txl), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, fs, &txf), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 1, ls, &tt), SLAPO_OK);
  float *a = slapo_tensor_data(txl), *b = slapo_tensor_data(txf);
  int32_t *td = slapo_tensor_data(tt);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < Vl; c++)
      a[r * Vl + c] = start + c < V ? logit(r, start + c) : 1e4f; /* padding: never counted */
    for (int64_t c = 0; c < V; c++) b[r * V + c] = logit(r, c);
    /* targets on every rank's slice, the last class, and one ignored row */
    td[r] = r == 1 ? -100 : r == 2 ? (int32_t)(V - 1) : (int32_t)((r * 7919) % V);
  }
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(g, NULL, &p), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "xl", txl), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "xf", txf), SLAPO_OK);
  assert_int_equal(slapo_plan_bind_input(p, "t", tt), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  float got = *(const float *)slapo_tensor_data(slapo_plan_output(p, 0));
  float want = *(const float *)slapo_tensor_data(slapo_plan_output(p, 1));
  assert_true(fabsf(got - want) <= 1e-5f * fabsf(want) + 1e-6f);
  const float *gd = slapo_tensor_data(slapo_plan_output(p, 2));
  const float *wd = slapo_tensor_data(slapo_plan_output(p, 3));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < Vl; c++) {
      float w = start + c < V ? wd[r * V + start + c] : 0.0f;
      if (fabsf(gd[r * Vl + c] - w) > 1e-7f)
        fail_msg("V=%lld: dlogits[%lld, %lld] = %g, want %g", (long long)V, (long long)r,
                 (long long)(start + c), gd[r * Vl + c], w);
    }
  slapo_plan_free(p);
  slapo_tensor_free(txl);
  slapo_tensor_free(txf);
  slapo_tensor_free(tt);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void test_vocab_parallel_cross_entropy(void **state) {
  (void)state;
  vocab_parallel_case(256, 5);
  vocab_parallel_case(50257, 4); /* GPT-2's vocabulary: padded to a multiple of 128 N */
}

/* Plans a vocab-parallel loss over logits [1, Vl] holding classes
 * [start, start + Vl) of [0, valid): the status of slapo_plan_new; on
 * success *loss gets the loss of logits 0.5 c - 1 (c the global class) for
 * target 1. */
static slapo_status plan_vocab_layout(int64_t start, int64_t Vl, int64_t valid, float *loss) {
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_int_equal(slapo_graph_new(&g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(g, &ctx), SLAPO_OK);
  int64_t ls[2] = {1, Vl}, ts[1] = {1};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, ls);
  slapo_node *t = slapo_input(ctx, "t", SLAPO_DTYPE_I32, 1, ts);
  slapo_node *l = slapo_dist_vocab_parallel_cross_entropy(ctx, x, t, start, valid, -100,
                                                          SLAPO_GROUP_WORLD);
  slapo_output(ctx, 1, &l);
  assert_int_equal(slapo_ctx_status(ctx), SLAPO_OK); /* shapes alone look fine */
  slapo_plan *p = NULL;
  slapo_status s = slapo_plan_new(g, NULL, &p);
  if (s == SLAPO_OK) {
    slapo_tensor *xt, *tt;
    assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ls, &xt), SLAPO_OK);
    assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 1, ts, &tt), SLAPO_OK);
    for (int64_t c = 0; c < Vl; c++) ((float *)slapo_tensor_data(xt))[c] = 0.5f * (float)(start + c) - 1;
    *(int32_t *)slapo_tensor_data(tt) = 1;
    assert_int_equal(slapo_plan_bind_input(p, "x", xt), SLAPO_OK);
    assert_int_equal(slapo_plan_bind_input(p, "t", tt), SLAPO_OK);
    assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
    assert_int_equal(slapo_dist_kernel_status(), SLAPO_OK);
    *loss = *(const float *)slapo_tensor_data(slapo_plan_output(p, 0));
    slapo_tensor_free(xt);
    slapo_tensor_free(tt);
  }
  slapo_plan_free(p);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}

/* The case: every rank passes the full logits [1, 4] with
 * vocab_start 0 and vocab_valid 4. One rank holds the whole vocabulary
 * (the true loss); two ranks would count every class twice (the loss plus
 * ln 2): refused when planned, naming each rank's range. */
static void test_vocab_parallel_refuses_overlap(void **state) {
  (void)state;
  float loss = 0;
  slapo_status s = plan_vocab_layout(0, 4, 4, &loss);
  if (N == 1) {
    assert_int_equal(s, SLAPO_OK);
    /* logits -1, -0.5, 0, 0.5; target 1 */
    double z = exp(-1.0) + exp(-0.5) + exp(0.0) + exp(0.5);
    assert_true(fabs(loss - (log(z) + 0.5)) < 1e-6);
    return;
  }
  assert_int_equal(s, SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "the ranges overlap at class 0"));
  assert_non_null(strstr(slapo_last_error(), "rank 0 [0, 4), rank 1 [0, 4)"));
}

/* Ranges with a gap (classes 2, 5, .. on no rank) and ranks counting
 * different vocabularies are refused; a true split of the same classes is
 * planned and gives the one-rank loss. */
static void test_vocab_parallel_refuses_gaps(void **state) {
  (void)state;
  float loss = 0;
  if (N > 1) {
    assert_int_equal(plan_vocab_layout(3 * R, 2, 3 * N, &loss), SLAPO_SHAPE);
    assert_non_null(strstr(slapo_last_error(), "no rank holds classes 2 to 2"));
    assert_non_null(strstr(slapo_last_error(), "rank 0 [0, 2), rank 1 [3, 5)"));
    assert_int_equal(plan_vocab_layout(2 * R, 2, 2 * N + R, &loss), SLAPO_SHAPE);
    assert_non_null(strstr(slapo_last_error(), "different vocabularies"));
    /* the last rank's part stops short of vocab_valid */
    assert_int_equal(plan_vocab_layout(2 * R, 2, 2 * N + 1, &loss), SLAPO_SHAPE);
    assert_non_null(strstr(slapo_last_error(), "short of vocab_valid"));
  }
  assert_int_equal(plan_vocab_layout(2 * R, 2, 2 * N, &loss), SLAPO_OK);
  double z = 0;
  for (int c = 0; c < 2 * N; c++) z += exp(0.5 * c - 1);
  assert_true(fabs(loss - (log(z) + 0.5)) < 1e-5);
}

/* ---- shard layouts ---- */

static void test_shard_layout_parts(void **state) {
  (void)state;
  /* [6, 2] in 3 blocks over 2 ranks: rank 1 holds rows 1, 3, 5. */
  int64_t full[2] = {6, 2};
  slapo_shard s;
  assert_int_equal(slapo_shard_make(2, full, 0, 3, 1, 2, 1, &s), SLAPO_OK);
  int64_t want[6] = {2, 3, 6, 7, 10, 11};
  for (int i = 0; i < 6; i++) assert_int_equal(slapo_shard_global_index(&s, i), want[i]);
  /* axis 1 of [2, 4] over 2 ranks: rank 1 holds columns 2, 3. */
  int64_t f2[2] = {2, 4};
  assert_int_equal(slapo_shard_make(2, f2, -1, 1, 1, 2, 1, &s), SLAPO_OK);
  int64_t want2[4] = {2, 3, 6, 7};
  for (int i = 0; i < 4; i++) assert_int_equal(slapo_shard_global_index(&s, i), want2[i]);
  /* place(slice) is the identity over all ranks */
  slapo_tensor *t = NULL, *back = NULL, *piece = NULL;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, full, &t), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, full, &back), SLAPO_OK);
  for (int i = 0; i < 12; i++) ((float *)slapo_tensor_data(t))[i] = (float)i;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(slapo_shard_make(2, full, 0, 3, r, 2, 1, &s), SLAPO_OK);
    assert_int_equal(slapo_shard_slice(&s, t, &piece), SLAPO_OK);
    slapo_shard_place(&s, r, slapo_tensor_data(piece), back);
    slapo_tensor_free(piece);
  }
  assert_true(slapo_tensor_equal(t, back));
  slapo_tensor_free(t);
  slapo_tensor_free(back);
}

/* A vocabulary of 50257 rows padded to a multiple of 128 x 2: 25216 rows a
 * rank, the last 175 of rank 1 padding; slicing the unpadded tensor reads
 * zeros there and placing drops them. */
static void test_shard_padding(void **state) {
  (void)state;
  int64_t full[2] = {50257, 2};
  slapo_shard s;
  assert_int_equal(slapo_shard_make(2, full, 0, 1, 1, 2, 128, &s), SLAPO_OK);
  assert_int_equal(s.full[0], 50432);
  assert_int_equal(s.valid, 50257);
  int64_t local[2];
  slapo_shard_local_shape(&s, local);
  assert_int_equal(local[0], 25216);
  slapo_tensor *t, *piece, *back;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, full, &t), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, full, &back), SLAPO_OK);
  float *d = slapo_tensor_data(t);
  for (int64_t i = 0; i < 2 * 50257; i++) d[i] = (float)(i + 1);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(slapo_shard_make(2, full, 0, 1, r, 2, 128, &s), SLAPO_OK);
    assert_int_equal(slapo_shard_slice(&s, t, &piece), SLAPO_OK);
    const float *p = slapo_tensor_data(piece);
    if (r == 1) {
      assert_true(p[2 * (50257 - 25216) - 1] == (float)(2 * 50257)); /* the last real row */
      assert_true(p[2 * (50257 - 25216)] == 0.0f);                    /* padding */
    }
    slapo_shard_place(&s, r, p, back);
    slapo_tensor_free(piece);
  }
  assert_true(slapo_tensor_equal(t, back));
  assert_int_equal(slapo_shard_make(2, full, 1, 1, 0, 2, 128, &s), SLAPO_INVALID_ARG);
  slapo_tensor_free(t);
  slapo_tensor_free(back);
}

static void test_shard_layout_errors(void **state) {
  (void)state;
  int64_t full[2] = {50257, 768};
  slapo_shard s;
  assert_int_equal(slapo_shard_make(2, full, 0, 1, 0, 2, 1, &s), SLAPO_SHAPE); /* no pad= */
  assert_non_null(strstr(slapo_last_error(), "50257"));
  assert_non_null(strstr(slapo_last_error(), "group size 2"));
  assert_int_equal(slapo_shard_make(2, full, 2, 1, 0, 2, 1, &s), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_shard_make(2, full, 0, 1, 2, 2, 1, &s), SLAPO_INVALID_ARG);
  int64_t qkv[2] = {3 * 10, 4};
  assert_int_equal(slapo_shard_make(2, qkv, 0, 3, 0, 4, 1, &s), SLAPO_SHAPE);
  assert_non_null(strstr(slapo_last_error(), "parts"));
}

/* The gradient all-reduce: tensors of 3, 5 Mi (larger than a bucket of the
 * shared-memory path, 4 Mi floats, and straddling two), 7 and 3 Mi + 1
 * floats, element i of tensor t on rank r = r + 8 t + (i mod 1024) (exact
 * in f32), summed over the ranks; twice, so both alternating buckets and
 * a second call are used, then the sum of sums. */
static void test_all_reduce_tensors(void **state) {
  (void)state;
  const int64_t sizes[] = {3, 5 << 20, 7, (3 << 20) + 1};
  enum { NT = 4 };
  slapo_tensor *ts[NT];
  for (int t = 0; t < NT; t++) {
    assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 1, &sizes[t], &ts[t]), SLAPO_OK);
    float *d = slapo_tensor_data(ts[t]);
    for (int64_t i = 0; i < sizes[t]; i++) d[i] = (float)(R + 8 * t + i % 1024);
  }
  for (int call = 1; call <= 2; call++) {
    double sec = -1;
    assert_int_equal(slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, NT, ts, &sec), SLAPO_OK);
    assert_true(sec >= 0);
    /* after call c: N^(c-1) * (sum_r r + N (8 t + i mod 1024)) */
    double scale = call == 1 ? 1 : N;
    for (int t = 0; t < NT; t++) {
      const float *d = slapo_tensor_data(ts[t]);
      for (int64_t i = 0; i < sizes[t]; i++) {
        double want = scale * (N * (N - 1) / 2.0 + N * (8.0 * t + (double)(i % 1024)));
        if (d[i] != (float)want) {
          fail_msg("call %d tensor %d element %lld: %g, want %g", call, t, (long long)i,
                   (double)d[i], want);
        }
      }
    }
  }
  for (int t = 0; t < NT; t++) slapo_tensor_free(ts[t]);
}

/* The timeout's own checks (no collective needed). */
static void test_timeout_setting(void **state) {
  (void)state;
  double before = slapo_dist_timeout();
  assert_true(before > 0);
  assert_int_equal(slapo_dist_set_timeout(0), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_dist_set_timeout(-1), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_dist_set_timeout(INFINITY), SLAPO_INVALID_ARG);
  assert_true(slapo_dist_timeout() == before);
  assert_int_equal(slapo_dist_set_timeout(before), SLAPO_OK);
}

/* Open MPI's value of MCA variable `name` (an int) in this process, through
 * the MPI tool interface; -1 when it has none. */
static int mca_int(const char *name) {
  int provided, n, value = -1;
  assert_int_equal(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  MPI_T_cvar_get_num(&n);
  for (int i = 0; i < n && value < 0; i++) {
    char var[256], desc[1024];
    int nlen = sizeof var, dlen = sizeof desc, verbosity, bind, scope, count;
    MPI_Datatype type;
    MPI_T_enum enumtype;
    MPI_T_cvar_get_info(i, var, &nlen, &verbosity, &type, &enumtype, desc, &dlen, &bind, &scope);
    if (strcmp(var, name) || type != MPI_INT || bind != MPI_T_BIND_NO_OBJECT) continue;
    MPI_T_cvar_handle h;
    MPI_T_cvar_handle_alloc(i, NULL, &h, &count);
    MPI_T_cvar_read(h, &value);
    MPI_T_cvar_handle_free(&h);
  }
  MPI_T_finalize();
  return value;
}

/* slapo_dist_init chose libnbc's ring all-reduce (1) before MPI_Init,
 * where the environment named no algorithm (CTest's names none); a value
 * of the user's own is kept, and MPI runs with what the variable says. */
static void test_mca_default(void **state) {
  (void)state;
  if (!slapo_dist_active()) skip();
  const char *v = getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm");
  assert_non_null(v);
  assert_int_equal(mca_int("coll_libnbc_iallreduce_algorithm"), atoi(v));
}

int main(void) {
  if (slapo_dist_init(1) != SLAPO_OK) {
    fprintf(stderr, "dist init: %s\n", slapo_last_error());
    return 1;
  }
  R = slapo_dist_rank(SLAPO_GROUP_WORLD);
  N = slapo_dist_size(SLAPO_GROUP_WORLD);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_reduce),
      cmocka_unit_test(test_reduce_grad),
      cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_reduce_scatter),
      cmocka_unit_test(test_scatter),
      cmocka_unit_test(test_all_gather_last_axis),
      cmocka_unit_test(test_gradcheck_one_rank),
      cmocka_unit_test(test_vocab_parallel_cross_entropy),
      cmocka_unit_test(test_vocab_parallel_refuses_overlap),
      cmocka_unit_test(test_vocab_parallel_refuses_gaps),
      cmocka_unit_test(test_shard_layout_parts),
      cmocka_unit_test(test_shard_padding),
      cmocka_unit_test(test_shard_layout_errors),
      cmocka_unit_test(test_all_reduce_tensors),
      cmocka_unit_test(test_timeout_setting),
      cmocka_unit_test(test_mca_default),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  slapo_dist_finalize();
  return rc;
}
