/* tests/unit/test_sched_glob.c - glob selection over GPT-2 tiny (4 blocks):
 * '*', '**', '{a,b}', '{0..5}' and literals, alone and combined; results in
 * tree pre-order without duplicates; the NO_MATCH message naming the
 * nearest existing prefix, or the indices of a range that match nothing;
 * malformed globs with their columns. */
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


/* Selects `glob` below s and checks the paths, in order, against the
 * NULL-terminated `want`. */
static void expect(slapo_sched *s, const char *glob, const char *const *want) {
  slapo_sched_list l;
  slapo_status st = slapo_sched_select(s, glob, &l);
  if (st != SLAPO_OK) fail_msg("%s: %s", glob, slapo_last_error());
  size_t n = 0;
  while (want[n]) n++;
  for (size_t i = 0; i < l.n && i < n; i++)
    if (strcmp(slapo_sched_path(l.items[i]), want[i]))
      fail_msg("%s: item %zu is '%s', expected '%s'", glob, i, slapo_sched_path(l.items[i]),
               want[i]);
  if (l.n != n) fail_msg("%s: %zu matches, expected %zu", glob, l.n, n);
  slapo_sched_list_deinit(&l);
}

#define EXPECT(s, glob, ...) expect((s), (glob), (const char *const[]){__VA_ARGS__, NULL})

static void test_star(void **state) {
  schedfix *f = *state;
  EXPECT(f->sch, "transformer.h.*.mlp", "transformer.h.0.mlp", "transformer.h.1.mlp",
         "transformer.h.2.mlp", "transformer.h.3.mlp");
  EXPECT(f->sch, "transformer.h.1.mlp.c_*", "transformer.h.1.mlp.c_fc",
         "transformer.h.1.mlp.c_proj");
  EXPECT(f->sch, "*", "transformer", "lm_head");
  EXPECT(f->sch, "transformer.w*", "transformer.wte", "transformer.wpe");
  EXPECT(f->sch, "transformer.*e", "transformer.wte", "transformer.wpe");
  /* A literal path is a glob matching one node. */
  EXPECT(f->sch, "transformer.h.2.attn", "transformer.h.2.attn");
  EXPECT(f->sch, ".", "");
  EXPECT(f->sch, "", "");
}

static void test_range_and_alternatives(void **state) {
  schedfix *f = *state;
  EXPECT(f->sch, "transformer.h.{0..2}.attn", "transformer.h.0.attn", "transformer.h.1.attn",
         "transformer.h.2.attn");
  EXPECT(f->sch, "transformer.h.{0,3}.{ln_1,ln_2}", "transformer.h.0.ln_1",
         "transformer.h.0.ln_2", "transformer.h.3.ln_1", "transformer.h.3.ln_2");
  /* Alternatives are a set: order and repeats in the glob do not matter. */
  EXPECT(f->sch, "transformer.h.{3,0,3}.ln_1", "transformer.h.0.ln_1", "transformer.h.3.ln_1");
  /* A range that ends at the last block. */
  EXPECT(f->sch, "transformer.h.{2..3}", "transformer.h.2", "transformer.h.3");
  /* Pieces combine inside a segment; alternatives hold stars. */
  EXPECT(f->sch, "transformer.h.0.mlp.c_{fc,proj}", "transformer.h.0.mlp.c_fc",
         "transformer.h.0.mlp.c_proj");
  EXPECT(f->sch, "transformer.h.0.attn.{*_dropout,c_attn}", "transformer.h.0.attn.c_attn",
         "transformer.h.0.attn.attn_dropout", "transformer.h.0.attn.resid_dropout");
  EXPECT(f->sch, "transformer.{wte,h}", "transformer.wte", "transformer.h");
  EXPECT(f->sch, "transformer.h.{1..1}.{mlp,attn}.c_proj", "transformer.h.1.attn.c_proj",
         "transformer.h.1.mlp.c_proj");
  EXPECT(f->sch, "transformer.h.{1,{2..3}}", "transformer.h.1", "transformer.h.2",
         "transformer.h.3");
}

