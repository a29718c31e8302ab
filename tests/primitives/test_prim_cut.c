/* tests/primitives/test_prim_cut.c - the `cut` primitive and the pipeline
 * stages it makes (slapo_pp_stage_*), in one process: a tiny GPT-2 cut
 * after transformer.h.0 runs as two stages, each on its own copy of the
 * model, micro-batch by micro-batch in 1F1B's order (stage 0 keeps two
 * micro-batches in flight, in two slots), the values and gradients between
 * them copied as MPI would carry them. Against one process accumulating
 * the same micro-batches (slapo_train_accumulate): the loss and every
 * gradient of a parameter one stage holds are bitwise equal; the tied
 * embedding's, summed over the two stages, within 1e-6; the same under
 * schedules/gpt2.sched's lines (FlashAttention, flattened traces, cc
 * fusions; one process ignores the cut line). Also the cut primitive's
 * errors and the stages' preconditions with their messages (a module
 * fused into its block's region, two cuts at one op, a stage out of
 * range; on toy models: a module called twice, nothing after the last
 * cut, a stage sending only an integer value). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "compiler/cache_fixture.h"
#include "prim_test.h"
#include "slapo/apply.h"
#include "slapo/primitives.h"
#include "slapo/train.h"

enum { M = 3 };

typedef struct pp_model {
  slapo_sched *root;
  slapo_module *m;
} pp_model;

static pp_model cut_model(const char *const *cuts, int n) {
  pp_model p = {pt_sched_new(&k_tiny), NULL};
  p.m = slapo_sched_module(p.root);
  for (int i = 0; i < n; i++) OK(slapo_cut(pt_at(p.root, cuts[i])));
  return p;
}

static void mb_inputs(slapo_tensor *in[M][2]) {
  int64_t bt[2] = {PT_B, PT_T};
  for (int m = 0; m < M; m++)
    for (int j = 0; j < 2; j++) {
      OK(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &in[m][j]));
      int32_t *d = slapo_tensor_data(in[m][j]); /* [B, T] */
      for (int64_t i = 0; i < PT_B * PT_T; i++)
        d[i] = (int32_t)((i * 37 + j * 11 + m * 101 + 5) % k_tiny.vocab_size);
    }
}

static void copy(slapo_tensor *dst, const slapo_tensor *src) {
  assert_non_null(dst);
  assert_non_null(src);
  OK(slapo_tensor_copy(dst, src));
}

/* Stage 0 -> stage 1: micro-batch in slot0 of stage 0 into slot 0 of 1. */
static void send_act(slapo_pp_stage *s0, slapo_pp_stage *s1) {
  assert_int_equal(slapo_pp_stage_n_send(s0), slapo_pp_stage_n_recv(s1));
  for (int k = 0; k < slapo_pp_stage_n_send(s0); k++)
    copy(slapo_pp_stage_recv_buf(s1, 0, k), slapo_pp_stage_sent(s0, k));
}

static void send_grad(slapo_pp_stage *s1, slapo_pp_stage *s0, int slot0) {
  for (int k = 0; k < slapo_pp_stage_n_recv(s1); k++)
    copy(slapo_pp_stage_grad_buf(s0, slot0, k), slapo_pp_stage_recv_grad(s1, k));
}

static slapo_parameter *param_of(slapo_module *m, const char *path) {
  const char *dot = strrchr(path, '.');
  char dir[256];
  snprintf(dir, sizeof dir, "%.*s", (int)(dot - path), path);
  slapo_module *owner;
  OK(slapo_module_at(m, dir, &owner));
  return slapo_module_param(owner, dot + 1);
}

static slapo_tensor *g_in[M][2];
static const slapo_tensor *g_flat[2 * M];
static slapo_kernel_env g_envs[M];

static int inputs_setup(void **state) {
  mb_inputs(g_in);
  for (int m = 0; m < M; m++) {
    g_flat[2 * m] = g_in[m][0], g_flat[2 * m + 1] = g_in[m][1];
    g_envs[m] = (slapo_kernel_env){.seed = 2024, .step = (uint64_t)(10 + m), .training = true};
  }
  return cache_setup(state);
}

