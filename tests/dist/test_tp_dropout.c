/* tests/dist/test_tp_dropout.c - random ops on tensor-parallel values
 * through the C API (issue 32, item 1). A column-parallel Linear (4 -> 64),
 * slapo_dropout(p = 0.5) on its output, a row-parallel Linear (64 -> 3):
 * each rank must draw its part of the unsharded model's mask (the value's
 * layout, ops/layout.c), so the loss and every gradient are the unsharded
 * model's; before the layouts, both ranks drew columns 0..31's mask and the
 * loss differed (1704 against 1956 in the report). A dropout on a value
 * whose layout no rule follows (a reshape mixing the sharded axis) or on a
 * partial sum (a row-parallel output before its all-reduce) is refused with
 * the node and shape named; a cc region drawing dropout on a shard is
 * refused, and compiler=none fuses it right. CTest runs it on one rank
 * (shards of one: everything is replicated, the refusals are skipped) and
 * under mpirun -np 2. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/check.h"

#include "core/assert.h"

#include "slapo/apply.h"
#include "slapo/dist.h"
#include "slapo/primitives.h"


enum { N = 8, IN = 4, HID = 64, OUT = 3 };

typedef enum { NET_PLAIN, NET_MIXING_RESHAPE, NET_DROP_PARTIAL } net_kind;

typedef struct net_cfg {
  net_kind kind;
} net_cfg;

/* x [N, IN] -> y [N, OUT]; with targets t [N, OUT], the loss mean((y - t)^2). */
static slapo_node *net_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  const net_cfg *c = self->config;
  slapo_node *h = slapo_call1(ctx, self, "fc1", in[0]); /* [N, HID / K] */
  if (!h) return NULL;
  int64_t L = h->shape[1];
  if (c->kind == NET_MIXING_RESHAPE) {
    /* [N, L] -> [N / 2, 2 L]: a row holds two ranks' worth of columns of
     * two rows, no slice of the unsharded [N / 2, 2 HID]. */
    int64_t mixed[2] = {N / 2, 2 * L}, back[2] = {N, L};
    h = slapo_reshape(ctx, slapo_dropout(ctx, slapo_reshape(ctx, h, 2, mixed), 0.5), 2, back);
  } else if (c->kind == NET_PLAIN) {
    h = slapo_dropout(ctx, h, 0.5);
  }
  slapo_node *y = slapo_call1(ctx, self, "fc2", h);
  if (c->kind == NET_DROP_PARTIAL) y = slapo_dropout(ctx, y, 0.5);
  if (n_in < 2 || !y) return y;
  slapo_node *d = slapo_sub(ctx, y, in[1]);
  int64_t axes[2] = {0, 1};
  return slapo_mean(ctx, slapo_mul(ctx, d, d), 2, axes, false);
}

static const slapo_module_type k_net = {"TPDropoutNet", net_forward, NULL, NULL, NULL};

static slapo_status build_kind(net_kind kind, slapo_module **out) {
  net_cfg *c = malloc(sizeof *c);
  if (!c) return SLAPO_NOMEM;
  c->kind = kind;
  slapo_module *m, *l;
  slapo_status s = slapo_module_new(&k_net, c, &m);
  if (s != SLAPO_OK) {
    free(c);
    return s;
  }
  /* No bias on fc2 when its partial sums meet the dropout: a partial sum
   * plus a replicated bias is not a partial sum. */
  s = slapo_linear_new(IN, HID, true, 1.0f, &l);
  if (s == SLAPO_OK) s = slapo_module_add_child(m, "fc1", l);
  if (s == SLAPO_OK) s = slapo_linear_new(HID, OUT, kind != NET_DROP_PARTIAL, 1.0f, &l);
  if (s == SLAPO_OK) s = slapo_module_add_child(m, "fc2", l);
  int64_t shape[2] = {N, IN};
  slapo_tensor *ex = NULL;
  if (s == SLAPO_OK) s = slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, shape, &ex);
  if (s == SLAPO_OK) s = slapo_module_set_example(m, 1, (const slapo_tensor *const *)&ex);
  slapo_tensor_free(ex);
  if (s == SLAPO_OK) s = slapo_module_materialize(m, 11);
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}