static void test_globstar(void **state) {
  schedfix *f = *state;
  EXPECT(f->sch, "**.c_proj", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_proj",
         "transformer.h.1.attn.c_proj", "transformer.h.1.mlp.c_proj",
         "transformer.h.2.attn.c_proj", "transformer.h.2.mlp.c_proj",
         "transformer.h.3.attn.c_proj", "transformer.h.3.mlp.c_proj");
  /* "**" alone: every node, the start node included (zero segments). */
  slapo_sched_list l;
  OK(slapo_sched_select(f->sch, "**", &l));
  assert_int_equal(l.n, slapo_sched_count(f->sch));
  size_t i = 0;
  for (slapo_sched *s = f->sch; s; s = slapo_sched_next(s, f->sch), i++)
    assert_ptr_equal(l.items[i], s);
  slapo_sched_list_deinit(&l);
  assert_int_equal(l.n, 0);
  assert_null(l.items);
  /* Several ways of matching one node give it once. */
  EXPECT(f->sch, "**.**.c_fc", "transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc",
         "transformer.h.2.mlp.c_fc", "transformer.h.3.mlp.c_fc");
  EXPECT(f->sch, "transformer.**.h", "transformer.h");
  EXPECT(f->sch, "transformer.h.**.{0,2}.ln_2", "transformer.h.0.ln_2", "transformer.h.2.ln_2");
  EXPECT(f->sch, "**.h.*", "transformer.h.0", "transformer.h.1", "transformer.h.2",
         "transformer.h.3");
  EXPECT(f->sch, "transformer.h.3.mlp.**", "transformer.h.3.mlp", "transformer.h.3.mlp.c_fc",
         "transformer.h.3.mlp.act", "transformer.h.3.mlp.c_proj", "transformer.h.3.mlp.dropout");
}

static void test_relative(void **state) {
  schedfix *f = *state;
  slapo_sched *h;
  OK(slapo_sched_at(f->sch, "transformer.h", &h));
  EXPECT(h, "*.attn", "transformer.h.0.attn", "transformer.h.1.attn", "transformer.h.2.attn",
         "transformer.h.3.attn");
  EXPECT(h, "{1..2}.mlp.act", "transformer.h.1.mlp.act", "transformer.h.2.mlp.act");
  EXPECT(h, ".", "transformer.h");
}

static void no_match(slapo_sched *s, const char *glob, const char *msg) {
  slapo_sched_list l = {0};
  assert_int_equal(slapo_sched_select(s, glob, &l), SLAPO_NO_MATCH);
  assert_int_equal(l.n, 0);
  assert_null(l.items);
  assert_string_equal(slapo_last_error(), msg);
}

static void test_no_match(void **state) {
  schedfix *f = *state;
  no_match(f->sch, "transformer.h.*.mlpx",
           "no module matches 'transformer.h.*.mlpx': the nearest existing prefix is "
           "'transformer.h.0' (matching 'transformer.h.*'), which has children ln_1, attn, "
           "ln_2, mlp");
  no_match(f->sch, "transformer.h.{4..9}.attn",
           "no module matches 'transformer.h.{4..9}.attn': the nearest existing prefix is "
           "'transformer.h' (matching 'transformer.h'), which has children 0, 1, 2, 3");
  /* A range that overshoots in part is an error too (it silently matched
   * the blocks that exist), naming the indices missed and those that match. */
  no_match(f->sch, "transformer.h.{2..100}",
           "no module matches 'transformer.h.{2..100}' at indices 4..100 of the range "
           "{2..100}: the model has 'transformer.h.{2..3}' (every index of a range must match "
           "a module)");
  no_match(f->sch, "transformer.h.{0..4}.mlp",
           "no module matches 'transformer.h.{0..4}.mlp' at index 4 of the range {0..4}: the "
           "model has 'transformer.h.{0..3}.mlp' (every index of a range must match a module)");
  no_match(f->sch, "**.{3..5}.attn.c_proj",
           "no module matches '**.{3..5}.attn.c_proj' at indices 4..5 of the range {3..5}: the "
           "model has '**.3.attn.c_proj' (every index of a range must match a module)");
  no_match(f->sch, "decoder.**",
           "no module matches 'decoder.**': the nearest existing prefix is '.', which has "
           "children transformer, lm_head");
  no_match(f->sch, "**.c_fc.weight",
           "no module matches '**.c_fc.weight': the nearest existing prefix is "
           "'transformer.h.0.mlp.c_fc' (matching '**.c_fc'), which has no children");
  slapo_sched *h;
  OK(slapo_sched_at(f->sch, "transformer.h", &h));
  no_match(h, "{1..5}.ln_1",
           "no module matches '{1..5}.ln_1' below 'transformer.h' at indices 4..5 of the range "
           "{1..5}: the model has '{1..3}.ln_1' (every index of a range must match a module)");
  no_match(h, "*.mlp.fc",
           "no module matches '*.mlp.fc' below 'transformer.h': the nearest existing prefix "
           "is 'transformer.h.0.mlp' (matching '*.mlp'), which has children c_fc, act, c_proj, "
           "dropout");
}

