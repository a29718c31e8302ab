/* models/fused_linear.c - "FusedLinear", the subgraph module a horizontal
 * replacement puts in place of several Linear calls on one input (q, k and v
 * projections): one GEMM over the concatenated weights instead of several
 * smaller ones. It ties each matched Linear's weight and bias (same objects,
 * same Hugging Face paths) as weight_<i> / bias_<i>, so checkpoints still
 * load and the optimizer sees each parameter once, and returns the results
 * joined along the last axis, which the replacement splits back.
 * Layer: models. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "models/internal.h"

typedef struct fl_cfg {
  int n;      /* Linears fused */
  bool bias;  /* all have a bias (else none) */
} fl_cfg;

/* x [.., in] -> [.., sum of out_i] */
static slapo_node *fl_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                              slapo_node *const *in) {
  const fl_cfg *c = self->config;
  if (n_in != 1) {
    slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: FusedLinear expects 1 input, got %d",
                   slapo_ctx_origin(ctx), n_in);
    return NULL;
  }
  slapo_node *w[32], *b[32];
  for (int i = 0; i < c->n; i++) {
    char name[32];
    snprintf(name, sizeof name, "weight_%d", i);
    w[i] = slapo_weight(ctx, self, name);
    snprintf(name, sizeof name, "bias_%d", i);
    b[i] = c->bias ? slapo_weight(ctx, self, name) : NULL;
  }
  slapo_node *W = slapo_concat(ctx, c->n, w, 0);             /* [sum out, in] */
  slapo_node *B = c->bias ? slapo_concat(ctx, c->n, b, 0) : NULL; /* [sum out] */
  return slapo_linear(ctx, in[0], W, B);
}

static void fl_describe(const slapo_module *self, char *buf, size_t cap) {
  const fl_cfg *c = self->config;
  snprintf(buf, cap, "n=%d, bias=%s", c->n, c->bias ? "True" : "False");
}

static const slapo_module_type k_fused_linear = {"FusedLinear", fl_forward, fl_describe, NULL,
                                                 NULL};

/* The one Linear a match covers, or NULL. */
static const slapo_module *linear_of(slapo_module *owner, const slapo_match *x) {
  const slapo_module *found = NULL;
  for (int j = 0; j < x->n_nodes; j++) {
    slapo_module *m;
    if (x->nodes[j]->kind != SLAPO_NODE_CALL_MODULE ||
        slapo_module_at(owner, x->paths[j], &m) != SLAPO_OK || strcmp(m->type->name, "Linear"))
      return NULL;
    if (found) return NULL;
    found = m;
  }
  return found;
}

slapo_status slapo_fused_linear_new(slapo_module *owner, int n, const slapo_match *ms,
                                    slapo_module **out) {
  *out = NULL;
  if (n < 1 || n > 32)
    return slapo_error(SLAPO_INVALID_ARG, "FusedLinear: fuses 1 to 32 Linears, got %d", n);
  const slapo_module *lin[32];
  for (int i = 0; i < n; i++)
    if (!(lin[i] = linear_of(owner, &ms[i])))
      return slapo_error(SLAPO_UNSUPPORTED, "FusedLinear: match %d is not one Linear call "
                         "(pattern it as linear(x, w, b) or mod('...')(x))", i + 1);
  bool bias = slapo_module_param(lin[0], "bias") != NULL;
  for (int i = 1; i < n; i++)
    if ((slapo_module_param(lin[i], "bias") != NULL) != bias ||
        slapo_module_param(lin[i], "weight")->value->shape[1] !=
            slapo_module_param(lin[0], "weight")->value->shape[1])
      return slapo_error(SLAPO_INVALID_ARG, "FusedLinear: %s and %s differ in in_features or "
                         "bias", ms[0].paths[0], ms[i].paths[0]);
  fl_cfg *c = slapo_malloc(sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "FusedLinear: out of memory");
  *c = (fl_cfg){n, bias};
  slapo_module *m;
  SLAPO_TRY(slapo_module_new(&k_fused_linear, c, &m));
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < n && s == SLAPO_OK; i++) {
    char name[32];
    snprintf(name, sizeof name, "weight_%d", i);
    s = slapo_module_tie_param(m, name, slapo_module_param(lin[i], "weight"));
    snprintf(name, sizeof name, "bias_%d", i);
    if (s == SLAPO_OK && bias) s = slapo_module_tie_param(m, name, slapo_module_param(lin[i], "bias"));
  }
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}
