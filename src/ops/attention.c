/* ops/attention.c - "flash_attention"(q, k, v) [B, NH, T, HS] = dropout(softmax(
 * scale q k^T, causal)) v computed in [32, 32] tiles without the [T, T] matrix
 * (Dao et al., "FlashAttention", NeurIPS 2022: Alg. 1 forward with the online
 * softmax, Alg. 2 dropout, Alg. 4 backward), and its backward-only op
 * "flash_attention_backward"(q, k, v, out, dout) -> dq, dk, dv packed flat.
 * k and v may have fewer heads than q (grouped-query attention, Ainslie et
 * al. 2023), and an optional [B, T] additive key mask (BERT's padding) joins
 * the scores. Layer: ops. Derivation: docs/flash_attention_backward.md.
 * One output per node: the row statistics are recomputed in the backward
 * kernel, and the rule reads the packed gradients through unpack views
 * (design note below). */
#include <math.h>
#include <string.h>

#include "ops/fa.h"

/* Design. The executor runs single-output nodes only, so:
 *  - the forward saves only its output. The paper also saves the row
 *    log-sum-exp L; here the backward kernel recomputes the row max and sum
 *    (kept apart: see row_stats) for each query
 *    tile with one more pass of q k^T (about 1/6 of the backward's work)
 *    rather than adding a second forward result or a separate "lse" node,
 *    which would cost the same pass plus a graph value;
 *  - the backward is one op returning dq, dk, dv concatenated, so the scores
 *    are recomputed once instead of once per gradient (three backward ops);
 *    the rule reads dq, dk, dv back with zero-copy unpack views;
 *  - grouped heads: one backward job per kv head runs its query heads in
 *    order, so dk and dv sum over the group without atomics or a race;
 *  - dropout on P reproduces the unfused Dropout module exactly: P[b, h, t, s]
 *    is kept iff slapo_rng_uniform(seed, stream, step, offset + ((b NH + h) T
 *    + t) T + s) >= p (its flat index in the [B, NH, T, T] probabilities) and
 *    scaled by 1/(1-p); "stream" is the key of the dropout op it replaces
 *    (slapo_rng_stream), applied only when env->training and p > 0.
 * Nothing of size T x T is ever allocated: the fast kernels keep one or three
 * [32, 32] tiles per thread on the stack; the reference kernels recompute
 * each score where needed (they are O(T^2 HS) and single-threaded). */


/* ------------------------------------------------------------------------ */
/* Shared: shape checks, attributes, dropout keys                            */
/* ------------------------------------------------------------------------ */

static const char *const k_names[5] = {"q", "k", "v", "out", "dout"};

/* Inputs of a forward (q, k, v[, mask]) or backward (q, k, v, out, dout[,
 * mask]) node: the mask, when present, is the last one. */
static int n_qkv_inputs(bool backward) { return backward ? 5 : 3; }
static bool has_mask(const slapo_node *node, bool backward) {
  return node->n_inputs > n_qkv_inputs(backward);
}

/* k and v [B, NKV, T, HS] with NKV dividing NH (grouped-query attention:
 * query head h reads kv head h / (NH / NKV)); out and dout q's shape. */
static slapo_status check_heads(const slapo_node *node, int i) {
  const slapo_node *q = node->inputs[0], *x = node->inputs[i];
  bool kv = i == 1 || i == 2;
  bool ok = x->ndim == 4 && x->shape[0] == q->shape[0] && x->shape[2] == q->shape[2] &&
            x->shape[3] == q->shape[3] &&
            (kv ? x->shape[1] > 0 && q->shape[1] % x->shape[1] == 0 &&
                      (i == 1 || x->shape[1] == node->inputs[1]->shape[1])
                : x->shape[1] == q->shape[1]);
  if (ok) return SLAPO_OK;
  char qs[96];
  slapo_shape_str(q->ndim, q->shape, qs, sizeof qs);
  return slapo_error(SLAPO_SHAPE,
                     "%s: %s %s differs from q %s; %s", node->target, k_names[i],
                     slapo__shape_of(x), qs,
                     kv ? "k and v must be [B, NKV, T, HS] alike, with NKV dividing q's NH "
                          "(grouped-query heads)"
                        : "out and dout must have q's shape [B, NH, T, HS]");
}

/* The optional additive key mask: f32 [B, T], added to every score of key s
 * in batch b (Hugging Face's extended attention mask, 0 = attend, a large
 * negative value = padding). */
static slapo_status check_mask(const slapo_node *node, int i) {
  const slapo_node *q = node->inputs[0], *m = node->inputs[i];
  if (m->ndim == 2 && m->shape[0] == q->shape[0] && m->shape[1] == q->shape[2]) return SLAPO_OK;
  return slapo_error(SLAPO_SHAPE,
                     "%s: mask %s must be [B, T] = [%lld, %lld], one additive bias per key "
                     "(0 = attend, a large negative value = padding)",
                     node->target, slapo__shape_of(m), (long long)q->shape[0],
                     (long long)q->shape[2]);
}

/* Every input f32; q [B, NH, T, HS], k and v [B, NKV, T, HS]; attributes in
 * range. */
