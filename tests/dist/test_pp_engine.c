/* tests/dist/test_pp_engine.c - pipeline parallelism over MPI
 * (slapo_pp_train_accumulate, slapo_pp_sum_tied_grads): a tiny GPT-2 cut
 * after transformer.h.0 runs as one stage per rank (mpirun -np 2), four
 * micro-batches a step, in 1F1B's order and in GPipe's. Every rank also
 * computes one process's step (slapo_train_accumulate over the same
 * micro-batches, same thread count) and checks: the loss bitwise, every
 * gradient of a parameter its stage alone holds bitwise, the tied
 * embedding's (on both stages) within 1e-6 and bitwise the same on both
 * ranks; then a whole optimizer step (slapo_pp_train_update) and the
 * model gathered back (slapo_pp_gather) against one process's step.
 * Errors that must fail on every rank alike, before any transfer:
 * a rank holding another stage than its pipeline rank, too few slots.
 * CTest runs it under mpirun -np 2 with a timeout. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"
#include "slapo/primitives.h"
#include "slapo/train.h"

enum { M = 4 };

static int P = 1, R = 0; /* pipeline size, this rank's stage */

static slapo_tensor *g_in[M][2];
static const slapo_tensor *g_flat[2 * M];
static slapo_kernel_env g_envs[M];

static void make_inputs(void) {
  int64_t bt[2] = {PT_B, PT_T};
  for (int m = 0; m < M; m++) {
    for (int j = 0; j < 2; j++) {
      OK(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &g_in[m][j]));
      int32_t *d = slapo_tensor_data(g_in[m][j]); /* [B, T] */
      for (int64_t i = 0; i < PT_B * PT_T; i++)
        d[i] = (int32_t)((i * 37 + j * 11 + m * 101 + 5) % k_tiny.vocab_size);
    }
    /* Some ignored targets: micro-batches weigh by their valid tokens. */
    if (m == 1) ((int32_t *)slapo_tensor_data(g_in[m][1]))[3] = SLAPO_IGNORE_INDEX;
    g_flat[2 * m] = g_in[m][0], g_flat[2 * m + 1] = g_in[m][1];
    g_envs[m] = (slapo_kernel_env){.seed = 99, .step = (uint64_t)(40 + m), .training = true};
  }
}

static slapo_sched *cut_model(void) {
  slapo_sched *root = pt_sched_new(&k_tiny);
  if (P > 1) OK(slapo_cut(pt_at(root, "transformer.h.0")));
  return root;
}

static void check_schedule(slapo_pp_schedule sched) {
  /* One process, on every rank. */
  slapo_module *ref = pt_model(&k_tiny);
  slapo_runner *run;
  OK(slapo_runner_new(ref, NULL, &run));
  double want;
  OK(slapo_train_accumulate(run, M, g_flat, g_envs, &want, NULL));
  slapo_runner_free(run);
  pt_result r = {0};
  OK(slapo_module_visit_params(ref, pt_take_grad, &r));

  slapo_sched *root = cut_model();
  slapo_module *m = slapo_sched_module(root);
  slapo_pp_stage *st;
  OK(slapo_pp_stage_new(m, 2, g_flat, R, M, NULL, &st));
  double loss;
  int64_t valid;
  OK(slapo_pp_train_accumulate(st, sched, M, g_flat, g_envs, &loss, &valid));
  assert_int_equal(valid, M * PT_B * PT_T - 1);
  int tied;
  OK(slapo_pp_sum_tied_grads(st, m, &tied));
  assert_int_equal(tied, P > 1 ? 1 : 0);
  assert_true(loss == want);
  pt_result got = {0};
  OK(slapo_module_visit_params(m, pt_take_grad, &got));
  assert_int_equal(got.n, r.n);
  int checked = 0;
  for (int i = 0; i < r.n; i++) {
    if (!pt_stage_holds(st, r.paths[i])) continue;
    checked++;
    int64_t n = slapo_tensor_numel(r.grads[i]);
    const float *a = slapo_tensor_data(got.grads[i]), *b = slapo_tensor_data(r.grads[i]);
    if (P > 1 && !strcmp(r.paths[i], "transformer.wte.weight")) {
      for (int64_t k = 0; k < n; k++) assert_float_equal(a[k], b[k], 1e-6);
      /* Both holders have the same bits. */
      float *other = slapo_calloc((size_t)n * (size_t)P, sizeof *other);
      OK(slapo_dist_all_gather_f32(SLAPO_GROUP_PP, a, other, n));
      assert_memory_equal(other, other + n, (size_t)n * sizeof(float));
      slapo_free(other);
    } else {
      assert_memory_equal(a, b, (size_t)n * sizeof(float));
    }
  }
  assert_true(checked > 0);
  pt_result_free(&got);
  pt_result_free(&r);
  slapo_pp_stage_free(st);
  pt_sched_free(root);
  slapo_module_free(ref);
}

