/* tensor/tensor.c - refcounted storage and the tensor object: creation
 * (zeroed, meta, from data, wrapping external memory), release,
 * materialization, element access, strided copy, dtype conversion, equality
 * and printing. Views live in view.c.
 * Layer: tensor. Stride and contiguity rules follow PyTorch (size-1 dims
 * and empty tensors do not constrain strides). */
#include <inttypes.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/tensor.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "slapo assumes a little-endian host (safetensors data is little-endian)"
#endif

/* ------------------------------------------------------------------------ */
/* Storage                                                                   */
/* ------------------------------------------------------------------------ */

/* New storage with one reference: `nbytes` bytes (zeroed if `zero`), or
 * `external` memory (not owned) when it is non-NULL. NULL on allocation
 * failure. */
static slapo_storage *storage_new(size_t nbytes, bool zero, void *external) {
  slapo_storage *s = slapo_malloc(sizeof *s);
  if (!s) return NULL;
  s->nbytes = nbytes;
  s->refcount = 1;
  s->external = external != NULL;
  if (external) {
    s->data = external;
  } else {
    /* Never zero bytes, so data is always a valid pointer for memcpy. */
    s->data = slapo_aligned_alloc(nbytes ? nbytes : 1);
    if (!s->data) {
      slapo_free(s);
      return NULL;
    }
    if (zero) memset(s->data, 0, nbytes);
  }
  return s;
}

static void storage_unref(slapo_storage *s) {
  if (!s) return;
  SLAPO_ASSERT(s->refcount > 0);
  if (--s->refcount > 0) return;
  if (!s->external) slapo_aligned_free(s->data);
  slapo_free(s);
}

/* ------------------------------------------------------------------------ */
/* Creation and release                                                      */
/* ------------------------------------------------------------------------ */

/* Checks a requested dtype and shape; on success *nbytes is the byte size of
 * a contiguous tensor of that shape. `op` names the caller in messages. */
static slapo_status check_shape(const char *op, slapo_dtype dt, int ndim, const int64_t *shape,
                                size_t *nbytes) {
  if ((unsigned)dt >= SLAPO_DTYPE_COUNT)
    return slapo_error(SLAPO_INVALID_ARG, "%s: %d is not a dtype", op, (int)dt);
  if (ndim < 0 || ndim > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: ndim %d is outside [0, %d]", op, ndim,
                       SLAPO_MAX_DIMS);
  if (ndim > 0 && !shape)
    return slapo_error(SLAPO_INVALID_ARG, "%s: shape is NULL for ndim %d", op, ndim);
  char buf[160];
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return slapo_error(SLAPO_INVALID_ARG, "%s: shape %s has negative dim %d (%" PRId64 ")", op,
                         slapo_shape_str(ndim, shape, buf, sizeof buf), i, shape[i]);
  /* Byte count and strides representable as both size_t and int64_t. */
  if (!slapo_shape_addressable(ndim, shape, slapo_dtype_size(dt)))
    return slapo_error(SLAPO_INVALID_ARG, "%s: %s%s is too large to address (its strides "
                       "overflow 64 bits, zero dims counted as 1)", op, slapo_dtype_name(dt),
                       slapo_shape_str(ndim, shape, buf, sizeof buf));
  *nbytes = (size_t)slapo_shape_numel(ndim, shape) * slapo_dtype_size(dt);
  return SLAPO_OK;
}

/* Shared by the constructors: `data_kind` 'm' meta, 'z' zeroed storage,
 * 'u' uninitialized storage (the caller fills every byte), 'x' external
 * memory `ext`. */
static slapo_status tensor_make(const char *op, slapo_dtype dt, int ndim, const int64_t *shape,
                                char data_kind, void *ext, slapo_tensor **out) {
  SLAPO_ASSERT(out);
  *out = NULL;
  size_t nbytes = 0;
  SLAPO_TRY(check_shape(op, dt, ndim, shape, &nbytes));
  slapo_tensor *t = slapo_malloc(sizeof *t);
  if (!t) return slapo_error(SLAPO_NOMEM, "%s: out of memory for the tensor header", op);
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->ndim = ndim;
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  slapo_shape_contiguous_strides(ndim, t->shape, t->strides);
  if (data_kind != 'm') {
    t->storage = storage_new(nbytes, data_kind == 'z', data_kind == 'x' ? ext : NULL);
    if (!t->storage) {
      slapo_free(t);
      char buf[160];
      return slapo_error(SLAPO_NOMEM, "%s: out of memory for %s%s (%zu bytes)", op,
                         slapo_dtype_name(dt), slapo_shape_str(ndim, shape, buf, sizeof buf),
                         nbytes);
    }
  }
  *out = t;
  return SLAPO_OK;
}