static slapo_status check_inputs(const slapo_node *node, bool backward) {
  const char *op = node->target;
  int n_heads = n_qkv_inputs(backward);
  if (node->n_inputs != n_heads && node->n_inputs != n_heads + 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: expects %d inputs (%s) and an optional mask, got %d",
                       op, n_heads, backward ? "q, k, v, out, dout" : "q, k, v", node->n_inputs);
  for (int i = 0; i < node->n_inputs; i++) SLAPO_TRY(slapo__want_dtype(node, i, SLAPO_DTYPE_F32));
  const slapo_node *q = node->inputs[0];
  if (q->ndim != 4)
    return slapo_error(SLAPO_SHAPE,
                       "%s: q %s must be 4-d [B, NH, T, HS]; split the heads with reshape and "
                       "permute first",
                       op, slapo__shape_of(q));
  for (int i = 1; i < n_heads; i++) SLAPO_TRY(check_heads(node, i));
  if (has_mask(node, backward)) SLAPO_TRY(check_mask(node, n_heads));
  int64_t causal = slapo_node_attr_int(node, "causal", 0);
  if (causal != 0 && causal != 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute causal = %lld; use 0 or 1", op,
                       (long long)causal);
  double scale = slapo_node_attr_float(node, "scale", 1.0);
  if (!isfinite(scale))
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: attribute scale = %g is not finite; use e.g. 1/sqrt(HS) = %g", op,
                       scale, 1.0 / sqrt((double)(q->shape[3] > 0 ? q->shape[3] : 1)));
  double p = slapo_node_attr_float(node, "dropout_p", 0.0);
  if (!(p >= 0 && p <= 1))
    return slapo_error(SLAPO_INVALID_ARG, "%s: dropout_p = %g is outside [0, 1]", op, p);
  int64_t offset = slapo_node_attr_int(node, "offset", 0);
  if (offset < 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: offset = %lld; it must be >= 0", op,
                       (long long)offset);
  return SLAPO_OK;
}

/* Geometry, attributes and RNG keys of one kernel call. */

/* The geometry of a node on [B, NH, T, HS] q and [B, NKV, T, HS] k, v, with
 * contiguous heads; pointers: q, k, v (and o, dO for the backward). */
static fa_geom geom_of(const slapo_node *node, const slapo_tensor *const *in, bool backward,
                       const slapo_kernel_env *env) {
  const slapo_tensor *q = in[0];
  fa_geom g = {0};
  g.BH = q->shape[0] * q->shape[1];
  g.NH = q->shape[1];
  g.G = q->shape[1] / in[1]->shape[1];
  g.T = q->shape[2];
  g.HS = q->shape[3];
  g.mask = has_mask(node, backward) ? slapo_tensor_data(in[n_qkv_inputs(backward)]) : NULL;
  slapo__fa_attrs(&g, node, env);
  int64_t NKV = g.NH / g.G, n = g.T * g.HS;
  g.lq = g.lo = (fa_rows){g.NH, g.NH * n, n, g.HS};
  g.lkv = (fa_rows){NKV, NKV * n, n, g.HS};
  g.q = slapo_tensor_data(in[0]); /* q [BH, T, HS] */
  g.k = slapo_tensor_data(in[1]); /* k [BH / G, T, HS] */
  g.v = slapo_tensor_data(in[2]); /* v [BH / G, T, HS] */
  if (backward) {
    g.o = (float *)slapo_tensor_data(in[3]); /* o  [BH, T, HS] (read only here) */
    g.dO = slapo_tensor_data(in[4]);         /* dO [BH, T, HS] */
  }
  return g;
}

static void forward_kernel(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env, bool reference) {
  fa_geom g = geom_of(node, in, false, env);
  g.o = slapo_tensor_data(out); /* o [BH, T, HS] */
  slapo__fa_forward(&g, reference);
}

/* The packed gradients: dq [BH, T, HS], then dk and dv [BH / G, T, HS]. */
static void backward_kernel(const slapo_node *node, const slapo_tensor *const *in,
                            slapo_tensor *out, const slapo_kernel_env *env, bool reference) {
  fa_geom g = geom_of(node, in, true, env);
  g.dq = slapo_tensor_data(out);
  g.dk = g.dq + g.BH * g.T * g.HS;
  g.dv = g.dk + g.BH / g.G * g.T * g.HS;
  slapo__fa_backward(&g, reference, g.dq, slapo_tensor_numel(out));
}

FA_OP_KERNELS

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

static slapo_status fa_infer(slapo_node *node) {
  SLAPO_TRY(check_inputs(node, false));
  return slapo__same_as_input(node, 0);
}

static int64_t numel_of(const slapo_node *x) { return slapo_shape_numel(x->ndim, x->shape); }

/* The packed gradients: dq (q's numel), then dk and dv (k's numel each),
 * one flat f32 buffer read back through zero-copy unpack views. */
static slapo_status fa_backward_infer(slapo_node *node) {
  SLAPO_TRY(check_inputs(node, true));
  int64_t n = numel_of(node->inputs[0]) + 2 * numel_of(node->inputs[1]);
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &n);
}

