/* module/layers.c - built-in layers with PyTorch's names and semantics:
 * Linear, LayerNorm, RMSNorm, Embedding, Dropout, GELU, ReLU, SiLU, ModuleList.
 * Layer: module. */
#include <stdio.h>

#include "module/internal.h"

static slapo_node *one_input(slapo_ctx *ctx, const slapo_module *self, int n_in,
                             slapo_node *const *in) {
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: %s expects 1 input, got %d",
                   slapo_ctx_origin(ctx), self->type->name, n_in);
    return NULL;
  }
  return in[0];
}

/* ---- Linear ---- */

typedef struct linear_cfg {
  int64_t in, out;
  bool bias;
} linear_cfg;

static slapo_node *linear_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                  slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  if (!x) return NULL;
  const linear_cfg *c = self->config;
  slapo_node *w = slapo_weight(ctx, self, "weight");
  slapo_node *b = c->bias ? slapo_weight(ctx, self, "bias") : NULL;
  return slapo_linear(ctx, x, w, b);
}

/* From the weight: a sharded Linear shows this rank's features. */
static void linear_describe(const slapo_module *self, char *buf, size_t cap) {
  const linear_cfg *c = self->config;
  const slapo_parameter *w = slapo_module_param(self, "weight");
  int64_t in = w ? w->value->shape[1] : c->in, out = w ? w->value->shape[0] : c->out;
  snprintf(buf, cap, "in_features=%lld, out_features=%lld, bias=%s%s", (long long)in,
           (long long)out, c->bias ? "True" : "False", w && w->shard ? ", sharded" : "");
}

/* Op forms (pattern matching: linear ~ Linear, ...): the op each layer
 * emits, with its inputs in the op's order. */
static bool form(slapo_op_form *f, const slapo_op *op, int n, const char *const *inputs) {
  *f = (slapo_op_form){.op = op, .n_inputs = n};
  for (int i = 0; i < n; i++) f->inputs[i] = inputs[i];
  return true;
}

static bool linear_form(const slapo_module *self, slapo_op_form *f) {
  const linear_cfg *c = self->config;
  return form(f, SLAPO_OP_DESC(linear), c->bias ? 3 : 2, (const char *const[]){"$0", "weight", "bias"});
}

static const slapo_module_type k_linear = {"Linear", linear_forward, linear_describe, NULL,
                                           linear_form};

slapo_status slapo_linear_new(int64_t in_features, int64_t out_features, bool bias, float std,
                              slapo_module **out) {
  if (in_features <= 0 || out_features <= 0)
    return slapo_error(SLAPO_INVALID_ARG, "Linear: sizes must be positive, got in=%lld out=%lld",
                       (long long)in_features, (long long)out_features);
  linear_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "Linear: out of memory");
  *c = (linear_cfg){in_features, out_features, bias};
  SLAPO_TRY(slapo_module_new(&k_linear, c, out));
  int64_t ws[2] = {out_features, in_features};
  slapo_status s = slapo_module_add_param(*out, "weight", 2, ws, SLAPO_INIT_NORMAL, std);
  if (s == SLAPO_OK && bias)
    s = slapo_module_add_param(*out, "bias", 1, &out_features, SLAPO_INIT_ZEROS, 0);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

/* ---- LayerNorm ---- */

typedef struct ln_cfg {
  int64_t dim;
  double eps;
} ln_cfg;

static slapo_node *ln_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  if (!x) return NULL;
  const ln_cfg *c = self->config;
  return slapo_layer_norm(ctx, x, slapo_weight(ctx, self, "weight"),
                          slapo_weight(ctx, self, "bias"), c->eps);
}

static void ln_describe(const slapo_module *self, char *buf, size_t cap) {
  const ln_cfg *c = self->config;
  snprintf(buf, cap, "(%lld,), eps=%g", (long long)c->dim, c->eps);
}

static bool ln_form(const slapo_module *self, slapo_op_form *f) {
  const ln_cfg *c = self->config;
  bool ok = form(f, SLAPO_OP_DESC(layer_norm), 3, (const char *const[]){"$0", "weight", "bias"});
  f->attrs[f->n_attrs++] = slapo_attr_float("eps", c->eps);
  return ok;
}

