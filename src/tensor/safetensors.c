/* tensor/safetensors.c - reading (with full validation) and atomic writing
 * of safetensors files: an 8-byte little-endian header length N, N bytes of
 * JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {k: v}},
 * then the raw little-endian tensor data.
 * Layer: tensor. Format and validation rules: the reference implementation,
 * https://github.com/huggingface/safetensors (safetensors/src/tensor.rs). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/assert.h"
#include "slapo/tensor.h"

/* Headers larger than this are rejected, as in the reference implementation. */
#define MAX_HEADER_NBYTES 100000000u

typedef struct entry {
  const char *name; /* in the arena */
  slapo_dtype dtype;
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
  uint64_t begin, end; /* byte offsets into the data region */
} entry;

struct slapo_safetensors {
  slapo_arena *arena;    /* path, names, metadata strings, the tables */
  const char *path;
  unsigned char *buf;    /* the whole file (mapped), or the header (slapo_malloc) */
  size_t mapped;         /* > 0: buf is a read-only private mapping of this size */
  const unsigned char *data; /* data region inside buf; NULL header-only */
  bool header_only;
  uint64_t data_nbytes;
  int n;
  entry *entries;        /* sorted by name */
  int n_meta;
  const char **meta_keys, **meta_values; /* sorted by key */
};

/* Sets SLAPO_IO with the "safetensors: <path>: " prefix. */
__attribute__((format(printf, 2, 3))) static slapo_status io_error(const char *path,
                                                                   const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return slapo_error(SLAPO_IO, "safetensors: %s: %s", path, msg);
}

static slapo_status nomem(const char *path) {
  return slapo_error(SLAPO_NOMEM, "safetensors: %s: out of memory", path);
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* Orders entries by data range (begin, then end) for the coverage check. */
static int cmp_entry_range(const void *a, const void *b) {
  const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

typedef struct kv {
  const char *key, *value;
} kv;

static int cmp_kv(const void *a, const void *b) {
  return strcmp(((const kv *)a)->key, ((const kv *)b)->key);
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */
/* ------------------------------------------------------------------------ */

/* The bytes of a file of `size` bytes that a header-only read needs: the
 * 8-byte length and the header it gives (what is there of them; parse
 * checks the lengths against `size`). */
static size_t header_span(FILE *fp, size_t size) {
  uint64_t hlen = 0;
  if (size < 8 || fread(&hlen, 1, 8, fp) != 8 || fseek(fp, 0, SEEK_SET) != 0) return size;
  if (hlen > MAX_HEADER_NBYTES) hlen = MAX_HEADER_NBYTES;
  return hlen < size - 8 ? (size_t)hlen + 8 : size;
}

/* Reads the file into f->buf, whole or (header_only) its header; *nbytes
 * receives the file's size. */
static slapo_status read_file(slapo_safetensors *f, const char *path, bool header_only,
                              size_t *nbytes) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return io_error(path, "cannot open: %s", strerror(errno));
  struct stat st;
  if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
    slapo_status s = io_error(path, "not a regular file");
    fclose(fp);
    return s;
  }
  size_t n = header_only ? header_span(fp, (size_t)st.st_size) : (size_t)st.st_size;
  if (!header_only && n > 0) {
    /* The whole file is mapped, not read: its pages are the page cache's,
     * which the kernel can drop and read again, so loading a checkpoint as
     * large as the model (GPT-2 1.5B: 6 GB of weights, 6 GB of optimizer
     * state) into a process already holding the model does not need that
     * much more memory. Files are replaced by rename (slapo_write_atomic),
     * so the mapped file is never rewritten in place. */
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fileno(fp), 0);
    int err = errno;
    fclose(fp);
    if (p == MAP_FAILED) return io_error(path, "cannot map %zu bytes: %s", n, strerror(err));
    madvise(p, n, MADV_SEQUENTIAL);
    f->buf = p;
    f->mapped = n;
    *nbytes = n;
    return SLAPO_OK;
  }
  f->buf = slapo_malloc(n ? n : 1);
  if (!f->buf) {
    fclose(fp);
    return nomem(path);
  }
  size_t got = fread(f->buf, 1, n, fp);
  int err = ferror(fp) ? errno : 0;
  fclose(fp);
  if (got != n)
    return io_error(path, "read %zu of %zu bytes: %s", got, n,
                    err ? strerror(err) : "file shrank while reading");
  *nbytes = (size_t)st.st_size;
  return SLAPO_OK;
}

