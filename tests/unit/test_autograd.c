/* tests/unit/test_autograd.c - slapo_backward on handcrafted graphs: values
 * with several users and their fixed accumulation order, broadcast
 * reduction, zeros for unreachable wrt, intermediate wrt, origins of
 * gradient nodes, and each error (no backward rule, call_module on the
 * path, dy shape), plus an allocation-failure sweep. Two test-only ops are
 * registered at run time: ag_scale (y = k x, with a rule) and ag_nobw. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/failalloc.h"
#include "slapo/autograd.h"
#include "slapo/exec.h"

/* ---- test-only ops ---- */

static slapo_status same_infer(slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, x->dtype, x->ndim, x->shape);
}

static void scale_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                      const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* x [..] contiguous */
  float *o = slapo_tensor_data(out);         /* out [..] */
  float k = (float)slapo_node_attr_float(node, "k", 1.0);
  for (int64_t i = 0; i < slapo_tensor_numel(out); i++) o[i] = k * x[i];
}

static slapo_node *scale(slapo_ctx *ctx, slapo_node *x, double k) {
  slapo_attr a = slapo_attr_float("k", k);
  return slapo_op_call(ctx, "ag_scale", 1, &x, 1, &a);
}

/* d(kx)/dx = k: the rule is the op itself with the same k. */
static slapo_status scale_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                   const bool *need, slapo_node **dx) {
  if (need[0]) dx[0] = scale(ctx, dy, slapo_node_attr_float(node, "k", 1.0));
  return slapo_ctx_status(ctx);
}

static const slapo_op k_scale = {.name = "ag_scale", .n_inputs = 1, .infer = same_infer,
                                 .ref = scale_ref, .backward = scale_backward,
                                 .contiguous_inputs = true, .doc = "test: y = k x"};
static const slapo_op k_nobw = {.name = "ag_nobw", .n_inputs = 1, .infer = same_infer,
                                .ref = scale_ref, .contiguous_inputs = true,
                                .doc = "test: an op without a backward rule"};

/* ag_pack2: x [2, 3] -> [12] = [2 x | 3 x], two results read through unpack
 * views; its packed rule records what autograd handed it. */
static slapo_status pack2_infer(slapo_node *node) {
  int64_t n = 12;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &n);
}

static void pack2_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                      const slapo_kernel_env *env) {
  (void)node, (void)env;
  const float *x = slapo_tensor_data(in[0]); /* x [2, 3] */
  float *o = slapo_tensor_data(out);         /* [12] */
  for (int i = 0; i < 6; i++) o[i] = 2 * x[i], o[6 + i] = 3 * x[i];
}

static int g_pack_n;
static int64_t g_pack_offs[4];

/* dx = 2 dy(offset 0) + 3 dy(offset 6), either absent. */
static slapo_status pack2_backward(slapo_ctx *ctx, slapo_node *node, int n, const int64_t *offs,
                                   slapo_node *const *dys, const bool *need, slapo_node **dx) {
  (void)node;
  g_pack_n = n;
  for (int k = 0; k < n && k < 4; k++) g_pack_offs[k] = offs[k];
  if (!need[0]) return slapo_ctx_status(ctx);
  slapo_node *sum = NULL;
  for (int k = 0; k < n; k++) {
    slapo_node *t = scale(ctx, dys[k], offs[k] == 0 ? 2 : 3);
    sum = sum ? slapo_add(ctx, sum, t) : t;
  }
  dx[0] = sum;
  return slapo_ctx_status(ctx);
}

static const slapo_op k_pack2 = {.name = "ag_pack2", .n_inputs = 1, .infer = pack2_infer,
                                 .ref = pack2_ref, .backward_packed = pack2_backward,
                                 .contiguous_inputs = true, .doc = "test: [2 x | 3 x] packed"};

static int setup_ops(void **state) {
  (void)state;
  if (!slapo_op_find("ag_pack2") && slapo_op_register(&k_pack2) != SLAPO_OK) return -1;
  if (!slapo_op_find("ag_scale") && slapo_op_register(&k_scale) != SLAPO_OK) return -1;
  if (!slapo_op_find("ag_nobw") && slapo_op_register(&k_nobw) != SLAPO_OK) return -1;
  return 0;
}

