/* tests/unit/test_sched_tree.c - the schedule tree over GPT-2 tiny: one node
 * per module, path lookup (relative paths, ".", the NOT_FOUND message),
 * accessors, pre-order iteration against the module tree, rebuilding after
 * a child module is swapped, and allocation failures during create and
 * rebuild. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/failalloc.h"
#include "common/schedfix.h"
#include "slapo/models.h"
#include "slapo/schedule.h"


static size_t count_modules(const slapo_module *m) {
  size_t n = 1;
  for (int i = 0; i < m->n_children; i++) n += count_modules(m->children[i]);
  return n;
}

/* Appends the module paths of m's subtree in pre-order to paths[*n]. */
static void module_preorder(const slapo_module *m, char **paths, size_t *n) {
  paths[(*n)++] = slapo_module_path(m);
  for (int i = 0; i < m->n_children; i++) module_preorder(m->children[i], paths, n);
}

static void test_at_and_accessors(void **state) {
  schedfix *f = *state;
  slapo_sched *attn, *h, *x;
  OK(slapo_sched_at(f->sch, "transformer.h.0.attn", &attn));
  assert_string_equal(slapo_sched_path(attn), "transformer.h.0.attn");
  assert_string_equal(slapo_sched_name(attn), "attn");
  slapo_module *m;
  OK(slapo_module_at(f->model, "transformer.h.0.attn", &m));
  assert_ptr_equal(slapo_sched_module(attn), m);
  assert_int_equal(slapo_sched_n_children(attn), 4);
  assert_string_equal(slapo_sched_path(slapo_sched_child(attn, 1)), "transformer.h.0.attn.c_proj");
  assert_ptr_equal(slapo_sched_child_named(attn, "c_attn"), slapo_sched_child(attn, 0));
  assert_null(slapo_sched_child_named(attn, "nope"));
  assert_string_equal(slapo_sched_path(slapo_sched_parent(attn)), "transformer.h.0");
  assert_ptr_equal(slapo_sched_root(attn), f->sch);
  assert_null(slapo_sched_parent(f->sch));
  assert_string_equal(slapo_sched_path(f->sch), "");
  assert_ptr_equal(slapo_sched_module(f->sch), f->model);
  assert_ptr_equal(slapo_sched_log_of(attn), slapo_sched_log_of(f->sch));
  assert_int_equal(slapo_sched_log_count(slapo_sched_log_of(attn)), 0);

  /* Relative paths, "." and "" are the node itself, list indices. */
  OK(slapo_sched_at(f->sch, "transformer.h", &h));
  assert_int_equal(slapo_sched_n_children(h), 4);
  OK(slapo_sched_at(h, "2.mlp.c_fc", &x));
  assert_string_equal(slapo_sched_path(x), "transformer.h.2.mlp.c_fc");
  OK(slapo_sched_at(h, ".", &x));
  assert_ptr_equal(x, h);
  OK(slapo_sched_at(h, "", &x));
  assert_ptr_equal(x, h);
  OK(slapo_sched_at(f->sch, "lm_head", &x));
  assert_string_equal(slapo_sched_module(x)->type->name, "Linear");
}

static void test_not_found_messages(void **state) {
  schedfix *f = *state;
  slapo_sched *x = (slapo_sched *)1, *h;
  assert_int_equal(slapo_sched_at(f->sch, "transformer.h.7", &x), SLAPO_NOT_FOUND);
  assert_null(x);
  assert_string_equal(slapo_last_error(),
                      "no module 'transformer.h.7': 'transformer.h' has children 0, 1, 2, 3");
  assert_int_equal(slapo_sched_at(f->sch, "transformer.h.0.atn.c_proj", &x), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(), "no module 'transformer.h.0.atn.c_proj': "
                                          "'transformer.h.0' has children ln_1, attn, ln_2, mlp");
  assert_int_equal(slapo_sched_at(f->sch, "decoder", &x), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(),
                      "no module 'decoder': '.' has children transformer, lm_head");
  assert_int_equal(slapo_sched_at(f->sch, "lm_head.weight", &x), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(), "no module 'lm_head.weight': 'lm_head' has no children");
  /* From a node below the root, the message still gives full paths. */
  OK(slapo_sched_at(f->sch, "transformer.h", &h));
  assert_int_equal(slapo_sched_at(h, "9.mlp", &x), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(),
                      "no module 'transformer.h.9.mlp': 'transformer.h' has children 0, 1, 2, 3");
  /* Empty segments are a malformed path, not a missing module. */
  assert_int_equal(slapo_sched_at(f->sch, "transformer..h", &x), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "empty segment at column 13"));
  assert_int_equal(slapo_sched_at(f->sch, "transformer.", &x), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_sched_at(f->sch, ".transformer", &x), SLAPO_INVALID_ARG);
}

