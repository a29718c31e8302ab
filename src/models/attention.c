/* models/attention.c - what the families' attention modules share: the
 * heads a tensor-parallel rank computes, attention over a KV cache while
 * decoding, the fused flash_attention op's attributes, and Linears tied to
 * a replaced module's for the FlashAttention replacements. Layer: models. */
#include <math.h>
#include <stdio.h>

#include "core/assert.h"
#include "models/internal.h"

bool slapo__local_heads(slapo_ctx *ctx, const slapo_module *attn, const char *proj,
                        int64_t rows_per_head, int64_t n_head, const char *what, int64_t *local,
                        int64_t *head0) {
  *local = n_head, *head0 = 0;
  const slapo_module *l = slapo_module_child(attn, proj);
  const slapo_parameter *w = l ? slapo_module_param(l, "weight") : NULL;
  if (!w || !w->shard || w->value->ndim != 2) return true;
  int64_t rows = w->value->shape[0];
  if (rows == 0 || rows % rows_per_head) {
    const char *o = slapo_ctx_origin(ctx);
    slapo_ctx_fail(ctx, SLAPO_SHAPE,
                   "%s: this rank's %s.weight keeps %lld of %lld rows (%d ranks), not whole "
                   "heads of %lld rows: the tensor-parallel size must divide %s = %lld",
                   o[0] ? o : "(root)", proj, (long long)rows, (long long)w->shard->full[0],
                   w->shard->count, (long long)rows_per_head, what, (long long)n_head);
    return false;
  }
  *local = rows / rows_per_head;
  *head0 = slapo_shard_global_index(w->shard, 0) / w->shard->full[1] /
           (rows_per_head / w->shard->parts);
  return true;
}

slapo_node *slapo__attend_decoding(slapo_ctx *ctx, slapo_node *q, slapo_node *k, slapo_node *v) {
  int64_t past = slapo_decode_past(ctx);
  if (!q || !k || !v) return NULL;
  if (past > 0 && q->shape[2] != 1) {
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED, "%s: decoding %lld new tokens after %lld cached ones; "
                   "steps after the first take one token", slapo_ctx_origin(ctx),
                   (long long)q->shape[2], (long long)past);
    return NULL;
  }
  slapo_node *k_all, *v_all;
  if (slapo_decode_kv(ctx, k, v, &k_all, &v_all) != SLAPO_OK) return NULL;
  slapo_node *att = slapo_matmul(ctx, q, k_all, false, true); /* [B, NH, T, P + T] */
  att = slapo_mul_scalar(ctx, att, 1.0 / sqrt((double)q->shape[3]));
  att = slapo_softmax(ctx, att, past == 0);
  return slapo_matmul(ctx, att, v_all, false, false);
}

slapo_node *slapo__flash_attention(slapo_ctx *ctx, const slapo_op *op, int n_in,
                                   slapo_node *const *in, const char *drop, bool causal,
                                   double scale, double p, int64_t local, int64_t head0,
                                   int64_t n_head, int64_t n_qkv_heads) {
  const char *origin = slapo_ctx_origin(ctx);
  char drop_path[1024];
  snprintf(drop_path, sizeof drop_path, "%s%s%s", origin, origin[0] ? "." : "", drop);
  slapo_attr attrs[7];
  int n = 0;
  if (n_qkv_heads > 0) attrs[n++] = slapo_attr_int("n_head", n_qkv_heads);
  attrs[n++] = slapo_attr_int("causal", causal);
  attrs[n++] = slapo_attr_float("scale", scale);
  attrs[n++] = slapo_attr_float("dropout_p", p);
  attrs[n++] = slapo_attr_int("stream", (int64_t)slapo_rng_stream(drop_path, slapo_ctx_call(ctx), 0));
  if (local != n_head) { /* tensor parallel: the unsharded model's masks in these heads */
    attrs[n++] = slapo_attr_int("head_offset", head0);
    attrs[n++] = slapo_attr_int("n_head_total", n_head);
  }
  return slapo_op_apply(ctx, op, n_in, in, n, attrs);
}

slapo_status slapo__tied_linear(const slapo_module *old, const char *name, slapo_module **out) {
  *out = NULL;
  slapo_module *l = old ? slapo_module_child(old, name) : NULL;
  slapo_parameter *w = l ? slapo_module_param(l, "weight") : NULL;
  if (!w || w->value->ndim != 2)
    return slapo_error(SLAPO_INVALID_ARG,
                       "FlashAttention: the replaced module has no Linear child '%s' with a "
                       "2-d weight",
                       name);
  slapo_parameter *b = slapo_module_param(l, "bias");
  SLAPO_TRY(slapo_linear_new(w->value->shape[1], w->value->shape[0], b != NULL, 0.0f, out));
  slapo_status s = slapo_module_tie_param(*out, "weight", w);
  if (s == SLAPO_OK && b) s = slapo_module_tie_param(*out, "bias", b);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

