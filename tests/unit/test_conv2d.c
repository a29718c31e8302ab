/* tests/unit/test_conv2d.c - the conv2d op and the Conv2d module:
 * (a) output and the gradients of sum(out * r) for x, w and b against
 *     PyTorch (tests/data/conv2d_fixture.safetensors, written by
 *     tools/gen_conv2d_fixture.py with Debian's python3-torch) for two
 *     configurations, one with groups 2, stride 2, padding 1, dilation 2,
 *     with reference and with fast (oneDNN) kernels. Both sides compute in
 *     f32 with different summation orders; each tensor must agree within
 *     1e-4 of its largest magnitude (a wrong index gives errors of order 1);
 * (b) shape and argument errors with their messages;
 * (c) Conv2d: parameter names and shapes, PyTorch's init bound, repr, op
 *     form, and a train step through slapo_step matching the op. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/torchfix.h"
#include "slapo/module.h"


static char g_path[4096];
static slapo_safetensors *g_fix;


/* Attributes of one convolution. */
typedef struct conv_args {
  int64_t stride[2], padding[2], dilation[2], groups;
} conv_args;

/* Builds y = conv2d(x, w, b) and its backward seeded with r (so the
 * gradients are those of sum(y * r)); runs it with reference or fast
 * kernels; out[0..3] = y, dx, dw, db (owned contiguous copies). */
static void run_conv(slapo_tensor *const *in, const conv_args *a, bool reference,
                     slapo_tensor **out) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  const char *names[4] = {"x", "w", "b", "r"};
  slapo_node *n[4];
  for (int i = 0; i < 3; i++)
    n[i] = slapo_input(ctx, names[i], SLAPO_DTYPE_F32, in[i]->ndim, in[i]->shape);
  slapo_node *y = slapo_conv2d(ctx, n[0], n[1], n[2], a->stride, a->padding, a->dilation,
                               a->groups);
  assert_non_null(y);
  n[3] = slapo_input(ctx, "r", SLAPO_DTYPE_F32, y->ndim, y->shape);
  slapo_node *outs[4] = {y};
  OK(slapo_backward(ctx, y, n[3], 3, n, outs + 1));
  assert_non_null(slapo_output(ctx, 4, outs));
  OK(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  slapo_plan_opts o = {.reference = reference};
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  for (int i = 0; i < 4; i++) OK(slapo_plan_bind_input(p, names[i], in[i]));
  OK(slapo_plan_run(p, NULL));
  for (int i = 0; i < 4; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &out[i]));
  slapo_plan_free(p);
  slapo_graph_free(g);
}

/* ---- (a) against PyTorch ---- */

static int setup(void **state) {
  (void)state;
  return torchfix_open("conv2d_fixture.safetensors", g_path, sizeof g_path, &g_fix);
}

static int teardown(void **state) {
  (void)state;
  slapo_safetensors_free(g_fix);
  return 0;
}

static slapo_tensor *fixture(int k, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "%d.%s", k, name);
  return torchfix_get(g_fix, key);
}

/* "2,1" from the fixture's metadata into v[2]. */
static void meta_pair(int k, const char *name, int64_t v[2]) {
  char key[64];
  snprintf(key, sizeof key, "%d.%s", k, name);
  const char *s = slapo_safetensors_metadata(g_fix, key);
  assert_non_null(s);
  long long a, b;
  assert_int_equal(sscanf(s, "%lld,%lld", &a, &b), 2);
  v[0] = a, v[1] = b;
}

static void check_config(int k) {
  conv_args a;
  meta_pair(k, "stride", a.stride);
  meta_pair(k, "padding", a.padding);
  meta_pair(k, "dilation", a.dilation);
  char key[32];
  snprintf(key, sizeof key, "%d.groups", k);
  const char *gs = slapo_safetensors_metadata(g_fix, key);
  assert_non_null(gs);
  a.groups = atoll(gs);
  slapo_tensor *in[4] = {fixture(k, "x"), fixture(k, "w"), fixture(k, "b"), fixture(k, "r")};
  const char *what[4] = {"out", "dx", "dw", "db"};
  slapo_tensor *want[4];
  for (int i = 0; i < 4; i++) want[i] = fixture(k, what[i]);
  for (int mode = 0; mode < 2; mode++) {
    slapo_tensor *got[4];
    run_conv(in, &a, mode == 0, got);
    for (int i = 0; i < 4; i++) {
      assert_true(slapo_shape_equal(got[i]->ndim, got[i]->shape, want[i]->ndim, want[i]->shape));
      double e = torchfix_rel_err(got[i], want[i]);
      print_message("config %d (stride %lld, padding %lld, dilation %lld, groups %lld) %s "
                    "%-3s: max |slapo - torch| / max |torch| = %.2e\n",
                    k, (long long)a.stride[0], (long long)a.padding[0], (long long)a.dilation[0],
                    (long long)a.groups, mode == 0 ? "ref " : "fast", what[i], e);
      if (!(e <= 1e-4)) fail_msg("config %d %s differs from torch: %.3g", k, what[i], e);
      slapo_tensor_free(got[i]);
    }
  }
  for (int i = 0; i < 4; i++) slapo_tensor_free(in[i]), slapo_tensor_free(want[i]);
}

