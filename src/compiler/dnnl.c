/* compiler/dnnl.c - the `dnnl` backend: GEMM and convolution epilogue
 * fusion. A region
 *   linear(x, w[, b])  or  matmul(x, w, trans_b=1) [+ add(., b[N])]
 *   or conv2d(x, w[, b]) (NCHW; its attributes; one convolution primitive)
 * followed by a chain of relu, gelu (tanh or erf), mul_scalar, add_scalar
 * and add of a full-shape input (a residual) becomes one op whose forward is
 * ONE oneDNN matmul primitive: the bias as its bias argument, the chain as
 * post-ops (eltwise relu / gelu_tanh / gelu_erf / linear, binary add). Primitives
 * are cached per op (ops/dnnl_cache.h), keyed by problem shape and OpenMP
 * thread count.
 * The backward rule is built from existing ops on the fused node's inputs
 * and its own value y; nothing else is saved. A relu's mask comes from y
 * (y > 0 iff the pre-activation is, when the relu is last or followed only
 * by scales >= 1); scales and residual adds are linear. A gelu needs its
 * input, which the fused GEMM never writes: the backward RECOMPUTES the
 * pre-activation z = x w^T + b (one extra GEMM, `linear`) and replays the
 * chain up to the gelu with elementwise ops. Gradients of x, w, b and the
 * residuals are those of the unfused ops' rules (ops/linear.c, matmul.c).
 * Equal regions (same chain and constants) share one op. Layer: compiler. */
#include <oneapi/dnnl/dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "compiler/internal.h"
#include "slapo/ops/dnnl_cache.h"
#include "slapo/ops/gemm.h"

#define MAX_POST 8
#define MAX_IN 32
#define CACHE_CAP 8

typedef enum post_kind { P_RELU, P_GELU_TANH, P_GELU_ERF, P_SCALE, P_ADD, P_SHIFT } post_kind;

typedef struct post {
  post_kind kind;
  double scale; /* P_SCALE: the factor; P_SHIFT: the constant added */
  int in;       /* P_ADD: the residual's input index */
} post;

typedef struct plan {
  int n_in;
  int x, w, b; /* input indices; b -1: no bias */
  bool conv;   /* a conv2d head (NCHW) instead of a GEMM                 */
  int64_t stride[2], pad[2], dil[2], groups; /* conv: its attributes     */
  int n_post;
  post post[MAX_POST];
} plan;

/* The problem a primitive was made for; zeroed before filling (compared as
 * bytes). GEMM: M, N, K; conv: x [N, C, H, W], w [O, C/G, KH, KW],
 * y [N, O, OH, OW] in dims. */
typedef struct key {
  int64_t M, N, K;
  int64_t dims[11];
  int64_t nthr; /* dnnl fixes its work split at creation (no padding) */
} key;

enum { MEM_SRC, MEM_WEI, MEM_BIAS, MEM_DST, MEM_POST }; /* then one per P_ADD */
#define N_MEM (MEM_POST + MAX_POST)
_Static_assert(N_MEM <= SLAPO__DNNL_MAX_MEM, "the cache's memory objects");

typedef struct dnnl_op {
  slapo_op fwd; /* first: node->op of a fused node points here */
  char name[112];
  plan p;
  /* Per op, as the key does not name the plan; lives until exit, like the
   * op, so LSan sees the primitives as reachable. */
  slapo__dnnl_cache cache;
  slapo__dnnl_entry slots[CACHE_CAP];
} dnnl_op;

/* What the cache's create function needs: the plan and the problem. */
typedef struct create_args {
  const plan *p;
  const key *k;
} create_args;

static dnnl_op *of(const slapo_op *op) { return (dnnl_op *)op; }

/* ---- a conv2d head: its attributes and the conv2d op's own rules ---- */

/* The conv2d attributes of p into a [4] (pointing into p, which lives with
 * its op). */
static int conv_attrs(const plan *p, slapo_attr *a) {
  a[0] = slapo_attr_ints("stride", 2, p->stride);
  a[1] = slapo_attr_ints("padding", 2, p->pad);
  a[2] = slapo_attr_ints("dilation", 2, p->dil);
  a[3] = slapo_attr_int("groups", p->groups);
  return 4;
}

