/* tests/unit/test_sched_parse.c - the `.sched` grammar (comments, blank
 * lines, CRLF, quoting and escapes, numbers, booleans, words, the
 * not-replayable marker), the printer (DESIGN.md §7 layout) and the round
 * trip print -> parse -> print, entries appended from C, argument
 * accessors, expansion against GPT-2 tiny with numbering and file:line,
 * reading files, and allocation failures while parsing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/failalloc.h"
#include "slapo/models.h"
#include "slapo/schedule.h"


/* The example of DESIGN.md §7, as the printer writes it. */
static const char k_design[] =
    "# path-or-glob        primitive    arguments\n"
    "transformer.h.*.attn  replace      FlashAttention\n"
    "transformer.h.*.mlp   trace        flatten=true\n"
    "transformer.h.*.mlp   fuse         pattern=bias_gelu compiler=cc name=FusedBiasGeLU\n"
    "transformer.h         checkpoint   ratio=0.5\n";

static char *print_log(const slapo_sched_log *log) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  slapo_sched_log_print(log, f);
  fclose(f);
  return buf;
}

static const slapo_sched_entry *entry(const slapo_sched_log *log, size_t i) {
  assert_true(i < slapo_sched_log_count(log));
  return slapo_sched_log_entry(log, i);
}

static void test_grammar(void **state) {
  (void)state;
  const char *text =
      "# a comment line\n"
      "\n"
      "   \t  \n"
      "transformer.h.*.attn   replace   FlashAttention   # trailing comment\n"
      "\ttransformer.h.0.mlp\tshard\tc_fc.weight axis=0 group=-1\r\n"
      "h.{0..3}.mlp fuse pattern=bias_gelu compiler=cc name=\"Fused \\\"Bias\\\" \\\\GeLU\"\n"
      "transformer.h checkpoint ratio=0.5 exp=-2.5E+3 tiny=1e-5 on=true off=false n=+7\n"
      ". annotate note=\"# not a comment = fine\" \"positional string\" 42 3.0 false\n"
      "lm_head replace MyHead  # not replayable\n"
      "lm_head trace";
  slapo_sched_log *log;
  OK(slapo_sched_parse(text, "m.sched", &log));
  assert_int_equal(slapo_sched_log_count(log), 7);

  const slapo_sched_entry *e = entry(log, 0);
  assert_string_equal(e->path, "transformer.h.*.attn");
  assert_string_equal(e->primitive, "replace");
  assert_string_equal(e->file, "m.sched");
  assert_int_equal(e->line, 4);
  assert_true(e->replayable);
  assert_int_equal(e->n_args, 1);
  assert_null(e->args[0].key);
  assert_int_equal(e->args[0].kind, SLAPO_SCHED_ARG_WORD);
  assert_string_equal(e->args[0].text, "FlashAttention");

  e = entry(log, 1); /* tabs and CRLF */
  assert_int_equal(e->line, 5);
  assert_string_equal(e->path, "transformer.h.0.mlp");
  assert_int_equal(e->n_args, 3);
  assert_string_equal(e->args[0].text, "c_fc.weight");
  assert_int_equal(e->args[0].kind, SLAPO_SCHED_ARG_WORD);
  assert_string_equal(e->args[1].key, "axis");
  assert_int_equal(e->args[1].kind, SLAPO_SCHED_ARG_INT);
  assert_int_equal(e->args[1].i, 0);
  assert_int_equal(e->args[2].i, -1);

  e = entry(log, 2); /* escapes */
  assert_int_equal(e->args[2].kind, SLAPO_SCHED_ARG_STRING);
  assert_string_equal(e->args[2].key, "name");
  assert_string_equal(e->args[2].text, "Fused \"Bias\" \\GeLU");

  e = entry(log, 3); /* numbers and booleans */
  assert_int_equal(e->n_args, 6);
  assert_int_equal(e->args[0].kind, SLAPO_SCHED_ARG_FLOAT);
  assert_string_equal(e->args[0].text, "0.5");
  assert_true(e->args[0].f == 0.5);
  assert_int_equal(e->args[1].kind, SLAPO_SCHED_ARG_FLOAT);
  assert_true(e->args[1].f == -2500.0);
  assert_true(e->args[2].f == 1e-5);
  assert_int_equal(e->args[3].kind, SLAPO_SCHED_ARG_BOOL);
  assert_true(e->args[3].b);
  assert_false(e->args[4].b);
  assert_int_equal(e->args[5].kind, SLAPO_SCHED_ARG_INT);
  assert_int_equal(e->args[5].i, 7);
  assert_string_equal(e->args[5].text, "+7");

  e = entry(log, 4); /* root path, '#' and '=' inside strings, positional kinds */
  assert_string_equal(e->path, ".");
  assert_string_equal(e->args[0].text, "# not a comment = fine");
  assert_null(e->args[1].key);
  assert_int_equal(e->args[1].kind, SLAPO_SCHED_ARG_STRING);
  assert_int_equal(e->args[2].kind, SLAPO_SCHED_ARG_INT);
  assert_int_equal(e->args[3].kind, SLAPO_SCHED_ARG_FLOAT);
  assert_string_equal(e->args[3].text, "3.0");
  assert_int_equal(e->args[4].kind, SLAPO_SCHED_ARG_BOOL);

  e = entry(log, 5); /* the marker comment */
  assert_false(e->replayable);
  assert_int_equal(e->line, 9);
  slapo_sched_log_free(log);

  /* The last line, without a newline, still counts. */
  OK(slapo_sched_parse(text, NULL, &log));
  assert_int_equal(slapo_sched_log_count(log), 7);
  slapo_sched_log_free(log);
  OK(slapo_sched_parse("lm_head trace", NULL, &log));
  assert_string_equal(entry(log, 0)->file, "<string>");
  assert_int_equal(entry(log, 0)->line, 1);
  assert_int_equal(entry(log, 0)->n_args, 0);
  slapo_sched_log_free(log);
  /* Empty text and comments only: an empty log. */
  OK(slapo_sched_parse("", "e.sched", &log));
  assert_int_equal(slapo_sched_log_count(log), 0);
  slapo_sched_log_free(log);
  OK(slapo_sched_parse("# only\n\n# comments\n", "e.sched", &log));
  assert_int_equal(slapo_sched_log_count(log), 0);
  slapo_sched_log_free(log);
}

