/* ops/rotary.c - "rotary": rotary position embedding (Su et al., "RoFormer",
 * 2021, eq. 34) in Hugging Face's rotate-half layout (modeling_llama.py
 * apply_rotary_pos_emb): for x [B, NH, T, HS], h = HS / 2, row t at
 * position p = offset + t,
 *   inv_freq[i] = 1 / theta^(2i / HS),  a[j] = p inv_freq[j mod h],
 *   y[j] = x[j] cos a[j] - x[j + h] sin a[j]        j < h
 *   y[j] = x[j] cos a[j] + x[j - h] sin a[j]        j >= h
 * i.e. pairs (x[i], x[i + h]) turn by angle a[i]. Its gradient is the turn
 * by -a[i] (attr inverse=1): the same op, no backward kernel of its own.
 * inv_freq, a, cos and sin are computed in float as PyTorch does, so the
 * angles of long sequences match the reference to the ulp. Layer: ops. */
#include <math.h>

#include "ops/internal.h"

#define ROTARY_MAX_HS 1024 /* per-row cos/sin tables live on the stack */

static slapo_status rotary_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0];
  if (x->ndim != 4 || x->shape[3] % 2 || x->shape[3] > ROTARY_MAX_HS)
    return slapo_error(SLAPO_SHAPE,
                       "rotary: x %s must be [B, NH, T, HS] with an even HS <= %d (pairs (i, i + "
                       "HS/2) turn together)",
                       slapo__shape_of(x), ROTARY_MAX_HS);
  double theta = slapo_node_attr_float(node, "theta", 10000.0);
  if (!(theta > 1.0) || !isfinite(theta))
    return slapo_error(SLAPO_INVALID_ARG, "rotary: theta = %g; it must be a finite base > 1 "
                       "(LLaMA: 10000)", theta);
  if (slapo_node_attr_int(node, "offset", 0) < 0)
    return slapo_error(SLAPO_INVALID_ARG, "rotary: offset = %lld; positions start at >= 0",
                       (long long)slapo_node_attr_int(node, "offset", 0));
  return slapo__same_as_input(node, 0);
}

/* cos and sin of row position p's angles, [h] each, in float as
 * PyTorch's LlamaRotaryEmbedding computes them; sin negated for inverse. */
static void angles(const slapo_node *node, int64_t HS, int64_t p, float *c, float *s) {
  float theta = (float)slapo_node_attr_float(node, "theta", 10000.0);
  bool inverse = slapo_node_attr_int(node, "inverse", 0) != 0;
  int64_t h = HS / 2;
  for (int64_t i = 0; i < h; i++) {
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
    float a = (float)p * inv_freq;
    c[i] = cosf(a);
    s[i] = inverse ? -sinf(a) : sinf(a);
  }
}

/* Rows t of every (b, head) of x [BH, T, HS]: rows [t0, t1). */
static void turn_rows(const slapo_node *node, const float *x, float *y, int64_t BH, int64_t T,
                      int64_t HS, int64_t t0, int64_t t1) {
  int64_t h = HS / 2, offset = slapo_node_attr_int(node, "offset", 0);
  float c[ROTARY_MAX_HS / 2], s[ROTARY_MAX_HS / 2]; /* c, s [h]: this row's cos, sin */
  for (int64_t t = t0; t < t1; t++) {
    angles(node, HS, offset + t, c, s);
    for (int64_t bh = 0; bh < BH; bh++) {
      const float *xr = x + (bh * T + t) * HS; /* xr, yr [HS] */
      float *yr = y + (bh * T + t) * HS;
#pragma omp simd
      for (int64_t i = 0; i < h; i++) {
        float lo = xr[i], hi = xr[i + h];
        yr[i] = lo * c[i] - hi * s[i];
        yr[i + h] = hi * c[i] + lo * s[i];
      }
    }
  }
}

static void rotary_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  const int64_t *sh = in[0]->shape;
  turn_rows(node, slapo_tensor_data(in[0]), slapo_tensor_data(out), sh[0] * sh[1], sh[2], sh[3],
            0, sh[2]);
}

/* Parallel over positions: each thread computes its rows' angles once and
 * turns them in every head. */
static void rotary_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)env;
  const int64_t *sh = in[0]->shape;
  const float *x = slapo_tensor_data(in[0]); /* x [B NH, T, HS] */
  float *y = slapo_tensor_data(out);         /* y [B NH, T, HS] */
  int64_t T = sh[2];
#pragma omp parallel for num_threads(slapo__threads_for(slapo_tensor_numel(in[0]))) \
    schedule(static)
  for (int64_t t = 0; t < T; t++) turn_rows(node, x, y, sh[0] * sh[1], T, sh[3], t, t + 1);
}

static slapo_status rotary_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  dx[0] = NULL;
  if (!need[0]) return slapo_ctx_status(ctx);
  slapo_attr a[3] = {slapo_attr_float("theta", slapo_node_attr_float(node, "theta", 10000.0)),
                     slapo_attr_int("offset", slapo_node_attr_int(node, "offset", 0)),
                     slapo_attr_int("inverse", !slapo_node_attr_int(node, "inverse", 0))};
  dx[0] = slapo__call1(ctx, SLAPO_OP_DESC(rotary), dy, 3, a);
  return slapo_ctx_status(ctx);
}

/* Positions 3..7 (a decoding offset), two heads of 8. */
static slapo_node *rotary_example(slapo_ctx *ctx) {
  int64_t xs[4] = {1, 2, 5, 8};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 4, xs);
  return slapo_rotary(ctx, x, 10000.0, 3);
}

SLAPO_OP_DESCRIPTOR(rotary) = {
    .name = "rotary",
    .n_inputs = 1,
    .infer = rotary_infer,
    .ref = rotary_ref,
    .fast = rotary_fast,
    .backward = rotary_backward,
    .contiguous_inputs = true,
    .doc = "(x [B, NH, T, HS]) -> x with pairs (i, i + HS/2) of row t turned by (offset + t) / "
           "theta^(2i/HS) (rotary position embedding, Su et al. 2021, Hugging Face's rotate-half "
           "layout); attrs theta (10000), offset (0), inverse (0; 1 turns back: the gradient)",
    .test = {.example = rotary_example},
};

slapo_node *slapo_rotary(slapo_ctx *ctx, slapo_node *x, double theta, int64_t offset) {
  slapo_attr a[2] = {slapo_attr_float("theta", theta), slapo_attr_int("offset", offset)};
  return slapo__call1(ctx, SLAPO_OP_DESC(rotary), x, 2, a);
}