/* A conv2d node standing for the head of fused node `node` (not in any
 * graph: its shape inference, reference kernel and backward rule read its
 * inputs, attributes and meta only), so the convolution's math is written
 * once, in ops/conv.c. in [3] and a [4] are the caller's storage. */
static slapo_node conv_shadow(const slapo_node *node, const plan *p, slapo_node **in,
                              slapo_attr *a) {
  slapo_node sh = *node;
  in[0] = node->inputs[p->x], in[1] = node->inputs[p->w];
  if (p->b >= 0) in[2] = node->inputs[p->b];
  sh.op = SLAPO_OP_DESC(conv2d), sh.target = "conv2d";
  sh.inputs = in, sh.n_inputs = p->b >= 0 ? 3 : 2;
  sh.attrs = a, sh.n_attrs = conv_attrs(p, a);
  sh.n_users = 0, sh.users = NULL;
  return sh;
}

/* ---- shapes ---- */

static int64_t rows_of(const slapo_node *x) {
  int64_t r = 1;
  for (int d = 0; d < x->ndim - 1; d++) r *= x->shape[d];
  return r;
}

static slapo_status fwd_infer(slapo_node *node) {
  const plan *p = &of(node->op)->p;
  for (int i = 0; i < node->n_inputs; i++)
    if (node->inputs[i]->dtype != SLAPO_DTYPE_F32)
      return slapo_error(SLAPO_DTYPE, "%s: input %d is %s, expected f32", node->target, i,
                         slapo_dtype_name(node->inputs[i]->dtype));
  if (p->conv) {
    slapo_node *in[3];
    slapo_attr a[4];
    slapo_node sh = conv_shadow(node, p, in, a);
    SLAPO_TRY(SLAPO_OP_DESC(conv2d)->infer(&sh));
    for (int k = 0; k < p->n_post; k++) {
      const slapo_node *r = node->inputs[p->post[k].in];
      if (p->post[k].kind == P_ADD && !slapo_shape_equal(r->ndim, r->shape, sh.ndim, sh.shape))
        return slapo_error(SLAPO_SHAPE, "%s: residual input %d must have the output's shape",
                           node->target, p->post[k].in);
    }
    return slapo_node_set_meta(node, SLAPO_DTYPE_F32, sh.ndim, sh.shape);
  }
  const slapo_node *x = node->inputs[p->x], *w = node->inputs[p->w];
  if (x->ndim < 2 || w->ndim != 2 || w->shape[1] != x->shape[x->ndim - 1])
    return slapo_error(SLAPO_SHAPE, "%s: x [.., K] (%d-d) and w [N, K] (%d-d) do not match",
                       node->target, x->ndim, w->ndim);
  int64_t shape[SLAPO_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = w->shape[0];
  if (p->b >= 0) {
    const slapo_node *b = node->inputs[p->b];
    if (b->ndim != 1 || b->shape[0] != w->shape[0])
      return slapo_error(SLAPO_SHAPE, "%s: the bias must be [%lld]", node->target,
                         (long long)w->shape[0]);
  }
  for (int k = 0; k < p->n_post; k++) {
    const slapo_node *r = node->inputs[p->post[k].in];
    if (p->post[k].kind == P_ADD && !slapo_shape_equal(r->ndim, r->shape, x->ndim, shape))
      return slapo_error(SLAPO_SHAPE, "%s: residual input %d must have the output's shape",
                         node->target, p->post[k].in);
  }
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, x->ndim, shape);
}

/* ---- the reference: the GEMM of ops/gemm.h, then the chain, each op
 * rounded to f32 as its own reference kernel rounds ---- */

static double gelu_d(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
}

static void fwd_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                    const slapo_kernel_env *env) {
  const plan *p = &of(node->op)->p;
  if (p->conv) {
    slapo_node *sin[3];
    slapo_attr a[4];
    slapo_node sh = conv_shadow(node, p, sin, a);
    const slapo_tensor *t[3] = {in[p->x], in[p->w], p->b >= 0 ? in[p->b] : NULL};
    SLAPO_OP_DESC(conv2d)->ref(&sh, t, out, env);
  } else {
    slapo__gemm g;
    slapo__gemm_init(&g, in[p->x], false, in[p->w], true, p->b >= 0 ? in[p->b] : NULL, out);
    slapo__gemm_ref(&g);
  }
  float *y = slapo_tensor_data(out);
  int64_t n = slapo_tensor_numel(out);
  for (int k = 0; k < p->n_post; k++) {
    const post *q = &p->post[k];
    const float *r = q->kind == P_ADD ? slapo_tensor_data(in[q->in]) : NULL;
    for (int64_t i = 0; i < n; i++) {
      double v = y[i];
      switch (q->kind) {
      case P_RELU: v = v <= 0 ? 0.0 : v; break;
      case P_GELU_TANH: v = gelu_d(v, true); break;
      case P_GELU_ERF: v = gelu_d(v, false); break;
      case P_SCALE: v = v * q->scale; break;
      case P_ADD: v = v + r[i]; break;
      case P_SHIFT: v = v + q->scale; break;
      }
      y[i] = (float)v;
    }
  }
}

