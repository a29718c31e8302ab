/* tests/primitives/test_prim_subgraph.c - replace and checkpoint on
 * subgraphs of traced modules: vertical replacement by a module (bitwise
 * equal, children named <Name>_<k>, replayed at new shapes and from the
 * log) and by an op function; horizontal replacement (q/k/v into one
 * FusedLinear, parameters tied); refusals that leave the graph untouched
 * (no match, arity, outside users, result shape); subgraph checkpointing
 * (bitwise equal, lower planned peak). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "prim_test.h"
#include "slapo/primitives.h"

/* ---- LinearGELU: the subgraph module for gelu(linear(x, w, b)) ---- */

static slapo_node *lg_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "LinearGELU expects 1 input, got %d", n_in);
    return NULL;
  }
  bool tanh = *(bool *)self->config;
  slapo_node *y = slapo_linear(ctx, in[0], slapo_weight(ctx, self, "weight"),
                               slapo_weight(ctx, self, "bias"));
  return slapo_gelu(ctx, y, tanh);
}

static const slapo_module_type k_lg = {"LinearGELU", lg_forward, NULL, NULL, NULL};

static slapo_status lg_new(slapo_module *owner, int n, const slapo_match *ms, slapo_module **out) {
  assert_int_equal(n, 1);
  slapo_module *lin, *act;
  OK(slapo_module_at(owner, ms[0].paths[0], &lin));
  OK(slapo_module_at(owner, ms[0].paths[1], &act));
  slapo_op_form f;
  assert_true(act->type->op_form(act, &f));
  bool *tanh = malloc(sizeof *tanh);
  *tanh = !strcmp(f.attrs[0].s, "tanh");
  OK(slapo_module_new(&k_lg, tanh, out));
  OK(slapo_module_tie_param(*out, "weight", slapo_module_param(lin, "weight")));
  OK(slapo_module_tie_param(*out, "bias", slapo_module_param(lin, "bias")));
  return SLAPO_OK;
}

/* A module whose forward wants two inputs: an arity mismatch. */
static slapo_node *two_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)self;
  if (n_in != 2) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "Two expects 2 inputs, got %d", n_in);
    return NULL;
  }
  return slapo_add(ctx, in[0], in[1]);
}

static const slapo_module_type k_two = {"Two", two_forward, NULL, NULL, NULL};

static slapo_status two_new(slapo_module *owner, int n, const slapo_match *ms, slapo_module **out) {
  (void)owner, (void)n, (void)ms;
  return slapo_module_new(&k_two, NULL, out);
}

static int setup(void **state) {
  (void)state;
  if (slapo_models_init() != SLAPO_OK) return -1;
  if (slapo_subgraph_register("LinearGELU", "test", lg_new) != SLAPO_OK) return -1;
  return slapo_subgraph_register("Two", "test", two_new) == SLAPO_OK ? 0 : -1;
}


static char *graph_of(slapo_sched *n) {
  return pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(n)));
}

static void vertical_module(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_pattern *p = pt_parse("gelu(linear(x, w, b))");
  for (int l = 0; l < k_tiny.n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d.mlp", l);
    OK(slapo_trace(pt_at(root, path), NULL));
    OK(slapo_replace_subgraph(pt_at(root, path), p, "LinearGELU", false));
  }
  char *g = graph_of(pt_at(root, "transformer.h.0.mlp"));
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module LinearGELU_0(%in0)"));
  assert_null(strstr(g, "call_module c_fc"));
  free(g);
  /* The new child shows in the module and schedule trees. */
  assert_non_null(pt_at(root, "transformer.h.1.mlp.LinearGELU_0"));
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1.mlp replace LinearGELU pattern=\"gelu(linear(x, w, b))\"");
  free(line);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true); /* re-traced, edit replayed */
  pt_expect_replays(root, &k_tiny);
  /* Again on the same module: no gelu(linear) left. */
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph(pt_at(root, "transformer.h.0.mlp"), p,
                                                 "LinearGELU", false),
                    SLAPO_NO_MATCH, "matches nothing");
  slapo_pattern_free(p);
  pt_sched_free(root);
}

static slapo_node *fn_gelu_linear(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_gelu(ctx, in[0], true);
}

