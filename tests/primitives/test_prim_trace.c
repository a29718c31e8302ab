/* tests/primitives/test_prim_trace.c - the `trace` primitive: a traced
 * module computes exactly what it did (loss, logits and every gradient
 * byte-identical, dropout on), with and without flatten, at the example
 * shapes and at others (re-traced); the stored graph's structure; refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "prim_test.h"
#include "slapo/primitives.h"


static char *graph_text(slapo_sched *n) {
  return pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(n)));
}

static void trace_mlp_keeps_children(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_trace(pt_at(root, "transformer.h.0.mlp"), NULL));
  char *g = graph_text(pt_at(root, "transformer.h.0.mlp"));
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module c_fc(%in0)"));
  assert_non_null(strstr(g, "call_module act("));
  assert_non_null(strstr(g, "call_module dropout("));
  assert_null(strstr(g, "call_op"));
  free(g);
  /* The example is [2, 8]; [2, 16] and [3, 5] re-trace. */
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, PT_B, PT_T, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.0.mlp trace");
  free(line);
  pt_sched_free(root);
}

static void trace_flatten_block(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_trace_opts o = {.flatten = true};
  OK(slapo_trace(pt_at(root, "transformer.h.1"), &o));
  char *g = graph_text(pt_at(root, "transformer.h.1"));
  print_message("%s", g);
  /* attn and mlp are inlined; their Linears stay leaves. */
  assert_non_null(strstr(g, "call_module attn.c_attn("));
  assert_non_null(strstr(g, "call_module mlp.c_fc("));
  assert_non_null(strstr(g, "call_op matmul("));
  assert_non_null(strstr(g, "# attn"));
  assert_null(strstr(g, "call_module attn("));
  free(g);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1 trace flatten=true");
  free(line);
  /* The inlined attention can no longer be traced or replaced alone. */
  PT_EXPECT_REFUSED(root, slapo_trace(pt_at(root, "transformer.h.1.attn"), NULL), SLAPO_STATE,
                    "transformer.h.1.attn is inlined into the flattened trace of transformer.h.1");
  PT_EXPECT_REFUSED(root, slapo_trace(pt_at(root, "transformer.h.1"), NULL), SLAPO_STATE,
                    "already traced");
  PT_EXPECT_REFUSED(root, slapo_checkpoint(pt_at(root, "transformer.h.1.mlp"), 0), SLAPO_STATE,
                    "checkpoint: transformer.h.1.mlp is inlined into the flattened trace of "
                    "transformer.h.1");
  PT_EXPECT_REFUSED(root, slapo_replace(pt_at(root, "transformer.h.1.attn"), "FlashAttention"),
                    SLAPO_STATE, "replace: transformer.h.1.attn is inlined");
  /* A leaf inside the flattened graph keeps its own schedule state. */
  OK(slapo_checkpoint(pt_at(root, "transformer.h.1.mlp.c_fc"), 0));
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_replays(root, &k_tiny);
  pt_sched_free(root);
}

static void trace_root_flatten_with_leaves(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_trace_opts o = {.flatten = true, .leaves = "GPT2MLP, transformer.h.0.attn"};
  OK(slapo_trace(root, &o));
  char *g = graph_text(root);
  assert_non_null(strstr(g, "call_module transformer.h.0.mlp("));
  assert_non_null(strstr(g, "call_module transformer.h.0.attn("));
  assert_non_null(strstr(g, "call_module transformer.h.1.attn.c_attn("));
  assert_non_null(strstr(g, "call_op cross_entropy("));
  free(g);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true);
  char *line = pt_last_line(root);
  assert_string_equal(line, ". trace flatten=true leaves=\"GPT2MLP, transformer.h.0.attn\"");
  free(line);
  pt_sched_free(root);
}

static void traced_child_inside_traced_parent(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_trace(pt_at(root, "transformer.h.0.attn"), NULL));
  OK(slapo_trace(pt_at(root, "transformer.h.0"), NULL));
  OK(slapo_checkpoint(pt_at(root, "transformer.h.0.mlp"), 0));
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true);
  pt_sched_free(root);
}

static void refuses_checkpointed_inline(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  OK(slapo_checkpoint(pt_at(root, "transformer.h.0.mlp"), 0));
  slapo_trace_opts o = {.flatten = true};
  PT_EXPECT_REFUSED(root, slapo_trace(pt_at(root, "transformer.h.0"), &o), SLAPO_UNSUPPORTED,
                    "cannot inline transformer.h.0.mlp", "checkpointed");
  pt_sched_free(root);
}

