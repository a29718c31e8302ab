/* tests/common/gradcheck.c - see gradcheck.h. Finite differences live here
 * rather than in autograd/ because running a graph needs exec/, which
 * autograd/ must not depend on (DESIGN.md §2). The loss is L(x) = sum(y(x) *
 * R) for a fixed random cotangent R, so dL/dx = backward(y, dy = R): one
 * scalar per perturbation checks the whole vector-Jacobian product.
 * Central differences: O(eps^2) truncation error (Nocedal & Wright,
 * "Numerical Optimization", §8.1); L is summed in double from f32 outputs. */
#include "common/gradcheck.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/autograd.h"

#define COTANGENT "gc_cotangent"
#define MAX_FD_ELEMS 2000
#define MAX_WRT 64 /* f32 inputs per example */

struct gc_case {
  const slapo_op *op;
  uint64_t seed;
  gc_settings st;
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_node *y;
  int n_leaf;
  slapo_node **leaf;   /* placeholders and params of the example, graph order */
  slapo_tensor **val;  /* val[j] bound to leaf[j], contiguous                 */
  int n_wrt;
  int *wrt_leaf;       /* leaf index of each f32 input                        */
  slapo_tensor *cot;   /* R [y shape] f32, backward cases only                */
  slapo_plan *plan;
  int n_out;
  char **out_names;
};

static void say(char *report, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *report, size_t cap, const char *fmt, ...) {
  if (!report || !cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(report, cap, fmt, ap);
  va_end(ap);
}

gc_settings gc_settings_of(const slapo_op *op) {
  const slapo_op_test *t = &op->test;
  gc_settings s = {t->lo, t->hi, t->int_high, t->fd_eps, t->atol, t->rtol, t->fast_atol};
  if (s.lo == 0 && s.hi == 0) s.lo = -1, s.hi = 1;
  if (s.int_high <= 0) s.int_high = 1;
  if (s.fd_eps == 0) s.fd_eps = 1e-3f;
  if (s.atol == 0) s.atol = 1e-2f;
  if (s.rtol == 0) s.rtol = 1e-2f;
  if (s.fast_atol == 0) s.fast_atol = 1e-5f;
  return s;
}

/* Row-major element i of t (any strides) as double. */
static double elem(const slapo_tensor *t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    off += (i % t->shape[d]) * t->strides[d];
    i /= t->shape[d];
  }
  const char *base = t->storage->data;
  switch (t->dtype) {
  case SLAPO_DTYPE_F32: return ((const float *)base)[off];
  case SLAPO_DTYPE_F64: return ((const double *)base)[off];
  case SLAPO_DTYPE_I32: return ((const int32_t *)base)[off];
  case SLAPO_DTYPE_I64: return (double)((const int64_t *)base)[off];
  default: return NAN;
  }
}

/* "[1, 4]" for row-major element i of a value of the given shape. */
static const char *index_str(int ndim, const int64_t *shape, int64_t i, char *buf, size_t cap) {
  int64_t idx[SLAPO_MAX_DIMS];
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return slapo_shape_str(ndim, idx, buf, cap);
}

void gc_max_diff(const slapo_tensor *a, const slapo_tensor *b, double *max_diff,
                 double *max_abs_a) {
  double md = 0, ma = 0;
  int64_t n = slapo_tensor_numel(a);
  for (int64_t i = 0; i < n; i++) {
    double x = elem(a, i), y = elem(b, i);
    if (isnan(x) && isnan(y)) continue;
    double d = fabs(x - y);
    if (!(d <= md)) md = isnan(d) ? INFINITY : d;
    if (fabs(x) > ma) ma = fabs(x);
  }
  if (max_diff) *max_diff = md;
  if (max_abs_a) *max_abs_a = ma;
}

void gc_case_free(gc_case *c) {
  if (!c) return;
  slapo_plan_free(c->plan);
  for (int j = 0; j < c->n_leaf; j++) slapo_tensor_free(c->val ? c->val[j] : NULL);
  slapo_tensor_free(c->cot);
  for (int i = 0; i < c->n_out; i++) slapo_free(c->out_names ? c->out_names[i] : NULL);
  slapo_free(c->out_names);
  slapo_free(c->val);
  slapo_free(c->leaf);
  slapo_free(c->wrt_leaf);
  slapo_ctx_free(c->ctx);
  slapo_graph_free(c->g);
  slapo_free(c);
}

