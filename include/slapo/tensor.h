/* slapo/tensor.h - dtypes, shapes, strided tensors over refcounted storage,
 * views (reshape, permute, slice), meta tensors, safetensors read/write.
 * Layer: tensor (depends on core).
 * safetensors format: https://github.com/huggingface/safetensors (8-byte
 * little-endian header length, JSON header, then raw little-endian data). */
#ifndef SLAPO_TENSOR_H
#define SLAPO_TENSOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "slapo/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------ */

/* X(ENUM, c name, size in bytes, safetensors name). f32 is the compute
 * dtype; i32/i64 hold token ids; the others are storage dtypes (checkpoints)
 * and room for bf16 compute later. */
#define SLAPO_DTYPE_LIST(X)                                                    \
  X(F32, "f32", 4, "F32")                                                      \
  X(F64, "f64", 8, "F64")                                                      \
  X(F16, "f16", 2, "F16")                                                      \
  X(BF16, "bf16", 2, "BF16")                                                   \
  X(I64, "i64", 8, "I64")                                                      \
  X(I32, "i32", 4, "I32")                                                      \
  X(I16, "i16", 2, "I16")                                                      \
  X(I8, "i8", 1, "I8")                                                         \
  X(U64, "u64", 8, "U64")                                                      \
  X(U32, "u32", 4, "U32")                                                      \
  X(U16, "u16", 2, "U16")                                                      \
  X(U8, "u8", 1, "U8")                                                         \
  X(BOOL, "bool", 1, "BOOL")

typedef enum slapo_dtype {
#define SLAPO__DTYPE_ENUM(e, n, sz, st) SLAPO_DTYPE_##e,
  SLAPO_DTYPE_LIST(SLAPO__DTYPE_ENUM)
#undef SLAPO__DTYPE_ENUM
  SLAPO_DTYPE_COUNT
} slapo_dtype;

size_t slapo_dtype_size(slapo_dtype dt);          /* bytes per element */
/* True for the floating-point dtypes (f32, f64, f16, bf16): the values
 * that carry gradients, and that conversions round rather than truncate. */
bool slapo_dtype_is_float(slapo_dtype dt);
const char *slapo_dtype_name(slapo_dtype dt);     /* "f32"; static */
const char *slapo_dtype_st_name(slapo_dtype dt);  /* safetensors "F32"; static */
/* Parses a safetensors dtype name ("F32"). Errors: SLAPO_DTYPE (unknown). */
slapo_status slapo_dtype_from_st_name(const char *name, slapo_dtype *out);

/* ------------------------------------------------------------------------ */
/* Shapes                                                                    */
/* ------------------------------------------------------------------------ */

#define SLAPO_MAX_DIMS 8

/* Product of the dims (1 for ndim == 0). */
int64_t slapo_shape_numel(int ndim, const int64_t *shape);
/* Writes "[a, b, c]" (NUL-terminated, truncated to `cap`) into buf; returns buf. */
char *slapo_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);
/* Row-major (contiguous) strides in elements. The shape must satisfy
 * slapo_shape_addressable (every tensor constructor checks it), so no
 * stride overflows. */
void slapo_shape_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* True when a tensor of this shape with elements of elem_nbytes bytes can be
 * addressed: every dim >= 0 and elem_nbytes * prod(max(dim, 1)) fits in
 * int64_t and size_t. Zero dims count as 1, as in the strides: [0, 2^62, 8]
 * holds no element, yet its row stride 8 * 2^62 does not fit. */
bool slapo_shape_addressable(int ndim, const int64_t *shape, uint64_t elem_nbytes);
bool slapo_shape_equal(int ndim_a, const int64_t *a, int ndim_b, const int64_t *b);

/* ------------------------------------------------------------------------ */
/* Storage and tensors                                                       */
/* ------------------------------------------------------------------------ */

/* Refcounted byte buffer (64-byte aligned). A tensor holds one reference; a
 * view shares it. `external` storage wraps memory the library does not own
 * (the executor's planned buffers): freeing it does not free `data`. The
 * refcount is a plain int: create and free views of one storage from one
 * thread at a time. */
typedef struct slapo_storage {
  void *data;
  size_t nbytes;
  int refcount;
  bool external;
} slapo_storage;

/* A strided view of a storage. Fields are public for kernels; create and
 * change tensors only through the functions below. A *meta* tensor has
 * storage == NULL: shape and dtype only. */