/* ---- helpers ---- */

typedef struct fx {
  slapo_graph *g;
  slapo_ctx *ctx;
} fx;

static fx fx_new(void) {
  fx f;
  assert_int_equal(slapo_graph_new(&f.g), SLAPO_OK);
  assert_int_equal(slapo_ctx_new(f.g, &f.ctx), SLAPO_OK);
  return f;
}

static void fx_free(fx *f) {
  slapo_ctx_free(f->ctx);
  slapo_graph_free(f->g);
}

static const int64_t k23[] = {2, 3};

/* Runs g with the given inputs bound (names[i] <- ts[i]) and returns owned
 * contiguous copies of its outputs in outs. */
static void run(slapo_graph *g, int n_in, const char *const *names,
                slapo_tensor *const *ts, int n_out, slapo_tensor **outs) {
  slapo_plan *p;
  slapo_plan_opts o = {.reference = true};
  assert_int_equal(slapo_plan_new(g, &o, &p), SLAPO_OK);
  for (int i = 0; i < n_in; i++)
    assert_int_equal(slapo_plan_bind_input(p, names[i], ts[i]), SLAPO_OK);
  assert_int_equal(slapo_plan_run(p, NULL), SLAPO_OK);
  assert_int_equal(slapo_plan_output_count(p), n_out);
  for (int i = 0; i < n_out; i++)
    assert_int_equal(slapo_tensor_contiguous(slapo_plan_output(p, i), &outs[i]), SLAPO_OK);
  slapo_plan_free(p);
}

static slapo_tensor *tensor(int ndim, const int64_t *shape, const float *data) {
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_from_data(SLAPO_DTYPE_F32, ndim, shape, data, &t), SLAPO_OK);
  return t;
}

static const float *f32(const slapo_tensor *t) { return slapo_tensor_data(t); }

/* ---- tests ---- */

/* y = x*x + x: x has three uses (mul slot 0, mul slot 1, add slot 1), so
 * dx = dy*x + x*dy + dy summed in that order; 2x + 1 for dy = ones. */
static void test_square_plus_x(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *y = slapo_add(f.ctx, slapo_mul(f.ctx, x, x), x);
  slapo_node *dx;
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_OK);
  assert_non_null(dx);
  assert_true(slapo_shape_equal(dx->ndim, dx->shape, 2, k23));
  /* Three contributions: ((c_mul0 + c_mul1) + c_add). */
  assert_string_equal(dx->target, "add");
  assert_string_equal(dx->inputs[0]->target, "add");
  slapo_node *outs[2] = {y, dx};
  assert_non_null(slapo_output(f.ctx, 2, outs));
  assert_int_equal(slapo_graph_lint(f.g), SLAPO_OK);

  const float xv[6] = {-1.5f, -0.25f, 0, 0.5f, 1, 3};
  slapo_tensor *xt = tensor(2, k23, xv), *res[2];
  const char *names[] = {"x"};
  run(f.g, 1, names, &xt, 2, res);
  for (int i = 0; i < 6; i++) {
    assert_float_equal(f32(res[0])[i], xv[i] * xv[i] + xv[i], 1e-6);
    assert_float_equal(f32(res[1])[i], 2 * xv[i] + 1, 1e-6);
  }
  for (int i = 0; i < 2; i++) slapo_tensor_free(res[i]);
  slapo_tensor_free(xt);
  fx_free(&f);
}

/* Contributions are summed in the users' graph order, not in visit order
 * (the reverse walk meets u2 before u1). */