/* Fills a fresh tensor for leaf n from Philox stream `stream`. */
static slapo_status fill_leaf(const gc_case *c, const slapo_node *n, uint64_t stream,
                              slapo_tensor **out, char *report, size_t cap) {
  slapo_status s = slapo_tensor_new(n->dtype, n->ndim, n->shape, out);
  if (s != SLAPO_OK) {
    say(report, cap, "input %s: %s", n->name, slapo_last_error());
    return s;
  }
  int64_t numel = slapo_tensor_numel(*out);
  void *d = slapo_tensor_data(*out);
  for (int64_t i = 0; i < numel; i++) {
    double u = slapo_rng_uniform(c->seed, stream, 0, (uint64_t)i);
    int64_t k = (int64_t)(u * (double)c->st.int_high);
    if (k >= c->st.int_high) k = c->st.int_high - 1;
    switch (n->dtype) {
    case SLAPO_DTYPE_F32: ((float *)d)[i] = (float)(c->st.lo + (c->st.hi - c->st.lo) * u); break;
    case SLAPO_DTYPE_I32: ((int32_t *)d)[i] = (int32_t)k; break;
    case SLAPO_DTYPE_I64: ((int64_t *)d)[i] = k; break;
    default:
      say(report, cap, "input %s has dtype %s; examples may use f32, i32 and i64 inputs",
          n->name, slapo_dtype_name(n->dtype));
      return SLAPO_UNSUPPORTED;
    }
  }
  return SLAPO_OK;
}

static slapo_status ctx_failed(const gc_case *c, const char *what, char *report, size_t cap) {
  slapo_status s = slapo_ctx_status(c->ctx);
  say(report, cap, "%s failed: %s: %s", what, slapo_status_name(s), slapo_ctx_message(c->ctx));
  return s;
}