static void test_preorder_iteration(void **state) {
  schedfix *f = *state;
  size_t n_mod = count_modules(f->model);
  /* 3 top (root, transformer, lm_head) + 5 under transformer + 13 per block. */
  assert_int_equal(n_mod, 3 + 5 + 4 * 13);
  assert_int_equal(slapo_sched_count(f->sch), n_mod);
  char **paths = calloc(n_mod, sizeof *paths);
  size_t n = 0;
  module_preorder(f->model, paths, &n);
  size_t i = 0;
  for (slapo_sched *s = f->sch; s; s = slapo_sched_next(s, f->sch), i++) {
    assert_true(i < n_mod);
    assert_string_equal(slapo_sched_path(s), paths[i]);
  }
  assert_int_equal(i, n_mod);
  for (size_t k = 0; k < n; k++) free(paths[k]);
  free(paths);

  /* A subtree walk stops at the subtree's end. */
  slapo_sched *b1;
  OK(slapo_sched_at(f->sch, "transformer.h.1", &b1));
  i = 0;
  const char *last = NULL;
  for (slapo_sched *s = b1; s; s = slapo_sched_next(s, b1), i++) last = slapo_sched_path(s);
  assert_int_equal(i, 13);
  assert_int_equal(slapo_sched_count(b1), 13);
  assert_string_equal(last, "transformer.h.1.mlp.dropout");
  /* A leaf alone. */
  slapo_sched *leaf;
  OK(slapo_sched_at(f->sch, "lm_head", &leaf));
  assert_null(slapo_sched_next(leaf, leaf));
  /* The last node of the whole tree has no successor. */
  assert_null(slapo_sched_next(leaf, f->sch));
}

/* Replaces parent's child `name` by repl (consumed), freeing the old one:
 * what a replace primitive does to the module tree. */
static void swap_child(slapo_module *parent, const char *name, slapo_module *repl) {
  for (int i = 0; i < parent->n_children; i++) {
    if (strcmp(parent->children[i]->name, name)) continue;
    slapo_module *old = parent->children[i];
    slapo_free(repl->name);
    repl->name = slapo_strdup(name);
    assert_non_null(repl->name);
    repl->parent = parent;
    parent->children[i] = repl;
    slapo_module_free(old);
    return;
  }
  fail_msg("no child %s", name);
}

/* A ModuleList with children "a" (Linear) and "b" (ReLU). */
static slapo_module *small_list(void) {
  slapo_module *l, *lin, *relu;
  OK(slapo_modulelist_new(&l));
  OK(slapo_linear_new(128, 128, true, 0.02f, &lin));
  OK(slapo_module_add_child(l, "a", lin));
  OK(slapo_relu_new(&relu));
  OK(slapo_module_add_child(l, "b", relu));
  return l;
}