static void test_torch_dense(void **state) {
  (void)state;
  check_config(0);
}

static void test_torch_grouped_strided_dilated(void **state) {
  (void)state;
  check_config(1);
}

/* ---- (b) errors ---- */

/* Builds conv2d on placeholders of the given shapes (b_shape NULL: no
 * bias) and checks the status and that the message contains `want`. */
static void expect_error(int xnd, const int64_t *xs, const int64_t *ws, const int64_t *bs,
                         const conv_args *a, slapo_status st, const char *want) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, xnd, xs);
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 4, ws);
  slapo_node *b = bs ? slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, bs) : NULL;
  assert_null(slapo_conv2d(ctx, x, w, b, a->stride, a->padding, a->dilation, a->groups));
  assert_int_equal(slapo_ctx_status(ctx), st);
  const char *msg = slapo_ctx_message(ctx);
  print_message("%s: %s\n", slapo_status_name(st), msg);
  if (!strstr(msg, want)) fail_msg("message '%s' lacks '%s'", msg, want);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void test_shape_errors(void **state) {
  (void)state;
  conv_args g2 = {{1, 1}, {0, 0}, {1, 1}, 2}, g1 = {{1, 1}, {0, 0}, {1, 1}, 1};
  expect_error(4, (int64_t[]){2, 5, 7, 6}, (int64_t[]){6, 2, 3, 3}, NULL, &g2, SLAPO_SHAPE,
               "conv2d: x [2, 5, 7, 6] has 5 channels, not divisible by groups 2");
  expect_error(4, (int64_t[]){2, 4, 7, 6}, (int64_t[]){5, 2, 3, 3}, NULL, &g2, SLAPO_SHAPE,
               "w [5, 2, 3, 3] has 5 output channels, not divisible by groups 2");
  expect_error(4, (int64_t[]){2, 4, 7, 6}, (int64_t[]){6, 3, 3, 3}, NULL, &g2, SLAPO_SHAPE,
               "w has 3 input channels per group, but x's 4 channels in 2 group(s) need 2");
  expect_error(4, (int64_t[]){1, 1, 3, 3}, (int64_t[]){1, 1, 5, 5}, NULL, &g1, SLAPO_SHAPE,
               "the dilated kernel 5 x 5 (dilation [1, 1]) is larger than the padded input "
               "3 x 3 (padding [0, 0])");
  conv_args dil = {{1, 1}, {1, 1}, {3, 1}, 1};
  expect_error(4, (int64_t[]){1, 1, 4, 4}, (int64_t[]){1, 1, 3, 3}, NULL, &dil, SLAPO_SHAPE,
               "the dilated kernel 7 x 3 (dilation [3, 1]) is larger than the padded input "
               "6 x 6");
  expect_error(4, (int64_t[]){2, 4, 7, 6}, (int64_t[]){6, 4, 3, 3}, (int64_t[]){5}, &g1,
               SLAPO_SHAPE, "conv2d: b [5] does not match w [6, 4, 3, 3]: expected [6]");
  expect_error(3, (int64_t[]){4, 7, 6}, (int64_t[]){6, 4, 3, 3}, NULL, &g1, SLAPO_SHAPE,
               "conv2d: x [4, 7, 6] must be 4-d [N, C, H, W]");
  conv_args s0 = {{0, 1}, {0, 0}, {1, 1}, 1};
  expect_error(4, (int64_t[]){2, 4, 7, 6}, (int64_t[]){6, 4, 3, 3}, NULL, &s0,
               SLAPO_INVALID_ARG, "stride [0, 1] and dilation [1, 1] must be >= 1");
  conv_args gz = {{1, 1}, {0, 0}, {1, 1}, 0};
  expect_error(4, (int64_t[]){2, 4, 7, 6}, (int64_t[]){6, 4, 3, 3}, NULL, &gz,
               SLAPO_INVALID_ARG, "groups 0 must be >= 1");
}

