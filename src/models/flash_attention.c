/* models/flash_attention.c - GPT-2's "FlashAttention", a drop-in replacement
 * for GPT2Attention that runs the fused "flash_attention" op (Dao et al.,
 * "FlashAttention", NeurIPS 2022; kernels in src/ops/attention.c) instead of
 * the [B, NH, T, T] softmax + dropout + matmul composite. It ties the
 * replaced module's c_attn/c_proj parameters (same objects, same Hugging Face
 * paths) and keys its fused dropout with the stream of the replaced
 * `<path>.attn_dropout` module, so outputs, gradients and masks match the
 * original to rounding. Layer: models. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

typedef struct fa_cfg {
  int n_head;
  int64_t n_embd;    /* C */
  double attn_pdrop; /* p of the replaced attn_dropout */
} fa_cfg;

/* x [B, T, C] -> [B, T, C], as GPT2Attention's forward (models/gpt2.c) with
 * the four middle ops fused. */
static slapo_node *fa_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  const fa_cfg *c = self->config;
  const char *origin = slapo_ctx_origin(ctx);
  if (n_in != 1 || in[0]->ndim != 3 || in[0]->shape[2] != c->n_embd) {
    char s[128] = "";
    if (n_in == 1) slapo_shape_str(in[0]->ndim, in[0]->shape, s, sizeof s);
    slapo_ctx_fail(ctx, SLAPO_SHAPE,
                   "%s: FlashAttention expects one input x [B, T, %lld], got %d input(s)%s%s",
                   origin[0] ? origin : "(root)", (long long)c->n_embd, n_in,
                   n_in == 1 ? " x " : "", s);
    return NULL;
  }
  slapo_node *x = in[0];
  int64_t B = x->shape[0], T = x->shape[1], HS = c->n_embd / c->n_head, NH, head0;
  /* this rank's heads */
  if (!slapo__local_heads(ctx, self, "c_attn", 3 * HS, c->n_head, "n_head", &NH, &head0))
    return NULL;
  int64_t C = NH * HS;
  slapo_node *qkv = slapo_call1(ctx, self, "c_attn", x); /* [B, T, 3C] */
  slapo_node *y; /* [B, T, C] */
  if (slapo_decode_past(ctx) >= 0) {
    /* Decoding with a KV cache: one new query over the cached keys needs no
     * tiling; the composite does it (eval mode: no dropout). */
    slapo_node *parts[3];
    int64_t sizes[3] = {C, C, C};
    if (slapo_split(ctx, qkv, 2, 3, sizes, parts) != SLAPO_OK) return NULL;
    int64_t bthd[4] = {B, T, NH, HS}, perm[4] = {0, 2, 1, 3}, btc[3] = {B, T, C};
    slapo_node *heads[3];
    for (int i = 0; i < 3; i++) /* [B, NH, T, HS] */
      heads[i] = slapo_permute(ctx, slapo_reshape(ctx, parts[i], 4, bthd), 4, perm);
    y = slapo__attend_decoding(ctx, heads[0], heads[1], heads[2]);
    y = slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, btc);
  } else {
    /* The heads are read where c_attn wrote them and written where c_proj
     * reads them: no split, no head permutes, forward or backward. The
     * replaced attention's dropout is the first random op of its
     * `<path>.attn_dropout` child, called once per call of the attention;
     * the fused kernel reuses that op's stream. */
    y = slapo__flash_attention(ctx, SLAPO_OP_DESC(flash_attention_qkv), 1, &qkv, "attn_dropout",
                               true, 1.0 / sqrt((double)HS), c->attn_pdrop, NH, head0, c->n_head,
                               NH);
  }
  y = slapo_call1(ctx, self, "c_proj", y);
  return slapo_call1(ctx, self, "resid_dropout", y);
}

static void fa_describe(const slapo_module *self, char *buf, size_t cap) {
  const fa_cfg *c = self->config;
  snprintf(buf, cap, "n_head=%d, attn_pdrop=%g", c->n_head, c->attn_pdrop);
}

static const slapo_module_type k_flash_attention = {"FlashAttention", fa_forward, fa_describe,
                                                    NULL, NULL};

slapo_status slapo__gpt2_flash_attention_new(const slapo_module *replaced, slapo_module **out) {
  *out = NULL;
  /* GPT2Attention modules carry the model's config (models/gpt2.c). */
  const slapo_gpt2_config *g = replaced->config;
  fa_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "FlashAttention: out of memory");
  *c = (fa_cfg){g->n_head, g->n_embd, g->dropout};
  slapo_module *m;
  SLAPO_TRY(slapo_module_new(&k_flash_attention, c, &m));
  const char *linears[2] = {"c_attn", "c_proj"};
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < 2 && s == SLAPO_OK; i++) {
    slapo_module *l;
    s = slapo__tied_linear(replaced, linears[i], &l);
    if (s == SLAPO_OK) s = slapo_module_add_child(m, linears[i], l);
  }
  const char *drops[2] = {"attn_dropout", "resid_dropout"};
  for (int i = 0; i < 2 && s == SLAPO_OK; i++) {
    slapo_module *d;
    s = slapo_dropout_new(g->dropout, &d);
    if (s == SLAPO_OK) s = slapo_module_add_child(m, drops[i], d);
  }
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}
