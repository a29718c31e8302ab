/* compiler/cc_rows.c - C source for a region around one LayerNorm or
 * RMSNorm over the last axis: elementwise ops before it on the same rows
 * (the pre phase: a bias + dropout + residual chain), the norm, and
 * elementwise ops after it that read its output (the post phase). One row-parallel forward kernel
 * and one backward kernel, each walking a row in phases:
 *
 *   forward:  pre values per element, the norm's input written (a result,
 *             or a hidden slot for the backward); the row's statistics and
 *             the normalised row; post values; every result written.
 *   backward: the saved norm input's statistics; post adjoints (the post
 *             values recomputed) down to the norm's output gradient; the
 *             norm's backward row, which adds the gradient of the norm's
 *             input from outside (the residual stream's, when that input
 *             is a result) where the unfused graph's fold_norm_add does;
 *             pre adjoints from it down to the inputs.
 *
 * The norm's row code is its fast kernels' own (slapo/ops/rowmath.h,
 * pasted verbatim), the elementwise statements are cc_gen.c's, and the
 * reductions of the weight, bias and ROW inputs use the fast kernels'
 * orders (LayerNorm's row blocks; RMSNorm's weight summed per column over
 * all rows after the row loop): a fused region is bitwise equal to the
 * unfused fast kernels, forward and backward, when the norm's input has at
 * most one reader outside (with more, autograd sums their gradients before
 * the norm's backward adds them: one rounding apart), and reruns are
 * byte-identical at any thread count.
 * The results are packed into the op's one value (plan.rows says how) and
 * the backward takes every result's gradient at once (cc_op.c).
 * Layer: compiler. */
#include <stdio.h>
#include <string.h>

#include "compiler/cc_gen.h"
#include "slapo/ops/rowmath.h"

typedef slapo__cc_gen gen;

bool slapo__cc_row_op(const slapo_op *op) {
  return op == SLAPO_OP_DESC(layer_norm) || op == SLAPO_OP_DESC(rms_norm) ||
         op == SLAPO_OP_DESC(softmax);
}

const char *slapo__cc_rows_src(void) {
  return SLAPO__CC_STR(SLAPO__LN_ROWS_SRC) "\n" SLAPO__CC_STR(SLAPO__RMS_ROWS_SRC) "\n"
      SLAPO__CC_STR(SLAPO__SOFTMAX_ROWS_SRC);
}

typedef struct rows {
  gen *G;
  const slapo_node *norm, *x;
  bool *pre, *post;      /* node id -> in the phase (ops, the inputs they read) */
  const char **as, **seed;
  char (*txt)[32];       /* the texts as and seed point to: 2 per node */
  int w, b;              /* input indices of the norm's weight and bias, or -1 */
  int norm_res;          /* the norm's result index, or -1 */
  bool has_pre, has_post;
  bool rms;              /* an RMSNorm */
  bool smax;             /* a softmax: the backward reads its output, saved */
  int x_res;             /* the norm input's result index, or -1 */
} rows;

/* The norm's weight and bias: region inputs of kind ROW read by it alone. */
static slapo_status affine_inputs(rows *R) {
  gen *G = R->G;
  R->w = R->b = -1;
  for (int i = 1; i < R->norm->n_inputs; i++) {
    const slapo_node *p = R->norm->inputs[i];
    if (p->kind != SLAPO_NODE_PLACEHOLDER || p->n_users != 1 ||
        G->plan->kind[G->ph_of[p->id]] != SLAPO__CC_ROW)
      return slapo_error(SLAPO_UNSUPPORTED, "cc: the %s %%%s's weight or bias %%%s must be a "
                         "region input of the row's size read by it alone", R->norm->target,
                         R->norm->name, p->name);
    *(i == 1 ? &R->w : &R->b) = G->ph_of[p->id];
  }
  return SLAPO_OK;
}

