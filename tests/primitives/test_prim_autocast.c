/* tests/primitives/test_prim_autocast.c - the `autocast` primitive on a tiny
 * GPT-2: its log line is the .sched form; the step graph casts each GEMM
 * operand once (weights once per graph) and keeps lm_head f32 under
 * `lm_head autocast dtype=f32`; a checkpointed block's recompute redoes its
 * casts and the gradients equal the uncheckpointed bf16 model's bit for
 * bit; each documented precondition fails with its status and message and
 * leaves the module unchanged. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static void test_log_line(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_autocast_module(root, "bf16"));
  char *line = pt_last_line(root);
  assert_string_equal(line, ". autocast dtype=bf16");
  free(line);
  OK(slapo_autocast_module(pt_at(root, "lm_head"), "f32"));
  line = pt_last_line(root);
  assert_string_equal(line, "lm_head autocast dtype=f32");
  free(line);
  pt_sched_free(root);
}

/* Counts the to_bf16 nodes of m's train step graph and whether lm_head's
 * linear (the one writing the logits) reads bf16. */
typedef struct graph_facts {
  int casts, bf16_gemms, f32_gemms;
} graph_facts;

static graph_facts facts_of(slapo_module *m) {
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  slapo_runner *r;
  OK(slapo_runner_new(m, NULL, &r));
  slapo_kernel_env env = {1, 1, true};
  const slapo_tensor *out;
  OK(slapo_step(r, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, &out));
  const slapo_graph *g = slapo_runner_graph(r);
  assert_non_null(g);
  graph_facts f = {0};
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (n->op == slapo_op_find("to_bf16")) f.casts++;
    if (n->op == slapo_op_find("linear") || n->op == slapo_op_find("matmul")) {
      if (n->inputs[0]->dtype == SLAPO_DTYPE_BF16) f.bf16_gemms++;
      else f.f32_gemms++;
    }
  }
  slapo_runner_free(r);
  pt_inputs_free(in);
  return f;
}

static void test_graph_casts(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  graph_facts f32 = facts_of(slapo_sched_module(root));
  assert_int_equal(f32.casts, 0);
  assert_int_equal(f32.bf16_gemms, 0);
  OK(slapo_autocast_module(root, "bf16"));
  graph_facts all = facts_of(slapo_sched_module(root));
  /* Every GEMM, forward and backward, reads bf16. */
  assert_int_equal(all.f32_gemms, 0);
  assert_int_equal(all.bf16_gemms, f32.f32_gemms);
  OK(slapo_autocast_module(pt_at(root, "lm_head"), "f32"));
  graph_facts kept = facts_of(slapo_sched_module(root));
  /* lm_head's forward, dx and dw GEMMs are f32 again, and their casts gone. */
  assert_int_equal(kept.f32_gemms, 3);
  assert_true(kept.casts < all.casts);
  pt_sched_free(root);
}

/* Autocast first, then trace (flattened, GEMMs decomposed as in
 * schedules/gpt2.sched): the traced blocks' stored graphs hold the casts,
 * so every GEMM of the step still reads bf16. */
static void test_trace_records_casts(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  graph_facts f32 = facts_of(slapo_sched_module(root));
  pt_apply(root, ". autocast dtype=bf16\n"
                 "transformer.h.*.mlp.c_fc decompose\n"
                 "transformer.h.* trace flatten=true\n");
  graph_facts f = facts_of(slapo_sched_module(root));
  assert_int_equal(f.f32_gemms, 0);
  assert_int_equal(f.bf16_gemms, f32.f32_gemms);
  pt_sched_free(root);
}

/* Checkpointing a bf16 block recomputes its casts: the same numbers. */
static void test_checkpoint_recomputes_casts(void **state) {
  (void)state;
  slapo_sched *a = pt_sched_new(&k_tiny), *b = pt_sched_new(&k_tiny);
  OK(slapo_autocast_module(a, "bf16"));
  OK(slapo_autocast_module(b, "bf16"));
  OK(slapo_checkpoint(pt_at(b, "transformer.h.0"), 0));
  OK(slapo_checkpoint(pt_at(b, "transformer.h.1"), 0));
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  pt_result ra, rb;
  pt_run(slapo_sched_module(a), in, &ra);
  pt_run(slapo_sched_module(b), in, &rb);
  pt_expect_bitwise(&rb, &ra);
  pt_result_free(&ra), pt_result_free(&rb);
  pt_inputs_free(in);
  pt_sched_free(a);
  pt_sched_free(b);
}

static void expect_refused(slapo_sched *node, const char *dtype, slapo_status want,
                           const char *needle) {
  slapo_module *m = slapo_sched_module(node);
  bool was_set = m->autocast_set;
  slapo_autocast was = m->autocast;
  assert_int_equal(slapo_autocast_module(node, dtype), want);
  if (!strstr(slapo_last_error(), needle))
    fail_msg("message '%s' lacks '%s'", slapo_last_error(), needle);
  assert_int_equal(m->autocast_set, was_set);
  assert_int_equal(m->autocast, was);
}

static void test_preconditions(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  expect_refused(root, "f16", SLAPO_INVALID_ARG,
                 "autocast: .: dtype=f16 is not a GEMM precision slapo autocasts to: bf16, "
                 "or f32");
  expect_refused(root, NULL, SLAPO_INVALID_ARG, "dtype=(none)");
  OK(slapo_autocast_module(pt_at(root, "transformer.h.0"), "bf16"));
  expect_refused(pt_at(root, "transformer.h.0"), "f32", SLAPO_STATE,
                 "autocast: transformer.h.0 already has autocast dtype=bf16");
  /* Traced first: its graph has no casts. */
  slapo_trace_opts to = {0};
  OK(slapo_module_trace(slapo_sched_module(pt_at(root, "transformer.h.1")), &to));
  expect_refused(pt_at(root, "transformer.h.1"), "bf16", SLAPO_STATE,
                 "autocast: transformer.h.1 is traced (at itself): its graph was recorded "
                 "without casts; put the autocast line before the trace line");
  expect_refused(pt_at(root, "transformer"), "bf16", SLAPO_STATE, "is traced (at 1)");
  pt_sched_free(root);
}

/* In a .sched file: a glob that matches nothing, and an unknown argument. */
static void test_schedule_errors(void **state) {
  (void)state;
  const struct {
    const char *text, *needle;
  } cases[] = {
      {"transformer.h.*.nothing autocast dtype=bf16\n", "transformer.h.*.nothing"},
      {". autocast dtype=bf16 scale=2\n", "scale"},
      {". autocast\n", "missing argument 'dtype'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    slapo_sched *root = pt_sched_new(&k_tiny);
    slapo_sched_log *log;
    OK(slapo_sched_parse(cases[i].text, "x.sched", &log));
    assert_int_not_equal(slapo_apply_schedule(root, log, NULL, 0, 0, NULL), SLAPO_OK);
    if (!strstr(slapo_last_error(), cases[i].needle))
      fail_msg("'%s': message '%s' lacks '%s'", cases[i].text, slapo_last_error(),
               cases[i].needle);
    assert_false(slapo_sched_module(root)->autocast_set);
    slapo_sched_log_free(log);
    pt_sched_free(root);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_log_line),
      cmocka_unit_test(test_graph_casts),
      cmocka_unit_test(test_checkpoint_recomputes_casts),
      cmocka_unit_test(test_trace_records_casts),
      cmocka_unit_test(test_preconditions),
      cmocka_unit_test(test_schedule_errors),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
