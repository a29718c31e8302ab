/* ops/conv.c - "conv2d": 2-D cross-correlation over x [N, C, H, W] with
 * weight [O, C/G, KH, KW] and an optional bias [O] (PyTorch nn.Conv2d /
 * nn.functional.conv2d: stride, zero padding, dilation with 1 = dense,
 * groups G), and its backward-only ops "conv2d_backward_data" (dx) and
 * "conv2d_backward_weights" (dw); db is dy summed over N, OH, OW. Math:
 *   y[n, o, i, j] = b[o] + sum_{c, p, q} x[n, g C/G + c, i sh - ph + p dh,
 *                   j sw - pw + q dw] * w[o, c, p, q],  g = o / (O/G),
 *   OH = floor((H + 2 ph - dh (KH - 1) - 1) / sh) + 1 (likewise OW),
 * out-of-range x reading as 0 (PyTorch Conv2d docs; Dumoulin & Visin 2016,
 * "A guide to convolution arithmetic for deep learning", relationships 1-8,
 * where dx is the transposed convolution of dy and dw the correlation of x
 * with dy). Reference kernels: direct loops with one double accumulator per
 * output element; fast kernels: oneDNN 2.6 convolution forward, backward
 * data and backward weights primitives on plain NCHW / OIHW (GOIHW) memory,
 * cached per problem. Each op's two tensor operands are both f32 or both
 * bf16 (autocast); bias and result are f32. bf16 operands are widened to
 * f32 (exact) for the oneDNN kernels, and read widened by the reference
 * ones: bf16 numerics, f32 speed (no bf16 convolution kernel yet). Layer:
 * ops. */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "slapo/ops/dnnl_cache.h"
#include "ops/internal.h"

/* ---- geometry ---- */

/* One convolution problem, in elements; also the primitive cache's key, so
 * it is zeroed before filling and compared as bytes. */
typedef struct conv_geom {
  int64_t N, C, H, W;    /* x  [N, C, H, W]        */
  int64_t O, KH, KW;     /* w  [O, C/G, KH, KW]    */
  int64_t OH, OW;        /* y  [N, O, OH, OW]      */
  int64_t G;             /* groups                 */
  int64_t s[2], p[2], d[2];
} conv_geom;

/* Reads stride / padding / dilation ([h, w] ints) and groups from node,
 * with PyTorch's defaults (1, 0, 1, 1); false when an attribute has the
 * wrong kind or count. */
static bool read_ints2(const slapo_node *node, const char *key, int64_t dflt, int64_t v[2]) {
  const slapo_attr *a = slapo_node_attr(node, key);
  v[0] = v[1] = dflt;
  if (!a) return true;
  if (a->kind != SLAPO_ATTR_INTS || a->n != 2) return false;
  v[0] = a->ints[0], v[1] = a->ints[1];
  return true;
}

static slapo_status read_attrs(const slapo_node *node, conv_geom *g) {
  const char *op = node->op->name;
  if (!read_ints2(node, "stride", 1, g->s) || !read_ints2(node, "padding", 0, g->p) ||
      !read_ints2(node, "dilation", 1, g->d))
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: stride, padding and dilation must be 2 ints [h, w]", op);
  g->G = slapo_node_attr_int(node, "groups", 1);
  for (int i = 0; i < 2; i++)
    if (g->s[i] < 1 || g->p[i] < 0 || g->d[i] < 1)
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: stride [%lld, %lld] and dilation [%lld, %lld] must be >= 1, "
                         "padding [%lld, %lld] >= 0",
                         op, (long long)g->s[0], (long long)g->s[1], (long long)g->d[0],
                         (long long)g->d[1], (long long)g->p[0], (long long)g->p[1]);
  if (g->G < 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: groups %lld must be >= 1", op, (long long)g->G);
  return SLAPO_OK;
}

/* Output extent along one axis (PyTorch's formula); <= 0 when the dilated
 * kernel does not fit in the padded input. */