static const slapo_module_type k_layernorm = {"LayerNorm", ln_forward, ln_describe, NULL,
                                              ln_form};

slapo_status slapo_layernorm_new(int64_t dim, double eps, slapo_module **out) {
  if (dim <= 0) return slapo_error(SLAPO_INVALID_ARG, "LayerNorm: dim must be positive, got %lld", (long long)dim);
  ln_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "LayerNorm: out of memory");
  *c = (ln_cfg){dim, eps};
  SLAPO_TRY(slapo_module_new(&k_layernorm, c, out));
  slapo_status s = slapo_module_add_param(*out, "weight", 1, &dim, SLAPO_INIT_ONES, 0);
  if (s == SLAPO_OK) s = slapo_module_add_param(*out, "bias", 1, &dim, SLAPO_INIT_ZEROS, 0);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

/* ---- RMSNorm (LLaMA's LlamaRMSNorm: weight only) ---- */

static slapo_node *rms_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  if (!x) return NULL;
  const ln_cfg *c = self->config;
  return slapo_rms_norm(ctx, x, slapo_weight(ctx, self, "weight"), c->eps);
}

static bool rms_form(const slapo_module *self, slapo_op_form *f) {
  const ln_cfg *c = self->config;
  bool ok = form(f, SLAPO_OP_DESC(rms_norm), 2, (const char *const[]){"$0", "weight"});
  f->attrs[f->n_attrs++] = slapo_attr_float("eps", c->eps);
  return ok;
}

static const slapo_module_type k_rmsnorm = {"RMSNorm", rms_forward, ln_describe, NULL, rms_form};

slapo_status slapo_rmsnorm_new(int64_t dim, double eps, slapo_module **out) {
  if (dim <= 0) return slapo_error(SLAPO_INVALID_ARG, "RMSNorm: dim must be positive, got %lld", (long long)dim);
  ln_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "RMSNorm: out of memory");
  *c = (ln_cfg){dim, eps};
  SLAPO_TRY(slapo_module_new(&k_rmsnorm, c, out));
  slapo_status s = slapo_module_add_param(*out, "weight", 1, &dim, SLAPO_INIT_ONES, 0);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

/* ---- Embedding ---- */

typedef struct emb_cfg {
  int64_t num, dim;
} emb_cfg;

static slapo_node *emb_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  slapo_node *idx = one_input(ctx, self, n_in, in);
  if (!idx) return NULL;
  const slapo_parameter *p = slapo_module_param(self, "weight");
  if (!p || !p->shard || p->shard->axis != 0)
    return slapo_embedding(ctx, slapo_weight(ctx, self, "weight"), idx);
  /* Vocab-parallel (Megatron-LM): this rank holds rows [start, start + V/n);
   * other ids read zeros, and the sync after the module sums the ranks. */
  int64_t start = slapo_shard_global_index(p->shard, 0) / p->shard->full[1];
  slapo_attr off = slapo_attr_int("offset", start);
  slapo_node *ins[2] = {slapo_weight(ctx, self, "weight"), idx};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(embedding), 2, ins, 1, &off);
}

static void emb_describe(const slapo_module *self, char *buf, size_t cap) {
  const emb_cfg *c = self->config;
  snprintf(buf, cap, "%lld, %lld", (long long)c->num, (long long)c->dim);
}

static bool emb_form(const slapo_module *self, slapo_op_form *f) {
  (void)self;
  return form(f, SLAPO_OP_DESC(embedding), 2, (const char *const[]){"weight", "$0"});
}

static const slapo_module_type k_embedding = {"Embedding", emb_forward, emb_describe, NULL,
                                              emb_form};

slapo_status slapo_embedding_new(int64_t num, int64_t dim, float std, slapo_module **out) {
  if (num <= 0 || dim <= 0)
    return slapo_error(SLAPO_INVALID_ARG, "Embedding: sizes must be positive, got %lld x %lld",
                       (long long)num, (long long)dim);
  emb_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "Embedding: out of memory");
  *c = (emb_cfg){num, dim};
  SLAPO_TRY(slapo_module_new(&k_embedding, c, out));
  int64_t ws[2] = {num, dim};
  slapo_status s = slapo_module_add_param(*out, "weight", 2, ws, SLAPO_INIT_NORMAL, std);
  if (s != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

/* ---- Dropout, GELU, ReLU ---- */

typedef struct scalar_cfg {
  double v;
} scalar_cfg;

static slapo_node *dropout_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                   slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  const scalar_cfg *c = self->config;
  return x ? slapo_dropout(ctx, x, c->v) : NULL;
}

