/* tests/compiler/test_dnnl.c - the dnnl backend (GEMM epilogue fusion):
 * every supported chain (linear + bias + relu, + gelu tanh, matmul(trans_b)
 * + bias + residual add, linear + scale, and a long chain through relu,
 * scale, residual and exact gelu that the backward recomputes) in a toy
 * traced model, fused with dnnl against none (loss and every parameter
 * gradient; fast and reference kernels); one op per equal region; chains
 * oneDNN cannot express refused with the op named; GPT-2 tiny with
 * gelu(linear(x, w, b)) fused in every MLP against the plain model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../primitives/prim_test.h"
#include "slapo/compiler.h"
#include "slapo/primitives.h"

static int setup(void **state) {
  (void)state;
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

/* ---- a toy model: x = in + e; y = chain(GEMM(x, w, b)); loss = sum(y y) ---- */

typedef enum chain {
  C_RELU,     /* relu(linear(x, w, b))                                      */
  C_GELU,     /* gelu(linear(x, w, b), tanh)                                */
  C_RESIDUAL, /* add(add(matmul(x, w, trans_b), b), tanh(x))                */
  C_SCALE,    /* mul_scalar(linear(x, w, b), -1.5)                          */
  C_LONG,     /* gelu(add(mul_scalar(relu(linear(x, w, b)), 2), tanh(x)))   */
  C_DROPOUT,  /* dropout(linear(x, w, b)): oneDNN has no post-op for it     */
} chain;

typedef struct toy {
  chain c;
  const char *pattern;
  int64_t N; /* out features (K = 8) */
} toy;

#define K_IN 8

static slapo_node *toy_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  const toy *t = self->config;
  slapo_node *x = slapo_add(ctx, in[0], slapo_weight(ctx, self, "e"));
  slapo_node *w = slapo_weight(ctx, self, "w"), *b = slapo_weight(ctx, self, "b"), *y = NULL;
  switch (t->c) {
  case C_RELU: y = slapo_relu(ctx, slapo_linear(ctx, x, w, b)); break;
  case C_GELU: y = slapo_gelu(ctx, slapo_linear(ctx, x, w, b), true); break;
  case C_RESIDUAL:
    y = slapo_add(ctx, slapo_add(ctx, slapo_matmul(ctx, x, w, false, true), b), slapo_tanh(ctx, x));
    break;
  case C_SCALE: y = slapo_mul_scalar(ctx, slapo_linear(ctx, x, w, b), -1.5); break;
  case C_LONG:
    y = slapo_mul_scalar(ctx, slapo_relu(ctx, slapo_linear(ctx, x, w, b)), 2.0);
    y = slapo_gelu(ctx, slapo_add(ctx, y, slapo_tanh(ctx, x)), false);
    break;
  case C_DROPOUT: y = slapo_dropout(ctx, slapo_linear(ctx, x, w, b), 0.1); break;
  }
  int64_t axes[3] = {0, 1, 2};
  return slapo_sum(ctx, slapo_mul(ctx, y, y), 3, axes, false);
}

static void toy_free(void *c) { (void)c; }
static const slapo_module_type k_toy = {"Toy", toy_forward, NULL, toy_free, NULL};

static const char *const k_params[] = {"e", "w", "b"};

static void fill(slapo_parameter *p, float lo, float hi, int salt) {
  float *d = slapo_tensor_data(p->value);
  for (int64_t i = 0; i < slapo_tensor_numel(p->value); i++)
    d[i] = lo + (hi - lo) * slapo_rng_uniform(11, (uint64_t)salt, 0, (uint64_t)i);
}

static const int64_t k_x[3] = {2, 3, K_IN};

static slapo_module *toy_model(const toy *t) {
  slapo_module *m;
  OK(slapo_module_new(&k_toy, (void *)t, &m));
  int64_t es[1] = {K_IN}, ws[2] = {t->N, K_IN}, bs[1] = {t->N};
  OK(slapo_module_add_param(m, "e", 1, es, SLAPO_INIT_ZEROS, 0));
  OK(slapo_module_add_param(m, "w", 2, ws, SLAPO_INIT_ZEROS, 0));
  OK(slapo_module_add_param(m, "b", 1, bs, SLAPO_INIT_ZEROS, 0));
  slapo_tensor *ex;
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, k_x, &ex));
  OK(slapo_module_set_example(m, 1, (const slapo_tensor *const *)&ex));
  slapo_tensor_free(ex);
  OK(slapo_module_materialize(m, 1));
  fill(slapo_module_param(m, "e"), -0.5f, 0.5f, 1);
  fill(slapo_module_param(m, "w"), -0.6f, 0.6f, 2);
  fill(slapo_module_param(m, "b"), -0.5f, 0.5f, 3);
  return m;
}