/* Parses one tensor entry `v` named `name` into *e (range checks later). */
static slapo_status parse_entry(slapo_safetensors *f, const char *name, json_t *v, entry *e) {
  const char *path = f->path;
  if (!json_is_object(v)) return io_error(path, "tensor '%s' entry is not a JSON object", name);
  e->name = slapo_arena_strdup(f->arena, name);
  if (!e->name) return nomem(path);

  json_t *jd = json_object_get(v, "dtype");
  if (!jd) return io_error(path, "tensor '%s' has no 'dtype'", name);
  if (!json_is_string(jd)) return io_error(path, "tensor '%s' dtype is not a string", name);
  if (slapo_dtype_from_st_name(json_string_value(jd), &e->dtype) != SLAPO_OK)
    return io_error(path, "tensor '%s' has unknown dtype '%s'", name, json_string_value(jd));

  json_t *js = json_object_get(v, "shape");
  if (!js) return io_error(path, "tensor '%s' has no 'shape'", name);
  if (!json_is_array(js)) return io_error(path, "tensor '%s' shape is not an array", name);
  if (json_array_size(js) > SLAPO_MAX_DIMS)
    return io_error(path, "tensor '%s' has %zu dims; at most %d are supported", name,
                    json_array_size(js), SLAPO_MAX_DIMS);
  e->ndim = (int)json_array_size(js);
  uint64_t nbytes = slapo_dtype_size(e->dtype);
  bool too_big = false;
  for (int i = 0; i < e->ndim; i++) {
    json_t *d = json_array_get(js, (size_t)i);
    if (!json_is_integer(d))
      return io_error(path, "tensor '%s' shape dim %d is not an integer", name, i);
    e->shape[i] = json_integer_value(d);
    if (e->shape[i] < 0)
      return io_error(path, "tensor '%s' shape dim %d is negative (%" PRId64 ")", name, i,
                      e->shape[i]);
    if (e->shape[i] && nbytes > (uint64_t)INT64_MAX / (uint64_t)e->shape[i]) too_big = true;
    else nbytes *= (uint64_t)e->shape[i];
  }
  /* Also with a zero dim: [0, 2^62, 8] holds no byte, but its strides overflow. */
  too_big |= !slapo_shape_addressable(e->ndim, e->shape, slapo_dtype_size(e->dtype));

  json_t *jo = json_object_get(v, "data_offsets");
  if (!jo) return io_error(path, "tensor '%s' has no 'data_offsets'", name);
  if (!json_is_array(jo) || json_array_size(jo) != 2 ||
      !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
    return io_error(path, "tensor '%s' data_offsets is not an array of two integers", name);
  json_int_t b = json_integer_value(json_array_get(jo, 0));
  json_int_t en = json_integer_value(json_array_get(jo, 1));
  if (b < 0 || en < 0)
    return io_error(path, "tensor '%s' data_offsets [%lld, %lld] are negative", name,
                    (long long)b, (long long)en);
  if (b > en)
    return io_error(path, "tensor '%s' data_offsets [%lld, %lld] have begin > end", name,
                    (long long)b, (long long)en);
  if ((uint64_t)en > f->data_nbytes)
    return io_error(path, "tensor '%s' data_offsets [%lld, %lld] exceed data size %" PRIu64,
                    name, (long long)b, (long long)en, f->data_nbytes);
  e->begin = (uint64_t)b;
  e->end = (uint64_t)en;
  if (too_big || nbytes != e->end - e->begin) {
    char shp[160];
    slapo_shape_str(e->ndim, e->shape, shp, sizeof shp);
    if (too_big) return io_error(path, "tensor '%s' shape %s is too large", name, shp);
    return io_error(path, "tensor '%s' dtype %s shape %s needs %" PRIu64
                    " bytes but data_offsets [%lld, %lld] span %" PRIu64, name,
                    slapo_dtype_st_name(e->dtype), shp, nbytes, (long long)b, (long long)en,
                    e->end - e->begin);
  }
  return SLAPO_OK;
}

/* Reads `__metadata__` (an object of strings) into the sorted key table. */
static slapo_status parse_metadata(slapo_safetensors *f, json_t *m) {
  const char *path = f->path;
  if (!json_is_object(m)) return io_error(path, "__metadata__ is not a JSON object");
  size_t n = json_object_size(m);
  kv *tab = slapo_arena_alloc(f->arena, n * sizeof *tab, 0);
  if (!tab) return nomem(path);
  const char *key;
  json_t *v;
  size_t i = 0;
  json_object_foreach(m, key, v) {
    if (!json_is_string(v))
      return io_error(path, "__metadata__ value for key '%s' is not a string", key);
    tab[i].key = slapo_arena_strdup(f->arena, key);
    tab[i].value = slapo_arena_strdup(f->arena, json_string_value(v));
    if (!tab[i].key || !tab[i].value) return nomem(path);
    i++;
  }
  qsort(tab, n, sizeof *tab, cmp_kv);
  f->meta_keys = slapo_arena_alloc(f->arena, n * sizeof *f->meta_keys, 0);
  f->meta_values = slapo_arena_alloc(f->arena, n * sizeof *f->meta_values, 0);
  if (!f->meta_keys || !f->meta_values) return nomem(path);
  for (i = 0; i < n; i++) {
    f->meta_keys[i] = tab[i].key;
    f->meta_values[i] = tab[i].value;
  }
  f->n_meta = (int)n;
  return SLAPO_OK;
}

/* Requires the tensors' data ranges to tile the data region exactly: sorted
 * by offset, each begins where the previous ended and the last ends at the
 * end of the file. */
static slapo_status check_coverage(slapo_safetensors *f) {
  const char *path = f->path;
  entry **order = slapo_arena_alloc(f->arena, (size_t)f->n * sizeof *order, 0);
  if (!order) return nomem(path);
  for (int i = 0; i < f->n; i++) order[i] = &f->entries[i];
  qsort(order, (size_t)f->n, sizeof *order, cmp_entry_range);
  uint64_t pos = 0;
  const entry *prev = NULL;
  for (int i = 0; i < f->n; i++) {
    const entry *e = order[i];
    if (e->begin < pos)
      return io_error(path, "tensors '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] and '%s' "
                      "data_offsets [%" PRIu64 ", %" PRIu64 "] overlap", prev->name,
                      prev->begin, prev->end, e->name, e->begin, e->end);
    if (e->begin > pos)
      return io_error(path, "data bytes [%" PRIu64 ", %" PRIu64 ") before tensor '%s' belong "
                      "to no tensor", pos, e->begin, e->name);
    pos = e->end;
    prev = e;
  }
  if (pos != f->data_nbytes)
    return io_error(path, "tensors cover %" PRIu64 " of the %" PRIu64 " data bytes; bytes [%"
                    PRIu64 ", %" PRIu64 ") belong to no tensor", pos, f->data_nbytes, pos,
                    f->data_nbytes);
  return SLAPO_OK;
}

/* The top-level key whose value holds byte `pos` of the header text (a
 * tensor name or "__metadata__"), copied into buf [cap]; "" when pos lies
 * outside every value. A small scan of JSON's structure (strings, escapes,
 * nesting), enough to name where jansson stopped. */
static void key_at(const char *h, size_t n, size_t pos, char *buf, size_t cap) {
  int depth = 0;
  size_t ks = 0, ke = 0; /* the last string seen at depth 1 */
  buf[0] = '\0';
  for (size_t i = 0; i < n && i < pos; i++) {
    char c = h[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < n && h[j] != '"') j += h[j] == '\\' ? 2 : 1;
      if (depth == 1) ks = i + 1, ke = j < n ? j : n;
      i = j;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  if (depth >= 2 || (depth == 1 && ke > ks && pos > ke))
    snprintf(buf, cap, "%.*s", (int)(ke - ks), h + ks);
}

/* jansson's "too big integer" names no tensor: say which one holds it. */
static slapo_status number_overflow(slapo_safetensors *f, const char *hdr, size_t n,
                                    const json_error_t *jerr) {
  char key[256];
  key_at(hdr, n, (size_t)jerr->position, key, sizeof key);
  const char *near = strstr(jerr->text, "near ");
  near = near ? near + 5 : jerr->text;
  if (!strcmp(key, "__metadata__"))
    return io_error(f->path, "__metadata__ holds an integer too large for 64 bits (%s)", near);
  if (key[0])
    return io_error(f->path, "tensor '%s' holds an integer too large for 64 bits (%s); "
                    "dims and data_offsets must fit in int64", key, near);
  return io_error(f->path, "header holds an integer too large for 64 bits (%s)", near);
}

/* Parses and validates the header of the file already in f->buf. */
static slapo_status parse(slapo_safetensors *f, size_t file_nbytes) {
  const char *path = f->path;
  if (file_nbytes < 8)
    return io_error(path, "file is %zu bytes, shorter than the 8-byte header length",
                    file_nbytes);
  uint64_t hlen;
  memcpy(&hlen, f->buf, 8);
  if (hlen > file_nbytes - 8)
    return io_error(path, "header length %" PRIu64 " exceeds the %zu bytes after it", hlen,
                    file_nbytes - 8);
  if (hlen > MAX_HEADER_NBYTES)
    return io_error(path, "header length %" PRIu64 " exceeds the limit of %u bytes", hlen,
                    MAX_HEADER_NBYTES);
  f->data = f->header_only ? NULL : f->buf + 8 + hlen;
  f->data_nbytes = file_nbytes - 8 - hlen;

  /* The format (and its reference reader) wants the JSON object to start
   * right after the length; only trailing spaces may pad it. jansson would
   * skip leading blanks. */
  const char *hdr = (const char *)f->buf + 8;
  if (hlen == 0) return io_error(path, "header is empty (length 0); it must be a JSON object");
  if (hdr[0] != '{') {
    unsigned char c = (unsigned char)hdr[0];
    char shown[16] = "";
    if (c > ' ' && c < 0x7f) snprintf(shown, sizeof shown, " ('%c')", c);
    return io_error(path, "header is not a JSON object starting right after the 8-byte length: "
                    "its first byte is 0x%02x%s (leading whitespace is not allowed; only "
                    "trailing padding is)", (unsigned)c, shown);
  }
  json_error_t jerr;
  json_t *root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    if (json_error_code(&jerr) == json_error_numeric_overflow)
      return number_overflow(f, hdr, (size_t)hlen, &jerr);
    if (json_error_code(&jerr) == json_error_duplicate_key) {
      /* jansson reports the key as the token: duplicate object key near '"w"'. */
      const char *tok = strstr(jerr.text, "near '\"");
      size_t len = tok ? strlen(tok += 7) : 0;
      if (len >= 2 && tok[len - 1] == '\'' && tok[len - 2] == '"')
        return io_error(path, "header names tensor '%.*s' twice", (int)(len - 2), tok);
      return io_error(path, "header has a duplicate tensor name: %s", jerr.text);
    }
    return io_error(path, "header is not valid JSON: %s (line %d, column %d)", jerr.text,
                    jerr.line, jerr.column);
  }
  slapo_status s = SLAPO_OK;
  if (!json_is_object(root)) {
    s = io_error(path, "header is not a JSON object");
    goto done;
  }
  json_t *meta = json_object_get(root, "__metadata__");
  size_t n = json_object_size(root) - (meta != NULL);
  if (n > INT32_MAX) {
    s = io_error(path, "header lists %zu tensors; at most %d are supported", n, INT32_MAX);
    goto done;
  }
  if (meta && (s = parse_metadata(f, meta)) != SLAPO_OK) goto done;
  f->entries = slapo_arena_alloc(f->arena, n * sizeof *f->entries, 0);
  if (!f->entries) {
    s = nomem(path);
    goto done;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (v == meta) continue;
    if ((s = parse_entry(f, key, v, &f->entries[f->n])) != SLAPO_OK) goto done;
    f->n++;
  }
  qsort(f->entries, (size_t)f->n, sizeof *f->entries, cmp_entry_name);
  s = check_coverage(f);
done:
  json_decref(root);
  return s;
}

static slapo_status read_any(const char *path, bool header_only, slapo_safetensors **out) {
  SLAPO_ASSERT(out);
  *out = NULL;
  if (!path) return slapo_error(SLAPO_INVALID_ARG, "safetensors_read: path is NULL");
  slapo_safetensors *f = slapo_malloc(sizeof *f);
  if (!f) return nomem(path);
  memset(f, 0, sizeof *f);
  slapo_status s = slapo_arena_new(0, &f->arena);
  if (s != SLAPO_OK) {
    slapo_free(f);
    return nomem(path);
  }
  size_t nbytes = 0;
  f->header_only = header_only;
  if (!(f->path = slapo_arena_strdup(f->arena, path))) s = nomem(path);
  else if ((s = read_file(f, path, header_only, &nbytes)) == SLAPO_OK) s = parse(f, nbytes);
  if (s != SLAPO_OK) {
    slapo_safetensors_free(f);
    return s;
  }
  *out = f;
  return SLAPO_OK;
}

slapo_status slapo_safetensors_read(const char *path, slapo_safetensors **out) {
  return read_any(path, false, out);
}

slapo_status slapo_safetensors_read_header(const char *path, slapo_safetensors **out) {
  return read_any(path, true, out);
}

void slapo_safetensors_free(slapo_safetensors *f) {
  if (!f) return;
  if (f->mapped) munmap(f->buf, f->mapped);
  else slapo_free(f->buf);
  slapo_arena_free(f->arena);
  slapo_free(f);
}

int slapo_safetensors_count(const slapo_safetensors *f) { return f->n; }

const char *slapo_safetensors_name(const slapo_safetensors *f, int i) {
  SLAPO_ASSERT(i >= 0 && i < f->n);
  return f->entries[i].name;
}

const char *slapo_safetensors_metadata(const slapo_safetensors *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++) /* few keys: a linear scan is enough */
    if (strcmp(key, f->meta_keys[i]) == 0) return f->meta_values[i];
  return NULL;
}