static int64_t out_extent(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

/* Checks x's channels against w and groups and the kernel against the
 * padded input, then sets g->OH, g->OW. xs, ws: the shapes as text. */
static slapo_status check_geom(const char *op, conv_geom *g, const char *xs, const char *ws) {
  if (g->C % g->G != 0)
    return slapo_error(SLAPO_SHAPE, "%s: x %s has %lld channels, not divisible by groups %lld",
                       op, xs, (long long)g->C, (long long)g->G);
  if (g->O % g->G != 0)
    return slapo_error(SLAPO_SHAPE,
                       "%s: w %s has %lld output channels, not divisible by groups %lld", op,
                       ws, (long long)g->O, (long long)g->G);
  int64_t eh = g->d[0] * (g->KH - 1) + 1, ew = g->d[1] * (g->KW - 1) + 1;
  if (eh > g->H + 2 * g->p[0] || ew > g->W + 2 * g->p[1])
    return slapo_error(SLAPO_SHAPE,
                       "%s: x %s and w %s: the dilated kernel %lld x %lld (dilation [%lld, "
                       "%lld]) is larger than the padded input %lld x %lld (padding [%lld, "
                       "%lld])",
                       op, xs, ws, (long long)eh, (long long)ew, (long long)g->d[0],
                       (long long)g->d[1], (long long)(g->H + 2 * g->p[0]),
                       (long long)(g->W + 2 * g->p[1]), (long long)g->p[0], (long long)g->p[1]);
  g->OH = out_extent(g->H, g->KH, g->s[0], g->p[0], g->d[0]);
  g->OW = out_extent(g->W, g->KW, g->s[1], g->p[1], g->d[1]);
  return SLAPO_OK;
}

static void set_x(conv_geom *g, const int64_t *x) {
  g->N = x[0], g->C = x[1], g->H = x[2], g->W = x[3];
}
static void set_w(conv_geom *g, const int64_t *w) { g->O = w[0], g->KH = w[2], g->KW = w[3]; }

/* The geometry of a node of any of the three ops, from its inputs' and its
 * own (already inferred) shapes: conv2d (x, w[, b]) -> y, backward_data
 * (dy, w) -> dx, backward_weights (x, dy) -> dw. */
static void geom_of(const slapo_node *node, conv_geom *g) {
  memset(g, 0, sizeof *g);
  SLAPO_ASSERT(read_attrs(node, g) == SLAPO_OK);
  const slapo_node *a = node->inputs[0], *b = node->inputs[1];
  if (slapo_node_is_op(node, SLAPO_OP_DESC(conv2d))) {
    set_x(g, a->shape), set_w(g, b->shape);
  } else if (slapo_node_is_op(node, SLAPO_OP_DESC(conv2d_backward_data))) {
    set_x(g, node->shape), set_w(g, b->shape);
  } else {
    set_x(g, a->shape), set_w(g, node->shape);
  }
  g->OH = out_extent(g->H, g->KH, g->s[0], g->p[0], g->d[0]);
  g->OW = out_extent(g->W, g->KW, g->s[1], g->p[1], g->d[1]);
}

/* Requires input i to be a 4-d tensor (its dtype: slapo__want_gemm_operands);
 * `name` and `layout` name it in the message ("x", "[N, C, H, W]"). */
static slapo_status want4(const slapo_node *node, int i, const char *name, const char *layout) {
  const slapo_node *t = node->inputs[i];
  if (t->ndim != 4)
    return slapo_error(SLAPO_SHAPE, "%s: %s %s must be 4-d %s", node->op->name, name,
                       slapo__shape_of(t), layout);
  return SLAPO_OK;
}

/* Reads a [h, w] ints attribute that backward ops require. */
static slapo_status want_hw(const slapo_node *node, const char *key, int64_t hw[2]) {
  if (!read_ints2(node, key, -1, hw) || hw[0] < 1 || hw[1] < 1)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %s must be 2 positive ints [h, w]",
                       node->op->name, key);
  return SLAPO_OK;
}

/* ---- conv2d: shape inference ---- */

static slapo_status conv2d_infer(slapo_node *node) {
  if (node->n_inputs < 2 || node->n_inputs > 3)
    return slapo_error(SLAPO_INVALID_ARG, "conv2d: expects 2 or 3 inputs (x, w[, b]), got %d",
                       node->n_inputs);
  SLAPO_TRY(slapo__want_gemm_operands(node));
  SLAPO_TRY(want4(node, 0, "x", "[N, C, H, W]"));
  SLAPO_TRY(want4(node, 1, "w", "[O, C/groups, KH, KW]"));
  const slapo_node *x = node->inputs[0], *w = node->inputs[1];
  conv_geom g = {0};
  SLAPO_TRY(read_attrs(node, &g));
  set_x(&g, x->shape), set_w(&g, w->shape);
  const char *xs = slapo__shape_of(x), *ws = slapo__shape_of(w);
  SLAPO_TRY(check_geom("conv2d", &g, xs, ws));
  if (w->shape[1] * g.G != g.C)
    return slapo_error(SLAPO_SHAPE,
                       "conv2d: x %s and w %s: w has %lld input channels per group, but x's "
                       "%lld channels in %lld group(s) need %lld (w is [O, C/groups, KH, KW])",
                       xs, ws, (long long)w->shape[1], (long long)g.C, (long long)g.G,
                       (long long)(g.C / g.G));
  if (node->n_inputs == 3) {
    SLAPO_TRY(slapo__want_dtype(node, 2, SLAPO_DTYPE_F32));
    const slapo_node *b = node->inputs[2];
    if (b->ndim != 1 || b->shape[0] != g.O)
      return slapo_error(SLAPO_SHAPE, "conv2d: b %s does not match w %s: expected [%lld]",
                         slapo__shape_of(b), ws, (long long)g.O);
  }
  int64_t shape[4] = {g.N, g.O, g.OH, g.OW};
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 4, shape);
}

