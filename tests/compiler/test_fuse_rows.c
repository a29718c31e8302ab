/* tests/compiler/test_fuse_rows.c - regions around a LayerNorm or RMSNorm
 * through the cc backend (compiler/cc_rows.c): GPT-2's bias + dropout +
 * residual + LayerNorm chains, in a per-block trace (ln_2's, the residual
 * sum a second result) and in a trace spanning the blocks (all 2 n_layer,
 * ln_1's and ln_f's), fused with cc and auto and bitwise equal to the
 * unfused fast kernels in logits, loss and every gradient, dropout on, at
 * widths that are and are not multiples of the vector width; a chain alone
 * with and without ops after the norm, bitwise against today's cc pair and
 * byte-identical at 1, 2 and 3 threads; fuse_all regions ending in a
 * LayerNorm; LLaMA's residual + RMSNorm bitwise; and what cc refuses, with
 * its messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <omp.h>
#include <unistd.h>

#include "../primitives/prim_test.h"
#include "cache_fixture.h"
#include "slapo/compiler.h"
#include "slapo/primitives.h"


/* 36 = 2 x 16 + 4: the row routines' lane sums and the vector loops both
 * have a tail. */
static const slapo_gpt2_config k_odd = {2, 4, 36, 32, 256, 0.1, 1e-5};

static const char k_chain[] = "layer_norm(add(x, dropout(add(y, b))), w, c)";

static void decompose_projections(slapo_sched *root, int n_layer) {
  for (int l = 0; l < n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d.attn.c_proj", l);
    OK(slapo_decompose(pt_at(root, path)));
    snprintf(path, sizeof path, "transformer.h.%d.mlp.c_proj", l);
    OK(slapo_decompose(pt_at(root, path)));
  }
}

/* Counts call_module nodes of `name` in the traced graph of node; *two:
 * those returning two values. */
static int count_calls(slapo_sched *node, const char *name, int *two) {
  char *g = pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(node)));
  char call[96], pair[96];
  snprintf(call, sizeof call, "= call_module %s_", name);
  snprintf(pair, sizeof pair, " : (2) = call_module %s_", name);
  int n = 0;
  *two = 0;
  for (const char *q = g; (q = strstr(q, call)); q++) n++;
  for (const char *q = g; (q = strstr(q, pair)); q++) (*two)++;
  free(g);
  return n;
}

/* Whether node's module tree prints `needle`. */
static __attribute__((noinline)) bool tree_has(slapo_sched *node, const char *needle) {
  char *tree = pt_capture(pt_print_module, slapo_sched_module(node));
  bool hit = strstr(tree, needle) != NULL;
  free(tree);
  return hit;
}

/* All 2 n_layer chains of a trace spanning the blocks, one op each. */
static slapo_sched *spanning(const slapo_gpt2_config *cfg, const char *compiler) {
  slapo_sched *root = pt_sched_new(cfg);
  decompose_projections(root, cfg->n_layer);
  slapo_sched *tr = pt_at(root, "transformer");
  OK(slapo_trace(tr, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse(k_chain);
  OK(slapo_fuse(tr, p, compiler, "BiasDropoutResidualLN", NULL, true));
  slapo_pattern_free(p);
  int two, n = count_calls(tr, "BiasDropoutResidualLN", &two);
  assert_int_equal(n, 2 * cfg->n_layer);
  assert_int_equal(two, 2 * cfg->n_layer - 1);
  assert_true(tree_has(tr, "runs=cc"));
  assert_false(tree_has(tr, "; cc")); /* one op for both results */
  return root;
}

static void pre_ln_chains_bitwise(void **state) {
  (void)state;
  const slapo_gpt2_config *cfgs[] = {&k_tiny4, &k_odd};
  const char *compilers[] = {"cc", "auto"};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      slapo_sched *root = spanning(cfgs[i], compilers[j]);
      pt_expect_same_as_plain(root, cfgs[i], 2, 8, true);
      pt_expect_same_as_plain(root, cfgs[i], 3, 5, true); /* other shapes, same kernels */
      pt_sched_free(root);
    }
}

/* The per-block chain (ln_2's): the residual sum is a second result, read
 * by the block's next residual add. */
static void per_block_chain_bitwise(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_odd);
  decompose_projections(root, k_odd.n_layer);
  for (int l = 0; l < k_odd.n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d", l);
    slapo_sched *blk = pt_at(root, path);
    OK(slapo_trace(blk, &(slapo_trace_opts){.flatten = true}));
    slapo_pattern *p = pt_parse(k_chain);
    OK(slapo_fuse(blk, p, "cc", "BiasDropoutResidualLN", NULL, false));
    slapo_pattern_free(p);
    int two;
    assert_int_equal(count_calls(blk, "BiasDropoutResidualLN", &two), 1);
    assert_int_equal(two, 1);
  }
  pt_expect_same_as_plain(root, &k_odd, 2, 8, true);
  pt_sched_free(root);
}