static slapo_status fa_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                const bool *need, slapo_node **dx) {
  for (int i = 0; i < node->n_inputs; i++) dx[i] = NULL;
  if (has_mask(node, false) && need[3])
    return slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                          "%s: flash_attention has no gradient for its mask; the mask is an "
                          "input (padding), not a parameter",
                          slapo_ctx_origin(ctx));
  if (!need[0] && !need[1] && !need[2]) return slapo_ctx_status(ctx);
  /* Same attributes (causal, scale, dropout_p, stream, offset): the backward
   * regenerates the forward's dropout mask instead of storing it. */
  slapo_node *in[6] = {node->inputs[0], node->inputs[1], node->inputs[2], node, dy,
                       has_mask(node, false) ? node->inputs[3] : NULL};
  slapo_node *packed = slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention_backward),
                                       in[5] ? 6 : 5, in, node->n_attrs, node->attrs);
  int64_t offset = 0;
  for (int i = 0; i < 3; i++) {
    const slapo_node *x = node->inputs[i];
    slapo_attr a[2] = {slapo_attr_int("offset", offset), slapo_attr_ints("shape", x->ndim, x->shape)};
    if (need[i]) dx[i] = slapo_op_apply(ctx, SLAPO_OP_DESC(unpack), 1, &packed, 2, a);
    offset += numel_of(x);
  }
  return slapo_ctx_status(ctx);
}

/* B = 1, NH = 2 query heads over one kv head (grouped), T = 5, HS = 4,
 * causal, dropout 0.2: the mask is a fixed function of the keys, so finite
 * differences see a smooth function. */
static slapo_node *fa_example(slapo_ctx *ctx) {
  int64_t shape[4] = {1, 2, 5, 4}, kv[4] = {1, 1, 5, 4};
  slapo_node *in[3];
  for (int i = 0; i < 3; i++)
    in[i] = slapo_input(ctx, k_names[i], SLAPO_DTYPE_F32, 4, i ? kv : shape);
  slapo_attr a[3] = {slapo_attr_int("causal", 1), slapo_attr_float("scale", 0.5),
                     slapo_attr_float("dropout_p", 0.2)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention), 3, in, 3, a);
}

/* Non-causal, with a T (37) that crosses tile boundaries; `out` is an
 * arbitrary input here (the kernels only use it for D = rowsum(dO out)). */
static slapo_node *fa_backward_example(slapo_ctx *ctx) {
  int64_t shape[4] = {1, 2, 37, 3};
  slapo_node *in[5];
  for (int i = 0; i < 5; i++) in[i] = slapo_input(ctx, k_names[i], SLAPO_DTYPE_F32, 4, shape);
  slapo_attr a[2] = {slapo_attr_int("causal", 0), slapo_attr_float("dropout_p", 0.3)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention_backward), 5, in, 2, a);
}

/* q k^T and p v: 2 x 2 T per element of the output [B, NH, T, HS], T the
 * keys (the causal mask's skipped half is not subtracted). */
static double fa_flops(const slapo_node *n) {
  return 4.0 * (double)slapo_shape_numel(n->ndim, n->shape) * (double)n->inputs[1]->shape[2];
}

SLAPO_OP_DESCRIPTOR(flash_attention) = {
    .name = "flash_attention",
    .n_inputs = -1,
    .infer = fa_infer,
    .ref = fa_ref,
    .fast = fa_fast,
    .backward = fa_backward,
    .flops = fa_flops,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(q [B, NH, T, HS], k, v [B, NKV, T, HS][, mask [B, T]]) -> dropout(softmax(scale "
           "q k^T + mask, causal)) v [B, NH, T, HS] without materializing the [T, T] scores "
           "(FlashAttention, Dao et al. 2022, Alg. 1-2); NKV divides NH (grouped-query heads: "
           "query head h reads kv head h / (NH / NKV)); mask: an additive bias per key (0 "
           "attend, -3.4e38 padding, as Hugging Face's extended attention mask); attrs "
           "causal (0/1), scale (default 1/sqrt(HS)), dropout_p, stream (the RNG key of the "
           "dropout it replaces; set by slapo_op_call when absent), offset (default 0); P[b, h, "
           "t, s] kept iff uniform(seed, stream, step, offset + ((b NH + h) T + t) T + s) >= p",
    .test = {.example = fa_example, .lo = -1, .hi = 1},
};

SLAPO_OP_DESCRIPTOR(flash_attention_backward) = {
    .name = "flash_attention_backward",
    .n_inputs = -1,
    .infer = fa_backward_infer,
    .ref = fa_backward_ref,
    .fast = fa_backward_fast,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(q, k, v, out, dout[, mask]) -> dq, dk, dv packed flat (q's numel, then k's "
           "twice), recomputing the scores and the row max and sum tile by tile "
           "(FlashAttention Alg. 4) instead of the "
           "composite's [T, T] probabilities, dropout mask and their gradients; attrs as "
           "flash_attention",
    .test = {.example = fa_backward_example,
             .checked_by = "softmax + dropout + matmul composite (through flash_attention's "
                           "gradcheck)"},
};