static void test_accumulation_order(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *u1 = scale(f.ctx, x, 2);
  slapo_node *u2 = scale(f.ctx, x, 3);
  slapo_node *y = slapo_add(f.ctx, u2, u1);
  slapo_node *dx;
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_OK);
  assert_string_equal(dx->target, "add");
  assert_string_equal(dx->inputs[0]->target, "ag_scale");
  assert_string_equal(dx->inputs[1]->target, "ag_scale");
  assert_float_equal(slapo_node_attr_float(dx->inputs[0], "k", 0), 2, 0);
  assert_float_equal(slapo_node_attr_float(dx->inputs[1], "k", 0), 3, 0);

  /* The same build twice prints the same graph (names, order, attributes). */
  char *text[2];
  size_t len[2];
  for (int r = 0; r < 2; r++) {
    fx h = fx_new();
    slapo_node *hx = slapo_input(h.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
    slapo_node *hy = slapo_add(h.ctx, scale(h.ctx, hx, 3), scale(h.ctx, hx, 2));
    slapo_node *hd;
    assert_int_equal(slapo_backward(h.ctx, hy, NULL, 1, &hx, &hd), SLAPO_OK);
    FILE *m = open_memstream(&text[r], &len[r]);
    slapo_graph_print(h.g, m);
    fclose(m);
    fx_free(&h);
  }
  assert_string_equal(text[0], text[1]);
  free(text[0]);
  free(text[1]);

  slapo_node *o = dx;
  assert_non_null(slapo_output(f.ctx, 1, &o));
  const float xv[6] = {1, 2, 3, 4, 5, 6};
  slapo_tensor *xt = tensor(2, k23, xv), *res;
  const char *names[] = {"x"};
  run(f.g, 1, names, &xt, 1, &res);
  for (int i = 0; i < 6; i++) assert_float_equal(f32(res)[i], 5, 0);
  slapo_tensor_free(res);
  slapo_tensor_free(xt);
  fx_free(&f);
}

/* a [2, 3] + b [3]: db is dy summed over the broadcast rows, shape [3]. */
static void test_broadcast_reduced(void **state) {
  (void)state;
  fx f = fx_new();
  const int64_t k3[] = {3};
  slapo_node *a = slapo_input(f.ctx, "a", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *b = slapo_input(f.ctx, "b", SLAPO_DTYPE_F32, 1, k3);
  slapo_node *dy = slapo_input(f.ctx, "dy", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *y = slapo_add(f.ctx, a, b);
  slapo_node *wrt[2] = {a, b}, *g[2];
  assert_int_equal(slapo_backward(f.ctx, y, dy, 2, wrt, g), SLAPO_OK);
  assert_true(slapo_shape_equal(g[0]->ndim, g[0]->shape, 2, k23));
  assert_true(slapo_shape_equal(g[1]->ndim, g[1]->shape, 1, k3));
  assert_non_null(slapo_output(f.ctx, 2, g));

  const float av[6] = {0}, bv[3] = {0}, dv[6] = {1, 2, 3, 10, 20, 30};
  slapo_tensor *in[3] = {tensor(2, k23, av), tensor(1, k3, bv), tensor(2, k23, dv)}, *res[2];
  const char *names[] = {"a", "b", "dy"};
  run(f.g, 3, names, in, 2, res);
  for (int i = 0; i < 6; i++) assert_float_equal(f32(res[0])[i], dv[i], 0);
  assert_float_equal(f32(res[1])[0], 11, 0);
  assert_float_equal(f32(res[1])[1], 22, 0);
  assert_float_equal(f32(res[1])[2], 33, 0);
  for (int i = 0; i < 2; i++) slapo_tensor_free(res[i]);
  for (int i = 0; i < 3; i++) slapo_tensor_free(in[i]);
  fx_free(&f);
}

/* A wrt value y does not depend on (before or after y) gets zeros of its
 * own shape; y itself gets the seed. */
static void test_unreachable_and_seed(void **state) {
  (void)state;
  fx f = fx_new();
  const int64_t k4[] = {4};
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *z = slapo_input(f.ctx, "z", SLAPO_DTYPE_F32, 1, k4);
  slapo_node *y = scale(f.ctx, x, 2);
  slapo_node *late = scale(f.ctx, x, 5);
  slapo_node *wrt[4] = {z, late, y, x}, *g[4];
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 4, wrt, g), SLAPO_OK);
  for (int i = 0; i < 3; i++) assert_string_equal(g[i]->target, "full");
  assert_true(slapo_shape_equal(g[0]->ndim, g[0]->shape, 1, k4));
  assert_float_equal(slapo_node_attr_float(g[0], "value", -1), 0, 0);
  assert_float_equal(slapo_node_attr_float(g[1], "value", -1), 0, 0);
  assert_float_equal(slapo_node_attr_float(g[2], "value", -1), 1, 0); /* the seed */
  assert_string_equal(g[3]->target, "ag_scale");
  assert_ptr_equal(g[3]->inputs[0], g[2]);
  assert_non_null(slapo_output(f.ctx, 4, g));

  const float xv[6] = {1, 2, 3, 4, 5, 6}, zv[4] = {1, 1, 1, 1};
  slapo_tensor *in[2] = {tensor(2, k23, xv), tensor(1, k4, zv)}, *res[4];
  const char *names[] = {"x", "z"};
  run(f.g, 2, names, in, 4, res);
  for (int i = 0; i < 4; i++) assert_float_equal(f32(res[0])[i], 0, 0);
  for (int i = 0; i < 6; i++) {
    assert_float_equal(f32(res[1])[i], 0, 0);
    assert_float_equal(f32(res[2])[i], 1, 0);
    assert_float_equal(f32(res[3])[i], 2, 0);
  }
  for (int i = 0; i < 4; i++) slapo_tensor_free(res[i]);
  for (int i = 0; i < 2; i++) slapo_tensor_free(in[i]);
  fx_free(&f);
}