static void test_module_arg_errors(void **state) {
  (void)state;
  slapo_module *m = NULL;
  slapo_conv2d_opts o = SLAPO_CONV2D_OPTS_DEFAULT;
  o.groups = 3;
  assert_int_equal(slapo_conv2d_new(4, 6, 3, 3, &o, &m), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "groups=3 must be >= 1 and divide in_channels=4"));
  assert_null(m);
  o = SLAPO_CONV2D_OPTS_DEFAULT;
  o.padding[1] = -1;
  assert_int_equal(slapo_conv2d_new(4, 6, 3, 3, &o, &m), SLAPO_INVALID_ARG);
  assert_int_equal(slapo_conv2d_new(4, 0, 3, 3, NULL, &m), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "out_channels=0"));
}

/* ---- (c) the module ---- */

static void test_module_params_and_init(void **state) {
  (void)state;
  slapo_conv2d_opts o = {{2, 1}, {1, 1}, {1, 2}, 2, true};
  slapo_module *m;
  OK(slapo_conv2d_new(4, 6, 3, 3, &o, &m));
  assert_int_equal(m->n_params, 2);
  assert_string_equal(m->param_names[0], "weight");
  assert_string_equal(m->param_names[1], "bias");
  const slapo_tensor *w = m->params[0]->value, *b = m->params[1]->value;
  int64_t ws[4] = {6, 2, 3, 3}, bs[1] = {6};
  assert_true(slapo_shape_equal(w->ndim, w->shape, 4, ws));
  assert_true(slapo_shape_equal(b->ndim, b->shape, 1, bs));
  assert_true(m->params[1]->no_weight_decay);
  assert_false(m->params[0]->no_weight_decay);
  OK(slapo_module_materialize(m, 11));
  /* fan_in = C/groups * KH * KW = 2 * 3 * 3. */
  double bound = 1.0 / sqrt(18.0);
  for (int k = 0; k < 2; k++) {
    const slapo_tensor *t = m->params[k]->value;
    const float *d = slapo_tensor_data(t);
    double mx = 0, sum = 0;
    for (int64_t i = 0; i < slapo_tensor_numel(t); i++) {
      if (!(fabs(d[i]) < bound))
        fail_msg("%s[%lld] = %g outside (-%g, %g)", m->param_names[k], (long long)i, d[i],
                 bound, bound);
      if (fabs(d[i]) > mx) mx = fabs(d[i]);
      sum += d[i];
    }
    print_message("%s: max |v| %.4f of bound %.4f, mean %.4f\n", m->param_names[k], mx, bound,
                  sum / (double)slapo_tensor_numel(t));
    if (k == 0) assert_true(mx > 0.9 * bound); /* 108 draws fill the range */
  }
  /* A pure function of (seed, path, index): a second module agrees. */
  slapo_module *m2;
  OK(slapo_conv2d_new(4, 6, 3, 3, &o, &m2));
  OK(slapo_module_materialize(m2, 11));
  assert_memory_equal(slapo_tensor_data(w), slapo_tensor_data(m2->params[0]->value),
                      slapo_tensor_nbytes(w));
  slapo_module_free(m2);
  slapo_module_free(m);
}

static void expect_repr(int64_t in, int64_t out, int64_t kh, int64_t kw,
                        const slapo_conv2d_opts *o, const char *want) {
  slapo_module *m;
  OK(slapo_conv2d_new(in, out, kh, kw, o, &m));
  char buf[256];
  m->type->describe(m, buf, sizeof buf);
  assert_string_equal(buf, want);
  slapo_module_free(m);
}

static void test_module_repr_and_form(void **state) {
  (void)state;
  expect_repr(3, 32, 3, 3, NULL, "3, 32, kernel_size=(3, 3), stride=(1, 1)");
  slapo_conv2d_opts o = {{2, 1}, {1, 1}, {1, 2}, 2, false};
  expect_repr(4, 6, 3, 5, &o,
              "4, 6, kernel_size=(3, 5), stride=(2, 1), padding=(1, 1), dilation=(1, 2), "
              "groups=2, bias=False");
  slapo_module *m;
  OK(slapo_conv2d_new(3, 32, 3, 3, NULL, &m));
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  slapo_module_print(m, f);
  fclose(f);
  assert_string_equal(text, "Conv2d(3, 32, kernel_size=(3, 3), stride=(1, 1))  # 896 params\n");
  free(text);
  slapo_op_form form;
  assert_true(m->type->op_form(m, &form));
  assert_ptr_equal(form.op, SLAPO_OP_DESC(conv2d));
  assert_int_equal(form.n_inputs, 3);
  assert_string_equal(form.inputs[0], "$0");
  assert_string_equal(form.inputs[1], "weight");
  assert_string_equal(form.inputs[2], "bias");
  assert_int_equal(form.n_attrs, 4);
  assert_string_equal(form.attrs[0].key, "stride");
  assert_int_equal(form.attrs[0].n, 2);
  assert_int_equal(form.attrs[0].ints[0], 1);
  assert_string_equal(form.attrs[3].key, "groups");
  assert_int_equal(form.attrs[3].i, 1);
  slapo_module_free(m);
}

