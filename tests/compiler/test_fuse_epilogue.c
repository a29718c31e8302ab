/* tests/compiler/test_fuse_epilogue.c - GEMM and convolution epilogues:
 * the original system's recipe `x = conv(x); x = relu(x); x = x + 1`
 * (pattern add(relu(conv2d(x, w, b)), 1)) and its Linear twin fused with
 * cc (the oneDNN op runs on its own, one generated kernel over its
 * output), dnnl (one oneDNN matmul or convolution with post-ops; `+ 1` as
 * eltwise linear)
 * and auto (which backend ran is in the module's description), against the
 * unfused model in outputs and every gradient; and the relu-mask edge:
 * relu(z) + 1 is exactly 1 for 0 < z < 2^-24, so a mask read from the
 * output would lose those gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../primitives/prim_test.h"
#include "slapo/primitives.h"

/* ---- Chain: y = relu(head(x)) + 1; loss = mean((y - t)^2) ---- */

static slapo_node *chain_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  slapo_node *y = slapo_add_scalar(ctx, slapo_relu(ctx, slapo_call1(ctx, self, "head", in[0])), 1.0);
  if (n_in == 1) return y;
  slapo_node *d = slapo_sub(ctx, y, in[1]);
  int64_t axes[4] = {0, 1, 2, 3};
  return slapo_mean(ctx, slapo_mul(ctx, d, d), d->ndim, axes, false);
}

static const slapo_module_type k_chain = {"Chain", chain_forward, NULL, NULL, NULL};

enum { N = 2, C = 4, H = 5, W = 6, O = 4 };

/* The convolution's options (padding 1 unless a test changes them). */
static slapo_conv2d_opts g_conv = {{1, 1}, {1, 1}, {1, 1}, 1, true};

/* conv: Conv2d(C, O, 3, g_conv) on [N, C, H, W]; else Linear(W, O) on
 * [N, C, H, W] (x's last axis). */
static slapo_module *chain_new(bool conv, int64_t *xs, int64_t *ys) {
  slapo_module *m, *head;
  OK(slapo_module_new(&k_chain, NULL, &m));
  if (conv) {
    OK(slapo_conv2d_new(C, O, 3, 3, &g_conv, &head));
  } else {
    OK(slapo_linear_new(W, O, true, 0.5f, &head));
  }
  OK(slapo_module_add_child(m, "head", head));
  OK(slapo_module_materialize(m, PT_SEED));
  /* PyTorch's output extent: floor((in + 2p - d (k - 1) - 1) / s) + 1 */
  int64_t oh = (H + 2 * g_conv.padding[0] - g_conv.dilation[0] * 2 - 1) / g_conv.stride[0] + 1;
  int64_t ow = (W + 2 * g_conv.padding[1] - g_conv.dilation[1] * 2 - 1) / g_conv.stride[1] + 1;
  int64_t x[4] = {N, C, H, W}, y[4] = {N, conv ? O : C, conv ? oh : H, conv ? ow : O};
  memcpy(xs, x, sizeof x), memcpy(ys, y, sizeof y);
  slapo_tensor *ex[2];
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, x, &ex[0]));
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, y, &ex[1]));
  OK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  slapo_tensor_free(ex[0]);
  slapo_tensor_free(ex[1]);
  return m;
}

static void inputs(const int64_t *xs, const int64_t *ys, slapo_tensor *in[2]) {
  const int64_t *s[2] = {xs, ys};
  for (int j = 0; j < 2; j++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, s[j], &in[j]));
    float *d = slapo_tensor_data(in[j]); /* [numel] */
    for (int64_t i = 0; i < slapo_tensor_numel(in[j]); i++)
      d[i] = (float)((i * 7 + j * 5) % 13) / 6.0f - 1.0f;
  }
}

static void run(slapo_module *m, const int64_t *xs, const int64_t *ys, pt_result *r) {
  slapo_tensor *in[2];
  inputs(xs, ys, in);
  pt_run(m, in, r);
  pt_inputs_free(in);
}

/* Fuses the chain of a fresh model with `compiler`, checks the module's
 * description names `runs`, and compares with the unfused model. */
