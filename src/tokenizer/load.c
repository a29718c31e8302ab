/* src/tokenizer/load.c - reading a byte-level BPE from a Hugging Face
 * tokenizer.json or GPT-2's vocab.json + merges.txt (jansson for JSON).
 * Anything the encoder would not reproduce (another model, a normalizer,
 * another pre-tokenizer) is refused by name, never approximated. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "tokenizer/internal.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

/* Byte-level text (each code point one byte of slapo__byte_char's
 * alphabet) to bytes in out[0..strlen): the number of bytes, or -1 with
 * the first code point that stands for no byte in *bad. */
static long from_byte_level(const char *text, uint8_t *out, uint32_t *bad) {
  const uint8_t *s = (const uint8_t *)text;
  size_t n = strlen(text), k = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp = 0;
    int len = slapo__utf8_decode(s + i, n - i, &cp);
    int b = len ? slapo__char_byte(cp) : -1;
    if (b < 0) return *bad = len ? cp : s[i], -1;
    out[k++] = (uint8_t)b;
    i += (size_t)len;
  }
  return (long)k;
}

typedef struct entry {
  const char *text; /* borrowed from the JSON */
  bool special;     /* an added token: its text is its bytes */
} entry;

/* Builds the vocabulary of t from `vocab` (text -> id) and `added` (a
 * tokenizer.json's added_tokens, or NULL; `eot_special`: GPT-2's pair of
 * files, where "<|endoftext|>" is the special token). */
static slapo_status build_vocab(slapo_tokenizer *t, json_t *vocab, json_t *added, bool eot_special,
                                const char *src) {
  if (!json_is_object(vocab)) return slapo_error(SLAPO_PARSE, "%s: the vocabulary is not a JSON object", src);
  int64_t n = 0;
  const char *key;
  json_t *v;
  json_object_foreach(vocab, key, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX / 2)
      return slapo_error(SLAPO_PARSE, "%s: vocabulary entry \"%.60s\" has no valid id", src, key);
    if (json_integer_value(v) + 1 > n) n = json_integer_value(v) + 1;
  }
  size_t i;
  json_array_foreach(added, i, v) {
    json_t *id = json_object_get(v, "id"), *c = json_object_get(v, "content");
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX / 2 ||
        !json_is_string(c) || json_string_length(c) == 0)
      return slapo_error(SLAPO_PARSE, "%s: added_tokens[%zu] needs an \"id\" and a non-empty \"content\"", src, i);
    if (json_integer_value(id) + 1 > n) n = json_integer_value(id) + 1;
  }
  entry *e = slapo_calloc((size_t)n ? (size_t)n : 1, sizeof *e);
  if (!e) return slapo_error(SLAPO_NOMEM, "%s: out of memory", src);
  slapo_status st = SLAPO_OK;
  json_array_foreach(added, i, v) {
    int64_t id = json_integer_value(json_object_get(v, "id"));
    const char *c = json_string_value(json_object_get(v, "content"));
    if (e[id].text && strcmp(e[id].text, c) != 0) {
      st = slapo_error(SLAPO_PARSE, "%s: added tokens \"%.60s\" and \"%.60s\" both have id %lld", src,
                       e[id].text, c, (long long)id);
      goto done;
    }
    e[id] = (entry){c, json_is_true(json_object_get(v, "special"))};
  }
  json_object_foreach(vocab, key, v) {
    int64_t id = json_integer_value(v);
    if (e[id].text && strcmp(e[id].text, key) != 0) {
      st = slapo_error(SLAPO_PARSE, "%s: vocabulary entries \"%.60s\" and \"%.60s\" both have id %lld",
                       src, e[id].text, key, (long long)id);
      goto done;
    }
    if (!e[id].text) e[id] = (entry){key, eot_special && strcmp(key, "<|endoftext|>") == 0};
  }
  /* Token bytes, in id order. */
  size_t total = 0;
  for (int64_t id = 0; id < n; id++) {
    if (!e[id].text) {
      st = slapo_error(SLAPO_PARSE, "%s: no token has id %lld (ids must run over [0, %lld))", src,
                       (long long)id, (long long)n);
      goto done;
    }
    total += strlen(e[id].text);
  }
  uint32_t *off = slapo_malloc(((size_t)n + 1) * sizeof *off);
  uint8_t *bytes = slapo_malloc(total ? total : 1);
  t->special = slapo_malloc((size_t)n * sizeof *t->special + 1);
  if (!off || !bytes || !t->special) {
    st = slapo_error(SLAPO_NOMEM, "%s: out of memory", src);
  } else {
    off[0] = 0;
    for (int64_t id = 0; id < n && st == SLAPO_OK; id++) {
      long m;
      uint32_t bad = 0;
      if (e[id].special) {
        m = (long)strlen(e[id].text);
        memcpy(bytes + off[id], e[id].text, (size_t)m);
        t->special[t->n_special++] = (int32_t)id;
      } else if ((m = from_byte_level(e[id].text, bytes + off[id], &bad)) < 0) {
        st = slapo_error(SLAPO_PARSE,
                         "%s: vocabulary entry \"%.60s\" (id %lld) is not byte-level text: U+%04X "
                         "stands for no byte",
                         src, e[id].text, (long long)id, bad);
      }
      if (st == SLAPO_OK) off[id + 1] = off[id] + (uint32_t)m;
    }
    if (st == SLAPO_OK) st = slapo__tok_build(t, off, bytes, (int32_t)n, src);
  }
  slapo_free(off);
  slapo_free(bytes);
