/* tests/unit/test_step_inputs.c - slapo_step refuses token ids and targets
 * outside the vocabulary (module/index_check.c) instead of returning the
 * plausible loss the kernels would give (a zero embedding row, a skipped
 * target): the message names the input, the value, its element and the
 * reader; an ignored target (-100) passes, and strided ids are checked
 * element by element. Also: slapo_runner_estimate on a meta model, and
 * NULL arguments of the public entry points as INVALID_ARG. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdlib.h>
#include <string.h>

#include "common/expect.h"
#include "slapo/models.h"
#include "slapo/primitives.h"
#include "slapo/schedule.h"


typedef struct fixture {
  slapo_module *m;
  slapo_runner *r;
  slapo_tensor *x, *y;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  slapo_gpt2_config cfg;
  assert_ok(slapo_gpt2_config_named("tiny", &cfg));
  cfg.n_layer = 1;
  assert_ok(slapo_gpt2_new(&cfg, &f->m));
  assert_ok(slapo_module_materialize(f->m, 1));
  assert_ok(slapo_runner_new(f->m, NULL, &f->r));
  int64_t shape[2] = {2, 8};
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &f->x));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I64, 2, shape, &f->y));
  int32_t *xp = slapo_tensor_data(f->x);
  int64_t *yp = slapo_tensor_data(f->y);
  for (int i = 0; i < 16; i++) xp[i] = i * 7 % 256, yp[i] = i * 13 % 256;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  slapo_runner_free(f->r);
  slapo_module_free(f->m);
  slapo_tensor_free(f->x);
  slapo_tensor_free(f->y);
  free(f);
  return 0;
}

static slapo_status train(fixture *f) {
  const slapo_tensor *in[2] = {f->x, f->y};
  return slapo_step(f->r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL);
}

static void test_ids_outside_vocabulary(void **state) {
  fixture *f = *state;
  assert_ok(train(f));
  int32_t *xp = slapo_tensor_data(f->x);
  xp[3] = 256;
  assert_int_equal(train(f), SLAPO_INVALID_ARG);
  assert_last_error_has("step: input 0 holds 256 at element 3, outside [0, 256), the vocabulary of embedding");
  xp[3] = -1;
  assert_int_equal(train(f), SLAPO_INVALID_ARG);
  assert_last_error_has("holds -1 at element 3");
  xp[3] = -100; /* an ignore_index is for targets only */
  assert_int_equal(train(f), SLAPO_INVALID_ARG);
  xp[3] = 3;
  assert_ok(train(f));
}

static void test_targets_outside_vocabulary(void **state) {
  fixture *f = *state;
  int64_t *yp = slapo_tensor_data(f->y);
  yp[15] = -100; /* ignored */
  assert_ok(train(f));
  yp[15] = 1000;
  assert_int_equal(train(f), SLAPO_INVALID_ARG);
  assert_last_error_has("step: input 1 holds 1000 at element 15, outside [0, 256), the vocabulary of "
             "cross_entropy");
  assert_last_error_has("ignore_index");
  yp[15] = 5;
  assert_ok(train(f));
}

/* A strided view of the ids is checked element by element too. */
static void test_strided_ids(void **state) {
  fixture *f = *state;
  int64_t shape[2] = {8, 2};
  slapo_tensor *t, *view;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &t));
  int32_t *tp = slapo_tensor_data(t);
  for (int i = 0; i < 16; i++) tp[i] = i;
  int perm[2] = {1, 0};
  assert_ok(slapo_tensor_permute(t, perm, &view)); /* [2, 8], strided */
  const slapo_tensor *in[2] = {view, f->y};
  assert_ok(slapo_step(f->r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL));
  tp[1] = 300; /* element [1, 0] of the view */
  assert_int_equal(slapo_step(f->r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL), SLAPO_INVALID_ARG);
  assert_last_error_has("holds 300 at element 8");
  slapo_tensor_free(view);
  slapo_tensor_free(t);
}

/* A meta model estimates its step without a name_params call first, and
 * the id check leaves meta inputs alone. */
static void test_estimate_meta_model(void **state) {
  (void)state;
  slapo_gpt2_config cfg;
  slapo_module *m;
  slapo_runner *r;
  assert_ok(slapo_gpt2_config_named("tiny", &cfg));
  assert_ok(slapo_gpt2_new(&cfg, &m));
  assert_ok(slapo_runner_new(m, NULL, &r));
  int64_t shape[2] = {2, 8};
  slapo_tensor *x;
  assert_ok(slapo_tensor_new_meta(SLAPO_DTYPE_I32, 2, shape, &x));
  const slapo_tensor *in[2] = {x, x};
  size_t peak = 0;
  assert_ok(slapo_runner_estimate(r, 2, in, SLAPO_STEP_TRAIN, &peak));
  assert_true(peak > 0);
  slapo_tensor_free(x);
  slapo_runner_free(r);
  slapo_module_free(m);
}

/* NULL where a pointer is required is the caller's error, named, never a
 * crash. */
static void test_null_arguments(void **state) {
  fixture *f = *state;
  slapo_module *m;
  slapo_sched_log *log;
  slapo_sched *tree, *node;
  assert_int_equal(slapo_module_at(f->m, NULL, &m), SLAPO_INVALID_ARG);
  assert_last_error_has("module_at: path is NULL");
  assert_int_equal(slapo_sched_parse(NULL, "x.sched", &log), SLAPO_INVALID_ARG);
  assert_last_error_has("sched_parse: text is NULL");
  assert_int_equal(slapo_sched_parse_file(NULL, &log), SLAPO_INVALID_ARG);
  assert_ok(slapo_sched_create(f->m, &tree));
  assert_int_equal(slapo_sched_at(tree, NULL, &node), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_fuse(tree, NULL, "none", "F", NULL, false), SLAPO_INVALID_ARG);
  assert_last_error_has("fuse: p is NULL");
  slapo_sched_free(tree);
  const slapo_tensor *in[2] = {f->x, NULL};
  assert_int_equal(slapo_step(f->r, 2, in, SLAPO_STEP_TRAIN, NULL, NULL), SLAPO_INVALID_ARG);
  assert_last_error_has("step: input 1 is NULL");
  assert_int_equal(slapo_step(f->r, 2, NULL, SLAPO_STEP_TRAIN, NULL, NULL), SLAPO_INVALID_ARG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ids_outside_vocabulary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_targets_outside_vocabulary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_strided_ids, setup, teardown),
      cmocka_unit_test(test_estimate_meta_model),
      cmocka_unit_test_setup_teardown(test_null_arguments, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
