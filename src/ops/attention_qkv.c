/* ops/attention_qkv.c - "flash_attention_qkv": FlashAttention reading its
 * heads where the fused projection wrote them. qkv [B, T, (NH + 2 NKV) HS]
 * is GPT-2's c_attn output (q heads, then k heads, then v heads along the
 * last axis); the result [B, T, NH HS] is what c_proj reads. The same
 * computation as flash_attention on the split heads (the same kernels,
 * ops/fa_kernels.c, with row strides), without the three slices, the four
 * [B, T, NH, HS] <-> [B, NH, T, HS] permute copies and, in the backward, the
 * slice_backward/concat that join dq, dk, dv: its backward op
 * "flash_attention_qkv_backward"(qkv, out, dout[, mask]) writes d(qkv)
 * [B, T, W] directly. Attributes: n_head (NH), n_kv_head (NKV, default NH),
 * then those of flash_attention. Layer: ops. */
#include <math.h>

#include "ops/fa.h"

typedef struct qkv_dims {
  int64_t B, T, W, NH, NKV, HS;
} qkv_dims;

static qkv_dims dims_of(const slapo_node *node, const int64_t *qkv_shape) {
  qkv_dims d = {qkv_shape[0], qkv_shape[1], qkv_shape[2], 0, 0, 0};
  d.NH = slapo_node_attr_int(node, "n_head", 0);
  d.NKV = slapo_node_attr_int(node, "n_kv_head", d.NH);
  d.HS = d.NH > 0 && d.NKV > 0 ? d.W / (d.NH + 2 * d.NKV) : 0;
  return d;
}

/* (qkv[, mask]) forward or (qkv, out, dout[, mask]) backward. */
static slapo_status check(const slapo_node *node, bool backward) {
  const char *op = node->target;
  int base = backward ? 3 : 1;
  if (node->n_inputs != base && node->n_inputs != base + 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: expects %s and an optional mask, got %d inputs", op,
                       backward ? "(qkv, out, dout)" : "(qkv)", node->n_inputs);
  for (int i = 0; i < node->n_inputs; i++) SLAPO_TRY(slapo__want_dtype(node, i, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0];
  if (x->ndim != 3)
    return slapo_error(SLAPO_SHAPE, "%s: qkv %s must be [B, T, (NH + 2 NKV) HS]", op,
                       slapo__shape_of(x));
  qkv_dims d = dims_of(node, x->shape);
  if (d.NH < 1 || d.NKV < 1 || d.NH % d.NKV || d.HS < 1 || d.W != (d.NH + 2 * d.NKV) * d.HS)
    return slapo_error(SLAPO_SHAPE,
                       "%s: qkv %s does not split into n_head = %lld query heads and 2 x "
                       "n_kv_head = %lld key/value heads of one size (NKV must divide NH)",
                       op, slapo__shape_of(x), (long long)d.NH, (long long)d.NKV);
  int64_t o_shape[3] = {d.B, d.T, d.NH * d.HS};
  for (int i = 1; backward && i < 3; i++)
    if (!slapo_shape_equal(node->inputs[i]->ndim, node->inputs[i]->shape, 3, o_shape))
      return slapo_error(SLAPO_SHAPE, "%s: %s %s must be [B, T, NH HS] = [%lld, %lld, %lld]", op,
                         i == 1 ? "out" : "dout", slapo__shape_of(node->inputs[i]),
                         (long long)d.B, (long long)d.T, (long long)(d.NH * d.HS));
  if (node->n_inputs == base + 1) {
    const slapo_node *m = node->inputs[base];
    if (m->ndim != 2 || m->shape[0] != d.B || m->shape[1] != d.T)
      return slapo_error(SLAPO_SHAPE, "%s: mask %s must be [B, T] = [%lld, %lld]", op,
                         slapo__shape_of(m), (long long)d.B, (long long)d.T);
  }
  return SLAPO_OK;
}

static slapo_status infer(slapo_node *node) {
  SLAPO_TRY(check(node, false));
  qkv_dims d = dims_of(node, node->inputs[0]->shape);
  int64_t shape[3] = {d.B, d.T, d.NH * d.HS};
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 3, shape);
}

static slapo_status backward_infer(slapo_node *node) {
  SLAPO_TRY(check(node, true));
  return slapo__same_as_input(node, 0);
}

/* Rows of query head h of batch row b at qkv + b T W + h HS + t W; kv head
 * j at + (NH + j) HS (k) and + (NH + NKV + j) HS (v); output rows at
 * b T NH HS + h HS + t NH HS. */
static fa_geom geom_of(const slapo_node *node, const slapo_tensor *const *in, bool backward,
                       const slapo_kernel_env *env) {
  qkv_dims d = dims_of(node, in[0]->shape);
  fa_geom g = {0};
  g.BH = d.B * d.NH, g.NH = d.NH, g.G = d.NH / d.NKV, g.T = d.T, g.HS = d.HS;
  int base = backward ? 3 : 1;
  g.mask = node->n_inputs > base ? slapo_tensor_data(in[base]) : NULL;
  slapo__fa_attrs(&g, node, env);
  int64_t C = d.NH * d.HS;
  g.lq = (fa_rows){d.NH, d.T * d.W, d.HS, d.W};
  g.lkv = (fa_rows){d.NKV, d.T * d.W, d.HS, d.W};
  g.lo = (fa_rows){d.NH, d.T * C, d.HS, C};
  g.q = slapo_tensor_data(in[0]); /* q, k, v: [B, T, W] column blocks */
  g.k = g.q + C;
  g.v = g.k + d.NKV * d.HS;
  if (backward) {
    g.o = (float *)slapo_tensor_data(in[1]); /* o, dO [B, T, C] (o read only) */
    g.dO = slapo_tensor_data(in[2]);
  }
  return g;
}