done:
  slapo_free(e);
  return st;
}

/* The id of byte-level token text `s` (a merge's side), or -1. */
static int32_t find_text(const slapo_tokenizer *t, const char *s) {
  size_t n = strlen(s);
  uint8_t stack[512];
  uint8_t *b = n <= sizeof stack ? stack : slapo_malloc(n);
  uint32_t bad;
  long m = b ? from_byte_level(s, b, &bad) : -1;
  int32_t id = m > 0 ? slapo__tok_find(t, b, (size_t)m) : -1;
  if (b != stack) slapo_free(b);
  return id;
}

static slapo_status add_merge(slapo_tokenizer *t, const char *a, const char *b, const char *where) {
  int32_t l = find_text(t, a), r = find_text(t, b);
  if (l < 0 || r < 0)
    return slapo_error(SLAPO_PARSE, "%s: \"%.60s\" is not in the vocabulary", where, l < 0 ? a : b);
  return slapo__merge_add(t, l, r, where);
}

/* One merge "A B" of a string (merges.txt's line, or a tokenizer.json
 * merges entry in the older form) split at its one space. */
static slapo_status add_merge_line(slapo_tokenizer *t, char *line, const char *where) {
  char *sp = strchr(line, ' ');
  if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' '))
    return slapo_error(SLAPO_PARSE, "%s: \"%.60s\" is not a merge \"A B\"", where, line);
  *sp = '\0';
  slapo_status st = add_merge(t, line, sp + 1, where);
  *sp = ' ';
  return st;
}

static slapo_status model_merges(slapo_tokenizer *t, json_t *merges, const char *src) {
  if (!json_is_array(merges)) return slapo_error(SLAPO_PARSE, "%s: model.merges is not an array", src);
  SLAPO_TRY(slapo__merges_reserve(t, json_array_size(merges)));
  size_t i;
  json_t *m;
  char where[600];
  json_array_foreach(merges, i, m) {
    snprintf(where, sizeof where, "%s: model.merges[%zu]", src, i);
    if (json_is_string(m)) {
      char *line = slapo_strdup(json_string_value(m));
      if (!line) return slapo_error(SLAPO_NOMEM, "%s: out of memory", where);
      slapo_status st = add_merge_line(t, line, where);
      slapo_free(line);
      SLAPO_TRY(st);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      SLAPO_TRY(add_merge(t, json_string_value(json_array_get(m, 0)),
                          json_string_value(json_array_get(m, 1)), where));
    } else {
      return slapo_error(SLAPO_PARSE, "%s: a merge is \"A B\" or [\"A\", \"B\"]", where);
    }
  }
  return SLAPO_OK;
}