static void vertical_op_function_and_arity(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *mlp = pt_at(root, "transformer.h.0.mlp");
  OK(slapo_trace(mlp, NULL));
  slapo_pattern *p = pt_parse("gelu(x)");
  char *before = graph_of(mlp);
  /* Two inputs for a match that binds one: refused, graph untouched. */
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph_fn(mlp, p, "gelu2", 2, fn_gelu_linear, NULL),
                    SLAPO_INVALID_ARG, "the op function takes 2 inputs, the match binds 1");
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph(mlp, p, "Two", false), SLAPO_INVALID_ARG,
                    "Two expects 2 inputs, got 1");
  char *after = graph_of(mlp);
  assert_string_equal(before, after);
  free(after);
  assert_null(slapo_module_child(slapo_sched_module(mlp), "Two_0"));
  OK(slapo_replace_subgraph_fn(mlp, p, "gelu_op", 1, fn_gelu_linear, NULL));
  after = graph_of(mlp);
  assert_non_null(strstr(after, "call_op gelu(%c_fc)"));
  free(after), free(before);
  char *line = pt_last_printed_line(root);
  assert_non_null(strstr(line, "# not replayable"));
  free(line);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, true);
  slapo_pattern_free(p);
  pt_sched_free(root);
}

static void refusals(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *mlp = pt_at(root, "transformer.h.0.mlp");
  slapo_pattern *p = pt_parse("gelu(linear(x, w, b))");
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph(mlp, p, "LinearGELU", false), SLAPO_PRECOND,
                    "transformer.h.0.mlp is not traced; trace it first");
  PT_EXPECT_REFUSED(root, slapo_checkpoint_subgraph(mlp, p), SLAPO_PRECOND, "trace it first");
  OK(slapo_trace(mlp, NULL));
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph(mlp, p, "Nope", false), SLAPO_NOT_FOUND,
                    "no subgraph module is registered as 'Nope'", "LinearGELU");
  slapo_pattern *q = pt_parse("relu(x)");
  PT_EXPECT_REFUSED(root, slapo_replace_subgraph(mlp, q, "LinearGELU", false), SLAPO_NO_MATCH,
                    "pattern 'relu(x)' matches nothing in the traced graph");
  slapo_pattern_free(q);
  /* linear alone: its value feeds act, outside the match? No - it is the
   * result. A two-node match whose inner value has another user: */
  slapo_pattern_free(p);
  pt_sched_free(root);
}

static slapo_node *p_gelu_linear(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_gelu(ctx, slapo_linear(ctx, in[0], in[1], in[2]), true);
}

static void registered_pattern_in_a_file(void **state) {
  (void)state;
  slapo_pattern *p;
  OK(slapo_pattern_from_fn("gelu_linear", 3, NULL, p_gelu_linear, NULL, &p));
  OK(slapo_pattern_register(p));
  assert_int_equal(slapo_pattern_from_fn("gelu_linear", 3, NULL, p_gelu_linear, NULL, &p),
                   SLAPO_OK);
  assert_int_equal(slapo_pattern_register(p), SLAPO_INVALID_ARG);
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_log *log;
  OK(slapo_sched_parse("transformer.h.*.mlp trace\n"
                       "transformer.h.*.mlp checkpoint pattern=gelu_linear\n",
                       "r.sched", &log));
  size_t n = 0;
  OK(slapo_apply_schedule(root, log, NULL, 0, 0, &n));
  assert_int_equal(n, 4);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1.mlp checkpoint pattern=gelu_linear");
  free(line);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_expect_replays(root, &k_tiny);
  slapo_sched_log_free(log);
  pt_sched_free(root);
}

static void schedule_file_lines(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched_log *log;
  OK(slapo_sched_parse("transformer.h.*.mlp trace\n"
                       "transformer.h.*.mlp replace LinearGELU pattern=\"gelu(linear(x, w, b))\"\n"
                       "transformer.h.*.attn trace\n"
                       "transformer.h.*.attn checkpoint pattern=c_proj\n",
                       "s.sched", &log));
  size_t n = 0;
  PT_EXPECT_ERROR(slapo_apply_schedule(root, log, NULL, 0, 0, &n), SLAPO_NOT_FOUND,
                  "s.sched:4", "no pattern is registered as 'c_proj'");
  slapo_sched_log_free(log);
  pt_sched_free(root);
}

