/* ops/dropout.c - inverted dropout (Srivastava et al. 2014; PyTorch
 * nn.functional.dropout: kept values scaled by 1/(1-p) at training time,
 * identity at eval). Layer: ops.
 * Element i of the contiguous tensor is kept iff
 *   slapo_rng_uniform(seed, stream, step, offset + i) >= p
 * (DESIGN.md §3): a pure function of the keys, so the mask is independent of
 * tiling, threads and the tensor's total size, and the backward (the same op
 * on dy with the same attributes) regenerates it instead of storing it. */
#include <math.h>
#include <string.h>

#include "ops/internal.h"
#include "slapo/ops/vmath.h"

static slapo_status dropout_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  double p = slapo_node_attr_float(node, "p", 0.0);
  if (!(p >= 0 && p <= 1))
    return slapo_error(SLAPO_INVALID_ARG, "dropout: p = %g is outside [0, 1]", p);
  int64_t offset = slapo_node_attr_int(node, "offset", 0);
  if (offset < 0)
    return slapo_error(SLAPO_INVALID_ARG, "dropout: offset = %lld; it must be >= 0",
                       (long long)offset);
  int64_t dim = slapo_node_attr_int(node, "shard_dim", -1);
  if (dim >= 0) {
    const slapo_node *x = node->inputs[0];
    int64_t start = slapo_node_attr_int(node, "shard_start", 0);
    int64_t full = slapo_node_attr_int(node, "shard_full", 0);
    int64_t parts = slapo_node_attr_int(node, "shard_parts", 1);
    int64_t L = dim < x->ndim ? x->shape[dim] : 0;
    if (parts < 1 || L % parts || full % parts)
      return slapo_error(SLAPO_INVALID_ARG, "dropout: x %s: shard_parts = %lld does not divide "
                         "dim %lld (%lld here, %lld unsharded)", slapo__shape_of(x),
                         (long long)parts, (long long)dim, (long long)L, (long long)full);
    if (dim >= x->ndim || start < 0 || start + L / parts > full / parts)
      return slapo_error(SLAPO_INVALID_ARG, "dropout: x %s as the slice [%lld, %lld) of dim "
                         "%lld of size %lld does not fit", slapo__shape_of(x), (long long)start,
                         (long long)(start + L / parts), (long long)dim,
                         (long long)(full / parts));
  }
  return slapo__same_as_input(node, 0);
}

/* x as runs of elements contiguous in the unsharded index space: all of it
 * (one run at `offset`), or, for a slice along shard_dim (the attributes
 * op building derives from x's tensor-parallel layout, ops/layout.c), one
 * run per index of the dims up to it, each `len` elements. With
 * shard_parts = P the dim is P blocks of full / P, this rank holding
 * [start, start + L / P) of each. */
typedef struct drop_runs {
  int64_t n, len;                  /* runs, elements each                 */
  int64_t L, full, start, inner;   /* local and full size of the dim ...  */
  int64_t parts;
  uint64_t offset;
} drop_runs;

static drop_runs runs_of(const slapo_node *node, const slapo_tensor *x) {
  drop_runs r = {1, slapo_tensor_numel(x), 1, 1, 0, 0, 1, 0};
  r.offset = (uint64_t)slapo_node_attr_int(node, "offset", 0);
  int64_t dim = slapo_node_attr_int(node, "shard_dim", -1);
  if (dim < 0 || r.len == 0) return r;
  r.L = x->shape[dim];
  r.full = slapo_node_attr_int(node, "shard_full", r.L);
  r.start = slapo_node_attr_int(node, "shard_start", 0);
  r.parts = slapo_node_attr_int(node, "shard_parts", 1);
  r.inner = 1;
  for (int i = (int)dim + 1; i < x->ndim; i++) r.inner *= x->shape[i];
  r.len = r.inner;
  r.n = slapo_tensor_numel(x) / r.len;
  return r;
}

/* Unsharded index of the first element of run k. */
static uint64_t run_start(const drop_runs *r, int64_t k) {
  if (r->n == 1 && r->inner == 0) return r->offset;
  int64_t o = k / r->L, a = k % r->L, l = r->L / r->parts;
  int64_t g = o * r->full + (a / l) * (r->full / r->parts) + r->start + a % l;
  return r->offset + (uint64_t)(g * r->inner);
}

/* The parameters of one dropout node; `active` is false when it is the
 * identity (not training, or p == 0). */