/* ---- a chain alone: no GEMM whose sums depend on the thread count ----
 * h = relu(x); s = x + dropout(h + b); y = ln(s) [then gelu(y) * 2: ops
 * after the norm]; loss = mean(y t) + mean(s), so the residual sum s
 * is a second result with a gradient of its own, from one reader outside
 * (as a pre-LN block's next residual add). With several readers outside,
 * autograd sums their gradients before the fused backward adds them: the
 * same values, rounded in another order than the unfused graph's. */

typedef struct chain_cfg {
  int64_t C;
  bool post;
  bool s_alone; /* s read by the norm alone (post-LN): loss mean(y t) */
} chain_cfg;

static slapo_node *chain_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  const chain_cfg *cfg = self->config;
  slapo_node *x = in[0], *h = slapo_relu(ctx, x);
  slapo_node *d = slapo_call1(ctx, self, "drop", slapo_add(ctx, h, slapo_weight(ctx, self, "b")));
  slapo_node *s = slapo_add(ctx, x, d);
  slapo_node *y = slapo_call1(ctx, self, "ln", s);
  if (cfg->post) y = slapo_mul_scalar(ctx, slapo_gelu(ctx, y, true), 2.0);
  int64_t axes[3] = {0, 1, 2};
  if (cfg->s_alone) /* a loss of one elementwise op: no region of its own */
    return n_in == 1 ? y : slapo_mean(ctx, slapo_mul(ctx, y, in[1]), 3, axes, false);
  if (n_in == 1) return slapo_add(ctx, y, s); /* s read on in eval too */
  return slapo_add(ctx, slapo_mean(ctx, slapo_mul(ctx, y, in[1]), 3, axes, false),
                   slapo_mean(ctx, s, 3, axes, false));
}

static const slapo_module_type k_chain_type = {"Chain", chain_forward, NULL, NULL, NULL};

enum { CB = 3, CT = 7 };

static slapo_module *chain_new(const chain_cfg *cfg) {
  slapo_module *m, *drop, *ln;
  chain_cfg *own = slapo_malloc(sizeof *own); /* the module's (slapo_free) */
  assert_non_null(own);
  *own = *cfg;
  OK(slapo_module_new(&k_chain_type, own, &m));
  OK(slapo_module_add_param(m, "b", 1, &own->C, SLAPO_INIT_NORMAL, 0.5f));
  OK(slapo_dropout_new(0.1, &drop));
  OK(slapo_module_add_child(m, "drop", drop));
  OK(slapo_layernorm_new(cfg->C, 1e-5, &ln));
  OK(slapo_module_add_child(m, "ln", ln));
  OK(slapo_module_materialize(m, PT_SEED));
  int64_t xs[3] = {CB, CT, cfg->C};
  slapo_tensor *ex[2];
  for (int j = 0; j < 2; j++) OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, xs, &ex[j]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  for (int j = 0; j < 2; j++) slapo_tensor_free(ex[j]);
  return m;
}

static void chain_inputs(int64_t C, slapo_tensor *in[2]) {
  int64_t xs[3] = {CB, CT, C};
  for (int j = 0; j < 2; j++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_F32, 3, xs, &in[j]));
    float *d = slapo_tensor_data(in[j]); /* [numel] */
    for (int64_t i = 0; i < slapo_tensor_numel(in[j]); i++)
      d[i] = (float)((i * 7 + j * 5) % 13) / 6.0f - 1.0f + (float)(i % 5) * 0.25f;
  }
}

/* The chain with `pattern` fused by cc; the schedule owns the model. */
static slapo_sched *chain_fused(const chain_cfg *cfg, const char *pattern) {
  slapo_sched *root;
  OK(slapo_sched_create(chain_new(cfg), &root));
  OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse(pattern);
  OK(slapo_fuse(root, p, "cc", "Rows", NULL, false));
  slapo_pattern_free(p);
  return root;
}

/* Today's default schedules' pair: bias + dropout + residual as one cc
 * kernel, the LayerNorm (and what follows) as their fast kernels. */
