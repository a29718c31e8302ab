/* dist/vocab_parallel.c - cross-entropy over logits whose class axis is
 * split across a group (Megatron-LM's vocab-parallel loss, Shoeybi et al.
 * 2019, §3): no rank ever holds a full row of logits. Layer: dist.
 *
 *   m_r = max over all ranks' classes of x_r          (all-reduce MAX)
 *   s_r = sum over all ranks' classes exp(x_r - m_r)  (all-reduce SUM)
 *   z_r = x_r[t_r] - m_r on the rank owning t_r, 0 elsewhere (all-reduce SUM)
 *   loss = (1/K) sum over counted rows (log s_r - z_r)
 *   dx_r = (exp(x_r - m_r) / s_r - onehot(t_r)) * dloss / K, own classes only
 *
 * The forward writes one packed f32 buffer [2 + 3R]: loss, K, m[R], s[R],
 * z[R] (the all-reduces run in place there, so the kernel allocates
 * nothing); the loss is read through an unpack view and the backward reads
 * m and s instead of communicating again. Classes at or past `vocab_valid`
 * (a vocabulary padded to a multiple of the group) count as absent. */
#include <math.h>
#include <string.h>

#include "dist/internal.h"

static int64_t index_at(const slapo_tensor *t, int64_t i) {
  if (t->dtype == SLAPO_DTYPE_I32) return ((const int32_t *)slapo_tensor_data(t))[i];
  return ((const int64_t *)slapo_tensor_data(t))[i];
}

typedef struct vp_dims {
  int64_t R, V, start, valid, ignore; /* rows, local classes, first id, ids < valid count */
} vp_dims;

static vp_dims dims_of(const slapo_node *node) {
  const slapo_node *x = node->inputs[0];
  vp_dims d;
  d.V = x->shape[x->ndim - 1];
  d.R = 1;
  for (int i = 0; i < x->ndim - 1; i++) d.R *= x->shape[i];
  d.start = slapo_node_attr_int(node, "vocab_start", 0);
  d.valid = slapo_node_attr_int(node, "vocab_valid", INT64_MAX);
  d.ignore = slapo_node_attr_int(node, "ignore_index", -100);
  return d;
}

/* Local classes of a row that exist: [0, n). */
static int64_t local_valid(const vp_dims *d) {
  int64_t n = d->valid - d->start;
  return n < 0 ? 0 : n > d->V ? d->V : n;
}

static slapo_status check_inputs(const slapo_node *node) {
  const slapo_node *x = node->inputs[0], *t = node->inputs[1];
  if (x->dtype != SLAPO_DTYPE_F32 || (t->dtype != SLAPO_DTYPE_I32 && t->dtype != SLAPO_DTYPE_I64))
    return slapo_error(SLAPO_DTYPE, "%s: logits must be f32 and targets i32/i64, got %s and %s",
                       node->target, slapo_dtype_name(x->dtype), slapo_dtype_name(t->dtype));
  if (x->ndim < 1 || !slapo_shape_equal(x->ndim - 1, x->shape, t->ndim, t->shape)) {
    char a[96], b[96];
    return slapo_error(SLAPO_SHAPE, "%s: targets %s are not logits %s without the class axis",
                       node->target, slapo_shape_str(t->ndim, t->shape, b, sizeof b),
                       slapo_shape_str(x->ndim, x->shape, a, sizeof a));
  }
  int g = slapo__dist_group_of(node);
  if (g < 0 || g >= SLAPO_GROUP_COUNT)
    return slapo_error(SLAPO_INVALID_ARG, "%s: group %d is not a process group", node->target,
                       g);
  return SLAPO_OK;
}

/* ---- the group's class ranges, agreed once per plan ---- */

/* What a rank holds: classes [start, start + V) of [0, valid). */
typedef struct vp_range {
  int64_t start, V, valid;
} vp_range;

/* Layouts this process already checked with its group: a rebuilt step
 * (a new shape, SLAPO_DEBUG_STEP on some rank only) does not gather again,
 * so ranks that rebuild at different times still call the same collectives. */
