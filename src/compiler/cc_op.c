/* compiler/cc_op.c - the `cc` backend: a region's generated kernels
 * registered as a fused op and its backward op. The fused op's backward
 * rule runs the backward kernel once, into one packed buffer holding every
 * input's gradient (a node has one value), and reads each gradient out of
 * it with zero-copy `unpack` views; forward intermediates are recomputed
 * by the backward kernel, not saved. Equal regions (same source, compiler,
 * ISA) share one op. Layer: compiler. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "compiler/cc_gen.h"

typedef struct cc_op {
  slapo_op fwd; /* first: node->op of a fused node points here */
  slapo_op bwd;
  char fwd_name[96], bwd_name[112];
  slapo__cc_plan plan;
  slapo__cc_fwd_fn f;
  slapo__cc_bwd_fn b;
} cc_op;

static const cc_op *of_fwd(const slapo_op *op) { return (const cc_op *)op; }
static const cc_op *of_bwd(const slapo_op *op) {
  return (const cc_op *)((const char *)op - offsetof(cc_op, bwd));
}

static int64_t numel_of(const slapo_node *n) {
  int64_t k = 1;
  for (int d = 0; d < n->ndim; d++) k *= n->shape[d];
  return k;
}

/* NumPy broadcasting of the inputs' shapes into shape [*ndim]. */
static slapo_status broadcast(const slapo_node *node, int n, int *ndim, int64_t *shape) {
  *ndim = 0;
  for (int i = 0; i < n; i++) {
    const slapo_node *x = node->inputs[i];
    if (x->dtype != SLAPO_DTYPE_F32)
      return slapo_error(SLAPO_DTYPE, "%s: input %d is %s, expected f32", node->target, i,
                         slapo_dtype_name(x->dtype));
    int nd = x->ndim > *ndim ? x->ndim : *ndim;
    int64_t out[SLAPO_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
      int a = d - (nd - *ndim), b = d - (nd - x->ndim);
      int64_t da = a < 0 ? 1 : shape[a], db = b < 0 ? 1 : x->shape[b];
      if (da != db && da != 1 && db != 1)
        return slapo_error(SLAPO_SHAPE, "%s: input %d does not broadcast (dim %d: %lld vs %lld)",
                           node->target, i, d, (long long)da, (long long)db);
      out[d] = da == 1 ? db : da;
    }
    memcpy(shape, out, sizeof(int64_t) * (size_t)nd);
    *ndim = nd;
  }
  return SLAPO_OK;
}

/* The kinds at these shapes must be the ones the kernels were made for. */
static slapo_status same_kinds(const slapo_node *node, const cc_op *c, int ndim,
                               const int64_t *shape, int64_t *C) {
  slapo__cc_kind k[SLAPO__CC_MAX_IN];
  SLAPO_TRY(slapo__cc_kinds(c->plan.n_in, (const slapo_node *const *)node->inputs, ndim, shape,
                            k, C));
  for (int i = 0; i < c->plan.n_in; i++)
    if (k[i] != c->plan.kind[i])
      return slapo_error(SLAPO_SHAPE, "%s: input %d broadcasts differently from the shapes it "
                         "was compiled for (fuse again at these shapes)", node->target, i);
  return SLAPO_OK;
}

/* A row region's value packs its results (plan.rows): [n_slots * N]. */
static slapo_status fwd_infer(slapo_node *node) {
  const cc_op *c = of_fwd(node->op);
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS], C;
  SLAPO_TRY(broadcast(node, c->plan.n_in, &ndim, shape));
  SLAPO_TRY(same_kinds(node, c, ndim, shape, &C));
  if (!c->plan.rows) return slapo_node_set_meta(node, SLAPO_DTYPE_F32, ndim, shape);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  if (ndim == 0 || shape[ndim - 1] > SLAPO__CC_MAX_ROW)
    return slapo_error(SLAPO_UNSUPPORTED, "%s: rows of %lld values; a fused region around a "
                       "norm or softmax takes rows of 1 to %d (its kernels keep rows on the stack)",
                       node->target, (long long)(ndim ? shape[ndim - 1] : 0), SLAPO__CC_MAX_ROW);
  n *= c->plan.n_slots;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &n);
}

