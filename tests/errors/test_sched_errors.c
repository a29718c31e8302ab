/* tests/errors/test_sched_errors.c - malformed `.sched` files that must fail:
 * each case checks the status, that no log is returned, and the exact
 * message with its file:line:column; unreadable files fail with SLAPO_IO
 * naming the file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/schedule.h"

typedef struct bad_case {
  const char *text;
  const char *msg; /* the whole message */
} bad_case;

static const bad_case k_cases[] = {
    /* strings */
    {"h.0 fuse name=\"abc",
     "t.sched:1:15: expected a closing '\"' for the string opened here, got end of line"},
    {"h.0 fuse \"abc\\",
     "t.sched:1:10: expected a closing '\"' for the string opened here, got end of line"},
    {"h.0 fuse s=\"a\\nb\"",
     "t.sched:1:14: expected \\\" or \\\\ after '\\' in a string, got '\\n'"},
    {"h p s=\"a\tb\"",
     "t.sched:1:9: expected a printable character in a string, got a control character (0x09)"},
    {"h p \"abc\"def", "t.sched:1:10: expected a space after the closing '\"', got 'def'"},
    {"h p foo\"bar\"", "t.sched:1:8: expected a space after 'foo', got '\"'"},
    /* the primitive name */
    {"transformer.h", "t.sched:1:14: expected a primitive name after 'transformer.h', got end "
                      "of line"},
    {"transformer.h   # checkpoint",
     "t.sched:1:17: expected a primitive name after 'transformer.h', got a comment"},
    {"h 3x", "t.sched:1:3: expected a primitive name after 'h', got '3x'"},
    {"h ratio=0.5", "t.sched:1:3: expected a primitive name after 'h', got 'ratio=0.5'"},
    /* keys and values */
    {"h checkpoint =0.5",
     "t.sched:1:14: expected a key before '=' (write key=value), got '=0.5'"},
    {"h checkpoint ratio =0.5",
     "t.sched:1:20: expected a key before '=' (write key=value), got '=0.5'"},
    {"h checkpoint ratio=", "t.sched:1:20: expected a value after 'ratio=', got end of line"},
    {"h checkpoint ratio= 0.5", "t.sched:1:20: expected a value after 'ratio=', got a space"},
    {"h checkpoint ratio=#x", "t.sched:1:20: expected a value after 'ratio=', got '#' (a "
                              "comment starts at a line's start or after a space)"},
    {"h p a==1", "t.sched:1:7: expected a value after 'a=', got '='"},
    {"h p a=b=c", "t.sched:1:8: expected a space after 'a=b', got '='"},
    {"h p a=1 b=2 a=3", "t.sched:1:13: expected each key once, got 'a' again (first at column 5)"},
    {"h p 0.5=3",
     "t.sched:1:5: expected a key (a name: letters, digits, '_', '.') before '=', got '0.5'"},
    /* numbers */
    {"h checkpoint ratio=0.5.1",
     "t.sched:1:20: expected a number (like 3, -1, 0.5 or 1e-5), got '0.5.1'"},
    {"h shard 3x", "t.sched:1:9: expected a number (like 3, -1, 0.5 or 1e-5), got '3x'"},
    {"h p r=.5", "t.sched:1:7: expected a number (like 3, -1, 0.5 or 1e-5), got '.5'"},
    {"h p r=1e", "t.sched:1:7: expected a number (like 3, -1, 0.5 or 1e-5), got '1e'"},
    {"h p n=99999999999999999999", "t.sched:1:7: expected a number that fits (64-bit integer or "
                                   "double), got '99999999999999999999'"},
    {"h p x=1e999",
     "t.sched:1:7: expected a number that fits (64-bit integer or double), got '1e999'"},
    /* '#' starts a comment only at a line's start or after a space: once
     * name=F#x silently read as name=F */
    {"h fuse name=F#x", "t.sched:1:14: expected a space before a comment's '#', got 'name=F#x' "
                        "(a comment starts at a line's start or after a space; a value that "
                        "holds '#' is written in double quotes)"},
    {"h fuse F#x", "t.sched:1:9: expected a space before a comment's '#', got 'F#x' (a comment "
                   "starts at a line's start or after a space; a value that holds '#' is "
                   "written in double quotes)"},
    {"h p \"a\"#b", "t.sched:1:8: expected a space before a comment's '#', got '\"a\"#b' (a "
                    "comment starts at a line's start or after a space; a value that holds '#' "
                    "is written in double quotes)"},
    {"h trace# c", "t.sched:1:8: expected a space before a comment's '#', got 'trace#' (a "
                   "comment starts at a line's start or after a space; a value that holds '#' "
                   "is written in double quotes)"},
    {"h.0#c trace", "t.sched:1:4: expected a space before a comment's '#', got 'h.0#c' (a "
                    "comment starts at a line's start or after a space; a value that holds '#' "
                    "is written in double quotes)"},
    /* paths and globs */
    {"ratio=0.5 checkpoint", "t.sched:1:1: expected a module path or glob first, got 'ratio=0.5'"},
    {"transformer.h.{0..3 replace X",
     "t.sched:1:20: bad range: expected '}' after '{0..3', got end of glob (in path or glob "
     "'transformer.h.{0..3')"},
    {"  h.{a,b replace X", "t.sched:1:5: expected '}' to close this '{', got end of glob (in "
                           "path or glob 'h.{a,b')"},
    {"h..0 trace", "t.sched:1:3: expected a segment, got '.' (empty segment) (in path or glob "
                   "'h..0')"},
    /* control bytes in argument positions (once an endless loop that
     * allocated without bound: the argument scan did not advance) */
    {"a b c\001d\n",
     "t.sched:1:6: expected an argument (a word, number or quoted string), got a control "
     "character (0x01)"},
    {"a b \x7f", "t.sched:1:5: expected an argument (a word, number or quoted string), got a "
                  "control character (0x7f)"},
    {"a b x \r y", "t.sched:1:7: expected an argument (a word, number or quoted string), got a "
                    "control character (0x0d)"},
    {"a b k=\x1f", "t.sched:1:7: expected a value after 'k=', got a control character (0x1f)"},
    {"a b k=v\x02", "t.sched:1:8: expected an argument (a word, number or quoted string), got a "
                     "control character (0x02)"},
    /* control and non-ASCII bytes inside a token are shown escaped */
    {"h rep\x01lace", "t.sched:1:3: expected a primitive name after 'h', got 'rep\\x01lace'"},
    {"h p\xc3\xa9", "t.sched:1:3: expected a primitive name after 'h', got 'p\\xc3\\xa9'"},
    /* later lines, comments and CRLF line ends */
    {"# c\r\n\r\nh p ok=1\r\nh p bad=1.\r\n",
     "t.sched:4:9: expected a number (like 3, -1, 0.5 or 1e-5), got '1.'"},
    {"h p\n\n   # indented comment\nh.{1..0} q\n",
     "t.sched:4:7: bad range {1..0}: expected an end >= the start 1 (in path or glob "
     "'h.{1..0}')"},
};

