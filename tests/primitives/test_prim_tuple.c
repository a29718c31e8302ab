/* tests/primitives/test_prim_tuple.c - modules that return several values
 * (slapo_tuple / slapo_getitem): a toy model whose child `p1` returns two
 * values that are both used and whose child `p2` returns two values of
 * which the caller takes one. Checked against the same model written with
 * one-value modules (bitwise): eager, traced (plain, flattened, root),
 * replaced by a tuple-returning module, checkpointed, subgraph-replaced
 * (vertical by a tuple module; horizontal as the original system's
 * `(x, x)` case), fused with cc and none, and verified from a schedule
 * file; the unused value costs no node; and the errors a caller gets for
 * using a tuple as one value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "prim_test.h"
#include "slapo/apply.h"
#include "slapo/primitives.h"

enum { D = 8, NB = 4 };

/* ---- Pair: h = lin(x); (gelu(h), h * sigmoid(h)) ---- */

typedef enum pair_mode { PAIR_TUPLE, PAIR_SUM, PAIR_FIRST } pair_mode;

static slapo_node *pair_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  (void)n_in;
  pair_mode mode = *(pair_mode *)self->config;
  slapo_node *h = slapo_call1(ctx, self, "lin", in[0]);
  slapo_node *u = slapo_gelu(ctx, h, true);
  if (mode == PAIR_FIRST) return u;
  slapo_node *v = slapo_mul(ctx, h, slapo_sigmoid(ctx, h));
  if (mode == PAIR_SUM) return slapo_add(ctx, u, v);
  return slapo_tuple(ctx, 2, (slapo_node *[]){u, v});
}

static const slapo_module_type k_pair = {"Pair", pair_forward, NULL, NULL, NULL};

static slapo_module *pair_new(pair_mode mode) {
  pair_mode *cfg = malloc(sizeof *cfg);
  *cfg = mode;
  slapo_module *m, *lin;
  OK(slapo_module_new(&k_pair, cfg, &m));
  OK(slapo_linear_new(D, D, true, 0.5f, &lin));
  OK(slapo_module_add_child(m, "lin", lin));
  return m;
}

/* ---- PairNet: y = sum of p1's pair; z = p2's first; head(z); MSE ---- */

static slapo_node *net_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  bool tuple = *(bool *)self->config;
  slapo_node *a = slapo_call1(ctx, self, "p1", in[0]);
  slapo_node *y = tuple ? slapo_add(ctx, slapo_getitem(ctx, a, 0), slapo_getitem(ctx, a, 1)) : a;
  slapo_node *c = slapo_call1(ctx, self, "p2", y);
  slapo_node *z = tuple ? slapo_getitem(ctx, c, 0) : c;
  slapo_node *logits = slapo_call1(ctx, self, "head", z);
  if (n_in == 1) return logits;
  slapo_node *d = slapo_sub(ctx, logits, in[1]);
  return slapo_mean(ctx, slapo_mul(ctx, d, d), 2, (int64_t[]){0, 1}, false);
}

static const slapo_module_type k_net = {"PairNet", net_forward, NULL, NULL, NULL};

/* m materialized, with example inputs x, target [2, D] f32 for `trace`. */
static slapo_module *materialized(slapo_module *m) {
  OK(slapo_module_materialize(m, PT_SEED));
  slapo_tensor *ex[2];
  for (int i = 0; i < 2; i++) OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, (int64_t[]){2, D}, &ex[i]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  for (int i = 0; i < 2; i++) slapo_tensor_free(ex[i]);
  return m;
}

/* The model: with tuples, or the same computation with one-value modules
 * (p1 adds its pair itself, p2 returns its first value). Same parameter
 * paths and values either way. */
static slapo_module *net_new(bool tuple) {
  bool *cfg = malloc(sizeof *cfg);
  *cfg = tuple;
  slapo_module *m, *head;
  OK(slapo_module_new(&k_net, cfg, &m));
  OK(slapo_module_add_child(m, "p1", pair_new(tuple ? PAIR_TUPLE : PAIR_SUM)));
  OK(slapo_module_add_child(m, "p2", pair_new(tuple ? PAIR_TUPLE : PAIR_FIRST)));
  OK(slapo_linear_new(D, D, true, 0.5f, &head));
  OK(slapo_module_add_child(m, "head", head));
  return materialized(m);
}