slapo_status slapo_tensor_new(slapo_dtype dt, int ndim, const int64_t *shape,
                              slapo_tensor **out) {
  return tensor_make("tensor_new", dt, ndim, shape, 'z', NULL, out);
}

slapo_status slapo_tensor_new_meta(slapo_dtype dt, int ndim, const int64_t *shape,
                                   slapo_tensor **out) {
  return tensor_make("tensor_new_meta", dt, ndim, shape, 'm', NULL, out);
}

slapo_status slapo_tensor_from_data(slapo_dtype dt, int ndim, const int64_t *shape,
                                    const void *data, slapo_tensor **out) {
  SLAPO_ASSERT(out);
  *out = NULL;
  if (!data) return slapo_error(SLAPO_INVALID_ARG, "tensor_from_data: data is NULL");
  SLAPO_TRY(tensor_make("tensor_from_data", dt, ndim, shape, 'u', NULL, out));
  memcpy((*out)->storage->data, data, (*out)->storage->nbytes);
  return SLAPO_OK;
}

slapo_status slapo_tensor_wrap(slapo_dtype dt, int ndim, const int64_t *shape, void *data,
                               slapo_tensor **out) {
  SLAPO_ASSERT(out);
  *out = NULL;
  if (!data) return slapo_error(SLAPO_INVALID_ARG, "tensor_wrap: data is NULL");
  return tensor_make("tensor_wrap", dt, ndim, shape, 'x', data, out);
}

void slapo_tensor_free(slapo_tensor *t) {
  if (!t) return;
  storage_unref(t->storage);
  slapo_free(t);
}

slapo_status slapo_tensor_view(const slapo_tensor *t, slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = slapo_malloc(sizeof **out);
  if (!*out) return slapo_error(SLAPO_NOMEM, "tensor_view: out of memory for the tensor header");
  **out = *t;
  if (t->storage) t->storage->refcount++;
  return SLAPO_OK;
}

slapo_status slapo_tensor_materialize(slapo_tensor *t) {
  SLAPO_ASSERT(t);
  if (t->storage) return SLAPO_OK;
  size_t nbytes = slapo_tensor_nbytes(t);
  slapo_storage *s = storage_new(nbytes, true, NULL);
  if (!s) {
    char buf[160];
    return slapo_error(SLAPO_NOMEM, "tensor_materialize: out of memory for %s%s (%zu bytes)",
                       slapo_dtype_name(t->dtype),
                       slapo_shape_str(t->ndim, t->shape, buf, sizeof buf), nbytes);
  }
  t->storage = s;
  t->offset = 0;
  slapo_shape_contiguous_strides(t->ndim, t->shape, t->strides);
  return SLAPO_OK;
}

/* ------------------------------------------------------------------------ */
/* Queries and element access                                                */
/* ------------------------------------------------------------------------ */

int64_t slapo_tensor_numel(const slapo_tensor *t) { return slapo_shape_numel(t->ndim, t->shape); }

size_t slapo_tensor_nbytes(const slapo_tensor *t) {
  return (size_t)slapo_tensor_numel(t) * slapo_dtype_size(t->dtype);
}

bool slapo_tensor_is_meta(const slapo_tensor *t) { return t->storage == NULL; }

