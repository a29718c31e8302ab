/* tests/unit/test_tp_layout.c - tensor-parallel layouts of values
 * (ops/layout.c) on one process, with the layouts of the inputs set by hand
 * as a rank's parameters would give them: the rules of reshape (the head
 * split), permute, slice (q|k|v), linear and matmul; dropout deriving its
 * shard attributes from its input's layout and drawing exactly the
 * unsharded model's numbers in its part (a blocked layout too); its
 * backward copying them; and the refusals of a dropout on a value of
 * unknown layout or on a partial sum. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/opfix.h"
#include "slapo/autograd.h"
#include "slapo/tensor.h"

static slapo_layout split(int axis, int parts, int64_t start, int64_t full) {
  return (slapo_layout){SLAPO_LAYOUT_SPLIT, axis, parts, start, full};
}

static void assert_split(const slapo_node *n, int axis, int parts, int64_t start, int64_t full) {
  char b[160];
  if (n->layout.kind != SLAPO_LAYOUT_SPLIT || n->layout.axis != axis ||
      n->layout.parts != parts || n->layout.start != start || n->layout.full != full)
    fail_msg("%%%s: layout %s, want split axis %d parts %d from %lld of %lld", n->name,
             slapo_layout_str(&n->layout, b, sizeof b), axis, parts, (long long)start,
             (long long)full);
}

/* c_attn's output on rank 1 of 2 (GPT-2, C 8 = 2 heads of 4): [B, T, 3 x 4]
 * holding columns [4, 8) of each of q, k, v -> split -> [B, T, 1, 4] heads
 * -> [B, 1, T, 4]: head 1 of 2. */
static void test_qkv_to_heads(void **state) {
  opfix *f = *state;
  int64_t s[3] = {2, 3, 12};
  slapo_node *qkv = opfix_input(f, "qkv", 3, s);
  qkv->layout = split(2, 3, 4, 24);
  slapo_node *parts[3];
  int64_t sizes[3] = {4, 4, 4};
  assert_int_equal(slapo_split(f->ctx, qkv, 2, 3, sizes, parts), SLAPO_OK);
  for (int i = 0; i < 3; i++) assert_split(parts[i], 2, 1, 4, 8);
  int64_t bthd[4] = {2, 3, 1, 4}, perm[4] = {0, 2, 1, 3};
  slapo_node *h = slapo_reshape(f->ctx, parts[0], 4, bthd);
  assert_split(h, 2, 1, 1, 2);
  slapo_node *p = slapo_permute(f->ctx, h, 4, perm);
  assert_split(p, 1, 1, 1, 2);
  slapo_node *att = slapo_softmax(f->ctx, slapo_matmul(f->ctx, p, p, false, true), true);
  assert_split(att, 1, 1, 1, 2);
  /* att @ v back to [B, T, C]: the heads axis merged with HS. */
  slapo_node *y = slapo_matmul(f->ctx, att, p, false, false);
  assert_split(y, 1, 1, 1, 2);
  int64_t btc[3] = {2, 3, 4};
  slapo_node *m = slapo_reshape(f->ctx, slapo_permute(f->ctx, y, 4, perm), 3, btc);
  assert_non_null(m);
  assert_split(m, 2, 1, 4, 8);
}

/* Linear: column parallel (w on axis 0, bias alike) gives a slice of the
 * last axis, row parallel (w on axis 1, x split alike) a partial sum, which
 * an all-reduce would make replicated; a replicated bias on a partial sum
 * is UNKNOWN. */