/* ---- the fast path: one matmul primitive with bias and post-ops ---- */

static bool desc2(dnnl_memory_desc_t *md, int64_t r, int64_t c, int64_t sr, int64_t sc) {
  dnnl_dims_t d = {r, c}, s = {sr, sc};
  return dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, s) == dnnl_success;
}

/* The cache's create function (ud: create_args). */
/* The memory descriptors of a conv2d head, NCHW as ops/conv.c uses them. */
static bool conv_descs(const plan *p, const key *k, dnnl_memory_desc_t *md) {
  const int64_t *d = k->dims; /* N C H W O KH KW OH OW */
  int64_t G = p->groups;
  dnnl_dims_t xd = {d[0], d[1], d[2], d[3]}, yd = {d[0], d[4], d[7], d[8]}, bd = {d[4]};
  dnnl_dims_t wd = {G, d[4] / G, d[1] / G, d[5], d[6]};
  return dnnl_memory_desc_init_by_tag(&md[MEM_SRC], 4, xd, dnnl_f32, dnnl_nchw) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&md[MEM_DST], 4, yd, dnnl_f32, dnnl_nchw) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&md[MEM_WEI], G > 1 ? 5 : 4, G > 1 ? wd : wd + 1, dnnl_f32,
                                      G > 1 ? dnnl_goihw : dnnl_oihw) == dnnl_success &&
         dnnl_memory_desc_init_by_tag(&md[MEM_BIAS], 1, bd, dnnl_f32, dnnl_x) == dnnl_success;
}

static bool entry_create(slapo__dnnl_entry *e, const void *ud) {
  const create_args *a = ud;
  const plan *p = a->p;
  const key *k = a->k;
  dnnl_engine_t eng = slapo__dnnl_engine();
  /* GEMM: src x [M, K]; weights w^T [K, N] read through w [N, K]'s strides. */
  dnnl_memory_desc_t md[N_MEM];
  bool ok = p->conv ? conv_descs(p, k, md)
                    : desc2(&md[MEM_SRC], k->M, k->K, k->K, 1) &&
                          desc2(&md[MEM_WEI], k->K, k->N, 1, k->K) &&
                          desc2(&md[MEM_BIAS], 1, k->N, k->N, 1) &&
                          desc2(&md[MEM_DST], k->M, k->N, k->N, 1);
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_attr_t attr = NULL;
  ok = ok && dnnl_post_ops_create(&po) == dnnl_success &&
       dnnl_primitive_attr_create(&attr) == dnnl_success;
  for (int i = 0; ok && i < p->n_post; i++) {
    const post *q = &p->post[i];
    switch (q->kind) {
    case P_RELU: ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0, 0); break;
    case P_GELU_TANH:
      ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_tanh, 0, 0);
      break;
    case P_GELU_ERF:
      ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_erf, 0, 0);
      break;
    case P_SCALE:
      ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, (float)q->scale, 0);
      break;
    case P_SHIFT: /* eltwise linear: alpha x + beta */
      ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, 1.0f, (float)q->scale);
      break;
    case P_ADD:
      if (p->conv) md[MEM_POST + i] = md[MEM_DST];
      ok = (p->conv || desc2(&md[MEM_POST + i], k->M, k->N, k->N, 1)) &&
           !dnnl_post_ops_append_binary(po, dnnl_binary_add, &md[MEM_POST + i]);
      break;
    }
  }
  ok = ok && dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  dnnl_matmul_desc_t mm;
  dnnl_convolution_desc_t cd;
  dnnl_primitive_desc_t pd = NULL;
  /* dnnl counts dilation from 0; the right padding equal to the left gives
   * PyTorch's floor in the output extent (as ops/conv.c). */
  dnnl_dims_t st = {p->stride[0], p->stride[1]}, dil = {p->dil[0] - 1, p->dil[1] - 1};
  dnnl_dims_t pad = {p->pad[0], p->pad[1]};
  const dnnl_memory_desc_t *bias = p->b >= 0 ? &md[MEM_BIAS] : NULL;
  if (p->conv)
    ok = ok && dnnl_dilated_convolution_forward_desc_init(
                   &cd, dnnl_forward_training, dnnl_convolution_direct, &md[MEM_SRC],
                   &md[MEM_WEI], bias, &md[MEM_DST], st, dil, pad, pad) == dnnl_success;
  else
    ok = ok && dnnl_matmul_desc_init(&mm, &md[MEM_SRC], &md[MEM_WEI], bias, &md[MEM_DST]) ==
                   dnnl_success;
  ok = ok && dnnl_primitive_desc_create(&pd, p->conv ? (const void *)&cd : (const void *)&mm,
                                        attr, eng, NULL) == dnnl_success;
  ok = ok && dnnl_primitive_create(&e->prim, pd) == dnnl_success;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (po) dnnl_post_ops_destroy(po);
  for (int i = 0; ok && i < MEM_POST + p->n_post; i++) {
    if (i == MEM_BIAS && p->b < 0) continue;
    if (i >= MEM_POST && p->post[i - MEM_POST].kind != P_ADD) continue;
    ok = dnnl_memory_create(&e->mem[i], &md[i], eng, DNNL_MEMORY_NONE) == dnnl_success;
  }
  return ok;
}

