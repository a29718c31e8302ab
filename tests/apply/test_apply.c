/* tests/apply/test_apply.c - slapo_apply_schedule on a tiny GPT-2: a parsed
 * schedule with globs expands to numbered steps in tree order; disabled
 * step numbers are skipped and only applied steps reach the log; `upto`
 * stops after a step; an error at step k names the file:line and leaves the
 * steps before k applied (and nothing after). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "primitives/prim_test.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

/* Steps 1-2: the attentions; 3-4: the MLPs; 5-6: the embeddings; 7: h. */
static const char k_text[] =
    "# a schedule with globs\n"
    "transformer.h.*.attn        replace     FlashAttention\n"
    "\n"
    "transformer.h.{0..1}.mlp    checkpoint\n"
    "transformer.w{te,pe}        annotate    weight weight_decay=0   # embeddings\n"
    "transformer.h               checkpoint  ratio=0.5\n";

typedef struct fixture {
  slapo_module *m;
  slapo_sched *root;
  slapo_sched_log *log;
} fixture;

static void fixture_init(fixture *f, const char *text) {
  f->m = pt_model(&k_tiny);
  OK(slapo_sched_create(f->m, &f->root));
  OK(slapo_sched_parse(text, "g.sched", &f->log));
}

static void fixture_deinit(fixture *f) {
  slapo_sched_log_free(f->log);
  slapo_sched_free(f->root);
  slapo_module_free(f->m);
}

static const char *type_at(slapo_sched *root, const char *path) {
  slapo_sched *n;
  OK(slapo_sched_at(root, path, &n));
  return slapo_sched_module(n)->type->name;
}

/* The applied log, spaces collapsed, without its header line. */
static char *log_lines(slapo_sched *root) {
  char *raw = pt_capture(pt_print_log, slapo_sched_log_of(root));
  char *c = pt_collapse(raw);
  free(raw);
  char *nl = strchr(c, '\n');
  char *body = strdup(nl ? nl + 1 : "");
  free(c);
  return body;
}

static void test_glob_expansion_numbers(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, k_text);
  slapo_sched_steps steps = {0};
  OK(slapo_sched_expand(f.log, f.root, &steps));
  struct {
    const char *path, *prim;
    int line;
  } want[] = {
      {"transformer.h.0.attn", "replace", 2},    {"transformer.h.1.attn", "replace", 2},
      {"transformer.h.0.mlp", "checkpoint", 4},  {"transformer.h.1.mlp", "checkpoint", 4},
      {"transformer.wte", "annotate", 5},        {"transformer.wpe", "annotate", 5},
      {"transformer.h", "checkpoint", 6},
  };
  assert_int_equal(steps.n, 7);
  for (size_t i = 0; i < steps.n; i++) {
    assert_int_equal(steps.items[i].number, i + 1);
    assert_string_equal(steps.items[i].path, want[i].path);
    assert_string_equal(steps.items[i].entry->primitive, want[i].prim);
    assert_string_equal(steps.items[i].entry->file, "g.sched");
    assert_int_equal(steps.items[i].entry->line, want[i].line);
  }
  slapo_sched_steps_deinit(&steps);

  size_t n = 99;
  OK(slapo_apply_schedule(f.root, f.log, NULL, 0, 0, &n));
  assert_int_equal(n, 7);
  assert_string_equal(type_at(f.root, "transformer.h.0.attn"), "FlashAttention");
  assert_string_equal(type_at(f.root, "transformer.h.1.attn"), "FlashAttention");
  /* One log line per step, concrete paths, each with its source line. */
  const slapo_sched_log *log = slapo_sched_log_of(f.root);
  assert_int_equal(slapo_sched_log_count(log), 7);
  for (size_t i = 0; i < 7; i++) {
    const slapo_sched_entry *e = slapo_sched_log_entry(log, i);
    assert_string_equal(e->path, want[i].path);
    assert_string_equal(e->file, "g.sched");
    assert_int_equal(e->line, want[i].line);
  }
  char *lines = log_lines(f.root);
  assert_string_equal(lines, "transformer.h.0.attn replace FlashAttention\n"
                             "transformer.h.1.attn replace FlashAttention\n"
                             "transformer.h.0.mlp checkpoint\n"
                             "transformer.h.1.mlp checkpoint\n"
                             "transformer.wte annotate weight weight_decay=0\n"
                             "transformer.wpe annotate weight weight_decay=0\n"
                             "transformer.h checkpoint ratio=0.5\n");
  free(lines);
  char *ck = pt_capture(pt_print_ckpt, f.m);
  assert_string_equal(ck, "transformer.h.0\ntransformer.h.0.mlp\ntransformer.h.1.mlp\n");
  free(ck);
  fixture_deinit(&f);
}