static void test_malformed_text(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
    slapo_sched_log *log = (slapo_sched_log *)1;
    slapo_status st = slapo_sched_parse(k_cases[i].text, "t.sched", &log);
    if (st != SLAPO_PARSE)
      fail_msg("case %zu (%s): status %s, expected parse", i, k_cases[i].text,
               slapo_status_name(st));
    assert_null(log);
    if (strcmp(slapo_last_error(), k_cases[i].msg))
      fail_msg("case %zu:\n  got      %s\n  expected %s", i, slapo_last_error(),
               k_cases[i].msg);
  }
}

static void test_unreadable_files(void **state) {
  (void)state;
  slapo_sched_log *log = (slapo_sched_log *)1;
  assert_int_equal(slapo_sched_parse_file("/nonexistent/dir/x.sched", &log), SLAPO_IO);
  assert_null(log);
  assert_string_equal(slapo_last_error(), "cannot read schedule file '/nonexistent/dir/x.sched': "
                                          "No such file or directory");
  char dir[] = "/tmp/slapo_sched_dir_XXXXXX";
  assert_non_null(mkdtemp(dir));
  assert_int_equal(slapo_sched_parse_file(dir, &log), SLAPO_IO);
  assert_non_null(strstr(slapo_last_error(), dir));
  assert_non_null(strstr(slapo_last_error(), "Is a directory"));
  rmdir(dir);
}

static void test_file_errors_name_the_file(void **state) {
  (void)state;
  char path[] = "/tmp/slapo_sched_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  /* A NUL byte on line 2, column 4. */
  static const char bytes[] = "h p\nh q\0x\n";
  assert_int_equal(write(fd, bytes, sizeof bytes - 1), (ssize_t)(sizeof bytes - 1));
  close(fd);
  slapo_sched_log *log;
  assert_int_equal(slapo_sched_parse_file(path, &log), SLAPO_PARSE);
  char want[128];
  snprintf(want, sizeof want, "%s:2:4: expected text, got a NUL byte", path);
  assert_string_equal(slapo_last_error(), want);

  /* A grammar error in a file carries the file's name. */
  FILE *f = fopen(path, "w");
  fputs("transformer.h.*.attn replace FlashAttention\ntransformer.h checkpoint ratio=0.5.1\n", f);
  fclose(f);
  assert_int_equal(slapo_sched_parse_file(path, &log), SLAPO_PARSE);
  snprintf(want, sizeof want,
           "%s:2:32: expected a number (like 3, -1, 0.5 or 1e-5), got '0.5.1'", path);
  assert_string_equal(slapo_last_error(), want);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malformed_text),
      cmocka_unit_test(test_unreadable_files),
      cmocka_unit_test(test_file_errors_name_the_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