static const char k_pair[] = "add(x, dropout(add(y, b)))";

static const char k_post[] = "mul_scalar(gelu(layer_norm(add(x, dropout(add(y, b))), w, c)))";

/* Bitwise against the pair (the bias reduction is cc's in both; the
 * unfused graph's generic reduction sums in another order: tolerance), at
 * 16 + 4 and 64 wide, without and with ops after the norm; logits, loss
 * and gradients byte-identical at 1, 2 and 3 threads. */
static void chain_bitwise_and_thread_counts(void **state) {
  (void)state;
  int64_t widths[2] = {20, 64};
  for (int wi = 0; wi < 2; wi++)
    for (int post = 0; post < 2; post++) {
      chain_cfg cfg = {widths[wi], post, false};
      slapo_sched *root = chain_fused(&cfg, post ? k_post : k_chain);
      slapo_module *ref = chain_new(&cfg);
      slapo_sched *pair = chain_fused(&cfg, k_pair);
      slapo_tensor *in[2];
      chain_inputs(cfg.C, in);
      pt_result r[3], u, v;
      pt_run(ref, in, &u);
      pt_run(slapo_sched_module(pair), in, &v);
      int saved = omp_get_max_threads();
      for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        pt_run(slapo_sched_module(root), in, &r[t]);
      }
      omp_set_num_threads(saved);
      pt_expect_bitwise(&v, &r[1]);
      pt_expect_close(&r[1], &u, 1e-5, 1e-4);
      pt_expect_bitwise(&r[0], &r[1]);
      pt_expect_bitwise(&r[0], &r[2]);
      for (int t = 0; t < 3; t++) pt_result_free(&r[t]);
      pt_result_free(&u);
      pt_result_free(&v);
      pt_sched_free(pair);
      pt_inputs_free(in);
      slapo_module_free(ref);
      pt_sched_free(root);
    }
}

/* fuse_all with cc and auto: the region of relu, bias add, dropout and
 * residual add ends in the LayerNorm when the residual sum feeds it alone
 * (post-LN), and stops before it when the sum is read on (pre-LN). */
static void fuse_all_ends_in_layer_norm(void **state) {
  (void)state;
  const char *compilers[2] = {"cc", "auto"};
  for (int k = 0; k < 2; k++)
    for (int alone = 0; alone < 2; alone++) {
      chain_cfg cfg = {36, false, alone};
      slapo_sched *root;
      OK(slapo_sched_create(chain_new(&cfg), &root));
      OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
      OK(slapo_fuse_all(root, compilers[k], "Fused"));
      assert_true(tree_has(root, "Fused_0"));
      assert_true(tree_has(root, "relu+add+dropout+add+layer_norm") == alone);
      assert_true(tree_has(root, "runs=cc"));
      slapo_module *ref = chain_new(&cfg);
      slapo_tensor *in[2];
      chain_inputs(cfg.C, in);
      pt_result u, r;
      pt_run(ref, in, &u);
      pt_run(slapo_sched_module(root), in, &r);
      pt_expect_close(&r, &u, 1e-5, 1e-4);
      pt_result_free(&u);
      pt_result_free(&r);
      pt_inputs_free(in);
      slapo_module_free(ref);
      pt_sched_free(root);
    }
}

/* The original system's bias-LayerNorm recipe, its pattern as written
 * there, on a post-LN chain: cc and auto generate it (auto says cc runs
 * it), bitwise against today's pair; dnnl, whose regions start with a
 * GEMM or convolution, refuses it naming why. */
static void original_recipe(void **state) {
  (void)state;
  static const char k_recipe[] = "layer_norm(add(dropout(add(x, bias)), residual), w, b)";
  chain_cfg cfg = {36, false, true};
  const char *compilers[2] = {"cc", "auto"};
  slapo_tensor *in[2];
  chain_inputs(cfg.C, in);
  slapo_sched *pair = chain_fused(&cfg, k_pair);
  pt_result v;
  pt_run(slapo_sched_module(pair), in, &v);
  for (int k = 0; k < 2; k++) {
    slapo_sched *root;
    OK(slapo_sched_create(chain_new(&cfg), &root));
    OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
    slapo_pattern *p = pt_parse(k_recipe);
    OK(slapo_fuse(root, p, compilers[k], "BiasLayerNorm", NULL, false));
    slapo_pattern_free(p);
    assert_true(tree_has(root, "ops=add+dropout+add+layer_norm, runs=cc"));
    pt_result r;
    pt_run(slapo_sched_module(root), in, &r);
    pt_expect_bitwise(&v, &r);
    pt_result_free(&r);
    pt_sched_free(root);
  }
  slapo_sched *root;
  OK(slapo_sched_create(chain_new(&cfg), &root));
  OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse(k_recipe);
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "BiasLayerNorm", NULL, false),
                    SLAPO_UNSUPPORTED, "dnnl: the region must start with a matmul");
  slapo_pattern_free(p);
  pt_sched_free(root);
  pt_result_free(&v);
  pt_inputs_free(in);
  pt_sched_free(pair);
}