/* One op serves every region with the same source, so the random streams
 * (which differ per region: each dropout has its own) come from the fused
 * node's "streams" attribute, in the region's graph order; the compiled
 * region's own streams are the default. */
static void keys_of(const slapo_node *node, const cc_op *c, const slapo_kernel_env *env,
                    uint64_t *keys) {
  const slapo_attr *a = slapo_node_attr(node, "streams");
  for (int r = 0; r < c->plan.n_rand; r++) {
    uint64_t stream = a && a->kind == SLAPO_ATTR_INTS && r < a->n ? (uint64_t)a->ints[r]
                                                                  : c->plan.stream[r];
    keys[r] = slapo_rng_key(env ? env->seed : 0, stream);
  }
}

/* C: the ROW inputs' numel, or N (the output as one row); a row region's
 * row size (the last dim of a FULL input: one has the region's shape). */
static int64_t row_of(const slapo_node *node, const cc_op *c, int64_t N) {
  for (int i = 0; c->plan.rows && i < c->plan.n_in; i++)
    if (c->plan.kind[i] == SLAPO__CC_FULL) return node->inputs[i]->shape[node->inputs[i]->ndim - 1];
  int64_t C = 0;
  for (int i = 0; i < c->plan.n_in; i++)
    if (c->plan.kind[i] == SLAPO__CC_ROW) C = numel_of(node->inputs[i]);
  return C ? C : N;
}

static void fwd_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  const cc_op *c = of_fwd(node->op);
  const float *ins[SLAPO__CC_MAX_IN];
  uint64_t keys[SLAPO__CC_MAX_RAND];
  for (int i = 0; i < c->plan.n_in; i++) ins[i] = slapo_tensor_data(in[i]);
  keys_of(node, c, env, keys);
  int64_t N = slapo_tensor_numel(out) / (c->plan.rows ? c->plan.n_slots : 1);
  if (N == 0) return;
  c->f(N, row_of(node, c, N), ins, slapo_tensor_data(out), keys, env ? env->step : 0,
       env && env->training);
}

/* Each needed input gradient out of the backward's packed buffer pk, by a
 * zero-copy unpack view; where plan.grad_is_dy says so, dy itself (a row
 * region: the view of the norm input's gradient, after the inputs'). */
static slapo_status unpack_grads(slapo_ctx *ctx, const slapo_node *node, const cc_op *c,
                                 slapo_node *pk, const int64_t *numels, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  int64_t off = 0, shared = 0; /* a row region's shared slot: after the inputs' */
  for (int i = 0; i < c->plan.n_in; i++) shared += numels[i];
  for (int i = 0; i < c->plan.n_in; i++) {
    const slapo_node *x = node->inputs[i];
    bool is_dy = c->plan.grad_is_dy[i];
    slapo_attr a[2] = {slapo_attr_int("offset", is_dy ? shared : off),
                       slapo_attr_ints("shape", x->ndim, x->shape)};
    if (need[i] && is_dy && dy)
      dx[i] = slapo_shape_equal(x->ndim, x->shape, dy->ndim, dy->shape)
                  ? dy
                  : slapo_reshape(ctx, dy, x->ndim, x->shape);
    else if (need[i]) dx[i] = slapo_op_apply(ctx, SLAPO_OP_DESC(unpack), 1, &pk, 2, a);
    off += numels[i];
  }
  return slapo_ctx_status(ctx);
}

/* A row region's backward: one node reading what its kernel needs (the
 * inputs of plan.bwd_reads, the forward's packed value when the norm's
 * input is saved there, then each result's gradient present, in result
 * order: attribute "dys" says which), writing every input's gradient. */