static void test_print_design_example(void **state) {
  (void)state;
  /* Unaligned input prints as the aligned DESIGN.md example. */
  const char *loose = "transformer.h.*.attn replace FlashAttention\n"
                      "transformer.h.*.mlp trace flatten=true\n"
                      "transformer.h.*.mlp fuse pattern=bias_gelu compiler=cc "
                      "name=FusedBiasGeLU\n"
                      "transformer.h checkpoint ratio=0.5\n";
  slapo_sched_log *log;
  OK(slapo_sched_parse(loose, "d.sched", &log));
  char *out = print_log(log);
  assert_string_equal(out, k_design);
  free(out);
  slapo_sched_log_free(log);
}

static void round_trip(const char *text) {
  slapo_sched_log *a, *b;
  OK(slapo_sched_parse(text, "a.sched", &a));
  char *pa = print_log(a);
  OK(slapo_sched_parse(pa, "b.sched", &b));
  char *pb = print_log(b);
  assert_string_equal(pa, pb);
  assert_int_equal(slapo_sched_log_count(a), slapo_sched_log_count(b));
  for (size_t i = 0; i < slapo_sched_log_count(a); i++) {
    const slapo_sched_entry *x = entry(a, i), *y = entry(b, i);
    assert_string_equal(x->path, y->path);
    assert_string_equal(x->primitive, y->primitive);
    assert_int_equal(x->replayable, y->replayable);
    assert_int_equal(x->n_args, y->n_args);
    for (int j = 0; j < x->n_args; j++) {
      assert_int_equal(x->args[j].kind, y->args[j].kind);
      assert_string_equal(x->args[j].text, y->args[j].text);
      assert_true(x->args[j].f == y->args[j].f || x->args[j].f != x->args[j].f);
    }
  }
  free(pa);
  free(pb);
  slapo_sched_log_free(a);
  slapo_sched_log_free(b);
}