/* Results (each of the norm's shape), the phases and the slots. */
static slapo_status classify(rows *R) {
  gen *G = R->G;
  slapo__cc_plan *pl = G->plan;
  const slapo_node *out = slapo_graph_output(G->g);
  int64_t N = slapo__cc_numel(R->norm->ndim, R->norm->shape);
  if (out->n_inputs > SLAPO__CC_MAX_RES)
    return slapo_error(SLAPO_UNSUPPORTED, "cc: %d results; a region packs at most %d",
                       out->n_inputs, SLAPO__CC_MAX_RES);
  pl->rows = true, pl->n_res = out->n_inputs, pl->x_slot = pl->x_in = -1;
  R->norm_res = R->x_res = -1;
  for (int k = 0; k < out->n_inputs; k++) {
    const slapo_node *r = out->inputs[k];
    if (slapo__cc_numel(r->ndim, r->shape) != N)
      return slapo_error(SLAPO_UNSUPPORTED, "cc: result %%%s is not of the %s %%%s's shape; cc "
                         "packs results of its shape", r->name, R->norm->target, R->norm->name);
    if (r == R->x) R->x_res = k;
    if (r == R->norm) R->norm_res = k;
  }
  if (R->smax && slapo_node_attr_int(R->norm, "causal", 0))
    return slapo_error(SLAPO_UNSUPPORTED, "cc: softmax %%%s is causal; cc generates softmax "
                       "over whole rows (fuse the causal one with compiler=none, or use "
                       "FlashAttention)", R->norm->name);
  SLAPO_TRY(affine_inputs(R));
  if (R->x->kind == SLAPO_NODE_PLACEHOLDER) {
    if (R->x->n_users != 1 || pl->kind[G->ph_of[R->x->id]] != SLAPO__CC_FULL)
      return slapo_error(SLAPO_UNSUPPORTED, "cc: the input %%%s of %s %%%s is a region input "
                         "that other ops read too or that broadcasts; fuse the ops before the "
                         "%s with it", R->x->name, R->norm->target, R->norm->name,
                         R->norm->target);
    pl->x_in = G->ph_of[R->x->id];
  }
  /* The row the backward reads: a norm's input, a softmax's output; a
   * result's slot, or a hidden one after them, written for it alone. */
  if (R->smax) pl->x_slot = R->norm_res >= 0 ? R->norm_res : pl->n_res;
  else if (pl->x_in < 0) pl->x_slot = R->x_res >= 0 ? R->x_res : pl->n_res;
  pl->n_slots = pl->n_res + (pl->x_slot == pl->n_res);
  /* pre: the cone of the norm's input */
  if (R->x->kind != SLAPO_NODE_PLACEHOLDER) R->pre[R->x->id] = R->has_pre = true;
  for (const slapo_node *n = slapo_graph_last(G->g); n; n = n->prev)
    if (R->pre[n->id] && n->kind == SLAPO_NODE_CALL_OP)
      for (int j = 0; j < n->n_inputs; j++) R->pre[n->inputs[j]->id] = true;
  /* post: the other ops, reading the norm, each other, constants and
   * inputs no pre op reads */
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next) {
    if (n->kind != SLAPO_NODE_CALL_OP || n == R->norm || R->pre[n->id]) continue;
    R->post[n->id] = R->has_post = true;
    for (int j = 0; j < n->n_inputs; j++) {
      const slapo_node *in = n->inputs[j];
      bool constant = in->kind == SLAPO_NODE_CALL_OP && in->op == SLAPO_OP_DESC(full);
      if (in->kind == SLAPO_NODE_PLACEHOLDER && R->pre[in->id])
        return slapo_error(SLAPO_UNSUPPORTED, "cc: region input %%%s is read before and after "
                           "the %s (by %%%s); pass it twice", in->name, R->norm->target, n->name);
      if (in != R->norm && !R->post[in->id] && !constant && in->kind != SLAPO_NODE_PLACEHOLDER)
        return slapo_error(SLAPO_UNSUPPORTED, "cc: %%%s after the %s reads %%%s, computed before "
                           "it; ops after it may read its output, each other and region inputs",
                           n->name, R->norm->target, in->name);
      R->post[in->id] = true;
    }
  }
  if (!R->has_post && R->norm_res < 0)
    return slapo_error(SLAPO_UNSUPPORTED, "cc: the output of %s %%%s is neither a result nor "
                       "read", R->norm->target, R->norm->name);
  /* RMSNorm's weight gradient sums each column over all rows in order (its
   * fast kernel's), from the gradient of the norm's output, which the post
   * phase keeps a row at a time only. */
  if (R->rms && R->w >= 0 && R->has_post)
    return slapo_error(SLAPO_UNSUPPORTED, "cc: ops after the RMSNorm %%%s with a weight (its "
                       "weight's gradient needs the norm output's); fuse the region up to the "
                       "norm", R->norm->name);
  pl->rstd_rows = R->rms && R->w >= 0;
  /* The backward reads the norm's input (saved or an input), its weight,
   * and its bias when the norm's output is recomputed for the post phase. */
  if (pl->x_in >= 0) pl->bwd_reads[pl->x_in] = !R->smax;
  if (R->w >= 0) pl->bwd_reads[R->w] = true;
  if (R->b >= 0) pl->bwd_reads[R->b] = G->need[R->norm->id];
  return SLAPO_OK;
}