static const entry *find(const slapo_safetensors *f, const char *name) {
  entry probe = {.name = name};
  return bsearch(&probe, f->entries, (size_t)f->n, sizeof *f->entries, cmp_entry_name);
}

slapo_status slapo_safetensors_meta(const slapo_safetensors *f, const char *name,
                                    slapo_tensor **out) {
  SLAPO_ASSERT(f && name && out);
  *out = NULL;
  const entry *e = find(f, name);
  if (!e) return slapo_error(SLAPO_NOT_FOUND, "safetensors: %s: no tensor '%s'", f->path, name);
  return slapo_tensor_new_meta(e->dtype, e->ndim, e->shape, out);
}

slapo_status slapo_safetensors_get(const slapo_safetensors *f, const char *name,
                                   slapo_tensor **out) {
  SLAPO_ASSERT(f && name && out);
  *out = NULL;
  const entry *e = find(f, name);
  if (!e) return slapo_error(SLAPO_NOT_FOUND, "safetensors: %s: no tensor '%s'", f->path, name);
  if (!f->data)
    return slapo_error(SLAPO_STATE, "safetensors: %s: read header-only; tensor '%s' has no data",
                       f->path, name);
  return slapo_tensor_from_data(e->dtype, e->ndim, e->shape, f->data + e->begin, out);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct named {
  const char *name;
  const slapo_tensor *t;
} named;

static int cmp_named(const void *a, const void *b) {
  return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* Checks the arguments of slapo_safetensors_write and sorts the tensors and
 * metadata by name into `ts` and `kvs`; nothing on disk is touched yet. */
static slapo_status check_write_args(const char *path, int n, const char *const *names,
                                     const slapo_tensor *const *tensors, int n_meta,
                                     const char *const *keys, const char *const *values,
                                     named *ts, kv *kvs) {
  const char *op = "safetensors_write";
  for (int i = 0; i < n; i++) {
    if (!names[i] || !names[i][0])
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: tensor %d has %s name", op, path, i,
                         names[i] ? "an empty" : "a NULL");
    if (strcmp(names[i], "__metadata__") == 0)
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: tensor %d is named '__metadata__', "
                         "which the format reserves", op, path, i);
    if (!tensors[i])
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: tensor '%s' is NULL", op, path, names[i]);
    if (!tensors[i]->storage)
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: tensor '%s' is a meta tensor (no data)",
                         op, path, names[i]);
    ts[i] = (named){names[i], tensors[i]};
  }
  qsort(ts, (size_t)n, sizeof *ts, cmp_named);
  for (int i = 1; i < n; i++)
    if (strcmp(ts[i - 1].name, ts[i].name) == 0)
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: duplicate tensor name '%s'", op, path,
                         ts[i].name);
  for (int i = 0; i < n_meta; i++) {
    if (!keys[i] || !values[i])
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: metadata entry %d has a NULL %s", op, path,
                         i, keys[i] ? "value" : "key");
    kvs[i] = (kv){keys[i], values[i]};
  }
  qsort(kvs, (size_t)n_meta, sizeof *kvs, cmp_kv);
  for (int i = 1; i < n_meta; i++)
    if (strcmp(kvs[i - 1].key, kvs[i].key) == 0)
      return slapo_error(SLAPO_INVALID_ARG, "%s: %s: duplicate metadata key '%s'", op, path,
                         kvs[i].key);
  return SLAPO_OK;
}