static void test_round_trip(void **state) {
  (void)state;
  round_trip(k_design);
  round_trip("# c\n"
             "transformer.h.{0,3}.{ln_1,ln_2}   annotate  k=\"a \\\"b\\\" \\\\ c\" n=0.50 e=1E5\n"
             "**.c_proj shard weight axis=1\n"
             ". checkpoint\n"
             "lm_head replace MyHead # not replayable\n"
             "lm_head trace flatten=false \"#\" -3\n");
}

static void test_append_from_c(void **state) {
  (void)state;
  slapo_sched_log *log;
  OK(slapo_sched_log_new(&log));
  char path[] = "transformer.h.0.mlp"; /* the log copies: change it afterwards */
  slapo_sched_arg args[] = {
      slapo_sched_arg_word(NULL, "FusedMLP"),     slapo_sched_arg_float("ratio", 0.1),
      slapo_sched_arg_float("one", 1.0),          slapo_sched_arg_float("small", 1e-7),
      slapo_sched_arg_int("axis", -3),            slapo_sched_arg_bool("flatten", true),
      slapo_sched_arg_string("note", "say \"hi\" \\ ok"),
  };
  slapo_sched_entry e = {.path = path, .primitive = "replace", .n_args = 7, .args = args,
                         .file = "user.c", .line = 12, .replayable = true};
  OK(slapo_sched_log_append(log, &e));
  path[0] = 'X';
  slapo_sched_entry root = {.path = "", .primitive = "checkpoint", .replayable = false};
  OK(slapo_sched_log_append(log, &root));
  const slapo_sched_entry *d = entry(log, 0);
  assert_string_equal(d->path, "transformer.h.0.mlp");
  assert_string_equal(d->file, "user.c");
  assert_int_equal(d->line, 12);
  assert_string_equal(d->args[1].text, "0.1");
  assert_string_equal(d->args[2].text, "1.0");
  assert_string_equal(d->args[3].text, "1e-07");
  assert_string_equal(d->args[4].text, "-3");
  assert_true(d->args[4].f == -3.0);
  assert_string_equal(d->args[5].text, "true");
  assert_string_equal(entry(log, 1)->path, ".");
  char *out = print_log(log);
  assert_string_equal(out,
                      "# path-or-glob       primitive    arguments\n"
                      "transformer.h.0.mlp  replace      FusedMLP ratio=0.1 one=1.0 small=1e-07 "
                      "axis=-3 flatten=true note=\"say \\\"hi\\\" \\\\ ok\"\n"
                      ".                    checkpoint  # not replayable\n");
  /* The printed text reads back to the same values. */
  slapo_sched_log *back;
  OK(slapo_sched_parse(out, "p.sched", &back));
  const slapo_sched_entry *b = entry(back, 0);
  assert_true(b->args[1].f == 0.1);
  assert_true(b->args[3].f == 1e-7);
  assert_string_equal(b->args[6].text, "say \"hi\" \\ ok");
  assert_false(entry(back, 1)->replayable);
  char *again = print_log(back);
  assert_string_equal(again, out);
  free(again);
  free(out);
  slapo_sched_log_free(back);

  /* Entries that could not be read back are refused; the log is unchanged. */
  struct {
    slapo_sched_arg arg;
    const char *path, *prim, *msg;
  } bad[] = {
      {slapo_sched_arg_word("w", "true"), "h", "p", "would not read back as the word given"},
      {slapo_sched_arg_word("w", "3"), "h", "p", "would not read back as the word given"},
      {slapo_sched_arg_word("w", "a b"), "h", "p", "cannot be a bare word"},
      {slapo_sched_arg_word(NULL, ""), "h", "p", "empty word"},
      {slapo_sched_arg_float("f", 1.0 / 0.0), "h", "p", "not a finite number"},
      {slapo_sched_arg_string("s", "line\nbreak"), "h", "p", "control character"},
      {slapo_sched_arg_int("bad key", 1), "h", "p", "bad key 'bad key'"},
      {slapo_sched_arg_int("k", 1), "h", "bad-name", "bad primitive name 'bad-name'"},
      {slapo_sched_arg_int("k", 1), "h.{0..", "p", "bad path or glob 'h.{0..': column 7"},
      {slapo_sched_arg_int("k", 1), "a b", "p", "bad path or glob 'a b': column 2"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    slapo_sched_entry x = {.path = bad[i].path, .primitive = bad[i].prim, .n_args = 1,
                           .args = &bad[i].arg, .replayable = true};
    assert_int_equal(slapo_sched_log_append(log, &x), SLAPO_INVALID_ARG);
    if (!strstr(slapo_last_error(), bad[i].msg))
      fail_msg("case %zu: '%s' lacks '%s'", i, slapo_last_error(), bad[i].msg);
  }
  slapo_sched_arg twice[] = {slapo_sched_arg_int("k", 1), slapo_sched_arg_int("k", 2)};
  slapo_sched_entry x = {.path = "h", .primitive = "p", .n_args = 2, .args = twice};
  assert_int_equal(slapo_sched_log_append(log, &x), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "key 'k' given twice"));
  slapo_sched_arg wrong_text = {
      .key = "r", .kind = SLAPO_SCHED_ARG_FLOAT, .text = "0.25", .f = 0.5};
  x = (slapo_sched_entry){.path = "h", .primitive = "p", .n_args = 1, .args = &wrong_text};
  assert_int_equal(slapo_sched_log_append(log, &x), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_sched_log_count(log), 2);
  slapo_sched_log_free(log);
}