static int inputs_teardown(void **state) {
  for (int m = 0; m < M; m++) slapo_tensor_free(g_in[m][0]), slapo_tensor_free(g_in[m][1]);
  return cache_teardown(state);
}

/* One process's step over the micro-batches: its loss; grads in m. */
static double one_process(slapo_module *m) {
  slapo_runner *run;
  OK(slapo_runner_new(m, NULL, &run));
  double loss;
  OK(slapo_train_accumulate(run, M, g_flat, g_envs, &loss, NULL));
  slapo_runner_free(run);
  return loss;
}

/* 1F1B, p = 2, m = 3: stage 0 runs F0 F1 B0 F2 B1 B2, stage 1 F0 B0 F1 B1
 * F2 B2; what a stage sent is read before it runs again. The loss. */
static double run_1f1b(slapo_pp_stage *s0, slapo_pp_stage *s1) {
  double wd = (double)(PT_B * PT_T) / (double)(M * PT_B * PT_T); /* n_i / N, all valid */
  float w = (float)wd;
  double loss = 0;
  OK(slapo_pp_stage_forward(s0, 0, 2, g_flat, &g_envs[0]));
  send_act(s0, s1);
  for (int m = 0; m < M; m++) {
    unsigned g = m == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD;
    OK(slapo_pp_stage_forward(s1, 0, 2, g_flat + 2 * m, &g_envs[m]));
    loss += wd * (double)*(const float *)slapo_tensor_data(slapo_pp_stage_loss(s1));
    OK(slapo_pp_stage_backward(s1, 0, 2, g_flat + 2 * m, &g_envs[m], w, g));
    send_grad(s1, s0, m % 2);
    if (m + 1 < M) {
      /* m + 1's activations wait in the other slot while m's backward runs. */
      OK(slapo_pp_stage_forward(s0, (m + 1) % 2, 2, g_flat + 2 * (m + 1), &g_envs[m + 1]));
      send_act(s0, s1);
    }
    OK(slapo_pp_stage_backward(s0, m % 2, 2, g_flat + 2 * m, &g_envs[m], w, g));
  }
  return loss;
}

/* ref's gradients against the stages' (models a and b): bitwise where one
 * stage holds the parameter, the sum within 1e-6 where both do. */
static void compare_grads(slapo_module *ref, slapo_module *a, slapo_module *b,
                          const slapo_pp_stage *s0, const slapo_pp_stage *s1) {
  pt_result r = {0};
  OK(slapo_module_visit_params(ref, pt_take_grad, &r));
  int tied = 0;
  for (int i = 0; i < r.n; i++) {
    const char *path = r.params[i]->path;
    bool h0 = pt_stage_holds(s0, path), h1 = pt_stage_holds(s1, path);
    assert_true(h0 || h1);
    const slapo_tensor *g0 = param_of(a, path)->grad, *g1 = param_of(b, path)->grad;
    int64_t n = slapo_tensor_numel(r.grads[i]);
    const float *want = slapo_tensor_data(r.grads[i]);
    if (h0 && h1) {
      tied++;
      const float *x = slapo_tensor_data(g0), *y = slapo_tensor_data(g1);
      for (int64_t k = 0; k < n; k++) assert_float_equal(x[k] + y[k], want[k], 1e-6);
    } else {
      assert_memory_equal(slapo_tensor_data(h0 ? g0 : g1), want, (size_t)n * sizeof(float));
    }
  }
  assert_int_equal(tied, 1); /* wte / lm_head */
  pt_result_free(&r);
}