static void test_rebuild_after_swap(void **state) {
  schedfix *f = *state;
  slapo_sched *mlp, *block, *x;
  OK(slapo_sched_at(f->sch, "transformer.h.1.mlp", &mlp));
  OK(slapo_sched_at(f->sch, "transformer.h.1", &block));
  size_t before = slapo_sched_count(f->sch);
  swap_child(slapo_sched_module(block), "mlp", small_list());
  OK(slapo_sched_rebuild(mlp));
  /* Same handle, same path, the new module and its children. */
  slapo_sched *again;
  OK(slapo_sched_at(f->sch, "transformer.h.1.mlp", &again));
  assert_ptr_equal(again, mlp);
  assert_string_equal(slapo_sched_path(mlp), "transformer.h.1.mlp");
  assert_string_equal(slapo_sched_module(mlp)->type->name, "ModuleList");
  assert_int_equal(slapo_sched_n_children(mlp), 2);
  OK(slapo_sched_at(f->sch, "transformer.h.1.mlp.a", &x));
  assert_string_equal(slapo_sched_module(x)->type->name, "Linear");
  assert_ptr_equal(slapo_sched_parent(x), mlp);
  assert_int_equal(slapo_sched_count(f->sch), before - 4 + 2);
  assert_int_equal(slapo_sched_at(f->sch, "transformer.h.1.mlp.c_fc", &x), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(),
                      "no module 'transformer.h.1.mlp.c_fc': 'transformer.h.1.mlp' has "
                      "children a, b");
  /* Pre-order still walks into the new children and on to the next block. */
  x = slapo_sched_next(slapo_sched_child(mlp, 1), f->sch);
  assert_string_equal(slapo_sched_path(x), "transformer.h.2");

  /* Rebuilding the root re-reads everything; handles below become new. */
  OK(slapo_sched_rebuild(f->sch));
  assert_int_equal(slapo_sched_count(f->sch), count_modules(f->model));
}

static void test_rebuild_missing_module(void **state) {
  schedfix *f = *state;
  slapo_sched *attn;
  OK(slapo_sched_at(f->sch, "transformer.h.3.attn", &attn));
  slapo_module *block = slapo_sched_module(slapo_sched_parent(attn));
  /* Rename the module away under the schedule node. */
  slapo_module *m = slapo_module_child(block, "attn");
  slapo_free(m->name);
  m->name = slapo_strdup("attention");
  assert_int_equal(slapo_sched_rebuild(attn), SLAPO_NOT_FOUND);
  assert_string_equal(slapo_last_error(), "sched: cannot rebuild 'transformer.h.3.attn': module "
                                          "'transformer.h.3' has no child 'attn' any more");
  assert_int_equal(slapo_sched_n_children(attn), 4); /* unchanged */
  assert_ptr_equal(slapo_sched_module(attn), m);
}

static void test_print(void **state) {
  schedfix *f = *state;
  slapo_sched *mlp;
  OK(slapo_sched_at(f->sch, "transformer.h.0.mlp", &mlp));
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  slapo_sched_print(mlp, out);
  fclose(out);
  assert_string_equal(buf, "transformer.h.0.mlp  (GPT2MLP)\n"
                           "  transformer.h.0.mlp.c_fc  (Linear)\n"
                           "  transformer.h.0.mlp.act  (GELU)\n"
                           "  transformer.h.0.mlp.c_proj  (Linear)\n"
                           "  transformer.h.0.mlp.dropout  (Dropout)\n");
  free(buf);
}

/* A wide list: messages stay bounded, lists and walks grow as needed. */
static void test_wide_list(void **state) {
  (void)state;
  slapo_module *l;
  OK(slapo_modulelist_new(&l));
  for (int i = 0; i < 300; i++) {
    slapo_module *r;
    char name[16];
    OK(slapo_relu_new(&r));
    snprintf(name, sizeof name, "%d", i);
    OK(slapo_module_add_child(l, name, r));
  }
  slapo_sched *s, *x;
  OK(slapo_sched_create(l, &s));
  assert_int_equal(slapo_sched_count(s), 301);
  assert_int_equal(slapo_sched_at(s, "300", &x), SLAPO_NOT_FOUND);
  const char *msg = slapo_last_error();
  assert_non_null(strstr(msg, "no module '300': '.' has children 0, 1, 2, "));
  assert_string_equal(msg + strlen(msg) - 5, ", ...");
  OK(slapo_sched_at(s, "299", &x));
  assert_string_equal(slapo_sched_path(x), "299");
  slapo_sched_list sel;
  OK(slapo_sched_select(s, "{10..259}", &sel));
  assert_int_equal(sel.n, 250);
  assert_string_equal(slapo_sched_path(sel.items[249]), "259");
  slapo_sched_list_deinit(&sel);
  /* A range is checked at every index however wide. */
  assert_int_equal(slapo_sched_select(s, "{250..100000}", &sel), SLAPO_NO_MATCH);
  assert_string_equal(slapo_last_error(), "no module matches '{250..100000}' at indices "
                                          "300..100000 of the range {250..100000}: the model "
                                          "has '{250..299}' (every index of a range must "
                                          "match a module)");
  slapo_sched_free(s);
  slapo_module_free(l);
}