bool slapo_tensor_is_contiguous(const slapo_tensor *t) {
  if (slapo_tensor_numel(t) == 0) return true;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

void *slapo_tensor_data(const slapo_tensor *t) {
  if (!t->storage) return NULL;
  return (char *)t->storage->data + t->offset * (int64_t)slapo_dtype_size(t->dtype);
}

static bool is_unsigned(slapo_dtype dt) {
  return dt == SLAPO_DTYPE_U8 || dt == SLAPO_DTYPE_U16 || dt == SLAPO_DTYPE_U32 ||
         dt == SLAPO_DTYPE_U64 || dt == SLAPO_DTYPE_BOOL;
}

/* Loads a floating-point element as double. */
static double load_f(const void *p, slapo_dtype dt) {
  switch (dt) {
  case SLAPO_DTYPE_F32: { float v; memcpy(&v, p, 4); return v; }
  case SLAPO_DTYPE_F64: { double v; memcpy(&v, p, 8); return v; }
  case SLAPO_DTYPE_F16: { uint16_t v; memcpy(&v, p, 2); return slapo_f16_to_f32(v); }
  case SLAPO_DTYPE_BF16: { uint16_t v; memcpy(&v, p, 2); return slapo_bf16_to_f32(v); }
  default: SLAPO_ASSERT(!"load_f: not a float dtype"); return 0;
  }
}

/* Stores a double into a floating-point element (f16/bf16 through f32). */
static void store_f(void *p, slapo_dtype dt, double v) {
  switch (dt) {
  case SLAPO_DTYPE_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
  case SLAPO_DTYPE_F64: memcpy(p, &v, 8); break;
  case SLAPO_DTYPE_F16: { uint16_t h = slapo_f32_to_f16((float)v); memcpy(p, &h, 2); break; }
  case SLAPO_DTYPE_BF16: { uint16_t h = slapo_f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
  default: SLAPO_ASSERT(!"store_f: not a float dtype");
  }
}

/* Loads an integer or bool element as its 64-bit two's complement pattern
 * (sign-extended for signed dtypes, zero-extended otherwise). */
static uint64_t load_i(const void *p, slapo_dtype dt) {
  switch (dt) {
  case SLAPO_DTYPE_I8: { int8_t v; memcpy(&v, p, 1); return (uint64_t)(int64_t)v; }
  case SLAPO_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); return (uint64_t)(int64_t)v; }
  case SLAPO_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return (uint64_t)(int64_t)v; }
  case SLAPO_DTYPE_I64: { int64_t v; memcpy(&v, p, 8); return (uint64_t)v; }
  case SLAPO_DTYPE_U8: case SLAPO_DTYPE_BOOL: { uint8_t v; memcpy(&v, p, 1); return v; }
  case SLAPO_DTYPE_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
  case SLAPO_DTYPE_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
  case SLAPO_DTYPE_U64: { uint64_t v; memcpy(&v, p, 8); return v; }
  default: SLAPO_ASSERT(!"load_i: not an integer dtype"); return 0;
  }
}

/* Stores the low bits of `v` (wrapping like a C conversion to an unsigned
 * type); bool stores v != 0. */
static void store_i(void *p, slapo_dtype dt, uint64_t v) {
  switch (dt) {
  case SLAPO_DTYPE_BOOL: { uint8_t b = v != 0; memcpy(p, &b, 1); break; }
  case SLAPO_DTYPE_I8: case SLAPO_DTYPE_U8: { uint8_t b = (uint8_t)v; memcpy(p, &b, 1); break; }
  case SLAPO_DTYPE_I16: case SLAPO_DTYPE_U16: { uint16_t b = (uint16_t)v; memcpy(p, &b, 2); break; }
  case SLAPO_DTYPE_I32: case SLAPO_DTYPE_U32: { uint32_t b = (uint32_t)v; memcpy(p, &b, 4); break; }
  case SLAPO_DTYPE_I64: case SLAPO_DTYPE_U64: memcpy(p, &v, 8); break;
  default: SLAPO_ASSERT(!"store_i: not an integer dtype");
  }
}

static double load_as_double(const void *p, slapo_dtype dt) {
  if (slapo_dtype_is_float(dt)) return load_f(p, dt);
  uint64_t u = load_i(p, dt);
  return is_unsigned(dt) ? (double)u : (double)(int64_t)u;
}

/* Address of the element at multi-index `index`; asserts bounds. */
static char *elem_ptr(const slapo_tensor *t, const int64_t *index) {
  SLAPO_ASSERT(t->storage);
  int64_t off = t->offset;
  for (int i = 0; i < t->ndim; i++) {
    SLAPO_ASSERT(index[i] >= 0 && index[i] < t->shape[i]);
    off += index[i] * t->strides[i];
  }
  return (char *)t->storage->data + off * (int64_t)slapo_dtype_size(t->dtype);
}

