/* tests/unit/test_tokenizer_spm.c - SentencePiece models through
 * libsentencepiece (LLaMA's tokenizer.model kind): a small BPE model with
 * byte fallback (tools/gen_spm_fixture.sh) encodes each of its golden texts
 * to the ids spm_encode wrote; decoding gives the text back with
 * SentencePiece's leading space; a file that is not a model, and saving
 * one as tokenizer.json, are refused by name. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/expect.h"
#include "slapo/tokenizer.h"

static char g_dir[1024];

static const char *path_of(const char *file) {
  static char p[1200];
  snprintf(p, sizeof p, "%s/%s", g_dir, file);
  return p;
}

static slapo_tokenizer *load(void) {
  slapo_tokenizer *t = NULL;
  if (slapo_tokenizer_open(path_of("tiny.model"), &t) != SLAPO_OK) fail_msg("%s", slapo_last_error());
  return t;
}

static void test_goldens(void **state) {
  (void)state;
  slapo_tokenizer *t = load();
  assert_int_equal(slapo_tokenizer_vocab_size(t), 600);
  assert_int_equal(slapo_tokenizer_special_id(t, "</s>"), 2);
  FILE *ft = fopen(path_of("texts.txt"), "r"), *fi = fopen(path_of("ids.txt"), "r");
  assert_non_null(ft);
  assert_non_null(fi);
  char *text = NULL, *ids = NULL;
  size_t ct = 0, ci = 0, cases = 0;
  ssize_t nt;
  while ((nt = getline(&text, &ct, ft)) > 0) {
    assert_true(getline(&ids, &ci, fi) > 0);
    text[--nt] = '\0';
    slapo_token_ids got = {0};
    assert_int_equal(slapo_tokenizer_encode(t, text, (size_t)nt, false, &got), SLAPO_OK);
    char line[8192];
    size_t k = 0;
    for (size_t i = 0; i < got.n; i++) k += (size_t)snprintf(line + k, sizeof line - k, "%s%d", i ? " " : "", got.ids[i]);
    line[k] = '\0';
    ids[strcspn(ids, "\n")] = '\0';
    if (strcmp(line, ids) != 0) fail_msg("text %zu \"%s\": want %s, got %s", cases, text, ids, line);
    slapo_token_ids_free(&got);
    cases++;
  }
  assert_true(cases > 200);
  free(text);
  free(ids);
  fclose(ft);
  fclose(fi);
  slapo_tokenizer_free(t);
}

static void test_decode(void **state) {
  (void)state;
  slapo_tokenizer *t = load();
  slapo_token_ids ids = {0};
  slapo_bytes b = {0};
  const char *s = "Hello world, café 😀";
  assert_int_equal(slapo_tokenizer_encode(t, s, strlen(s), false, &ids), SLAPO_OK);
  assert_int_equal(slapo_tokenizer_decode(t, ids.ids, ids.n, &b), SLAPO_OK);
  assert_string_equal(b.data, " Hello world, café 😀");
  slapo_bytes_free(&b);
  slapo_token_ids_free(&ids);
  assert_int_equal(slapo_tokenizer_save(t, "/tmp/slapo-spm-never.json"), SLAPO_UNSUPPORTED);
  assert_last_error_has("tokenizer.model");
  slapo_tokenizer_free(t);
}

static void test_not_a_model(void **state) {
  (void)state;
  char p[] = "/tmp/slapo_spm_XXXXXX.model";
  int fd = mkstemps(p, 6);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "not a model", 11), 11);
  close(fd);
  slapo_tokenizer *t = (slapo_tokenizer *)1;
  assert_int_equal(slapo_tokenizer_open(p, &t), SLAPO_PARSE);
  assert_null(t);
  assert_last_error_has("not a SentencePiece model");
  assert_last_error_has(p);
  unlink(p);
}

int main(void) {
  const char *d = getenv("SLAPO_TEST_DATA");
  snprintf(g_dir, sizeof g_dir, "%s/tokenizer/spm", d ? d : "tests/data");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_goldens),
      cmocka_unit_test(test_decode),
      cmocka_unit_test(test_not_a_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