static void forward_kernel(const slapo_node *node, const slapo_tensor *const *in,
                           slapo_tensor *out, const slapo_kernel_env *env, bool reference) {
  fa_geom g = geom_of(node, in, false, env);
  g.o = slapo_tensor_data(out); /* o [B, T, NH HS] */
  slapo__fa_forward(&g, reference);
}

static void backward_kernel(const slapo_node *node, const slapo_tensor *const *in,
                            slapo_tensor *out, const slapo_kernel_env *env, bool reference) {
  fa_geom g = geom_of(node, in, true, env);
  g.dq = slapo_tensor_data(out); /* d(qkv) [B, T, W], the blocks of q, k, v */
  g.dk = g.dq + (g.k - g.q);
  g.dv = g.dq + (g.v - g.q);
  slapo__fa_backward(&g, reference, g.dq, slapo_tensor_numel(out));
}

FA_OP_KERNELS

static slapo_status rule(slapo_ctx *ctx, slapo_node *node, slapo_node *dy, const bool *need,
                         slapo_node **dx) {
  for (int i = 0; i < node->n_inputs; i++) dx[i] = NULL;
  if (node->n_inputs == 2 && need[1])
    return slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                          "%s: flash_attention_qkv has no gradient for its mask; the mask is an "
                          "input (padding), not a parameter",
                          slapo_ctx_origin(ctx));
  if (!need[0]) return slapo_ctx_status(ctx);
  /* Same attributes: the backward regenerates the forward's dropout mask. */
  slapo_node *in[4] = {node->inputs[0], node, dy, node->n_inputs == 2 ? node->inputs[1] : NULL};
  dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention_qkv_backward), in[3] ? 4 : 3, in,
                         node->n_attrs, node->attrs);
  return slapo_ctx_status(ctx);
}

/* B = 1, T = 5, 2 query heads over one kv head of 4: W = 16; causal,
 * dropout 0.2 (a fixed function of the keys: smooth for finite differences). */
static slapo_node *example(slapo_ctx *ctx) {
  int64_t shape[3] = {1, 5, 16};
  slapo_node *qkv = slapo_input(ctx, "qkv", SLAPO_DTYPE_F32, 3, shape);
  slapo_attr a[5] = {slapo_attr_int("n_head", 2), slapo_attr_int("n_kv_head", 1),
                     slapo_attr_int("causal", 1), slapo_attr_float("scale", 0.5),
                     slapo_attr_float("dropout_p", 0.2)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention_qkv), 1, &qkv, 5, a);
}

/* Non-causal over T = 37 (crossing tile edges), 2 heads of 3. */
static slapo_node *backward_example(slapo_ctx *ctx) {
  int64_t xs[3] = {1, 37, 18}, os[3] = {1, 37, 6};
  slapo_node *in[3] = {slapo_input(ctx, "qkv", SLAPO_DTYPE_F32, 3, xs),
                       slapo_input(ctx, "out", SLAPO_DTYPE_F32, 3, os),
                       slapo_input(ctx, "dout", SLAPO_DTYPE_F32, 3, os)};
  slapo_attr a[3] = {slapo_attr_int("n_head", 2), slapo_attr_int("causal", 0),
                     slapo_attr_float("dropout_p", 0.3)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(flash_attention_qkv_backward), 3, in, 3, a);
}

/* As flash_attention's: 4 T per element of the output [B, T, NH HS]. */
static double flops(const slapo_node *n) {
  return 4.0 * (double)slapo_shape_numel(n->ndim, n->shape) * (double)n->shape[1];
}

SLAPO_OP_DESCRIPTOR(flash_attention_qkv) = {
    .name = "flash_attention_qkv",
    .flops = flops,
    .n_inputs = -1,
    .infer = infer,
    .ref = fa_ref,
    .fast = fa_fast,
    .backward = rule,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(qkv [B, T, (NH + 2 NKV) HS][, mask [B, T]]) -> [B, T, NH HS]: flash_attention on "
           "the q, k, v heads packed along qkv's last axis (a fused projection's output), "
           "written with merged heads; attrs n_head, n_kv_head (default n_head), causal, "
           "scale, dropout_p, stream, offset as flash_attention (the same masks)",
    .test = {.example = example, .lo = -1, .hi = 1},
};

SLAPO_OP_DESCRIPTOR(flash_attention_qkv_backward) = {
    .name = "flash_attention_qkv_backward",
    .n_inputs = -1,
    .infer = backward_infer,
    .ref = fa_backward_ref,
    .fast = fa_backward_fast,
    .contiguous_inputs = true,
    .random = true,
    .doc = "(qkv, out, dout[, mask]) -> d(qkv) [B, T, W], recomputing scores and row "
           "statistics tile by tile (FlashAttention Alg. 4); attrs as flash_attention_qkv",
    .test = {.example = backward_example,
             .checked_by = "flash_attention_qkv's gradcheck and the split-head "
                           "flash_attention (tests/unit/test_flash_attention.c)"},
};
