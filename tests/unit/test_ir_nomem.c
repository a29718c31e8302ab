/* tests/unit/test_ir_nomem.c - allocation-failure sweep over the ir layer:
 * for k = 0, 1, 2, ... a script that uses every constructor and allocating
 * edit runs with allocation k and all later ones failing. Each call must
 * return SLAPO_OK or SLAPO_NOMEM; after a NOMEM the graph is unchanged (same
 * structural fingerprint) and lint-clean; after slapo_graph_free nothing is live.
 * The sweep ends when the whole script succeeds. A second sweep repeats it
 * with the arena's first block filled to different depths, so that arena
 * growth fails inside every constructor too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdbool.h>
#include <string.h>

#include "common/failalloc.h"
#include "slapo/ir.h"


/* FNV-1a over everything a failed call must leave alone: list order, names,
 * kinds, targets, inputs, user lists, attributes, metadata and origins.
 * Allocation-free, so it is cheap enough to take before every call. */
static uint64_t mix(uint64_t h, const void *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ULL;
  return h;
}
static uint64_t mix_str(uint64_t h, const char *s) { return mix(h, s, strlen(s) + 1); }
#define MIX(h, v) ((h) = mix((h), &(v), sizeof(v)))

static uint64_t fingerprint(const slapo_graph *g) {
  uint64_t h = 0xcbf29ce484222325ULL;
  int count = slapo_graph_count(g);
  MIX(h, count);
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    h = mix_str(h, n->name);
    h = mix_str(h, n->target);
    h = mix_str(h, n->origin);
    MIX(h, n->kind);
    MIX(h, n->n_inputs);
    for (int i = 0; i < n->n_inputs; i++) MIX(h, n->inputs[i]);
    MIX(h, n->n_users);
    for (int i = 0; i < n->n_users; i++) MIX(h, n->users[i]);
    MIX(h, n->n_attrs);
    MIX(h, n->attrs);
    MIX(h, n->n_results);
    MIX(h, n->item);
    MIX(h, n->dtype);
    MIX(h, n->ndim);
    h = mix(h, n->shape, sizeof n->shape);
    MIX(h, n->op_seq);
  }
  return h;
}

/* Runs one call; on failure it must be NOMEM with the graph unchanged, and
 * the script stops (every later allocation would fail too). */
#define STEP(expr)                                                             \
  do {                                                                         \
    uint64_t before_ = fingerprint(g);                                         \
    slapo_status s_ = (expr);                                                  \
    if (s_ != SLAPO_OK) {                                                      \
      assert_int_equal(s_, SLAPO_NOMEM);                                       \
      OK(slapo_graph_lint(g));                                                 \
      assert_true(fingerprint(g) == before_);                                  \
      return false;                                                            \
    }                                                                          \
  } while (0)

static bool script(slapo_graph *g) {
  int64_t xs[2] = {2, 3}, ws[2] = {3, 4}, ms[2] = {2, 4};
  slapo_node *x, *y, *w, *mm, *mod, *g0, *g1, *sum, *relu, *out;
  STEP(slapo_graph_add_placeholder(g, "x", SLAPO_DTYPE_F32, 2, xs, &x));
  STEP(slapo_graph_add_placeholder(g, "y", SLAPO_DTYPE_F32, 2, xs, &y));
  STEP(slapo_graph_add_param(g, "transformer.h.0.w", SLAPO_DTYPE_F32, 2, ws, &w));
  int64_t perm[3] = {0, 2, 1};
  slapo_attr attrs[4] = {slapo_attr_int("transpose_b", 1), slapo_attr_float("eps", 1e-5),
                         slapo_attr_str("mode", "fast"), slapo_attr_ints("perm", 3, perm)};
  slapo_node *in[2] = {x, w};
  STEP(slapo_graph_add_call_op(g, "matmul", NULL, 2, in, 4, attrs, &mm));
  STEP(slapo_node_set_meta(mm, SLAPO_DTYPE_F32, 2, ms));
  STEP(slapo_node_set_origin(mm, "transformer.h.0.mlp", 1));
  /* Six uses of x grow its user list past the first capacity; six "add"s
   * exercise the name-suffix counter. */
  slapo_node *add[6];
  for (int i = 0; i < 6; i++) {
    slapo_node *ai[2] = {i ? add[i - 1] : mm, x};
    STEP(slapo_graph_add_call_op(g, "add", NULL, 2, ai, 0, NULL, &add[i]));
  }
  STEP(slapo_graph_add_call_module(g, "h.0.mlp", 1, &add[5], &mod));
  STEP(slapo_node_set_n_results(mod, 2));
  STEP(slapo_graph_add_getitem(g, mod, 0, &g0));
  STEP(slapo_graph_add_getitem(g, mod, 1, &g1));
  slapo_node *gi[2] = {g0, g1};
  STEP(slapo_graph_add_call_op(g, "add", NULL, 2, gi, 0, NULL, &sum));
  slapo_graph_insert_before(g, mm);
  STEP(slapo_graph_add_call_op(g, "relu", NULL, 1, &x, 0, NULL, &relu));
  slapo_graph_insert_at_end(g);
  STEP(slapo_node_replace_all_uses(x, y)); /* y has no user list yet */
  STEP(slapo_node_set_input(add[0], 0, relu)); /* mm is now unused */
  STEP(slapo_graph_add_output(g, 1, &sum, &out));
  OK(slapo_graph_lint(g));
  OK(slapo_graph_erase(g, mm)); /* erase never allocates */
  assert_int_equal(slapo_graph_dce(g), 1); /* the param w */
  OK(slapo_graph_lint(g));
  assert_int_equal(slapo_graph_count(g), 14);
  return true;
}

/* One sweep over k with `pad` bytes taken from the graph's arena first, so
 * that the arena needs a new block at a different point of the script. */
static long sweep(size_t pad) {
  bool done = false;
  long k;
  for (k = 0; !done && k < 100000; k++) {
    failalloc_install(k);
    slapo_graph *g = NULL;
    slapo_status s = slapo_graph_new(&g);
    if (s == SLAPO_OK) {
      if (pad == 0 || slapo_arena_alloc(slapo_graph_arena(g), pad, 1)) done = script(g);
      OK(slapo_graph_lint(g));
    } else {
      assert_int_equal(s, SLAPO_NOMEM);
      assert_null(g);
    }
    slapo_graph_free(g);
    if (failalloc_live() != 0)
      fail_msg("pad %zu, fail_at %ld: %ld allocations leaked", pad, k, failalloc_live());
    failalloc_uninstall();
  }
  assert_true(done);
  return k - 1;
}

static void test_sweep(void **state) {
  (void)state;
  long points = sweep(0);
  print_message("ir nomem sweep: %ld allocation points\n", points);
  assert_true(points > 10);
}

/* The same with the arena's first block (4 KiB) ending at every 16 bytes. */
static void test_sweep_arena_boundaries(void **state) {
  (void)state;
  long total = 0;
  for (size_t pad = 16; pad <= 4096; pad += 16) total += sweep(pad);
  print_message("ir nomem sweep with padding: %ld runs\n", total);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sweep),
      cmocka_unit_test(test_sweep_arena_boundaries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
