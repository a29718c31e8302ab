/* tests/unit/test_ir_print.c - the text form of a small graph against exact
 * expected text (the format documented atop src/ir/print.c), and the lines
 * of its Graphviz DOT export. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/ir.h"


typedef void (*print_fn)(const slapo_graph *g, FILE *f);

static char *capture(const slapo_graph *g, print_fn fn) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  fn(g, f);
  fclose(f);
  return buf;
}

/* Every node kind, attributes of every kind, an origin, a tuple. */
static slapo_graph *build(void) {
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x, *w, *mm, *mod, *split, *gi, *out;
  int64_t xs[2] = {2, 3}, ws[2] = {3, 4}, ms[2] = {2, 4}, gs[1] = {2};
  OK(slapo_graph_add_placeholder(g, "x", SLAPO_DTYPE_F32, 2, xs, &x));
  OK(slapo_graph_add_param(g, "transformer.wte.weight", SLAPO_DTYPE_F32, 2, ws, &w));
  int64_t perm[3] = {0, 2, 1};
  slapo_attr attrs[4] = {slapo_attr_int("transpose_b", 1), slapo_attr_float("eps", 1e-5),
                         slapo_attr_str("name", "s"), slapo_attr_ints("perm", 3, perm)};
  slapo_node *in[2] = {x, w};
  OK(slapo_graph_add_call_op(g, "matmul", NULL, 2, in, 4, attrs, &mm));
  OK(slapo_node_set_meta(mm, SLAPO_DTYPE_F32, 2, ms));
  OK(slapo_node_set_origin(mm, "transformer.h.0.mlp", 0));
  OK(slapo_graph_add_call_module(g, "h.0.mlp", 1, &mm, &mod));
  OK(slapo_node_set_meta(mod, SLAPO_DTYPE_F32, 2, ms));
  slapo_attr sattrs[2] = {slapo_attr_int("axis", -1), slapo_attr_str("tag", "a\"b\\c\n")};
  OK(slapo_graph_add_call_op(g, "split", NULL, 1, &mod, 2, sattrs, &split));
  OK(slapo_node_set_n_results(split, 3));
  OK(slapo_graph_add_getitem(g, split, 1, &gi));
  OK(slapo_node_set_meta(gi, SLAPO_DTYPE_BF16, 1, gs));
  slapo_node *outs[2] = {mod, gi};
  OK(slapo_graph_add_output(g, 2, outs, &out));
  OK(slapo_graph_lint(g));
  return g;
}

static void test_text(void **state) {
  (void)state;
  slapo_graph *g = build();
  char *text = capture(g, slapo_graph_print);
  const char *want =
      "%x : f32[2, 3] = placeholder[x]\n"
      "%transformer_wte_weight : f32[3, 4] = param[transformer.wte.weight]\n"
      "%matmul : f32[2, 4] = call_op matmul(%x, %transformer_wte_weight) {transpose_b=1, "
      "eps=1e-05, name=\"s\", perm=[0, 2, 1]}  # transformer.h.0.mlp\n"
      "%h_0_mlp : f32[2, 4] = call_module h.0.mlp(%matmul)\n"
      "%split : (3) = call_op split(%h_0_mlp) {axis=-1, tag=\"a\\\"b\\\\c\\n\"}\n"
      "%getitem : bf16[2] = getitem(%split, 1)\n"
      "output(%h_0_mlp, %getitem)\n";
  assert_string_equal(text, want);
  free(text);

  /* Scalars, empty argument lists and an empty graph. */
  slapo_graph *e;
  OK(slapo_graph_new(&e));
  text = capture(e, slapo_graph_print);
  assert_string_equal(text, "");
  free(text);
  slapo_node *c, *out;
  OK(slapo_graph_add_call_op(e, "zeros", NULL, 0, NULL, 0, NULL, &c));
  OK(slapo_graph_add_output(e, 0, NULL, &out));
  text = capture(e, slapo_graph_print);
  assert_string_equal(text, "%zeros : f32[] = call_op zeros()\noutput()\n");
  free(text);
  slapo_graph_print(NULL, stdout); /* prints nothing, does not crash */
  slapo_graph_print(e, NULL);
  slapo_graph_free(e);
  slapo_graph_free(g);
}

static void expect_line(const char *text, const char *line) {
  char *want = malloc(strlen(line) + 3);
  assert_non_null(want);
  sprintf(want, "\n%s\n", line);
  if (!strstr(text, want)) fail_msg("DOT output lacks line %s:\n%s", line, text);
  free(want);
}

static void test_dot(void **state) {
  (void)state;
  slapo_graph *g = build();
  char *dot = capture(g, slapo_graph_print_dot);
  assert_true(strncmp(dot, "digraph G {\n", 12) == 0);
  assert_true(strcmp(dot + strlen(dot) - 2, "}\n") == 0);
  expect_line(dot, "  \"x\" [shape=box, label=\"x\\nx\\nf32[2, 3]\"];");
  expect_line(dot, "  \"transformer_wte_weight\" [shape=box, "
                   "label=\"transformer_wte_weight\\ntransformer.wte.weight\\nf32[3, 4]\"];");
  expect_line(dot, "  \"split\" [shape=box, label=\"split\\nsplit\\n(3)\"];");
  expect_line(dot, "  \"getitem\" [shape=box, label=\"getitem\\ngetitem[1]\\nbf16[2]\"];");
  expect_line(dot, "  \"output\" [shape=box, label=\"output\\noutput\"];");
  expect_line(dot, "  \"x\" -> \"matmul\";");
  expect_line(dot, "  \"transformer_wte_weight\" -> \"matmul\";");
  expect_line(dot, "  \"matmul\" -> \"h_0_mlp\";");
  expect_line(dot, "  \"h_0_mlp\" -> \"output\";");
  expect_line(dot, "  \"getitem\" -> \"output\";");
  free(dot);

  /* Quotes in targets are escaped. */
  slapo_graph *q;
  slapo_node *p;
  OK(slapo_graph_new(&q));
  OK(slapo_graph_add_placeholder(q, "say \"hi\"", SLAPO_DTYPE_F32, 0, NULL, &p));
  dot = capture(q, slapo_graph_print_dot);
  expect_line(dot, "  \"say__hi_\" [shape=box, label=\"say__hi_\\nsay \\\"hi\\\"\\nf32[]\"];");
  free(dot);
  slapo_graph_free(q);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text),
      cmocka_unit_test(test_dot),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