static slapo_status rows_backward(slapo_ctx *ctx, slapo_node *node, int n, const int64_t *offs,
                                  slapo_node *const *dys, const bool *need, slapo_node **dx) {
  const cc_op *c = of_fwd(node->op);
  slapo_node *args[SLAPO__CC_MAX_IN + 1 + SLAPO__CC_MAX_RES];
  int64_t numels[SLAPO__CC_MAX_IN + 1], has[SLAPO__CC_MAX_RES] = {0};
  int64_t N = numel_of(node) / c->plan.n_slots;
  int k = 0, n_numels = c->plan.n_in;
  for (int i = 0; i < c->plan.n_in; i++) {
    /* Inputs whose gradient is the norm input's share one slot after all. */
    numels[i] = c->plan.grad_is_dy[i] ? 0 : numel_of(node->inputs[i]);
    if (c->plan.grad_is_dy[i]) numels[c->plan.n_in] = N, n_numels = c->plan.n_in + 1;
    if (c->plan.bwd_reads[i]) args[k++] = node->inputs[i];
  }
  if (c->plan.x_slot >= 0) args[k++] = node; /* the row it saved */
  for (int j = 0; j < n; j++) {
    if (N == 0 || offs[j] % N || offs[j] / N >= c->plan.n_res)
      return slapo_ctx_fail(ctx, SLAPO_STATE, "%s: a view at offset %lld is not one of its %d "
                            "results of %lld values", node->target, (long long)offs[j],
                            c->plan.n_res, (long long)N);
    has[offs[j] / N] = 1;
    args[k++] = dys[j]; /* offsets ascend: results in order */
  }
  int64_t C = row_of(node, c, N);
  slapo_attr attrs[6] = {slapo_attr_ints("numels", n_numels, numels), slapo_attr_int("row", C),
                         slapo_attr_int("work", slapo__cc_work_doubles(&c->plan, C, N / C)),
                         slapo_attr_ints("dys", c->plan.n_res, has), slapo_attr_int("numel", N)};
  int n_attrs = 5;
  const slapo_attr *st = slapo_node_attr(node, "streams");
  if (st) attrs[n_attrs++] = *st;
  slapo_node *pk = slapo_op_apply(ctx, &c->bwd, k, args, n_attrs, attrs);
  return unpack_grads(ctx, node, c, pk, numels, NULL, need, dx);
}

/* The backward node reads only the inputs whose values its kernel needs
 * (plan.bwd_reads), so the others can die during the forward; every
 * input's element count and the row size travel as attributes. */
static slapo_status fwd_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                 const bool *need, slapo_node **dx) {
  const cc_op *c = of_fwd(node->op);
  slapo_node *args[SLAPO__CC_MAX_IN + 1];
  int64_t numels[SLAPO__CC_MAX_IN], N = numel_of(node);
  int n = c->plan.n_in, k = 0;
  for (int i = 0; i < n; i++) {
    /* A gradient that is dy itself takes no room in the packed buffer. */
    numels[i] = c->plan.grad_is_dy[i] ? 0 : numel_of(node->inputs[i]);
    if (c->plan.bwd_reads[i]) args[k++] = node->inputs[i];
  }
  args[k++] = dy;
  int64_t C = row_of(node, c, N);
  slapo_attr attrs[4] = {slapo_attr_ints("numels", n, numels), slapo_attr_int("row", C),
                         slapo_attr_int("work", slapo__cc_work_doubles(&c->plan, C, N / C))};
  int n_attrs = 3;
  const slapo_attr *st = slapo_node_attr(node, "streams");
  if (st) attrs[n_attrs++] = *st;
  slapo_node *pk = slapo_op_apply(ctx, &c->bwd, k, args, n_attrs, attrs);
  return unpack_grads(ctx, node, c, pk, numels, dy, need, dx);
}

/* The packed gradients, then (from a 64-byte boundary) the backward's work
 * area of `work` doubles: its row blocks' partial sums. Keeping it in the
 * node's own buffer lets the planner place it, and the kernel cannot fail. */
static int64_t work_offset(int64_t grads) { return (grads + 15) / 16 * 16; }

static slapo_status bwd_infer(slapo_node *node) {
  const slapo_attr *ne = slapo_node_attr(node, "numels");
  if (!ne || ne->kind != SLAPO_ATTR_INTS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: needs the numels attribute", node->target);
  int64_t total = 0, work = slapo_node_attr_int(node, "work", 0);
  for (int i = 0; i < ne->n; i++) total += ne->ints[i];
  if (work > 0) total = work_offset(total) + 2 * work;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, 1, &total);
}