/* Builds the header: 8-byte length, then the JSON padded with spaces so the
 * data starts 8-byte aligned. *out owned (slapo_free). */
static slapo_status build_header(const char *path, int n, const named *ts, int n_meta,
                                 const kv *kvs, unsigned char **out, size_t *out_nbytes) {
  const char *op = "safetensors_write";
  slapo_status s = SLAPO_OK;
  json_t *root = json_object();
  if (!root) return slapo_error(SLAPO_NOMEM, "%s: %s: out of memory (JSON)", op, path);
  if (n_meta) {
    json_t *m = json_object();
    if (json_object_set_new(root, "__metadata__", m)) goto nomem_json;
    for (int i = 0; i < n_meta; i++) {
      json_t *v = json_string(kvs[i].value);
      if (!v || json_object_set_new(m, kvs[i].key, v)) {
        s = slapo_error(SLAPO_INVALID_ARG, "%s: %s: metadata '%s' is not valid UTF-8", op, path,
                        kvs[i].key);
        goto done;
      }
    }
  }
  uint64_t pos = 0;
  for (int i = 0; i < n; i++) {
    const slapo_tensor *t = ts[i].t;
    uint64_t nb = slapo_tensor_nbytes(t);
    json_t *shape = json_array();
    json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", slapo_dtype_st_name(t->dtype),
                          "shape", shape, "data_offsets", (json_int_t)pos,
                          (json_int_t)(pos + nb));
    if (!e) goto nomem_json; /* json_pack consumed `shape` */
    for (int d = 0; d < t->ndim; d++)
      if (json_array_append_new(shape, json_integer(t->shape[d]))) {
        json_decref(e);
        goto nomem_json;
      }
    if (json_object_set_new(root, ts[i].name, e)) {
      s = slapo_error(SLAPO_INVALID_ARG, "%s: %s: tensor name '%s' is not valid UTF-8", op, path,
                      ts[i].name);
      goto done;
    }
    pos += nb;
  }
  size_t jlen = json_dumpb(root, NULL, 0, JSON_COMPACT);
  if (!jlen) goto nomem_json;
  size_t hlen = (jlen + 7) & ~(size_t)7;
  unsigned char *buf = slapo_malloc(8 + hlen);
  if (!buf) {
    s = slapo_error(SLAPO_NOMEM, "%s: %s: out of memory for a %zu-byte header", op, path, hlen);
    goto done;
  }
  uint64_t hlen64 = hlen;
  memcpy(buf, &hlen64, 8);
  size_t again = json_dumpb(root, (char *)buf + 8, jlen, JSON_COMPACT);
  SLAPO_ASSERT(again == jlen);
  memset(buf + 8 + jlen, ' ', hlen - jlen);
  *out = buf;
  *out_nbytes = 8 + hlen;
  goto done;