static const char *type_of(json_t *o) {
  const char *s = json_string_value(json_object_get(o, "type"));
  return s ? s : "(no type)";
}

/* What the encoder implements: BPE, no normalizer, the ByteLevel
 * pre-tokenizer without a prefix space, no dropout, no affixes. */
static slapo_status check_supported(json_t *root, json_t *model, const char *src) {
  json_t *norm = json_object_get(root, "normalizer"), *pre = json_object_get(root, "pre_tokenizer");
  const char *mt = json_string_value(json_object_get(model, "type"));
  if (mt && strcmp(mt, "BPE") != 0)
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported tokenizer model %s (slapo reads byte-level BPE)", src, mt);
  if (norm && !json_is_null(norm))
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported normalizer %s (byte-level BPE has none)", src, type_of(norm));
  if (!json_is_object(pre) || strcmp(type_of(pre), "ByteLevel") != 0)
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported pre_tokenizer %s (slapo implements ByteLevel)", src,
                       json_is_object(pre) ? type_of(pre) : "null");
  if (json_is_true(json_object_get(pre, "add_prefix_space")))
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported pre_tokenizer option add_prefix_space true", src);
  if (json_is_false(json_object_get(pre, "use_regex")))
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported pre_tokenizer option use_regex false", src);
  json_t *d = json_object_get(model, "dropout");
  if (d && !json_is_null(d))
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported BPE option dropout (encoding is deterministic)", src);
  static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int k = 0; k < 2; k++) {
    const char *a = json_string_value(json_object_get(model, affix[k]));
    if (a && *a) return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported BPE option %s \"%s\"", src, affix[k], a);
  }
  if (json_is_true(json_object_get(model, "byte_fallback")))
    return slapo_error(SLAPO_UNSUPPORTED, "%s: unsupported BPE option byte_fallback", src);
  return SLAPO_OK;
}

static slapo_status load_json(const char *path, json_t **out) {
  json_error_t err;
  *out = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
  if (*out) return SLAPO_OK;
  if (json_error_code(&err) == json_error_cannot_open_file)
    return slapo_error(SLAPO_IO, "%s: cannot read: %s", path, err.text);
  return slapo_error(SLAPO_PARSE, "%s:%d:%d: %s", path, err.line, err.column, err.text);
}

slapo_status slapo_tokenizer_load(const char *path, slapo_tokenizer **out) {
  SLAPO_NEED(path, "slapo_tokenizer_load");
  SLAPO_NEED(out, "slapo_tokenizer_load");
  *out = NULL;
  json_t *root;
  SLAPO_TRY(load_json(path, &root));
  slapo_tokenizer *t = slapo_calloc(1, sizeof *t);
  json_t *model = json_object_get(root, "model");
  slapo_status st = !t ? slapo_error(SLAPO_NOMEM, "%s: out of memory", path)
                    : !json_is_object(model) ? slapo_error(SLAPO_PARSE, "%s: no \"model\" object (not a tokenizer.json?)", path)
                                            : check_supported(root, model, path);
  if (st == SLAPO_OK) st = build_vocab(t, json_object_get(model, "vocab"), json_object_get(root, "added_tokens"), false, path);
  if (st == SLAPO_OK) st = model_merges(t, json_object_get(model, "merges"), path);
  json_decref(root);
  if (st != SLAPO_OK) return slapo_tokenizer_free(t), st;
  *out = t;
  return SLAPO_OK;
}

/* merges.txt: "#version: ..." first (optional), then "A B" per line; an
 * empty last line is the file's final newline. */