static void test_1f1b_matches_one_process(void **state) {
  (void)state;
  check_schedule(SLAPO_PP_1F1B);
}

static void test_gpipe_matches_one_process(void **state) {
  (void)state;
  check_schedule(SLAPO_PP_GPIPE);
}

/* Weights of every parameter of m by path, copied (pt_result's grads). */
static void take_weight(slapo_parameter *p, const char *path, void *ud) {
  pt_result *r = ud;
  slapo_tensor *g = p->grad;
  p->grad = p->value; /* pt_take_grad copies p->grad */
  pt_take_grad(p, path, r);
  p->grad = g;
}

/* A whole optimizer step: one process's slapo_train_update against this
 * stage's slapo_pp_train_update on a rank released to its stage
 * (slapo_pp_release, slapo_pp_adamw_new: no weights, gradient or moments
 * of another stage's parameters), then slapo_pp_gather: stage 0 holds the
 * whole model, which a save needs, every weight bitwise one process's but
 * the tied embedding's (within 1e-6: its gradient sums in another order),
 * the AdamW moments moved along; the other ranks their stage's; the norm
 * within rounding. */
static void test_update_and_gather(void **state) {
  (void)state;
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_module *ref = pt_model(&k_tiny);
  slapo_runner *run;
  slapo_adamw *ref_opt, *opt;
  double loss, want_norm, norm;
  OK(slapo_runner_new(ref, NULL, &run));
  OK(slapo_adamw_new(ref, &ac, &ref_opt));
  OK(slapo_train_accumulate(run, M, g_flat, g_envs, &loss, NULL));
  OK(slapo_train_update(run, ref, ref_opt, 1e-3f, 0, &want_norm, NULL));
  pt_result want = {0};
  OK(slapo_module_visit_params(ref, take_weight, &want));

  slapo_sched *root = cut_model();
  slapo_module *m = slapo_sched_module(root);
  slapo_pp_stage *st;
  OK(slapo_pp_stage_new(m, 2, g_flat, R, M, NULL, &st));
  OK(slapo_pp_release(st, m, NULL));
  OK(slapo_pp_adamw_new(st, m, &ac, &opt));
  /* Another stage's block: no weights, gradient or moments here. */
  slapo_parameter *other = slapo_module_param_at(m, R == 0 ? "transformer.h.1.mlp.c_fc.weight"
                                                             : "transformer.h.0.mlp.c_fc.weight");
  assert_non_null(other);
  if (P > 1) assert_true(slapo_tensor_is_meta(other->value) && !other->grad);
  OK(slapo_pp_train_accumulate(st, SLAPO_PP_1F1B, M, g_flat, g_envs, &loss, NULL));
  OK(slapo_pp_train_update(st, m, opt, 1e-3f, 0, &norm, NULL));
  assert_float_equal(norm, want_norm, 1e-6 * want_norm);
  char path[] = "/tmp/slapo_pp_optim_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  if (P > 1 && R == 0) /* the writer needs every moment */
    expect_status(slapo_adamw_save(opt, path, NULL), SLAPO_STATE, "are another rank's");
  OK(slapo_pp_gather(st, m, opt));
  OK(slapo_adamw_save(opt, path, NULL)); /* whole on rank 0, which writes */
  unlink(path);
  for (int i = 0; i < want.n; i++) {
    slapo_parameter *p = slapo_module_param_at(m, want.paths[i]);
    if (slapo_tensor_is_meta(p->value)) { /* another stage's, not on stage 0 */
      assert_true(R != 0 && !pt_stage_holds(st, want.paths[i]));
      continue;
    }
    int64_t n = slapo_tensor_numel(want.grads[i]);
    const float *a = slapo_tensor_data(p->value), *b = slapo_tensor_data(want.grads[i]);
    bool tied = P > 1 && !strcmp(want.paths[i], "transformer.wte.weight");
    if (tied)
      for (int64_t k = 0; k < n; k++) assert_float_equal(a[k], b[k], 1e-6);
    else
      assert_memory_equal(a, b, (size_t)n * sizeof(float));
    slapo_tensor *gm, *gv, *wm, *wv;
    OK(slapo_adamw_moments(opt, p, &gm, &gv));
    OK(slapo_adamw_moments(ref_opt, want.params[i], &wm, &wv));
    if (!tied) {
      assert_memory_equal(slapo_tensor_data(gm), slapo_tensor_data(wm), (size_t)n * sizeof(float));
      assert_memory_equal(slapo_tensor_data(gv), slapo_tensor_data(wv), (size_t)n * sizeof(float));
    }
  }
  /* Stage 0 lets go of the others' parameters again. */
  OK(slapo_pp_release(st, m, opt));
  if (P > 1) assert_true(slapo_tensor_is_meta(other->value) && !other->grad);
  assert_int_equal(slapo_adamw_steps(opt), 1);
  pt_result_free(&want);
  slapo_adamw_free(opt);
  slapo_pp_stage_free(st);
  pt_sched_free(root);
  slapo_adamw_free(ref_opt);
  slapo_runner_free(run);
  slapo_module_free(ref);
}