/* LLaMA: each layer's attention residual sum and its RMSNorm
 * (post_attention_layernorm), the sum a second result read by the MLP's
 * residual add; fused with cc, bitwise against the unfused fast kernels
 * (rms_norm_backward with the residual folded, rms_norm_backward_weight),
 * also at 1 and 3 threads. */
/* 40 = 2 x 16 + 8 wide (heads of 10, even for RoPE): tails in every row loop. */
static const slapo_llama_config k_llama_odd = {2, 4, 2, 40, 96, 32, 256, 1e-5, 10000.0, 0.0, false};

static slapo_module *llama_model(const slapo_llama_config *cfg) {
  slapo_module *m;
  OK(slapo_llama_new(cfg, &m));
  OK(slapo_module_materialize(m, PT_SEED));
  return m;
}

static void llama_rms_chains(const slapo_llama_config *cfg) {
  slapo_module *plain = llama_model(cfg), *m = llama_model(cfg);
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  for (int l = 0; l < cfg->n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "model.layers.%d", l);
    slapo_sched *layer = pt_at(root, path);
    OK(slapo_trace(layer, &(slapo_trace_opts){.flatten = true}));
    slapo_pattern *p = pt_parse("rms_norm(add(x, y), w)");
    OK(slapo_fuse(layer, p, "cc", "ResidualRMSNorm", NULL, false));
    slapo_pattern_free(p);
    int two;
    assert_int_equal(count_calls(layer, "ResidualRMSNorm", &two), 1);
    assert_int_equal(two, 1);
  }
  slapo_tensor *in[2];
  pt_inputs(2, 9, 256, in);
  int saved = omp_get_max_threads();
  for (int t = 0; t < 2; t++) { /* the GEMMs' sums may depend on the thread count */
    pt_result a, b;
    omp_set_num_threads(t ? 3 : 1);
    pt_run(plain, in, &a);
    pt_run(m, in, &b);
    pt_expect_bitwise(&a, &b);
    pt_result_free(&a);
    pt_result_free(&b);
  }
  omp_set_num_threads(saved);
  pt_inputs_free(in);
  slapo_module_free(plain);
  pt_sched_free(root);
}

static void llama_rms_chains_bitwise(void **state) {
  (void)state;
  slapo_llama_config tiny;
  OK(slapo_llama_config_named("tiny", &tiny));
  llama_rms_chains(&tiny);
  llama_rms_chains(&k_llama_odd);
}

/* ---- softmax: scores scaled, plus a mask, softmax, dropout ----
 * z = x / 8 + relu(x) (the mask-like second input computed outside the
 * region); y = dropout(softmax(z)); loss = mean(y t). */

static slapo_node *attn_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  slapo_node *z = slapo_add(ctx, slapo_mul_scalar(ctx, in[0], 0.125), slapo_relu(ctx, in[0]));
  slapo_node *y = slapo_call1(ctx, self, "drop", slapo_softmax(ctx, z, false));
  int64_t axes[3] = {0, 1, 2};
  return n_in == 1 ? y : slapo_mean(ctx, slapo_mul(ctx, y, in[1]), 3, axes, false);
}

static const slapo_module_type k_attn_type = {"Scores", attn_forward, NULL, NULL, NULL};

static slapo_module *attn_new(int64_t C) {
  slapo_module *m, *drop;
  OK(slapo_module_new(&k_attn_type, NULL, &m));
  OK(slapo_dropout_new(0.1, &drop));
  OK(slapo_module_add_child(m, "drop", drop));
  OK(slapo_module_materialize(m, PT_SEED));
  int64_t xs[3] = {CB, CT, C};
  slapo_tensor *ex[2];
  for (int j = 0; j < 2; j++) OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, xs, &ex[j]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  for (int j = 0; j < 2; j++) slapo_tensor_free(ex[j]);
  return m;
}