static struct {
  int n;
  struct {
    int g, size;
    vp_range r;
  } e[16];
} g_agreed;

static bool agreed_before(int g, const vp_range *r) {
  for (int i = 0; i < g_agreed.n; i++)
    if (g_agreed.e[i].g == g && g_agreed.e[i].size == slapo_dist_size((slapo_group)g) &&
        !memcmp(&g_agreed.e[i].r, r, sizeof *r))
      return true;
  return false;
}

static void remember(int g, const vp_range *r) {
  if (g_agreed.n == (int)(sizeof g_agreed.e / sizeof *g_agreed.e)) return; /* checks again */
  g_agreed.e[g_agreed.n].g = g;
  g_agreed.e[g_agreed.n].size = slapo_dist_size((slapo_group)g);
  g_agreed.e[g_agreed.n++].r = *r;
}

/* "rank 0 [0, 4), rank 1 [0, 4)" (the first 16 ranks) into buf [cap]. */
static void ranges_str(const vp_range *all, int n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 0; r < n && len < cap; r++) {
    int w = r == 16 ? snprintf(buf + len, cap - len, ", ...")
                    : snprintf(buf + len, cap - len, "%srank %d [%lld, %lld)", r ? ", " : "", r,
                               (long long)all[r].start, (long long)(all[r].start + all[r].V));
    if (w < 0 || r == 16) break;
    len += (size_t)w;
  }
}

static const char *group_name(int g) {
  return g == SLAPO_GROUP_TP ? "tensor-parallel" : g == SLAPO_GROUP_DP ? "data-parallel" : "world";
}

/* Every class of [0, valid) on exactly one rank, one valid for all: else
 * the problem (a gap, an overlap, unequal totals) into what [cap]. */
static bool ranges_tile(const vp_range *all, int n, int *order, char *what, size_t cap) {
  for (int r = 1; r < n; r++)
    if (all[r].valid != all[0].valid) {
      snprintf(what, cap, "the ranks count different vocabularies (vocab_valid %lld on rank 0, "
               "%lld on rank %d)", (long long)all[0].valid, (long long)all[r].valid, r);
      return false;
    }
  /* Walk the ranges by start (order [n]: an insertion sort of the ranks). */
  for (int r = 0; r < n; r++) {
    int k = r;
    while (k > 0 && all[order[k - 1]].start > all[r].start) order[k] = order[k - 1], k--;
    order[k] = r;
  }
  int64_t end = 0;
  for (int k = 0; k < n; k++) {
    const vp_range *x = &all[order[k]];
    if (x->start != end) {
      if (x->start > end)
        snprintf(what, cap, "no rank holds classes %lld to %lld (rank %d starts at %lld)",
                 (long long)end, (long long)x->start - 1, order[k], (long long)x->start);
      else
        snprintf(what, cap, "the ranges overlap at class %lld (rank %d starts at %lld)",
                 (long long)x->start, order[k], (long long)x->start);
      return false;
    }
    end = x->start + x->V;
  }
  if (end < all[0].valid) {
    snprintf(what, cap, "the ranges end at class %lld, short of vocab_valid %lld",
             (long long)end, (long long)all[0].valid);
    return false;
  }
  return true;
}

/* Shape inference sees only this rank's logits; the ranges are checked
 * across the group once per plan (slapo_op.prepare). */
