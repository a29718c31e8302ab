/* tests/primitives/test_prim_cut.c - the `cut` primitive and the pipeline
 * stages it makes (slapo_pp_stage_*), in one process: a tiny GPT-2 cut
 * after transformer.h.0 runs as two stages, each on its own copy of the
 * model, micro-batch by micro-batch in 1F1B's order (stage 0 keeps two
 * micro-batches in flight, in two slots), the values and gradients between
 * them copied as MPI would carry them. Against one process accumulating
 * the same micro-batches (slapo_train_accumulate): the loss and every
 * gradient of a parameter one stage holds are bitwise equal; the tied
 * embedding's, summed over the two stages, within 1e-6. Also the cut
 * primitive's errors and the stages' preconditions with their messages. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "prim_test.h"
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

static void test_two_stages_match_one_process(void **state) {
  (void)state;
  slapo_tensor *in[M][2];
  mb_inputs(in);
  const slapo_tensor *flat[2 * M];
  slapo_kernel_env envs[M];
  for (int m = 0; m < M; m++) {
    flat[2 * m] = in[m][0], flat[2 * m + 1] = in[m][1];
    envs[m] = (slapo_kernel_env){.seed = 2024, .step = (uint64_t)(10 + m), .training = true};
  }
  /* One process. */
  slapo_module *ref = pt_model(&k_tiny);
  slapo_runner *run;
  OK(slapo_runner_new(ref, NULL, &run));
  double want_loss;
  OK(slapo_train_accumulate(run, M, flat, envs, &want_loss, NULL));
  slapo_runner_free(run);

  /* Two stages, each on its own copy of the model. */
  const char *cuts[] = {"transformer.h.0"};
  pp_model a = cut_model(cuts, 1), b = cut_model(cuts, 1);
  assert_int_equal(slapo_pp_stage_count(a.m), 2);
  slapo_pp_stage *s0, *s1;
  OK(slapo_pp_stage_new(a.m, 2, flat, 0, 2, NULL, &s0));
  OK(slapo_pp_stage_new(b.m, 2, flat, 1, 1, NULL, &s1));
  assert_false(slapo_pp_stage_is_last(s0));
  assert_true(slapo_pp_stage_is_last(s1));
  assert_int_equal(slapo_pp_stage_n_recv(s0), 0);
  assert_int_equal(slapo_pp_stage_n_send(s1), 0);
  assert_true(slapo_pp_stage_n_send(s0) >= 1);
  double wd = (double)(PT_B * PT_T) / (double)(M * PT_B * PT_T); /* n_i / N, all valid */
  float w = (float)wd;
  double loss = 0;
  /* 1F1B, p = 2, m = 3: stage 0 runs F0 F1 B0 F2 B1 B2, stage 1 F0 B0 F1
   * B1 F2 B2; what a stage sent is read before it runs again. */
  OK(slapo_pp_stage_forward(s0, 0, 2, flat, &envs[0]));
  send_act(s0, s1);
  for (int m = 0; m < M; m++) {
    unsigned g = m == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD;
    OK(slapo_pp_stage_forward(s1, 0, 2, flat + 2 * m, &envs[m]));
    loss += wd * (double)*(const float *)slapo_tensor_data(slapo_pp_stage_loss(s1));
    OK(slapo_pp_stage_backward(s1, 0, 2, flat + 2 * m, &envs[m], w, g));
    send_grad(s1, s0, m % 2);
    if (m + 1 < M) {
      /* m + 1's activations wait in the other slot while m's backward runs. */
      OK(slapo_pp_stage_forward(s0, (m + 1) % 2, 2, flat + 2 * (m + 1), &envs[m + 1]));
      send_act(s0, s1);
    }
    OK(slapo_pp_stage_backward(s0, m % 2, 2, flat + 2 * m, &envs[m], w, g));
  }
  assert_true(loss == want_loss);

  /* Gradients, by parameter path. */
  pt_result r = {0};
  OK(slapo_module_visit_params(ref, pt_take_grad, &r));
  int tied = 0;
  for (int i = 0; i < r.n; i++) {
    const char *path = r.params[i]->path;
    bool h0 = pt_stage_holds(s0, path), h1 = pt_stage_holds(s1, path);
    assert_true(h0 || h1);
    const slapo_tensor *g0 = param_of(a.m, path)->grad, *g1 = param_of(b.m, path)->grad;
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
  slapo_pp_stage_free(s0);
  slapo_pp_stage_free(s1);
  pt_sched_free(a.root);
  pt_sched_free(b.root);
  slapo_module_free(ref);
  for (int m = 0; m < M; m++) slapo_tensor_free(in[m][0]), slapo_tensor_free(in[m][1]);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_stages_match_one_process),
      cmocka_unit_test(test_cut_errors),
      cmocka_unit_test(test_stage_preconditions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