typedef struct toy_result {
  float loss;
  slapo_tensor *grad[3]; /* k_params order, contiguous copies */
} toy_result;

static void toy_run(slapo_module *m, bool reference, toy_result *r) {
  slapo_tensor *x;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 3, k_x, &x));
  float *d = slapo_tensor_data(x);
  for (int i = 0; i < 2 * 3 * K_IN; i++) d[i] = (float)((i * 7) % 11) / 11.0f - 0.45f;
  slapo_plan_opts po = {.reference = reference};
  slapo_runner *run;
  OK(slapo_runner_new(m, &po, &run));
  slapo_module_zero_grad(m);
  const slapo_tensor *out;
  slapo_kernel_env env = {.seed = 5, .step = 1, .training = true};
  OK(slapo_step(run, 1, (const slapo_tensor *const *)&x, SLAPO_STEP_TRAIN, &env, &out));
  r->loss = *(const float *)slapo_tensor_data(out);
  for (int i = 0; i < 3; i++)
    OK(slapo_tensor_contiguous(slapo_module_param(m, k_params[i])->grad, &r->grad[i]));
  slapo_runner_free(run);
  slapo_tensor_free(x);
}

static void toy_result_free(toy_result *r) {
  for (int i = 0; i < 3; i++) slapo_tensor_free(r->grad[i]);
}

/* Traces m and fuses t's pattern with `compiler`; returns the status. */
static slapo_status toy_fuse(slapo_module *m, const char *compiler, slapo_sched **root) {
  const toy *t = m->config;
  OK(slapo_sched_create(m, root));
  OK(slapo_trace(*root, NULL));
  slapo_pattern *p = pt_parse(t->pattern);
  slapo_status s = slapo_fuse(*root, p, compiler, "Epi", NULL, false);
  slapo_pattern_free(p);
  return s;
}

static void expect_close(const char *what, const toy_result *a, const toy_result *b) {
  print_message("%-28s loss %.7g vs %.7g\n", what, a->loss, b->loss);
  if (!(fabsf(a->loss - b->loss) <= 1e-5f + 1e-4f * fabsf(b->loss)))
    fail_msg("%s: loss %.9g vs %.9g", what, a->loss, b->loss);
  for (int i = 0; i < 3; i++) {
    double w = pt_worst(a->grad[i], b->grad[i], 1e-5, 1e-4);
    if (!(w <= 1)) fail_msg("%s: gradient of %s differs (%.3g of the tolerance)", what,
                            k_params[i], w);
  }
}

static const toy k_chains[] = {
    {C_RELU, "relu(linear(x, w, b))", 12},
    {C_GELU, "gelu(linear(x, w, b))", 12},
    {C_RESIDUAL, "add(add(matmul(x, w, trans_b=1), b), r)", K_IN},
    {C_SCALE, "mul_scalar(linear(x, w, b))", 12},
    {C_LONG, "gelu(add(mul_scalar(relu(linear(x, w, b))), r))", K_IN},
};

static void every_chain_dnnl_vs_none(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof k_chains / sizeof k_chains[0]; i++) {
    const toy *t = &k_chains[i];
    slapo_module *a = toy_model(t), *b = toy_model(t), *plain = toy_model(t);
    slapo_sched *ra, *rb;
    OK(toy_fuse(a, "none", &ra));
    slapo_status s = toy_fuse(b, "dnnl", &rb);
    if (s != SLAPO_OK) fail_msg("%s: %s", t->pattern, slapo_last_error());
    /* The region is one call of the fused module. */
    char *g = pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(b));
    if (!strstr(g, "call_module Epi_0(")) fail_msg("%s: not fused:\n%s", t->pattern, g);
    free(g);
    toy_result rn, rd, rr, rp;
    toy_run(a, false, &rn);
    toy_run(b, false, &rd);
    toy_run(b, true, &rr); /* the dnnl op's reference kernel */
    toy_run(plain, false, &rp);
    expect_close(t->pattern, &rd, &rn);
    expect_close("  (reference kernels)", &rr, &rn);
    expect_close("  (none vs plain)", &rn, &rp);
    toy_result_free(&rn), toy_result_free(&rd), toy_result_free(&rr), toy_result_free(&rp);
    slapo_sched_free(ra), slapo_sched_free(rb);
    slapo_module_free(a), slapo_module_free(b), slapo_module_free(plain);
  }
}