static void dropout_describe(const slapo_module *self, char *buf, size_t cap) {
  snprintf(buf, cap, "p=%g", ((const scalar_cfg *)self->config)->v);
}

static slapo_node *gelu_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  const scalar_cfg *c = self->config;
  return x ? slapo_gelu(ctx, x, c->v != 0) : NULL;
}

static void gelu_describe(const slapo_module *self, char *buf, size_t cap) {
  snprintf(buf, cap, "approximate='%s'", ((const scalar_cfg *)self->config)->v ? "tanh" : "none");
}

static slapo_node *relu_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  return x ? slapo_relu(ctx, x) : NULL;
}

static slapo_node *silu_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  slapo_node *x = one_input(ctx, self, n_in, in);
  return x ? slapo_silu(ctx, x) : NULL;
}

static bool dropout_form(const slapo_module *self, slapo_op_form *f) {
  bool ok = form(f, SLAPO_OP_DESC(dropout), 1, (const char *const[]){"$0"});
  f->attrs[f->n_attrs++] = slapo_attr_float("p", ((const scalar_cfg *)self->config)->v);
  return ok;
}

static bool gelu_form(const slapo_module *self, slapo_op_form *f) {
  bool ok = form(f, SLAPO_OP_DESC(gelu), 1, (const char *const[]){"$0"});
  bool tanh = ((const scalar_cfg *)self->config)->v != 0;
  f->attrs[f->n_attrs++] = slapo_attr_str("approximate", tanh ? "tanh" : "none");
  return ok;
}

static bool relu_form(const slapo_module *self, slapo_op_form *f) {
  (void)self;
  return form(f, SLAPO_OP_DESC(relu), 1, (const char *const[]){"$0"});
}

static bool silu_form(const slapo_module *self, slapo_op_form *f) {
  (void)self;
  return form(f, SLAPO_OP_DESC(silu), 1, (const char *const[]){"$0"});
}

static const slapo_module_type k_dropout = {"Dropout", dropout_forward, dropout_describe, NULL,
                                            dropout_form};
static const slapo_module_type k_gelu = {"GELU", gelu_forward, gelu_describe, NULL, gelu_form};
static const slapo_module_type k_relu = {"ReLU", relu_forward, NULL, NULL, relu_form};
static const slapo_module_type k_silu = {"SiLU", silu_forward, NULL, NULL, silu_form};

static slapo_status scalar_module(const slapo_module_type *t, double v, slapo_module **out) {
  scalar_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "%s: out of memory", t->name);
  c->v = v;
  return slapo_module_new(t, c, out);
}

slapo_status slapo_dropout_new(double p, slapo_module **out) {
  if (!(p >= 0 && p < 1))
    return slapo_error(SLAPO_INVALID_ARG, "Dropout: p must be in [0, 1), got %g", p);
  return scalar_module(&k_dropout, p, out);
}

slapo_status slapo_gelu_new(bool tanh, slapo_module **out) {
  return scalar_module(&k_gelu, tanh ? 1 : 0, out);
}

slapo_status slapo_relu_new(slapo_module **out) { return scalar_module(&k_relu, 0, out); }
slapo_status slapo_silu_new(slapo_module **out) { return scalar_module(&k_silu, 0, out); }

/* ---- ModuleList ---- */

static slapo_node *list_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  /* Like nn.ModuleList, a list is a container, not a callable; models
   * iterate over its children with slapo_call. */
  slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED, "%s: a ModuleList cannot be called; call its children",
                 slapo_ctx_origin(ctx));
  (void)self, (void)n_in, (void)in;
  return NULL;
}

static const slapo_module_type k_modulelist = {"ModuleList", list_forward, NULL, NULL, NULL};

slapo_status slapo_modulelist_new(slapo_module **out) {
  return slapo_module_new(&k_modulelist, NULL, out);
}