static slapo_status case_build(gc_case *c, bool backward, char *report, size_t cap) {
  slapo_status s;
  if ((s = slapo_graph_new(&c->g)) != SLAPO_OK || (s = slapo_ctx_new(c->g, &c->ctx)) != SLAPO_OK) {
    say(report, cap, "out of memory");
    return s;
  }
  c->y = c->op->test.example(c->ctx);
  if (slapo_ctx_status(c->ctx) != SLAPO_OK) return ctx_failed(c, "example", report, cap);
  if (!c->y) {
    say(report, cap, "example returned NULL without recording an error");
    return SLAPO_STATE;
  }

  int n = slapo_graph_count(c->g);
  c->leaf = slapo_calloc((size_t)n + 1, sizeof *c->leaf);
  c->val = slapo_calloc((size_t)n + 1, sizeof *c->val);
  c->wrt_leaf = slapo_calloc((size_t)n + 1, sizeof *c->wrt_leaf);
  if (!c->leaf || !c->val || !c->wrt_leaf) return SLAPO_NOMEM;
  for (slapo_node *nd = slapo_graph_first(c->g); nd; nd = nd->next) {
    if (nd->kind != SLAPO_NODE_PLACEHOLDER && nd->kind != SLAPO_NODE_PARAM) continue;
    int j = c->n_leaf++;
    c->leaf[j] = nd;
    SLAPO_TRY(fill_leaf(c, nd, 0x5eed0000u + (uint64_t)j, &c->val[j], report, cap));
    if (nd->dtype == SLAPO_DTYPE_F32) c->wrt_leaf[c->n_wrt++] = j;
  }

  slapo_node *outs[1 + MAX_WRT];
  c->n_out = 1 + (backward ? c->n_wrt : 0);
  if (c->n_wrt > MAX_WRT) {
    say(report, cap, "example has %d f32 inputs; gradcheck takes at most %d", c->n_wrt,
        MAX_WRT);
    return SLAPO_LIMIT;
  }
  outs[0] = c->y;
  if (backward) {
    /* A bf16 output (to_bf16) has an f32 gradient, like every float. */
    if (c->y->dtype != SLAPO_DTYPE_F32 && c->y->dtype != SLAPO_DTYPE_BF16) {
      say(report, cap,
          "output %s has dtype %s: not differentiable (set .test.exempt to say why)",
          c->y->name, slapo_dtype_name(c->y->dtype));
      return SLAPO_UNSUPPORTED;
    }
    slapo_node *r = slapo_input(c->ctx, COTANGENT, SLAPO_DTYPE_F32, c->y->ndim, c->y->shape);
    slapo_node *wrt[MAX_WRT];
    for (int k = 0; k < c->n_wrt; k++) wrt[k] = c->leaf[c->wrt_leaf[k]];
    if (r) slapo_backward(c->ctx, c->y, r, c->n_wrt, wrt, outs + 1);
    if (slapo_ctx_status(c->ctx) != SLAPO_OK) return ctx_failed(c, "backward", report, cap);
    /* R is drawn in [-1, 1] whatever the op's input range. */
    gc_settings keep = c->st;
    c->st.lo = -1, c->st.hi = 1;
    s = fill_leaf(c, r, 0xc07a0000u, &c->cot, report, cap);
    c->st = keep;
    if (s != SLAPO_OK) return s;
  }
  slapo_output(c->ctx, c->n_out, outs);
  if (slapo_ctx_status(c->ctx) != SLAPO_OK) return ctx_failed(c, "output", report, cap);
  if ((s = slapo_graph_lint(c->g)) != SLAPO_OK) {
    say(report, cap, "graph fails lint after %s: %s", backward ? "backward" : "example",
        slapo_last_error());
    return s;
  }

  c->out_names = slapo_calloc((size_t)c->n_out, sizeof *c->out_names);
  if (!c->out_names) return SLAPO_NOMEM;
  c->out_names[0] = slapo_strdup("y");
  for (int k = 1; k < c->n_out; k++) {
    const char *t = c->leaf[c->wrt_leaf[k - 1]]->target;
    c->out_names[k] = slapo_malloc(strlen(t) + 2);
    if (c->out_names[k]) sprintf(c->out_names[k], "d%s", t);
  }
  for (int k = 0; k < c->n_out; k++)
    if (!c->out_names[k]) return SLAPO_NOMEM;
  return SLAPO_OK;
}

slapo_status gc_case_new(const slapo_op *op, uint64_t seed, bool backward, gc_case **out,
                         char *report, size_t cap) {
  *out = NULL;
  say(report, cap, "%s", "");
  if (!op->test.example) {
    say(report, cap, "op '%s' has no test.example", op->name);
    return SLAPO_INVALID_ARG;
  }
  gc_case *c = slapo_calloc(1, sizeof *c);
  if (!c) return SLAPO_NOMEM;
  c->op = op;
  c->seed = seed;
  c->st = gc_settings_of(op);
  slapo_status s = case_build(c, backward, report, cap);
  if (s != SLAPO_OK) {
    if (s == SLAPO_NOMEM && report && !report[0]) say(report, cap, "out of memory");
    gc_case_free(c);
    return s;
  }
  *out = c;
  return SLAPO_OK;
}

slapo_status gc_case_plan(gc_case *c, bool reference, char *report, size_t cap) {
  slapo_plan_free(c->plan);
  c->plan = NULL;
  /* Reference runs also poison freed buffers with NaN, so a planner bug
   * shows up as a failing check rather than as silently shared memory. */
  slapo_plan_opts o = {.reference = reference, .debug_alloc = reference};
  slapo_status s = slapo_plan_new(c->g, &o, &c->plan);
  if (s != SLAPO_OK)
    say(report, cap, "plan failed: %s: %s", slapo_status_name(s), slapo_last_error());
  return s;
}

