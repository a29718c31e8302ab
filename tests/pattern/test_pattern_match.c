/* tests/pattern/test_pattern_match.c - the dataflow matcher behind `find`:
 * one test per behaviour (regex, pattern functions, interleaving, order,
 * several inputs, repeated placeholders, commutativity, diamonds, several
 * results, op ~ module forms, module patterns, literals, attributes,
 * overlap, outside users, untraced modules, debug reasons). Toy modules
 * build exactly the dataflow each case needs; GPT-2 covers real graphs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "common/check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/models.h"
#include "slapo/pattern.h"


/* ---- a toy module: forward number `which` over inputs x, y [2, 4] ---- */

typedef struct toy_cfg {
  int which;
} toy_cfg;

static slapo_node *toy_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  slapo_node *x = in[0], *y = in[1];
  switch (((toy_cfg *)self->config)->which) {
  case 0: { /* add(relu(x), x) with unrelated nodes in between */
    slapo_node *r = slapo_relu(ctx, x);
    slapo_node *u = slapo_exp(ctx, y);
    slapo_node *v = slapo_tanh(ctx, u);
    return slapo_add(ctx, slapo_add(ctx, r, x), v);
  }
  case 1: /* add(x, relu(x)): operands swapped */
    return slapo_add(ctx, x, slapo_relu(ctx, x));
  case 2: /* add(relu(x), y): a different second operand */
    return slapo_add(ctx, slapo_relu(ctx, x), y);
  case 3: /* sub(x, relu(x)) and sub(relu(y), y) */
    return slapo_add(ctx, slapo_sub(ctx, x, slapo_relu(ctx, x)),
                     slapo_sub(ctx, slapo_relu(ctx, y), y));
  case 4: { /* the diamond: a = fc1(x) + fc2(y); a*5 unused-ish; a*2 + a*3 */
    slapo_node *h1 = slapo_call1(ctx, self, "fc1", x);
    slapo_node *a = slapo_add(ctx, h1, slapo_call1(ctx, self, "fc2", y));
    slapo_node *b1 = slapo_mul_scalar(ctx, a, 5);
    slapo_node *c1 = slapo_mul_scalar(ctx, a, 2);
    slapo_node *c2 = slapo_mul_scalar(ctx, a, 3);
    return slapo_add(ctx, slapo_add(ctx, c1, c2), b1);
  }
  case 5: { /* mul(add(x, y), sub(x, y)), the sub built first */
    slapo_node *s = slapo_sub(ctx, x, y);
    slapo_node *a = slapo_add(ctx, x, y);
    return slapo_mul(ctx, a, s);
  }
  case 6: { /* relu(fc1(x)) through the ReLU module, gelu(fc2(y)) tanh */
    slapo_node *a = slapo_call1(ctx, self, "act", slapo_call1(ctx, self, "fc1", x));
    slapo_node *b = slapo_gelu(ctx, slapo_call1(ctx, self, "fc2", y), true);
    return slapo_add(ctx, a, b);
  }
  case 7: { /* literals: relu(x) + 1 (add_scalar) and relu(y) + full(1) */
    int64_t s[2] = {2, 4};
    slapo_node *a = slapo_add_scalar(ctx, slapo_relu(ctx, x), 1);
    slapo_node *ry = slapo_relu(ctx, y);
    slapo_node *b = slapo_add(ctx, ry, slapo_full(ctx, 2, s, 1.0));
    slapo_node *c = slapo_add_scalar(ctx, slapo_relu(ctx, a), 2);
    return slapo_add(ctx, slapo_add(ctx, a, b), c);
  }
  case 8: /* relu(relu(relu(x))) */
    return slapo_relu(ctx, slapo_relu(ctx, slapo_relu(ctx, x)));
  case 9: { /* gelu(fc1(x)) whose fc1 output is also used outside */
    slapo_node *h = slapo_call1(ctx, self, "fc1", x);
    return slapo_add(ctx, slapo_gelu(ctx, h, false), h);
  }
  default: /* relu(x) and gelu(x): two results of one input */
    return slapo_add(ctx, slapo_relu(ctx, x), slapo_gelu(ctx, x, false));
  }
}

static const slapo_module_type k_toy = {"Toy", toy_forward, NULL, NULL, NULL};