/* ---- emission ---- */

static void put_row_setup(rows *R) {
  gen *G = R->G;
  char w[24] = "NULL", b[24] = "NULL";
  if (R->w >= 0) snprintf(w, sizeof w, "in[%d]", R->w);
  if (R->b >= 0) snprintf(b, sizeof b, "in[%d]", R->b);
  slapo__cc_put(&G->b,
                "  const int64_t R = N / C;\n"
                "  const float eps = (float)%.17g;\n"
                "  const float *w = %s, *b = %s;\n"
                "  (void)w, (void)b;\n",
                slapo_node_attr_float(R->norm, "eps", 1e-5), w, b);
}

/* Whether inputs share the norm input's gradient (plan.grad_is_dy). */
static bool any_identity(const slapo__cc_plan *pl) {
  for (int k = 0; k < pl->n_in; k++)
    if (pl->grad_is_dy[k]) return true;
  return false;
}

/* Inside a phase's column block: prefetches PD floats ahead (the rows
 * this thread walks next, as cc_gen.c's loops do) of every stream the
 * row's phases read or write: the forward's FULL inputs and result slots;
 * the backward's FULL inputs it reads, the saved norm input, the results'
 * gradients and the FULL inputs' gradients. */
static void put_prefetch(rows *R, bool bwd, const char *ind) {
  gen *G = R->G;
  const slapo__cc_plan *pl = G->plan;
  slapo__cc_put(&G->b, "%sif (r * C + c0 + PD + CB <= N)\n"
                "%s  for (int64_t q = r * C + c0 + PD; q < r * C + c0 + PD + CB; q += 16) {\n",
                ind, ind);
  for (int k = 0; k < pl->n_in; k++)
    if (pl->kind[k] == SLAPO__CC_FULL && (!bwd || pl->bwd_reads[k]))
      slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(in[%d] + q, 0);\n", ind, k);
  if (!bwd)
    for (int k = 0; k < pl->n_slots; k++)
      slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(y + (int64_t)%d * N + q, 1);\n", ind, k);
  if (bwd && pl->x_slot >= 0)
    slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(fw + (int64_t)%d * N + q, 0);\n", ind, pl->x_slot);
  for (int k = 0; bwd && k < pl->n_res; k++)
    slapo__cc_put(&G->b, "%s    if (dy%d) SLAPO_CC_PREFETCH(dy%d + q, 0);\n", ind, k, k);
  for (int k = 0; bwd && k <= pl->n_in; k++)
    if (k == pl->n_in ? any_identity(pl) : pl->kind[k] == SLAPO__CC_FULL && !pl->grad_is_dy[k])
      slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(pk + off[%d] + q, 1);\n", ind, k);
  slapo__cc_put(&G->b, "%s  }\n", ind);
}

