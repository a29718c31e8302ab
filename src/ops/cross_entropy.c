/* ops/cross_entropy.c - mean softmax cross-entropy of logits [.., V] against
 * integer targets [..] with an ignore_index (PyTorch nn.functional.
 * cross_entropy, reduction "mean"), and its fused gradient. Layer: ops.
 *   loss = (1/K) sum over counted rows r of (logsumexp(x_r) - x_r[t_r]),
 *   dx_r = (softmax(x_r) - onehot(t_r)) * dloss / K, zero for skipped rows,
 * K = number of counted rows (loss 0 when K = 0); logsumexp subtracts the row
 * max so logits like 1e4 stay finite (llm.c crossentropy_softmax_backward).
 * A target outside [0, V) that is not ignore_index is skipped like an ignored
 * one: kernels cannot fail, and slapo_step checks targets first
 * (module/index_check.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/internal.h"
#include "slapo/ops/vmath.h"

#define CE_IGNORE_DEFAULT (-100) /* PyTorch's default ignore_index */
#define CE_MAX_PARTIALS 256      /* per-thread partial sums in the fast kernel */

static int64_t index_at(const slapo_tensor *t, int64_t i) {
  if (t->dtype == SLAPO_DTYPE_I32) return ((const int32_t *)slapo_tensor_data(t))[i];
  return ((const int64_t *)slapo_tensor_data(t))[i];
}

/* Whether row target t counts: not ignored and a valid class. */
static bool counted(int64_t t, int64_t V, int64_t ignore) {
  return t != ignore && t >= 0 && t < V;
}

/* logits [R, V], targets [R] of a node's contiguous inputs. */
typedef struct ce_dims {
  int64_t R, V, ignore;
} ce_dims;

static ce_dims dims_of(const slapo_node *node, const slapo_tensor *logits) {
  ce_dims d;
  d.V = logits->shape[logits->ndim - 1];
  d.R = d.V ? slapo_tensor_numel(logits) / d.V : 0;
  d.ignore = slapo_node_attr_int(node, "ignore_index", CE_IGNORE_DEFAULT);
  return d;
}

/* Shared checks: logits f32 [.., V], targets i32/i64 [..] = logits minus the
 * last axis. */
static slapo_status want_logits_targets(const slapo_node *node) {
  SLAPO_TRY(slapo__want_dtype(node, 0, SLAPO_DTYPE_F32));
  SLAPO_TRY(slapo__want_index(node, 1));
  const slapo_node *x = node->inputs[0], *t = node->inputs[1];
  if (x->ndim < 1)
    return slapo_error(SLAPO_SHAPE, "%s: logits %s is a scalar; expected logits [.., V]",
                       node->target, slapo__shape_of(x));
  if (!slapo_shape_equal(x->ndim - 1, x->shape, t->ndim, t->shape)) {
    char want[128];
    return slapo_error(SLAPO_SHAPE,
                       "%s: targets %s do not match logits %s: expected targets %s (the logits' "
                       "shape without the class axis)",
                       node->target, slapo__shape_of(t), slapo__shape_of(x),
                       slapo_shape_str(x->ndim - 1, x->shape, want, sizeof want));
  }
  return SLAPO_OK;
}

/* ---- forward ---- */

static slapo_status cross_entropy_infer(slapo_node *node) {
  SLAPO_TRY(want_logits_targets(node));
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 0, NULL);
}

static void cross_entropy_ref(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* logits  [R, V] */
  float *loss = slapo_tensor_data(out);      /* loss    [] */
  ce_dims d = dims_of(node, in[0]);          /* targets [R] */
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < d.R; r++) {
    int64_t t = index_at(in[1], r);
    if (!counted(t, d.V, d.ignore)) continue;
    const float *xr = x + r * d.V;
    double m = -INFINITY, se = 0;
    for (int64_t v = 0; v < d.V; v++) m = xr[v] > m ? xr[v] : m;
    for (int64_t v = 0; v < d.V; v++) se += exp(xr[v] - m);
    sum += m + log(se) - xr[t];
    count++;
  }
  loss[0] = count ? (float)(sum / (double)count) : 0.0f;
}