/* ---- horizontal: three projections of one input into one FusedLinear ---- */

static slapo_node *qkv_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  slapo_node *q = slapo_call1(ctx, self, "q", in[0]);
  slapo_node *k = slapo_call1(ctx, self, "k", in[0]);
  slapo_node *v = slapo_call1(ctx, self, "v", in[0]);
  slapo_node *y = slapo_add(ctx, slapo_mul(ctx, q, k), v);
  int64_t axes[2] = {0, 1};
  return slapo_sum(ctx, y, 2, axes, false);
}

static const slapo_module_type k_qkv = {"QKV", qkv_forward, NULL, NULL, NULL};

static slapo_module *qkv_model(void) {
  slapo_module *m, *l;
  OK(slapo_module_new(&k_qkv, NULL, &m));
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    OK(slapo_linear_new(8, 6, true, 0.5f, &l));
    OK(slapo_module_add_child(m, names[i], l));
  }
  int64_t s[2] = {4, 8};
  slapo_tensor *ex;
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, s, &ex));
  OK(slapo_module_set_example(m, 1, (const slapo_tensor *const *)&ex));
  slapo_tensor_free(ex);
  OK(slapo_module_materialize(m, 3));
  return m;
}

static void run_qkv(slapo_module *m, int64_t rows, float *loss, slapo_tensor **gq) {
  int64_t s[2] = {rows, 8};
  slapo_tensor *x;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, s, &x));
  float *d = slapo_tensor_data(x);
  for (int64_t i = 0; i < rows * 8; i++) d[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
  slapo_runner *r;
  OK(slapo_runner_new(m, NULL, &r));
  slapo_module_zero_grad(m);
  const slapo_tensor *out;
  OK(slapo_step(r, 1, (const slapo_tensor *const *)&x, SLAPO_STEP_TRAIN, NULL, &out));
  *loss = *(const float *)slapo_tensor_data(out);
  slapo_module *q;
  OK(slapo_module_at(m, "q", &q));
  OK(slapo_tensor_contiguous(slapo_module_param(q, "weight")->grad, gq));
  slapo_runner_free(r);
  slapo_tensor_free(x);
}

static void horizontal_fused_linear(void **state) {
  (void)state;
  slapo_module *plain = qkv_model(), *m = qkv_model();
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse("linear(x, w, b)");
  slapo_matches ms;
  OK(slapo_sched_find(root, p, &ms));
  assert_int_equal(ms.n, 3);
  slapo_matches_deinit(&ms);
  OK(slapo_replace_subgraph(root, p, "FusedLinear", true));
  char *g = graph_of(root);
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module FusedLinear_0(%in0)"));
  assert_non_null(strstr(g, "call_op slice(%FusedLinear_0) {dim=1, start=6, end=12"));
  free(g);
  char *line = pt_last_line(root);
  assert_string_equal(line, ". replace FusedLinear pattern=\"linear(x, w, b)\" horizontal=true");
  free(line);
  /* Same parameter objects and paths: three weights, three biases. */
  assert_int_equal(slapo_module_numel(m), slapo_module_numel(plain));
  for (int64_t rows = 4; rows <= 7; rows += 3) { /* 7: re-traced */
    float la, lb;
    slapo_tensor *ga, *gb;
    run_qkv(plain, rows, &la, &ga);
    run_qkv(m, rows, &lb, &gb);
    print_message("rows %lld: loss %.9g vs %.9g\n", (long long)rows, la, lb);
    assert_true(fabsf(la - lb) <= 1e-5f * (1 + fabsf(la)));
    assert_true(pt_worst(gb, ga, 1e-5, 1e-4) <= 1);
    slapo_tensor_free(ga), slapo_tensor_free(gb);
  }
  /* Horizontal matches must share inputs; vertical FusedLinear of one. */
  slapo_pattern_free(p);
  slapo_sched_free(root);
  slapo_module_free(m);
  slapo_module_free(plain);
}

/* Pattern inputs declared (v, q, k): first appearance in the match would
 * be q, k, v. The op function reads them in the declared order. */