/* The column blocks of one phase, open: the uniforms, then the element loop
 * (simd unless a SCALAR sum is taken in it: that order stays sequential). */
static void open_phase(rows *R, const bool *mask, bool simd, int prefetch, const char *ind) {
  gen *G = R->G;
  G->mask = mask;
  slapo__cc_put(&G->b, "%sfor (int64_t c0 = 0; c0 < C; c0 += CB) {\n"
                "%s  const int64_t c1 = c0 + CB < C ? c0 + CB : C;\n", ind, ind);
  char in2[32];
  snprintf(in2, sizeof in2, "%s  ", ind);
  if (prefetch >= 0) put_prefetch(R, prefetch, in2);
  slapo__cc_emit_uniforms(G, in2);
  slapo__cc_put(&G->b, "%s%s  for (int64_t c = c0; c < c1; c++) {\n"
                "%s    const int64_t i = r * C + c;\n%s    (void)i;\n",
                simd ? "#pragma omp simd\n" : "", ind, ind, ind);
}

static void close_phase(rows *R, const char *ind) {
  slapo__cc_put(&R->G->b, "%s  }\n%s}\n", ind, ind);
  R->G->mask = NULL, R->G->as = NULL, R->G->seed = NULL;
}

/* The results a phase computes, written (the norm's input through xs). */
static void put_results(rows *R, const bool *mask, const char *ind) {
  gen *G = R->G;
  const slapo_node *out = slapo_graph_output(G->g);
  if (mask == R->pre) slapo__cc_put(&G->b, "%sxs[c] = v%d;\n", ind, R->x->id);
  for (int k = 0; k < out->n_inputs; k++) {
    const slapo_node *r = out->inputs[k];
    if (mask[r->id] && r != R->x && r != R->norm)
      slapo__cc_put(&G->b, "%sy[(int64_t)%d * N + i] = v%d;\n", ind, k, r->id);
  }
}

/* The row's statistics, as the norm's fast kernels take them. */
static void put_stats(rows *R, const char *ind) {
  if (R->smax) return;
  if (R->rms)
    slapo__cc_put(&R->G->b, "%sconst float rstd = slapo__rms_row_rstd(xs, C, eps);\n", ind);
  else
    slapo__cc_put(&R->G->b, "%sfloat mean, rstd;\n%sslapo__ln_row_stats(xs, C, eps, &mean, &rstd);\n",
                  ind, ind);
}

static void put_norm_row(rows *R, const char *dst, const char *ind) {
  if (R->smax) slapo__cc_put(&R->G->b, "%sslapo__softmax_row(xs, %s, C, C);\n", ind, dst);
  else if (R->rms) slapo__cc_put(&R->G->b, "%sslapo__rms_norm_row(xs, w, %s, C, rstd);\n", ind, dst);
  else slapo__cc_put(&R->G->b, "%sslapo__ln_norm_row(xs, w, b, %s, C, mean, rstd);\n", ind, dst);
}