static void test_linear_rules(void **state) {
  opfix *f = *state;
  int64_t xs[2] = {5, 4}, ws[2] = {6, 4}, bs[1] = {6}, w2s[2] = {3, 6}, b2s[1] = {3};
  slapo_node *x = opfix_input(f, "x", 2, xs), *w = opfix_input(f, "w", 2, ws),
             *b = opfix_input(f, "b", 1, bs), *w2 = opfix_input(f, "w2", 2, w2s),
             *b2 = opfix_input(f, "b2", 1, b2s);
  w->layout = split(0, 1, 6, 12);
  b->layout = split(0, 1, 6, 12);
  w2->layout = split(1, 1, 6, 12);
  slapo_node *h = slapo_linear(f->ctx, x, w, b);
  assert_split(h, 1, 1, 6, 12);
  slapo_node *g = slapo_gelu(f->ctx, h, true);
  assert_split(g, 1, 1, 6, 12);
  slapo_node *y = slapo_linear(f->ctx, g, w2, NULL);
  assert_int_equal(y->layout.kind, SLAPO_LAYOUT_PARTIAL);
  assert_int_equal(slapo_mul_scalar(f->ctx, y, 2.0)->layout.kind, SLAPO_LAYOUT_PARTIAL);
  assert_int_equal(slapo_add(f->ctx, y, b2)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
  assert_int_equal(slapo_linear(f->ctx, g, w2, b2)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
  /* A bias split unlike the weight. */
  slapo_node *b3 = opfix_input(f, "b3", 1, bs);
  b3->layout = split(0, 1, 0, 12);
  assert_int_equal(slapo_linear(f->ctx, x, w, b3)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
}

/* Reshapes that mix the sharded axis, or split it off whole heads. */
static void test_reshape_mixing(void **state) {
  opfix *f = *state;
  int64_t s[2] = {4, 8};
  slapo_node *x = opfix_input(f, "x", 2, s);
  x->layout = split(1, 1, 8, 16);
  int64_t mixed[2] = {2, 16}, heads[3] = {4, 2, 4}, flat[1] = {32};
  assert_int_equal(slapo_reshape(f->ctx, x, 2, mixed)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
  assert_split(slapo_reshape(f->ctx, x, 3, heads), 1, 1, 2, 4);
  assert_int_equal(slapo_reshape(f->ctx, x, 1, flat)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
  /* Not head-aligned: columns [6, 14) are not whole heads of 4. */
  slapo_node *y = opfix_input(f, "y", 2, s);
  y->layout = split(1, 1, 6, 16);
  assert_int_equal(slapo_reshape(f->ctx, y, 3, heads)->layout.kind, SLAPO_LAYOUT_UNKNOWN);
}

/* dropout(x_local) equals the unsharded dropout's elements in this rank's
 * part, for a blocked layout (3 blocks of 4 columns, this rank holding
 * [1, 3) of each), by the reference and the fast kernel; the backward
 * copies the forward's shard attributes. */
static void test_dropout_draws_its_part(void **state) {
  opfix *f = *state;
  int64_t fs[2] = {3, 12}, ls[2] = {3, 6};
  slapo_node *xf = opfix_input(f, "xf", 2, fs), *xl = opfix_input(f, "xl", 2, ls);
  xl->layout = split(1, 3, 1, 12);
  /* One stream, as a model and its shard draw it (module path, call). */
  slapo_attr a[2] = {slapo_attr_float("p", 0.5), slapo_attr_int("stream", 1234)};
  slapo_node *yf = slapo_op_call(f->ctx, "dropout", 1, &xf, 2, a);
  slapo_node *yl = slapo_op_call(f->ctx, "dropout", 1, &xl, 2, a);
  assert_non_null(yf);
  assert_non_null(yl);
  assert_int_equal(slapo_node_attr_int(yl, "shard_dim", -1), 1);
  assert_int_equal(slapo_node_attr_int(yl, "shard_parts", 1), 3);
  assert_int_equal(slapo_node_attr(yf, "shard_dim"), NULL);
  assert_split(yl, 1, 3, 1, 12);
  slapo_tensor *tf = opfix_arange(2, fs), *tl = opfix_tensor(2, ls, NULL);
  float *dl = slapo_tensor_data(tl);
  const float *df = slapo_tensor_data(tf);
  for (int r = 0; r < 3; r++)
    for (int j = 0; j < 6; j++) dl[r * 6 + j] = df[r * 12 + (j / 2) * 4 + 1 + j % 2];
  slapo_kernel_env env = {9, 4, true};
  slapo_tensor *of, *ol;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, fs, &of), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ls, &ol), SLAPO_OK);
  yf->op->ref(yf, (const slapo_tensor *const *)&tf, of, &env);
  const float *o = slapo_tensor_data(of);
  float want[18];
  int zeros = 0;
  for (int r = 0; r < 3; r++)
    for (int j = 0; j < 6; j++) {
      want[r * 6 + j] = o[r * 12 + (j / 2) * 4 + 1 + j % 2];
      zeros += want[r * 6 + j] == 0;
    }
  assert_true(zeros > 0 && zeros < 18); /* the mask matters */
  for (int fast = 0; fast < 2; fast++) {
    (fast ? yl->op->fast : yl->op->ref)(yl, (const slapo_tensor *const *)&tl, ol, &env);
    opfix_assert_values(ol, 18, want, 0, 0);
  }
  slapo_node *dx[1];
  opfix_backward(f, yl, dx);
  assert_int_equal(slapo_node_attr_int(dx[0], "shard_dim", -1), 1);
  assert_int_equal(slapo_node_attr_int(dx[0], "shard_start", -1), 1);
  assert_int_equal(slapo_node_attr_int(dx[0], "shard_parts", 1), 3);
  slapo_tensor_free(tf);
  slapo_tensor_free(tl);
  slapo_tensor_free(of);
  slapo_tensor_free(ol);
}

/* A dropout on a value whose layout is unknown, or on a partial sum, is
 * refused naming the value, its shape and where it came from. */
static void test_dropout_refusals(void **state) {
  opfix *f = *state;
  int64_t s[2] = {4, 8}, mixed[2] = {2, 16};
  slapo_node *x = opfix_input(f, "x", 2, s);
  x->layout = split(1, 1, 8, 16);
  slapo_node *r = slapo_reshape(f->ctx, x, 2, mixed);
  int before = slapo_graph_count(f->g);
  slapo_node *y = slapo_dropout(f->ctx, r, 0.1);
  opfix_expect_fail(f, y, SLAPO_UNSUPPORTED, before,
                    OPFIX_SUBS("dropout of %reshape [2, 16] (from reshape)",
                               "tensor-parallel layout is unknown",
                               "refused rather than drawn as if replicated"));
}

static void test_dropout_partial_refused(void **state) {
  opfix *f = *state;
  int64_t s[2] = {4, 8};
  slapo_node *x = opfix_input(f, "x", 2, s);
  x->layout = (slapo_layout){.kind = SLAPO_LAYOUT_PARTIAL};
  int before = slapo_graph_count(f->g);
  slapo_node *y = slapo_dropout(f->ctx, x, 0.1);
  opfix_expect_fail(f, y, SLAPO_UNSUPPORTED, before,
                    OPFIX_SUBS("dropout of %x [4, 8] (from placeholder)", "partial sum",
                               "sync fwd_post all_reduce"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_qkv_to_heads, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_linear_rules, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_reshape_mixing, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_dropout_draws_its_part, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_dropout_refusals, opfix_setup, opfix_teardown),
      cmocka_unit_test_setup_teardown(test_dropout_partial_refused, opfix_setup,
                                      opfix_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
