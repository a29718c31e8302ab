/* tests/unit/test_rng_streams.c - a random op's stream is assigned once, when
 * its node is built from a module call, and nothing else moves it: not the
 * recompute copies checkpointing emits, not other (non-random) ops of the
 * same module, not an earlier random op deleted through the IR edit API;
 * while a module called twice in one forward draws two different masks.
 * Masks are compared by running the graph (dropout p = 0.5 on ones: each
 * element is 0 or 2). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "slapo/autograd.h"
#include "slapo/exec.h"

#define N 64

typedef struct built {
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_node *x;
} built;

static void begin(built *b) {
  assert_int_equal(slapo_graph_new(&b->g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(b->g, &b->ctx), SLAPO_OK);
  int64_t sh[1] = {N};
  b->x = slapo_input(b->ctx, "x", SLAPO_DTYPE_F32, 1, sh);
}

static void end(built *b) {
  slapo_ctx_free(b->ctx);
  slapo_graph_free(b->g);
}

/* The module "blk": x * 3, then a dropout; `ckpt` makes it a recompute
 * region (activation checkpointing). Returns the dropout's output. */
static slapo_node *blk(built *b, bool ckpt) {
  assert_int_equal(slapo_ctx_enter_call(b->ctx, "blk"), SLAPO_OK);
  int prev = slapo_ctx_region(b->ctx);
  if (ckpt) slapo_ctx_set_region(b->ctx, slapo_ctx_new_region(b->ctx));
  slapo_node *y = slapo_dropout(b->ctx, slapo_mul_scalar(b->ctx, b->x, 3.0), 0.5);
  slapo_ctx_set_region(b->ctx, prev);
  slapo_ctx_pop_origin(b->ctx);
  assert_non_null(y);
  return y;
}

/* Runs the graph whose outputs are `outs` with x = ones and copies output
 * `which` into mask [N]. */
static void run_mask(built *b, int n_out, slapo_node *const *outs, int which, float *mask) {
  assert_non_null(slapo_output(b->ctx, n_out, outs));
  slapo_plan *p;
  assert_int_equal(slapo_plan_new(b->g, NULL, &p), SLAPO_OK);
  int64_t sh[1] = {N};
  slapo_tensor *x;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_F32, 1, sh, &x), SLAPO_OK);
  float *xp = slapo_tensor_data(x);
  for (int i = 0; i < N; i++) xp[i] = 1.0f;
  assert_int_equal(slapo_plan_bind_input(p, "x", x), SLAPO_OK);
  slapo_kernel_env env = {1234, 5, true};
  assert_int_equal(slapo_plan_run(p, &env), SLAPO_OK);
  const slapo_tensor *y = slapo_plan_output(p, which);
  assert_non_null(y);
  memcpy(mask, slapo_tensor_data(y), sizeof(float) * N);
  slapo_tensor_free(x);
  slapo_plan_free(p);
}

/* Forward of blk, backward, then one more dropout under "blk" (as a later
 * module of the same path would emit it): its mask is the same with blk
 * checkpointed, although the recompute copies were emitted before it. */
static void after_backward(bool ckpt, float *mask) {
  built b;
  begin(&b);
  slapo_node *y = blk(&b, ckpt);
  slapo_node *loss = slapo_sum(b.ctx, y, 0, NULL, false);
  slapo_node *dx = NULL;
  assert_int_equal(slapo_backward(b.ctx, loss, NULL, 1, &b.x, &dx), SLAPO_OK);
  assert_int_equal(slapo_ctx_push_origin(b.ctx, "blk"), SLAPO_OK);
  slapo_node *late = slapo_dropout(b.ctx, b.x, 0.5);
  slapo_ctx_pop_origin(b.ctx);
  slapo_node *outs[3] = {late, loss, dx};
  run_mask(&b, 3, outs, 0, mask);
  end(&b);
}

static void test_mask_unchanged_by_checkpointing(void **state) {
  (void)state;
  float plain[N], ck[N];
  after_backward(false, plain);
  after_backward(true, ck);
  int zeros = 0;
  for (int i = 0; i < N; i++) zeros += plain[i] == 0.0f;
  assert_true(zeros > 0 && zeros < N); /* a real mask */
  assert_memory_equal(plain, ck, sizeof plain);
}

/* Two dropouts in different calls of "a", then one in "b"; deleting the
 * first through the IR edit API leaves b's mask as it was. */
static void test_mask_unchanged_by_deleting_earlier_random_op(void **state) {
  (void)state;
  float masks[2][N];
  for (int del = 0; del < 2; del++) {
    built b;
    begin(&b);
    assert_int_equal(slapo_ctx_enter_call(b.ctx, "a"), SLAPO_OK);
    slapo_node *d0 = slapo_dropout(b.ctx, b.x, 0.5);
    slapo_ctx_pop_origin(b.ctx);
    assert_int_equal(slapo_ctx_enter_call(b.ctx, "b"), SLAPO_OK);
    slapo_node *d1 = slapo_dropout(b.ctx, b.x, 0.5);
    slapo_ctx_pop_origin(b.ctx);
    slapo_node *keep = d1;
    if (del) assert_int_equal(slapo_graph_erase(b.g, d0), SLAPO_OK);
    slapo_node *outs[2] = {keep, del ? keep : d0};
    run_mask(&b, del ? 1 : 2, outs, 0, masks[del]);
    end(&b);
  }
  assert_memory_equal(masks[0], masks[1], sizeof masks[0]);
}

/* A module called twice in one forward: two calls, two streams and masks;
 * ordinary ops emitted between its random ops do not move their streams. */
static void test_two_calls_two_masks(void **state) {
  (void)state;
  built b;
  begin(&b);
  slapo_node *y0 = blk(&b, false), *y1 = blk(&b, false);
  assert_int_not_equal(slapo_node_attr_int(y0, "stream", -1), slapo_node_attr_int(y1, "stream", -1));
  assert_int_equal(slapo_node_attr_int(y0, "stream", -1),
                   (int64_t)slapo_rng_stream("blk", 0, 0));
  assert_int_equal(slapo_node_attr_int(y1, "stream", -1),
                   (int64_t)slapo_rng_stream("blk", 1, 0));
  slapo_node *outs[2] = {y0, y1};
  float m0[N], m1[N];
  run_mask(&b, 2, outs, 0, m0);
  end(&b);
  begin(&b);
  y0 = blk(&b, false);
  y1 = blk(&b, false);
  slapo_node *outs2[2] = {y0, y1};
  run_mask(&b, 2, outs2, 1, m1);
  end(&b);
  assert_memory_not_equal(m0, m1, sizeof m0);

  /* More plain ops before the dropout of a call: same stream. */
  begin(&b);
  assert_int_equal(slapo_ctx_enter_call(b.ctx, "blk"), SLAPO_OK);
  slapo_node *z = slapo_mul_scalar(b.ctx, slapo_add_scalar(b.ctx, b.x, 1.0), 2.0);
  slapo_node *d = slapo_dropout(b.ctx, z, 0.5);
  slapo_ctx_pop_origin(b.ctx);
  assert_int_equal(slapo_node_attr_int(d, "stream", -1), (int64_t)slapo_rng_stream("blk", 0, 0));
  end(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mask_unchanged_by_checkpointing),
      cmocka_unit_test(test_mask_unchanged_by_deleting_earlier_random_op),
      cmocka_unit_test(test_two_calls_two_masks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