static void test_accessors(void **state) {
  (void)state;
  slapo_sched_log *log;
  OK(slapo_sched_parse("# accessors\n"
                       "h.0 shard weight bias axis=1 ratio=0.5 whole=2 on=true cc=cc s=\"x y\"\n"
                       "h.1 checkpoint ratio=abc axis=0.5 on=1 name=3\n",
                       "m.sched", &log));
  const slapo_sched_entry *e = entry(log, 0), *bad = entry(log, 1);
  int64_t i = -7;
  double f = -1;
  bool b = false;
  const char *s = NULL;
  OK(slapo_sched_entry_get_int(e, "axis", true, &i));
  assert_int_equal(i, 1);
  OK(slapo_sched_entry_get_float(e, "ratio", true, &f));
  assert_true(f == 0.5);
  OK(slapo_sched_entry_get_float(e, "whole", true, &f)); /* an integer is a number */
  assert_true(f == 2.0);
  OK(slapo_sched_entry_get_bool(e, "on", true, &b));
  assert_true(b);
  OK(slapo_sched_entry_get_string(e, "cc", true, &s));
  assert_string_equal(s, "cc");
  OK(slapo_sched_entry_get_string(e, "s", true, &s));
  assert_string_equal(s, "x y");
  assert_string_equal(slapo_sched_entry_positional(e, 0)->text, "weight");
  assert_string_equal(slapo_sched_entry_positional(e, 1)->text, "bias");
  assert_null(slapo_sched_entry_positional(e, 2));
  assert_null(slapo_sched_entry_find(e, "nope"));
  /* Optional and absent: OK, the default stays. */
  i = 42;
  OK(slapo_sched_entry_get_int(e, "group", false, &i));
  assert_int_equal(i, 42);
  /* Required and absent. */
  assert_int_equal(slapo_sched_entry_get_int(e, "group", true, &i), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:2: shard: missing argument 'group' (expected group=<integer>)");
  /* Wrong kinds. */
  assert_int_equal(slapo_sched_entry_get_float(bad, "ratio", true, &f), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:3: checkpoint: ratio=abc: expected a number, got 'abc'");
  assert_int_equal(slapo_sched_entry_get_int(bad, "axis", false, &i), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:3: checkpoint: axis=0.5: expected an integer, got '0.5'");
  assert_int_equal(slapo_sched_entry_get_bool(bad, "on", true, &b), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:3: checkpoint: on=1: expected true or false, got '1'");
  assert_int_equal(slapo_sched_entry_get_string(bad, "name", true, &s), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:3: checkpoint: name=3: expected a name or a quoted string, got '3'");
  assert_int_equal(slapo_sched_entry_get_int(e, "s", true, &i), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:2: shard: s=\"x y\": expected an integer, got \"x y\"");
  /* Known keys and positional counts. */
  const char *const known[] = {"axis", "ratio", "whole", "on", "cc", "s", NULL};
  OK(slapo_sched_entry_check_args(e, known, 2));
  assert_int_equal(slapo_sched_entry_check_args(e, known, 1), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "m.sched:2: shard: unexpected argument 'bias' (at most 1 positional "
                      "argument)");
  const char *const few[] = {"axis", NULL};
  assert_int_equal(slapo_sched_entry_check_args(e, few, 2), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(), "m.sched:2: shard: unknown argument 'ratio' (known: "
                                          "axis)");
  /* An entry from C without a file names its path. */
  slapo_sched_entry c = {.path = "h.0", .primitive = "shard"};
  assert_int_equal(slapo_sched_entry_get_int(&c, "axis", true, &i), SLAPO_INVALID_ARG);
  assert_string_equal(slapo_last_error(),
                      "h.0 shard: missing argument 'axis' (expected axis=<integer>)");
  slapo_sched_log_free(log);
}

static void test_expand(void **state) {
  (void)state;
  slapo_gpt2_config c;
  OK(slapo_gpt2_config_named("tiny", &c));
  slapo_module *model;
  OK(slapo_gpt2_new(&c, &model));
  slapo_sched *sch;
  OK(slapo_sched_create(model, &sch));
  slapo_sched_log *log;
  OK(slapo_sched_parse("# expansion\n"
                       "transformer.h.*.attn  replace  FlashAttention\n"
                       "transformer.h         checkpoint  ratio=0.5\n"
                       "\n"
                       "**.c_fc  shard  weight axis=0\n"
                       ".  trace  flatten=false\n"
                       "transformer.h.{1,3}.mlp.act  replace  MyGELU  # not replayable\n",
                       "m.sched", &log));
  slapo_sched_steps steps;
  OK(slapo_sched_expand(log, sch, &steps));
  assert_int_equal(steps.n, 4 + 1 + 4 + 1 + 2);
  static const struct {
    const char *path;
    int line;
  } want[] = {
      {"transformer.h.0.attn", 2},     {"transformer.h.1.attn", 2},
      {"transformer.h.2.attn", 2},     {"transformer.h.3.attn", 2},
      {"transformer.h", 3},            {"transformer.h.0.mlp.c_fc", 5},
      {"transformer.h.1.mlp.c_fc", 5}, {"transformer.h.2.mlp.c_fc", 5},
      {"transformer.h.3.mlp.c_fc", 5}, {".", 6},
      {"transformer.h.1.mlp.act", 7},  {"transformer.h.3.mlp.act", 7},
  };
  for (size_t i = 0; i < steps.n; i++) {
    assert_int_equal(steps.items[i].number, i + 1);
    assert_string_equal(steps.items[i].path, want[i].path);
    assert_int_equal(steps.items[i].entry->line, want[i].line);
    assert_string_equal(steps.items[i].entry->file, "m.sched");
  }
  assert_string_equal(steps.items[5].entry->primitive, "shard");
  assert_string_equal(steps.items[4].entry->args[0].text, "0.5");

  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  slapo_sched_steps_print(&steps, f);
  fclose(f);
  assert_string_equal(buf,
      " 1  transformer.h.0.attn      replace     FlashAttention  # m.sched:2\n"
      " 2  transformer.h.1.attn      replace     FlashAttention  # m.sched:2\n"
      " 3  transformer.h.2.attn      replace     FlashAttention  # m.sched:2\n"
      " 4  transformer.h.3.attn      replace     FlashAttention  # m.sched:2\n"
      " 5  transformer.h             checkpoint  ratio=0.5       # m.sched:3\n"
      " 6  transformer.h.0.mlp.c_fc  shard       weight axis=0   # m.sched:5\n"
      " 7  transformer.h.1.mlp.c_fc  shard       weight axis=0   # m.sched:5\n"
      " 8  transformer.h.2.mlp.c_fc  shard       weight axis=0   # m.sched:5\n"
      " 9  transformer.h.3.mlp.c_fc  shard       weight axis=0   # m.sched:5\n"
      "10  .                         trace       flatten=false   # m.sched:6\n"
      "11  transformer.h.1.mlp.act   replace     MyGELU          # m.sched:7, not replayable\n"
      "12  transformer.h.3.mlp.act   replace     MyGELU          # m.sched:7, not replayable\n");
  free(buf);
  slapo_sched_steps_deinit(&steps);
  assert_int_equal(steps.n, 0);
  slapo_sched_log_free(log);

  /* A line selecting nothing names its file:line. */
  OK(slapo_sched_parse("lm_head trace\ntransformer.h.*.mlp.fc2 fuse\n", "m.sched", &log));
  assert_int_equal(slapo_sched_expand(log, sch, &steps), SLAPO_NO_MATCH);
  assert_int_equal(steps.n, 0);
  assert_null(steps.items);
  assert_string_equal(slapo_last_error(),
                      "m.sched:2: no module matches 'transformer.h.*.mlp.fc2': the nearest "
                      "existing prefix is 'transformer.h.0.mlp' (matching "
                      "'transformer.h.*.mlp'), which has children c_fc, act, c_proj, dropout");
  slapo_sched_log_free(log);
  slapo_sched_free(sch);
  slapo_module_free(model);
}

static void test_parse_file(void **state) {
  (void)state;
  char path[] = "/tmp/slapo_sched_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs(k_design, f);
  fclose(f);
  slapo_sched_log *log;
  OK(slapo_sched_parse_file(path, &log));
  assert_int_equal(slapo_sched_log_count(log), 4);
  assert_string_equal(entry(log, 3)->file, path);
  assert_int_equal(entry(log, 3)->line, 5);
  char *out = print_log(log);
  assert_string_equal(out, k_design);
  free(out);
  slapo_sched_log_free(log);
  unlink(path);
}

/* A file saved with a UTF-8 byte-order mark (as Windows editors write it)
 * reads as without one: the mark had become part of the first path ("no
 * module matches '\ufeffmodel.layers.0'", the mark invisible). Only the
 * text's first bytes are a mark; columns count from after it. */
static void test_byte_order_mark(void **state) {
  (void)state;
  char path[] = "/tmp/slapo_sched_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("\xef\xbb\xbfmodel.layers.0 trace\nmodel.norm trace\n", f);
  fclose(f);
  slapo_sched_log *log;
  OK(slapo_sched_parse_file(path, &log));
  assert_int_equal(slapo_sched_log_count(log), 2);
  assert_string_equal(entry(log, 0)->path, "model.layers.0");
  assert_int_equal(entry(log, 0)->line, 1);
  slapo_sched_log_free(log);
  unlink(path);
  OK(slapo_sched_parse("\xef\xbb\xbf# a comment first\nh trace\n", "b.sched", &log));
  assert_int_equal(slapo_sched_log_count(log), 1);
  assert_string_equal(entry(log, 0)->path, "h");
  slapo_sched_log_free(log);
  assert_int_equal(slapo_sched_parse("\xef\xbb\xbfh..0 trace", "b.sched", &log), SLAPO_PARSE);
  assert_string_equal(slapo_last_error(), "b.sched:1:3: expected a segment, got '.' (empty "
                                          "segment) (in path or glob 'h..0')");
}

static void test_nomem(void **state) {
  (void)state;
  for (long k = 0;; k++) {
    failalloc_install(k);
    slapo_sched_log *log = NULL;
    slapo_status st = slapo_sched_parse(k_design, "n.sched", &log);
    size_t n = log ? slapo_sched_log_count(log) : 0;
    slapo_sched_log_free(log);
    long live = failalloc_live();
    failalloc_uninstall();
    assert_int_equal(live, 0);
    if (st == SLAPO_OK) {
      assert_int_equal(n, 4);
      break;
    }
    assert_int_equal(st, SLAPO_NOMEM);
    assert_null(log);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grammar),         cmocka_unit_test(test_print_design_example),
      cmocka_unit_test(test_round_trip),      cmocka_unit_test(test_append_from_c),
      cmocka_unit_test(test_accessors),       cmocka_unit_test(test_expand),
      cmocka_unit_test(test_parse_file),      cmocka_unit_test(test_byte_order_mark),
      cmocka_unit_test(test_nomem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
