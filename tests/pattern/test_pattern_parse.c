/* tests/pattern/test_pattern_parse.c - text patterns (src/pattern/parse.c,
 * print.c): the canonical printed form of golden texts and its round trip
 * (parse -> print -> parse -> print prints the same), every error with its
 * exact message, the graphs parses build (node kinds, descriptors,
 * attributes, placeholder order and sharing, literals, module patterns),
 * and allocation failures while parsing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/failalloc.h"
#include "slapo/ops.h"
#include "slapo/pattern.h"


static char *print_pattern(const slapo_pattern *p) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  slapo_pattern_print(p, f);
  fclose(f);
  return buf;
}

/* parse(text) prints `want`, and parsing that prints it again. */
static void check_print(const char *text, const char *want) {
  slapo_pattern *p;
  if (slapo_pattern_parse(text, &p) != SLAPO_OK) fail_msg("%s: %s", text, slapo_last_error());
  char *once = print_pattern(p);
  if (strcmp(once, want)) fail_msg("%s printed as\n  %s\nwant\n  %s", text, once, want);
  slapo_pattern *q;
  if (slapo_pattern_parse(once, &q) != SLAPO_OK) fail_msg("%s: %s", once, slapo_last_error());
  char *twice = print_pattern(q);
  assert_string_equal(twice, once);
  free(once);
  free(twice);
  slapo_pattern_free(p);
  slapo_pattern_free(q);
}

static void test_print_goldens(void **state) {
  (void)state;
  static const char *const same[] = {
      "add(relu(x), 1)",
      "gelu(add(matmul(x, w), b))",
      "gelu(x, approximate=tanh)",
      "(relu(x), gelu(x))",
      "mod('c_.*')",
      "mod('c_.*')(x)",
      "relu(mod('fc?')(x))",
      "mod('h\\.0')()",
      "mod('h\\.[0-9]{1,2}\\.(attn|mlp)+[]a-z[:digit:]]*')",
      "mod('((((c))))')",
      "mod('(a+)?(b|c)*x{0,3}(d{2})+$')",
      "mod('a\\\\\\\\')",
      "mod('it\\'s')",
      "add(x, -0.5)",
      "add(x, 0.1)",
      "mul(x, 1e-05)",
      "softmax(x, axis=-1)",
      "sum(x, axes=[0, -1])",
      "sum(x, axes=[])",
      "dropout(x, p=1.0)",
      "dropout(x, p=0.25)",
      "layer_norm(x, w, b, eps=1e-05)",
      "gelu(x, approximate='a b')",
      "gelu(x, approximate='true')",
      "gelu(x, approximate='')",
      "full(shape=[2, 3], value=0.5)",
      "concat(x, y, z, axis=1)",
      "(relu(x), relu(x))",
      "let t1 = relu(x); let t2 = gelu(t1); (add(t2, t1), t2)",
      "let t1 = mod('a'); add(t1, t1)",
      "let t2 = relu(t1); mul(t2, t2)",
      "relu(relu)",
  };
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) check_print(same[i], same[i]);
  static const char *const pairs[][2] = {
      {"let a = add(x, y); mul(a, a)", "let t1 = add(x, y); mul(t1, t1)"},
      {"softmax(x, causal=true)", "softmax(x, causal=1)"},
      {"softmax(x, causal=false)", "softmax(x, causal=0)"},
      {"gelu(approximate = \"tanh\", x)", "gelu(x, approximate=tanh)"},
      {" add ( x ,\n\ty ) \r\n", "add(x, y)"},
      {"let a = relu(x); add(y, a)", "add(y, relu(x))"},
      {"let a = x; mul(a, a)", "mul(x, x)"},
      {"let r = relu(x); (r, r)", "let t1 = relu(x); (t1, t1)"},
      {"add(x, .5)", "add(x, 0.5)"},
      {"add(x, 1.)", "add(x, 1)"},
      {"add(x, +2E3)", "add(x, 2000)"},
      {"dropout(x, p=1e0)", "dropout(x, p=1.0)"},
      {"dropout(x, p=2.5e+20)", "dropout(x, p=2.5e+20)"},
      {"gelu(x, approximate=\"it's \\\"q\\\"\")", "gelu(x, approximate='it\\'s \"q\"')"},
      {"mod(\"h\\\\.0\")", "mod('h\\.0')"},
      {"let s = relu(x); let u = gelu(s); mul(u, add(u, s))",
       "let t1 = relu(x); let t2 = gelu(t1); mul(t2, add(t2, t1))"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) check_print(pairs[i][0], pairs[i][1]);
}

