/* cli/tokenizer.c - `slapo tokenizer train` (learn a byte-level BPE and write
 * its tokenizer.json) and `slapo tokenize` (text to an llm.c token file).
 * Layer: cli. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/common.h"
#include "slapo/tokenizer.h"

enum { OPT_VOCAB = 1000, OPT_SPECIAL, OPT_MIN_FREQ };

/* Where `--tokenizer gpt2` looks: $SLAPO_GPT2_TOKENIZER, else the GPT-2
 * vocabulary files this tree ships (encoder.json, vocab.bpe). */
const char *cli_gpt2_tokenizer_dir(void) {
  const char *d = getenv("SLAPO_GPT2_TOKENIZER");
  return d && *d ? d : SLAPO_GPT2_TOKENIZER_DIR;
}

slapo_status cli_tokenizer_open(const char *spec, slapo_tokenizer **out) {
  return slapo_tokenizer_open(!strcmp(spec, "gpt2") ? cli_gpt2_tokenizer_dir() : spec, out);
}

/* The text of every FILE (files, or directories of text files) joined. */
static slapo_status read_all(int n, char **paths, char **text, size_t *len) {
  *text = NULL, *len = 0;
  for (int i = 0; i < n; i++) {
    char *t;
    size_t k;
    SLAPO_TRY(slapo_text_read(paths[i], &t, &k));
    char *grown = slapo_realloc(*text, *len + k + 1);
    if (!grown) {
      slapo_free(t);
      return slapo_error(SLAPO_NOMEM, "tokenizer: out of memory reading %s", paths[i]);
    }
    *text = grown;
    if (k) memcpy(*text + *len, t, k);
    *len += k;
    slapo_free(t);
  }
  return SLAPO_OK;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char k_train_usage[] =
    "usage: slapo tokenizer train --vocab-size N [--output FILE] [--special TEXT]...\n"
    "                             [--min-frequency K] FILE...\n\n"
    "Learns a byte-level BPE (GPT-2's pre-tokenizer, merges by pair frequency) on the\n"
    "text of FILE... (files, or directories of text files) and writes a Hugging Face\n"
    "tokenizer.json. Ids: the 256 bytes, then the special tokens, then the merges.\n"
    "  --vocab-size N     tokens in all (bytes + special tokens + merges)\n"
    "  --output FILE      the tokenizer.json to write [tokenizer.json]\n"
    "  --special TEXT     a special token (repeatable) [<|endoftext|> and <|mask|>]\n"
    "  --min-frequency K  a pair must occur K times to be merged [2]\n";

static int tokenizer_train(int argc, char **argv) {
  static const struct option opts[] = {{"vocab-size", required_argument, 0, OPT_VOCAB},
                                       {"output", required_argument, 0, OPT_OUTPUT},
                                       {"special", required_argument, 0, OPT_SPECIAL},
                                       {"min-frequency", required_argument, 0, OPT_MIN_FREQ},
                                       {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *output = "tokenizer.json";
  const char *specials[16];
  int n_specials = 0;
  int64_t vocab = 0, min_freq = 2;
  int o;
  opterr = 0;
  while ((o = cli_getopt(argc, argv, opts)) != -1) {
    if (o == OPT_VOCAB) {
      if (!cli_parse_i64(optarg, &vocab) || vocab < 256 || vocab > (1 << 24))
        return cli_option_error("tokenizer train", opts, o, argv);
    } else if (o == OPT_MIN_FREQ) {
      if (!cli_parse_i64(optarg, &min_freq) || min_freq < 1 || min_freq > (1 << 30))
        return cli_option_error("tokenizer train", opts, o, argv);
    } else if (o == OPT_OUTPUT) {
      output = optarg;
    } else if (o == OPT_SPECIAL) {
      if (n_specials == 16) return cli_usage_error("tokenizer train", "%s", "at most 16 --special tokens");
      specials[n_specials++] = optarg;
    } else if (o == OPT_HELP) {
      printf("%s", k_train_usage);
      return 0;
    } else {
      return cli_option_error("tokenizer train", opts, o, argv);
    }
  }
  if (!vocab) return cli_usage_error("tokenizer train", "%s", "--vocab-size is required");
  if (optind >= argc) return cli_usage_error("tokenizer train", "%s", "name at least one text FILE");
  if (!n_specials) specials[n_specials++] = "<|endoftext|>", specials[n_specials++] = "<|mask|>";
  slapo_status s = slapo_check_write_target(output, "tokenizer train");
  if (s != SLAPO_OK) return cli_fail(s);
  char *text;
  size_t len;
  if ((s = read_all(argc - optind, argv + optind, &text, &len)) != SLAPO_OK) return cli_fail(s);
  double t0 = now_s();
  slapo_bpe_train_opts opt = {(int32_t)vocab, specials, n_specials, (int)min_freq};
  slapo_tokenizer *t = NULL;
  s = slapo_tokenizer_train(text, len, &opt, &t);
  double dt = now_s() - t0;
  slapo_token_ids ids = {0};
  if (s == SLAPO_OK) s = slapo_tokenizer_encode(t, text, len, false, &ids);
  if (s == SLAPO_OK) s = slapo_tokenizer_save(t, output);
  if (s == SLAPO_OK)
    printf("tokenizer train: %zu bytes of text, %d tokens (%d special) in %.1f s; the text is "
           "%zu tokens (%.2f bytes a token); wrote %s\n",
           len, slapo_tokenizer_vocab_size(t), n_specials, dt, ids.n,
           ids.n ? (double)len / (double)ids.n : 0.0, output);
  if (s == SLAPO_OK && slapo_tokenizer_vocab_size(t) < vocab)
    printf("tokenizer train: stopped below --vocab-size %lld: no pair occurs %lld times more\n",
           (long long)vocab, (long long)min_freq);
  slapo_token_ids_free(&ids);
  slapo_tokenizer_free(t);
  slapo_free(text);
  return s == SLAPO_OK ? 0 : cli_fail(s);
}

/* A token's bytes for a terminal: printable ASCII as is, the rest (and
 * '|', the separator, and '\\') escaped. */
static void print_piece(const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)b[i];
    if (c == '\n') printf("\\n");
    else if (c == '\t') printf("\\t");
    else if (c >= 0x20 && c < 0x7f && c != '|' && c != '\\') putchar(c);
    else printf("\\x%02x", c);
  }
}

static const char k_encode_usage[] =
    "usage: slapo tokenizer encode [--tokenizer T] [--special] TEXT...\n\n"
    "Prints the ids of each TEXT and the bytes of each token (between '|'; bytes\n"
    "outside printable ASCII as \\xNN), to see how a tokenizer splits text.\n"
    "  --tokenizer T   gpt2, bytes, a tokenizer.json or a directory with one [gpt2]\n"
    "  --special       recognise special tokens' text (e.g. <|endoftext|>)\n";

static int tokenizer_encode(int argc, char **argv) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, OPT_TOKENIZER},
                                       {"special", no_argument, 0, OPT_SPECIAL},
                                       {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *spec = "gpt2";
  bool special = false;
  int o;
  opterr = 0;
  while ((o = cli_getopt(argc, argv, opts)) != -1) {
    if (o == OPT_TOKENIZER) spec = optarg;
    else if (o == OPT_SPECIAL) special = true;
    else if (o == OPT_HELP) return printf("%s", k_encode_usage), 0;
    else return cli_option_error("tokenizer encode", opts, o, argv);
  }
  if (optind >= argc) return cli_usage_error("tokenizer encode", "%s", "give a TEXT to encode");
  slapo_tokenizer *t = NULL;
  slapo_status s = cli_tokenizer_open(spec, &t);
  for (int i = optind; s == SLAPO_OK && i < argc; i++) {
    slapo_token_ids ids = {0};
    s = slapo_tokenizer_encode(t, argv[i], strlen(argv[i]), special, &ids);
    if (s == SLAPO_OK) {
      printf("%zu tokens:", ids.n);
      for (size_t k = 0; k < ids.n; k++) printf(" %d", ids.ids[k]);
      printf("\n|");
      for (size_t k = 0; k < ids.n && s == SLAPO_OK; k++) {
        slapo_bytes b = {0};
        s = slapo_tokenizer_decode(t, &ids.ids[k], 1, &b);
        if (s == SLAPO_OK) print_piece(b.data, b.n), putchar('|');
        slapo_bytes_free(&b);
      }
      printf("\n");
    }
    slapo_token_ids_free(&ids);
  }
  slapo_tokenizer_free(t);
  return s == SLAPO_OK ? 0 : cli_fail(s);
}