static slapo_status build_plain(void *ud, slapo_module **out) {
  (void)ud;
  return build_kind(NET_PLAIN, out);
}

static const char k_megatron[] = "fc1 shard weight axis=0\n"
                                 "fc1 shard bias axis=0\n"
                                 "fc1 sync bwd_post all_reduce\n"
                                 "fc2 shard weight axis=1\n"
                                 "fc2 sync fwd_post all_reduce\n";

static slapo_tensor *inputs[2];

static void make_inputs(void) {
  int64_t xs[2] = {N, IN}, ts[2] = {N, OUT};
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, xs, &inputs[0]));
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ts, &inputs[1]));
  float *x = slapo_tensor_data(inputs[0]), *t = slapo_tensor_data(inputs[1]);
  for (int i = 0; i < N * IN; i++) x[i] = (float)((i * 37 + 5) % 17) - 8.0f;
  for (int i = 0; i < N * OUT; i++) t[i] = (float)((i * 11 + 3) % 7) - 3.0f;
}

/* The schedule `text` applied to m on this rank. */
static slapo_status apply_text(slapo_module *m, const char *text) {
  slapo_sched_log *log;
  SLAPO_TRY(slapo_sched_parse(text, "t.sched", &log));
  slapo_sched *root;
  slapo_status s = slapo_sched_create(m, &root);
  if (s == SLAPO_OK) {
    s = slapo_apply_schedule(root, log, NULL, 0, 0, NULL);
    slapo_sched_free(root);
  }
  slapo_sched_log_free(log);
  return s;
}

/* The loss of one train step (dropout on, seed 5, step 2) into *loss. */
static slapo_status train_loss(slapo_module *m, float *loss) {
  slapo_runner *r;
  SLAPO_TRY(slapo_runner_new(m, NULL, &r));
  slapo_kernel_env env = {5, 2, true};
  const slapo_tensor *out = NULL;
  slapo_status s =
      slapo_step(r, 2, (const slapo_tensor *const *)inputs, SLAPO_STEP_TRAIN, &env, &out);
  if (s == SLAPO_OK) *loss = *(const float *)slapo_tensor_data(out);
  slapo_runner_free(r);
  return s;
}

/* Column-parallel, dropout, row-parallel: the unsharded model's loss on
 * every rank, and verify (loss and every gathered gradient) passes. */
static void test_dropout_between_column_and_row_parallel(void **state) {
  (void)state;
  slapo_module *ref, *tp;
  float want = 0, got = -1;
  OK(build_kind(NET_PLAIN, &ref));
  OK(train_loss(ref, &want));
  OK(build_kind(NET_PLAIN, &tp));
  OK(apply_text(tp, k_megatron));
  OK(train_loss(tp, &got));
  if (!(fabsf(got - want) <= 1e-5f * fabsf(want)))
    fail_msg("rank %d: loss %.9g, unsharded %.9g", slapo_dist_rank(SLAPO_GROUP_WORLD), got, want);
  slapo_module_free(ref);
  slapo_module_free(tp);

  slapo_sched_log *log;
  OK(slapo_sched_parse(k_megatron, "t.sched", &log));
  slapo_verify_opts o = {.n_in = 2, .in = (const slapo_tensor *const *)inputs, .seed = 5,
                         .step = 2};
  size_t bad = 0;
  slapo_status s = slapo_verify(build_plain, NULL, log, &o, NULL, NULL, &bad);
  if (s != SLAPO_OK) fail_msg("verify: %s: %s", slapo_status_name(s), slapo_last_error());
  assert_int_equal(bad, 0);
  slapo_sched_log_free(log);
}