static slapo_sched *net_sched(bool tuple) {
  slapo_sched *root;
  OK(slapo_sched_create(net_new(tuple), &root));
  return root;
}

/* x, target [NB, D] f32. */
static void net_inputs(slapo_tensor *in[2]) {
  for (int j = 0; j < 2; j++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){NB, D}, &in[j]));
    float *d = slapo_tensor_data(in[j]); /* [NB, D] */
    for (int i = 0; i < NB * D; i++) d[i] = (float)((i * 7 + j * 3) % 11) / 5.0f - 1.0f;
  }
}

/* Runs m (eval: x; train: x, target) into r. */
static void net_run(slapo_module *m, pt_result *r) {
  slapo_tensor *in[2];
  net_inputs(in);
  pt_run(m, in, r);
  pt_inputs_free(in);
}

/* The one-value model's results. */
static void reference(pt_result *r) {
  slapo_module *ref = net_new(false);
  net_run(ref, r);
  memset(r->params, 0, sizeof r->params);
  slapo_module_free(ref);
}

static void expect_like_reference(slapo_module *m, bool bitwise) {
  pt_result a, b;
  reference(&a);
  net_run(m, &b);
  if (bitwise) pt_expect_bitwise(&b, &a);
  else pt_expect_close(&b, &a, 1e-5, 1e-4);
  pt_result_free(&a);
  pt_result_free(&b);
}

/* Op nodes in a train step graph of m whose op name is `op`, or with
 * `prefix`, starts with it (fused ops are named after their module); a
 * step graph never holds a tuple. */
static int step_count_of(slapo_module *m, const char *op, bool prefix) {
  slapo_tensor *in[2];
  net_inputs(in);
  slapo_runner *r;
  OK(slapo_runner_new(m, NULL, &r));
  slapo_kernel_env env = {.seed = 1, .step = 0, .training = true};
  OK(slapo_step(r, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, NULL));
  int n = 0;
  for (const slapo_node *x = slapo_graph_first(slapo_runner_graph(r)); x; x = x->next) {
    assert_int_not_equal(x->kind, SLAPO_NODE_TUPLE);
    n += x->kind == SLAPO_NODE_CALL_OP &&
         (prefix ? !strncmp(x->target, op, strlen(op)) : !strcmp(x->target, op));
  }
  slapo_runner_free(r);
  pt_inputs_free(in);
  return n;
}

static int step_count(slapo_module *m, const char *op) { return step_count_of(m, op, false); }

static char *graph_of(slapo_sched *n) {
  return pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(n)));
}

/* ---- eager ---- */

static void eager_matches_one_value_model(void **state) {
  (void)state;
  slapo_module *m = net_new(true);
  expect_like_reference(m, true);
  /* p2's second value is never taken: no sigmoid (nor its gradient) for
   * it; p1's both are. The one-value model has the same count. */
  slapo_module *ref = net_new(false);
  assert_int_equal(step_count(m, "sigmoid"), 1);
  assert_int_equal(step_count(m, "sigmoid"), step_count(ref, "sigmoid"));
  assert_int_equal(step_count(m, "mul"), step_count(ref, "mul"));
  slapo_module_free(ref);
  slapo_module_free(m);
}

/* ---- misuse ---- */

static slapo_node *misuse_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  (void)n_in;
  int how = *(int *)self->config;
  slapo_node *a = slapo_call1(ctx, self, "p1", in[0]);
  switch (how) {
  case 0: return slapo_relu(ctx, a);                       /* tuple into an op      */
  case 1: return slapo_call1(ctx, self, "p2", a);          /* tuple into a module   */
  case 2: return slapo_getitem(ctx, a, 2);                 /* item out of range     */
  case 3: return slapo_getitem(ctx, slapo_getitem(ctx, a, 0), 0); /* value as tuple */
  default: return a;                                       /* root returns a tuple  */
  }
}

static const slapo_module_type k_misuse = {"Misuse", misuse_forward, NULL, NULL, NULL};