static void fwd_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                     const slapo_kernel_env *env) {
  dnnl_op *c = of(node->op);
  const plan *p = &c->p;
  key k;
  memset(&k, 0, sizeof k);
  if (p->conv) {
    const slapo_tensor *x = in[p->x], *w = in[p->w];
    int64_t d[11] = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0],
                     w->shape[2], w->shape[3], out->shape[2], out->shape[3]};
    memcpy(k.dims, d, sizeof d);
    /* the GEMM view of the size checks below: an empty output, or an
     * empty filter (reference path) */
    k.M = slapo_tensor_numel(out), k.N = 1, k.K = slapo_tensor_numel(w);
  } else {
    k.M = rows_of(node->inputs[p->x]), k.K = in[p->w]->shape[1], k.N = in[p->w]->shape[0];
  }
  k.nthr = omp_get_max_threads();
  if (k.M == 0 || k.N == 0) return;
  dnnl_stream_t stream = slapo__dnnl_stream();
  slapo__dnnl_entry local, *e = NULL;
  create_args ca = {p, &k};
  if (k.K > 0 && stream)
    e = slapo__dnnl_acquire(&c->cache, &k, sizeof k, entry_create, &ca, &local);
  if (!e) {
    fwd_ref(node, in, out, env);
    return;
  }
  dnnl_exec_arg_t args[4 + MAX_POST];
  int n = 0;
  /* dnnl reads but never writes src, weights, bias and residuals. */
  dnnl_memory_set_data_handle(e->mem[MEM_SRC], (void *)slapo_tensor_data(in[p->x]));
  dnnl_memory_set_data_handle(e->mem[MEM_WEI], (void *)slapo_tensor_data(in[p->w]));
  dnnl_memory_set_data_handle(e->mem[MEM_DST], slapo_tensor_data(out));
  args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, e->mem[MEM_SRC]};
  args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, e->mem[MEM_WEI]};
  args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, e->mem[MEM_DST]};
  if (p->b >= 0) {
    dnnl_memory_set_data_handle(e->mem[MEM_BIAS], (void *)slapo_tensor_data(in[p->b]));
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->mem[MEM_BIAS]};
  }
  for (int i = 0; i < p->n_post; i++) {
    if (p->post[i].kind != P_ADD) continue;
    dnnl_memory_t m = e->mem[MEM_POST + i];
    dnnl_memory_set_data_handle(m, (void *)slapo_tensor_data(in[p->post[i].in]));
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1, m};
  }
  dnnl_status_t st = dnnl_primitive_execute(e->prim, stream, n, args);
  if (st == dnnl_success) st = dnnl_stream_wait(stream);
  slapo__dnnl_release(&c->cache, e);
  if (st != dnnl_success) fwd_ref(node, in, out, env); /* short of a bug, never */
}