static void test_two_stages_match_one_process(void **state) {
  (void)state;
  slapo_module *ref = pt_model(&k_tiny);
  double want = one_process(ref);
  const char *cuts[] = {"transformer.h.0"};
  pp_model a = cut_model(cuts, 1), b = cut_model(cuts, 1);
  assert_int_equal(slapo_pp_stage_count(a.m), 2);
  slapo_pp_stage *s0, *s1;
  OK(slapo_pp_stage_new(a.m, 2, g_flat, 0, 2, NULL, &s0));
  OK(slapo_pp_stage_new(b.m, 2, g_flat, 1, 1, NULL, &s1));
  assert_false(slapo_pp_stage_is_last(s0));
  assert_true(slapo_pp_stage_is_last(s1));
  assert_int_equal(slapo_pp_stage_n_recv(s0), 0);
  assert_int_equal(slapo_pp_stage_n_send(s1), 0);
  assert_true(slapo_pp_stage_n_send(s0) >= 1);
  assert_true(run_1f1b(s0, s1) == want);
  compare_grads(ref, a.m, b.m, s0, s1);
  slapo_pp_stage_free(s0);
  slapo_pp_stage_free(s1);
  pt_sched_free(a.root);
  pt_sched_free(b.root);
  slapo_module_free(ref);
}

/* schedules/gpt2.sched's lines (FlashAttention, decompose, flattened
 * traces, cc fusions) and `extra`, applied to a fresh model. */
static slapo_module *default_scheduled(const char *extra, slapo_status want, const char *needle) {
  char path[] = "/tmp/slapo_cut_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "transformer.h.*.attn replace FlashAttention\n"
             "transformer.h.*.attn.c_proj decompose\n"
             "transformer.h.*.mlp.c_fc decompose\n"
             "transformer.h.*.mlp.c_proj decompose\n"
             "transformer.h.* trace flatten=true\n"
             "transformer.h.* fuse pattern=\"gelu(add(x, b))\" compiler=cc name=FusedBiasGeLU\n"
             "transformer.h.* fuse pattern=\"add(x, dropout(add(y, b)))\" compiler=cc "
             "name=FusedBiasDropoutResidual all=true\n%s\n", extra);
  fclose(f);
  slapo_module *m = pt_model(&k_tiny);
  slapo_schedule_run run = {0};
  expect_status(slapo_schedule_file_apply(m, path, NULL, NULL, 0, &run), want, needle);
  slapo_schedule_run_deinit(&run);
  unlink(path);
  return m;
}

/* The default schedule's fused kernels and FlashAttention split as well;
 * one process ignores the cut line. */
static void test_default_schedule_stages(void **state) {
  (void)state;
  slapo_module *ref = default_scheduled("transformer.h.0 cut", SLAPO_OK, "");
  double want = one_process(ref);
  slapo_module *a = default_scheduled("transformer.h.0 cut", SLAPO_OK, "");
  slapo_module *b = default_scheduled("transformer.h.0 cut", SLAPO_OK, "");
  slapo_pp_stage *s0, *s1;
  OK(slapo_pp_stage_new(a, 2, g_flat, 0, 2, NULL, &s0));
  OK(slapo_pp_stage_new(b, 2, g_flat, 1, 1, NULL, &s1));
  assert_true(run_1f1b(s0, s1) == want);
  compare_grads(ref, a, b, s0, s1);
  slapo_pp_stage_free(s0);
  slapo_pp_stage_free(s1);
  slapo_module_free(a);
  slapo_module_free(b);
  slapo_module_free(ref);
  /* GELU's own module is fused into its block's region. */
  slapo_module *c = default_scheduled("transformer.h.0.mlp.act cut", SLAPO_OK, "");
  slapo_pp_stage *st = NULL;
  expect_status(slapo_pp_stage_new(c, 2, g_flat, 0, 1, NULL, &st), SLAPO_PRECOND,
                "transformer.h.0.mlp.act emits no op of its own");
  slapo_module_free(c);
}

/* --pp K without cut lines: the blocks' costs (identical blocks cost
 * alike; the first and last carry the embeddings and the head) and the
 * balanced cuts, with their schedule lines; errors named. */