static void misuse_errors(void **state) {
  (void)state;
  const char *want[][3] = {
      {"relu: input 0 (%tuple) is a tuple of 2 values (returned by p1)", "slapo_getitem", ""},
      {"call of p2: input 0 (%tuple) is a tuple of 2 values (returned by p1)", "slapo_getitem",
       ""},
      {"getitem(%tuple, 2): the tuple holds 2 values (returned by p1); items are 0..1", "", ""},
      {"getitem(%gelu, 0): %gelu (gelu from p1) is one value, not a tuple", "", ""},
      {"the Misuse forward returned a tuple of 2 values", "return the item it needs", ""},
  };
  for (int how = 0; how < 5; how++) {
    int *cfg = malloc(sizeof *cfg);
    *cfg = how;
    slapo_module *m;
    OK(slapo_module_new(&k_misuse, cfg, &m));
    OK(slapo_module_add_child(m, "p1", pair_new(PAIR_TUPLE)));
    OK(slapo_module_add_child(m, "p2", pair_new(PAIR_TUPLE)));
    OK(slapo_module_materialize(m, 1));
    slapo_tensor *in[2];
    net_inputs(in);
    slapo_runner *r;
    OK(slapo_runner_new(m, NULL, &r));
    slapo_kernel_env env = {.seed = 1};
    slapo_status s = slapo_step(r, 1, (const slapo_tensor *const *)in, SLAPO_STEP_EVAL, &env, NULL);
    print_message("case %d: %s\n", how, slapo_last_error());
    assert_int_equal(s, SLAPO_INVALID_ARG);
    for (int k = 0; k < 3 && want[how][k][0]; k++)
      assert_non_null(strstr(slapo_last_error(), want[how][k]));
    slapo_runner_free(r);
    pt_inputs_free(in);
    slapo_module_free(m);
  }
}

/* ---- trace ---- */

static void traced_child_and_root(void **state) {
  (void)state;
  /* The child traced plainly (lin stays a call), then flattened. */
  for (int flatten = 0; flatten < 2; flatten++) {
    slapo_sched *root = net_sched(true);
    slapo_trace_opts o = {.flatten = flatten};
    OK(slapo_trace(pt_at(root, "p1"), &o));
    OK(slapo_trace(pt_at(root, "p2"), &o));
    char *g = graph_of(pt_at(root, "p2"));
    print_message("%s", g);
    assert_non_null(strstr(g, "output(%gelu, %mul)"));
    free(g);
    expect_like_reference(slapo_sched_module(root), true);
    pt_sched_free(root);
  }
  /* The root traced without flatten: p1 and p2 are multi-result calls read
   * through getitem; p2's unused value has no getitem. */
  slapo_sched *root = net_sched(true);
  OK(slapo_trace(root, NULL));
  char *g = graph_of(root);
  print_message("%s", g);
  assert_non_null(strstr(g, "%p1 : (2) = call_module p1(%in0)"));
  assert_non_null(strstr(g, "getitem(%p1, 0)"));
  assert_non_null(strstr(g, "getitem(%p1, 1)"));
  assert_non_null(strstr(g, "getitem(%p2, 0)"));
  assert_null(strstr(g, "getitem(%p2, 1)"));
  free(g);
  expect_like_reference(slapo_sched_module(root), true);
  assert_int_equal(step_count(slapo_sched_module(root), "sigmoid"), 1);
  pt_sched_free(root);
  /* And flattened: everything inlined. */
  root = net_sched(true);
  OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
  expect_like_reference(slapo_sched_module(root), true);
  pt_sched_free(root);
}

/* ---- replace (module) and checkpoint ---- */

/* A module built from a Pair (its own Linear, tied to the Pair's, so the
 * parameter paths stay): the tuple-returning replacement. */
static slapo_node *pair2_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  (void)n_in;
  slapo_node *h = slapo_call1(ctx, self, "lin", in[0]);
  slapo_node *u = slapo_gelu(ctx, h, true);
  slapo_node *v = slapo_mul(ctx, h, slapo_sigmoid(ctx, h));
  return slapo_tuple(ctx, 2, (slapo_node *[]){u, v});
}

static const slapo_module_type k_pair2 = {"PairOneModule", pair2_forward, NULL, NULL, NULL};

static slapo_status pair2_new(const slapo_module *old, slapo_module **out) {
  slapo_module *old_lin = slapo_module_child(old, "lin"), *lin;
  if (!old_lin) return slapo_error(SLAPO_INVALID_ARG, "PairOneModule replaces a Pair");
  OK(slapo_module_new(&k_pair2, NULL, out));
  OK(slapo_linear_new(D, D, true, 0.5f, &lin));
  OK(slapo_module_tie_param(lin, "weight", slapo_module_param(old_lin, "weight")));
  OK(slapo_module_tie_param(lin, "bias", slapo_module_param(old_lin, "bias")));
  OK(slapo_module_add_child(*out, "lin", lin));
  return SLAPO_OK;
}