/* ---- reference kernels ---- */

/* An operand's data, f32 or bf16; at() reads element i as f32 (bf16
 * widened exactly). */
typedef struct operand {
  const void *p;
  bool bf16;
} operand;

static operand operand_of(const slapo_tensor *t) {
  return (operand){slapo_tensor_data(t), t->dtype == SLAPO_DTYPE_BF16};
}

static inline double at(operand o, int64_t i) {
  return o.bf16 ? (double)slapo_bf16_to_f32(((const uint16_t *)o.p)[i]) : (double)((const float *)o.p)[i];
}

static void conv2d_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  conv_geom g;
  geom_of(node, &g);
  const operand x = operand_of(in[0]);                                  /* x [N, C, H, W]    */
  const operand w = operand_of(in[1]);                                  /* w [O, Cg, KH, KW] */
  const float *b = node->n_inputs == 3 ? slapo_tensor_data(in[2]) : NULL; /* b [O]           */
  float *y = slapo_tensor_data(out);                                    /* y [N, O, OH, OW]  */
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const int64_t work = g.N * g.O * g.OH * g.OW * Cg * g.KH * g.KW; /* multiply-adds */
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(static)
  for (int64_t no = 0; no < g.N * g.O; no++) {
    int64_t n = no / g.O, o = no % g.O, c0 = o / Og * Cg;
    for (int64_t i = 0; i < g.OH; i++)
      for (int64_t j = 0; j < g.OW; j++) {
        double acc = 0;
        for (int64_t c = 0; c < Cg; c++)
          for (int64_t p = 0; p < g.KH; p++) {
            int64_t ih = i * g.s[0] - g.p[0] + p * g.d[0];
            if (ih < 0 || ih >= g.H) continue;
            int64_t xr = ((n * g.C + c0 + c) * g.H + ih) * g.W; /* x row [W] */
            int64_t wr = ((o * Cg + c) * g.KH + p) * g.KW;      /* w row [KW] */
            for (int64_t q = 0; q < g.KW; q++) {
              int64_t iw = j * g.s[1] - g.p[1] + q * g.d[1];
              if (iw >= 0 && iw < g.W) acc += at(x, xr + iw) * at(w, wr + q);
            }
          }
        if (b) acc += b[o];
        y[(no * g.OH + i) * g.OW + j] = (float)acc;
      }
  }
}

/* dx[n, c, h, v] = sum over o in c's group, p, q with h = i sh - ph + p dh
 * and v = j sw - pw + q dw for some output position (i, j) of
 * dy[n, o, i, j] * w[o, c - g Cg, p, q]. */
static void backward_data_ref(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  conv_geom g;
  geom_of(node, &g);
  const operand dy = operand_of(in[0]); /* dy [N, O, OH, OW]  */
  const operand w = operand_of(in[1]);  /* w  [O, Cg, KH, KW] */
  float *dx = slapo_tensor_data(out);   /* dx [N, C, H, W]    */
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const int64_t work = g.N * g.O * g.OH * g.OW * Cg * g.KH * g.KW; /* multiply-adds */
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(static)
  for (int64_t nc = 0; nc < g.N * g.C; nc++) {
    int64_t n = nc / g.C, c = nc % g.C, o0 = c / Cg * Og, cl = c % Cg;
    for (int64_t h = 0; h < g.H; h++)
      for (int64_t v = 0; v < g.W; v++) {
        double acc = 0;
        for (int64_t o = o0; o < o0 + Og; o++)
          for (int64_t p = 0; p < g.KH; p++) {
            int64_t ti = h + g.p[0] - p * g.d[0];
            if (ti < 0 || ti % g.s[0] != 0 || ti / g.s[0] >= g.OH) continue;
            int64_t dyr = ((n * g.O + o) * g.OH + ti / g.s[0]) * g.OW; /* dy row [OW] */
            int64_t wr = ((o * Cg + cl) * g.KH + p) * g.KW;            /* w row [KW] */
            for (int64_t q = 0; q < g.KW; q++) {
              int64_t tj = v + g.p[1] - q * g.d[1];
              if (tj < 0 || tj % g.s[1] != 0 || tj / g.s[1] >= g.OW) continue;
              acc += at(dy, dyr + tj / g.s[1]) * at(w, wr + q);
            }
          }
        dx[(nc * g.H + h) * g.W + v] = (float)acc;
      }
  }
}