/* The fast kernels' row pass: e^(x[v] - m) for v < V (m = the row max),
 * summed in LANES interleaved partial sums (a fixed order, so reproducible)
 * that let the loop vectorize, as in ops/softmax.c. e^ is
 * slapo__exp_bounded_f (ops/vmath.h: float only, ~1 ulp); arguments below -87 (e^-87 ~ 1.6e-38, nothing next
 * to the max's 1) are clamped to -87. */
enum { LANES = 16 };
#define EXP_ARG_MAX_BITS 0x42ae0000u /* 87.0f */

SLAPO__SIMD_FN(float, exp_sum_row, (const float *restrict x, int64_t V, float m), (x, V, m)) {
  float acc[LANES] = {0};
  int64_t v = 0;
  for (; v + LANES <= V; v += LANES)
    for (int l = 0; l < LANES; l++)
      acc[l] += slapo__exp_bounded_f(slapo__clamp_abs(x[v + l] - m, EXP_ARG_MAX_BITS));
  for (int l = 0; v < V; v++, l++)
    acc[l] += slapo__exp_bounded_f(slapo__clamp_abs(x[v] - m, EXP_ARG_MAX_BITS));
  float sum = 0.0f;
  for (int l = 0; l < LANES; l++) sum += acc[l];
  return sum;
}

/* y[v] = e^(y[v] - m) in place, with exp_sum_row's terms and summation
 * order (so its bits), returning the sum. */
SLAPO__SIMD_FN(float, exp_inplace_row, (float *restrict y, int64_t V, float m), (y, V, m)) {
  float acc[LANES] = {0};
  int64_t v = 0;
  for (; v + LANES <= V; v += LANES)
    for (int l = 0; l < LANES; l++) {
      float e = slapo__exp_bounded_f(slapo__clamp_abs(y[v + l] - m, EXP_ARG_MAX_BITS));
      y[v + l] = e;
      acc[l] += e;
    }
  for (int l = 0; v < V; v++, l++) {
    float e = slapo__exp_bounded_f(slapo__clamp_abs(y[v] - m, EXP_ARG_MAX_BITS));
    y[v] = e;
    acc[l] += e;
  }
  float sum = 0.0f;
  for (int l = 0; l < LANES; l++) sum += acc[l];
  return sum;
}

/* y[v] *= k for v < V. */
SLAPO__SIMD_PROC(scale_row, (float *restrict y, int64_t V, float k), (y, V, k)) {
  for (int64_t v = 0; v < V; v++) y[v] *= k;
}

/* Float x as an int32 that orders like x (non-negative floats order like
 * their bit patterns; negative ones reversed, so flip their magnitude bits).
 * The map is its own inverse. Integer max vectorizes; fmaxf does not without
 * -ffast-math (see ops/vmath.h). */
static inline int32_t order_key(float x) {
  int32_t i;
  memcpy(&i, &x, sizeof i);
  return i ^ (int32_t)((uint32_t)(i >> 31) & 0x7fffffffu);
}

/* max_v x[v] for V >= 1, in LANES interleaved integer maxima (exact, so the
 * order does not matter). A NaN maps above +inf or below -inf; either way
 * the row's exponentials then come out NaN, as in the reference. */
SLAPO__SIMD_FN(float, row_max, (const float *restrict x, int64_t V), (x, V)) {
  int32_t acc[LANES];
  for (int l = 0; l < LANES; l++) acc[l] = INT32_MIN;
  int64_t v = 0;
  for (; v + LANES <= V; v += LANES)
    for (int l = 0; l < LANES; l++) {
      int32_t k = order_key(x[v + l]);
      acc[l] = k > acc[l] ? k : acc[l];
    }
  for (int l = 0; v < V; v++, l++) {
    int32_t k = order_key(x[v]);
    acc[l] = k > acc[l] ? k : acc[l];
  }
  int32_t k = acc[0];
  for (int l = 1; l < LANES; l++) k = acc[l] > k ? acc[l] : k;
  k = k ^ (int32_t)((uint32_t)(k >> 31) & 0x7fffffffu);
  float m;
  memcpy(&m, &k, sizeof m);
  return m;
}

/* Fast: each thread sums a contiguous block of rows into its own partial
 * (logsumexp in float per row, vectorized exp_sum_row); partials are added
 * in thread order, so the result is reproducible for a given thread count. */
