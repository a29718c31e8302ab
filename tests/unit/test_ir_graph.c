/* tests/unit/test_ir_graph.c - building graphs (constructors, unique names,
 * insertion points, getitem, attribute copies, metadata) and every edit
 * (set_input, replace_all_uses, erase, move_before, dce), each followed by
 * a clean lint and checks of the user lists with multiplicity. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>
#include <string.h>

#include "slapo/ir.h"


/* Node names in list order, comma-separated (static buffer). */
static const char *order_of(const slapo_graph *g) {
  static char buf[4096];
  size_t len = 0;
  buf[0] = '\0';
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? "," : "", n->name);
  return buf;
}

static int count_users(const slapo_node *v, const slapo_node *u) {
  int c = 0;
  for (int i = 0; i < v->n_users; i++) c += v->users[i] == u;
  return c;
}

static slapo_node *unary(slapo_graph *g, const char *op, slapo_node *x) {
  slapo_node *n = NULL;
  OK(slapo_graph_add_call_op(g, op, NULL, 1, &x, 0, NULL, &n));
  return n;
}

static slapo_node *binary(slapo_graph *g, const char *op, slapo_node *a, slapo_node *b) {
  slapo_node *in[2] = {a, b}, *n = NULL;
  OK(slapo_graph_add_call_op(g, op, NULL, 2, in, 0, NULL, &n));
  return n;
}

static slapo_node *placeholder(slapo_graph *g, const char *name) {
  int64_t shape[2] = {2, 3};
  slapo_node *n = NULL;
  OK(slapo_graph_add_placeholder(g, name, SLAPO_DTYPE_F32, 2, shape, &n));
  return n;
}

static void test_build_basic(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  assert_null(slapo_graph_first(g));
  assert_int_equal(slapo_graph_count(g), 0);
  assert_non_null(slapo_graph_arena(g));

  slapo_node *x = placeholder(g, "x");
  int64_t wshape[2] = {3, 4};
  slapo_node *w;
  OK(slapo_graph_add_param(g, "transformer.wte.weight", SLAPO_DTYPE_F32, 2, wshape, &w));
  slapo_node *mm = binary(g, "matmul", x, w);
  slapo_node *mod;
  OK(slapo_graph_add_call_module(g, "h.0.mlp", 1, &mm, &mod));
  slapo_node *out;
  OK(slapo_graph_add_output(g, 1, &mod, &out));
  OK(slapo_graph_lint(g));

  assert_string_equal(order_of(g), "x,transformer_wte_weight,matmul,h_0_mlp,output");
  assert_int_equal(slapo_graph_count(g), 5);
  assert_ptr_equal(slapo_graph_first(g), x);
  assert_ptr_equal(slapo_graph_last(g), out);
  assert_ptr_equal(slapo_graph_output(g), out);
  assert_ptr_equal(slapo_graph_find(g, "matmul"), mm);
  assert_null(slapo_graph_find(g, "nope"));

  assert_int_equal(x->kind, SLAPO_NODE_PLACEHOLDER);
  assert_string_equal(w->target, "transformer.wte.weight");
  assert_int_equal(w->ndim, 2);
  assert_int_equal(w->shape[1], 4);
  assert_int_equal(mm->kind, SLAPO_NODE_CALL_OP);
  assert_string_equal(mm->target, "matmul");
  assert_int_equal(mm->dtype, SLAPO_DTYPE_F32);
  assert_int_equal(mm->ndim, 0);
  assert_string_equal(mm->origin, "");
  assert_string_equal(mod->target, "h.0.mlp");
  assert_string_equal(slapo_node_kind_name(mod->kind), "call_module");
  assert_string_equal(slapo_node_kind_name(SLAPO_NODE_GETITEM), "getitem");

  assert_int_equal(mm->n_inputs, 2);
  assert_ptr_equal(mm->inputs[0], x);
  assert_ptr_equal(mm->inputs[1], w);
  assert_int_equal(x->n_users, 1);
  assert_ptr_equal(x->users[0], mm);
  assert_int_equal(mod->n_users, 1);
  assert_ptr_equal(mod->users[0], out);
  assert_int_equal(out->n_users, 0);

  slapo_graph_renumber(g);
  assert_int_equal(x->id, 0);
  assert_int_equal(out->id, 4);
  slapo_graph_free(g);
  slapo_graph_free(NULL);
}