/* A traced toy root (meta weights: find needs no values). */
static slapo_module *toy(int which) {
  toy_cfg *c = malloc(sizeof *c);
  c->which = which;
  slapo_module *m, *l;
  OK(slapo_module_new(&k_toy, c, &m));
  OK(slapo_linear_new(4, 4, true, 0.02f, &l));
  OK(slapo_module_add_child(m, "fc1", l));
  OK(slapo_linear_new(4, 4, true, 0.02f, &l));
  OK(slapo_module_add_child(m, "fc2", l));
  OK(slapo_relu_new(&l));
  OK(slapo_module_add_child(m, "act", l));
  int64_t s[2] = {2, 4};
  slapo_tensor *ex[2];
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, s, &ex[0]));
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, s, &ex[1]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  slapo_tensor_free(ex[0]);
  slapo_tensor_free(ex[1]);
  OK(slapo_module_trace(m, NULL));
  return m;
}

/* Matches of `p` in m, each printed as "target target ..." (graph order)
 * joined by " | ". */
static char *found(slapo_module *m, const slapo_pattern *p, slapo_matches *ms) {
  OK(slapo_find(m, p, ms));
  char *buf = calloc(1, 4096);
  for (int i = 0; i < ms->n; i++) {
    if (i) strcat(buf, " | ");
    for (int j = 0; j < ms->items[i].n_nodes; j++) {
      const slapo_node *n = ms->items[i].nodes[j];
      if (j) strcat(buf, " ");
      strcat(buf, n->kind == SLAPO_NODE_CALL_MODULE ? n->target : n->target);
    }
  }
  return buf;
}

static void expect_found(slapo_module *m, const slapo_pattern *p, const char *want) {
  slapo_matches ms;
  char *got = found(m, p, &ms);
  print_message("%s: %s\n", slapo_pattern_name(p), got);
  assert_string_equal(got, want);
  free(got);
  slapo_matches_deinit(&ms);
}

/* ---- pattern functions ---- */

static slapo_node *p_add_relu_x(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_add(ctx, slapo_relu(ctx, in[0]), in[0]);
}

static slapo_node *p_sub_relu_x(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_sub(ctx, slapo_relu(ctx, in[0]), in[0]);
}

static slapo_pattern *fn_pattern(const char *name, int n, slapo_pattern_fn fn) {
  slapo_pattern *p;
  OK(slapo_pattern_from_fn(name, n, NULL, fn, NULL, &p));
  return p;
}