typedef struct slapo_tensor {
  slapo_dtype dtype;
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
  int64_t strides[SLAPO_MAX_DIMS]; /* in elements */
  int64_t offset;                  /* in elements, into storage */
  slapo_storage *storage;          /* NULL for a meta tensor */
} slapo_tensor;

/* New contiguous tensor with zeroed storage. ndim in [0, SLAPO_MAX_DIMS],
 * each dim >= 0. *out owned (slapo_tensor_free).
 * Errors: SLAPO_INVALID_ARG (ndim, negative dim), SLAPO_NOMEM. */
slapo_status slapo_tensor_new(slapo_dtype dt, int ndim, const int64_t *shape,
                              slapo_tensor **out);
/* New meta tensor (no storage). Same errors as slapo_tensor_new. */
slapo_status slapo_tensor_new_meta(slapo_dtype dt, int ndim, const int64_t *shape,
                                   slapo_tensor **out);
/* New contiguous tensor copying `numel * dtype size` bytes from `data`.
 * Errors: as slapo_tensor_new; SLAPO_INVALID_ARG (data NULL). */
slapo_status slapo_tensor_from_data(slapo_dtype dt, int ndim, const int64_t *shape,
                                    const void *data, slapo_tensor **out);
/* New tensor viewing external memory `data` (not owned, not freed; must
 * outlive the tensor), contiguous. Errors: SLAPO_INVALID_ARG, SLAPO_NOMEM. */
slapo_status slapo_tensor_wrap(slapo_dtype dt, int ndim, const int64_t *shape,
                               void *data, slapo_tensor **out);
/* Releases the tensor and its storage reference. NULL is fine. */
void slapo_tensor_free(slapo_tensor *t);

/* Gives a meta tensor zeroed contiguous storage (no-op if it has storage);
 * its strides become contiguous and its offset 0. Other views of the same
 * meta tensor stay meta. Errors: SLAPO_NOMEM. */
slapo_status slapo_tensor_materialize(slapo_tensor *t);

int64_t slapo_tensor_numel(const slapo_tensor *t);
size_t slapo_tensor_nbytes(const slapo_tensor *t); /* numel * dtype size */
bool slapo_tensor_is_meta(const slapo_tensor *t);
bool slapo_tensor_is_contiguous(const slapo_tensor *t);
/* Pointer to element 0 of the view (storage data + offset); NULL for meta.
 * Borrowed: valid while the storage lives. */
void *slapo_tensor_data(const slapo_tensor *t);
/* Typed element read/write at a multi-index (tests and tools; slow). `t`
 * must have storage and every index[i] must lie in [0, shape[i]) (asserted).
 * set converts like a C cast (bool: v != 0). */
double slapo_tensor_get(const slapo_tensor *t, const int64_t *index);
void slapo_tensor_set(slapo_tensor *t, const int64_t *index, double v);

/* Views share storage with `t` (also for meta tensors). *out owned; every
 * view function may also fail with SLAPO_NOMEM.
 * reshape: `t` must be contiguous; one dim may be -1. Errors: SLAPO_SHAPE
 *   (numel differs, -1 not inferable, or t not contiguous: message gives
 *   both shapes), SLAPO_INVALID_ARG (ndim, dim < -1, more than one -1).
 * permute: `perm` is a permutation of 0..ndim-1. Errors: SLAPO_INVALID_ARG.
 * slice: elements start, start+step, ... < end along `dim` (negative start/
 *   end count from the end, clamped as in Python; step >= 1).
 *   Errors: SLAPO_INVALID_ARG (dim out of range, step < 1). */
slapo_status slapo_tensor_reshape(const slapo_tensor *t, int ndim, const int64_t *shape,
                                  slapo_tensor **out);
slapo_status slapo_tensor_permute(const slapo_tensor *t, const int *perm,
                                  slapo_tensor **out);
slapo_status slapo_tensor_slice(const slapo_tensor *t, int dim, int64_t start, int64_t end,
                                int64_t step, slapo_tensor **out);
/* New view of the same storage with identical fields (refcount + 1). */
slapo_status slapo_tensor_view(const slapo_tensor *t, slapo_tensor **out);

/* New contiguous tensor with a copy of t's elements (any strides).
 * Errors: SLAPO_STATE (t is meta), SLAPO_NOMEM. */
slapo_status slapo_tensor_contiguous(const slapo_tensor *t, slapo_tensor **out);
/* Copies src's elements into dst (same shape and dtype, any strides). dst
 * and src must not partially overlap in memory.
 * Errors: SLAPO_SHAPE, SLAPO_DTYPE, SLAPO_STATE (meta). */