/* ---- the backward rule ---- */

static slapo_node *accumulate(slapo_ctx *ctx, slapo_node *acc, slapo_node *g) {
  return acc ? slapo_add(ctx, acc, g) : g;
}

static slapo_node *apply_post(slapo_ctx *ctx, const post *q, slapo_node *v,
                              slapo_node *const *in) {
  switch (q->kind) {
  case P_RELU: return slapo_relu(ctx, v);
  case P_GELU_TANH: return slapo_gelu(ctx, v, true);
  case P_GELU_ERF: return slapo_gelu(ctx, v, false);
  case P_SCALE: return slapo_mul_scalar(ctx, v, q->scale);
  case P_ADD: return slapo_add(ctx, v, in[q->in]);
  case P_SHIFT: return slapo_add_scalar(ctx, v, q->scale);
  }
  return NULL;
}

/* A relu's mask from y: the relu is last, or only scales >= 1 follow it
 * (s z > 0 iff z > 0 then; a scale below 1 could round a tiny z to 0).
 * After a shift, y says nothing exact: relu(z) + 1 is 1 for every
 * 0 < z < 2^-24, so the pre-activation is recomputed. */
static bool relu_mask_from_y(const plan *p, int k) {
  for (int j = k + 1; j < p->n_post; j++)
    if (p->post[j].kind != P_SCALE || !(p->post[j].scale >= 1.0)) return false;
  return true;
}

static slapo_status gemm_grads(slapo_ctx *ctx, const plan *p, slapo_node *const *in,
                               slapo_node *g, const bool *need, slapo_node **acc);

/* Whether post-op k's gradient needs its input (which the fused GEMM
 * never writes): a gelu's, a relu's whose mask y does not give. */
static bool needs_input(const plan *p, int k) {
  post_kind q = p->post[k].kind;
  return q == P_GELU_TANH || q == P_GELU_ERF || (q == P_RELU && !relu_mask_from_y(p, k));
}

static slapo_status fwd_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  const plan *p = &of(node->op)->p;
  slapo_node *const *in = node->inputs;
  /* val[k]: the input of post-op k (val[0] = z, the GEMM's output with
   * bias), recomputed up to the last one a gradient needs. */
  int upto = -1;
  for (int k = 0; k < p->n_post; k++)
    if (needs_input(p, k)) upto = k;
  slapo_node *val[MAX_POST + 1] = {0};
  slapo_node *sin[3];
  slapo_attr ca[4];
  slapo_node sh = p->conv ? conv_shadow(node, p, sin, ca) : *node;
  if (upto >= 0) {
    val[0] = p->conv ? slapo_op_apply(ctx, SLAPO_OP_DESC(conv2d), sh.n_inputs, sin, 4, ca)
                     : slapo_linear(ctx, in[p->x], in[p->w], p->b >= 0 ? in[p->b] : NULL);
    for (int k = 0; k < upto; k++) val[k + 1] = apply_post(ctx, &p->post[k], val[k], in);
  }
  slapo_node *acc[MAX_IN] = {0}, *g = dy;
  for (int k = p->n_post - 1; k >= 0; k--) {
    const post *q = &p->post[k];
    slapo_attr a;
    switch (q->kind) {
    case P_SCALE: g = slapo_mul_scalar(ctx, g, q->scale); break;
    case P_SHIFT: break;
    case P_ADD:
      if (need[q->in]) acc[q->in] = accumulate(ctx, acc[q->in], g);
      break;
    case P_RELU:
      g = slapo_op_apply(ctx, SLAPO_OP_DESC(relu_backward), 2,
                         (slapo_node *[]){val[k] ? val[k] : node, g}, 0, NULL);
      break;
    case P_GELU_TANH:
    case P_GELU_ERF:
      a = slapo_attr_str("approximate", q->kind == P_GELU_TANH ? "tanh" : "none");
      g = slapo_op_apply(ctx, SLAPO_OP_DESC(gelu_backward), 2, (slapo_node *[]){val[k], g}, 1,
                         &a);
      break;
    }
  }
  if (p->conv) {
    /* g: the gradient of z = conv2d(x, w, b), through conv2d's own rule. */
    bool cneed[3] = {need[p->x], need[p->w], p->b >= 0 && need[p->b]};
    slapo_node *cdx[3] = {0};
    SLAPO_TRY(SLAPO_OP_DESC(conv2d)->backward(ctx, &sh, g, cneed, cdx));
    int idx[3] = {p->x, p->w, p->b};
    for (int i = 0; i < sh.n_inputs; i++)
      if (cneed[i]) acc[idx[i]] = accumulate(ctx, acc[idx[i]], cdx[i]);
  } else {
    SLAPO_TRY(gemm_grads(ctx, p, in, g, need, acc));
  }
  for (int i = 0; i < p->n_in; i++)
    if (need[i])
      dx[i] = acc[i] ? acc[i] : slapo_full(ctx, in[i]->ndim, in[i]->shape, 0.0);
  return slapo_ctx_status(ctx);
}