static slapo_status read_merges(slapo_tokenizer *t, const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return slapo_error(SLAPO_IO, "%s: cannot read: %s", path, strerror(errno));
  size_t lines = 0, cap = 0;
  char *line = NULL;
  ssize_t len;
  while (getline(&line, &cap, fp) > 0) lines++;
  slapo_status st = slapo__merges_reserve(t, lines);
  rewind(fp);
  char where[600];
  for (size_t no = 1; st == SLAPO_OK && (len = getline(&line, &cap, fp)) > 0; no++) {
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    if ((no == 1 && strncmp(line, "#version", 8) == 0) || len == 0) continue;
    snprintf(where, sizeof where, "%s:%zu", path, no);
    if (memchr(line, '\0', (size_t)len)) st = slapo_error(SLAPO_PARSE, "%s: a NUL byte in the line", where);
    else st = add_merge_line(t, line, where);
  }
  free(line);
  fclose(fp);
  return st;
}

slapo_status slapo_tokenizer_load_bpe(const char *vocab_json, const char *merges_txt,
                                      slapo_tokenizer **out) {
  SLAPO_NEED(vocab_json, "slapo_tokenizer_load_bpe");
  SLAPO_NEED(merges_txt, "slapo_tokenizer_load_bpe");
  SLAPO_NEED(out, "slapo_tokenizer_load_bpe");
  *out = NULL;
  json_t *root;
  SLAPO_TRY(load_json(vocab_json, &root));
  slapo_tokenizer *t = slapo_calloc(1, sizeof *t);
  slapo_status st = t ? build_vocab(t, root, NULL, true, vocab_json)
                      : slapo_error(SLAPO_NOMEM, "%s: out of memory", vocab_json);
  json_decref(root);
  if (st == SLAPO_OK) st = read_merges(t, merges_txt);
  if (st != SLAPO_OK) return slapo_tokenizer_free(t), st;
  *out = t;
  return SLAPO_OK;
}

slapo_status slapo_tokenizer_load_spm(const char *path, slapo_tokenizer **out) {
  SLAPO_NEED(path, "slapo_tokenizer_load_spm");
  SLAPO_NEED(out, "slapo_tokenizer_load_spm");
  *out = NULL;
  char err[512];
  void *h;
  if (slapo__spm_load(path, &h, err, sizeof err) != 0)
    return slapo_error(SLAPO_PARSE, "%s: not a SentencePiece model: %s", path, err);
  slapo_tokenizer *t = slapo_calloc(1, sizeof *t);
  int32_t n = slapo__spm_size(h);
  size_t total = 0;
  for (int32_t id = 0; id < n; id++) total += slapo__spm_piece(h, id, NULL, 0);
  slapo_status st = SLAPO_OK;
  if (t) {
    t->spm = h, h = NULL, t->n_vocab = n;
    t->tok_off = slapo_malloc(((size_t)n + 1) * sizeof *t->tok_off);
    t->tok_bytes = slapo_malloc(total + 1);
    t->special = slapo_malloc((size_t)n * sizeof *t->special + 1);
  }
  if (!t || !t->tok_off || !t->tok_bytes || !t->special) {
    st = slapo_error(SLAPO_NOMEM, "%s: out of memory", path);
  } else {
    t->tok_off[0] = 0;
    for (int32_t id = 0; id < n; id++) {
      size_t k = slapo__spm_piece(t->spm, id, (char *)t->tok_bytes + t->tok_off[id], total - t->tok_off[id]);
      t->tok_off[id + 1] = t->tok_off[id] + (uint32_t)k;
      /* Control pieces (<s>, </s>) are the special tokens; an empty one
       * (SentencePiece may leave a control piece's text empty) is not. */
      if (slapo__spm_is_control(t->spm, id) && k) t->special[t->n_special++] = id;
    }
    st = slapo__merges_reserve(t, 0);
  }
  slapo__spm_free(h);
  if (st != SLAPO_OK) return slapo_tokenizer_free(t), st;
  *out = t;
  return SLAPO_OK;
}