typedef struct drop_args {
  bool active;
  double p;
  uint64_t stream, offset;
  float scale;
} drop_args;

static drop_args drop_args_of(const slapo_node *node, const slapo_kernel_env *env) {
  drop_args a = {0};
  a.p = slapo_node_attr_float(node, "p", 0.0);
  a.active = env && env->training && a.p != 0;
  a.stream = (uint64_t)slapo_node_attr_int(node, "stream", 0);
  /* "offset" is the index of element 0 in the unsharded tensor: a shard that
   * holds elements [offset, offset + N) draws exactly that slice of the
   * unsharded mask (shards of a flattened contiguous tensor only). */
  a.offset = (uint64_t)slapo_node_attr_int(node, "offset", 0);
  a.scale = a.p < 1 ? (float)(1.0 / (1.0 - a.p)) : 0.0f;
  return a;
}

/* Reference: the definition, one slapo_rng_uniform call per element. */
static void dropout_ref(const slapo_node *node, const slapo_tensor *const *in,
                        slapo_tensor *out, const slapo_kernel_env *env) {
  const float *x = slapo_tensor_data(in[0]); /* x [N] (any shape, flattened) */
  float *y = slapo_tensor_data(out);         /* y [N] */
  int64_t N = slapo_tensor_numel(in[0]);
  drop_args a = drop_args_of(node, env);
  if (!a.active) {
    memcpy(y, x, (size_t)N * sizeof(float));
    return;
  }
  drop_runs r = runs_of(node, in[0]);
  for (int64_t k = 0; k < r.n; k++) {
    uint64_t g0 = run_start(&r, k);
    for (int64_t j = k * r.len; j < (k + 1) * r.len; j++) {
      float u = slapo_rng_uniform(env->seed, a.stream, env->step, g0 + (uint64_t)(j - k * r.len));
      y[j] = (double)u >= a.p ? x[j] * a.scale : 0.0f;
    }
  }
}

/* ---- fast kernel ----
 * The same mask, computed as slapo_rng_uniform defines it (core/philox.c:
 * key slapo_rng_key(seed, stream) split into two words, counter (block lo,
 * block hi, step lo, step hi), element g is word g % 4 of block g / 4,
 * u = (word >> 8) * 2^-24), but with the key hashed once per node, each
 * Philox block used for all four of its elements, and batches of blocks
 * computed side by side so that the ten rounds vectorize (in AVX-512,
 * 16 blocks per instruction). u >= p is decided in integers: u = k * 2^-24
 * for the integer k = word >> 8, so u >= p exactly when k >= ceil(p * 2^24)
 * (p * 2^24 is exact in double). The op tests compare it with the reference
 * bitwise. Philox4x32-10: Salmon et al., SC'11 (constants as core/philox.c). */
enum { PHILOX_LANES = 64 }; /* blocks per batch: 256 elements */

/* Philox4x32-10 of the blocks b0 .. b0 + PHILOX_LANES - 1 with counter
 * words 2-3 = step: w[4 l + q] = word q of block b0 + l, i.e. the word of
 * element 4 (b0 + l) + q. One block per iteration of the outer loop, which
 * GCC vectorizes across blocks; the ten rounds are unrolled inside it. */