static void test_disabled_steps_are_skipped(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, k_text);
  const size_t off[3] = {2, 3, 7};
  size_t n = 0;
  OK(slapo_apply_schedule(f.root, f.log, off, 3, 0, &n));
  assert_int_equal(n, 4);
  assert_string_equal(type_at(f.root, "transformer.h.0.attn"), "FlashAttention");
  assert_string_equal(type_at(f.root, "transformer.h.1.attn"), "GPT2Attention");
  char *lines = log_lines(f.root);
  assert_string_equal(lines, "transformer.h.0.attn replace FlashAttention\n"
                             "transformer.h.1.mlp checkpoint\n"
                             "transformer.wte annotate weight weight_decay=0\n"
                             "transformer.wpe annotate weight weight_decay=0\n");
  free(lines);
  char *ck = pt_capture(pt_print_ckpt, f.m);
  assert_string_equal(ck, "transformer.h.1.mlp\n");
  free(ck);
  /* The applied lines replay to the same schedule. */
  pt_expect_replays(f.root, &k_tiny);
  fixture_deinit(&f);
}

static void test_upto_stops_after_step(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, k_text);
  size_t n = 0;
  OK(slapo_apply_schedule(f.root, f.log, NULL, 0, 3, &n));
  assert_int_equal(n, 3);
  char *lines = log_lines(f.root);
  assert_string_equal(lines, "transformer.h.0.attn replace FlashAttention\n"
                             "transformer.h.1.attn replace FlashAttention\n"
                             "transformer.h.0.mlp checkpoint\n");
  free(lines);
  fixture_deinit(&f);
  /* upto counts step numbers, disabled ones included. */
  fixture_init(&f, k_text);
  const size_t off[1] = {1};
  OK(slapo_apply_schedule(f.root, f.log, off, 1, 2, &n));
  assert_int_equal(n, 1);
  lines = log_lines(f.root);
  assert_string_equal(lines, "transformer.h.1.attn replace FlashAttention\n");
  free(lines);
  fixture_deinit(&f);
}

/* Step 5 checkpoints h.0.mlp a second time: STATE, with line 4's location;
 * steps 1-4 stay applied, step 6 does not run. */
static void test_error_at_step_keeps_earlier_steps(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, "transformer.h.*.attn replace FlashAttention\n"
                   "transformer.h.{0..1}.mlp checkpoint\n"
                   "\n"
                   "transformer.h.0.mlp checkpoint\n"
                   "transformer.wte annotate weight weight_decay=0\n");
  size_t n = 99;
  PT_EXPECT_ERROR(slapo_apply_schedule(f.root, f.log, NULL, 0, 0, &n), SLAPO_STATE,
                  "g.sched:4: ", "transformer.h.0.mlp is already checkpointed");
  assert_true(!strncmp(slapo_last_error(), "g.sched:4: ", 11));
  assert_int_equal(n, 4);
  assert_int_equal(slapo_sched_log_count(slapo_sched_log_of(f.root)), 4);
  assert_string_equal(type_at(f.root, "transformer.h.1.attn"), "FlashAttention");
  char *ck = pt_capture(pt_print_ckpt, f.m);
  assert_string_equal(ck, "transformer.h.0.mlp\ntransformer.h.1.mlp\n");
  free(ck);
  slapo_sched *wte;
  OK(slapo_sched_at(f.root, "transformer.wte", &wte));
  assert_null(slapo_module_param(slapo_sched_module(wte), "weight")->tags);
  fixture_deinit(&f);
}

/* An unknown primitive and a factory error: file:line of the failing line. */
static void test_error_messages_name_file_and_line(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, "transformer.h.0 checkpoint\ntransformer.h.1 frobnicate x=1\n");
  size_t n = 0;
  PT_EXPECT_ERROR(slapo_apply_schedule(f.root, f.log, NULL, 0, 0, &n), SLAPO_NOT_FOUND,
                  "g.sched:2: ", "unknown primitive 'frobnicate'", "checkpoint");
  assert_int_equal(n, 1);
  fixture_deinit(&f);
  fixture_init(&f, "transformer.h.*.attn replace FlashAttention\n"
                   "transformer.h.1.mlp.c_fc replace FlashAttention\n");
  PT_EXPECT_ERROR(slapo_apply_schedule(f.root, f.log, NULL, 0, 0, &n), SLAPO_INVALID_ARG,
                  "g.sched:2: ", "transformer.h.1.mlp.c_fc", "got Linear");
  assert_int_equal(n, 2);
  assert_int_equal(slapo_sched_log_count(slapo_sched_log_of(f.root)), 2);
  fixture_deinit(&f);
}

/* A glob matching nothing fails during expansion: nothing is applied. */
static void test_expansion_error_applies_nothing(void **state) {
  (void)state;
  fixture f;
  fixture_init(&f, "transformer.h.0 checkpoint\ntransformer.h.7.attn replace FlashAttention\n");
  pt_snap s;
  pt_snap_take(f.root, &s);
  size_t n = 99;
  PT_EXPECT_ERROR(slapo_apply_schedule(f.root, f.log, NULL, 0, 0, &n), SLAPO_NO_MATCH,
                  "g.sched:2: ", "transformer.h.7.attn");
  assert_int_equal(n, 0);
  pt_snap_expect_same(f.root, &s);
  fixture_deinit(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_glob_expansion_numbers),
      cmocka_unit_test(test_disabled_steps_are_skipped),
      cmocka_unit_test(test_upto_stops_after_step),
      cmocka_unit_test(test_error_at_step_keeps_earlier_steps),
      cmocka_unit_test(test_error_messages_name_file_and_line),
      cmocka_unit_test(test_expansion_error_applies_nothing),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
