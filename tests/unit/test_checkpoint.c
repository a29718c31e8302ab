/* tests/unit/test_checkpoint.c - activation checkpointing through the
 * recompute pass: with dropout on, a GPT-2 whose blocks are checkpointed
 * gives a byte-identical loss and byte-identical gradients (DESIGN.md §3),
 * and its planned activation peak is lower. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "slapo/models.h"

typedef struct run {
  slapo_module *m;
  slapo_runner *r;
  float loss;
  size_t peak;
} run;

static void train_once(run *x, const char *const *ckpt, int n_ckpt) {
  slapo_gpt2_config c = {3, 4, 32, 32, 256, 0.1, 1e-5};
  assert_int_equal(slapo_gpt2_new(&c, &x->m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(x->m, 5), SLAPO_OK);
  for (int i = 0; i < n_ckpt; i++) {
    slapo_module *b;
    assert_int_equal(slapo_module_at(x->m, ckpt[i], &b), SLAPO_OK);
    b->checkpoint = true;
  }
  assert_int_equal(slapo_runner_new(x->m, NULL, &x->r), SLAPO_OK);
  int64_t shape[2] = {2, 24};
  slapo_tensor *idx, *tgt;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &tgt), SLAPO_OK);
  int32_t *a = slapo_tensor_data(idx), *b = slapo_tensor_data(tgt);
  for (int i = 0; i < 48; i++) a[i] = (i * 37) % 256, b[i] = (i * 91 + 3) % 256;
  const slapo_tensor *in[2] = {idx, tgt}, *loss;
  slapo_kernel_env env = {42, 7, true};
  slapo_status s = slapo_step(x->r, 2, in, SLAPO_STEP_TRAIN, &env, &loss);
  if (s != SLAPO_OK) fail_msg("%s", slapo_last_error());
  x->loss = *(const float *)slapo_tensor_data(loss);
  x->peak = slapo_runner_peak_nbytes(x->r);
  slapo_tensor_free(idx);
  slapo_tensor_free(tgt);
}

typedef struct pair {
  slapo_module *other;
  int n, differ;
} pair;

static void compare(slapo_parameter *p, const char *path, void *ud) {
  pair *q = ud;
  /* Find the same path in the other model: modules are built identically. */
  char mod[256];
  const char *dot = strrchr(path, '.');
  snprintf(mod, sizeof mod, "%.*s", (int)(dot - path), path);
  slapo_module *m;
  assert_int_equal(slapo_module_at(q->other, mod, &m), SLAPO_OK);
  slapo_parameter *o = slapo_module_param(m, dot + 1);
  assert_non_null(o);
  q->n++;
  if (!slapo_tensor_equal(p->grad, o->grad)) q->differ++, print_message("differs: %s\n", path);
}

static void test_checkpoint_bitwise(void **state) {
  (void)state;
  run plain = {0}, ck = {0}, one = {0};
  train_once(&plain, NULL, 0);
  const char *all[3] = {"transformer.h.0", "transformer.h.1", "transformer.h.2"};
  train_once(&ck, all, 3);
  const char *mlp[1] = {"transformer.h.1.mlp"};
  train_once(&one, mlp, 1);
  print_message("loss %.7f; planned peak: plain %zu B, all blocks %zu B, one mlp %zu B\n",
                plain.loss, plain.peak, ck.peak, one.peak);
  assert_memory_equal(&plain.loss, &ck.loss, sizeof(float));
  assert_memory_equal(&plain.loss, &one.loss, sizeof(float));
  pair q = {ck.m, 0, 0};
  assert_int_equal(slapo_module_visit_params(plain.m, compare, &q), SLAPO_OK);
  assert_int_equal(q.n, 2 + 12 * 3 + 2);
  assert_int_equal(q.differ, 0);
  pair q1 = {one.m, 0, 0};
  assert_int_equal(slapo_module_visit_params(plain.m, compare, &q1), SLAPO_OK);
  assert_int_equal(q1.differ, 0);
  assert_true(ck.peak < plain.peak);
  assert_true(one.peak <= plain.peak);
  run *rs[3] = {&plain, &ck, &one};
  for (int i = 0; i < 3; i++) {
    slapo_runner_free(rs[i]->r);
    slapo_module_free(rs[i]->m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_checkpoint_bitwise)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