/* parse(text) fails with SLAPO_PARSE and exactly `want`, leaving *out NULL. */
static void check_error(const char *text, const char *want) {
  slapo_pattern *p = (slapo_pattern *)&p;
  slapo_status s = slapo_pattern_parse(text, &p);
  if (s != SLAPO_PARSE)
    fail_msg("%s: status %s (%s)", text, slapo_status_name(s), slapo_last_error());
  assert_null(p);
  if (strcmp(slapo_last_error(), want))
    fail_msg("%s:\n  got  %s\n  want %s", text, slapo_last_error(), want);
}

static void test_errors(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"frob(x)", "pattern 'frob(x)': column 1: unknown op 'frob'"},
      {"relu(frob(x))", "pattern 'relu(frob(x))': column 6: unknown op 'frob'"},
      {"relu(x", "pattern 'relu(x': column 7: expected ',' or ')', got end of pattern"},
      {"relu((x)", "pattern 'relu((x)': column 6: expected an expression, got '('"},
      {"relu(x) y", "pattern 'relu(x) y': column 9: expected end of pattern, got 'y'"},
      {"relu(x))", "pattern 'relu(x))': column 8: expected end of pattern, got ')'"},
      {"relu(x) # note", "pattern 'relu(x) # note': column 9: expected end of pattern, got '#'"},
      {"relu(x, y)", "pattern 'relu(x, y)': column 1: relu takes 1 input, got 2"},
      {"add(x)", "pattern 'add(x)': column 1: add takes 2 inputs, got 1"},
      {"full(x)", "pattern 'full(x)': column 1: full takes 0 inputs, got 1"},
      {"concat(axis=0)",
       "pattern 'concat(axis=0)': column 1: concat takes at least 1 input, got 0"},
      {"let a = relu(x); gelu(x)",
       "pattern 'let a = relu(x); gelu(x)': column 5: let 'a' is never used"},
      {"", "pattern '': column 1: expected an expression, got end of pattern"},
      {"  \n ", "pattern '  \\x0a ': column 5: expected an expression, got end of pattern"},
      {"gelu(x, a=1, a=2)", "pattern 'gelu(x, a=1, a=2)': column 14: duplicate attribute 'a'"},
      {"let a = relu(x); let a = gelu(x); add(a, a)",
       "pattern 'let a = relu(x); let a = gelu(x); add(a, a)': column 22: let 'a' is already "
       "defined at column 5"},
      {"let a = relu(a); a",
       "pattern 'let a = relu(a); a': column 5: let 'a' comes after a use of 'a' at column 14; a "
       "let must precede its uses"},
      {"let b = relu(a); let a = gelu(x); add(a, b)",
       "pattern 'let b = relu(a); let a = gelu(x); add(a, b)': column 22: let 'a' comes after a "
       "use of 'a' at column 14; a let must precede its uses"},
      {"let let = x; x", "pattern 'let let = x; x': column 5: expected a name after let, got "
                         "keyword 'let'"},
      {"let a relu(x); a", "pattern 'let a relu(x); a': column 7: expected '=', got 'relu'"},
      {"let a = relu(x) a", "pattern 'let a = relu(x) a': column 17: expected ';', got 'a'"},
      {"relu(let)", "pattern 'relu(let)': column 6: expected an expression, got keyword 'let'"},
      {"(relu(x))", "pattern '(relu(x))': column 9: expected ',', got ')'"},
      {"x", "pattern 'x': column 1: expected an op call or a module pattern as a result, got the "
            "wildcard 'x'"},
      {"(relu(x), 1.5)", "pattern '(relu(x), 1.5)': column 11: expected an op call or a module "
                         "pattern as a result, got the number '1.5'"},
      {"let a = y; (relu(x), a)", "pattern 'let a = y; (relu(x), a)': column 22: expected an op "
                                  "call or a module pattern as a result, got the wildcard 'a'"},
      {"(relu(x), relu(y)",
       "pattern '(relu(x), relu(y)': column 18: expected ',' or ')', got end of pattern"},
      {"mod", "pattern 'mod': column 4: expected '(' after mod, got end of pattern"},
      {"mod(x)", "pattern 'mod(x)': column 5: expected a quoted module regex, got 'x'"},
      {"mod('a'", "pattern 'mod('a'': column 8: expected ')', got end of pattern"},
      {"mod('a')(x, k=1)", "pattern 'mod('a')(x, k=1)': column 14: expected ',' or ')', got '='"},
      {"relu('abc", "pattern 'relu('abc': column 10: expected ' to close the string at column 6, "
                    "got end of pattern"},
      {"relu('abc')", "pattern 'relu('abc')': column 6: expected an expression, got the string "
                      "'abc'"},
      {"relu(x, a=)", "pattern 'relu(x, a=)': column 11: expected a value (a word, a number, "
                      "true/false, a string or [ints]), got ')'"},
      {"sum(x, axes=[1, 2.5])", "pattern 'sum(x, axes=[1, 2.5])': column 17: expected an "
                                "integer, got '2.5'"},
      {"sum(x, axes=[1 2])", "pattern 'sum(x, axes=[1 2])': column 16: expected ',' or ']', got "
                             "'2'"},
      {"add(x, 1e999)", "pattern 'add(x, 1e999)': column 8: expected a finite number, got "
                        "'1e999'"},
      {"relu(x, k=99999999999999999999)",
       "pattern 'relu(x, k=99999999999999999999)': column 11: expected a 64-bit integer, got "
       "'99999999999999999999'"},
      {"relu(-x)", "pattern 'relu(-x)': column 6: expected an expression, got '-'"},
      {"relu(\x01)", "pattern 'relu(\\x01)': column 6: expected an expression, got '\\x01'"},
      {"mod('(a{100}){100}')",
       "pattern 'mod('(a{100}){100}')': column 5: bad module regex '(a{100}){100}': too complex "
       "(more than 1024 nodes once repetitions are expanded)"},
      {"mod('x++++++++++++')",
       "pattern 'mod('x++++++++++++')': column 5: bad module regex 'x++++++++++++': too complex "
       "(more than 1024 nodes once repetitions are expanded)"},
      {"mod('(()?()?)*')",
       "pattern 'mod('(()?()?)*')': column 5: bad module regex '(()?()?)*': it repeats an operand "
       "that matches the empty string (like a**, (a?)+ or ()?)"},
      /* glibc reads {,n} as {0,n}: found by the fuzzer as a timeout. */
      {"mod('((a{,20}){,20}){,20}')",
       "pattern 'mod('((a{,20}){,20}){,20}')': column 5: bad module regex "
       "'((a{,20}){,20}){,20}': it repeats an operand that matches the empty string (like a**, "
       "(a?)+ or ()?)"},
      {"mod('(ab{,99}){,99}c')",
       "pattern 'mod('(ab{,99}){,99}c')': column 5: bad module regex '(ab{,99}){,99}c': too "
       "complex (more than 1024 nodes once repetitions are expanded)"},
      {"mod('(a{00,3}){2}')",
       "pattern 'mod('(a{00,3}){2}')': column 5: bad module regex '(a{00,3}){2}': it repeats an "
       "operand that matches the empty string (like a**, (a?)+ or ()?)"},
      {"mod('(\\b)(\\b\\1+()){,40}')",
       "pattern 'mod('(\\b)(\\b\\1+()){,40}')': column 5: bad module regex "
       "'(\\b)(\\b\\1+()){,40}': it has a back-reference (\\1 to \\9), which module regexes "
       "do not allow"},
      {"mod('(\\ba){9}')",
       "pattern 'mod('(\\ba){9}')': column 5: bad module regex '(\\ba){9}': more than 8 "
       "word boundaries (\\b, \\B) once repetitions are expanded"},
      {"mod('h.a*?')", "pattern 'mod('h.a*?')': column 5: bad module regex 'h.a*?': it repeats an "
                       "operand that matches the empty string (like a**, (a?)+ or ()?)"},
      {"mod('(a|b?)+')", "pattern 'mod('(a|b?)+')': column 5: bad module regex '(a|b?)+': it "
                         "repeats an operand that matches the empty string (like a**, (a?)+ or "
                         "()?)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_error(cases[i][0], cases[i][1]);
}

