/* tests/unit/test_profile.c - slapo_profile_run (train/profile.c): row paths
 * at a depth, times that add up to the measured step, rows that name
 * modules of the model in tree order, node counts that cover the graph,
 * per-module activation bytes that add up to the executor's measured live
 * peak (so the profile's copy of the planner's liveness is the planner's)
 * and stay within the planned peak, which is the memory estimate's figure,
 * and the forward/backward split (checkpoint recomputation is backward).
 * Model: a 2-layer, 32-wide GPT-2 (context 16). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/train.h"

static slapo_module *new_model(void) {
  slapo_gpt2_config c = {2, 4, 32, 16, 256, 0.0, 1e-5};
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(m, 7), SLAPO_OK);
  return m;
}

static slapo_profile_opts opts(int depth) {
  return (slapo_profile_opts){.batch = 2, .seq = 16, .vocab = 256, .steps = 2, .depth = depth,
                              .seed = 3};
}

static const slapo_profile_row *row(const slapo_profile *p, const char *path) {
  for (int i = 0; i < p->n_rows; i++)
    if (!strcmp(p->rows[i].path, path)) return &p->rows[i];
  return NULL;
}

static int row_index(const slapo_profile *p, const char *path) {
  const slapo_profile_row *r = row(p, path);
  if (!r) fail_msg("no row %s", path);
  return (int)(r - p->rows);
}

static void test_row_path(void **state) {
  (void)state;
  char b[64];
  struct {
    const char *origin;
    int depth;
    const char *want;
  } cases[] = {
      {"", 2, "."},
      {NULL, 0, "."},
      {"lm_head", 2, "lm_head"},
      {"transformer.wte", 2, "transformer.wte"},
      {"transformer.h.0.attn.c_attn", 2, "transformer.h.0.attn"},
      {"transformer.h.0.attn.c_attn", 1, "transformer.h.0"},
      {"transformer.h.0.attn.c_attn", 0, "transformer"},
      {"transformer.h.11.mlp.c_fc", 3, "transformer.h.11.mlp.c_fc"},
      {"transformer.h.11", 9, "transformer.h.11"},
      {"0.1.x", 0, "0.1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    slapo_profile_row_path(cases[i].origin, cases[i].depth, b, sizeof b);
    if (strcmp(b, cases[i].want))
      fail_msg("%s at depth %d: got %s, want %s", cases[i].origin ? cases[i].origin : "NULL",
               cases[i].depth, b, cases[i].want);
  }
  char small[8];
  slapo_profile_row_path("transformer.h.0", 2, small, sizeof small);
  assert_string_equal(small, "transfo");
}

/* The checks every profile must pass. */
static void check_profile(slapo_module *m, const slapo_profile *p, const slapo_profile_opts *o) {
  assert_true(p->n_rows > 0);
  assert_int_equal(p->steps, o->steps);
  /* Times: rows add up to nodes_ms; nodes + optimizer + other is the step. */
  double sum = 0;
  int nodes = 0;
  size_t act = 0;
  for (int i = 0; i < p->n_rows; i++) {
    const slapo_profile_row *r = &p->rows[i];
    assert_true(r->fwd_ms >= 0 && r->bwd_ms >= 0);
    assert_true(r->n_fwd >= 0 && r->n_bwd >= 0 && r->n_fwd + r->n_bwd > 0);
    sum += r->fwd_ms + r->bwd_ms;
    nodes += r->n_fwd + r->n_bwd;
    act += r->act_nbytes;
    /* Every row names a module of the model. */
    slapo_module *x;
    if (slapo_module_at(m, strcmp(r->path, ".") ? r->path : "", &x) != SLAPO_OK)
      fail_msg("row %s names no module: %s", r->path, slapo_last_error());
    for (int j = 0; j < i; j++)
      if (!strcmp(p->rows[j].path, r->path)) fail_msg("row %s twice", r->path);
  }
  assert_true(fabs(sum - p->nodes_ms) <= 1e-9 * (1 + sum));
  assert_true(p->nodes_ms > 0 && p->optimizer_ms > 0);
  assert_true(p->grads_ms > 0);
  assert_true(p->nodes_ms + p->grads_ms + p->optimizer_ms <= p->step_ms + 1e-9);
  assert_true(p->other_ms >= -1e-9);
  assert_true(fabs(p->nodes_ms + p->grads_ms + p->optimizer_ms + p->other_ms - p->step_ms) <=
              1e-9 * p->step_ms);
  assert_int_equal(nodes, p->n_nodes);
  /* Memory: the rows are the live peak, which the executor measured too. */
  assert_true(act > 0);
  assert_int_equal(act, p->live_peak_nbytes);
  assert_int_equal(p->live_peak_nbytes, p->measured_peak_nbytes);
  assert_true(p->live_peak_nbytes <= p->planned_peak_nbytes);
  /* ... and the planned peak is the memory estimate's TRAIN figure. */
  slapo_memory_estimate e;
  assert_int_equal(slapo_memory_estimate_train(m, o->batch, o->seq, 0, false, &e), SLAPO_OK);
  assert_int_equal(p->planned_peak_nbytes, e.train_activations);
}