static void cross_entropy_fast(const slapo_node *node, const slapo_tensor *const *in,
                               slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]); /* logits  [R, V] */
  float *loss = slapo_tensor_data(out);      /* loss    [] */
  ce_dims d = dims_of(node, in[0]);          /* targets [R] */
  double part_sum[CE_MAX_PARTIALS] = {0};
  int64_t part_count[CE_MAX_PARTIALS] = {0};
  int threads = slapo__threads_for(d.R * d.V);
  if (threads > CE_MAX_PARTIALS) threads = CE_MAX_PARTIALS;
#pragma omp parallel num_threads(threads)
  {
    int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t r0 = d.R * tid / nt, r1 = d.R * (tid + 1) / nt;
    double s = 0;
    int64_t c = 0;
    for (int64_t r = r0; r < r1; r++) {
      int64_t t = index_at(in[1], r);
      if (!counted(t, d.V, d.ignore)) continue;
      const float *xr = x + r * d.V;
      float m = row_max(xr, d.V);
      float se = exp_sum_row(xr, d.V, m);
      s += (double)m + log((double)se) - (double)xr[t];
      c++;
    }
    part_sum[tid] = s;
    part_count[tid] = c;
  }
  double sum = 0;
  int64_t count = 0;
  for (int i = 0; i < threads; i++) sum += part_sum[i], count += part_count[i];
  loss[0] = count ? (float)(sum / (double)count) : 0.0f;
}

static slapo_status cross_entropy_backward_rule(slapo_ctx *ctx, slapo_node *node,
                                                slapo_node *dy, const bool *need,
                                                slapo_node **dx) {
  dx[1] = NULL; /* integer targets */
  dx[0] = NULL;
  if (need[0]) {
    slapo_attr a = slapo_attr_int("ignore_index",
                                  slapo_node_attr_int(node, "ignore_index", CE_IGNORE_DEFAULT));
    slapo_node *in[3] = {node->inputs[0], node->inputs[1], dy};
    dx[0] = slapo_op_apply(ctx, SLAPO_OP_DESC(cross_entropy_backward), 3, in, 1, &a);
  }
  return slapo_ctx_status(ctx);
}

static slapo_node *cross_entropy_example(slapo_ctx *ctx) {
  int64_t xs[3] = {2, 3, 5}, ts[2] = {2, 3};
  return slapo_cross_entropy(ctx, slapo_input(ctx, "logits", SLAPO_DTYPE_F32, 3, xs),
                             slapo_input(ctx, "targets", SLAPO_DTYPE_I64, 2, ts), -100);
}

SLAPO_OP_DESCRIPTOR(cross_entropy) = {
    .name = "cross_entropy",
    .n_inputs = 2,
    .infer = cross_entropy_infer,
    .ref = cross_entropy_ref,
    .fast = cross_entropy_fast,
    .backward = cross_entropy_backward_rule,
    .contiguous_inputs = true,
    .doc = "(logits [.., V] f32, targets [..] i32/i64) -> [] mean over counted rows of "
           "logsumexp(row) - row[target]; attr ignore_index (default -100); targets equal to "
           "it or outside [0, V) are skipped; 0 when none count",
    .test = {.example = cross_entropy_example, .lo = -3, .hi = 3, .int_high = 5},
};

/* ---- fused backward ---- */

static slapo_status cross_entropy_backward_infer(slapo_node *node) {
  SLAPO_TRY(want_logits_targets(node));
  SLAPO_TRY(slapo__want_dtype(node, 2, SLAPO_DTYPE_F32));
  const slapo_node *dl = node->inputs[2];
  if (dl->ndim != 0)
    return slapo_error(SLAPO_SHAPE, "cross_entropy_backward: dloss %s must be a scalar []",
                       slapo__shape_of(dl));
  return slapo__same_as_input(node, 0);
}

static int64_t count_rows(const slapo_tensor *targets, const ce_dims *d) {
  int64_t count = 0;
  for (int64_t r = 0; r < d->R; r++) count += counted(index_at(targets, r), d->V, d->ignore);
  return count;
}