/* An intermediate wrt stops the walk there unless another wrt lies above;
 * gradient nodes carry the forward node's module path. */
static void test_intermediate_wrt_and_origin(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  assert_int_equal(slapo_ctx_push_origin(f.ctx, "h.0.attn"), SLAPO_OK);
  slapo_node *u = scale(f.ctx, x, 2);
  slapo_ctx_pop_origin(f.ctx);
  assert_int_equal(slapo_ctx_push_origin(f.ctx, "h.1.mlp"), SLAPO_OK);
  slapo_node *y = scale(f.ctx, u, 3);
  slapo_ctx_pop_origin(f.ctx);
  slapo_node *du;
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &u, &du), SLAPO_OK);
  assert_string_equal(du->target, "ag_scale");
  assert_string_equal(du->origin, "h.1.mlp");
  int n_scale = 0;
  for (slapo_node *n = slapo_graph_first(f.g); n; n = n->next)
    n_scale += !strcmp(n->target, "ag_scale");
  assert_int_equal(n_scale, 3); /* u, y and du: nothing emitted for x */

  slapo_node *wrt[2] = {x, u}, *g[2];
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 2, wrt, g), SLAPO_OK);
  assert_string_equal(g[0]->origin, "h.0.attn");
  assert_ptr_equal(g[0]->inputs[0], g[1]);
  assert_int_equal(slapo_ctx_status(f.ctx), SLAPO_OK);
  fx_free(&f);
}

/* An op without a rule on the path is SLAPO_UNSUPPORTED naming the op, the
 * node and the module path; off the path it is fine. */
static void test_no_backward_rule(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *z = slapo_input(f.ctx, "z", SLAPO_DTYPE_F32, 2, k23);
  assert_int_equal(slapo_ctx_push_origin(f.ctx, "h.0.mlp"), SLAPO_OK);
  slapo_node *off = slapo_op_call(f.ctx, "ag_nobw", 1, &z, 0, NULL);
  slapo_node *u = slapo_op_call(f.ctx, "ag_nobw", 1, &x, 0, NULL);
  slapo_ctx_pop_origin(f.ctx);
  slapo_node *y = slapo_add(f.ctx, scale(f.ctx, u, 2), off);
  slapo_node *dz, *dx = (slapo_node *)1;

  /* No gradient has to pass through an ag_nobw node when the wrt is u
   * itself (and `off` never is on a path). */
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &u, &dz), SLAPO_OK);
  assert_string_equal(dz->target, "ag_scale");

  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_UNSUPPORTED);
  assert_null(dx);
  assert_int_equal(slapo_ctx_status(f.ctx), SLAPO_UNSUPPORTED);
  const char *m = slapo_ctx_message(f.ctx);
  assert_non_null(strstr(m, "op 'ag_nobw'"));
  assert_non_null(strstr(m, "%ag_nobw_1"));
  assert_non_null(strstr(m, "module h.0.mlp"));
  assert_non_null(strstr(m, "no backward rule"));
  assert_string_equal(slapo_last_error(), m);
  /* Sticky: later calls fail at once with the first error. */
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &u, &dz), SLAPO_UNSUPPORTED);
  assert_null(dz);
  fx_free(&f);
}