slapo_status slapo_tensor_copy(slapo_tensor *dst, const slapo_tensor *src);
/* Converts element types into a new contiguous tensor: float <-> float
 * (f16/bf16 round to nearest even; from f64 they round through f32),
 * integer/bool <-> integer/bool (wrapping like C casts; bool is v != 0) and
 * integer -> float. Float -> integer needs a rounding rule and is refused.
 * dt == t->dtype gives a contiguous copy.
 * Errors: SLAPO_UNSUPPORTED (float -> integer/bool), SLAPO_STATE (meta),
 * SLAPO_INVALID_ARG (dt), SLAPO_NOMEM. */
slapo_status slapo_tensor_to_dtype(const slapo_tensor *t, slapo_dtype dt, slapo_tensor **out);
/* True when shapes, dtypes and every element's bytes are equal (so -0.0 !=
 * 0.0 and identical NaNs are equal). Two meta tensors compare shape and
 * dtype only; a meta tensor never equals one with storage. */
bool slapo_tensor_equal(const slapo_tensor *a, const slapo_tensor *b);
/* Prints "f32[2, 3] {1, 2, 3, ...}" (at most `max_elems` values, row-major)
 * to f; a meta tensor prints as "f32[2, 3] (meta)". */
void slapo_tensor_print(const slapo_tensor *t, FILE *f, int max_elems);

/* bf16 <-> f32. bf16 is the top half of an f32: widening is exact. f32 ->
 * bf16 rounds to nearest, ties to even; +-Inf and signed zeros are kept;
 * finite values past the largest bf16 (3.3895e38) round to Inf as IEEE
 * rounding says; subnormals are rounded like any other value (never
 * flushed); a NaN stays a NaN of the same sign, quieted (bit 6 of the
 * bf16 set), its top payload bits kept. */
float slapo_bf16_to_f32(uint16_t v);
uint16_t slapo_f32_to_bf16(float v);
/* The same over n contiguous elements, vectorized (run-time ISA dispatch,
 * the same bits at every level as the scalar forms). x and y must not
 * overlap; n <= 0 does nothing. Single-threaded: callers split rows. */
void slapo_f32_to_bf16_n(const float *x, uint16_t *y, int64_t n);
void slapo_bf16_to_f32_n(const uint16_t *x, float *y, int64_t n);
float slapo_f16_to_f32(uint16_t v);
uint16_t slapo_f32_to_f16(float v);

/* ------------------------------------------------------------------------ */
/* safetensors                                                               */
/* ------------------------------------------------------------------------ */

/* A safetensors file read fully into memory and validated. */
typedef struct slapo_safetensors slapo_safetensors;

/* Reads and validates `path`. Rejects, with SLAPO_IO and a message naming the
 * file, the tensor and the offending value: a file shorter than 8 bytes, a
 * header length larger than the file, a header that is not a JSON object,
 * an entry without dtype/shape/data_offsets, an unknown dtype, negative or
 * non-integer dims, offsets out of range, begin > end, a byte count that
 * does not match shape x dtype size, overlapping or non-covering data
 * ranges, duplicate names, and `__metadata__` values that are not strings.
 * The file is mapped read-only (its pages stay the page cache's, so a
 * checkpoint as large as the model loads beside it), not copied; files are
 * replaced by rename, never rewritten in place, so the mapping stays valid.
 * *out owned (slapo_safetensors_free).
 * Errors: SLAPO_IO, SLAPO_NOMEM, SLAPO_INVALID_ARG (path NULL). */
slapo_status slapo_safetensors_read(const char *path, slapo_safetensors **out);
/* The same checks on the header alone (the 8-byte length and the JSON;
 * data ranges against the file's size), reading none of the tensor data:
 * names, shapes and metadata of a large checkpoint for the cost of its
 * header. slapo_safetensors_get on the result fails (SLAPO_STATE). *out
 * owned (slapo_safetensors_free). Errors: as slapo_safetensors_read. */
slapo_status slapo_safetensors_read_header(const char *path, slapo_safetensors **out);
void slapo_safetensors_free(slapo_safetensors *f);

/* Number of tensors, and the i-th name (0 <= i < count) in strcmp order,
 * not file-header order. Borrowed strings, valid until free. */
int slapo_safetensors_count(const slapo_safetensors *f);
const char *slapo_safetensors_name(const slapo_safetensors *f, int i);
/* Metadata value for `key` from `__metadata__`, or NULL. Borrowed. */
const char *slapo_safetensors_metadata(const slapo_safetensors *f, const char *key);
/* Shape/dtype of tensor `name` as a meta tensor. *out owned.
 * Errors: SLAPO_NOT_FOUND (message names the tensor and the file), SLAPO_NOMEM. */