int cmd_tokenizer(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "train")) return tokenizer_train(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "encode")) return tokenizer_encode(argc - 1, argv + 1);
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: slapo tokenizer train|encode ...   (slapo tokenizer <sub> --help)\n\n%s\n%s",
           k_train_usage, k_encode_usage);
    return 0;
  }
  return cli_usage_error("tokenizer", "%s", argc >= 2 ? "unknown subcommand (try 'train' or 'encode')"
                                                       : "a subcommand is required: train or encode");
}

/* llm.c's token file: 256 int32 header (magic 20240520, version 1, count),
 * then uint16 tokens, little-endian (train_gpt2.c, dev/data/data_common.py). */
typedef struct token_file {
  const slapo_token_ids *ids;
} token_file;

static slapo_status write_tokens(FILE *fp, const char *tmp, void *ud) {
  const slapo_token_ids *ids = ((token_file *)ud)->ids;
  int32_t header[256] = {20240520, 1, (int32_t)ids->n};
  if (fwrite(header, sizeof header, 1, fp) != 1) return slapo_error(SLAPO_IO, "%s: %s", tmp, strerror(errno));
  uint16_t buf[4096];
  for (size_t i = 0; i < ids->n;) {
    size_t k = 0;
    for (; k < 4096 && i < ids->n; k++, i++) buf[k] = (uint16_t)ids->ids[i];
    if (fwrite(buf, sizeof *buf, k, fp) != k) return slapo_error(SLAPO_IO, "%s: %s", tmp, strerror(errno));
  }
  return SLAPO_OK;
}

