/* train/dataset.c - token data: text through the byte tokenizer, llm.c
 * token files (train_gpt2.c's format: 256 int32 header, uint16 tokens), a
 * directory of text files (the fortunes corpus), a held-out split, and
 * batches drawn with Philox from (seed, step). Layer: train. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/assert.h"
#include "slapo/tokenizer.h"
#include "slapo/train.h"

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_INTS 256

struct slapo_dataset {
  int32_t *tokens; /* [n] */
  int64_t n, n_train, vocab;
  bool gpt2_tokens; /* an llm.c token file (GPT-2's tokenizer), not bytes */
  int64_t text_bytes[2]; /* from text: bytes of the training, validation split */
};

/* Appends the bytes of `path` to (*buf, *len, *cap). */
static slapo_status read_append(const char *path, unsigned char **buf, size_t *len,
                                size_t *cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return slapo_error(SLAPO_IO, "data: cannot open %s: %s", path, strerror(errno));
  unsigned char chunk[65536];
  size_t k;
  slapo_status s = SLAPO_OK;
  while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (*len + k > *cap) {
      size_t nc = *cap ? *cap : 1 << 20;
      while (nc < *len + k) nc *= 2;
      unsigned char *nb = slapo_realloc(*buf, nc);
      if (!nb) {
        s = slapo_error(SLAPO_NOMEM, "data: out of memory reading %s", path);
        break;
      }
      *buf = nb;
      *cap = nc;
    }
    memcpy(*buf + *len, chunk, k);
    *len += k;
  }
  if (s == SLAPO_OK && ferror(f)) s = slapo_error(SLAPO_IO, "data: error reading %s", path);
  fclose(f);
  return s;
}

/* A file is text when its first 4 KiB hold no NUL byte. */
static bool is_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char head[4096];
  size_t k = fread(head, 1, sizeof head, f);
  fclose(f);
  return memchr(head, '\0', k) == NULL;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Calls fn on each file of directory `path` that slapo_dataset_load reads,
 * in name order: regular text files, not hidden. Symbolic links
 * (fortunes' *.u8 point at the text files themselves) would count the text
 * twice, and binary files (fortunes' *.dat indexes) are not text. */
static slapo_status each_dir_file(const char *path, slapo_status (*fn)(const char *, void *),
                                  void *ud) {
  DIR *d = opendir(path);
  if (!d) return slapo_error(SLAPO_IO, "data: cannot open directory %s: %s", path, strerror(errno));
  char **names = NULL;
  int n = 0, capn = 0;
  slapo_status s = SLAPO_OK;
  struct dirent *e;
  while (s == SLAPO_OK && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue; /* ., .., hidden files */
    if (n == capn) {
      capn = capn ? 2 * capn : 32;
      char **nn = slapo_realloc(names, (size_t)capn * sizeof *nn);
      if (!nn) {
        s = slapo_error(SLAPO_NOMEM, "data: out of memory");
        break;
      }
      names = nn;
    }
    if (!(names[n] = slapo_strdup(e->d_name))) s = slapo_error(SLAPO_NOMEM, "data: out of memory");
    else n++;
  }
  closedir(d);
  if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 0; s == SLAPO_OK && i < n; i++) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, names[i]);
    struct stat st;
    if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode) || !is_text(full)) continue;
    s = fn(full, ud);
  }
  for (int i = 0; i < n; i++) slapo_free(names[i]);
  slapo_free(names);
  return s;
}

typedef struct append_state {
  unsigned char **buf;
  size_t *len, *cap;
} append_state;

static slapo_status append_file(const char *path, void *ud) {
  append_state *a = ud;
  return read_append(path, a->buf, a->len, a->cap);
}

static slapo_status read_dir(const char *path, unsigned char **buf, size_t *len, size_t *cap) {
  size_t before = *len;
  append_state a = {buf, len, cap};
  SLAPO_TRY(each_dir_file(path, append_file, &a));
  if (*len == before)
    return slapo_error(SLAPO_IO, "data: directory %s has no text files (files without NUL "
                                 "bytes in their first 4 KiB)", path);
  return SLAPO_OK;
}

typedef struct digest_state {
  uint64_t h;
  int64_t n;
  unsigned char *chunk; /* [DIGEST_CHUNK] */
} digest_state;

enum { DIGEST_CHUNK = 1 << 20 };

/* Chains the XXH3 of each whole 1 MiB chunk (the last one shorter): one
 * pass, a fixed buffer, the same value wherever the same bytes are read. */