static void test_unique_names(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *x2 = placeholder(g, "x"); /* same target, new name */
  assert_string_equal(x2->name, "x_1");
  assert_string_equal(x2->target, "x");
  slapo_node *taken = placeholder(g, "add_2");
  slapo_node *a0 = binary(g, "add", x, x2);
  slapo_node *a1 = binary(g, "add", a0, x);
  slapo_node *a2 = binary(g, "add", a1, x); /* add_2 is taken: skip it */
  assert_string_equal(a0->name, "add");
  assert_string_equal(a1->name, "add_1");
  assert_string_equal(a2->name, "add_3");
  assert_string_equal(taken->name, "add_2");

  slapo_node *odd = placeholder(g, "input ids-0");
  assert_string_equal(odd->name, "input_ids_0");
  slapo_node *m0;
  OK(slapo_graph_add_call_module(g, "0", 1, &x, &m0));
  assert_string_equal(m0->name, "_0");
  slapo_node *root;
  OK(slapo_graph_add_call_module(g, "", 1, &x, &root));
  assert_string_equal(root->name, "node");
  slapo_node *root2;
  OK(slapo_graph_add_call_module(g, "", 1, &x, &root2));
  assert_string_equal(root2->name, "node_1");
  OK(slapo_graph_lint(g));

  /* Erased names are never handed out again and are not found. */
  OK(slapo_graph_erase(g, root2));
  assert_null(slapo_graph_find(g, "node_1"));
  slapo_node *root3;
  OK(slapo_graph_add_call_module(g, "", 1, &x, &root3));
  assert_string_equal(root3->name, "node_2");
  OK(slapo_graph_erase(g, a2));
  slapo_node *a4 = binary(g, "add", a1, x);
  assert_string_equal(a4->name, "add_4");
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

/* Many nodes of one op: names stay unique and sequential. */
static void test_many_names(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *prev = x;
  for (int i = 0; i < 500; i++) prev = binary(g, "mul", prev, x);
  assert_string_equal(prev->name, "mul_499");
  assert_int_equal(x->n_users, 501); /* mul(x, x), then x once per mul */
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

static void test_insertion_points(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *a = unary(g, "a", x);
  slapo_node *b = unary(g, "b", a);
  slapo_node *out;
  OK(slapo_graph_add_output(g, 1, &b, &out));
  /* At end: before the output, which stays last. */
  unary(g, "e", b);
  assert_string_equal(order_of(g), "x,a,b,e,output");

  slapo_graph_insert_before(g, b);
  unary(g, "c1", a);
  unary(g, "c2", a);
  assert_string_equal(order_of(g), "x,a,c1,c2,b,e,output");

  slapo_graph_insert_after(g, x);
  unary(g, "d1", x);
  unary(g, "d2", x);
  assert_string_equal(order_of(g), "x,d1,d2,a,c1,c2,b,e,output");

  slapo_graph_insert_before(g, NULL); /* the beginning */
  placeholder(g, "p");
  assert_string_equal(order_of(g), "p,x,d1,d2,a,c1,c2,b,e,output");

  slapo_graph_insert_after(g, NULL); /* same as at end */
  unary(g, "f", x);
  assert_string_equal(order_of(g), "p,x,d1,d2,a,c1,c2,b,e,f,output");
  OK(slapo_graph_lint(g));

  /* Erasing the anchor moves the insertion point to its neighbour. */
  slapo_node *c2 = slapo_graph_find(g, "c2");
  slapo_graph_insert_after(g, c2);
  OK(slapo_graph_erase(g, c2));
  unary(g, "g1", a);
  assert_string_equal(order_of(g), "p,x,d1,d2,a,c1,g1,b,e,f,output");
  slapo_graph_insert_before(g, slapo_graph_find(g, "f"));
  OK(slapo_graph_erase(g, slapo_graph_find(g, "f")));
  unary(g, "h1", a);
  assert_string_equal(order_of(g), "p,x,d1,d2,a,c1,g1,b,e,h1,output");
  slapo_graph_insert_at_end(g);
  unary(g, "i1", a);
  assert_string_equal(order_of(g), "p,x,d1,d2,a,c1,g1,b,e,h1,i1,output");
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

/* Repeated inserts at one spot exhaust the order-key gap and relabel. */
static void test_order_relabel(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *last = unary(g, "last", x);
  for (int i = 0; i < 200; i++) {
    slapo_graph_insert_after(g, x); /* always right after x: halves the gap */
    unary(g, "n", x);
  }
  slapo_graph_insert_at_end(g);
  slapo_graph_insert_before(g, NULL);
  for (int i = 0; i < 100; i++) placeholder(g, "p"); /* at the front, in order */
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_count(g), 302);
  assert_string_equal(slapo_graph_first(g)->name, "p");
  assert_string_equal(slapo_graph_first(g)->next->name, "p_1");
  assert_ptr_equal(slapo_graph_last(g), last);
  /* The node inserted last sits right after x. */
  assert_string_equal(x->next->name, "n_199");
  slapo_graph_free(g);
}

static void test_getitem_and_results(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *split = unary(g, "split", x);
  OK(slapo_node_set_n_results(split, 3));
  slapo_node *items[3];
  for (int i = 0; i < 3; i++) OK(slapo_graph_add_getitem(g, split, i, &items[i]));
  assert_string_equal(items[0]->name, "getitem");
  assert_string_equal(items[2]->name, "getitem_2");
  assert_int_equal(items[1]->kind, SLAPO_NODE_GETITEM);
  assert_int_equal(items[1]->item, 1);
  assert_ptr_equal(items[1]->inputs[0], split);
  assert_int_equal(split->n_users, 3);
  slapo_node *out;
  OK(slapo_graph_add_output(g, 3, items, &out));
  OK(slapo_graph_lint(g));

  /* Shrinking below an item in use is refused; above is fine. */
  assert_int_equal(slapo_node_set_n_results(split, 2), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "getitem_2"));
  assert_int_equal(split->n_results, 3);
  OK(slapo_node_set_n_results(split, 4));
  assert_int_equal(slapo_node_set_n_results(x, 2), SLAPO_INVALID_ARG);
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

/* A tuple node (a forward's several values): n_results = n_inputs, its
 * items' metas, no nesting; an output returns a tuple with n_results = its
 * n_inputs, nothing else; DCE drops an unused tuple. */
static void test_tuple_node(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x"), *y = unary(g, "relu", x), *t, *out;
  OK(slapo_graph_add_tuple(g, 2, (slapo_node *[]){x, y}, &t));
  assert_int_equal(t->kind, SLAPO_NODE_TUPLE);
  assert_string_equal(slapo_node_kind_name(t->kind), "tuple");
  assert_int_equal(t->n_results, 2);
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_add_tuple(g, 2, (slapo_node *[]){t, y}, NULL), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "do not nest"));
  assert_int_equal(slapo_graph_add_tuple(g, 0, (slapo_node *[]){x}, NULL), SLAPO_INVALID_ARG);
  t->n_results = 1; /* broken by hand: lint names the rule */
  assert_int_equal(slapo_graph_lint(g), SLAPO_STATE);
  assert_non_null(strstr(slapo_last_error(), "n_results = n_inputs"));
  t->n_results = 2;
  OK(slapo_graph_add_output(g, 2, (slapo_node *[]){x, y}, &out));
  assert_int_equal(slapo_node_set_n_results(out, 1), SLAPO_INVALID_ARG);
  OK(slapo_node_set_n_results(out, 2));
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_dce(g), 1);
  assert_null(slapo_graph_find(g, "tuple"));
  slapo_graph_free(g);
}