nomem_json:
  s = slapo_error(SLAPO_NOMEM, "%s: %s: out of memory (JSON)", op, path);
done:
  json_decref(root);
  return s;
}

/* What slapo_safetensors_write puts in the file. */
typedef struct body {
  const unsigned char *hdr;
  size_t hdr_nbytes;
  int n;
  const named *ts;
} body;

/* Writes header and data to `fp` (slapo_write_fn). */
static slapo_status write_body(FILE *fp, const char *tmp, void *ud) {
  const body *b = ud;
  if (fwrite(b->hdr, 1, b->hdr_nbytes, fp) != b->hdr_nbytes)
    return slapo_error(SLAPO_IO, "safetensors_write: %s: write failed: %s", tmp, strerror(errno));
  for (int i = 0; i < b->n; i++) {
    const slapo_tensor *t = b->ts[i].t;
    slapo_tensor *c = NULL;
    if (!slapo_tensor_is_contiguous(t)) {
      SLAPO_TRY(slapo_tensor_contiguous(t, &c));
      t = c;
    }
    size_t nb = slapo_tensor_nbytes(t);
    size_t put = nb ? fwrite(slapo_tensor_data(t), 1, nb, fp) : 0;
    slapo_tensor_free(c);
    if (put != nb)
      return slapo_error(SLAPO_IO, "safetensors_write: %s: writing tensor '%s' failed: %s", tmp,
                         b->ts[i].name, strerror(errno));
  }
  return SLAPO_OK;
}