/* dw[o, c, p, q] = sum over n, i, j of dy[n, o, i, j] *
 * x[n, g Cg + c, i sh - ph + p dh, j sw - pw + q dw]. */
static void backward_weights_ref(const slapo_node *node, const slapo_tensor *const *in,
                                 slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  conv_geom g;
  geom_of(node, &g);
  const operand x = operand_of(in[0]);  /* x  [N, C, H, W]    */
  const operand dy = operand_of(in[1]); /* dy [N, O, OH, OW]  */
  float *dw = slapo_tensor_data(out);   /* dw [O, Cg, KH, KW] */
  const int64_t Cg = g.C / g.G, Og = g.O / g.G;
  const int64_t work = g.N * g.O * g.OH * g.OW * Cg * g.KH * g.KW; /* multiply-adds */
#pragma omp parallel for num_threads(slapo__threads_for(work)) schedule(static)
  for (int64_t oc = 0; oc < g.O * Cg; oc++) {
    int64_t o = oc / Cg, c = o / Og * Cg + oc % Cg;
    for (int64_t p = 0; p < g.KH; p++)
      for (int64_t q = 0; q < g.KW; q++) {
        double acc = 0;
        for (int64_t n = 0; n < g.N; n++)
          for (int64_t i = 0; i < g.OH; i++) {
            int64_t ih = i * g.s[0] - g.p[0] + p * g.d[0];
            if (ih < 0 || ih >= g.H) continue;
            int64_t xr = ((n * g.C + c) * g.H + ih) * g.W;   /* x row [W]   */
            int64_t dyr = ((n * g.O + o) * g.OH + i) * g.OW; /* dy row [OW] */
            for (int64_t j = 0; j < g.OW; j++) {
              int64_t iw = j * g.s[1] - g.p[1] + q * g.d[1];
              if (iw >= 0 && iw < g.W) acc += at(dy, dyr + j) * at(x, xr + iw);
            }
          }
        dw[(oc * g.KH + p) * g.KW + q] = (float)acc;
      }
  }
}

/* ---- oneDNN fast kernels ---- */

enum { FWD, BWD_DATA, BWD_WEIGHTS };

/* The cache key: the problem, which primitive, the bias, and the OpenMP
 * thread count (dnnl fixes its work split at creation). */
typedef struct conv_key {
  conv_geom g;
  int kind, has_bias, nthr;
} conv_key;
_Static_assert(sizeof(conv_key) <= SLAPO__DNNL_KEY_MAX, "the cache's key room");

/* Arguments in dnnl's order for each kind; MEM_BIAS only for FWD. */
enum { MEM_0, MEM_1, MEM_OUT, MEM_BIAS, N_MEM };

/* The cache's create function: the primitive of the key ud and its memory
 * objects; false when oneDNN refuses. Every kind is created from the
 * forward descriptor (a backward primitive needs it as a hint). */