static void test_profile_sums(void **state) {
  (void)state;
  slapo_module *m = new_model();
  slapo_profile_opts o = opts(2);
  slapo_profile p;
  assert_int_equal(slapo_profile_run(m, &o, &p), SLAPO_OK);
  check_profile(m, &p, &o);
  assert_true(isfinite(p.loss) && p.loss > 0);
  /* Depth 2 rows, in module tree order. */
  const char *order[] = {"transformer.wte", "transformer.wpe", "transformer.h.0.ln_1",
                         "transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.1.attn",
                         "transformer.h.1.mlp", "transformer.ln_f", "lm_head"};
  for (size_t i = 1; i < sizeof order / sizeof *order; i++)
    if (row_index(&p, order[i - 1]) >= row_index(&p, order[i]))
      fail_msg("row %s comes after %s", order[i - 1], order[i]);
  assert_null(row(&p, "transformer.h.0.attn.c_attn")); /* deeper than 2 */
  /* Forward and backward: modules with parameters have both; a linear's
   * backward is at least its forward (two products instead of one). */
  const char *both[] = {"transformer.wte", "transformer.h.0.attn", "transformer.h.1.mlp",
                        "lm_head"};
  for (size_t i = 0; i < sizeof both / sizeof *both; i++) {
    const slapo_profile_row *r = row(&p, both[i]);
    assert_non_null(r);
    if (r->n_fwd == 0 || r->n_bwd == 0)
      fail_msg("%s: %d fwd, %d bwd nodes", both[i], r->n_fwd, r->n_bwd);
  }
  const slapo_profile_row *mlp = row(&p, "transformer.h.0.mlp");
  assert_true(mlp->n_bwd >= mlp->n_fwd);
  /* The forward activations of the first block are still held at the peak
   * (it is reached in the backward, before block 0's gradients). */
  assert_true(row(&p, "transformer.h.0.mlp")->act_nbytes > 0);
  slapo_profile_deinit(&p);
  slapo_profile_deinit(&p); /* idempotent */

  /* Depth 0: the root's children only; same nodes and bytes. */
  o = opts(0);
  assert_int_equal(slapo_profile_run(m, &o, &p), SLAPO_OK);
  check_profile(m, &p, &o);
  for (int i = 0; i < p.n_rows; i++)
    if (strcmp(p.rows[i].path, ".") && strcmp(p.rows[i].path, "transformer") &&
        strcmp(p.rows[i].path, "lm_head"))
      fail_msg("depth 0 row %s", p.rows[i].path);
  slapo_profile_deinit(&p);
  slapo_module_free(m);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static int nodes_of(const slapo_profile *p, bool bwd) {
  int n = 0;
  for (int i = 0; i < p->n_rows; i++) n += bwd ? p->rows[i].n_bwd : p->rows[i].n_fwd;
  return n;
}

/* Checkpointing every block: the forward is the same graph, the
 * recomputation runs in the backward (more backward nodes), and the blocks
 * hold fewer bytes at the peak. */
static void test_profile_checkpoint(void **state) {
  (void)state;
  assert_int_equal(slapo_models_init(), SLAPO_OK);
  char path[] = "/tmp/slapo_profile_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  write_text(path, "transformer.h checkpoint ratio=1.0\n");
  slapo_module *plain = new_model(), *ck = new_model();
  slapo_schedule_run run = {0};
  assert_int_equal(slapo_schedule_file_apply(ck, path, NULL, NULL, 0, &run), SLAPO_OK);
  slapo_schedule_run_deinit(&run);
  unlink(path);
  slapo_profile_opts o = opts(2);
  slapo_profile a, b;
  assert_int_equal(slapo_profile_run(plain, &o, &a), SLAPO_OK);
  assert_int_equal(slapo_profile_run(ck, &o, &b), SLAPO_OK);
  check_profile(plain, &a, &o);
  check_profile(ck, &b, &o);
  assert_int_equal(nodes_of(&a, false), nodes_of(&b, false));
  assert_true(nodes_of(&b, true) > nodes_of(&a, true));
  assert_true(b.live_peak_nbytes < a.live_peak_nbytes);
  assert_true(row(&b, "transformer.h.0.mlp")->act_nbytes <
              row(&a, "transformer.h.0.mlp")->act_nbytes);
  slapo_profile_deinit(&a);
  slapo_profile_deinit(&b);
  slapo_module_free(plain);
  slapo_module_free(ck);
}

static void test_profile_errors(void **state) {
  (void)state;
  slapo_module *m = new_model();
  slapo_profile p;
  slapo_profile_opts o = opts(2);
  o.steps = 0;
  assert_int_equal(slapo_profile_run(m, &o, &p), SLAPO_INVALID_ARG);
  assert_int_equal(p.n_rows, 0);
  o = opts(-1);
  assert_int_equal(slapo_profile_run(m, &o, &p), SLAPO_INVALID_ARG);
  o = opts(2);
  o.seq = 17; /* past the context: the step fails to build, nothing leaks */
  assert_int_not_equal(slapo_profile_run(m, &o, &p), SLAPO_OK);
  assert_null(p.rows);
  assert_int_equal(slapo_profile_run(NULL, &o, &p), SLAPO_INVALID_ARG);
  slapo_module *meta;
  slapo_gpt2_config c = {2, 4, 32, 16, 256, 0.0, 1e-5};
  assert_int_equal(slapo_gpt2_new(&c, &meta), SLAPO_OK);
  o = opts(2);
  assert_int_equal(slapo_profile_run(meta, &o, &p), SLAPO_STATE); /* not materialized */
  slapo_module_free(meta);
  slapo_module_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_row_path),
      cmocka_unit_test(test_profile_sums),
      cmocka_unit_test(test_profile_checkpoint),
      cmocka_unit_test(test_profile_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