static slapo_status prepare_fwd(const slapo_node *node) {
  int g = slapo__dist_group_of(node);
  vp_dims d = dims_of(node);
  vp_range mine = {d.start, d.V, d.valid};
  if (agreed_before(g, &mine)) return SLAPO_OK;
  int n = slapo_dist_size((slapo_group)g);
  vp_range *all = slapo_calloc((size_t)n, sizeof *all);
  int *order = slapo_calloc((size_t)n, sizeof *order);
  if (!all || !order) {
    slapo_free(all);
    slapo_free(order);
    return slapo_error(SLAPO_NOMEM, "%s: out of memory", node->target);
  }
  slapo_status s = slapo_dist_all_gather_bytes((slapo_group)g, &mine, all, sizeof mine);
  char what[256], ranges[512];
  if (s == SLAPO_OK && !ranges_tile(all, n, order, what, sizeof what)) {
    ranges_str(all, n, ranges, sizeof ranges);
    s = slapo_error(SLAPO_SHAPE,
                    "%s: the class ranges of the %d ranks of the %s group do not split the "
                    "vocabulary of %lld: %s; %s (each rank's logits must hold its own part "
                    "[vocab_start, vocab_start + Vl), every class on exactly one rank)",
                    node->target, n, group_name(g), (long long)all[0].valid, what, ranges);
  }
  if (s == SLAPO_OK) remember(g, &mine);
  slapo_free(order);
  slapo_free(all);
  return s;
}

static slapo_status infer_fwd(slapo_node *node) {
  SLAPO_TRY(check_inputs(node));
  vp_dims d = dims_of(node);
  int64_t n = 2 + 3 * d.R;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &n);
}

static void all_reduce_rows(const slapo_node *node, float *buf, int64_t n, MPI_Op op) {
  int g = slapo__dist_group_of(node);
  if (slapo_dist_size((slapo_group)g) == 1 || !slapo__dist_kernel_ok()) return;
  slapo_status s = slapo__dist_usable();
  if (s == SLAPO_OK) {
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, op, slapo__dist_comm(g), &req);
    s = slapo__dist_wait(rc, &req, g, "MPI_Iallreduce (vocab-parallel loss)");
  }
  if (s != SLAPO_OK) slapo__dist_kernel_failed(s);
}

static void fwd_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  vp_dims d = dims_of(node);
  const float *x = slapo_tensor_data(in[0]);
  float *o = slapo_tensor_data(out), *m = o + 2, *s = m + d.R, *z = s + d.R;
  int64_t nv = local_valid(&d);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < d.R; r++) {
    const float *xr = x + r * d.V;
    float mx = -INFINITY;
    for (int64_t c = 0; c < nv; c++) mx = xr[c] > mx ? xr[c] : mx;
    m[r] = mx;
  }
  all_reduce_rows(node, m, d.R, MPI_MAX);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < d.R; r++) {
    const float *xr = x + r * d.V;
    double se = 0;
    for (int64_t c = 0; c < nv; c++) se += exp((double)xr[c] - (double)m[r]);
    s[r] = (float)se;
    int64_t t = index_at(in[1], r) - d.start;
    z[r] = t >= 0 && t < nv ? xr[t] - m[r] : 0.0f;
  }
  all_reduce_rows(node, s, 2 * d.R, MPI_SUM); /* s and z are adjacent */
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < d.R; r++) {
    int64_t t = index_at(in[1], r);
    if (t == d.ignore || t < 0 || t >= d.valid) continue;
    sum += log((double)s[r]) - (double)z[r];
    count++;
  }
  o[0] = count ? (float)(sum / (double)count) : 0.0f;
  o[1] = (float)count;
}

/* The loss of a packed forward is read through unpack; the packed value's
 * gradient dy [2 + 3R] carries dloss at element 0. */
static slapo_status fwd_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  if (!need[0]) return slapo_ctx_status(ctx);
  slapo_node *ins[4] = {node->inputs[0], node->inputs[1], node, dy};
  int na = 0;
  slapo_attr a[5];
  const char *keys[4] = {"group", "vocab_start", "vocab_valid", "ignore_index"};
  for (int i = 0; i < 4; i++) {
    const slapo_attr *at = slapo_node_attr(node, keys[i]);
    if (at) a[na++] = *at;
  }
  dx[0] = slapo_op_apply(ctx, &slapo_dist_op_vocab_parallel_cross_entropy_backward, 4, ins, na,
                         a);
  return slapo_ctx_status(ctx);
}

static slapo_status infer_bwd(slapo_node *node) {
  SLAPO_TRY(check_inputs(node));
  const slapo_node *x = node->inputs[0];
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, x->ndim, x->shape);
}