static bool entry_create(slapo__dnnl_entry *e, const void *ud) {
  const conv_key *k = ud;
  dnnl_engine_t eng = slapo__dnnl_engine();
  const conv_geom *g = &k->g;
  dnnl_dims_t xd = {g->N, g->C, g->H, g->W}, yd = {g->N, g->O, g->OH, g->OW}, bd = {g->O};
  dnnl_dims_t wd = {g->G, g->O / g->G, g->C / g->G, g->KH, g->KW};
  /* dnnl counts dilation from 0 (dense); the right padding equal to the
   * left reproduces PyTorch's floor in the output extent. */
  dnnl_dims_t st = {g->s[0], g->s[1]}, dil = {g->d[0] - 1, g->d[1] - 1};
  dnnl_dims_t pad = {g->p[0], g->p[1]};
  dnnl_memory_desc_t xmd, wmd, ymd, bmd;
  bool grouped = g->G > 1;
  if (dnnl_memory_desc_init_by_tag(&xmd, 4, xd, dnnl_f32, dnnl_nchw) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&ymd, 4, yd, dnnl_f32, dnnl_nchw) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&wmd, grouped ? 5 : 4, grouped ? wd : wd + 1, dnnl_f32,
                                   grouped ? dnnl_goihw : dnnl_oihw) != dnnl_success ||
      dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x) != dnnl_success)
    return false;
  dnnl_convolution_desc_t fd, bd_desc;
  dnnl_primitive_desc_t fpd = NULL, pd = NULL;
  bool bias = k->kind == FWD && k->has_bias;
  if (dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                 dnnl_convolution_direct, &xmd, &wmd,
                                                 bias ? &bmd : NULL, &ymd, st, dil, pad,
                                                 pad) != dnnl_success ||
      dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL) != dnnl_success)
    return false;
  dnnl_status_t s = dnnl_success;
  if (k->kind == FWD) {
    pd = fpd, fpd = NULL;
  } else {
    s = k->kind == BWD_DATA
            ? dnnl_dilated_convolution_backward_data_desc_init(
                  &bd_desc, dnnl_convolution_direct, &xmd, &wmd, &ymd, st, dil, pad, pad)
            : dnnl_dilated_convolution_backward_weights_desc_init(
                  &bd_desc, dnnl_convolution_direct, &xmd, &wmd, NULL, &ymd, st, dil, pad, pad);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &bd_desc, NULL, eng, fpd);
    dnnl_primitive_desc_destroy(fpd);
    if (s != dnnl_success) return false;
  }
  s = dnnl_primitive_create(&e->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (s != dnnl_success) {
    e->prim = NULL;
    return false;
  }
  /* Inputs then output: FWD (x, w) -> y, BWD_DATA (dy, w) -> dx,
   * BWD_WEIGHTS (x, dy) -> dw. */
  const dnnl_memory_desc_t *mds[3][N_MEM] = {{&xmd, &wmd, &ymd, bias ? &bmd : NULL},
                                             {&ymd, &wmd, &xmd, NULL},
                                             {&xmd, &ymd, &wmd, NULL}};
  for (int i = 0; i < N_MEM; i++) {
    const dnnl_memory_desc_t *md = mds[k->kind][i];
    if (md && dnnl_memory_create(&e->mem[i], md, eng, DNNL_MEMORY_NONE) != dnnl_success) {
      e->mem[i] = NULL;
      return false;
    }
  }
  return true;
}

/* A small cache: a training step has a handful of distinct convolutions;
 * once full, the least recently used idle entry goes. Static, so LSan sees
 * the primitives as reachable; never freed. */
#define CACHE_CAP 64
static slapo__dnnl_entry g_slots[CACHE_CAP];
static slapo__dnnl_cache g_cache = SLAPO__DNNL_CACHE_INIT(g_slots);

/* Runs kind on in0, in1 (and bias) into out; false when oneDNN cannot, the
 * caller then runs the reference. */
static bool run_dnnl(const slapo_node *node, int kind, const slapo_tensor *const *in,
                     slapo_tensor *out) {
  conv_key k;
  memset(&k, 0, sizeof k);
  geom_of(node, &k.g);
  k.kind = kind;
  k.has_bias = kind == FWD && node->n_inputs == 3;
  k.nthr = omp_get_max_threads();
  dnnl_stream_t stream = slapo__dnnl_stream();
  if (!stream) return false;
  slapo__dnnl_entry local;
  slapo__dnnl_entry *e = slapo__dnnl_acquire(&g_cache, &k, sizeof k, entry_create, &k, &local);
  if (!e) return false;
  /* dnnl reads but never writes the inputs. */
  dnnl_memory_set_data_handle(e->mem[MEM_0], slapo_tensor_data(in[0]));
  dnnl_memory_set_data_handle(e->mem[MEM_1], slapo_tensor_data(in[1]));
  dnnl_memory_set_data_handle(e->mem[MEM_OUT], slapo_tensor_data(out));
  static const int arg[3][N_MEM] = {
      {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS},
      {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC, 0},
      {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, 0}};
  dnnl_exec_arg_t args[N_MEM];
  int nargs = 3;
  for (int i = 0; i < 3; i++) args[i] = (dnnl_exec_arg_t){arg[kind][i], e->mem[i]};
  if (k.has_bias) {
    dnnl_memory_set_data_handle(e->mem[MEM_BIAS], slapo_tensor_data(in[2]));
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->mem[MEM_BIAS]};
  }
  dnnl_status_t st = dnnl_primitive_execute(e->prim, stream, nargs, args);
  if (st == dnnl_success) st = dnnl_stream_wait(stream);
  slapo__dnnl_release(&g_cache, e);
  return st == dnnl_success;
}