static void test_auto_cut(void **state) {
  (void)state;
  char *list, lines[256];
  double *cost, share;
  int n;
  slapo_module *m = pt_model(&k_tiny4);
  OK(slapo_pp_block_costs(m, 2, g_flat, &list, &cost, &n));
  assert_string_equal(list, "transformer.h");
  assert_int_equal(n, 4);
  assert_true(cost[1] > 0 && cost[1] == cost[2]);
  assert_true(cost[0] > cost[1] && cost[3] > cost[1]);
  slapo_free(list);
  slapo_free(cost);
  OK(slapo_pp_auto_cut(m, 2, g_flat, 1, lines, sizeof lines, &share));
  assert_string_equal(lines, "");
  assert_true(share == 1.0);
  expect_status(slapo_pp_auto_cut(m, 2, g_flat, 5, lines, sizeof lines, NULL), SLAPO_INVALID_ARG,
                "--pp 5: transformer.h has 4 blocks to split into stages");
  OK(slapo_pp_auto_cut(m, 2, g_flat, 2, lines, sizeof lines, &share));
  assert_string_equal(lines, "transformer.h.1 cut\n");
  assert_int_equal(slapo_pp_stage_count(m), 2);
  assert_true(share > 0.5 && share < 0.6);
  expect_status(slapo_pp_auto_cut(m, 2, g_flat, 2, lines, sizeof lines, NULL), SLAPO_STATE,
                "already cuts GPT2LMHeadModel into 2 stages");
  slapo_module_free(m);
  m = pt_model(&k_tiny4);
  OK(slapo_pp_auto_cut(m, 2, g_flat, 4, lines, sizeof lines, NULL));
  assert_string_equal(lines, "transformer.h.0 cut\ntransformer.h.1 cut\ntransformer.h.2 cut\n");
  expect_status(slapo_pp_auto_cut(m, 2, g_flat, 4, lines, 8, NULL), SLAPO_STATE, "already");
  slapo_module_free(m);
  m = pt_model(&k_tiny4);
  expect_status(slapo_pp_auto_cut(m, 2, g_flat, 4, lines, 24, NULL), SLAPO_LIMIT,
                "3 cut lines exceed 24 bytes");
  slapo_module_free(m);
}

/* A meta tiny GPT-2 with a parameter no forward reads (*unread), cut
 * after transformer.h.0; its schedule tree in *root (pt_sched_free). */
static slapo_module *meta_cut_model(slapo_sched **root, slapo_parameter **unread) {
  slapo_module *m;
  OK(slapo_gpt2_new(&k_tiny, &m));
  int64_t shape[1] = {4};
  OK(slapo_module_add_param(m, "unread", 1, shape, SLAPO_INIT_ONES, 0));
  *unread = slapo_module_param(m, "unread");
  OK(slapo_sched_create(m, root));
  OK(slapo_cut(pt_at(*root, "transformer.h.0")));
  return m;
}

/* A pipeline rank materializes its stage alone: on a meta model, stage 0's
 * parameters get the values a whole materialize gives them, and those no
 * stage reads too; stage 1's stay meta, and building stage 1 then names
 * what it lacks. Stage 1 alone leaves the unread one meta. */