/* Indices missing inside a range: the message lists each gap and each run
 * of indices that match. */
static void test_range_gaps(void **state) {
  (void)state;
  slapo_module *l;
  OK(slapo_modulelist_new(&l));
  for (int i = 0; i < 8; i++) {
    if (i == 2 || i == 5 || i == 6) continue;
    slapo_module *r;
    char name[16];
    OK(slapo_relu_new(&r));
    snprintf(name, sizeof name, "%d", i);
    OK(slapo_module_add_child(l, name, r));
  }
  slapo_sched *s;
  OK(slapo_sched_create(l, &s));
  slapo_sched_list sel;
  OK(slapo_sched_select(s, "{3..4}", &sel));
  assert_int_equal(sel.n, 2);
  slapo_sched_list_deinit(&sel);
  assert_int_equal(slapo_sched_select(s, "{1..9}", &sel), SLAPO_NO_MATCH);
  assert_string_equal(slapo_last_error(), "no module matches '{1..9}' at indices 2, 5..6, 8..9 "
                                          "of the range {1..9}: the model has '{1, 3..4, 7}' "
                                          "(every index of a range must match a module)");
  assert_int_equal(slapo_sched_select(s, "{1..2}", &sel), SLAPO_NO_MATCH);
  assert_string_equal(slapo_last_error(), "no module matches '{1..2}' at index 2 of the range "
                                          "{1..2}: the model has '1' (every index of a range "
                                          "must match a module)");
  slapo_sched_free(s);
  slapo_module_free(l);
}

/* Every allocation failure during create and rebuild returns NOMEM and
 * leaks nothing; rebuild leaves the tree as it was. */
static void test_nomem(void **state) {
  schedfix *f = *state;
  long ok_create = -1;
  for (long k = 0; k < 10000 && ok_create < 0; k++) {
    failalloc_install(k);
    slapo_sched *s = NULL;
    slapo_status st = slapo_sched_create(f->model, &s);
    if (st == SLAPO_OK) {
      slapo_sched_free(s);
      ok_create = k;
    } else {
      assert_int_equal(st, SLAPO_NOMEM);
      assert_null(s);
    }
    assert_int_equal(failalloc_live(), 0);
    failalloc_uninstall();
  }
  assert_true(ok_create > 100); /* every node allocates */

  failalloc_install(-1);
  slapo_sched *s;
  OK(slapo_sched_create(f->model, &s));
  slapo_sched *block;
  OK(slapo_sched_at(s, "transformer.h.2", &block));
  size_t n = slapo_sched_count(s);
  failalloc_uninstall();
  for (long k = 0; k < 1000; k++) {
    failalloc_install(k); /* the k-th allocation from here on fails */
    slapo_status st = slapo_sched_rebuild(block);
    long live = failalloc_live();
    failalloc_uninstall();
    if (st == SLAPO_OK) break;
    assert_int_equal(st, SLAPO_NOMEM);
    assert_int_equal(live, 0);
    assert_int_equal(slapo_sched_count(s), n);
    assert_string_equal(slapo_sched_path(slapo_sched_child(block, 3)), "transformer.h.2.mlp");
  }
  failalloc_install(-1);
  slapo_sched_free(s);
  failalloc_uninstall();
}

#define SCHED_TEST(t) cmocka_unit_test_setup_teardown(t, schedfix_setup, schedfix_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      SCHED_TEST(test_at_and_accessors),
      SCHED_TEST(test_not_found_messages),
      SCHED_TEST(test_preorder_iteration),
      SCHED_TEST(test_rebuild_after_swap),
      SCHED_TEST(test_rebuild_missing_module),
      SCHED_TEST(test_print),
      cmocka_unit_test(test_wide_list),
      cmocka_unit_test(test_range_gaps),
      SCHED_TEST(test_nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