/* oneDNN on f32 operands: bf16 ones are widened first (exact: the
 * products are what a bf16 kernel forms, summed in f32); false when
 * oneDNN cannot or the copies do not fit, the caller then runs the
 * reference, which reads bf16 itself. */
static bool run_dnnl_f32(const slapo_node *node, int kind, const slapo_tensor *const *in,
                         slapo_tensor *out) {
  if (in[0]->dtype != SLAPO_DTYPE_BF16) return run_dnnl(node, kind, in, out);
  slapo_tensor *w[2] = {NULL, NULL};
  bool ok = slapo_tensor_to_dtype(in[0], SLAPO_DTYPE_F32, &w[0]) == SLAPO_OK &&
            slapo_tensor_to_dtype(in[1], SLAPO_DTYPE_F32, &w[1]) == SLAPO_OK;
  if (ok) {
    const slapo_tensor *wide[3] = {w[0], w[1], node->n_inputs == 3 ? in[2] : NULL};
    ok = run_dnnl(node, kind, wide, out);
  } else {
    slapo_error_clear();
  }
  slapo_tensor_free(w[0]);
  slapo_tensor_free(w[1]);
  return ok;
}

static void conv2d_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  if (!run_dnnl_f32(node, FWD, in, out)) conv2d_ref(node, in, out, env);
}

static void backward_data_fast(const slapo_node *node, const slapo_tensor *const *in,
                               slapo_tensor *out, const slapo_kernel_env *env) {
  if (!run_dnnl_f32(node, BWD_DATA, in, out)) backward_data_ref(node, in, out, env);
}

static void backward_weights_fast(const slapo_node *node, const slapo_tensor *const *in,
                                  slapo_tensor *out, const slapo_kernel_env *env) {
  if (!run_dnnl_f32(node, BWD_WEIGHTS, in, out)) backward_weights_ref(node, in, out, env);
}

/* ---- backward ---- */

/* The forward's attributes plus `key` = hw, for the backward ops. */
static int backward_attrs(const conv_geom *g, const char *key, const int64_t *hw,
                          slapo_attr *a) {
  a[0] = slapo_attr_ints("stride", 2, g->s);
  a[1] = slapo_attr_ints("padding", 2, g->p);
  a[2] = slapo_attr_ints("dilation", 2, g->d);
  a[3] = slapo_attr_int("groups", g->G);
  a[4] = slapo_attr_ints(key, 2, hw);
  return 5;
}

static slapo_status conv2d_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  slapo_node *x = node->inputs[0], *w = node->inputs[1];
  conv_geom g;
  geom_of(node, &g);
  slapo_attr a[5];
  /* bf16 operands (autocast): dy enters both backward convolutions in
   * bf16, one cast; the weight is cast again where it is read (as the
   * GEMMs do: no bf16 copy kept from the forward); db sums dy in f32. */
  slapo_node *dg = need[0] || need[1] ? slapo__gemm_grad_operand(ctx, node, dy) : dy;
  w = need[0] ? slapo__gemm_recast(ctx, w) : w;
  if (need[0]) {
    /* dx: the transposed convolution of dy; H and W are attributes since
     * several input sizes floor to the same output size. */
    int64_t hw[2] = {g.H, g.W};
    slapo_node *in[2] = {dg, w};
    int na = backward_attrs(&g, "input_hw", hw, a);
    dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(conv2d_backward_data), 2, in, na, a);
  }
  if (need[1]) {
    int64_t hw[2] = {g.KH, g.KW};
    slapo_node *in[2] = {x, dg};
    int na = backward_attrs(&g, "kernel_hw", hw, a);
    dx[1] = slapo_op_apply(ctx, SLAPO_OP_DESC(conv2d_backward_weights), 2, in, na, a);
  }
  if (node->n_inputs == 3 && need[2]) {
    /* db [O] = dy summed over N, OH, OW. */
    dx[2] = slapo_sum(ctx, dy, 3, (const int64_t[]){0, 2, 3}, false);
  }
  return slapo_ctx_status(ctx);
}

/* ---- test examples: every attribute away from its default ---- */

static const int64_t k_stride[2] = {2, 1}, k_padding[2] = {1, 1}, k_dilation[2] = {1, 2};