/* The step build's status and message for net `kind` under `text`. */
static slapo_status build_step(net_kind kind, const char *text) {
  slapo_module *m;
  OK(build_kind(kind, &m));
  slapo_status s = apply_text(m, text);
  float loss = 0;
  if (s == SLAPO_OK) s = train_loss(m, &loss);
  slapo_module_free(m);
  return s;
}

static void expect_refused(net_kind kind, const char *text, const char *const *parts) {
  slapo_status s = build_step(kind, text);
  if (slapo_dist_size(SLAPO_GROUP_TP) < 2) { /* shards of one: all replicated */
    if (s != SLAPO_OK) fail_msg("one rank: %s: %s", slapo_status_name(s), slapo_last_error());
    return;
  }
  if (s != SLAPO_UNSUPPORTED)
    fail_msg("got %s (%s), want unsupported", slapo_status_name(s), slapo_last_error());
  for (; *parts; parts++)
    if (!strstr(slapo_last_error(), *parts))
      fail_msg("message '%s' lacks '%s'", slapo_last_error(), *parts);
}

/* [N, 32] -> [N / 2, 64] on each of 2 ranks mixes the sharded axis with
 * the rows: refused, never drawn as if replicated. */
static void test_dropout_on_unknown_layout_refused(void **state) {
  (void)state;
  expect_refused(NET_MIXING_RESHAPE, k_megatron,
                 (const char *const[]){"dropout of %reshape [4, 64] (from reshape)",
                                       "tensor-parallel layout is unknown",
                                       "refused rather than drawn as if replicated", NULL});
}

/* fc2's output before its all-reduce is a partial sum. */
static void test_dropout_on_partial_sum_refused(void **state) {
  (void)state;
  expect_refused(NET_DROP_PARTIAL,
                 "fc1 shard weight axis=0\nfc1 shard bias axis=0\nfc2 shard weight axis=1\n",
                 (const char *const[]){"dropout of %linear_1 [8, 3] (from linear in fc2)", "partial sum",
                                       "sync fwd_post all_reduce", NULL});
}

/* A fused cc region drawing the dropout on fc1's column-parallel output:
 * cc draws by element index as if replicated, so the step is refused; the
 * none backend re-emits the ops, which draw by layout, and verifies. */
static const char k_fused[] = "fc1 decompose\n"
                              "fc1 shard weight axis=0\n"
                              "fc1 shard bias axis=0\n"
                              "fc1 sync bwd_post all_reduce\n"
                              "fc2 shard weight axis=1\n"
                              "fc2 sync fwd_post all_reduce\n"
                              ". trace flatten=true\n"
                              ". fuse pattern=\"dropout(add(y, b))\" compiler=%s name=F\n";

static void test_fused_dropout_on_shard(void **state) {
  (void)state;
  char text[1024];
  snprintf(text, sizeof text, k_fused, "cc");
  expect_refused(NET_PLAIN, text,
                 (const char *const[]){"draws random numbers (dropout)",
                                       "split on axis 1", "compiler=none", NULL});
  snprintf(text, sizeof text, k_fused, "none");
  slapo_sched_log *log;
  OK(slapo_sched_parse(text, "t.sched", &log));
  slapo_verify_opts o = {.n_in = 2, .in = (const slapo_tensor *const *)inputs, .seed = 5,
                         .step = 2};
  size_t bad = 0;
  slapo_status s = slapo_verify(build_plain, NULL, log, &o, NULL, NULL, &bad);
  if (s != SLAPO_OK) fail_msg("verify: %s: %s", slapo_status_name(s), slapo_last_error());
  slapo_sched_log_free(log);
}

int main(void) {
  if (slapo_dist_init(0) != SLAPO_OK) return 1; /* every rank in one TP group */
  make_inputs();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dropout_between_column_and_row_parallel),
      cmocka_unit_test(test_dropout_on_unknown_layout_refused),
      cmocka_unit_test(test_dropout_on_partial_sum_refused),
      cmocka_unit_test(test_fused_dropout_on_shard),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  slapo_tensor_free(inputs[0]);
  slapo_tensor_free(inputs[1]);
  slapo_dist_finalize();
  return rc;
}