/* The gradients of z = x w^T + b from g, as linear's rule takes them, added
 * into acc. */
static slapo_status gemm_grads(slapo_ctx *ctx, const plan *p, slapo_node *const *in,
                               slapo_node *g, const bool *need, slapo_node **acc) {
  slapo_node *x = in[p->x], *w = in[p->w];
  int nd = x->ndim;
  int64_t rows = rows_of(x), K = w->shape[1], N = w->shape[0];
  if (need[p->x]) acc[p->x] = accumulate(ctx, acc[p->x], slapo_matmul(ctx, g, w, false, false));
  if (need[p->w]) {
    slapo_node *g2 = nd == 2 ? g : slapo_reshape(ctx, g, 2, (int64_t[]){rows, N});
    slapo_node *x2 = nd == 2 ? x : slapo_reshape(ctx, x, 2, (int64_t[]){rows, K});
    acc[p->w] = accumulate(ctx, acc[p->w], slapo_matmul(ctx, g2, x2, true, false));
  }
  if (p->b >= 0 && need[p->b]) {
    int64_t axes[SLAPO_MAX_DIMS];
    for (int i = 0; i < nd - 1; i++) axes[i] = i;
    acc[p->b] = accumulate(ctx, acc[p->b], slapo_sum(ctx, g, nd - 1, axes, false));
  }
  return slapo_ctx_status(ctx);
}

/* ---- compile: the region as a plan ---- */

static int input_index(slapo_node *const *ph, int n, const slapo_node *v) {
  for (int i = 0; i < n; i++)
    if (ph[i] == v) return i;
  return -1;
}