void slapo_tokenizer_free(slapo_tokenizer *t) {
  if (!t) return;
  slapo__spm_free(t->spm);
  slapo_free(t->tok_off);
  slapo_free(t->tok_bytes);
  slapo_free(t->tok_slot);
  slapo_free(t->pair_key);
  slapo_free(t->pair_rank);
  slapo_free(t->pair_out);
  slapo_free(t->merge_left);
  slapo_free(t->merge_right);
  slapo_free(t->special);
  slapo_free(t->cache);
  slapo_free(t);
}

int32_t slapo_tokenizer_vocab_size(const slapo_tokenizer *t) { return t ? t->n_vocab : 0; }

int32_t slapo_tokenizer_special_id(const slapo_tokenizer *t, const char *text) {
  if (!t || !text) return -1;
  size_t m = strlen(text);
  for (int k = 0; k < t->n_special; k++) {
    int32_t id = t->special[k];
    if (t->tok_off[id + 1] - t->tok_off[id] == m && memcmp(t->tok_bytes + t->tok_off[id], text, m) == 0)
      return id;
  }
  return -1;
}

const char *slapo_unicode_version(void) { return slapo__unicode_version; }

slapo_status slapo_tokenizer_bytes(slapo_tokenizer **out) {
  SLAPO_NEED(out, "slapo_tokenizer_bytes");
  *out = NULL;
  uint32_t off[257];
  uint8_t bytes[256];
  for (int b = 0; b < 256; b++) off[b] = (uint32_t)b, bytes[b] = (uint8_t)b;
  off[256] = 256;
  slapo_tokenizer *t = slapo_calloc(1, sizeof *t);
  slapo_status st = t ? slapo__tok_build(t, off, bytes, 256, "bytes") : slapo_error(SLAPO_NOMEM, "bytes: out of memory");
  if (st == SLAPO_OK) st = slapo__merges_reserve(t, 0);
  if (st != SLAPO_OK) return slapo_tokenizer_free(t), st;
  *out = t;
  return SLAPO_OK;
}

static bool is_file(const char *dir, const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (f) fclose(f);
  return f != NULL;
}

slapo_status slapo_tokenizer_open(const char *spec, slapo_tokenizer **out) {
  SLAPO_NEED(spec, "slapo_tokenizer_open");
  SLAPO_NEED(out, "slapo_tokenizer_open");
  *out = NULL;
  if (!strcmp(spec, "bytes")) return slapo_tokenizer_bytes(out);
  size_t n = strlen(spec);
  DIR *d = opendir(spec);
  if (!d && n > 6 && !strcmp(spec + n - 6, ".model")) return slapo_tokenizer_load_spm(spec, out);
  if (!d) return slapo_tokenizer_load(spec, out);
  closedir(d);
  char a[4200], b[4200];
  if (is_file(spec, "tokenizer.json", a, sizeof a)) return slapo_tokenizer_load(a, out);
  if (is_file(spec, "tokenizer.model", a, sizeof a)) return slapo_tokenizer_load_spm(a, out);
  if (is_file(spec, "vocab.json", a, sizeof a) && is_file(spec, "merges.txt", b, sizeof b))
    return slapo_tokenizer_load_bpe(a, b, out);
  if (is_file(spec, "encoder.json", a, sizeof a) && is_file(spec, "vocab.bpe", b, sizeof b))
    return slapo_tokenizer_load_bpe(a, b, out);
  return slapo_error(SLAPO_IO,
                     "%s: a tokenizer directory holds tokenizer.json, tokenizer.model, vocab.json + "
                     "merges.txt, or encoder.json + vocab.bpe; this one has none of them",
                     spec);
}

int32_t slapo_tokenizer_token_len(const slapo_tokenizer *t, int32_t id) {
  if (!t || id < 0 || id >= t->n_vocab) return 0;
  return (int32_t)(t->tok_off[id + 1] - t->tok_off[id]);
}