slapo_status slapo_safetensors_meta(const slapo_safetensors *f, const char *name,
                                    slapo_tensor **out);
/* Owned contiguous copy of tensor `name`. Errors: SLAPO_NOT_FOUND, SLAPO_NOMEM,
 * SLAPO_STATE (f was read header-only). */
slapo_status slapo_safetensors_get(const slapo_safetensors *f, const char *name,
                                   slapo_tensor **out);

/* Writes `n` tensors (any strides; written contiguous, little-endian) with
 * the given names and optional string metadata (`n_meta` key/value pairs)
 * to `path` atomically: a temporary file in the same directory, fsync, then
 * rename (mode 0644). Tensors are stored sorted by name; the JSON header is
 * padded with spaces so the data starts 8-byte aligned. Names must be
 * unique, non-empty, valid UTF-8 and not "__metadata__"; metadata keys must
 * be unique. Arguments are checked before anything touches the disk, and a
 * failed write leaves an existing `path` unchanged and no temporary file.
 * Errors: SLAPO_INVALID_ARG (duplicate/empty/reserved name, meta tensor, bad
 * counts), SLAPO_IO (message names the path and errno text), SLAPO_NOMEM. */
slapo_status slapo_safetensors_write(const char *path, int n, const char *const *names,
                                     const slapo_tensor *const *tensors, int n_meta,
                                     const char *const *meta_keys,
                                     const char *const *meta_values);


/* ------------------------------------------------------------------------ */
/* Shards (tensor parallelism; src/tensor/shard.c)                           */
/* ------------------------------------------------------------------------ */

/* How a tensor is split across a group of `count` ranks along `axis`: the
 * axis is `parts` equal blocks (3 for GPT-2's fused q|k|v weight), each cut
 * into `count` equal chunks, and rank `index` holds chunk `index` of every
 * block, blocks in order. parts = 1 is the plain contiguous split; parts =
 * 3 on c_attn gives every rank its own heads' q, k and v (a plain split
 * would give rank 0 all of q). */
typedef struct slapo_shard {
  int axis, parts, index, count;
  int ndim;                      /* of the unsharded tensor             */
  int64_t full[SLAPO_MAX_DIMS];  /* the unsharded shape, padded         */
  int64_t valid;                 /* the axis' size before padding: rows */
                                 /* valid .. full[axis] - 1 are zeros   */
} slapo_shard;

/* Fills *out for a tensor [full] (ndim dims) split along axis (negative
 * counts from the end). pad > 1 (axis 0, parts 1 only) first pads the axis
 * with zero rows to a multiple of pad * count (a vocabulary of 50257 over 2
 * ranks with pad 128: 50432 rows, 25216 each; Megatron-LM pads the same
 * way). Errors: SLAPO_INVALID_ARG (axis outside the dims, parts < 1, count
 * < 1, index outside [0, count), pad on another axis or with parts),
 * SLAPO_SHAPE (the axis' size is not divisible by parts * count; the message
 * gives size, parts and group size; callers prefix the parameter's name). */
slapo_status slapo_shard_make(int ndim, const int64_t *full, int axis, int parts, int index,
                              int count, int64_t pad, slapo_shard *out);
/* The unsharded shape without padding (axis size `valid`) into shape. */
void slapo_shard_orig_shape(const slapo_shard *s, int64_t *shape);
/* The local shape (full with the axis divided by count) into shape [ndim]. */
void slapo_shard_local_shape(const slapo_shard *s, int64_t *shape);
/* Flat index in the unsharded tensor of local element i (row-major). */
int64_t slapo_shard_global_index(const slapo_shard *s, int64_t i);
/* A new contiguous f32 tensor holding rank s->index's piece of `full`
 * (f32, the unsharded shape padded or not, any strides; padding rows read
 * zeros). *out owned. Errors: SLAPO_SHAPE (full has neither shape),
 * SLAPO_DTYPE, NOMEM. */
slapo_status slapo_shard_slice(const slapo_shard *s, const slapo_tensor *full,
                               slapo_tensor **out);
/* Writes rank `index`'s piece `local` [numel of the local shape] (f32,
 * contiguous) into its place in `full` (f32, contiguous, the unsharded
 * shape padded or not: padding rows are dropped): a gather is every rank's
 * piece placed. */
void slapo_shard_place(const slapo_shard *s, int index, const float *local, slapo_tensor *full);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_TENSOR_H */