double slapo_tensor_get(const slapo_tensor *t, const int64_t *index) {
  return load_as_double(elem_ptr(t, index), t->dtype);
}

void slapo_tensor_set(slapo_tensor *t, const int64_t *index, double v) {
  char *p = elem_ptr(t, index);
  if (slapo_dtype_is_float(t->dtype)) store_f(p, t->dtype, v);
  else if (t->dtype == SLAPO_DTYPE_BOOL) store_i(p, t->dtype, v != 0);
  else if (v >= 0) store_i(p, t->dtype, (uint64_t)v);
  else store_i(p, t->dtype, (uint64_t)(int64_t)v);
}

/* ------------------------------------------------------------------------ */
/* Strided traversal                                                         */
/* ------------------------------------------------------------------------ */

/* Two tensors of one shape walked together in row-major order. Size-1 dims
 * are dropped and adjacent dims merged where both layouts allow, so a
 * contiguous pair becomes a single row and a permuted one keeps as few loops
 * as possible. Strides are in elements. */
typedef struct walk2 {
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
  int64_t sa[SLAPO_MAX_DIMS], sb[SLAPO_MAX_DIMS];
} walk2;

static void walk2_init(walk2 *w, int ndim, const int64_t *shape, const int64_t *sa,
                       const int64_t *sb) {
  w->ndim = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 1) continue;
    int k = w->ndim - 1;
    if (k >= 0 && w->sa[k] == sa[i] * shape[i] && w->sb[k] == sb[i] * shape[i]) {
      w->shape[k] *= shape[i];
      w->sa[k] = sa[i];
      w->sb[k] = sb[i];
      continue;
    }
    w->shape[++k] = shape[i];
    w->sa[k] = sa[i];
    w->sb[k] = sb[i];
    w->ndim = k + 1;
  }
  if (w->ndim == 0) { /* a single element */
    w->ndim = 1;
    w->shape[0] = 1;
    w->sa[0] = w->sb[0] = 1;
  }
}

/* Row callback: `n` elements at a (stride sa) and b (stride sb), in bytes of
 * the respective element sizes given to walk2_run. */
typedef void (*row_fn)(char *a, int64_t sa, const char *b, int64_t sb, int64_t n, void *ctx);