static void test_attrs_copied(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  char key[8] = "axis", str[8] = "mean";
  int64_t perm[3] = {0, 2, 1};
  slapo_attr attrs[4] = {slapo_attr_int(key, -1), slapo_attr_float("eps", 1e-5),
                         slapo_attr_str("mode", str), slapo_attr_ints("perm", 3, perm)};
  slapo_node *n;
  OK(slapo_graph_add_call_op(g, "norm", NULL, 1, &x, 4, attrs, &n));
  /* Mutate the caller's buffers: the node keeps its own copies. */
  strcpy(key, "zzzz");
  strcpy(str, "sum");
  perm[0] = 9;

  assert_int_equal(n->n_attrs, 4);
  assert_int_equal(slapo_node_attr_int(n, "axis", 7), -1);
  assert_true(slapo_node_attr_float(n, "eps", 0.0) == 1e-5);
  assert_string_equal(slapo_node_attr_str(n, "mode", NULL), "mean");
  const slapo_attr *p = slapo_node_attr(n, "perm");
  assert_non_null(p);
  assert_int_equal(p->kind, SLAPO_ATTR_INTS);
  assert_int_equal(p->n, 3);
  assert_int_equal(p->ints[0], 0);
  assert_int_equal(p->ints[2], 1);
  /* Absent or of another kind: the default. */
  assert_null(slapo_node_attr(n, "zzzz"));
  assert_int_equal(slapo_node_attr_int(n, "missing", 7), 7);
  assert_int_equal(slapo_node_attr_int(n, "eps", 7), 7);
  assert_true(slapo_node_attr_float(n, "axis", 2.5) == 2.5);
  assert_string_equal(slapo_node_attr_str(n, "axis", "d"), "d");
  assert_null(slapo_node_attr(NULL, "axis"));
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

static void test_meta_and_origin(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *r = unary(g, "relu", x);
  int64_t shape[3] = {4, 5, 6};
  OK(slapo_node_set_meta(r, SLAPO_DTYPE_BF16, 3, shape));
  assert_int_equal(r->dtype, SLAPO_DTYPE_BF16);
  assert_int_equal(r->ndim, 3);
  assert_int_equal(r->shape[2], 6);
  OK(slapo_node_set_meta(r, SLAPO_DTYPE_F32, 0, NULL));
  assert_int_equal(r->ndim, 0);
  assert_int_equal(slapo_node_set_meta(r, SLAPO_DTYPE_F32, SLAPO_MAX_DIMS + 1, shape),
                   SLAPO_INVALID_ARG);
  char path[32] = "transformer.h.0.mlp";
  OK(slapo_node_set_origin(r, path, 3));
  strcpy(path, "changed");
  assert_string_equal(r->origin, "transformer.h.0.mlp");
  assert_int_equal(r->op_seq, 3);
  OK(slapo_node_set_origin(r, "", 0));
  assert_string_equal(r->origin, "");
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

/* x used twice by add(x, x): two user entries; edits keep the count. */
static void test_users_multiplicity(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *y = placeholder(g, "y");
  slapo_node *add = binary(g, "add", x, x);
  assert_int_equal(x->n_users, 2);
  assert_int_equal(count_users(x, add), 2);
  OK(slapo_graph_lint(g));

  OK(slapo_node_set_input(add, 1, y));
  assert_int_equal(count_users(x, add), 1);
  assert_int_equal(count_users(y, add), 1);
  assert_ptr_equal(add->inputs[1], y);
  OK(slapo_graph_lint(g));
  OK(slapo_node_set_input(add, 1, y)); /* same input: no change */
  assert_int_equal(y->n_users, 1);
  OK(slapo_node_set_input(add, 1, x));
  assert_int_equal(count_users(x, add), 2);
  assert_int_equal(y->n_users, 0);
  OK(slapo_graph_lint(g));

  /* Replacing x moves both uses. */
  slapo_node *mul = binary(g, "mul", x, add);
  OK(slapo_node_replace_all_uses(x, y));
  assert_int_equal(x->n_users, 0);
  assert_int_equal(count_users(y, add), 2);
  assert_int_equal(count_users(y, mul), 1);
  assert_ptr_equal(add->inputs[0], y);
  assert_ptr_equal(add->inputs[1], y);
  assert_ptr_equal(mul->inputs[0], y);
  OK(slapo_graph_lint(g));
  OK(slapo_node_replace_all_uses(y, y)); /* no-op */
  assert_int_equal(y->n_users, 3);

  /* Erasing add(y, y) removes both entries from y. */
  OK(slapo_node_set_input(mul, 1, y));
  OK(slapo_graph_erase(g, add));
  assert_int_equal(y->n_users, 2);
  assert_int_equal(count_users(y, mul), 2);
  assert_null(add->graph);
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

static void test_replace_all_uses(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *a = unary(g, "neg", x);
  slapo_node *b = binary(g, "add", x, a);
  slapo_node *out;
  OK(slapo_graph_add_output(g, 1, &b, &out));
  /* Typical rewrite: a new node right after a, then swap it in. */
  slapo_graph_insert_after(g, a);
  slapo_node *r = unary(g, "relu", a);
  OK(slapo_node_replace_all_uses(b, r));
  OK(slapo_graph_lint(g));
  assert_ptr_equal(out->inputs[0], r);
  assert_int_equal(b->n_users, 0);
  assert_int_equal(slapo_graph_dce(g), 1); /* b is dead */
  assert_string_equal(order_of(g), "x,neg,relu,output");
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

static void test_erase_and_dce(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  placeholder(g, "unused_input");
  int64_t s1[1] = {3};
  slapo_node *w;
  OK(slapo_graph_add_param(g, "w", SLAPO_DTYPE_F32, 1, s1, &w));
  slapo_node *d1 = binary(g, "mul", x, w); /* dead chain d1 -> d2 -> d3 */
  slapo_node *d2 = unary(g, "exp", d1);
  unary(g, "log", d2);
  slapo_node *live = unary(g, "relu", x);
  slapo_node *split = unary(g, "split", x);
  OK(slapo_node_set_n_results(split, 2));
  slapo_node *gi;
  OK(slapo_graph_add_getitem(g, split, 0, &gi));
  slapo_node *out;
  OK(slapo_graph_add_output(g, 1, &live, &out));
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_dce(g), 6); /* log, exp, mul, w, getitem, split */
  assert_string_equal(order_of(g), "x,unused_input,relu,output");
  assert_int_equal(x->n_users, 1);
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_dce(g), 0);

  /* Erasing the output is allowed; a new one can then be added. */
  OK(slapo_graph_erase(g, out));
  assert_null(slapo_graph_output(g));
  OK(slapo_graph_lint(g));
  OK(slapo_graph_add_output(g, 1, &live, &out));
  assert_string_equal(out->name, "output_1");
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_dce(NULL), 0);
  slapo_graph_free(g);
}

static void test_move_before(void **state) {
  (void)state;
  slapo_graph *g;
  OK(slapo_graph_new(&g));
  slapo_node *x = placeholder(g, "x");
  slapo_node *a = unary(g, "a", x);
  slapo_node *b = unary(g, "b", x);
  slapo_node *c = binary(g, "c", a, b);
  slapo_node *out;
  OK(slapo_graph_add_output(g, 1, &c, &out));
  OK(slapo_graph_move_before(g, b, a));
  assert_string_equal(order_of(g), "x,b,a,c,output");
  OK(slapo_graph_lint(g));
  OK(slapo_graph_move_before(g, b, b)); /* no-op */
  OK(slapo_graph_move_before(g, b, a)); /* already there */
  assert_string_equal(order_of(g), "x,b,a,c,output");
  OK(slapo_graph_move_before(g, a, out));
  OK(slapo_graph_move_before(g, b, out));
  assert_string_equal(order_of(g), "x,c,a,b,output"); /* broken: c before a, b */
  assert_int_equal(slapo_graph_lint(g), SLAPO_STATE);
  OK(slapo_graph_move_before(g, c, out));
  assert_string_equal(order_of(g), "x,a,b,c,output");
  OK(slapo_graph_lint(g));
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_build_basic),
      cmocka_unit_test(test_unique_names),
      cmocka_unit_test(test_many_names),
      cmocka_unit_test(test_insertion_points),
      cmocka_unit_test(test_order_relabel),
      cmocka_unit_test(test_getitem_and_results),
      cmocka_unit_test(test_attrs_copied),
      cmocka_unit_test(test_meta_and_origin),
      cmocka_unit_test(test_users_multiplicity),
      cmocka_unit_test(test_replace_all_uses),
      cmocka_unit_test(test_erase_and_dce),
      cmocka_unit_test(test_move_before),
      cmocka_unit_test(test_tuple_node),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