slapo_status gc_case_run(gc_case *c, char *report, size_t cap) {
  slapo_status s = SLAPO_OK;
  for (int j = 0; j < c->n_leaf && s == SLAPO_OK; j++) {
    const slapo_node *n = c->leaf[j];
    s = n->kind == SLAPO_NODE_PARAM ? slapo_plan_bind_param(c->plan, n->target, c->val[j])
                                    : slapo_plan_bind_input(c->plan, n->target, c->val[j]);
  }
  if (s == SLAPO_OK && c->cot) s = slapo_plan_bind_input(c->plan, COTANGENT, c->cot);
  if (s != SLAPO_OK) {
    say(report, cap, "bind failed: %s: %s", slapo_status_name(s), slapo_last_error());
    return s;
  }
  slapo_kernel_env env = {.seed = c->seed, .step = 0, .training = true};
  s = slapo_plan_run(c->plan, &env);
  if (s != SLAPO_OK) {
    say(report, cap, "run failed: %s: %s", slapo_status_name(s), slapo_last_error());
    return s;
  }
  if (slapo_plan_output_count(c->plan) != c->n_out) {
    say(report, cap, "plan has %d outputs, expected %d", slapo_plan_output_count(c->plan),
        c->n_out);
    return SLAPO_STATE;
  }
  return SLAPO_OK;
}

const slapo_graph *gc_case_graph(const gc_case *c) { return c->g; }

slapo_status gc_case_copy_input0(gc_case *c, char *report, size_t cap) {
  slapo_graph_insert_before(c->g, c->y);
  slapo_node *copy = slapo_mul_scalar(c->ctx, c->y->inputs[0], 1.0);
  slapo_graph_insert_at_end(c->g);
  slapo_status s = copy ? slapo_node_set_input(c->y, 0, copy) : slapo_ctx_status(c->ctx);
  if (s != SLAPO_OK)
    say(report, cap, "copy of input 0 failed: %s: %s", slapo_status_name(s), slapo_last_error());
  return s;
}
int gc_case_output_count(const gc_case *c) { return c->n_out; }
const slapo_tensor *gc_case_output(const gc_case *c, int i) {
  return slapo_plan_output(c->plan, i);
}
const char *gc_case_output_name(const gc_case *c, int i) { return c->out_names[i]; }

/* ---- gradient check ---- */

typedef struct worst {
  double ratio, err, a, n;
  int input;   /* wrt index */
  int64_t elem;
  const char *mode;
} worst;

/* L = sum(y * R) in double for the current inputs of forward case f. */
static slapo_status loss(gc_case *f, const slapo_tensor *cot, double *L, char *report,
                         size_t cap) {
  SLAPO_TRY(gc_case_run(f, report, cap));
  const slapo_tensor *y = gc_case_output(f, 0);
  int64_t n = slapo_tensor_numel(y);
  const float *r = slapo_tensor_data(cot); /* R [y shape] contiguous */
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += elem(y, i) * (double)r[i];
  *L = acc;
  return SLAPO_OK;
}

/* One mode (reference or fast kernels): analytic gradients from b, numeric
 * ones from forward case f; updates *w and *max_err. */
static slapo_status check_mode(gc_case *b, gc_case *f, bool reference, worst *w,
                               double *max_err, char *report, size_t cap) {
  const char *mode = reference ? "reference" : "fast";
  SLAPO_TRY(gc_case_plan(b, reference, report, cap));
  SLAPO_TRY(gc_case_run(b, report, cap));
  SLAPO_TRY(gc_case_plan(f, reference, report, cap));
  const gc_settings *st = &b->st;
  for (int k = 0; k < b->n_wrt; k++) {
    const slapo_tensor *ga = gc_case_output(b, 1 + k); /* analytic [input shape] */
    slapo_tensor *x = f->val[f->wrt_leaf[k]];          /* x, contiguous f32       */
    float *xd = slapo_tensor_data(x);
    int64_t numel = slapo_tensor_numel(x);
    for (int64_t i = 0; i < numel; i++) {
      double a = elem(ga, i);
      if (!isfinite(a)) {
        char ib[96];
        say(report, cap, "analytic gradient d%s%s is %g [%s kernels]",
            b->leaf[b->wrt_leaf[k]]->target, index_str(x->ndim, x->shape, i, ib, sizeof ib), a,
            mode);
        return SLAPO_VERIFY;
      }
    }
    int64_t count = numel < MAX_FD_ELEMS ? numel : MAX_FD_ELEMS;
    for (int64_t s = 0; s < count; s++) {
      int64_t i = count == numel ? s : s * numel / count;
      float orig = xd[i];
      float xp = (float)(orig + st->fd_eps), xm = (float)(orig - st->fd_eps);
      double lp, lm;
      xd[i] = xp;
      slapo_status rs = loss(f, b->cot, &lp, report, cap);
      xd[i] = xm;
      if (rs == SLAPO_OK) rs = loss(f, b->cot, &lm, report, cap);
      xd[i] = orig;
      if (rs != SLAPO_OK) return rs;
      double num = (lp - lm) / ((double)xp - (double)xm);
      double a = elem(ga, i);
      double err = fabs(a - num);
      double tol = st->atol + st->rtol * fabs(num);
      double ratio = isfinite(err) ? err / tol : INFINITY;
      if (isfinite(err) && err > *max_err) *max_err = err;
      if (!isfinite(err)) *max_err = INFINITY;
      if (ratio > w->ratio || w->mode == NULL)
        *w = (worst){ratio, err, a, num, k, i, mode};
    }
  }
  return SLAPO_OK;
}