static void bwd_kernel(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  const cc_op *c = of_bwd(node->op);
  const float *ins[SLAPO__CC_MAX_IN + 1 + SLAPO__CC_MAX_RES];
  int64_t off[SLAPO__CC_MAX_IN + 1], at = 0;
  uint64_t keys[SLAPO__CC_MAX_RAND];
  const slapo_attr *ne = slapo_node_attr(node, "numels");
  int k = 0;
  for (int i = 0; i < c->plan.n_in; i++) {
    ins[i] = c->plan.bwd_reads[i] ? slapo_tensor_data(in[k++]) : NULL;
    off[i] = at;
    at += ne->ints[i];
  }
  if (ne->n > c->plan.n_in) off[c->plan.n_in] = at, at += ne->ints[c->plan.n_in]; /* rows' ds */
  keys_of(node, c, env, keys);
  float *pk = slapo_tensor_data(out);
  double *work = slapo_node_attr_int(node, "work", 0) > 0 ? (double *)(pk + work_offset(at)) : NULL;
  if (c->plan.rows) { /* then the saved forward, then each result's gradient or NULL */
    const slapo_attr *has = slapo_node_attr(node, "dys");
    ins[c->plan.n_in] = c->plan.x_slot >= 0 ? slapo_tensor_data(in[k++]) : NULL;
    for (int r = 0; r < c->plan.n_res; r++)
      ins[c->plan.n_in + 1 + r] = has->ints[r] ? slapo_tensor_data(in[k++]) : NULL;
    int64_t N = slapo_node_attr_int(node, "numel", 0);
    if (N > 0)
      c->b(N, slapo_node_attr_int(node, "row", N), ins, NULL, pk, off, work, keys,
           env ? env->step : 0, env && env->training);
    return;
  }
  const slapo_tensor *dy = in[k];
  int64_t N = slapo_tensor_numel(dy);
  if (N == 0) return;
  c->b(N, slapo_node_attr_int(node, "row", N), ins, slapo_tensor_data(dy), pk, off, work, keys,
       env ? env->step : 0, env && env->training);
}

/* Tensor-parallel layout: the region is elementwise. Its random numbers
 * are drawn by element index of the value at hand (cc_gen.c), i.e. as if
 * replicated, so a region that draws them on a shard (a dropout on a
 * column-parallel output, a partial sum) is refused when the step is
 * built rather than given the wrong masks; such a region fuses after the
 * all-reduce, or with compiler=none (whose ops draw by layout). */
static slapo_status fwd_layout(slapo_node *node) {
  const cc_op *c = of_fwd(node->op);
  for (int i = 0; i < node->n_inputs && c->plan.n_rand > 0; i++) {
    const slapo_node *x = node->inputs[i];
    char ls[160], xs[128];
    if (slapo_layout_sharded(&x->layout))
      return slapo_error(SLAPO_UNSUPPORTED,
                         "cc: %s draws random numbers (dropout) and its input %d (%%%s %s) is "
                         "%s across the tensor-parallel ranks; cc draws them as if replicated: "
                         "fuse the region after the all-reduce, or with compiler=none",
                         node->target, i, x->name, slapo_shape_str(x->ndim, x->shape, xs, sizeof xs),
                         slapo_layout_str(&x->layout, ls, sizeof ls));
  }
  return slapo_layout_elementwise(node);
}

/* A row region normalises whole rows: its inputs must be replicated (a
 * tensor-parallel split of the row would need the row's sums across ranks). */
static slapo_status rows_layout(slapo_node *node) {
  for (int i = 0; i < node->n_inputs; i++) {
    const slapo_node *x = node->inputs[i];
    char ls[160];
    if (slapo_layout_sharded(&x->layout))
      return slapo_error(SLAPO_UNSUPPORTED, "cc: %s normalises rows and its input %d (%%%s) is "
                         "%s across the tensor-parallel ranks; fuse it where its inputs are "
                         "replicated", node->target, i, x->name,
                         slapo_layout_str(&x->layout, ls, sizeof ls));
  }
  node->layout = (slapo_layout){0}; /* replicated */
  return SLAPO_OK;
}