/* A root module: loss = sum(conv(x)). */
static slapo_node *root_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  assert_int_equal(n_in, 1);
  slapo_node *y = slapo_call1(ctx, self, "conv", in[0]);
  return slapo_sum(ctx, y, 4, (const int64_t[]){0, 1, 2, 3}, false);
}

static const slapo_module_type k_root = {"Root", root_forward, NULL, NULL, NULL};

static void test_module_step_matches_op(void **state) {
  (void)state;
  slapo_conv2d_opts o = {{2, 1}, {1, 1}, {1, 2}, 2, true};
  slapo_module *root, *conv;
  OK(slapo_module_new(&k_root, NULL, &root));
  OK(slapo_conv2d_new(4, 6, 3, 3, &o, &conv));
  OK(slapo_module_add_child(root, "conv", conv));
  OK(slapo_module_materialize(root, 5));
  int64_t xs[4] = {2, 4, 7, 6}, ys[4] = {2, 6, 4, 4};
  slapo_tensor *x, *ones;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, xs, &x));
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, ys, &ones));
  float *xd = slapo_tensor_data(x), *od = slapo_tensor_data(ones);
  for (int64_t i = 0; i < slapo_tensor_numel(x); i++)
    xd[i] = 2 * slapo_rng_uniform(3, 1, 0, (uint64_t)i) - 1;
  for (int64_t i = 0; i < slapo_tensor_numel(ones); i++) od[i] = 1;

  slapo_runner *r;
  OK(slapo_runner_new(root, NULL, &r));
  slapo_module_zero_grad(root);
  const slapo_tensor *loss;
  OK(slapo_step(r, 1, (const slapo_tensor *const *)&x, SLAPO_STEP_TRAIN, NULL, &loss));
  float got_loss = *(const float *)slapo_tensor_data(loss);

  slapo_module *c = slapo_module_child(root, "conv");
  slapo_tensor *in[4] = {x, c->params[0]->value, c->params[1]->value, ones}, *want[4];
  conv_args a = {{2, 1}, {1, 1}, {1, 2}, 2};
  run_conv(in, &a, false, want);
  double sum = 0;
  const float *yd = slapo_tensor_data(want[0]);
  for (int64_t i = 0; i < slapo_tensor_numel(want[0]); i++) sum += yd[i];
  print_message("module loss %.7f, op sum %.7f; |dw| rel %.2e, |db| rel %.2e\n", got_loss,
                sum, torchfix_rel_err(c->params[0]->grad, want[2]), torchfix_rel_err(c->params[1]->grad, want[3]));
  assert_true(fabs(got_loss - sum) <= 1e-5 * (1 + fabs(sum)));
  assert_true(torchfix_rel_err(c->params[0]->grad, want[2]) <= 1e-6);
  assert_true(torchfix_rel_err(c->params[1]->grad, want[3]) <= 1e-6);
  for (int i = 0; i < 4; i++) slapo_tensor_free(want[i]);
  slapo_runner_free(r);
  slapo_tensor_free(x);
  slapo_tensor_free(ones);
  slapo_module_free(root);
}

int main(void) {
  const struct CMUnitTest torch_tests[] = {
      cmocka_unit_test(test_torch_dense),
      cmocka_unit_test(test_torch_grouped_strided_dilated),
  };
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape_errors),
      cmocka_unit_test(test_module_arg_errors),
      cmocka_unit_test(test_module_params_and_init),
      cmocka_unit_test(test_module_repr_and_form),
      cmocka_unit_test(test_module_step_matches_op),
  };
  int rc = cmocka_run_group_tests_name("conv2d_torch", torch_tests, setup, teardown);
  return rc | cmocka_run_group_tests_name("conv2d", tests, NULL, NULL);
}