int cmd_tokenize(int argc, char **argv) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, OPT_TOKENIZER},
                                       {"output", required_argument, 0, OPT_OUTPUT},
                                       {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *spec = "gpt2", *output = NULL;
  int o;
  opterr = 0;
  while ((o = cli_getopt(argc, argv, opts)) != -1) {
    if (o == OPT_TOKENIZER) spec = optarg;
    else if (o == OPT_OUTPUT) output = optarg;
    else if (o == OPT_HELP) {
      printf("usage: slapo tokenize [--tokenizer T] --output FILE.bin FILE...\n\n"
             "Encodes the text of FILE... (files, or directories of text files), each\n"
             "preceded by <|endoftext|> when the tokenizer has it (as llm.c's data scripts),\n"
             "into llm.c's token file (256 int32 header, uint16 tokens), which 'slapo train\n"
             "--data' and llm.c's train_gpt2 read.\n"
             "  --tokenizer T   gpt2, bytes, a tokenizer.json or a directory with one [gpt2]\n"
             "  --output FILE   the token file to write (required)\n");
      return 0;
    } else return cli_option_error("tokenize", opts, o, argv);
  }
  if (!output) return cli_usage_error("tokenize", "%s", "--output is required");
  if (optind >= argc) return cli_usage_error("tokenize", "%s", "name at least one text FILE");
  slapo_tokenizer *t = NULL;
  slapo_status s = cli_tokenizer_open(spec, &t);
  if (s == SLAPO_OK && slapo_tokenizer_vocab_size(t) > 65536)
    s = slapo_error(SLAPO_UNSUPPORTED, "tokenize: %s has %d tokens; llm.c's token file holds ids "
                                       "below 65536", spec, slapo_tokenizer_vocab_size(t));
  if (s == SLAPO_OK) s = slapo_check_write_target(output, "tokenize");
  slapo_token_ids ids = {0};
  size_t bytes = 0;
  int32_t eot = slapo_tokenizer_special_id(t, "<|endoftext|>");
  for (int i = optind; s == SLAPO_OK && i < argc; i++) {
    char *text;
    size_t len;
    s = slapo_text_read(argv[i], &text, &len);
    if (s == SLAPO_OK && eot >= 0) s = slapo_tokenizer_encode(t, "<|endoftext|>", 13, true, &ids);
    if (s == SLAPO_OK) s = slapo_tokenizer_encode(t, text, len, false, &ids);
    bytes += len;
    slapo_free(text);
  }
  if (s == SLAPO_OK && ids.n > INT32_MAX)
    s = slapo_error(SLAPO_LIMIT, "tokenize: %zu tokens; an llm.c token file holds at most 2^31 - 1", ids.n);
  token_file tf = {&ids};
  if (s == SLAPO_OK) s = slapo_write_atomic(output, "tokenize", write_tokens, &tf);
  if (s == SLAPO_OK)
    printf("tokenize: %zu bytes of text, %zu tokens (%.2f bytes a token); wrote %s\n", bytes,
           ids.n, ids.n ? (double)bytes / (double)ids.n : 0.0, output);
  slapo_token_ids_free(&ids);
  slapo_tokenizer_free(t);
  return s == SLAPO_OK ? 0 : cli_fail(s);
}