static slapo_status describe(cc_op *c, const char *name, const char *key) {
  snprintf(c->fwd_name, sizeof c->fwd_name, "%s_%.8s", name, key);
  snprintf(c->bwd_name, sizeof c->bwd_name, "%s_backward", c->fwd_name);
  c->fwd = (slapo_op){
      .name = c->fwd_name,
      .n_inputs = c->plan.n_in,
      .infer = fwd_infer,
      .ref = fwd_kernel,
      .backward = c->plan.rows ? NULL : fwd_backward,
      .backward_packed = c->plan.rows ? rows_backward : NULL,
      .layout = c->plan.rows ? rows_layout : fwd_layout,
      .contiguous_inputs = true,
      .doc = c->plan.rows ? "a fused region around a LayerNorm, RMSNorm or softmax, its results "
                            "packed (cc backend)"
                          : "a fused elementwise region (cc backend)",
      .test = {.exempt = "compiled at run time; tested against the none backend"},
  };
  c->bwd = (slapo_op){
      .name = c->bwd_name,
      .n_inputs = -1, /* the inputs it reads (plan.bwd_reads), then dy */
      .infer = bwd_infer,
      .ref = bwd_kernel,
      .contiguous_inputs = true,
      .doc = "every input gradient of a fused region, packed (cc backend)",
      .test = {.exempt = "compiled at run time", .checked_by = c->fwd_name},
  };
  SLAPO_TRY(slapo_op_register(&c->fwd));
  return slapo_op_register(&c->bwd);
}

static slapo_status cc_compile(const slapo_graph *region, const char *name,
                               const slapo_compile_opts *opts, const slapo_op **out) {
  *out = NULL;
  bool fast = true;
  for (int i = 0; opts && i < opts->n; i++) {
    if (strcmp(opts->keys[i], "math"))
      return slapo_error(SLAPO_INVALID_ARG, "cc: unknown option '%s' (the cc backend takes "
                         "math=fast|ref)", opts->keys[i]);
    if (strcmp(opts->values[i], "fast") && strcmp(opts->values[i], "ref"))
      return slapo_error(SLAPO_INVALID_ARG, "cc: math=%s; expected math=fast (the ops' fast "
                         "kernels' float math, the default) or math=ref (their reference "
                         "kernels' math)", opts->values[i]);
    fast = !strcmp(opts->values[i], "fast");
  }
  slapo__cc_plan plan;
  char *src = NULL, key[17];
  slapo__cc_fwd_fn f;
  slapo__cc_bwd_fn b;
  SLAPO_TRY(slapo__cc_generate(region, name, fast, &plan, &src));
  slapo_status s = slapo__cc_build(src, &f, &b, key);
  slapo_free(src);
  if (s != SLAPO_OK) return s;
  char op_name[96];
  snprintf(op_name, sizeof op_name, "%s_%.8s", name, key);
  if ((*out = slapo_op_find(op_name))) return SLAPO_OK; /* the same region fused before */
  cc_op *c = slapo_calloc(1, sizeof *c); /* lives until exit, like every registered op */
  if (!c) return slapo_error(SLAPO_NOMEM, "cc: out of memory");
  c->plan = plan, c->f = f, c->b = b;
  s = describe(c, name, key);
  if (s != SLAPO_OK) return s;
  *out = &c->fwd;
  return SLAPO_OK;
}

const slapo_compiler slapo__compiler_cc = {
    .name = "cc",
    .summary = "generated C for elementwise regions and regions around one LayerNorm, RMSNorm "
               "or softmax (forward and backward kernels), compiled with the system compiler "
               "into a cache; math=fast (the ops' fast kernels' float math, default) or "
               "math=ref (their reference kernels' math)",
    .compile = cc_compile,
    .ends_region = slapo__cc_row_op,
};
