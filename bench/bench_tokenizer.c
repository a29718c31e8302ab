/* bench/bench_tokenizer.c - GPT-2 tokenizer speed on one core: encoding
 * English text (a file, default the fortunes corpus, else this tree's
 * docs/ARCHITECTURE.md repeated) in MB/s, with the pre-token cache warm
 * (the second of two passes) and cold (a fresh tokenizer), decoding, a
 * CJK worst case (random common CJK characters without spaces: every
 * line is one pre-token of 600 bytes, merged through the heap), and
 * learning a BPE of 4,096 tokens on the text.
 *
 *   bench_bench_tokenizer [TEXT_FILE_OR_DIR] [GPT2_DIR]
 * GPT2_DIR defaults to tests/data/tokenizer/gpt2 (run from the tree). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/tokenizer.h"
#include "slapo/train.h"
#include "bench_machine.h"

static void die(const char *what) {
  fprintf(stderr, "bench_tokenizer: %s: %s\n", what, slapo_last_error());
  exit(1);
}

/* Best of 3 passes: seconds to encode text with t (cache as it is). */
static double time_encode(slapo_tokenizer *t, const char *text, size_t n, size_t *n_ids) {
  double best = 1e30;
  for (int r = 0; r < 3; r++) {
    slapo_token_ids ids = {0};
    double t0 = bench_now_s();
    if (slapo_tokenizer_encode(t, text, n, false, &ids) != SLAPO_OK) die("encode");
    double dt = bench_now_s() - t0;
    best = dt < best ? dt : best;
    *n_ids = ids.n;
    slapo_token_ids_free(&ids);
  }
  return best;
}

static slapo_tokenizer *gpt2(const char *dir) {
  char v[1100], m[1100];
  snprintf(v, sizeof v, "%s/encoder.json", dir);
  snprintf(m, sizeof m, "%s/vocab.bpe", dir);
  slapo_tokenizer *t;
  if (slapo_tokenizer_load_bpe(v, m, &t) != SLAPO_OK) die("load");
  return t;
}

int main(int argc, char **argv) {
  const char *src = argc > 1 ? argv[1] : "/usr/share/games/fortunes";
  const char *dir = argc > 2 ? argv[2] : "tests/data/tokenizer/gpt2";
  char *text;
  size_t n;
  if (slapo_text_read(src, &text, &n) != SLAPO_OK) {
    src = "docs/ARCHITECTURE.md";
    char *one;
    size_t k;
    if (slapo_text_read(src, &one, &k) != SLAPO_OK) die("read");
    n = 0, text = malloc(k * 40);
    for (int i = 0; i < 40; i++) memcpy(text + n, one, k), n += k;
    free(one);
  }
  bench_print_machine(stdout, "bench_tokenizer");
  double t0 = bench_now_s();
  slapo_tokenizer *t = gpt2(dir);
  double load_s = bench_now_s() - t0;
  size_t ids_n;
  /* Cold: a fresh tokenizer's first pass fills the cache as it goes. */
  slapo_tokenizer *cold = gpt2(dir);
  slapo_token_ids ids = {0};
  t0 = bench_now_s();
  if (slapo_tokenizer_encode(cold, text, n, false, &ids) != SLAPO_OK) die("encode");
  double cold_s = bench_now_s() - t0;
  slapo_tokenizer_free(cold);
  double warm_s = time_encode(t, text, n, &ids_n);
  slapo_bytes back = {0};
  t0 = bench_now_s();
  if (slapo_tokenizer_decode(t, ids.ids, ids.n, &back) != SLAPO_OK) die("decode");
  double dec_s = bench_now_s() - t0;
  if (back.n != n || memcmp(back.data, text, n) != 0) die("round trip");
  printf("english: %s, %.2f MB, %zu tokens (%.2f bytes a token); load %.3f s; encode %.1f MB/s "
         "warm cache, %.1f MB/s cold; decode %.0f MB/s\n",
         src, (double)n / 1e6, ids.n, (double)n / (double)ids.n, load_s, (double)n / warm_s / 1e6,
         (double)n / cold_s / 1e6, (double)n / dec_s / 1e6);
  /* CJK: 200-character lines of U+4E00..U+9FFF, 3 bytes each. */
  size_t cn = 0, lines = 2000;
  char *cjk = malloc(lines * (200 * 3 + 1));
  uint64_t lcg = 7;
  for (size_t l = 0; l < lines; l++) {
    for (int c = 0; c < 200; c++) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t cp = 0x4e00 + (uint32_t)((lcg >> 33) % 0x5200);
      cjk[cn++] = (char)(0xe0 | cp >> 12), cjk[cn++] = (char)(0x80 | (cp >> 6 & 0x3f));
      cjk[cn++] = (char)(0x80 | (cp & 0x3f));
    }
    cjk[cn++] = '\n';
  }
  double cjk_s = time_encode(t, cjk, cn, &ids_n);
  printf("cjk worst case: %.2f MB of random CJK, %zu tokens (%.2f bytes a token); encode %.1f "
         "MB/s\n",
         (double)cn / 1e6, ids_n, (double)cn / (double)ids_n, (double)cn / cjk_s / 1e6);
  const char *sp[2] = {"<|endoftext|>", "<|mask|>"};
  slapo_bpe_train_opts o = {4096, sp, 2, 2};
  slapo_tokenizer *learned;
  size_t tn = n < (size_t)4 << 20 ? n : (size_t)4 << 20;
  t0 = bench_now_s();
  if (slapo_tokenizer_train(text, tn, &o, &learned) != SLAPO_OK) die("train");
  printf("bpe training: %.2f MB to %d tokens in %.2f s\n", (double)tn / 1e6,
         slapo_tokenizer_vocab_size(learned), bench_now_s() - t0);
  slapo_tokenizer_free(learned);
  slapo_bytes_free(&back);
  slapo_token_ids_free(&ids);
  slapo_tokenizer_free(t);
  free(cjk);
  free(text);
  return 0;
}