/* Bitwise against the unfused fast kernels, at 16 + 4 and 64 wide, and the
 * same bytes at 1, 2 and 3 threads. */
static void softmax_chain_bitwise(void **state) {
  (void)state;
  int64_t widths[2] = {20, 64};
  for (int wi = 0; wi < 2; wi++) {
    slapo_sched *root;
    OK(slapo_sched_create(attn_new(widths[wi]), &root));
    OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
    slapo_pattern *p = pt_parse("dropout(softmax(add(mul_scalar(x), y)))");
    OK(slapo_fuse(root, p, "cc", "Scores", NULL, false));
    slapo_pattern_free(p);
    assert_true(tree_has(root, "ops=mul_scalar+add+softmax+dropout, runs=cc"));
    slapo_module *ref = attn_new(widths[wi]);
    slapo_tensor *in[2];
    chain_inputs(widths[wi], in);
    pt_result u, r[3];
    pt_run(ref, in, &u);
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
      omp_set_num_threads(t + 1);
      pt_run(slapo_sched_module(root), in, &r[t]);
    }
    omp_set_num_threads(saved);
    pt_expect_bitwise(&u, &r[1]);
    pt_expect_bitwise(&r[0], &r[1]);
    pt_expect_bitwise(&r[0], &r[2]);
    for (int t = 0; t < 3; t++) pt_result_free(&r[t]);
    pt_result_free(&u);
    pt_inputs_free(in);
    slapo_module_free(ref);
    pt_sched_free(root);
  }
}

/* ---- two norms of different widths in one match ----
 * z = x[..., :12]; y1 = ln1(x + relu(x)) over 20, y2 = ln2(z + relu(z))
 * over 12, matched as one pattern of two results: cc refuses the whole
 * (two row ops), so fuse compiles each result's cone, each a row op packing
 * its one result beside its saved row; each is read at its own shape. */

static slapo_node *two_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  slapo_node *x = in[0], *z = slapo_slice(ctx, x, 2, 0, 12);
  slapo_node *y1 = slapo_call1(ctx, self, "ln1", slapo_add(ctx, x, slapo_relu(ctx, x)));
  slapo_node *y2 = slapo_call1(ctx, self, "ln2", slapo_add(ctx, z, slapo_relu(ctx, z)));
  int64_t axes[3] = {0, 1, 2};
  slapo_node *t = n_in > 1 ? in[1] : x;
  return slapo_add(ctx, slapo_mean(ctx, slapo_mul(ctx, y1, t), 3, axes, false),
                   slapo_mean(ctx, slapo_mul(ctx, y2, slapo_slice(ctx, t, 2, 0, 12)), 3, axes,
                              false));
}

static const slapo_module_type k_two_type = {"TwoNorms", two_forward, NULL, NULL, NULL};

static slapo_module *two_new(void) {
  slapo_module *m, *ln1, *ln2;
  OK(slapo_module_new(&k_two_type, NULL, &m));
  OK(slapo_layernorm_new(20, 1e-5, &ln1));
  OK(slapo_module_add_child(m, "ln1", ln1));
  OK(slapo_layernorm_new(12, 1e-5, &ln2));
  OK(slapo_module_add_child(m, "ln2", ln2));
  OK(slapo_module_materialize(m, PT_SEED));
  int64_t xs[3] = {CB, CT, 20};
  slapo_tensor *ex[2];
  for (int j = 0; j < 2; j++) OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, xs, &ex[j]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  for (int j = 0; j < 2; j++) slapo_tensor_free(ex[j]);
  return m;
}