/* Tied copies that drift apart (here: the last stage's copy of the
 * embedding nudged by hand) end the next step on every rank, naming the
 * parameter, both stages and the step. */
static void test_tied_copies_checked(void **state) {
  (void)state;
  if (P < 2) return;
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_sched *root = cut_model();
  slapo_module *m = slapo_sched_module(root);
  slapo_pp_stage *st;
  slapo_adamw *opt;
  double loss;
  OK(slapo_pp_stage_new(m, 2, g_flat, R, M, NULL, &st));
  OK(slapo_pp_adamw_new(st, m, &ac, &opt));
  OK(slapo_pp_train_accumulate(st, SLAPO_PP_1F1B, M, g_flat, g_envs, &loss, NULL));
  OK(slapo_pp_train_update(st, m, opt, 1e-3f, 1.0, NULL, NULL));
  if (R == P - 1) {
    slapo_parameter *wte = slapo_module_param_at(m, "transformer.wte.weight");
    ((float *)slapo_tensor_data(wte->value))[5] += 0.5f;
  }
  OK(slapo_pp_train_accumulate(st, SLAPO_PP_1F1B, M, g_flat, g_envs, &loss, NULL));
  char want[160];
  snprintf(want, sizeof want, "after step 2 the tied parameter transformer.wte.weight differs "
           "between stage 0 and stage %d", P - 1);
  expect_status(slapo_pp_train_update(st, m, opt, 1e-3f, 1.0, NULL, NULL), SLAPO_VERIFY, want);
  slapo_adamw_free(opt);
  slapo_pp_stage_free(st);
  pt_sched_free(root);
}

static void test_errors_on_every_rank(void **state) {
  (void)state;
  if (P < 2) return;
  slapo_sched *root = cut_model();
  slapo_module *m = slapo_sched_module(root);
  slapo_pp_stage *st;
  double loss;
  /* Each rank builds the other's stage. */
  OK(slapo_pp_stage_new(m, 2, g_flat, P - 1 - R, M, NULL, &st));
  expect_status(slapo_pp_train_accumulate(st, SLAPO_PP_1F1B, M, g_flat, g_envs, &loss, NULL),
                SLAPO_INVALID_ARG, "but holds stage");
  slapo_pp_stage_free(st);
  /* One slot: GPipe keeps all four micro-batches in flight. */
  OK(slapo_pp_stage_new(m, 2, g_flat, R, 1, NULL, &st));
  expect_status(slapo_pp_train_accumulate(st, SLAPO_PP_GPIPE, M, g_flat, g_envs, &loss, NULL),
                SLAPO_INVALID_ARG, "keeps up to 4 in flight");
  slapo_pp_stage_free(st);
  pt_sched_free(root);
}

int main(void) {
  const char *n = getenv("OMPI_COMM_WORLD_SIZE");
  P = n ? atoi(n) : 1;
  if (slapo_dist_init_pp(1, P) != SLAPO_OK) {
    fprintf(stderr, "%s\n", slapo_last_error());
    return 1;
  }
  R = slapo_dist_rank(SLAPO_GROUP_PP);
  make_inputs();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_1f1b_matches_one_process),
      cmocka_unit_test(test_gpipe_matches_one_process),
      cmocka_unit_test(test_update_and_gather),
      cmocka_unit_test(test_tied_copies_checked),
      cmocka_unit_test(test_errors_on_every_rank),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  for (int m = 0; m < M; m++) slapo_tensor_free(g_in[m][0]), slapo_tensor_free(g_in[m][1]);
  slapo_dist_finalize();
  return rc;
}