static void schedule_file_form(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_log *log;
  OK(slapo_sched_parse("transformer.h.*.mlp trace flatten=true\n", "t.sched", &log));
  size_t n = 0;
  OK(slapo_apply_schedule(root, log, NULL, 0, 0, &n));
  assert_int_equal(n, 2);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  slapo_sched_log_free(log);
  OK(slapo_sched_parse("transformer.h.0 trace flat=true\n", "t.sched", &log));
  PT_EXPECT_ERROR(slapo_apply_schedule(root, log, NULL, 0, 0, &n), SLAPO_INVALID_ARG,
                  "t.sched:1", "flat");
  slapo_sched_log_free(log);
  pt_sched_free(root);
}

/* The named `tiny` config (4 blocks, 128 wide) with dropout on: every block
 * traced flat, and every MLP of a second model traced unflattened. */
static void named_tiny_bitwise(void **state) {
  (void)state;
  slapo_gpt2_config c;
  OK(slapo_gpt2_config_named("tiny", &c));
  c.dropout = 0.1;
  for (int flat = 0; flat < 2; flat++) {
    slapo_sched *root;
    OK(slapo_sched_create(pt_model(&c), &root));
    slapo_sched_list l = {0};
    OK(slapo_sched_select(root, flat ? "transformer.h.*" : "transformer.h.*.mlp", &l));
    for (size_t i = 0; i < l.n; i++)
      OK(slapo_trace(l.items[i], &(slapo_trace_opts){.flatten = flat != 0}));
    slapo_sched_list_deinit(&l);
    slapo_tensor *in[2];
    pt_inputs(2, 24, c.vocab_size, in);
    slapo_module *ref = pt_model(&c);
    pt_result a, b;
    pt_run(ref, in, &a);
    pt_run(slapo_sched_module(root), in, &b);
    pt_expect_bitwise(&a, &b);
    pt_result_free(&a), pt_result_free(&b);
    slapo_module_free(ref);
    pt_inputs_free(in);
    pt_sched_free(root);
  }
}

/* A child's graph edits survive when its parent is traced flat afterwards:
 * the parent inlines the child's stored graph, checkpoint regions
 * included. leaves= without flatten, or naming nothing, is refused. */
static void parent_flatten_keeps_child_edits(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny), *mlp = pt_at(root, "transformer.h.0.mlp");
  OK(slapo_trace(mlp, NULL));
  slapo_pattern *p;
  OK(slapo_pattern_parse("gelu(linear(x, w, b))", &p));
  OK(slapo_checkpoint_subgraph(mlp, p));
  OK(slapo_trace(pt_at(root, "transformer.h.0"), &(slapo_trace_opts){.flatten = true}));
  char *g = pt_capture((pt_print_fn)slapo_graph_print,
                       slapo_module_graph(slapo_sched_module(pt_at(root, "transformer.h.0"))));
  assert_non_null(strstr(g, "call_module mlp.c_fc(%ln_2)  [recompute 1]  # mlp"));
  assert_non_null(strstr(g, "call_module mlp.act(%mlp_c_fc)  [recompute 1]"));
  free(g);
  PT_EXPECT_REFUSED(root, slapo_checkpoint_subgraph(mlp, p), SLAPO_STATE,
                    "checkpoint: transformer.h.0.mlp is inlined");
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  slapo_module *ref = pt_model(&k_tiny);
  pt_result a, b;
  pt_run(ref, in, &a);
  pt_run(slapo_sched_module(root), in, &b);
  pt_expect_bitwise(&a, &b);
  assert_true(b.peak_train < a.peak_train);
  pt_result_free(&a), pt_result_free(&b);
  slapo_module_free(ref);
  pt_inputs_free(in);
  PT_EXPECT_REFUSED(root, slapo_trace(pt_at(root, "transformer.h.1"),
                                      &(slapo_trace_opts){.leaves = "GPT2MLP"}),
                    SLAPO_INVALID_ARG, "leaves= applies with flatten=true");
  PT_EXPECT_REFUSED(root, slapo_trace(pt_at(root, "transformer.h.1"),
                                      &(slapo_trace_opts){.flatten = true, .leaves = "mlp, GPT2Atention"}),
                    SLAPO_INVALID_ARG, "leaves entry 'GPT2Atention' names no module");
  slapo_pattern_free(p);
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(trace_mlp_keeps_children),
      cmocka_unit_test(trace_flatten_block),
      cmocka_unit_test(trace_root_flatten_with_leaves),
      cmocka_unit_test(traced_child_inside_traced_parent),
      cmocka_unit_test(refuses_checkpointed_inline),
      cmocka_unit_test(schedule_file_form),
      cmocka_unit_test(named_tiny_bitwise),
      cmocka_unit_test(parent_flatten_keeps_child_edits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