static slapo_status parse(const slapo_graph *region, plan *p, char *desc, size_t cap) {
  slapo_node *ph[MAX_IN], *ops[MAX_POST + 2], *out = NULL;
  int n_ops = 0;
  memset(p, 0, sizeof *p);
  p->b = -1;
  for (slapo_node *r = slapo_graph_first(region); r; r = r->next) {
    if (r->kind == SLAPO_NODE_PLACEHOLDER) {
      if (p->n_in == MAX_IN)
        return slapo_error(SLAPO_UNSUPPORTED, "dnnl: more than %d inputs", MAX_IN);
      ph[p->n_in++] = r;
    } else if (r->kind == SLAPO_NODE_CALL_OP) {
      if (n_ops == MAX_POST + 2)
        return slapo_error(SLAPO_UNSUPPORTED, "dnnl: more than %d post-ops", MAX_POST);
      ops[n_ops++] = r;
    } else if (r->kind == SLAPO_NODE_OUTPUT) {
      out = r;
    }
  }
  if (n_ops == 0 || !out || out->n_inputs != 1)
    return slapo_error(SLAPO_UNSUPPORTED, "dnnl: the region must start with a matmul or linear");
  slapo_node *g0 = ops[0];
  bool is_linear = g0->op == SLAPO_OP_DESC(linear), is_mm = g0->op == SLAPO_OP_DESC(matmul);
  p->conv = g0->op == SLAPO_OP_DESC(conv2d);
  if (!is_linear && !is_mm && !p->conv)
    return slapo_error(SLAPO_UNSUPPORTED, "dnnl: the region must start with a matmul, linear or "
                       "conv2d, not %s (%%%s)", g0->op->name, g0->name);
  if (is_mm &&
      (slapo_node_attr_int(g0, "trans_b", 0) != 1 || slapo_node_attr_int(g0, "trans_a", 0)))
    return slapo_error(SLAPO_UNSUPPORTED, "dnnl: matmul (%%%s) must be matmul(x, w, trans_b=1) "
                       "with w [N, K]", g0->name);
  for (int i = 0; i < g0->n_inputs; i++)
    if (input_index(ph, p->n_in, g0->inputs[i]) < 0)
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: %s (%%%s): its operands must be region inputs",
                         g0->op->name, g0->name);
  p->x = input_index(ph, p->n_in, g0->inputs[0]);
  p->w = input_index(ph, p->n_in, g0->inputs[1]);
  if (g0->n_inputs == 3) p->b = input_index(ph, p->n_in, g0->inputs[2]);
  size_t used;
  if (p->conv) {
    const slapo_attr *a[3] = {slapo_node_attr(g0, "stride"), slapo_node_attr(g0, "padding"),
                              slapo_node_attr(g0, "dilation")};
    int64_t *dst[3] = {p->stride, p->pad, p->dil}, dflt[3] = {1, 0, 1};
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++)
        dst[i][j] = a[i] && a[i]->kind == SLAPO_ATTR_INTS && a[i]->n == 2 ? a[i]->ints[j] : dflt[i];
    p->groups = slapo_node_attr_int(g0, "groups", 1);
    used = (size_t)snprintf(desc, cap, "dnnl1 conv n%d x%d w%d s%lld,%lld p%lld,%lld d%lld,%lld "
                            "g%lld", p->n_in, p->x, p->w, (long long)p->stride[0],
                            (long long)p->stride[1], (long long)p->pad[0], (long long)p->pad[1],
                            (long long)p->dil[0], (long long)p->dil[1], (long long)p->groups);
  } else {
    if (g0->inputs[0]->ndim < 2 || g0->inputs[1]->ndim != 2)
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: %s (%%%s): x must be [.., K] with 2 or more "
                         "dims and w [N, K]", g0->op->name, g0->name);
    used = (size_t)snprintf(desc, cap, "dnnl1 n%d x%d w%d", p->n_in, p->x, p->w);
  }
  for (int k = 1; k < n_ops; k++) {
    slapo_node *n = ops[k], *prev = ops[k - 1];
    if (prev->n_users != 1)
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: %%%s is used %d times; only a chain of "
                         "post-ops fuses", prev->name, prev->n_users);
    const slapo_op *op = n->op;
    int at = n->n_inputs > 0 && n->inputs[0] == prev   ? 0
             : n->n_inputs > 1 && n->inputs[1] == prev ? 1
                                                       : -1;
    if (at < 0)
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: %s (%%%s) does not take %%%s; only a chain of "
                         "post-ops fuses", op->name, n->name, prev->name);
    post q = {0};
    if (op == SLAPO_OP_DESC(relu)) {
      q.kind = P_RELU;
    } else if (op == SLAPO_OP_DESC(gelu)) {
      const char *a = slapo_node_attr_str(n, "approximate", "none");
      q.kind = !strcmp(a, "tanh") ? P_GELU_TANH : P_GELU_ERF;
    } else if (op == SLAPO_OP_DESC(mul_scalar)) {
      q.kind = P_SCALE, q.scale = slapo_node_attr_float(n, "value", 1.0);
    } else if (op == SLAPO_OP_DESC(add_scalar)) {
      q.kind = P_SHIFT, q.scale = slapo_node_attr_float(n, "value", 0.0);
    } else if (op == SLAPO_OP_DESC(add)) {
      const slapo_node *o = n->inputs[1 - at];
      int oi = input_index(ph, p->n_in, o);
      if (oi < 0 || o == prev)
        return slapo_error(SLAPO_UNSUPPORTED, "dnnl: add (%%%s): the other operand must be a "
                           "region input", n->name);
      bool row = o->ndim == 1 && o->shape[0] == n->shape[n->ndim - 1];
      if (row && k == 1 && p->b < 0 && !p->conv) {
        p->b = oi; /* the bias of matmul + add, as oneDNN's bias argument */
        continue;
      }
      if (!slapo_shape_equal(o->ndim, o->shape, n->ndim, n->shape))
        return slapo_error(SLAPO_UNSUPPORTED, "dnnl: add (%%%s) of a %d-d input that is neither "
                           "the [N] bias right after the GEMM nor a full-shape residual; oneDNN's "
                           "binary post-op is only used for those", n->name, o->ndim);
      q.kind = P_ADD, q.in = oi;
    } else {
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: %s (%%%s) has no oneDNN post-op", op->name,
                         n->name);
    }
    if (p->n_post == MAX_POST)
      return slapo_error(SLAPO_UNSUPPORTED, "dnnl: more than %d post-ops", MAX_POST);
    p->post[p->n_post++] = q;
    used += (size_t)snprintf(desc + used, used < cap ? cap - used : 0, " p%d:%a:%d", q.kind,
                             q.scale, q.in);
  }
  if (out->inputs[0] != ops[n_ops - 1])
    return slapo_error(SLAPO_UNSUPPORTED, "dnnl: the region's result is not its last op");
  snprintf(desc + used, used < cap ? cap - used : 0, " b%d", p->b);
  return used < cap ? SLAPO_OK : slapo_error(SLAPO_LIMIT, "dnnl: region too long");
}