static void two_norms_one_op_each(void **state) {
  (void)state;
  slapo_sched *root;
  OK(slapo_sched_create(two_new(), &root));
  OK(slapo_trace(root, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p =
      pt_parse("(layer_norm(add(x, relu(x)), w, b), layer_norm(add(z, relu(z)), v, c))");
  OK(slapo_fuse(root, p, "cc", "Two", NULL, false));
  slapo_pattern_free(p);
  assert_true(tree_has(root, "runs=cc; cc"));
  slapo_module *ref = two_new();
  slapo_tensor *in[2];
  chain_inputs(20, in);
  pt_result u, r;
  pt_run(ref, in, &u);
  pt_run(slapo_sched_module(root), in, &r);
  pt_expect_bitwise(&u, &r);
  pt_result_free(&u);
  pt_result_free(&r);
  pt_inputs_free(in);
  slapo_module_free(ref);
  pt_sched_free(root);
}

/* ---- what cc refuses, compiled directly ---- */

typedef struct region_fx {
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_node *x, *y, *w, *b;
} region_fx;

static region_fx region_new(int64_t C) {
  region_fx f;
  OK(slapo_graph_new(&f.g));
  OK(slapo_ctx_new(f.g, &f.ctx));
  int64_t xs[2] = {5, C};
  f.x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, xs);
  f.y = slapo_input(f.ctx, "y", SLAPO_DTYPE_F32, 2, xs);
  f.w = slapo_input(f.ctx, "w", SLAPO_DTYPE_F32, 1, &C);
  f.b = slapo_input(f.ctx, "b", SLAPO_DTYPE_F32, 1, &C);
  return f;
}

/* Compiles f's region with result r through cc, expecting `want` with a
 * message holding `needle` (SLAPO_OK: *op receives the op). */
static void compile_expect(region_fx *f, slapo_node *r, slapo_status want, const char *needle,
                           const slapo_op **op) {
  assert_non_null(slapo_output(f->ctx, 1, &r));
  const slapo_op *got = NULL;
  slapo_status s = slapo_compiler_find("cc")->compile(f->g, "R", NULL, &got);
  if (want != SLAPO_OK) expect_status(s, want, needle);
  else OK(s);
  if (op) *op = got;
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
}

static void refusals(void **state) {
  (void)state;
  region_fx f = region_new(8);
  slapo_node *s = slapo_add(f.ctx, f.x, f.y);
  compile_expect(&f, slapo_layer_norm(f.ctx, slapo_layer_norm(f.ctx, s, NULL, NULL, 1e-5), f.w,
                                      f.b, 1e-5),
                 SLAPO_UNSUPPORTED, "two row ops", NULL);
  f = region_new(8);
  s = slapo_add(f.ctx, f.x, f.y);
  compile_expect(&f, slapo_add(f.ctx, slapo_layer_norm(f.ctx, s, f.w, f.b, 1e-5), s),
                 SLAPO_UNSUPPORTED, "computed before it", NULL);
  f = region_new(8);
  s = slapo_add(f.ctx, f.x, f.y);
  compile_expect(&f, slapo_mul_scalar(f.ctx, slapo_rms_norm(f.ctx, s, f.w, 1e-6), 2.0),
                 SLAPO_UNSUPPORTED, "ops after the RMSNorm", NULL);
  f = region_new(8);
  s = slapo_add(f.ctx, f.x, f.y);
  compile_expect(&f, slapo_layer_norm(f.ctx, s, slapo_mul_scalar(f.ctx, f.w, 2.0), f.b, 1e-5),
                 SLAPO_UNSUPPORTED, "must be a region input", NULL);
  f = region_new(8);
  int64_t axis = 1;
  compile_expect(&f, slapo_mean(f.ctx, slapo_add(f.ctx, f.x, f.y), 1, &axis, true),
                 SLAPO_UNSUPPORTED, "neither elementwise nor a row op", NULL);
  f = region_new(8);
  compile_expect(&f, slapo_softmax(f.ctx, slapo_add(f.ctx, f.x, f.y), true), SLAPO_UNSUPPORTED,
                 "is causal", NULL);
  /* Rows longer than the kernels keep on the stack: refused when applied. */
  f = region_new(8);
  const slapo_op *op;
  compile_expect(&f, slapo_layer_norm(f.ctx, slapo_add(f.ctx, f.x, f.y), f.w, f.b, 1e-5),
                 SLAPO_OK, NULL, &op);
  region_fx big = region_new(20000);
  slapo_node *in[4] = {big.x, big.y, big.w, big.b};
  assert_null(slapo_op_apply(big.ctx, op, 4, in, 0, NULL));
  expect_status(slapo_ctx_status(big.ctx), SLAPO_UNSUPPORTED, "rows of 20000 values");
  slapo_ctx_free(big.ctx);
  slapo_graph_free(big.g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(pre_ln_chains_bitwise),
      cmocka_unit_test(per_block_chain_bitwise),
      cmocka_unit_test(chain_bitwise_and_thread_counts),
      cmocka_unit_test(fuse_all_ends_in_layer_norm),
      cmocka_unit_test(original_recipe),
      cmocka_unit_test(llama_rms_chains_bitwise),
      cmocka_unit_test(softmax_chain_bitwise),
      cmocka_unit_test(two_norms_one_op_each),
      cmocka_unit_test(refusals),
  };
  return cmocka_run_group_tests(tests, cache_setup, cache_teardown);
}