/* Two equal regions share one op; another constant is another op. */
static void one_op_per_region(void **state) {
  (void)state;
  const toy *t = &k_chains[C_GELU];
  slapo_module *a = toy_model(t), *b = toy_model(t);
  slapo_sched *ra, *rb;
  OK(toy_fuse(a, "dnnl", &ra));
  int n = slapo_op_count();
  OK(toy_fuse(b, "dnnl", &rb));
  assert_int_equal(slapo_op_count(), n);
  slapo_sched_free(ra), slapo_sched_free(rb);
  slapo_module_free(a), slapo_module_free(b);
}

static void unsupported_chains(void **state) {
  (void)state;
  static const toy drop = {C_DROPOUT, "dropout(linear(x, w, b))", 12};
  slapo_module *m = toy_model(&drop);
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse(drop.pattern);
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "Epi", NULL, false), SLAPO_UNSUPPORTED,
                    "dnnl: dropout (%", "has no oneDNN post-op");
  slapo_pattern_free(p);
  /* cc takes the dropout alone, dnnl wants a GEMM first. */
  p = pt_parse("dropout(x)");
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "Epi", NULL, false), SLAPO_UNSUPPORTED,
                    "dnnl: the region must start with a matmul, linear or conv2d");
  slapo_pattern_free(p);
  /* x = in + e: an add before the GEMM is not an epilogue. */
  p = pt_parse("linear(add(x, e), w, b)");
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "Epi", NULL, false), SLAPO_UNSUPPORTED,
                    "dnnl: the region must start with a matmul, linear or conv2d");
  slapo_pattern_free(p);
  p = pt_parse("linear(x, w, b)");
  const char *keys[1] = {"fast"}, *values[1] = {"true"};
  slapo_compile_opts o = {1, keys, values};
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "Epi", &o, false), SLAPO_INVALID_ARG,
                    "dnnl: unknown option 'fast'");
  slapo_pattern_free(p);
  slapo_sched_free(root);
  slapo_module_free(m);
}

/* GPT-2 tiny: no decompose; the flat MLP's gelu(linear(x, w, b)) as one
 * oneDNN matmul with a GELU post-op, in both blocks, dropout on. */
static void gpt2_bias_gelu(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  pt_apply(root, "transformer.h.*.mlp trace flatten=true\n"
                 "transformer.h.*.mlp fuse pattern=\"gelu(linear(x, w, b))\" compiler=dnnl "
                 "name=FusedLinearGeLU\n");
  char *g = pt_capture((pt_print_fn)slapo_graph_print,
                       slapo_module_graph(slapo_sched_module(pt_at(root, "transformer.h.0.mlp"))));
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module FusedLinearGeLU_0("));
  free(g);
  pt_expect_same_as_plain(root, &k_tiny, 2, 16, false);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, false); /* other shapes, other primitives */
  pt_sched_free(root);
}

/* Under autocast the GEMM reads bf16 operands, which the dnnl backend does
 * not fuse: refused with a message, the module left as it was. */
static void bf16_region_refused(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  pt_apply(root, ". autocast dtype=bf16\ntransformer.h.0.mlp trace flatten=true\n");
  slapo_sched_log *log;
  OK(slapo_sched_parse("transformer.h.0.mlp fuse pattern=\"gelu(linear(x, w, b))\" "
                       "compiler=dnnl name=FusedLinearGeLU\n",
                       "bf16.sched", &log));
  assert_int_equal(slapo_apply_schedule(root, log, NULL, 0, 0, NULL), SLAPO_UNSUPPORTED);
  const char *msg = slapo_last_error();
  if (!strstr(msg, "fuse: transformer.h.0.mlp runs under autocast dtype=bf16 and the region "
                   "holds a GEMM (linear), which no compiler backend fuses in bf16"))
    fail_msg("message: %s", msg);
  slapo_sched_log_free(log);
  pt_sched_free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_chain_dnnl_vs_none),
      cmocka_unit_test(one_op_per_region),
      cmocka_unit_test(unsupported_chains),
      cmocka_unit_test(gpt2_bias_gelu),
      cmocka_unit_test(bf16_region_refused),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