static void cross_entropy_backward_ref(const slapo_node *node, const slapo_tensor *const *in,
                                       slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);          /* logits  [R, V] */
  float dloss = *(const float *)slapo_tensor_data(in[2]); /* dloss [] */
  float *dx = slapo_tensor_data(out);                 /* dx      [R, V] */
  ce_dims d = dims_of(node, in[0]);                   /* targets [R] */
  int64_t count = count_rows(in[1], &d);
  double g = count ? (double)dloss / (double)count : 0.0;
  for (int64_t r = 0; r < d.R; r++) {
    int64_t t = index_at(in[1], r);
    const float *xr = x + r * d.V;
    float *dxr = dx + r * d.V;
    if (!counted(t, d.V, d.ignore)) {
      for (int64_t v = 0; v < d.V; v++) dxr[v] = 0.0f;
      continue;
    }
    double m = -INFINITY, se = 0;
    for (int64_t v = 0; v < d.V; v++) m = xr[v] > m ? xr[v] : m;
    for (int64_t v = 0; v < d.V; v++) se += exp(xr[v] - m);
    for (int64_t v = 0; v < d.V; v++)
      dxr[v] = (float)((exp(xr[v] - m) / se - (v == t ? 1.0 : 0.0)) * g);
  }
}

static void cross_entropy_backward_fast(const slapo_node *node, const slapo_tensor *const *in,
                                        slapo_tensor *out, const slapo_kernel_env *env) {
  (void)env;
  const float *x = slapo_tensor_data(in[0]);          /* logits  [R, V] */
  float dloss = *(const float *)slapo_tensor_data(in[2]); /* dloss [] */
  float *dx = slapo_tensor_data(out);                 /* dx      [R, V] */
  ce_dims d = dims_of(node, in[0]);                   /* targets [R] */
  int64_t count = count_rows(in[1], &d);
  float g = count ? (float)((double)dloss / (double)count) : 0.0f;
#pragma omp parallel for num_threads(slapo__threads_for(d.R * d.V)) schedule(static)
  for (int64_t r = 0; r < d.R; r++) {
    int64_t t = index_at(in[1], r);
    const float *xr = x + r * d.V;
    float *dxr = dx + r * d.V;
    if (!counted(t, d.V, d.ignore)) {
      memset(dxr, 0, (size_t)d.V * sizeof(float));
      continue;
    }
    /* dx_r = e^(x - m) * (g / se) - g onehot(t): exponentials stored by the
     * vectorized row pass, then one scaling pass. In place (dx over the
     * logits, whose last reader this is: the planner's usual case) the
     * [R, V] output needs no buffer of its own; out of place the row is
     * copied to dx first. */
    float m = row_max(xr, d.V);
    if (dxr != xr) memcpy(dxr, xr, (size_t)d.V * sizeof(float)); /* a row: in cache */
    float se = exp_inplace_row(dxr, d.V, m);
    scale_row(dxr, d.V, g / se);
    dxr[t] -= g;
  }
}

static slapo_node *cross_entropy_backward_example(slapo_ctx *ctx) {
  int64_t xs[2] = {3, 5}, ts[1] = {3};
  slapo_node *in[3] = {slapo_input(ctx, "logits", SLAPO_DTYPE_F32, 2, xs),
                       slapo_input(ctx, "targets", SLAPO_DTYPE_I32, 1, ts),
                       slapo_input(ctx, "dloss", SLAPO_DTYPE_F32, 0, NULL)};
  slapo_attr a = slapo_attr_int("ignore_index", -100);
  return slapo_op_apply(ctx, SLAPO_OP_DESC(cross_entropy_backward), 3, in, 1, &a);
}

SLAPO_OP_DESCRIPTOR(cross_entropy_backward) = {
    .name = "cross_entropy_backward",
    .n_inputs = 3,
    .infer = cross_entropy_backward_infer,
    .ref = cross_entropy_backward_ref,
    .fast = cross_entropy_backward_fast,
    .contiguous_inputs = true,
    .inplace = true,
    .doc = "(logits [.., V], targets [..], dloss []) -> (softmax(row) - onehot(target)) * "
           "dloss / count, zero rows for skipped targets: one pass per row, where the "
           "composite would materialise log_softmax, a one-hot [.., V] and a mask; attr "
           "ignore_index; in place over the logits where they have no later reader",
    .test = {.example = cross_entropy_backward_example,
             .int_high = 5,
             .checked_by = "cross_entropy composite"},
};

slapo_node *slapo_cross_entropy(slapo_ctx *ctx, slapo_node *logits, slapo_node *targets,
                                int64_t ignore_index) {
  slapo_attr a = slapo_attr_int("ignore_index", ignore_index);
  return slapo__call2(ctx, SLAPO_OP_DESC(cross_entropy), logits, targets, 1, &a);
}