slapo_status gradcheck_op(const slapo_op *op, uint64_t seed, char *report, size_t cap) {
  gc_case *b = NULL, *f = NULL;
  slapo_status s = gc_case_new(op, seed, true, &b, report, cap);
  if (s == SLAPO_OK) s = gc_case_new(op, seed, false, &f, report, cap);
  worst w = {0};
  double max_err = 0;
  if (s == SLAPO_OK) s = check_mode(b, f, true, &w, &max_err, report, cap);
  if (s == SLAPO_OK) s = check_mode(b, f, false, &w, &max_err, report, cap);
  if (s == SLAPO_OK) {
    gc_settings st = gc_settings_of(op);
    if (!w.mode) {
      say(report, cap, "no f32 inputs: nothing to differentiate");
    } else {
      const slapo_node *x = b->leaf[b->wrt_leaf[w.input]];
      char ib[96], sb[96];
      say(report, cap,
          "%s: worst at d%s%s (input %s) with %s kernels: analytic %.7g, numeric %.7g, "
          "|a-n| %.3g (tol %.3g + %.3g*|n|); max |a-n| %.3g",
          w.ratio <= 1 ? "ok" : "gradient mismatch", x->target,
          index_str(x->ndim, x->shape, w.elem, ib, sizeof ib),
          slapo_shape_str(x->ndim, x->shape, sb, sizeof sb),
          w.mode, w.a, w.n, w.err, (double)st.atol, (double)st.rtol, max_err);
      if (!(w.ratio <= 1)) s = SLAPO_VERIFY;
    }
  }
  gc_case_free(b);
  gc_case_free(f);
  return s;
}

/* ---- fast vs reference ---- */

slapo_status fastcheck_op(const slapo_op *op, uint64_t seed, bool *skipped, char *report,
                          size_t cap) {
  if (skipped) *skipped = false;
  gc_case *c = NULL;
  slapo_status s = gc_case_new(op, seed, op->backward != NULL, &c, report, cap);
  if (s != SLAPO_OK) return s;
  bool any_fast = false;
  for (const slapo_node *n = slapo_graph_first(c->g); n; n = n->next)
    any_fast |= n->kind == SLAPO_NODE_CALL_OP && n->op && n->op->fast;
  if (!any_fast) {
    if (skipped) *skipped = true;
    say(report, cap, "skipped: no node of the example has a fast kernel");
    gc_case_free(c);
    return SLAPO_OK;
  }
  slapo_tensor **ref = slapo_calloc((size_t)c->n_out, sizeof *ref);
  if (!ref) s = SLAPO_NOMEM;
  if (s == SLAPO_OK) s = gc_case_plan(c, true, report, cap);
  if (s == SLAPO_OK) s = gc_case_run(c, report, cap);
  for (int i = 0; i < c->n_out && s == SLAPO_OK; i++)
    s = slapo_tensor_contiguous(gc_case_output(c, i), &ref[i]);
  if (s == SLAPO_OK) s = gc_case_plan(c, false, report, cap);
  if (s == SLAPO_OK) s = gc_case_run(c, report, cap);
  double worst_rel = 0;
  for (int i = 0; i < c->n_out && s == SLAPO_OK; i++) {
    double d, m;
    gc_max_diff(ref[i], gc_case_output(c, i), &d, &m);
    double tol = c->st.fast_atol * m;
    double rel = m > 0 ? d / m : (d > 0 ? INFINITY : 0);
    if (rel > worst_rel) worst_rel = rel;
    if (!(d <= tol)) {
      say(report, cap,
          "fast and reference kernels differ on %s: max |fast-ref| %.3g > %.3g * max|ref| "
          "(%.3g)",
          c->out_names[i], d, (double)c->st.fast_atol, m);
      s = SLAPO_VERIFY;
    }
  }
  if (s == SLAPO_OK)
    say(report, cap, "ok: max |fast-ref| / max|ref| = %.3g over %d outputs", worst_rel,
        c->n_out);
  for (int i = 0; ref && i < c->n_out; i++) slapo_tensor_free(ref[i]);
  slapo_free(ref);
  gc_case_free(c);
  return s;
}