static void replaced_and_checkpointed(void **state) {
  (void)state;
  slapo_sched *root = net_sched(true);
  OK(slapo_replace(pt_at(root, "p1"), "PairOneModule"));
  OK(slapo_replace(pt_at(root, "p2"), "PairOneModule"));
  expect_like_reference(slapo_sched_module(root), true);
  OK(slapo_checkpoint(pt_at(root, "p1"), 1.0));
  OK(slapo_checkpoint(pt_at(root, "p2"), 1.0));
  expect_like_reference(slapo_sched_module(root), true);
  pt_sched_free(root);
  /* A traced tuple module checkpointed as a whole, and a subgraph of it
   * with two results. */
  root = net_sched(true);
  OK(slapo_trace(pt_at(root, "p1"), NULL));
  OK(slapo_checkpoint(pt_at(root, "p1"), 1.0));
  OK(slapo_trace(pt_at(root, "p2"), NULL));
  slapo_pattern *p = pt_parse("(gelu(x), mul(x, sigmoid(x)))");
  OK(slapo_checkpoint_subgraph(pt_at(root, "p2"), p));
  slapo_pattern_free(p);
  expect_like_reference(slapo_sched_module(root), true);
  pt_sched_free(root);
}

/* ---- subgraph replace ---- */

/* PairAct(h) = (gelu(h), h * sigmoid(h)): a match's two results as a tuple;
 * PairActBad returns three values. */
static slapo_node *act_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  slapo_node *u = slapo_gelu(ctx, in[0], true);
  slapo_node *v = slapo_mul(ctx, in[0], slapo_sigmoid(ctx, in[0]));
  bool bad = self->config != NULL;
  return slapo_tuple(ctx, bad ? 3 : 2, (slapo_node *[]){u, v, u});
}

static const slapo_module_type k_act = {"PairAct", act_forward, NULL, NULL, NULL};

static slapo_status act_new(slapo_module *owner, int n, const slapo_match *ms, slapo_module **out) {
  (void)owner, (void)n, (void)ms;
  return slapo_module_new(&k_act, NULL, out);
}

static slapo_status act_bad_new(slapo_module *owner, int n, const slapo_match *ms,
                                slapo_module **out) {
  (void)owner, (void)n, (void)ms;
  return slapo_module_new(&k_act, calloc(1, 1), out);
}

static slapo_node *act_fn(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  slapo_node *u = slapo_gelu(ctx, in[0], true);
  return slapo_tuple(ctx, 2, (slapo_node *[]){u, slapo_mul(ctx, in[0], slapo_sigmoid(ctx, in[0]))});
}

static const char *const k_pair_pattern = "(gelu(x), mul(x, sigmoid(x)))";

static void subgraph_replaced_by_tuples(void **state) {
  (void)state;
  slapo_pattern *p = pt_parse(k_pair_pattern);
  /* By a module: a multi-result call read by getitem, replayed at new
   * shapes and from the log. */
  slapo_sched *root = net_sched(true);
  for (int i = 1; i <= 2; i++) {
    char path[8];
    snprintf(path, sizeof path, "p%d", i);
    OK(slapo_trace(pt_at(root, path), NULL));
    /* find: one match of the region, its two results in pattern order. */
    slapo_matches ms = {0};
    OK(slapo_sched_find(pt_at(root, path), p, &ms));
    assert_int_equal(ms.n, 1);
    assert_int_equal(ms.items[0].n_outputs, 2);
    assert_string_equal(ms.items[0].outputs[0]->target, "gelu");
    assert_string_equal(ms.items[0].outputs[1]->target, "mul");
    assert_true(ms.items[0].replaceable);
    slapo_matches_deinit(&ms);
    OK(slapo_replace_subgraph(pt_at(root, path), p, "PairAct", false));
  }
  char *g = graph_of(pt_at(root, "p2"));
  print_message("%s", g);
  assert_non_null(strstr(g, "%PairAct_0 : (2) = call_module PairAct_0(%lin)"));
  assert_non_null(strstr(g, "output(%getitem, %getitem_1)"));
  free(g);
  expect_like_reference(slapo_sched_module(root), true);
  char *line = pt_last_line(root);
  assert_string_equal(line, "p2 replace PairAct pattern=\"(gelu(x), mul(x, sigmoid(x)))\"");
  free(line);
  /* A tuple of the wrong size is refused before anything changes. */
  slapo_sched *r2 = net_sched(true);
  OK(slapo_trace(pt_at(r2, "p1"), NULL));
  PT_EXPECT_REFUSED(r2, slapo_replace_subgraph(pt_at(r2, "p1"), p, "PairActBad", false),
                    SLAPO_SHAPE, "returns a tuple of 3 values where the match gives 2 results");
  /* By an op function returning a tuple. */
  OK(slapo_replace_subgraph_fn(pt_at(r2, "p1"), p, "act", 1, act_fn, NULL));
  g = graph_of(pt_at(r2, "p1"));
  assert_null(strstr(g, "tuple"));
  free(g);
  expect_like_reference(slapo_sched_module(r2), true);
  pt_sched_free(r2);
  pt_sched_free(root);
  slapo_pattern_free(p);
}