/* Modules must be inlined before differentiation. */
static void test_call_module_on_path(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23), *m, *dx;
  assert_int_equal(slapo_graph_add_call_module(f.g, "h.0.attn", 1, &x, &m), SLAPO_OK);
  assert_int_equal(slapo_node_set_meta(m, SLAPO_DTYPE_F32, 2, k23), SLAPO_OK);
  slapo_node *y = scale(f.ctx, m, 2);
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_UNSUPPORTED);
  const char *msg = slapo_ctx_message(f.ctx);
  assert_non_null(strstr(msg, "call_module"));
  assert_non_null(strstr(msg, "h.0.attn"));
  assert_non_null(strstr(msg, "inline"));
  fx_free(&f);
}

static void test_dy_shape_mismatch(void **state) {
  (void)state;
  fx f = fx_new();
  const int64_t k32[] = {3, 2};
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *dy = slapo_input(f.ctx, "dy", SLAPO_DTYPE_F32, 2, k32);
  slapo_node *y = scale(f.ctx, x, 2), *dx;
  assert_int_equal(slapo_backward(f.ctx, y, dy, 1, &x, &dx), SLAPO_SHAPE);
  assert_null(dx);
  const char *m = slapo_ctx_message(f.ctx);
  assert_non_null(strstr(m, "backward: dy (%dy) has shape [3, 2]"));
  assert_non_null(strstr(m, "[2, 3]"));
  fx_free(&f);
}

static void test_bad_args(void **state) {
  (void)state;
  fx f = fx_new(), h = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *other = slapo_input(h.ctx, "x", SLAPO_DTYPE_F32, 2, k23), *dx;
  slapo_node *y = scale(f.ctx, x, 2);
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &other, &dx), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_ctx_message(f.ctx), "wrt[0] (%x) is not a live node"));
  fx_free(&f);
  fx_free(&h);

  f = fx_new();
  const int64_t k4[] = {4};
  slapo_node *idx = slapo_input(f.ctx, "idx", SLAPO_DTYPE_I64, 1, k4);
  assert_int_equal(slapo_backward(f.ctx, idx, NULL, 1, &idx, &dx), SLAPO_DTYPE);
  assert_non_null(strstr(slapo_ctx_message(f.ctx), "has dtype i64"));
  fx_free(&f);
}

/* Every allocation failure inside building + backward is SLAPO_NOMEM with
 * nothing leaked. */
static void test_nomem_sweep(void **state) {
  (void)state;
  for (long k = 0;; k++) {
    failalloc_install(k);
    slapo_graph *g = NULL;
    slapo_ctx *ctx = NULL;
    slapo_status s = slapo_graph_new(&g);
    if (s == SLAPO_OK) s = slapo_ctx_new(g, &ctx);
    if (s == SLAPO_OK) {
      const int64_t k3[] = {3};
      slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, k23);
      slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, k3);
      slapo_node *u = slapo_add(ctx, scale(ctx, x, 2), b);
      slapo_node *y = slapo_add(ctx, slapo_mul(ctx, u, x), u);
      slapo_node *wrt[2] = {x, b}, *gr[2];
      s = slapo_ctx_status(ctx);
      if (s == SLAPO_OK) s = slapo_backward(ctx, y, NULL, 2, wrt, gr);
    }
    slapo_ctx_free(ctx);
    slapo_graph_free(g);
    long live = failalloc_live(), attempts = failalloc_attempts();
    failalloc_uninstall();
    assert_int_equal(live, 0);
    if (s == SLAPO_OK) {
      assert_true(k >= attempts);
      break;
    }
    assert_int_equal(s, SLAPO_NOMEM);
  }
}

