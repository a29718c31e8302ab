/* tests/unit/test_tokenizer_train.c - learning a byte-level BPE: the
 * textbook example's first merges, the special tokens at fixed ids and
 * never learned from, determinism (same text, same hash), a saved
 * tokenizer.json that reloads and encodes its corpus identically, and the
 * argument errors. */
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

static const char *const SPECIALS[2] = {"<|endoftext|>", "<|mask|>"};

static slapo_tokenizer *train(const char *text, int32_t vocab) {
  slapo_bpe_train_opts o = {.vocab_size = vocab, .specials = SPECIALS, .n_specials = 2};
  slapo_tokenizer *t = NULL;
  if (slapo_tokenizer_train(text, strlen(text), &o, &t) != SLAPO_OK) fail_msg("%s", slapo_last_error());
  return t;
}

static size_t count_ids(slapo_tokenizer *t, const char *s, bool special, int32_t *first) {
  slapo_token_ids ids = {0};
  assert_int_equal(slapo_tokenizer_encode(t, s, strlen(s), special, &ids), SLAPO_OK);
  size_t n = ids.n;
  if (first) *first = n ? ids.ids[0] : -1;
  slapo_token_ids_free(&ids);
  return n;
}

/* "low lower lowest newer wider" (Sennrich et al.'s flavour): the most
 * frequent pairs merge first, so "low" ends as one token, and merges stop
 * once no pair occurs twice. */
static void test_first_merges(void **state) {
  (void)state;
  slapo_tokenizer *t = train("low low low low low lower lower newest newest newest newest newest "
                             "newest widest widest widest", 1000);
  int32_t v = slapo_tokenizer_vocab_size(t);
  assert_true(v > 258 && v < 300); /* stopped early: nothing left occurs twice */
  assert_int_equal(slapo_tokenizer_special_id(t, "<|endoftext|>"), 256);
  assert_int_equal(slapo_tokenizer_special_id(t, "<|mask|>"), 257);
  assert_int_equal(count_ids(t, " low", false, NULL), 1);
  assert_int_equal(count_ids(t, " newest", false, NULL), 1);
  assert_int_equal(count_ids(t, " lowest", false, NULL), 2); /* " low" + "est" */
  slapo_tokenizer_free(t);
}

/* Special tokens' text is cut out of the training text: "<|" never
 * becomes a token however often it appears. */
static void test_specials_not_learned(void **state) {
  (void)state;
  char text[4096] = "";
  for (int i = 0; i < 100; i++) strcat(text, "a b<|endoftext|>");
  slapo_tokenizer *t = train(text, 400);
  assert_int_equal(count_ids(t, "<|", false, NULL), 2);
  int32_t first;
  assert_int_equal(count_ids(t, "<|endoftext|>", true, &first), 1);
  assert_int_equal(first, 256);
  slapo_tokenizer_free(t);
}

static char *corpus(size_t *n) {
  const char *d = getenv("SLAPO_TEST_DATA");
  char p[1100];
  snprintf(p, sizeof p, "%s/tokenizer/gpt2_golden.jsonl", d ? d : "tests/data");
  FILE *fp = fopen(p, "rb");
  assert_non_null(fp);
  char *buf = malloc(1 << 20);
  *n = fread(buf, 1, (1 << 20) - 1, fp);
  buf[*n] = '\0';
  fclose(fp);
  return buf;
}

static void test_save_reload_deterministic(void **state) {
  (void)state;
  size_t n;
  char *text = corpus(&n);
  slapo_tokenizer *a = train(text, 1024), *b = train(text, 1024);
  assert_int_equal(slapo_tokenizer_vocab_size(a), 1024);
  assert_true(slapo_tokenizer_hash(a) == slapo_tokenizer_hash(b));
  char path[] = "/tmp/slapo_tokjson_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(slapo_tokenizer_save(a, path), SLAPO_OK);
  slapo_tokenizer *c = NULL;
  if (slapo_tokenizer_load(path, &c) != SLAPO_OK) fail_msg("%s", slapo_last_error());
  assert_true(slapo_tokenizer_hash(a) == slapo_tokenizer_hash(c));
  slapo_token_ids x = {0}, y = {0};
  slapo_bytes back = {0};
  assert_int_equal(slapo_tokenizer_encode(a, text, n, true, &x), SLAPO_OK);
  assert_int_equal(slapo_tokenizer_encode(c, text, n, true, &y), SLAPO_OK);
  assert_int_equal(x.n, y.n);
  assert_memory_equal(x.ids, y.ids, x.n * sizeof *x.ids);
  assert_true(x.n < n / 2); /* it compresses its own corpus */
  assert_int_equal(slapo_tokenizer_decode(c, y.ids, y.n, &back), SLAPO_OK);
  assert_int_equal(back.n, n);
  assert_memory_equal(back.data, text, n);
  slapo_token_ids_free(&x);
  slapo_token_ids_free(&y);
  slapo_bytes_free(&back);
  slapo_tokenizer_free(a);
  slapo_tokenizer_free(b);
  slapo_tokenizer_free(c);
  unlink(path);
  free(text);
}

static void test_errors(void **state) {
  (void)state;
  slapo_tokenizer *t = NULL;
  slapo_bpe_train_opts o = {.vocab_size = 257, .specials = SPECIALS, .n_specials = 2};
  assert_int_equal(slapo_tokenizer_train("abc", 3, &o, &t), SLAPO_INVALID_ARG);
  assert_last_error_has("vocabulary size 257 is below the 256 bytes plus 2 special token(s)");
  const char *empty[1] = {""};
  o = (slapo_bpe_train_opts){.vocab_size = 300, .specials = empty, .n_specials = 1};
  assert_int_equal(slapo_tokenizer_train("abc", 3, &o, &t), SLAPO_INVALID_ARG);
  assert_last_error_has("special token 0 is empty");
  assert_null(t);
  o = (slapo_bpe_train_opts){.vocab_size = 300};
  assert_int_equal(slapo_tokenizer_train("", 0, &o, &t), SLAPO_OK); /* bytes only */
  assert_int_equal(slapo_tokenizer_vocab_size(t), 256);
  assert_int_equal(slapo_tokenizer_save(t, "/nonexistent-dir/tokenizer.json"), SLAPO_IO);
  slapo_tokenizer_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_merges),
      cmocka_unit_test(test_specials_not_learned),
      cmocka_unit_test(test_save_reload_deterministic),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