static void malformed(slapo_sched *s, const char *glob, const char *msg) {
  slapo_sched_list l = {0};
  assert_int_equal(slapo_sched_select(s, glob, &l), SLAPO_PARSE);
  assert_int_equal(l.n, 0);
  assert_null(l.items);
  assert_string_equal(slapo_last_error(), msg);
}

static void test_malformed(void **state) {
  schedfix *f = *state;
  malformed(f->sch, "transformer.h.{0..",
            "glob 'transformer.h.{0..': column 19: bad range: expected an integer after '..', "
            "got end of glob");
  malformed(f->sch, "transformer.h.{0,1",
            "glob 'transformer.h.{0,1': column 15: expected '}' to close this '{', got end of "
            "glob");
  malformed(f->sch, "h.{0..x}",
            "glob 'h.{0..x}': column 7: bad range: expected an integer after '..', got 'x'");
  malformed(f->sch, "h.{5..2}",
            "glob 'h.{5..2}': column 7: bad range {5..2}: expected an end >= the start 5");
  malformed(f->sch, "h.{0..5..2}",
            "glob 'h.{0..5..2}': column 8: bad range: expected '}' after '{0..5', got '.'");
  malformed(f->sch, "h.{a..b}",
            "glob 'h.{a..b}': column 5: bad range: expected an integer before '..', got 'a'");
  malformed(f->sch, "h.{ln_1.x}",
            "glob 'h.{ln_1.x}': column 8: expected ',' or '}', got '.' (alternatives in braces "
            "are single segments)");
  malformed(f->sch, "transformer..h",
            "glob 'transformer..h': column 13: expected a segment, got '.' (empty segment)");
  malformed(f->sch, "transformer.",
            "glob 'transformer.': column 13: expected a segment, got end of glob (trailing '.')");
  malformed(f->sch, "h.a**",
            "glob 'h.a**': column 4: expected '**' to be a whole segment, got it next to other "
            "text");
  malformed(f->sch, "h.0}", "glob 'h.0}': column 4: expected a segment, got '}' without a "
                            "matching '{'");
  malformed(f->sch, "h.{}", "glob 'h.{}': column 3: expected alternatives inside '{}', got '}'");
  malformed(f->sch, "h.0,1", "glob 'h.0,1': column 4: expected a segment, got ',' outside "
                             "braces (write {a,b})");
  malformed(f->sch, "h. 0", "glob 'h. 0': column 3: expected a segment, got a space");
  malformed(f->sch, "h.{0..1234567890123456789}",
            "glob 'h.{0..1234567890123456789}': column 7: range bound has more than 18 digits");
}

static void test_nomem(void **state) {
  schedfix *f = *state;
  for (long k = 0;; k++) {
    failalloc_install(k);
    slapo_sched_list l;
    slapo_status st = slapo_sched_select(f->sch, "transformer.h.{0..3}.{attn,mlp}.c_*", &l);
    size_t n = l.n;
    slapo_sched_list_deinit(&l);
    long live = failalloc_live();
    failalloc_uninstall();
    assert_int_equal(live, 0);
    if (st == SLAPO_OK) {
      assert_int_equal(n, 16); /* c_attn, c_proj, c_fc, c_proj per block */
      break;
    }
    assert_int_equal(st, SLAPO_NOMEM);
    assert_int_equal(n, 0);
  }
}

#define SCHED_TEST(t) cmocka_unit_test_setup_teardown(t, schedfix_setup, schedfix_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      SCHED_TEST(test_star),
      SCHED_TEST(test_range_and_alternatives),
      SCHED_TEST(test_globstar),
      SCHED_TEST(test_relative),
      SCHED_TEST(test_no_match),
      SCHED_TEST(test_malformed),
      SCHED_TEST(test_nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