static void fuse_pattern_and_compare(bool conv, const char *pattern, const char *compiler,
                                     const char *runs, bool bitwise) {
  int64_t xs[4], ys[4];
  slapo_sched *root;
  OK(slapo_sched_create(chain_new(conv, xs, ys), &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse(pattern);
  OK(slapo_fuse(root, p, compiler, "Epi", NULL, false));
  slapo_pattern_free(p);
  char *tree = pt_capture(pt_print_module, slapo_sched_module(root));
  print_message("%s %s:\n%s", conv ? "conv" : "linear", compiler, tree);
  assert_non_null(strstr(tree, runs));
  free(tree);
  pt_result a, b;
  slapo_module *ref = chain_new(conv, xs, ys);
  run(ref, xs, ys, &a);
  run(slapo_sched_module(root), xs, ys, &b);
  if (bitwise) pt_expect_bitwise(&b, &a);
  else pt_expect_close(&b, &a, 1e-5, 1e-4);
  pt_result_free(&a);
  pt_result_free(&b);
  slapo_module_free(ref);
  pt_sched_free(root);
}

static void fuse_and_compare(bool conv, const char *compiler, const char *runs, bool bitwise) {
  fuse_pattern_and_compare(conv, conv ? "add(relu(conv2d(x, w, b)), 1)"
                                      : "add(relu(linear(x, w, b)), 1)",
                           compiler, runs, bitwise);
}

static void conv_relu_add(void **state) {
  (void)state;
  /* cc: the convolution as its own oneDNN op, relu + 1 generated: the
   * same kernels and arithmetic as unfused, so bitwise. */
  fuse_and_compare(true, "cc", "runs=oneDNN conv2d + cc", true);
  fuse_and_compare(true, "auto", "runs=oneDNN conv2d + cc", true);
  fuse_and_compare(true, "none", "runs=the ops as they are", true);
  /* dnnl: one convolution primitive with relu and + 1 as post-ops; the
   * backward recomputes the convolution for the relu's mask. Its kernel
   * may order the sums differently from the unfused one: tolerance. */
  fuse_and_compare(true, "dnnl", "runs=dnnl", false);
  /* auto leaves convolutions to their own op even where dnnl needs no
   * recompute (oneDNN's NCHW convolution with post-ops is the slower one). */
  fuse_pattern_and_compare(true, "relu(conv2d(x, w, b))", "auto", "runs=oneDNN conv2d + cc", true);
}

/* dnnl's convolution gets every attribute as ops/conv.c does. */
static void conv_attributes(void **state) {
  (void)state;
  g_conv = (slapo_conv2d_opts){{2, 1}, {1, 2}, {1, 2}, 2, true};
  fuse_and_compare(true, "dnnl", "runs=dnnl", false);
  fuse_and_compare(true, "cc", "runs=oneDNN conv2d + cc", true);
  g_conv = (slapo_conv2d_opts){{1, 1}, {1, 1}, {1, 1}, 1, true};
}

static void linear_relu_add(void **state) {
  (void)state;
  fuse_and_compare(false, "cc", "runs=oneDNN linear + cc", true);
  /* dnnl: one matmul primitive, `+ 1` an eltwise linear post-op; its GEMM
   * blocking differs from the unfused linear's, so within tolerance. */
  fuse_and_compare(false, "dnnl", "runs=dnnl", false);
  /* auto: dnnl would recompute the GEMM for the relu's mask after + 1, so
   * the linear runs on its own and cc takes relu + 1; without the + 1 the
   * mask comes from y and dnnl takes the whole region. */
  fuse_and_compare(false, "auto", "runs=oneDNN linear + cc", true);
  fuse_pattern_and_compare(false, "relu(linear(x, w, b))", "auto", "runs=dnnl", false);
  /* dnnl's own refusal under recompute=never names the reason. */
  int64_t xs[4], ys[4];
  slapo_sched *root;
  OK(slapo_sched_create(chain_new(false, xs, ys), &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse("add(relu(linear(x, w, b)), 1)");
  const char *k[1] = {"recompute"}, *v[1] = {"never"};
  slapo_compile_opts o = {1, k, v};
  PT_EXPECT_REFUSED(root, slapo_fuse(root, p, "dnnl", "Epi", &o, false), SLAPO_UNSUPPORTED,
                    "would recompute the GEMM");
  slapo_pattern_free(p);
  pt_sched_free(root);
}

/* relu(z) + 1 == 1 for tiny positive z: the backward must still pass the
 * gradient there (z > 0), as the unfused relu's does. */
static void relu_mask_edge(void **state) {
  (void)state;
  const char *compilers[3] = {"dnnl", "cc", "auto"};
  for (int c = 0; c < 3; c++) {
    int64_t xs[4], ys[4];
    slapo_sched *root;
    OK(slapo_sched_create(chain_new(false, xs, ys), &root));
    slapo_module *ref = chain_new(false, xs, ys);
    /* weights so that z = x w^T + b lands in (0, 2^-24) for some outputs */
    slapo_module *models[2] = {slapo_sched_module(root), ref};
    for (int k = 0; k < 2; k++) {
      float *w = slapo_tensor_data(slapo_module_param_at(models[k], "head.weight")->value);
      float *b = slapo_tensor_data(slapo_module_param_at(models[k], "head.bias")->value);
      for (int i = 0; i < O * W; i++) w[i] = 0;
      b[0] = 1e-8f, b[1] = 3e-8f, b[2] = -1e-8f, b[3] = 0.5f; /* [O] */
    }
    OK(slapo_trace(root, NULL));
    slapo_pattern *p = pt_parse("add(relu(linear(x, w, b)), 1)");
    OK(slapo_fuse(root, p, compilers[c], "Epi", NULL, false));
    slapo_pattern_free(p);
    pt_result a, b;
    run(ref, xs, ys, &a);
    run(slapo_sched_module(root), xs, ys, &b);
    pt_expect_close(&b, &a, 1e-6, 1e-5);
    /* the bias gradient of the tiny positive outputs is not zero */
    for (int i = 0; i < b.n; i++)
      if (!strcmp(b.paths[i], "head.bias")) {
        const float *g = slapo_tensor_data(b.grads[i]); /* [O] */
        print_message("%s: bias grad %g %g %g %g\n", compilers[c], g[0], g[1], g[2], g[3]);
        assert_true(g[0] != 0 && g[1] != 0);
        assert_true(g[2] == 0);
      }
    pt_result_free(&a);
    pt_result_free(&b);
    slapo_module_free(ref);
    pt_sched_free(root);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(conv_relu_add),
      cmocka_unit_test(conv_attributes),
      cmocka_unit_test(linear_relu_add),
      cmocka_unit_test(relu_mask_edge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