/* ---- the original system's horizontal replacement ---- */

/* TwinNet: gelu(fc1(x)) + gelu(fc2(x)); the two branches share x. */
static slapo_node *twin_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  slapo_node *a = slapo_gelu(ctx, slapo_call1(ctx, self, "fc1", in[0]), true);
  slapo_node *b = slapo_gelu(ctx, slapo_call1(ctx, self, "fc2", in[0]), true);
  slapo_node *z = slapo_add(ctx, a, slapo_mul_scalar(ctx, b, 0.5));
  if (n_in == 1) return z;
  slapo_node *d = slapo_sub(ctx, z, in[1]);
  return slapo_mean(ctx, slapo_mul(ctx, d, d), 2, (int64_t[]){0, 1}, false);
}

static const slapo_module_type k_twin = {"TwinNet", twin_forward, NULL, NULL, NULL};

static slapo_module *twin_new(void) {
  slapo_module *m, *fc;
  OK(slapo_module_new(&k_twin, NULL, &m));
  for (int i = 1; i <= 2; i++) {
    char name[8];
    snprintf(name, sizeof name, "fc%d", i);
    OK(slapo_linear_new(D, D, true, 0.5f, &fc));
    OK(slapo_module_add_child(m, name, fc));
  }
  return materialized(m);
}

/* BothBranches: (gelu(a(x)), gelu(b(x))) with a, b tied to the matched
 * Linears: one value per match. */
static slapo_node *both_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  (void)n_in;
  slapo_node *a = slapo_gelu(ctx, slapo_call1(ctx, self, "a", in[0]), true);
  slapo_node *b = slapo_gelu(ctx, slapo_call1(ctx, self, "b", in[0]), true);
  return slapo_tuple(ctx, 2, (slapo_node *[]){a, b});
}

static const slapo_module_type k_both = {"BothBranches", both_forward, NULL, NULL, NULL};

static slapo_status both_new(slapo_module *owner, int n, const slapo_match *ms,
                             slapo_module **out) {
  assert_int_equal(n, 2);
  OK(slapo_module_new(&k_both, NULL, out));
  for (int i = 0; i < 2; i++) {
    slapo_module *old, *lin;
    OK(slapo_module_at(owner, ms[i].paths[0], &old));
    OK(slapo_linear_new(D, D, true, 0.5f, &lin));
    OK(slapo_module_tie_param(lin, "weight", slapo_module_param(old, "weight")));
    OK(slapo_module_tie_param(lin, "bias", slapo_module_param(old, "bias")));
    OK(slapo_module_add_child(*out, i ? "b" : "a", lin));
  }
  return SLAPO_OK;
}