/* Whether the backward would recompute the GEMM (a gelu's input, a relu
 * whose mask y does not give). */
static bool recomputes(const plan *p) {
  for (int k = 0; k < p->n_post; k++)
    if (needs_input(p, k)) return true;
  return false;
}

/* Options: recompute=allowed (the default) or never, which refuses a
 * region whose backward would run the GEMM again (compiler=auto asks for
 * it: in training that GEMM costs more than the passes the fusion saves). */
static slapo_status read_opts(const slapo_compile_opts *opts, bool *never) {
  *never = false;
  for (int i = 0; opts && i < opts->n; i++) {
    if (strcmp(opts->keys[i], "recompute"))
      return slapo_error(SLAPO_INVALID_ARG, "dnnl: unknown option '%s' (the dnnl backend takes "
                         "recompute=allowed|never)", opts->keys[i]);
    if (strcmp(opts->values[i], "allowed") && strcmp(opts->values[i], "never"))
      return slapo_error(SLAPO_INVALID_ARG, "dnnl: recompute=%s; expected allowed or never",
                         opts->values[i]);
    *never = !strcmp(opts->values[i], "never");
  }
  return SLAPO_OK;
}

static slapo_status dnnl_compile(const slapo_graph *region, const char *name,
                                 const slapo_compile_opts *opts, const slapo_op **out) {
  *out = NULL;
  bool never;
  SLAPO_TRY(read_opts(opts, &never));
  plan p;
  char desc[512];
  SLAPO_TRY(parse(region, &p, desc, sizeof desc));
  if (never && recomputes(&p))
    return slapo_error(SLAPO_UNSUPPORTED, "dnnl: the backward of this epilogue would recompute "
                       "the GEMM (a gelu, or a relu followed by more than scales >= 1) and "
                       "recompute=never");
  char op_name[112];
  snprintf(op_name, sizeof op_name, "%s_%08llx", name,
           (unsigned long long)(slapo_hash_str(desc) & 0xffffffffu));
  if ((*out = slapo_op_find(op_name))) return SLAPO_OK; /* the same region fused before */
  dnnl_op *c = slapo_calloc(1, sizeof *c); /* lives until exit, like every registered op */
  if (!c) return slapo_error(SLAPO_NOMEM, "dnnl: out of memory");
  c->p = p;
  slapo__dnnl_cache_init(&c->cache, c->slots, CACHE_CAP);
  memcpy(c->name, op_name, sizeof op_name);
  c->fwd = (slapo_op){
      .name = c->name,
      .n_inputs = p.n_in,
      .infer = fwd_infer,
      .ref = fwd_ref,
      .fast = fwd_fast,
      .backward = fwd_backward,
      .contiguous_inputs = true,
      .doc = "a GEMM with bias and post-ops, one oneDNN matmul (dnnl backend); the backward "
             "recomputes the pre-activation (one extra GEMM) when a gelu needs it",
      .test = {.exempt = "registered at run time; tested against the none backend"},
  };
  SLAPO_TRY(slapo_op_register(&c->fwd));
  *out = &c->fwd;
  return SLAPO_OK;
}

const slapo_compiler slapo__compiler_dnnl = {
    .name = "dnnl",
    .summary = "a matmul/linear with its bias and a chain of relu, gelu, scale and residual add "
               "as one oneDNN matmul primitive with post-ops",
    .compile = dnnl_compile,
};