static slapo_node *view(slapo_ctx *ctx, slapo_node *p, int64_t off) {
  slapo_attr a[2] = {slapo_attr_int("offset", off), slapo_attr_ints("shape", 2, k23)};
  return slapo_op_call(ctx, "unpack", 1, &p, 2, a);
}

/* A packed value's rule gets each result's gradient at once: the views of
 * one offset summed first (b read twice), offsets ascending; dx = 2 + 3 * 2
 * for dy = ones. A result nobody differentiates is absent. */
static void test_packed_results(void **state) {
  (void)state;
  fx f = fx_new();
  slapo_node *x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *p = slapo_op_call(f.ctx, "ag_pack2", 1, &x, 0, NULL);
  slapo_node *y = slapo_add(f.ctx, slapo_add(f.ctx, view(f.ctx, p, 6), view(f.ctx, p, 0)),
                            view(f.ctx, p, 6));
  slapo_node *dx;
  g_pack_n = -1;
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_OK);
  assert_int_equal(g_pack_n, 2);
  assert_int_equal(g_pack_offs[0], 0);
  assert_int_equal(g_pack_offs[1], 6);
  slapo_node *outs[2] = {y, dx};
  assert_non_null(slapo_output(f.ctx, 2, outs));
  const float xv[6] = {-1.5f, -0.25f, 0, 0.5f, 1, 3};
  slapo_tensor *xt = tensor(2, k23, xv), *res[2];
  const char *names[] = {"x"};
  run(f.g, 1, names, &xt, 2, res);
  for (int i = 0; i < 6; i++) {
    assert_float_equal(f32(res[0])[i], 8 * xv[i], 1e-6);
    assert_float_equal(f32(res[1])[i], 8, 1e-6);
  }
  for (int i = 0; i < 2; i++) slapo_tensor_free(res[i]);
  slapo_tensor_free(xt);
  fx_free(&f);

  /* Only the second result on the path. */
  f = fx_new();
  x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  p = slapo_op_call(f.ctx, "ag_pack2", 1, &x, 0, NULL);
  y = view(f.ctx, p, 6);
  (void)view(f.ctx, p, 0);
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_OK);
  assert_int_equal(g_pack_n, 1);
  assert_int_equal(g_pack_offs[0], 6);
  fx_free(&f);

  /* Read directly: refused, naming the reader. */
  f = fx_new();
  x = slapo_input(f.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  p = slapo_op_call(f.ctx, "ag_pack2", 1, &x, 0, NULL);
  y = slapo_add(f.ctx, scale(f.ctx, view(f.ctx, p, 0), 1.0), view(f.ctx, scale(f.ctx, p, 1.0), 6));
  assert_int_equal(slapo_backward(f.ctx, y, NULL, 1, &x, &dx), SLAPO_UNSUPPORTED);
  assert_non_null(strstr(slapo_last_error(), "other than through an unpack view"));
  fx_free(&f);
}


/* Several seeds (slapo_backward_multi), as a pipeline stage differentiates
 * the values it sends: whole graph y = sum(h1 * h2 + h1) with h1 = x * w,
 * h2 = tanh(x); a "first stage" graph computes h1, h2 only and is seeded
 * with the whole graph's gradients of h1 and h2. Its dx and dw are bitwise
 * the whole graph's. Also: the seeds' shapes are checked per y, and no y
 * is an error. */