static inline void philox_batch(uint64_t b0, uint64_t step, uint64_t key,
                                uint32_t w[4 * PHILOX_LANES]) {
  for (int l = 0; l < PHILOX_LANES; l++) {
    uint64_t b = b0 + (uint64_t)l;
    uint32_t c0 = (uint32_t)b, c1 = (uint32_t)(b >> 32);
    uint32_t c2 = (uint32_t)step, c3 = (uint32_t)(step >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
      uint64_t p0 = (uint64_t)0xD2511F53u * c0;
      uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
      uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
      c1 = (uint32_t)p1;
      c3 = (uint32_t)p0;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    w[4 * l] = c0, w[4 * l + 1] = c1, w[4 * l + 2] = c2, w[4 * l + 3] = c3;
  }
}

/* y = dropout(x) for the elements [lo, hi) of the unsharded index space; x
 * and y point at element lo. */
SLAPO__SIMD_PROC(dropout_span,
                 (const float *restrict x, float *restrict y, uint64_t lo, uint64_t hi,
                  uint64_t step, uint64_t key, uint32_t thresh, float scale),
                 (x, y, lo, hi, step, key, thresh, scale)) {
  uint32_t w[4 * PHILOX_LANES];
  for (uint64_t b0 = lo / 4; b0 * 4 < hi; b0 += PHILOX_LANES) {
    philox_batch(b0, step, key, w);
    uint64_t e0 = b0 * 4, e1 = e0 + 4 * PHILOX_LANES;
    uint64_t from = e0 > lo ? e0 : lo, to = e1 < hi ? e1 : hi;
    const uint32_t *wf = w + (from - e0);
    const float *xf = x + (from - lo);
    float *yf = y + (from - lo);
    int64_t n = (int64_t)(to - from);
    for (int64_t i = 0; i < n; i++) yf[i] = (wf[i] >> 8) >= thresh ? xf[i] * scale : 0.0f;
  }
}

/* Chunks aligned in index space (whole Philox groups) split statically over
 * the threads; the mask depends on element indices only, not on the split. */
static void dropout_fast(const slapo_node *node, const slapo_tensor *const *in,
                         slapo_tensor *out, const slapo_kernel_env *env) {
  const float *x = slapo_tensor_data(in[0]); /* x [N] (any shape, flattened) */
  float *y = slapo_tensor_data(out);         /* y [N] */
  int64_t N = slapo_tensor_numel(in[0]);
  drop_args a = drop_args_of(node, env);
  if (!a.active) {
    memcpy(y, x, (size_t)N * sizeof(float));
    return;
  }
  uint64_t key = slapo_rng_key(env->seed, a.stream);
  uint32_t thresh = (uint32_t)ceil(a.p * 16777216.0);
  const uint64_t chunk = 4 * PHILOX_LANES * 16; /* elements */
  drop_runs r = runs_of(node, in[0]);
  for (int64_t k = 0; k < r.n; k++) {
    uint64_t off = run_start(&r, k), end = off + (uint64_t)r.len;
    const float *xk = x + k * r.len;
    float *yk = y + k * r.len;
    uint64_t first = off / chunk, last = (end + chunk - 1) / chunk;
    int64_t n_chunks = (int64_t)(last - first);
#pragma omp parallel for num_threads(slapo__threads_for(r.len * 4)) schedule(static)
    for (int64_t c = 0; c < n_chunks; c++) {
      uint64_t lo = (first + (uint64_t)c) * chunk, hi = lo + chunk;
      lo = lo > off ? lo : off;
      hi = hi < end ? hi : end;
      dropout_span(xk + (lo - off), yk + (lo - off), lo, hi, env->step, key, thresh, a.scale);
    }
  }
}

static slapo_status dropout_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                     const bool *need, slapo_node **dx) {
  /* Same op, same attributes (p, stream, offset, shard_*): the same mask
   * and scale. Built as backward, so the shard attributes are copied, not
   * derived from dy's layout (also when a caller runs this rule outside
   * slapo_backward). */
  bool prev = slapo_ctx_set_copy_rng(ctx, true);
  dx[0] = need[0] ? slapo__call_like(ctx, node, 1, &dy) : NULL;
  slapo_ctx_set_copy_rng(ctx, prev);
  return slapo_ctx_status(ctx);
}

static slapo_node *dropout_example(slapo_ctx *ctx) {
  /* p = 0.3: the mask is a deterministic function of the keys, so finite
   * differences see a fixed linear map. */
  int64_t shape[2] = {3, 5};
  return slapo_dropout(ctx, slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, shape), 0.3);
}

SLAPO_OP_DESCRIPTOR(dropout) = {
    .name = "dropout",
    .n_inputs = 1,
    .infer = dropout_infer,
    .ref = dropout_ref,
    .fast = dropout_fast,
    .backward = dropout_backward,
    .contiguous_inputs = true,
    .random = true,
    .elementwise = true,
    .doc = "inverted dropout: element i kept iff uniform(seed, stream, step, offset + i) >= p, "
           "scaled by 1/(1-p); identity when not training or p == 0; attrs p, stream (set by "
           "slapo_op_call), offset (element index of x[0] in the unsharded tensor, default 0), "
           "shard_dim/shard_start/shard_full/shard_parts (x is a slice along one dim: derived from x's "
           "tensor-parallel layout when built, ops/layout.c)",
    .test = {.example = dropout_example},
};

slapo_node *slapo_dropout(slapo_ctx *ctx, slapo_node *x, double p) {
  slapo_attr a = slapo_attr_float("p", p);
  return slapo__call1(ctx, SLAPO_OP_DESC(dropout), x, 1, &a);
}