/* x [2, 4, 7, 6], w [6, 2, 3, 3], b [6], groups 2 -> y [2, 6, 4, 4]. */
static slapo_node *conv2d_example(slapo_ctx *ctx) {
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 4, (int64_t[]){2, 4, 7, 6});
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 4, (int64_t[]){6, 2, 3, 3});
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, (int64_t[]){6});
  return slapo_conv2d(ctx, x, w, b, k_stride, k_padding, k_dilation, 2);
}

static slapo_node *backward_example(slapo_ctx *ctx, bool data) {
  int64_t xs[4] = {2, 4, 7, 6}, ws[4] = {6, 2, 3, 3}, ys[4] = {2, 6, 4, 4};
  slapo_node *dy = slapo_input(ctx, "dy", SLAPO_DTYPE_F32, 4, ys);
  slapo_node *other = data ? slapo_input(ctx, "w", SLAPO_DTYPE_F32, 4, ws)
                           : slapo_input(ctx, "x", SLAPO_DTYPE_F32, 4, xs);
  conv_geom g = {.s = {2, 1}, .p = {1, 1}, .d = {1, 2}, .G = 2};
  slapo_attr a[5];
  int na = backward_attrs(&g, data ? "input_hw" : "kernel_hw",
                          data ? (const int64_t[]){7, 6} : (const int64_t[]){3, 3}, a);
  slapo_node *in[2] = {data ? dy : other, data ? other : dy};
  return slapo_op_apply(ctx,
                        data ? SLAPO_OP_DESC(conv2d_backward_data)
                             : SLAPO_OP_DESC(conv2d_backward_weights),
                        2, in, na, a);
}

static slapo_node *backward_data_example(slapo_ctx *ctx) { return backward_example(ctx, true); }
static slapo_node *backward_weights_example(slapo_ctx *ctx) {
  return backward_example(ctx, false);
}

/* 2 (Cin / groups) kh kw per element of the output: w [Cout, Cin / g, kh, kw]. */
static double conv2d_flops(const slapo_node *n) {
  const slapo_node *w = n->inputs[1];
  return 2.0 * (double)slapo_shape_numel(n->ndim, n->shape) *
         (double)(w->shape[1] * w->shape[2] * w->shape[3]);
}

SLAPO_OP_DESCRIPTOR(conv2d) = {
    .name = "conv2d",
    .flops = conv2d_flops,
    .n_inputs = -1, /* (x, w) or (x, w, b); the count is checked by infer */
    .infer = conv2d_infer,
    .ref = conv2d_ref,
    .fast = conv2d_fast,
    .backward = conv2d_backward,
    .contiguous_inputs = true,
    .doc = "x [N, C, H, W] (*) w [O, C/groups, KH, KW] + b [O] -> [N, O, OH, OW], b optional; "
           "attrs stride, padding, dilation [h, w] (1 = dense), groups "
           "(torch.nn.functional.conv2d; Dumoulin & Visin 2016)",
    /* Each output sums at most 18 products of inputs in [-1, 1]: the
     * default tolerances hold with the 1e-3 step. */
    .test = {.example = conv2d_example},
};

/* ---- conv2d_backward_data ---- */

static slapo_status backward_data_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_gemm_operands(node));
  SLAPO_TRY(want4(node, 0, "dy", "[N, O, OH, OW]"));
  SLAPO_TRY(want4(node, 1, "w", "[O, C/groups, KH, KW]"));
  const slapo_node *dy = node->inputs[0], *w = node->inputs[1];
  conv_geom g = {0};
  int64_t hw[2];
  SLAPO_TRY(read_attrs(node, &g));
  SLAPO_TRY(want_hw(node, "input_hw", hw));
  g.N = dy->shape[0], g.C = w->shape[1] * g.G, g.H = hw[0], g.W = hw[1];
  set_w(&g, w->shape);
  const char *ws = slapo__shape_of(w);
  char xs[96];
  snprintf(xs, sizeof xs, "[%lld, %lld, %lld, %lld]", (long long)g.N, (long long)g.C,
           (long long)g.H, (long long)g.W);
  SLAPO_TRY(check_geom("conv2d_backward_data", &g, xs, ws));
  if (dy->shape[1] != g.O || dy->shape[2] != g.OH || dy->shape[3] != g.OW)
    return slapo_error(SLAPO_SHAPE,
                       "conv2d_backward_data: dy %s does not match w %s and input %s: expected "
                       "[%lld, %lld, %lld, %lld]",
                       slapo__shape_of(dy), ws, xs, (long long)g.N, (long long)g.O,
                       (long long)g.OH, (long long)g.OW);
  int64_t shape[4] = {g.N, g.C, g.H, g.W};
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 4, shape);
}