static void bwd_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  vp_dims d = dims_of(node);
  const float *x = slapo_tensor_data(in[0]), *p = slapo_tensor_data(in[2]);
  const float *m = p + 2, *s = m + d.R;
  float dloss = ((const float *)slapo_tensor_data(in[3]))[0];
  double count = p[1];
  float g = count > 0 ? (float)((double)dloss / count) : 0.0f;
  float *dx = slapo_tensor_data(out);
  int64_t nv = local_valid(&d);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < d.R; r++) {
    const float *xr = x + r * d.V;
    float *dr = dx + r * d.V;
    int64_t t = index_at(in[1], r);
    if (t == d.ignore || t < 0 || t >= d.valid) {
      memset(dr, 0, sizeof(float) * (size_t)d.V);
      continue;
    }
    float inv = 1.0f / s[r];
    for (int64_t c = 0; c < d.V; c++)
      dr[c] = c < nv ? expf(xr[c] - m[r]) * inv * g : 0.0f;
    t -= d.start;
    if (t >= 0 && t < nv) dr[t] -= g;
  }
}

static slapo_node *example(slapo_ctx *ctx) {
  int64_t xs[2] = {5, 7};
  slapo_node *x = slapo_input(ctx, "logits", SLAPO_DTYPE_F32, 2, xs);
  slapo_node *t = slapo_input(ctx, "targets", SLAPO_DTYPE_I32, 1, xs);
  return slapo_dist_vocab_parallel_cross_entropy(ctx, x, t, 0, 7, -100, SLAPO_GROUP_WORLD);
}

/* The loss and the row statistics are all-reduced: the same on every rank. */
static slapo_status layout_fwd(slapo_node *node) {
  node->layout = (slapo_layout){.kind = SLAPO_LAYOUT_REPLICATED};
  return SLAPO_OK;
}

const slapo_op slapo_dist_op_vocab_parallel_cross_entropy = {
    .name = "vocab_parallel_cross_entropy",
    .n_inputs = 2,
    .infer = infer_fwd,
    .ref = fwd_kernel,
    .backward = fwd_backward,
    .prepare = prepare_fwd,
    .layout = layout_fwd,
    .contiguous_inputs = true,
    .doc = "mean cross-entropy of logits [.., Vl] holding classes [vocab_start, vocab_start + "
           "Vl) of a vocabulary split across `group` (Megatron-LM); packed output [2 + 3R]: "
           "loss, count, row max, row sum of exp, target logit - max",
    .test = {.example = example, .int_high = 7},
};

const slapo_op slapo_dist_op_vocab_parallel_cross_entropy_backward = {
    .name = "vocab_parallel_cross_entropy_backward",
    .n_inputs = 4,
    .infer = infer_bwd,
    .ref = bwd_kernel,
    .contiguous_inputs = true,
    .doc = "(exp(x - m) / s - onehot(target)) * dloss / count on the own classes, reading m, s "
           "and count from the forward's packed output",
    .test = {.checked_by = "vocab_parallel_cross_entropy"},
};

slapo_node *slapo_dist_vocab_parallel_cross_entropy(slapo_ctx *ctx, slapo_node *logits,
                                                    slapo_node *targets, int64_t vocab_start,
                                                    int64_t vocab_valid, int64_t ignore_index,
                                                    slapo_group g) {
  slapo_attr a[4] = {slapo_attr_int("group", g), slapo_attr_int("vocab_start", vocab_start),
                     slapo_attr_int("vocab_valid", vocab_valid),
                     slapo_attr_int("ignore_index", ignore_index)};
  slapo_node *in[2] = {logits, targets};
  slapo_node *packed =
      slapo_op_apply(ctx, &slapo_dist_op_vocab_parallel_cross_entropy, 2, in, 4, a);
  slapo_attr u[2] = {slapo_attr_int("offset", 0), slapo_attr_ints("shape", 0, NULL)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(unpack), 1, &packed, 2, u);
}