static void horizontal_tuple(void **state) {
  (void)state;
  slapo_sched *root;
  OK(slapo_sched_create(twin_new(), &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse("gelu(mod('fc1|fc2')(x))");
  OK(slapo_replace_subgraph(root, p, "BothBranches", true));
  slapo_pattern_free(p);
  /* One child, read by exactly two getitem nodes (the original's test). */
  char *g = graph_of(root);
  print_message("%s", g);
  assert_non_null(strstr(g, "%BothBranches_0 : (2) = call_module BothBranches_0(%in0)"));
  int getitems = 0;
  for (const char *q = g; (q = strstr(q, "getitem(%BothBranches_0, ")); q++) getitems++;
  assert_int_equal(getitems, 2);
  free(g);
  pt_result a, b;
  slapo_module *ref = twin_new();
  net_run(ref, &a);
  net_run(slapo_sched_module(root), &b);
  pt_expect_bitwise(&b, &a);
  pt_result_free(&a);
  pt_result_free(&b);
  slapo_module_free(ref);
  pt_sched_free(root);
}

/* ---- fuse ---- */

static void fused_cc_and_none(void **state) {
  (void)state;
  const char *compilers[2] = {"none", "cc"};
  for (int c = 0; c < 2; c++) {
    slapo_sched *root = net_sched(true);
    slapo_pattern *p = pt_parse(k_pair_pattern);
    for (int i = 1; i <= 2; i++) {
      char path[8];
      snprintf(path, sizeof path, "p%d", i);
      OK(slapo_trace(pt_at(root, path), NULL));
      OK(slapo_fuse(pt_at(root, path), p, compilers[c], "FusedPair", NULL, false));
    }
    slapo_pattern_free(p);
    char *g = graph_of(pt_at(root, "p2"));
    print_message("%s: %s", compilers[c], g);
    assert_non_null(strstr(g, "%FusedPair_0 : (2) = call_module FusedPair_0(%lin)"));
    free(g);
    /* none re-emits the ops: bitwise; cc within the fused tolerance. */
    expect_like_reference(slapo_sched_module(root), c == 0);
    if (c == 1) {
      /* One op per used value: p1's two, p2's first; p2's second (unused)
       * is not in the step at all, nor is its backward. */
      int n = step_count_of(slapo_sched_module(root), "FusedPair", true);
      print_message("fused op nodes in the train step: %d\n", n);
      assert_int_equal(n, 3 * 2); /* three forwards, three backwards */
    }
    pt_sched_free(root);
  }
}

/* ---- verify, from a schedule file ---- */

static slapo_status build_net(void *ud, slapo_module **out) {
  (void)ud;
  *out = net_new(true);
  return SLAPO_OK;
}

static void verified_schedule(void **state) {
  (void)state;
  const char *text = "p1 trace\n"
                     "p1 fuse pattern=\"(gelu(x), mul(x, sigmoid(x)))\" name=FusedPair compiler=cc\n"
                     "p2 trace\n"
                     "p2 replace PairAct pattern=\"(gelu(x), mul(x, sigmoid(x)))\"\n"
                     "p2 checkpoint\n"
                     ". trace\n";
  slapo_sched_log *log;
  OK(slapo_sched_parse(text, "tuple.sched", &log));
  slapo_tensor *in[2];
  net_inputs(in);
  slapo_verify_opts o = {.n_in = 2, .in = (const slapo_tensor *const *)in, .seed = 5, .step = 1,
                         .per_entry = true};
  size_t bad = 99;
  OK(slapo_verify(build_net, NULL, log, &o, NULL, NULL, &bad));
  assert_int_equal(bad, 0);
  slapo_sched_log_free(log);
  pt_inputs_free(in);
}

static int setup(void **state) {
  (void)state;
  if (slapo_models_init() != SLAPO_OK) return -1;
  if (slapo_subgraph_register("PairAct", "test: (gelu(h), h * sigmoid(h))", act_new) != SLAPO_OK ||
      slapo_subgraph_register("PairActBad", "test: three values", act_bad_new) != SLAPO_OK ||
      slapo_subgraph_register("BothBranches", "test: one value per branch", both_new) != SLAPO_OK)
    return -1;
  return slapo_module_register("PairOneModule", "test: a Pair as one module", pair2_new) ==
                 SLAPO_OK
             ? 0
             : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(eager_matches_one_value_model),
      cmocka_unit_test(misuse_errors),
      cmocka_unit_test(traced_child_and_root),
      cmocka_unit_test(replaced_and_checkpointed),
      cmocka_unit_test(subgraph_replaced_by_tuples),
      cmocka_unit_test(horizontal_tuple),
      cmocka_unit_test(fused_cc_and_none),
      cmocka_unit_test(verified_schedule),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