static void test_stage_materialize(void **state) {
  (void)state;
  slapo_sched *root, *root1;
  slapo_parameter *unread, *unread1;
  slapo_module *full = pt_model(&k_tiny), *m = meta_cut_model(&root, &unread);
  OK(slapo_pp_stage_materialize(m, 2, g_flat, 0, PT_SEED));
  const char *mine[] = {"transformer.wte.weight", "transformer.wpe.weight",
                        "transformer.h.0.mlp.c_fc.weight"};
  for (int i = 0; i < 3; i++) {
    const slapo_parameter *p = slapo_module_param_at(m, mine[i]);
    const slapo_parameter *q = slapo_module_param_at(full, mine[i]);
    assert_false(slapo_tensor_is_meta(p->value));
    assert_memory_equal(slapo_tensor_data(p->value), slapo_tensor_data(q->value),
                        slapo_tensor_nbytes(q->value));
  }
  const char *others[] = {"transformer.h.1.attn.c_attn.weight", "transformer.ln_f.weight"};
  for (int i = 0; i < 2; i++)
    assert_true(slapo_tensor_is_meta(slapo_module_param_at(m, others[i])->value));
  assert_false(slapo_tensor_is_meta(unread->value));
  assert_true(((const float *)slapo_tensor_data(unread->value))[3] == 1.0f);
  slapo_module *m1 = meta_cut_model(&root1, &unread1);
  OK(slapo_pp_stage_materialize(m1, 2, g_flat, 1, PT_SEED));
  assert_true(slapo_tensor_is_meta(unread1->value));
  assert_false(slapo_tensor_is_meta(slapo_module_param_at(m1, "transformer.ln_f.weight")->value));
  pt_sched_free(root1);
  slapo_pp_stage *st = NULL;
  OK(slapo_pp_stage_new(m, 2, g_flat, 0, 1, NULL, &st));
  slapo_pp_stage_free(st);
  expect_status(slapo_pp_stage_new(m, 2, g_flat, 1, 1, NULL, &st), SLAPO_STATE,
                "of stage 1 is not materialized");
  assert_null(st);
  pt_sched_free(root);
  slapo_module_free(full);
}

static void test_cut_errors(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  expect_status(slapo_cut(root), SLAPO_INVALID_ARG, "the root module cannot end a pipeline stage");
  OK(slapo_cut(pt_at(root, "transformer.h.0")));
  expect_status(slapo_cut(pt_at(root, "transformer.h.0")), SLAPO_STATE,
                "already ends after transformer.h.0");
  pt_sched_free(root);
}

static void expect_stage_error(const char *const *cuts, int n, slapo_status want,
                               const char *needle) {
  pp_model p = cut_model(cuts, n);
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  slapo_pp_stage *st = NULL;
  expect_status(slapo_pp_stage_new(p.m, 2, (const slapo_tensor *const *)in, 0, 1, NULL, &st),
                want, needle);
  assert_null(st);
  pt_inputs_free(in);
  pt_sched_free(p.root);
}

static void test_stage_preconditions(void **state) {
  (void)state;
  const char *same[] = {"transformer.h.1.mlp", "transformer.h.1.mlp.dropout"};
  expect_stage_error(same, 2, SLAPO_PRECOND, "end at the same op");
  const char *one[] = {"transformer.h.0"};
  pp_model p = cut_model(one, 1);
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  slapo_pp_stage *st = NULL;
  expect_status(slapo_pp_stage_new(p.m, 2, (const slapo_tensor *const *)in, 2, 1, NULL, &st),
                SLAPO_INVALID_ARG, "stage 2 of 2");
  pt_inputs_free(in);
  pt_sched_free(p.root);
}

/* ---- toy models for the preconditions GPT-2 cannot show ---- */

enum { TV = 16, TC = 8 };