static void test_bad_regex(void **state) {
  (void)state;
  regex_t re;
  int rc = regcomp(&re, "(", REG_EXTENDED | REG_NOSUB);
  assert_int_not_equal(rc, 0);
  char why[256], want[512];
  regerror(rc, &re, why, sizeof why);
  snprintf(want, sizeof want, "pattern 'relu(mod('(')(x))': column 10: bad module regex '(': %s",
           why);
  check_error("relu(mod('(')(x))", want);
}

/* n nested relu calls around x. */
static char *nested(int n) {
  char *t = malloc((size_t)n * 6 + 2);
  assert_non_null(t);
  size_t k = 0;
  for (int i = 0; i < n; i++) memcpy(t + k, "relu(", 5), k += 5;
  t[k++] = 'x';
  for (int i = 0; i < n; i++) t[k++] = ')';
  t[k] = '\0';
  return t;
}

/* Prints the text of parse(text) into want and checks the round trip. */
static void check_print_fmt(const char *text, const char *fmt, ...) {
  char want[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(want, sizeof want, fmt, ap);
  va_end(ap);
  check_print(text, want);
}

static void test_limits(void **state) {
  (void)state;
  /* 200 nested calls parse; printed, a chain deeper than 198 calls under
   * another call is cut with a let so that the text parses again (in a
   * tuple, results sit one level deeper). */
  char *n199 = nested(199), *n200 = nested(200), *tuple = malloc(4096);
  assert_non_null(tuple);
  check_print(n199, n199);
  check_print_fmt(n200, "let t1 = %s; relu(t1)", n199);
  snprintf(tuple, 4096, "(%s, relu(y))", n199);
  check_print(tuple, tuple);
  free(n199);
  free(n200);
  free(tuple);

  /* The message shows the first 200 bytes; the 202nd expression (x,
   * inside 201 calls) is too deep. */
  char *deep = nested(201);
  char want[512];
  snprintf(want, sizeof want, "pattern '%.200s...': column %d: pattern nests deeper than 200",
           deep, 201 * 5 + 1);
  check_error(deep, want);
  free(deep);

  size_t n = 64 * 1024 + 1;
  char *big = malloc(n + 1);
  assert_non_null(big);
  memset(big, ' ', n);
  memcpy(big, "relu(x)", 7);
  big[n] = '\0';
  snprintf(want, sizeof want,
           "pattern 'relu(x)%193s...': column 65537: pattern is longer than 65536 bytes", "");
  check_error(big, want);
  free(big);
}

static int n_nodes(const slapo_graph *g, slapo_node_kind k) {
  int n = 0;
  for (const slapo_node *x = slapo_graph_first(g); x; x = x->next) n += x->kind == k;
  return n;
}

static const slapo_node *result(const slapo_pattern *p, int i) {
  const slapo_node *out = slapo_graph_output(slapo_pattern_graph(p));
  assert_non_null(out);
  assert_true(i < out->n_inputs);
  return out->inputs[i];
}

static void test_graph_ops_and_placeholders(void **state) {
  (void)state;
  slapo_pattern *p;
  OK(slapo_pattern_parse("add(y, mul(x, y))", &p));
  assert_string_equal(slapo_pattern_name(p), "add(y, mul(x, y))");
  assert_true(slapo_pattern_is_text(p));
  assert_int_equal(slapo_pattern_n_inputs(p), 2);
  assert_string_equal(slapo_pattern_input_name(p, 0), "y");
  assert_string_equal(slapo_pattern_input_name(p, 1), "x");
  const slapo_graph *g = slapo_pattern_graph(p);
  assert_int_equal(n_nodes(g, SLAPO_NODE_PLACEHOLDER), 2); /* y is one node */
  OK(slapo_graph_lint(g));
  const slapo_node *add = result(p, 0);
  assert_int_equal(add->kind, SLAPO_NODE_CALL_OP);
  assert_ptr_equal(add->op, slapo_op_find("add"));
  assert_string_equal(add->target, "add");
  const slapo_node *y = add->inputs[0], *mul = add->inputs[1];
  assert_int_equal(y->kind, SLAPO_NODE_PLACEHOLDER);
  assert_string_equal(y->target, "y");
  assert_ptr_equal(mul->op, slapo_op_find("mul"));
  assert_string_equal(mul->inputs[0]->target, "x");
  assert_ptr_equal(mul->inputs[1], y);
  assert_int_equal(y->n_users, 2);
  slapo_pattern_free(p);
}

static void test_graph_attrs_and_literals(void **state) {
  (void)state;
  slapo_pattern *p;
  OK(slapo_pattern_parse("add(softmax(x, causal=true, axis=-1, approximate=tanh, scale=0.5, "
                         "perm=[2, 0], name='a b'), -0.5)",
                         &p));
  const slapo_node *add = result(p, 0);
  const slapo_node *sm = add->inputs[0], *lit = add->inputs[1];
  assert_ptr_equal(sm->op, slapo_op_find("softmax"));
  assert_int_equal(sm->n_attrs, 6);
  assert_string_equal(sm->attrs[0].key, "causal");
  assert_int_equal(sm->attrs[0].kind, SLAPO_ATTR_INT);
  assert_int_equal(sm->attrs[0].i, 1);
  assert_int_equal(slapo_node_attr_int(sm, "axis", 0), -1);
  assert_string_equal(slapo_node_attr_str(sm, "approximate", ""), "tanh");
  assert_int_equal(sm->attrs[3].kind, SLAPO_ATTR_FLOAT);
  assert_true(sm->attrs[3].f == 0.5);
  const slapo_attr *perm = slapo_node_attr(sm, "perm");
  assert_int_equal(perm->kind, SLAPO_ATTR_INTS);
  assert_int_equal(perm->n, 2);
  assert_int_equal(perm->ints[0], 2);
  assert_int_equal(perm->ints[1], 0);
  assert_string_equal(slapo_node_attr_str(sm, "name", ""), "a b");
  assert_int_equal(lit->kind, SLAPO_NODE_CALL_OP);
  assert_null(lit->op);
  assert_string_equal(lit->target, "literal");
  assert_true(slapo_node_attr_float(lit, "value", 0) == -0.5);
  assert_int_equal(slapo_pattern_n_inputs(p), 1);
  slapo_pattern_free(p);

  OK(slapo_pattern_parse("dropout(x, p=1e-1, q=1.0, k=7)", &p));
  const slapo_node *d = result(p, 0);
  assert_int_equal(d->attrs[0].kind, SLAPO_ATTR_FLOAT);
  assert_int_equal(d->attrs[1].kind, SLAPO_ATTR_FLOAT);
  assert_int_equal(d->attrs[2].kind, SLAPO_ATTR_INT);
  slapo_pattern_free(p);
}

static void test_graph_lets_modules_results(void **state) {
  (void)state;
  slapo_pattern *p;
  OK(slapo_pattern_parse("let a = add(x, y); let m = mod('c_.*'); (mul(a, a), relu(mod('fc?')(a)), "
                         "m)",
                         &p));
  assert_int_equal(slapo_pattern_n_inputs(p), 2);
  const slapo_node *mul = result(p, 0), *relu = result(p, 1), *m = result(p, 2);
  assert_ptr_equal(mul->inputs[0], mul->inputs[1]);
  assert_ptr_equal(mul->inputs[0]->op, slapo_op_find("add"));
  const slapo_node *fc = relu->inputs[0];
  assert_int_equal(fc->kind, SLAPO_NODE_CALL_MODULE);
  assert_string_equal(fc->target, "fc?");
  assert_int_equal(fc->n_inputs, 1);
  assert_ptr_equal(fc->inputs[0], mul->inputs[0]);
  assert_false(slapo_pattern_any_inputs(p, fc));
  assert_int_equal(m->kind, SLAPO_NODE_CALL_MODULE);
  assert_string_equal(m->target, "c_.*");
  assert_int_equal(m->n_inputs, 0);
  assert_true(slapo_pattern_any_inputs(p, m));
  assert_int_equal(n_nodes(slapo_pattern_graph(p), SLAPO_NODE_CALL_OP), 3);
  OK(slapo_graph_lint(slapo_pattern_graph(p)));
  slapo_pattern_free(p);

  /* The called form with no inputs is not the uncalled one. */
  OK(slapo_pattern_parse("mod('lm_head')()", &p));
  assert_false(slapo_pattern_any_inputs(p, result(p, 0)));
  assert_int_equal(slapo_pattern_n_inputs(p), 0);
  slapo_pattern_free(p);
}

static void test_null_args(void **state) {
  (void)state;
  slapo_pattern *p = (slapo_pattern *)&p;
  assert_int_equal(slapo_pattern_parse(NULL, &p), SLAPO_INVALID_ARG);
  assert_null(p);
  assert_int_equal(slapo_pattern_parse("relu(x)", NULL), SLAPO_INVALID_ARG);
  slapo_pattern_print(NULL, stdout); /* prints nothing */
}

static void test_nomem(void **state) {
  (void)state;
  const char *text = "let a = add(x, y); (gelu(a, approximate=tanh, perm=[1, 2]), "
                     "relu(mod('c_.*')(a)), mul(a, 0.5))";
  (void)slapo_op_find("add"); /* the op table is built once, outside the sweep */
  for (long k = 0;; k++) {
    failalloc_install(k);
    slapo_pattern *p = NULL;
    slapo_status st = slapo_pattern_parse(text, &p);
    /* The printer's own allocation comes after the parse's and fails. */
    char *printed = p ? print_pattern(p) : NULL;
    slapo_pattern_free(p);
    long live = failalloc_live();
    failalloc_uninstall();
    assert_int_equal(live, 0);
    if (st == SLAPO_OK) {
      assert_string_equal(printed, "<out of memory>");
      free(printed);
      break;
    }
    assert_int_equal(st, SLAPO_NOMEM);
    assert_null(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_print_goldens),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_bad_regex),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_graph_ops_and_placeholders),
      cmocka_unit_test(test_graph_attrs_and_literals),
      cmocka_unit_test(test_graph_lets_modules_results),
      cmocka_unit_test(test_null_args),
      cmocka_unit_test(test_nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