static void emit_fwd(rows *R, slapo_status *s) {
  gen *G = R->G;
  const slapo__cc_plan *pl = G->plan;
  slapo__cc_put(&G->b, "void slapo_cc_fwd(int64_t N, int64_t C, const float *const *in, float *y,\n"
                "                 const uint64_t *keys, uint64_t step, int training) {\n"
                "  (void)keys, (void)step, (void)training;\n");
  put_row_setup(R);
  slapo__cc_put(&G->b, "#pragma omp parallel for schedule(static)\n"
                "  for (int64_t r = 0; r < R; r++) {\n");
  if (pl->x_in >= 0) slapo__cc_put(&G->b, "    const float *xs = in[%d] + r * C;\n", pl->x_in);
  else if (!R->smax) slapo__cc_put(&G->b, "    float *xs = y + (int64_t)%d * N + r * C;\n", pl->x_slot);
  else if (R->x_res >= 0)
    slapo__cc_put(&G->b, "    float *xs = y + (int64_t)%d * N + r * C;\n", R->x_res);
  else slapo__cc_put(&G->b, "    float xsb[C], *xs = xsb;\n");
  if (R->has_pre) {
    open_phase(R, R->pre, true, 0, "    ");
    if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "        ", false);
    put_results(R, R->pre, "        ");
    close_phase(R, "    ");
  }
  put_stats(R, "    ");
  if (R->smax) slapo__cc_put(&G->b, "    float *nr = y + (int64_t)%d * N + r * C;\n", pl->x_slot);
  else if (R->norm_res >= 0)
    slapo__cc_put(&G->b, "    float *nr = y + (int64_t)%d * N + r * C;\n", R->norm_res);
  else slapo__cc_put(&G->b, "    float nr[C];\n");
  put_norm_row(R, "nr", "    ");
  if (R->has_post) {
    snprintf(R->txt[2 * R->norm->id], 32, "nr[c]");
    R->as[R->norm->id] = R->txt[2 * R->norm->id];
    open_phase(R, R->post, true, R->has_pre ? -1 : 0, "    ");
    G->as = R->as;
    if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "        ", false);
    put_results(R, R->post, "        ");
    close_phase(R, "    ");
  }
  slapo__cc_put(&G->b, "  }\n}\n\n");
}

/* Seeds of a phase's adjoints: each result's gradient row, and `extra`
 * (the norm's input in the pre phase: dsr, the norm's backward). */
static void set_seeds(rows *R, const bool *mask, const slapo_node *extra, const char *text) {
  const slapo_node *out = slapo_graph_output(R->G->g);
  for (int id = 0; id <= R->G->n; id++) R->seed[id] = NULL;
  for (int k = 0; k < out->n_inputs; k++) {
    const slapo_node *r = out->inputs[k];
    if (!mask[r->id] || r == R->x) continue;
    snprintf(R->txt[2 * r->id + 1], 32, "dyr%d[c]", k);
    R->seed[r->id] = R->txt[2 * r->id + 1];
  }
  if (extra) {
    snprintf(R->txt[2 * extra->id + 1], 32, "%s", text);
    R->seed[extra->id] = R->txt[2 * extra->id + 1];
  }
  R->G->seed = R->seed;
}

/* The post phase's backward: the norm's output gradient into gn. */
static void emit_bwd_post(rows *R, slapo_status *s) {
  gen *G = R->G;
  if (G->need[R->norm->id] && !R->smax) /* a softmax's output is saved */
    put_norm_row(R, "nb", "      ");
  snprintf(R->txt[2 * R->norm->id], 32, R->smax ? "ys[c]" : "nb[c]");
  R->as[R->norm->id] = R->txt[2 * R->norm->id];
  open_phase(R, R->post, !slapo__cc_count(G->plan, SLAPO__CC_SCALAR), 1, "      ");
  G->as = R->as;
  set_seeds(R, R->post, NULL, NULL);
  if (R->norm_res >= 0) {
    snprintf(R->txt[2 * R->norm->id + 1], 32, "dyr%d[c]", R->norm_res);
    R->seed[R->norm->id] = R->txt[2 * R->norm->id + 1];
  }
  if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "          ", true);
  if (*s == SLAPO_OK) *s = slapo__cc_emit_adjoints(G, "          ");
  slapo__cc_emit_grads(G, "          ");
  slapo__cc_put(&G->b, "          gn[c] = ga%d;\n", R->norm->id);
  close_phase(R, "      ");
}

/* RMSNorm's weight gradient after the row loop, as its fast kernel sums it
 * (slapo__rms_weight_cols over 64-column tiles), from the saved norm input,
 * the rows' rstd and the norm output's gradient (zero when it has none);
 * written over the ROW sum emit_sums left for the weight, which no row
 * partial fed. */