slapo_status slapo_safetensors_write(const char *path, int n, const char *const *names,
                                     const slapo_tensor *const *tensors, int n_meta,
                                     const char *const *meta_keys,
                                     const char *const *meta_values) {
  const char *op = "safetensors_write";
  if (!path || !path[0]) return slapo_error(SLAPO_INVALID_ARG, "%s: path is empty", op);
  if (n < 0 || n_meta < 0 || (n && (!names || !tensors)) ||
      (n_meta && (!meta_keys || !meta_values)))
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s: bad counts or NULL arrays (n %d, n_meta %d)",
                       op, path, n, n_meta);
  slapo_status s;
  named *ts = slapo_malloc((size_t)n * sizeof *ts);
  kv *kvs = slapo_malloc((size_t)n_meta * sizeof *kvs);
  unsigned char *hdr = NULL;
  size_t hdr_nbytes = 0;
  if (!ts || !kvs) s = slapo_error(SLAPO_NOMEM, "%s: %s: out of memory", op, path);
  else if ((s = check_write_args(path, n, names, tensors, n_meta, meta_keys, meta_values, ts,
                                 kvs)) == SLAPO_OK &&
           (s = build_header(path, n, ts, n_meta, kvs, &hdr, &hdr_nbytes)) == SLAPO_OK) {
    body b = {hdr, hdr_nbytes, n, ts};
    s = slapo_write_atomic(path, op, write_body, &b);
  }
  slapo_free(hdr);
  slapo_free(kvs);
  slapo_free(ts);
  return s;
}