SLAPO_OP_DESCRIPTOR(conv2d_backward_data) = {
    .name = "conv2d_backward_data",
    .n_inputs = 2,
    .infer = backward_data_infer,
    .ref = backward_data_ref,
    .fast = backward_data_fast,
    .contiguous_inputs = true,
    .doc = "(dy [N, O, OH, OW], w [O, C/groups, KH, KW]) -> dx [N, C, H, W] of conv2d, the "
           "transposed convolution of dy (one kernel instead of an im2col composite); attrs "
           "stride, padding, dilation, groups, input_hw [H, W]",
    .test = {.example = backward_data_example, .checked_by = "conv2d"},
};

/* ---- conv2d_backward_weights ---- */

static slapo_status backward_weights_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_gemm_operands(node));
  SLAPO_TRY(want4(node, 0, "x", "[N, C, H, W]"));
  SLAPO_TRY(want4(node, 1, "dy", "[N, O, OH, OW]"));
  const slapo_node *x = node->inputs[0], *dy = node->inputs[1];
  conv_geom g = {0};
  int64_t hw[2];
  SLAPO_TRY(read_attrs(node, &g));
  SLAPO_TRY(want_hw(node, "kernel_hw", hw));
  set_x(&g, x->shape);
  g.O = dy->shape[1], g.KH = hw[0], g.KW = hw[1];
  const char *xs = slapo__shape_of(x);
  char ws[96];
  snprintf(ws, sizeof ws, "[%lld, %lld, %lld, %lld]", (long long)g.O, (long long)(g.C / g.G),
           (long long)g.KH, (long long)g.KW);
  SLAPO_TRY(check_geom("conv2d_backward_weights", &g, xs, ws));
  if (dy->shape[0] != g.N || dy->shape[2] != g.OH || dy->shape[3] != g.OW)
    return slapo_error(SLAPO_SHAPE,
                       "conv2d_backward_weights: dy %s does not match x %s and kernel %lld x "
                       "%lld: expected [%lld, %lld, %lld, %lld]",
                       slapo__shape_of(dy), xs, (long long)g.KH, (long long)g.KW,
                       (long long)g.N, (long long)g.O, (long long)g.OH, (long long)g.OW);
  int64_t shape[4] = {g.O, g.C / g.G, g.KH, g.KW};
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 4, shape);
}

SLAPO_OP_DESCRIPTOR(conv2d_backward_weights) = {
    .name = "conv2d_backward_weights",
    .n_inputs = 2,
    .infer = backward_weights_infer,
    .ref = backward_weights_ref,
    .fast = backward_weights_fast,
    .contiguous_inputs = true,
    .doc = "(x [N, C, H, W], dy [N, O, OH, OW]) -> dw [O, C/groups, KH, KW] of conv2d, the "
           "correlation of x with dy summed over N; attrs stride, padding, dilation, groups, "
           "kernel_hw [KH, KW]",
    .test = {.example = backward_weights_example, .checked_by = "conv2d"},
};

/* ---- typed builder ---- */

slapo_node *slapo_conv2d(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b,
                         const int64_t stride[2], const int64_t padding[2],
                         const int64_t dilation[2], int64_t groups) {
  static const int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
  slapo_attr a[4] = {slapo_attr_ints("stride", 2, stride ? stride : ones),
                     slapo_attr_ints("padding", 2, padding ? padding : zeros),
                     slapo_attr_ints("dilation", 2, dilation ? dilation : ones),
                     slapo_attr_int("groups", groups)};
  slapo_node *in[3] = {slapo__autocast_operand(ctx, x), slapo__autocast_operand(ctx, w), b};
  if (slapo_ctx_autocast(ctx) != SLAPO_AUTOCAST_BF16_EMULATED)
    return slapo_op_apply(ctx, SLAPO_OP_DESC(conv2d), b ? 3 : 2, in, 4, a);
  /* Emulated: the bias after the rounding point of dy, as linear's. */
  slapo_node *y = slapo__autocast_result(ctx, slapo_op_apply(ctx, SLAPO_OP_DESC(conv2d), 2, in, 4, a));
  if (!b || !y) return y;
  slapo_attr sh = slapo_attr_ints("shape", 3, (int64_t[]){b->ndim == 1 ? b->shape[0] : -1, 1, 1});
  return slapo_add(ctx, y, slapo__call1(ctx, SLAPO_OP_DESC(reshape), b, 1, &sh));
}