static void emit_rms_weight(rows *R) {
  gen *G = R->G;
  const slapo__cc_plan *pl = G->plan;
  char xs[48];
  if (pl->x_in >= 0) snprintf(xs, sizeof xs, "in[%d]", pl->x_in);
  else snprintf(xs, sizeof xs, "fw + (int64_t)%d * N", pl->x_slot);
  slapo__cc_put(&G->b,
                "  if (!dy%d) {\n"
                "    for (int64_t c = 0; c < C; c++) pk[off[%d] + c] = 0.0f;\n"
                "    return;\n"
                "  }\n"
                "#pragma omp parallel for schedule(dynamic, 1)\n"
                "  for (int64_t t = 0; t < (C + 63) / 64; t++)\n"
                "    slapo__rms_weight_cols(%s, dy%d, rs, R, C, t * 64, C - t * 64 < 64 ? C - t * 64 : 64,\n"
                "                           pk + off[%d]);\n",
                R->norm_res, R->w, xs, R->norm_res, R->w);
}

static void emit_bwd(rows *R, slapo_status *s) {
  gen *G = R->G;
  const slapo__cc_plan *pl = G->plan;
  slapo__cc_put(&G->b, "void slapo_cc_bwd(int64_t N, int64_t C, const float *const *in, const float *dy,\n"
                "                 float *pk, const int64_t *off, double *work, const uint64_t *keys,\n"
                "                 uint64_t step, int training) {\n"
                "  (void)dy, (void)keys, (void)step, (void)training, (void)work;\n");
  put_row_setup(R);
  slapo__cc_put(&G->b, "  const float *fw = in[%d];\n  (void)fw;\n", pl->n_in);
  for (int k = 0; k < pl->n_res; k++)
    slapo__cc_put(&G->b, "  const float *dy%d = in[%d];\n", k, pl->n_in + 1 + k);
  if (pl->rstd_rows) /* each row's rstd, after the partials (slapo__cc_work_doubles) */
    slapo__cc_put(&G->b, "  float *rs = (float *)(work + ((int64_t)%d + ((int64_t)%d * C + 1) / 2) * RBLK);\n",
                  slapo__cc_count(pl, SLAPO__CC_SCALAR), slapo__cc_count(pl, SLAPO__CC_ROW));
  slapo__cc_put(&G->b, "  const int64_t rpb = (R + RBLK - 1) / RBLK, nrb = R ? (R + rpb - 1) / rpb : 0;\n"
                "#pragma omp parallel for schedule(static)\n"
                "  for (int64_t t = 0; t < nrb; t++) {\n"
                "    const int64_t r0 = t * rpb, r1 = r0 + rpb < R ? r0 + rpb : R;\n"
                "    float zr[C];\n"
                "    memset(zr, 0, sizeof(float) * (size_t)C);\n");
  slapo__cc_emit_partials(G, "    ");
  if (R->has_post) slapo__cc_put(&G->b, "    float gn[C], nb[C];\n    (void)nb;\n");
  if (!any_identity(pl)) slapo__cc_put(&G->b, "    float ds[C];\n");
  slapo__cc_put(&G->b, "    for (int64_t r = r0; r < r1; r++) {\n");
  if (R->smax) slapo__cc_put(&G->b, "      const float *ys = fw + (int64_t)%d * N + r * C;\n", pl->x_slot);
  else if (pl->x_in >= 0) slapo__cc_put(&G->b, "      const float *xs = in[%d] + r * C;\n", pl->x_in);
  else slapo__cc_put(&G->b, "      const float *xs = fw + (int64_t)%d * N + r * C;\n", pl->x_slot);
  for (int k = 0; k < pl->n_res; k++)
    slapo__cc_put(&G->b, "      const float *dyr%d = dy%d ? dy%d + r * C : zr;\n      (void)dyr%d;\n",
                  k, k, k, k);
  put_stats(R, "      ");
  if (pl->rstd_rows) slapo__cc_put(&G->b, "      rs[r] = rstd;\n");
  if (R->has_post) emit_bwd_post(R, s);
  if (R->has_post) slapo__cc_put(&G->b, "      const float *gnr = gn;\n");
  else slapo__cc_put(&G->b, "      const float *gnr = dyr%d;\n", R->norm_res);
  /* The norm input's gradient: written once after the inputs' when inputs
   * share it (a residual add's, x's own), else a row on the stack. */
  if (any_identity(pl)) slapo__cc_put(&G->b, "      float *dsr = pk + off[%d] + r * C;\n", pl->n_in);
  else slapo__cc_put(&G->b, "      float *dsr = ds;\n");
  /* The gradient of the norm's input from outside, added in its backward
   * (a result's: the residual stream's), as fold_norm_add does unfused. */
  char rr[64] = "NULL";
  if (R->x_res >= 0) snprintf(rr, sizeof rr, "dy%d ? dyr%d : NULL", R->x_res, R->x_res);
  if (R->smax) { /* softmax_backward, then the unfused graph's add of the other gradient */
    slapo__cc_put(&G->b, "      slapo__softmax_backward_row(ys, gnr, dsr, C);\n");
    if (R->x_res >= 0)
      slapo__cc_put(&G->b, "      if (dy%d)\n        for (int64_t c = 0; c < C; c++) dsr[c] = dsr[c] + dyr%d[c];\n",
                    R->x_res, R->x_res);
  } else if (R->rms)
    slapo__cc_put(&G->b, "      slapo__rms_backward_row(xs, w, gnr, %s, dsr, C, eps);\n", rr);
  else slapo__cc_put(&G->b, "      slapo__ln_backward_row(xs, w, gnr, %s, dsr, C, mean, rstd);\n", rr);
  if (R->w >= 0 && !R->rms && !R->smax)
    slapo__cc_put(&G->b, "      slapo__ln_affine_row(xs, gnr, acc%d, acc%d, C, mean, rstd);\n",
                  R->w, R->b);
  if (R->has_pre) {
    open_phase(R, R->pre, !slapo__cc_count(G->plan, SLAPO__CC_SCALAR), R->has_post ? -1 : 1, "      ");
    set_seeds(R, R->pre, R->x, "dsr[c]");
    if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "          ", true);
    if (*s == SLAPO_OK) *s = slapo__cc_emit_adjoints(G, "          ");
    slapo__cc_emit_grads(G, "          ");
    close_phase(R, "      ");
  }
  slapo__cc_put(&G->b, "    }\n");
  slapo__cc_emit_sums(G);
  if (pl->rstd_rows) emit_rms_weight(R);
  slapo__cc_put(&G->b, "}\n");
}