static void interleaved_unrelated_nodes(void **state) {
  (void)state;
  slapo_module *m = toy(0);
  slapo_pattern *p = fn_pattern("add_relu_x", 1, p_add_relu_x);
  expect_found(m, p, "relu add");
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.items[0].n_inputs, 1);
  assert_string_equal(ms.items[0].inputs[0].node->target, "in0");
  assert_true(ms.items[0].replaceable);
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void commutative_operands_either_order(void **state) {
  (void)state;
  slapo_module *m = toy(1);
  slapo_pattern *p = fn_pattern("add_relu_x", 1, p_add_relu_x);
  expect_found(m, p, "relu add");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void placeholder_binds_one_value(void **state) {
  (void)state;
  slapo_module *m = toy(2);
  slapo_pattern *p = fn_pattern("add_relu_x", 1, p_add_relu_x);
  expect_found(m, p, "");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void non_commutative_never_swapped(void **state) {
  (void)state;
  slapo_module *m = toy(3);
  slapo_pattern *p = fn_pattern("sub_relu_x", 1, p_sub_relu_x);
  /* sub(x, relu(x)) is not sub(relu(x), x); sub(relu(y), y) is. */
  expect_found(m, p, "relu sub");
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_string_equal(ms.items[0].inputs[0].node->target, "in1");
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static slapo_node *p_diamond(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  slapo_node *a = slapo_add(ctx, in[0], in[1]);
  return slapo_add(ctx, slapo_mul_scalar(ctx, a, 2), slapo_mul_scalar(ctx, a, 3));
}

static void diamond_binds_the_shared_node(void **state) {
  (void)state;
  slapo_module *m = toy(4);
  slapo_pattern *p = fn_pattern("diamond", 2, p_diamond);
  /* Not the unrelated a*5 (the original system's greedy scan took it). */
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.n, 1);
  slapo_match *x = &ms.items[0];
  assert_int_equal(x->n_nodes, 4);
  assert_string_equal(x->nodes[0]->target, "add");
  assert_int_equal((int)slapo_node_attr_float(x->nodes[1], "value", 0), 2);
  assert_int_equal((int)slapo_node_attr_float(x->nodes[2], "value", 0), 3);
  assert_string_equal(x->nodes[3]->target, "add");
  /* Several inputs, in the pattern's order: the two Linear calls. */
  assert_int_equal(x->n_inputs, 2);
  assert_string_equal(x->inputs[0].node->target, "fc1");
  assert_string_equal(x->inputs[1].node->target, "fc2");
  /* The shared add is also read by a*5: the match is not replaceable. */
  assert_false(x->replaceable);
  assert_non_null(strstr(x->why, "is also used by %mul_scalar"));
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static slapo_node *p_add_times_sub(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_mul(ctx, slapo_add(ctx, in[0], in[1]), slapo_sub(ctx, in[0], in[1]));
}

static void any_topological_order(void **state) {
  (void)state;
  slapo_module *m = toy(5);
  slapo_pattern *p = fn_pattern("add_times_sub", 2, p_add_times_sub);
  expect_found(m, p, "sub add mul");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static slapo_node *p_two_results(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  slapo_node *r[2] = {slapo_relu(ctx, in[0]), slapo_gelu(ctx, in[0], false)};
  return slapo_output(ctx, 2, r);
}

static void several_results(void **state) {
  (void)state;
  slapo_module *m = toy(10);
  slapo_pattern *p = fn_pattern("relu_and_gelu", 1, p_two_results);
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.n, 1);
  assert_int_equal(ms.items[0].n_outputs, 2);
  assert_string_equal(ms.items[0].outputs[0]->target, "relu");
  assert_string_equal(ms.items[0].outputs[1]->target, "gelu");
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static slapo_node *p_relu_linear(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_relu(ctx, slapo_linear(ctx, in[0], in[1], in[2]));
}

static slapo_node *p_gelu_any(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  return slapo_gelu(ctx, in[0], ud != NULL);
}

static void op_matches_module_form(void **state) {
  (void)state;
  slapo_module *m = toy(6);
  const char *names[3] = {"x", "w", "b"};
  slapo_pattern *p;
  OK(slapo_pattern_from_fn("relu_linear", 3, names, p_relu_linear, NULL, &p));
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.n, 1);
  slapo_match *x = &ms.items[0];
  assert_string_equal(x->paths[0], "fc1");
  assert_string_equal(x->paths[1], "act");
  assert_null(x->inputs[1].node);
  assert_string_equal(x->inputs[1].param, "fc1.weight");
  assert_string_equal(x->inputs[2].param, "fc1.bias");
  assert_int_equal(x->inputs[1].shape[0], 4);
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  /* gelu's approximation is an attribute: none does not match tanh. */
  OK(slapo_pattern_from_fn("gelu_none", 1, NULL, p_gelu_any, NULL, &p));
  expect_found(m, p, "");
  slapo_pattern_free(p);
  OK(slapo_pattern_from_fn("gelu_tanh", 1, NULL, p_gelu_any, (void *)1, &p));
  expect_found(m, p, "gelu");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static slapo_node *p_mod_relu(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  return slapo_relu(ctx, slapo_pattern_module(ctx, ud, 1, in));
}

static void module_pattern(void **state) {
  (void)state;
  slapo_module *m = toy(6);
  slapo_pattern *p;
  OK(slapo_pattern_from_fn("mod_relu", 1, NULL, p_mod_relu, "fc?1", &p));
  expect_found(m, p, "fc1 act");
  slapo_pattern_free(p);
  OK(slapo_pattern_from_fn("mod_relu", 1, NULL, p_mod_relu, "fc2", &p));
  expect_found(m, p, "");
  slapo_pattern_free(p);
  slapo_matches ms;
  OK(slapo_find_regex(m, "fc.", &ms));
  assert_int_equal(ms.n, 2);
  assert_string_equal(ms.items[1].nodes[0]->target, "fc2");
  assert_string_equal(ms.items[1].inputs[0].node->target, "in1");
  slapo_matches_deinit(&ms);

  assert_int_equal(slapo_find_regex(m, "fc(", &ms), SLAPO_PARSE);
  slapo_module_free(m);
}

static slapo_node *p_relu_plus_one(slapo_ctx *ctx, slapo_node *const *in, void *ud) {
  (void)ud;
  return slapo_add_scalar(ctx, slapo_relu(ctx, in[0]), 1);
}

static void literals_match_scalar_constants(void **state) {
  (void)state;
  slapo_module *m = toy(7);
  /* add_scalar in the pattern matches add_scalar of that value only. */
  slapo_pattern *p = fn_pattern("relu_plus_one", 1, p_relu_plus_one);
  expect_found(m, p, "relu add_scalar");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void matches_never_overlap(void **state) {
  (void)state;
  slapo_module *m = toy(8);
  slapo_pattern *p;
  OK(slapo_pattern_parse("relu(relu(x))", &p));
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.n, 1);
  assert_string_equal(ms.items[0].inputs[0].node->target, "in0");
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void outside_user_not_replaceable(void **state) {
  (void)state;
  slapo_module *m = toy(9);
  slapo_pattern *p;
  OK(slapo_pattern_parse("gelu(linear(x, w, b))", &p));
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  assert_int_equal(ms.n, 1);
  assert_false(ms.items[0].replaceable);
  assert_string_equal(ms.items[0].why, "%fc1 is also used by %add outside the match");
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void text_patterns(void **state) {
  (void)state;
  slapo_module *m = toy(7);
  slapo_pattern *p;
  /* A literal matches add_scalar and an add of a `full` constant. */
  OK(slapo_pattern_parse("add(relu(x), 1)", &p));
  expect_found(m, p, "relu add_scalar | relu full add");
  slapo_pattern_free(p);
  OK(slapo_pattern_parse("add(relu(x), 2)", &p));
  expect_found(m, p, "relu add_scalar");
  slapo_pattern_free(p);
  slapo_module_free(m);
  m = toy(4);
  OK(slapo_pattern_parse("let a = add(x, y); add(mul(a, 2), mul(a, 3))", &p));
  expect_found(m, p, "add mul_scalar mul_scalar add");
  slapo_pattern_free(p);
  OK(slapo_pattern_parse("add(mod('fc1')(x), mod('fc2'))", &p));
  expect_found(m, p, "fc1 fc2 add");
  slapo_pattern_free(p);
  slapo_module_free(m);
  m = toy(6);
  OK(slapo_pattern_parse("gelu(x, approximate=tanh)", &p));
  expect_found(m, p, "gelu");
  slapo_pattern_free(p);
  OK(slapo_pattern_parse("gelu(x, approximate=none)", &p));
  expect_found(m, p, "");
  slapo_pattern_free(p);
  OK(slapo_pattern_parse("(relu(mod('fc1')(x)), gelu(mod('fc2')(y)))", &p));
  expect_found(m, p, "fc1 act fc2 gelu");
  slapo_pattern_free(p);
  slapo_module_free(m);
}

static void untraced_is_precond(void **state) {
  (void)state;
  slapo_module *gpt;
  slapo_gpt2_config c = {2, 4, 32, 32, 256, 0.1, 1e-5};
  OK(slapo_gpt2_new(&c, &gpt));
  slapo_module *mlp;
  OK(slapo_module_at(gpt, "transformer.h.0.mlp", &mlp));
  slapo_pattern *p = fn_pattern("add_relu_x", 1, p_add_relu_x);
  slapo_matches ms;
  assert_int_equal(slapo_find(mlp, p, &ms), SLAPO_PRECOND);
  assert_non_null(strstr(slapo_last_error(), "transformer.h.0.mlp is not traced; trace it first"));
  assert_int_equal(ms.n, 0);
  slapo_pattern_free(p);
  slapo_module_free(gpt);
}

static void gpt2_flattened_block(void **state) {
  (void)state;
  slapo_module *gpt;
  slapo_gpt2_config c = {2, 4, 32, 32, 256, 0.1, 1e-5};
  OK(slapo_gpt2_new(&c, &gpt));
  slapo_module *blk;
  OK(slapo_module_at(gpt, "transformer.h.1", &blk));
  OK(slapo_module_trace(blk, &(slapo_trace_opts){.flatten = true}));
  slapo_matches ms;
  OK(slapo_find_regex(blk, "c_.*", &ms));
  assert_int_equal(ms.n, 4);
  slapo_matches_deinit(&ms);
  slapo_pattern *p;
  OK(slapo_pattern_parse("gelu(linear(x, w, b))", &p));
  OK(slapo_find(blk, p, &ms));
  assert_int_equal(ms.n, 1);
  assert_string_equal(ms.items[0].paths[0], "mlp.c_fc");
  assert_string_equal(ms.items[0].paths[1], "mlp.act");
  assert_string_equal(ms.items[0].inputs[0].node->target, "ln_2");
  assert_string_equal(ms.items[0].inputs[1].param, "mlp.c_fc.weight");
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  slapo_matches_print(&ms, p, f);
  fclose(f);
  print_message("%s", buf);
  assert_non_null(strstr(buf, "w=mlp.c_fc.weight f32[128, 32]"));
  free(buf);
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(gpt);
}

/* dropout ~ Dropout, layer_norm ~ LayerNorm, embedding ~ Embedding. */
static void more_module_forms(void **state) {
  (void)state;
  slapo_module *gpt, *tr;
  slapo_gpt2_config c = {2, 4, 32, 32, 256, 0.1, 1e-5};
  OK(slapo_gpt2_new(&c, &gpt));
  OK(slapo_module_at(gpt, "transformer", &tr));
  OK(slapo_module_trace(tr, &(slapo_trace_opts){.flatten = true}));
  const char *cases[][2] = {
      {"dropout(x)", "drop | h.0.attn.attn_dropout | h.0.attn.resid_dropout | h.0.mlp.dropout | "
                     "h.1.attn.attn_dropout | h.1.attn.resid_dropout | h.1.mlp.dropout"},
      {"dropout(x, p=0.5)", ""},
      {"layer_norm(x, w, b, eps=1e-05)", "h.0.ln_1 | h.0.ln_2 | h.1.ln_1 | h.1.ln_2 | ln_f"},
      {"embedding(w, idx)", "wte"},
      {"add(embedding(w, idx), slice(p))", "wte slice add"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    slapo_pattern *p;
    OK(slapo_pattern_parse(cases[i][0], &p));
    expect_found(tr, p, cases[i][1]);
    slapo_pattern_free(p);
  }
  slapo_module_free(gpt);
}

static char g_logged[8192];
static void sink(int level, const char *msg, void *ud) {
  (void)ud;
  if (level == 3 && strlen(g_logged) + strlen(msg) + 2 < sizeof g_logged)
    strcat(g_logged, msg), strcat(g_logged, "\n");
}

static void debug_says_why(void **state) {
  (void)state;
  slapo_module *m = toy(2);
  slapo_pattern *p = fn_pattern("add_relu_x", 1, p_add_relu_x);
  g_logged[0] = '\0';
  slapo_set_log(sink, NULL);
  slapo_matches ms;
  OK(slapo_find(m, p, &ms));
  slapo_set_log(NULL, NULL);
  print_message("%s", g_logged);
  assert_non_null(strstr(g_logged, "find: candidate %add rejected:"));
  assert_non_null(strstr(g_logged, "the wildcard is bound to another value"));
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(m);
}

/* A near miss deeper than the root is logged with what differs (here a
 * Linear where the pattern wants add); candidates that are not the root op
 * are not logged at all. */
static void debug_names_a_near_miss(void **state) {
  (void)state;
  slapo_module *gpt, *h0;
  slapo_gpt2_config c = {2, 4, 32, 32, 256, 0.1, 1e-5};
  OK(slapo_gpt2_new(&c, &gpt));
  OK(slapo_module_at(gpt, "transformer.h.0", &h0));
  OK(slapo_module_trace(h0, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p;
  OK(slapo_pattern_parse("gelu(add(x, b))", &p));
  g_logged[0] = '\0';
  slapo_set_log(sink, NULL);
  slapo_matches ms;
  OK(slapo_find(h0, p, &ms));
  slapo_set_log(NULL, NULL);
  print_message("%s", g_logged);
  assert_int_equal(ms.n, 0);
  assert_non_null(strstr(g_logged, "candidate %mlp_act rejected: pattern %add vs %mlp_c_fc: "
                                   "module mlp.c_fc (Linear) stands for op linear, the pattern "
                                   "wants add"));
  assert_null(strstr(g_logged, "%mlp_dropout"));
  slapo_matches_deinit(&ms);
  slapo_pattern_free(p);
  slapo_module_free(gpt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(interleaved_unrelated_nodes),
      cmocka_unit_test(debug_names_a_near_miss),
      cmocka_unit_test(commutative_operands_either_order),
      cmocka_unit_test(placeholder_binds_one_value),
      cmocka_unit_test(non_commutative_never_swapped),
      cmocka_unit_test(diamond_binds_the_shared_node),
      cmocka_unit_test(any_topological_order),
      cmocka_unit_test(several_results),
      cmocka_unit_test(op_matches_module_form),
      cmocka_unit_test(module_pattern),
      cmocka_unit_test(literals_match_scalar_constants),
      cmocka_unit_test(matches_never_overlap),
      cmocka_unit_test(outside_user_not_replaceable),
      cmocka_unit_test(text_patterns),
      cmocka_unit_test(untraced_is_precond),
      cmocka_unit_test(gpt2_flattened_block),
      cmocka_unit_test(more_module_forms),
      cmocka_unit_test(debug_says_why),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