static slapo_status digest_file(const char *path, void *ud) {
  digest_state *d = ud;
  FILE *f = fopen(path, "rb");
  if (!f) return slapo_error(SLAPO_IO, "data: cannot open %s: %s", path, strerror(errno));
  size_t k;
  while ((k = fread(d->chunk, 1, DIGEST_CHUNK, f)) > 0) {
    d->h = slapo_hash_combine(d->h, slapo_hash64(d->chunk, k, 0));
    d->n += (int64_t)k;
  }
  slapo_status s = ferror(f) ? slapo_error(SLAPO_IO, "data: error reading %s", path) : SLAPO_OK;
  fclose(f);
  return s;
}

slapo_status slapo_dataset_digest(const char *path, uint64_t *digest, int64_t *nbytes) {
  *digest = 0, *nbytes = 0;
  SLAPO_NEED(path, "dataset_digest");
  struct stat st;
  if (stat(path, &st) != 0)
    return slapo_error(SLAPO_IO, "data: cannot read %s: %s", path, strerror(errno));
  digest_state d = {0, 0, slapo_malloc(DIGEST_CHUNK)};
  if (!d.chunk) return slapo_error(SLAPO_NOMEM, "data: out of memory");
  slapo_status s = S_ISDIR(st.st_mode) ? each_dir_file(path, digest_file, &d)
                                       : digest_file(path, &d);
  slapo_free(d.chunk);
  if (s == SLAPO_OK) *digest = d.h, *nbytes = d.n;
  return s;
}

slapo_status slapo_dataset_load(const char *path, double val_fraction, slapo_dataset **out) {
  *out = NULL;
  if (!(val_fraction >= 0 && val_fraction < 1))
    return slapo_error(SLAPO_INVALID_ARG, "data: validation fraction %g is not in [0, 1)",
                       val_fraction);
  struct stat st;
  if (stat(path, &st) != 0)
    return slapo_error(SLAPO_IO, "data: cannot read %s: %s", path, strerror(errno));
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0;
  slapo_status s = S_ISDIR(st.st_mode) ? read_dir(path, &buf, &len, &cap)
                                       : read_append(path, &buf, &len, &cap);
  slapo_dataset *d = NULL;
  if (s == SLAPO_OK && len == 0) s = slapo_error(SLAPO_IO, "data: %s is empty", path);
  if (s == SLAPO_OK && !(d = slapo_calloc(1, sizeof *d)))
    s = slapo_error(SLAPO_NOMEM, "data: out of memory");
  int32_t header[LLMC_HEADER_INTS];
  bool llmc = false;
  if (s == SLAPO_OK && len >= sizeof header) {
    memcpy(header, buf, sizeof header);
    llmc = header[0] == LLMC_MAGIC;
  }
  size_t plen = strlen(path);
  if (s == SLAPO_OK && !llmc && plen > 4 && !strcmp(path + plen - 4, ".bin"))
    s = slapo_error(SLAPO_IO, "data: %s is not an llm.c token file (it does not start with the "
                              "magic number %d)", path, LLMC_MAGIC);
  if (s == SLAPO_OK && llmc) {
    int64_t ntok = header[2];
    size_t want = sizeof header + (size_t)ntok * 2;
    if (header[1] != 1)
      s = slapo_error(SLAPO_IO, "data: %s: llm.c token file version %d is not supported (want 1)",
                      path, header[1]);
    else if (ntok <= 0 || want != len)
      s = slapo_error(SLAPO_IO,
                      "data: %s: llm.c header says %lld tokens (%zu bytes) but the file has %zu "
                      "bytes",
                      path, (long long)ntok, want, len);
    else if (!(d->tokens = slapo_malloc((size_t)ntok * sizeof(int32_t))))
      s = slapo_error(SLAPO_NOMEM, "data: out of memory");
    else {
      const unsigned char *p = buf + sizeof header;
      for (int64_t i = 0; i < ntok; i++) {
        d->tokens[i] = (int32_t)(p[2 * i] | (p[2 * i + 1] << 8)); /* little-endian uint16 */
        if (d->tokens[i] + 1 > d->vocab) d->vocab = d->tokens[i] + 1;
      }
      d->n = ntok;
      d->gpt2_tokens = true;
    }
  } else if (s == SLAPO_OK) {
    /* Byte-level tokenizer: token id = byte value (vocabulary 256). */
    if (!(d->tokens = slapo_malloc(len * sizeof(int32_t)))) {
      s = slapo_error(SLAPO_NOMEM, "data: out of memory");
    } else {
      for (size_t i = 0; i < len; i++) d->tokens[i] = buf[i];
      d->n = (int64_t)len;
      d->vocab = 256;
    }
  }
  slapo_free(buf);
  if (s != SLAPO_OK) {
    slapo_dataset_free(d);
    return s;
  }
  d->n_train = d->n - (int64_t)((double)d->n * val_fraction);
  *out = d;
  return SLAPO_OK;
}