slapo_status slapo__cc_rows_emit(gen *G) {
  rows R = {.G = G, .norm = G->row, .x = G->row->inputs[0],
            .rms = G->row->op == SLAPO_OP_DESC(rms_norm),
            .smax = G->row->op == SLAPO_OP_DESC(softmax)};
  size_t n = (size_t)G->n + 1;
  R.pre = slapo_calloc(n, sizeof *R.pre);
  R.post = slapo_calloc(n, sizeof *R.post);
  R.as = slapo_calloc(n, sizeof *R.as);
  R.seed = slapo_calloc(n, sizeof *R.seed);
  R.txt = slapo_calloc(2 * n, sizeof *R.txt);
  slapo_status s = R.pre && R.post && R.as && R.seed && R.txt
                       ? SLAPO_OK
                       : slapo_error(SLAPO_NOMEM, "cc: out of memory");
  if (s == SLAPO_OK) s = classify(&R);
  if (s == SLAPO_OK) emit_fwd(&R, &s);
  if (s == SLAPO_OK) emit_bwd(&R, &s);
  G->mask = NULL, G->as = NULL, G->seed = NULL;
  slapo_free(R.pre);
  slapo_free(R.post);
  slapo_free(R.as);
  slapo_free(R.seed);
  slapo_free(R.txt);
  return s;
}