static void test_multi_seed_matches_whole(void **state) {
  (void)state;
  const float xv[6] = {-1.5f, -0.25f, 0.125f, 0.5f, 1, 3};
  const float wv[6] = {0.75f, -2, 1.25f, 0.3f, -0.6f, 0.9f};
  slapo_tensor *xt = tensor(2, k23, xv), *wt = tensor(2, k23, wv);
  slapo_tensor *ins[2] = {xt, wt};
  const char *names[] = {"x", "w", "d1", "d2"};
  /* Whole graph: gradients of x, w, h1, h2. */
  fx a = fx_new();
  slapo_node *x = slapo_input(a.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *w = slapo_input(a.ctx, "w", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *h1 = slapo_mul(a.ctx, x, w), *h2 = slapo_tanh(a.ctx, x);
  int64_t axes[2] = {0, 1};
  slapo_node *y = slapo_sum(a.ctx, slapo_add(a.ctx, slapo_mul(a.ctx, h1, h2), h1), 2, axes, false);
  slapo_node *wrt[4] = {x, w, h1, h2}, *g[4];
  assert_int_equal(slapo_backward(a.ctx, y, NULL, 4, wrt, g), SLAPO_OK);
  assert_non_null(slapo_output(a.ctx, 4, g));
  slapo_tensor *whole[4];
  run(a.g, 2, names, ins, 4, whole);
  /* First stage: h1, h2 seeded with the whole graph's d h1, d h2. */
  fx b = fx_new();
  x = slapo_input(b.ctx, "x", SLAPO_DTYPE_F32, 2, k23);
  w = slapo_input(b.ctx, "w", SLAPO_DTYPE_F32, 2, k23);
  slapo_node *ys[2] = {slapo_mul(b.ctx, x, w), slapo_tanh(b.ctx, x)};
  slapo_node *dys[2] = {slapo_input(b.ctx, "d1", SLAPO_DTYPE_F32, 2, k23),
                        slapo_input(b.ctx, "d2", SLAPO_DTYPE_F32, 2, k23)};
  slapo_node *bw[2] = {x, w}, *bg[2];
  assert_int_equal(slapo_backward_multi(b.ctx, 2, ys, dys, 2, bw, bg), SLAPO_OK);
  assert_non_null(slapo_output(b.ctx, 2, bg));
  slapo_tensor *bins[4] = {xt, wt, whole[2], whole[3]}, *stage[2];
  run(b.g, 4, names, bins, 2, stage);
  for (int i = 0; i < 2; i++)
    assert_memory_equal(slapo_tensor_data(stage[i]), slapo_tensor_data(whole[i]),
                        6 * sizeof(float));
  /* Errors. */
  int64_t k32[2] = {3, 2};
  slapo_node *bad[2] = {dys[0], slapo_input(b.ctx, "d3", SLAPO_DTYPE_F32, 2, k32)};
  fx c = fx_new();
  slapo_ctx_free(c.ctx);
  assert_int_equal(slapo_ctx_new(b.g, &c.ctx), SLAPO_OK);
  expect_status(slapo_backward_multi(c.ctx, 2, ys, bad, 2, bw, bg), SLAPO_SHAPE,
                "seed gradient must have y's shape");
  slapo_ctx_free(c.ctx);
  assert_int_equal(slapo_ctx_new(b.g, &c.ctx), SLAPO_OK);
  expect_status(slapo_backward_multi(c.ctx, 0, ys, NULL, 2, bw, bg), SLAPO_INVALID_ARG,
                "0 values to differentiate");
  slapo_ctx_free(c.ctx);
  slapo_graph_free(c.g);
  for (int i = 0; i < 4; i++) slapo_tensor_free(whole[i]);
  for (int i = 0; i < 2; i++) slapo_tensor_free(stage[i]);
  slapo_tensor_free(xt);
  slapo_tensor_free(wt);
  fx_free(&a);
  fx_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_square_plus_x),
      cmocka_unit_test(test_packed_results),
      cmocka_unit_test(test_multi_seed_matches_whole),
      cmocka_unit_test(test_accumulation_order),
      cmocka_unit_test(test_broadcast_reduced),
      cmocka_unit_test(test_unreachable_and_seed),
      cmocka_unit_test(test_intermediate_wrt_and_origin),
      cmocka_unit_test(test_no_backward_rule),
      cmocka_unit_test(test_call_module_on_path),
      cmocka_unit_test(test_dy_shape_mismatch),
      cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_nomem_sweep),
  };
  return cmocka_run_group_tests(tests, setup_ops, NULL);
}