/* Calls `fn` once per innermost row. esa/esb: element sizes in bytes. */
static void walk2_run(const walk2 *w, char *a, size_t esa, const char *b, size_t esb, row_fn fn,
                      void *ctx) {
  int64_t idx[SLAPO_MAX_DIMS] = {0};
  int inner = w->ndim - 1;
  for (int i = 0; i < w->ndim; i++)
    if (w->shape[i] == 0) return;
  for (;;) {
    fn(a, w->sa[inner], b, w->sb[inner], w->shape[inner], ctx);
    int d = inner - 1;
    for (; d >= 0; d--) {
      a += w->sa[d] * (int64_t)esa;
      b += w->sb[d] * (int64_t)esb;
      if (++idx[d] < w->shape[d]) break;
      a -= w->sa[d] * w->shape[d] * (int64_t)esa;
      b -= w->sb[d] * w->shape[d] * (int64_t)esb;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/* Copies a row of elements of `*(size_t *)ctx` bytes. */
static void row_copy(char *a, int64_t sa, const char *b, int64_t sb, int64_t n, void *ctx) {
  size_t es = *(const size_t *)ctx;
  if (sa == 1 && sb == 1) {
    memmove(a, b, (size_t)n * es);
    return;
  }
  int64_t ba = sa * (int64_t)es, bb = sb * (int64_t)es;
  switch (es) { /* fixed-size memcpy compiles to a single move */
  case 1: for (int64_t i = 0; i < n; i++) a[i * ba] = b[i * bb]; break;
  case 2: for (int64_t i = 0; i < n; i++) memcpy(a + i * ba, b + i * bb, 2); break;
  case 4: for (int64_t i = 0; i < n; i++) memcpy(a + i * ba, b + i * bb, 4); break;
  case 8: for (int64_t i = 0; i < n; i++) memcpy(a + i * ba, b + i * bb, 8); break;
  default: for (int64_t i = 0; i < n; i++) memcpy(a + i * ba, b + i * bb, es);
  }
}

slapo_status slapo_tensor_copy(slapo_tensor *dst, const slapo_tensor *src) {
  SLAPO_ASSERT(dst && src);
  if (!dst->storage || !src->storage)
    return slapo_error(SLAPO_STATE, "tensor_copy: %s is a meta tensor (no storage)",
                       dst->storage ? "src" : "dst");
  if (dst->dtype != src->dtype)
    return slapo_error(SLAPO_DTYPE, "tensor_copy: dst dtype %s != src dtype %s",
                       slapo_dtype_name(dst->dtype), slapo_dtype_name(src->dtype));
  if (!slapo_shape_equal(dst->ndim, dst->shape, src->ndim, src->shape)) {
    char a[160], b[160];
    return slapo_error(SLAPO_SHAPE, "tensor_copy: dst shape %s != src shape %s",
                       slapo_shape_str(dst->ndim, dst->shape, a, sizeof a),
                       slapo_shape_str(src->ndim, src->shape, b, sizeof b));
  }
  size_t es = slapo_dtype_size(src->dtype);
  walk2 w;
  walk2_init(&w, dst->ndim, dst->shape, dst->strides, src->strides);
  walk2_run(&w, slapo_tensor_data(dst), es, slapo_tensor_data(src), es, row_copy, &es);
  return SLAPO_OK;
}

slapo_status slapo_tensor_contiguous(const slapo_tensor *t, slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = NULL;
  if (!t->storage)
    return slapo_error(SLAPO_STATE, "tensor_contiguous: meta tensor has no data to copy");
  slapo_tensor *c;
  SLAPO_TRY(tensor_make("tensor_contiguous", t->dtype, t->ndim, t->shape, 'u', NULL, &c));
  slapo_status s = slapo_tensor_copy(c, t);
  SLAPO_ASSERT(s == SLAPO_OK);
  *out = c;
  return SLAPO_OK;
}

/* ------------------------------------------------------------------------ */
/* dtype conversion                                                          */
/* ------------------------------------------------------------------------ */

typedef struct convert_ctx {
  slapo_dtype to, from;
} convert_ctx;

/* Converts a row; sa/sb are element strides of the destination and source. */
static void row_convert(char *a, int64_t sa, const char *b, int64_t sb, int64_t n, void *ctx) {
  const convert_ctx *c = ctx;
  int64_t ba = sa * (int64_t)slapo_dtype_size(c->to), bb = sb * (int64_t)slapo_dtype_size(c->from);
  /* The f32 <-> 16-bit float pairs (checkpoint loading, bf16 casts) get
   * direct loops; contiguous bf16 rows the vector conversions. */
  if (sa == 1 && sb == 1 && c->from == SLAPO_DTYPE_F32 && c->to == SLAPO_DTYPE_BF16) {
    slapo_f32_to_bf16_n((const float *)(const void *)b, (uint16_t *)(void *)a, n);
    return;
  }
  if (sa == 1 && sb == 1 && c->from == SLAPO_DTYPE_BF16 && c->to == SLAPO_DTYPE_F32) {
    slapo_bf16_to_f32_n((const uint16_t *)(const void *)b, (float *)(void *)a, n);
    return;
  }
  if (c->from == SLAPO_DTYPE_F32 && (c->to == SLAPO_DTYPE_BF16 || c->to == SLAPO_DTYPE_F16)) {
    uint16_t (*cvt)(float) = c->to == SLAPO_DTYPE_BF16 ? slapo_f32_to_bf16 : slapo_f32_to_f16;
    for (int64_t i = 0; i < n; i++) {
      float f;
      memcpy(&f, b + i * bb, 4);
      uint16_t h = cvt(f);
      memcpy(a + i * ba, &h, 2);
    }
    return;
  }
  if (c->to == SLAPO_DTYPE_F32 && (c->from == SLAPO_DTYPE_BF16 || c->from == SLAPO_DTYPE_F16)) {
    float (*cvt)(uint16_t) = c->from == SLAPO_DTYPE_BF16 ? slapo_bf16_to_f32 : slapo_f16_to_f32;
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, b + i * bb, 2);
      float f = cvt(h);
      memcpy(a + i * ba, &f, 4);
    }
    return;
  }
  bool ff = slapo_dtype_is_float(c->from), tf = slapo_dtype_is_float(c->to);
  for (int64_t i = 0; i < n; i++) {
    const char *p = b + i * bb;
    char *q = a + i * ba;
    if (tf) store_f(q, c->to, load_as_double(p, c->from));
    else {
      SLAPO_ASSERT(!ff);
      store_i(q, c->to, load_i(p, c->from));
    }
  }
}

slapo_status slapo_tensor_to_dtype(const slapo_tensor *t, slapo_dtype dt, slapo_tensor **out) {
  SLAPO_ASSERT(t && out);
  *out = NULL;
  if ((unsigned)dt >= SLAPO_DTYPE_COUNT)
    return slapo_error(SLAPO_INVALID_ARG, "tensor_to_dtype: %d is not a dtype", (int)dt);
  if (!t->storage)
    return slapo_error(SLAPO_STATE, "tensor_to_dtype: meta tensor has no data to convert");
  if (slapo_dtype_is_float(t->dtype) && !slapo_dtype_is_float(dt))
    return slapo_error(SLAPO_UNSUPPORTED,
                       "tensor_to_dtype: %s -> %s is not supported: converting floats to "
                       "integers needs a rounding rule; round explicitly first",
                       slapo_dtype_name(t->dtype), slapo_dtype_name(dt));
  if (dt == t->dtype) return slapo_tensor_contiguous(t, out);
  slapo_tensor *c;
  SLAPO_TRY(tensor_make("tensor_to_dtype", dt, t->ndim, t->shape, 'u', NULL, &c));
  walk2 w;
  walk2_init(&w, t->ndim, t->shape, c->strides, t->strides);
  convert_ctx ctx = {dt, t->dtype};
  walk2_run(&w, slapo_tensor_data(c), slapo_dtype_size(dt), slapo_tensor_data(t),
            slapo_dtype_size(t->dtype), row_convert, &ctx);
  *out = c;
  return SLAPO_OK;
}

/* ------------------------------------------------------------------------ */
/* Equality and printing                                                     */
/* ------------------------------------------------------------------------ */

typedef struct equal_ctx {
  size_t es;
  bool equal;
} equal_ctx;

static void row_equal(char *a, int64_t sa, const char *b, int64_t sb, int64_t n, void *ctx) {
  equal_ctx *c = ctx;
  if (!c->equal) return;
  if (sa == 1 && sb == 1) {
    c->equal = memcmp(a, b, (size_t)n * c->es) == 0;
    return;
  }
  for (int64_t i = 0; i < n && c->equal; i++)
    c->equal = memcmp(a + i * sa * (int64_t)c->es, b + i * sb * (int64_t)c->es, c->es) == 0;
}

bool slapo_tensor_equal(const slapo_tensor *a, const slapo_tensor *b) {
  SLAPO_ASSERT(a && b);
  if (a->dtype != b->dtype || !slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape))
    return false;
  if (!a->storage || !b->storage) return !a->storage && !b->storage;
  equal_ctx ctx = {slapo_dtype_size(a->dtype), true};
  walk2 w;
  walk2_init(&w, a->ndim, a->shape, a->strides, b->strides);
  walk2_run(&w, slapo_tensor_data(a), ctx.es, slapo_tensor_data(b), ctx.es, row_equal, &ctx);
  return ctx.equal;
}

void slapo_tensor_print(const slapo_tensor *t, FILE *f, int max_elems) {
  char buf[160];
  fprintf(f, "%s%s", slapo_dtype_name(t->dtype), slapo_shape_str(t->ndim, t->shape, buf, sizeof buf));
  if (!t->storage) {
    fputs(" (meta)", f);
    return;
  }
  int64_t numel = slapo_tensor_numel(t);
  int64_t idx[SLAPO_MAX_DIMS] = {0};
  fputs(" {", f);
  for (int64_t k = 0; k < numel; k++) {
    if (k >= max_elems) {
      fputs(k ? ", ..." : "...", f);
      break;
    }
    const char *p = elem_ptr(t, idx);
    if (k) fputs(", ", f);
    if (slapo_dtype_is_float(t->dtype)) fprintf(f, "%g", load_f(p, t->dtype));
    else if (is_unsigned(t->dtype)) fprintf(f, "%" PRIu64, load_i(p, t->dtype));
    else fprintf(f, "%" PRId64, (int64_t)load_i(p, t->dtype));
    for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
  }
  fputc('}', f);
}
