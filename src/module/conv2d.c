/* module/conv2d.c - the built-in Conv2d layer with PyTorch's names, repr
 * and default init (nn.Conv2d: weight [out, in/groups, KH, KW] by
 * kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
 * bias [out] with the same bound; fan_in = in/groups * KH * KW). Its
 * forward and op form are the "conv2d" op (ops/conv.c). Layer: module. */
#include <math.h>
#include <stdio.h>

#include "module/internal.h"

/* The op form's ints attributes point into this config, which lives as long
 * as the module. */
typedef struct conv2d_cfg {
  int64_t in, out, kernel[2];
  slapo_conv2d_opts o;
} conv2d_cfg;

static slapo_node *conv2d_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: Conv2d expects 1 input, got %d",
                   slapo_ctx_origin(ctx), n_in);
    return NULL;
  }
  const conv2d_cfg *c = self->config;
  slapo_node *w = slapo_weight(ctx, self, "weight");
  slapo_node *b = c->o.bias ? slapo_weight(ctx, self, "bias") : NULL;
  return slapo_conv2d(ctx, in[0], w, b, c->o.stride, c->o.padding, c->o.dilation, c->o.groups);
}

/* Appends ", key=(a, b)" to buf at *len. */
static void pair(char *buf, size_t cap, size_t *len, const char *key, const int64_t v[2]) {
  if (*len >= cap) return;
  int n = snprintf(buf + *len, cap - *len, ", %s=(%lld, %lld)", key, (long long)v[0],
                   (long long)v[1]);
  if (n > 0) *len += (size_t)n;
}

/* PyTorch's _ConvNd.extra_repr: padding, dilation, groups and bias only
 * when not the default. */
static void conv2d_describe(const slapo_module *self, char *buf, size_t cap) {
  const conv2d_cfg *c = self->config;
  int n = snprintf(buf, cap, "%lld, %lld", (long long)c->in, (long long)c->out);
  size_t len = n > 0 ? (size_t)n : 0;
  pair(buf, cap, &len, "kernel_size", c->kernel);
  pair(buf, cap, &len, "stride", c->o.stride);
  if (c->o.padding[0] || c->o.padding[1]) pair(buf, cap, &len, "padding", c->o.padding);
  if (c->o.dilation[0] != 1 || c->o.dilation[1] != 1)
    pair(buf, cap, &len, "dilation", c->o.dilation);
  if (c->o.groups != 1 && len < cap) {
    n = snprintf(buf + len, cap - len, ", groups=%lld", (long long)c->o.groups);
    if (n > 0) len += (size_t)n;
  }
  if (!c->o.bias && len < cap) snprintf(buf + len, cap - len, ", bias=False");
}

static bool conv2d_form(const slapo_module *self, slapo_op_form *f) {
  const conv2d_cfg *c = self->config;
  *f = (slapo_op_form){.op = SLAPO_OP_DESC(conv2d),
                       .n_inputs = c->o.bias ? 3 : 2,
                       .inputs = {"$0", "weight", "bias"},
                       .n_attrs = 4,
                       .attrs = {slapo_attr_ints("stride", 2, c->o.stride),
                                 slapo_attr_ints("padding", 2, c->o.padding),
                                 slapo_attr_ints("dilation", 2, c->o.dilation),
                                 slapo_attr_int("groups", c->o.groups)}};
  return true;
}

static const slapo_module_type k_conv2d = {"Conv2d", conv2d_forward, conv2d_describe, NULL,
                                           conv2d_form};

slapo_status slapo_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                              const slapo_conv2d_opts *opts, slapo_module **out) {
  slapo_conv2d_opts o = opts ? *opts : SLAPO_CONV2D_OPTS_DEFAULT;
  if (in_channels < 1 || out_channels < 1 || kh < 1 || kw < 1)
    return slapo_error(SLAPO_INVALID_ARG,
                       "Conv2d: sizes must be positive, got in_channels=%lld out_channels=%lld "
                       "kernel_size=(%lld, %lld)",
                       (long long)in_channels, (long long)out_channels, (long long)kh,
                       (long long)kw);
  for (int i = 0; i < 2; i++)
    if (o.stride[i] < 1 || o.dilation[i] < 1 || o.padding[i] < 0)
      return slapo_error(SLAPO_INVALID_ARG,
                         "Conv2d: stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1 "
                         "and padding (%lld, %lld) >= 0",
                         (long long)o.stride[0], (long long)o.stride[1],
                         (long long)o.dilation[0], (long long)o.dilation[1],
                         (long long)o.padding[0], (long long)o.padding[1]);
  if (o.groups < 1 || in_channels % o.groups || out_channels % o.groups)
    return slapo_error(SLAPO_INVALID_ARG,
                       "Conv2d: groups=%lld must be >= 1 and divide in_channels=%lld and "
                       "out_channels=%lld",
                       (long long)o.groups, (long long)in_channels, (long long)out_channels);
  conv2d_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "Conv2d: out of memory");
  *c = (conv2d_cfg){in_channels, out_channels, {kh, kw}, o};
  SLAPO_TRY(slapo_module_new(&k_conv2d, c, out));
  int64_t ws[4] = {out_channels, in_channels / o.groups, kh, kw};
  float bound = (float)(1.0 / sqrt((double)(ws[1] * kh * kw)));
  slapo_status s = slapo_module_add_param(*out, "weight", 4, ws, SLAPO_INIT_UNIFORM, bound);
  if (s == SLAPO_OK && o.bias)
    s = slapo_module_add_param(*out, "bias", 1, &out_channels, SLAPO_INIT_UNIFORM, bound);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}