static slapo_node *sum_fwd(slapo_ctx *ctx, slapo_module *self, int n, slapo_node *const *in) {
  (void)self, (void)n;
  int64_t axes[SLAPO_MAX_DIMS];
  for (int i = 0; i < in[0]->ndim; i++) axes[i] = i;
  return slapo_sum(ctx, in[0], in[0]->ndim, axes, false);
}
static slapo_node *ids_fwd(slapo_ctx *ctx, slapo_module *self, int n, slapo_node *const *in) {
  (void)self, (void)n;
  return slapo_reshape(ctx, in[0], in[0]->ndim, in[0]->shape);
}
static slapo_node *emb_fwd(slapo_ctx *ctx, slapo_module *self, int n, slapo_node *const *in) {
  (void)n;
  return slapo_embedding(ctx, slapo_weight(ctx, self, "weight"), in[0]);
}
/* a, b, then a again: a is not called in sequence. */
static slapo_node *twice_fwd(slapo_ctx *ctx, slapo_module *self, int n, slapo_node *const *in) {
  (void)n;
  slapo_node *e = slapo_call1(ctx, self, "emb", in[0]);
  slapo_node *y = slapo_call1(ctx, self, "a", e);
  y = slapo_call1(ctx, self, "a", slapo_call1(ctx, self, "b", y));
  return slapo_call1(ctx, self, "head", y);
}
/* ids (an integer value), then its embedding. */
static slapo_node *ints_fwd(slapo_ctx *ctx, slapo_module *self, int n, slapo_node *const *in) {
  (void)n;
  slapo_node *e = slapo_call1(ctx, self, "emb", slapo_call1(ctx, self, "ids", in[0]));
  return slapo_call1(ctx, self, "head", e);
}
static const slapo_module_type k_sum = {.name = "ToySum", .forward = sum_fwd};
static const slapo_module_type k_ids = {.name = "ToyIds", .forward = ids_fwd};
static const slapo_module_type k_emb = {.name = "ToyEmbedding", .forward = emb_fwd};
static const slapo_module_type k_twice = {.name = "ToyTwice", .forward = twice_fwd};
static const slapo_module_type k_ints = {.name = "ToyInts", .forward = ints_fwd};

static void add(slapo_module *m, const char *name, const slapo_module_type *t) {
  slapo_module *c;
  OK(slapo_module_new(t, NULL, &c));
  int64_t shape[2] = {TV, TC};
  if (t == &k_emb) OK(slapo_module_add_param(c, "weight", 2, shape, SLAPO_INIT_NORMAL, 0.02f));
  OK(slapo_module_add_child(m, name, c));
}

/* The toy root (twice or ints), materialized, with a stage ending after `cut`. */
static slapo_sched *toy(const slapo_module_type *t, const char *cut) {
  slapo_module *m, *lin;
  OK(slapo_module_new(t, NULL, &m));
  add(m, "emb", &k_emb);
  if (t == &k_twice) {
    for (int i = 0; i < 2; i++) {
      OK(slapo_linear_new(TC, TC, true, 0.02f, &lin));
      OK(slapo_module_add_child(m, i ? "b" : "a", lin));
    }
  } else {
    add(m, "ids", &k_ids);
  }
  add(m, "head", &k_sum);
  OK(slapo_module_materialize(m, 3));
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  OK(slapo_cut(pt_at(root, cut)));
  return root;
}

static void expect_toy_error(const slapo_module_type *t, const char *cut, const char *needle) {
  slapo_sched *root = toy(t, cut);
  int64_t bt[2] = {2, 4};
  slapo_tensor *idx;
  OK(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &idx));
  memset(slapo_tensor_data(idx), 0, slapo_tensor_nbytes(idx));
  const slapo_tensor *in[1] = {idx};
  slapo_pp_stage *st = NULL;
  expect_status(slapo_pp_stage_new(slapo_sched_module(root), 1, in, 0, 1, NULL, &st),
                SLAPO_PRECOND, needle);
  assert_null(st);
  slapo_tensor_free(idx);
  pt_sched_free(root);
}

static void test_toy_preconditions(void **state) {
  (void)state;
  expect_toy_error(&k_twice, "a", "cut: a is not called in sequence: %linear_1 of b runs");
  expect_toy_error(&k_twice, "head", "cut: nothing of the forward runs after head");
  expect_toy_error(&k_ints, "ids", "stage 0 sends no floating-point value to stage 1");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_stages_match_one_process),
      cmocka_unit_test(test_default_schedule_stages),
      cmocka_unit_test(test_auto_cut),
      cmocka_unit_test(test_stage_materialize),
      cmocka_unit_test(test_cut_errors),
      cmocka_unit_test(test_stage_preconditions),
      cmocka_unit_test(test_toy_preconditions),
  };
  return cmocka_run_group_tests(tests, inputs_setup, inputs_teardown);
}