/* Copies every output of c's last run into out [c->n_out] (owned). */
static slapo_status snapshot(gc_case *c, slapo_tensor **out) {
  for (int i = 0; i < c->n_out; i++) SLAPO_TRY(slapo_tensor_contiguous(gc_case_output(c, i), &out[i]));
  return SLAPO_OK;
}

slapo_status isacheck_op(const slapo_op *op, uint64_t seed, char *report, size_t cap) {
  gc_case *c = NULL;
  slapo_status s = gc_case_new(op, seed, op->backward != NULL, &c, report, cap);
  if (s != SLAPO_OK) return s;
  slapo_isa host = slapo_isa_host();
  slapo_tensor **top = slapo_calloc((size_t)c->n_out * 2, sizeof *top), **low = top + c->n_out;
  if (!top) s = SLAPO_NOMEM;
  slapo_isa_set_max(host);
  if (s == SLAPO_OK) s = gc_case_plan(c, false, report, cap);
  if (s == SLAPO_OK) s = gc_case_run(c, report, cap);
  if (s == SLAPO_OK) s = snapshot(c, top);
  for (int lv = (int)host - 1; lv >= SLAPO_ISA_BASELINE && s == SLAPO_OK; lv--) {
    slapo_isa_set_max((slapo_isa)lv);
    s = gc_case_run(c, report, cap);
    if (s == SLAPO_OK) s = snapshot(c, low);
    for (int i = 0; i < c->n_out && s == SLAPO_OK; i++) {
      size_t nb = (size_t)slapo_tensor_numel(top[i]) * slapo_dtype_size(top[i]->dtype);
      if (memcmp(slapo_tensor_data(top[i]), slapo_tensor_data(low[i]), nb) != 0) {
        double d, m;
        gc_max_diff(top[i], low[i], &d, &m);
        say(report, cap, "fast kernels differ between %s and %s on %s: max |diff| %.3g",
            slapo_isa_name(host), slapo_isa_name((slapo_isa)lv), c->out_names[i], d);
        s = SLAPO_VERIFY;
      }
    }
    for (int i = 0; i < c->n_out; i++) slapo_tensor_free(low[i]), low[i] = NULL;
  }
  slapo_isa_set_max(host);
  if (s == SLAPO_OK)
    say(report, cap, "ok: %d outputs byte-identical from %s down to baseline", c->n_out,
        slapo_isa_name(host));
  for (int i = 0; top && i < c->n_out; i++) slapo_tensor_free(top[i]);
  slapo_free(top);
  gc_case_free(c);
  return s;
}

/* ---- coverage ---- */

slapo_status gc_mark_ops_used(const slapo_op *op, bool backward, bool *used) {
  gc_case *c = NULL;
  SLAPO_TRY(gc_case_new(op, 1, backward, &c, NULL, 0));
  int n_ops = slapo_op_count();
  for (const slapo_node *n = slapo_graph_first(c->g); n; n = n->next) {
    if (n->kind != SLAPO_NODE_CALL_OP) continue;
    for (int i = 0; i < n_ops; i++)
      if (slapo_op_at(i) == n->op) used[i] = true;
  }
  gc_case_free(c);
  return SLAPO_OK;
}