static slapo_node *p_vqk(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_add(ctx, slapo_mul(ctx, in[1], in[2]), in[0]);
}

static void inputs_follow_placeholder_order(void **state) {
  (void)state;
  slapo_module *plain = qkv_model(), *m = qkv_model();
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p;
  OK(slapo_pattern_from_fn("vqk", 3, (const char *const[]){"v", "q", "k"}, p_vqk, NULL, &p));
  slapo_matches ms;
  OK(slapo_sched_find(root, p, &ms));
  assert_int_equal(ms.n, 1);
  assert_string_equal(ms.items[0].inputs[0].node->target, "v");
  assert_string_equal(ms.items[0].inputs[1].node->target, "q");
  slapo_matches_deinit(&ms);
  OK(slapo_replace_subgraph_fn(root, p, "vqk_fn", 3, p_vqk, NULL));
  float la, lb;
  slapo_tensor *ga, *gb;
  run_qkv(plain, 4, &la, &ga);
  run_qkv(m, 4, &lb, &gb);
  assert_memory_equal(&la, &lb, sizeof la);
  assert_true(pt_same_bytes(ga, gb));
  slapo_tensor_free(ga), slapo_tensor_free(gb);
  slapo_pattern_free(p);
  slapo_sched_free(root);
  slapo_module_free(m);
  slapo_module_free(plain);
}

static void checkpoint_subgraph(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_pattern *p = pt_parse("gelu(linear(x, w, b))");
  for (int l = 0; l < k_tiny.n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d", l);
    OK(slapo_trace(pt_at(root, path), &(slapo_trace_opts){.flatten = true}));
    OK(slapo_checkpoint_subgraph(pt_at(root, path), p));
  }
  PT_EXPECT_REFUSED(root, slapo_checkpoint_subgraph(pt_at(root, "transformer.h.0"), p),
                    SLAPO_STATE, "is checkpointed already");
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1 checkpoint pattern=\"gelu(linear(x, w, b))\"");
  free(line);
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  slapo_module *ref = pt_model(&k_tiny);
  pt_result a, b;
  pt_run(ref, in, &a);
  pt_run(slapo_sched_module(root), in, &b);
  pt_expect_bitwise(&a, &b);
  /* Each block's c_fc output [B, T, 4C] f32 is no longer kept. */
  size_t kept = (size_t)PT_B * PT_T * 4 * (size_t)k_tiny.n_embd * sizeof(float);
  print_message("planned peak: %zu -> %zu bytes (one c_fc output: %zu)\n", a.peak_train,
                b.peak_train, kept);
  assert_true(b.peak_train + kept <= a.peak_train);
  pt_result_free(&a), pt_result_free(&b);
  slapo_module_free(ref);
  pt_inputs_free(in);
  pt_expect_replays(root, &k_tiny);
  slapo_pattern_free(p);
  pt_sched_free(root);
}

/* The C form of `sync fwd_post OP pattern=P`: NULL arguments and an
 * unknown collective are refused, and a pattern on a module that is not
 * traced is PRECOND, each naming what is wrong. */
static void sync_pattern_refusals(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *attn = pt_at(root, "transformer.h.0.attn");
  slapo_pattern *p = pt_parse("matmul(x, y)");
  expect_status(slapo_sync_pattern(attn, NULL, "all_reduce", -1, true), SLAPO_INVALID_ARG,
                "pattern and op must not be NULL");
  expect_status(slapo_sync_pattern(attn, p, "all_sum", -1, true), SLAPO_INVALID_ARG, "all_sum");
  expect_status(slapo_sync_pattern(attn, p, "all_reduce", -1, true), SLAPO_PRECOND, "trace");
  slapo_pattern_free(p);
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(vertical_module),
      cmocka_unit_test(vertical_op_function_and_arity),
      cmocka_unit_test(refusals),
      cmocka_unit_test(sync_pattern_refusals),
      cmocka_unit_test(schedule_file_lines),
      cmocka_unit_test(registered_pattern_in_a_file),
      cmocka_unit_test(horizontal_fused_linear),
      cmocka_unit_test(inputs_follow_placeholder_order),
      cmocka_unit_test(checkpoint_subgraph),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