void slapo_dataset_free(slapo_dataset *d) {
  if (!d) return;
  slapo_free(d->tokens);
  slapo_free(d);
}

int64_t slapo_dataset_tokens(const slapo_dataset *d, bool val) {
  return val ? d->n - d->n_train : d->n_train;
}

int64_t slapo_dataset_vocab(const slapo_dataset *d) { return d->vocab; }

bool slapo_dataset_gpt2_tokens(const slapo_dataset *d) { return d->gpt2_tokens; }

slapo_status slapo_dataset_batch(const slapo_dataset *d, bool val, uint64_t seed, int64_t step,
                                 slapo_tensor *idx, slapo_tensor *targets) {
  SLAPO_ASSERT(idx->ndim == 2 && idx->dtype == SLAPO_DTYPE_I32);
  int64_t B = idx->shape[0], T = idx->shape[1];
  const int32_t *base = d->tokens + (val ? d->n_train : 0);
  int64_t len = slapo_dataset_tokens(d, val);
  if (len < T + 1)
    return slapo_error(SLAPO_INVALID_ARG,
                       "data: the %s split has %lld tokens, fewer than sequence length + 1 = %lld",
                       val ? "validation" : "training", (long long)len, (long long)(T + 1));
  int32_t *x = slapo_tensor_data(idx), *y = slapo_tensor_data(targets); /* [B, T] */
  for (int64_t b = 0; b < B; b++) {
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)step, (uint32_t)((uint64_t)step >> 32), val};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x5eedu}, r[4];
    slapo_philox4x32_10(ctr, key, r);
    uint64_t u = ((uint64_t)r[0] << 32) | r[1];
    int64_t start = (int64_t)(u % (uint64_t)(len - T));
    memcpy(x + b * T, base + start, (size_t)T * sizeof(int32_t));
    memcpy(y + b * T, base + start + 1, (size_t)T * sizeof(int32_t));
  }
  return SLAPO_OK;
}

slapo_status slapo_text_read(const char *path, char **text, size_t *len) {
  SLAPO_NEED(path, "slapo_text_read");
  *text = NULL, *len = 0;
  struct stat st;
  if (stat(path, &st) != 0)
    return slapo_error(SLAPO_IO, "data: cannot read %s: %s", path, strerror(errno));
  unsigned char *buf = NULL;
  size_t cap = 0;
  slapo_status s = S_ISDIR(st.st_mode) ? read_dir(path, &buf, len, &cap) : read_append(path, &buf, len, &cap);
  if (s != SLAPO_OK) {
    slapo_free(buf);
    *len = 0;
    return s;
  }
  *text = (char *)buf;
  return SLAPO_OK;
}

size_t slapo_text_val_cut(const char *text, size_t len, double val_fraction) {
  size_t cut = len - (size_t)((double)len * val_fraction);
  /* Forward to a character's first byte: never split a UTF-8 sequence. */
  while (cut < len && ((unsigned char)text[cut] & 0xc0) == 0x80) cut++;
  return cut;
}

slapo_status slapo_dataset_from_text(const char *text, size_t len, size_t cut,
                                     slapo_tokenizer *tok, slapo_dataset **out) {
  SLAPO_NEED(tok, "slapo_dataset_from_text");
  SLAPO_NEED(out, "slapo_dataset_from_text");
  *out = NULL;
  if (cut > len)
    return slapo_error(SLAPO_INVALID_ARG, "data: split at byte %zu of %zu", cut, len);
  slapo_token_ids ids = {0};
  slapo_status s = slapo_tokenizer_encode(tok, text, cut, false, &ids);
  size_t n_train = ids.n;
  if (s == SLAPO_OK) s = slapo_tokenizer_encode(tok, text + cut, len - cut, false, &ids);
  slapo_dataset *d = s == SLAPO_OK ? slapo_calloc(1, sizeof *d) : NULL;
  if (s == SLAPO_OK && !d) s = slapo_error(SLAPO_NOMEM, "data: out of memory");
  if (s != SLAPO_OK) {
    slapo_token_ids_free(&ids);
    return s;
  }
  d->tokens = ids.ids; /* the dataset owns the ids (slapo_free) */
  d->n = (int64_t)ids.n;
  d->n_train = (int64_t)n_train;
  d->vocab = slapo_tokenizer_vocab_size(tok);
  d->text_bytes[0] = (int64_t)cut, d->text_bytes[1] = (int64_t)(len - cut);
  *out = d;
  return SLAPO_OK;
}

int64_t slapo_dataset_text_bytes(const slapo_dataset *d, bool val) { return d->text_bytes[val]; }
