/* exec/run.c - the executor: binding inputs and parameters, running the
 * planned nodes in graph order (fast kernel unless opts.reference, view ops
 * fill a header over their input's storage), copying strided inputs of
 * contiguous_inputs ops into a reused scratch buffer, adding accumulated
 * outputs into their bound tensors as soon as they are computed, per-node
 * timing and the live-bytes high-water mark. The hot path allocates nothing
 * except scratch growth and, in debug allocation mode, one block per buffer.
 * Layer: exec. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "exec/internal.h"
#include "slapo/ops/vmath.h"

/* ------------------------------------------------------------------------ */
/* Binding                                                                   */
/* ------------------------------------------------------------------------ */

/* Binds `t` to every node of `kind` whose target is `name`; checks them all
 * before changing any. `what` is the caller's name for messages. */
static slapo_status bind(slapo_plan *p, slapo_node_kind kind, const char *what, const char *name,
                         const slapo_tensor *t) {
  if (!p || !name) return slapo_error(SLAPO_INVALID_ARG, "%s: plan or name is NULL", what);
  if (!t) return slapo_error(SLAPO_INVALID_ARG, "%s: tensor for '%s' is NULL", what, name);
  if (!t->storage)
    return slapo_error(SLAPO_INVALID_ARG,
                       "%s: tensor for '%s' is a meta tensor (no storage); materialize it "
                       "before binding",
                       what, name);
  int found = 0;
  for (int i = 0; i < p->n_nodes; i++) {
    const slapo_node *n = p->nodes[i].node;
    if (n->kind != kind || strcmp(n->target, name)) continue;
    found++;
    bool dt_ok = t->dtype == n->dtype;
    if (!dt_ok || !slapo_shape_equal(t->ndim, t->shape, n->ndim, n->shape)) {
      char want[160], got[160];
      return slapo_error(dt_ok ? SLAPO_SHAPE : SLAPO_DTYPE,
                         "%s: '%s' (node '%s') expects %s%s, got %s%s; bind a tensor of the "
                         "planned dtype and shape or re-plan the graph",
                         what, name, n->name, slapo_dtype_name(n->dtype),
                         slapo_shape_str(n->ndim, n->shape, want, sizeof want),
                         slapo_dtype_name(t->dtype),
                         slapo_shape_str(t->ndim, t->shape, got, sizeof got));
    }
  }
  if (!found)
    return slapo_error(SLAPO_NOT_FOUND, "%s: the graph has no %s named '%s'", what,
                       kind == SLAPO_NODE_PLACEHOLDER ? "placeholder" : "param", name);
  for (int i = 0; i < p->n_nodes; i++) {
    const slapo_node *n = p->nodes[i].node;
    if (n->kind == kind && !strcmp(n->target, name)) p->nodes[i].val = t;
  }
  return SLAPO_OK;
}

slapo_status slapo_plan_bind_input(slapo_plan *p, const char *name, const slapo_tensor *t) {
  return bind(p, SLAPO_NODE_PLACEHOLDER, "plan_bind_input", name, t);
}

slapo_status slapo_plan_bind_param(slapo_plan *p, const char *path, const slapo_tensor *t) {
  return bind(p, SLAPO_NODE_PARAM, "plan_bind_param", path, t);
}

static bool accumulated(const slapo_plan *p, int i) {
  return p->opts.accumulate_from > 0 && i >= p->opts.accumulate_from && i < p->n_outputs;
}

slapo_status slapo_plan_bind_accumulator(slapo_plan *p, int i, slapo_tensor *acc) {
  if (!p || !acc)
    return slapo_error(SLAPO_INVALID_ARG, "plan_bind_accumulator: plan or tensor is NULL");
  if (!accumulated(p, i))
    return slapo_error(SLAPO_INVALID_ARG,
                       "plan_bind_accumulator: output %d is not accumulated (the plan has %d "
                       "outputs; opts.accumulate_from = %d)",
                       i, p->n_outputs, p->opts.accumulate_from);
  const slapo_node *v = p->nodes[p->nodes[p->out_idx].in[i]].node;
  if (!acc->storage || acc->dtype != SLAPO_DTYPE_F32 || v->dtype != SLAPO_DTYPE_F32 ||
      !slapo_tensor_is_contiguous(acc))
    return slapo_error(SLAPO_INVALID_ARG,
                       "plan_bind_accumulator: output %d ('%s'): the accumulator must be a "
                       "contiguous f32 tensor with storage, and the value f32",
                       i, v->name);
  if (!slapo_shape_equal(acc->ndim, acc->shape, v->ndim, v->shape)) {
    char want[160], got[160];
    return slapo_error(SLAPO_SHAPE,
                       "plan_bind_accumulator: output %d ('%s') is %s, the accumulator %s", i,
                       v->name, slapo_shape_str(v->ndim, v->shape, want, sizeof want),
                       slapo_shape_str(acc->ndim, acc->shape, got, sizeof got));
  }
  /* A SLAPO_ACC_WRITE run writes each accumulator once: two outputs in one
   * storage would overwrite each other's value. */
  const char *a0 = slapo_tensor_data(acc);
  size_t an = slapo_tensor_nbytes(acc);
  for (int j = 0; j < p->n_outputs; j++) {
    const slapo_tensor *o = p->accumulator[j];
    if (!o || j == i) continue;
    const char *b0 = slapo_tensor_data(o);
    if (a0 < b0 + slapo_tensor_nbytes(o) && b0 < a0 + an)
      return slapo_error(SLAPO_INVALID_ARG,
                         "plan_bind_accumulator: output %d ('%s'): the accumulator shares "
                         "memory with output %d's; bind one tensor per output",
                         i, v->name, j);
  }
  p->accumulator[i] = acc;
  return SLAPO_OK;
}

double slapo_plan_accumulator_sumsq(const slapo_plan *p, int i) {
  if (!p || !p->measured || !accumulated(p, i) || !p->accumulator[i]) return NAN;
  return p->sumsq[i];
}

/* acc += val, or acc = val when `write`, elementwise (val any strides).
 * Parallel over the elements. */
static void accumulate(slapo_tensor *acc, const slapo_tensor *val, bool write) {
  float *dst = slapo_tensor_data(acc); /* [numel] contiguous */
  int64_t numel = slapo_tensor_numel(acc);
  if (slapo_tensor_is_contiguous(val)) {
    const float *src = slapo_tensor_data(val); /* [numel] */
    if (write) {
#pragma omp parallel for schedule(static) if (numel > 65536)
      for (int64_t j = 0; j < numel; j++) dst[j] = src[j];
      return;
    }
#pragma omp parallel for schedule(static) if (numel > 65536)
    for (int64_t j = 0; j < numel; j++) dst[j] += src[j];
    return;
  }
  /* A strided value (a view of a bound tensor): the odometer walk of the
   * reference gathers, one element at a time. */
  const float *src = slapo_tensor_data(val);
  int64_t idx[SLAPO_MAX_DIMS] = {0}, off = 0;
  for (int64_t j = 0; j < numel; j++) {
    dst[j] = write ? src[off] : dst[j] + src[off];
    for (int k = val->ndim - 1; k >= 0; k--) {
      off += val->strides[k];
      if (++idx[k] < val->shape[k]) break;
      off -= val->strides[k] * val->shape[k];
      idx[k] = 0;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Running                                                                   */
/* ------------------------------------------------------------------------ */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static size_t round_up(size_t n) { return (n + SLAPO__EXEC_ALIGN - 1) & ~(SLAPO__EXEC_ALIGN - 1); }

/* Replaces strided inputs of a contiguous_inputs op in p->ins by contiguous
 * copies in the plan's scratch buffer (valid for this node only). Only
 * inputs that are bound tensors or views can be strided, and whether they
 * are is known only now. Errors: SLAPO_NOMEM (growing the scratch). */
static slapo_status make_contiguous(slapo_plan *p, exec_node *e) {
  size_t need = 0;
  for (int j = 0; j < e->n_in; j++)
    if (e->maybe_strided[j] && !slapo_tensor_is_contiguous(p->ins[j]))
      need += round_up(slapo_tensor_nbytes(p->ins[j]));
  if (need == 0) return SLAPO_OK;
  if (need > p->scratch_nbytes) {
    slapo_aligned_free(p->scratch);
    p->scratch_nbytes = 0;
    p->scratch = slapo_aligned_alloc(need);
    if (!p->scratch)
      return slapo_error(SLAPO_NOMEM,
                         "plan_run: out of memory for %zu bytes of scratch to make the inputs "
                         "of node '%s' (op '%s') contiguous",
                         need, e->node->name, e->node->op->name);
    p->scratch_nbytes = need;
  }
  size_t off = 0;
  for (int j = 0; j < e->n_in; j++) {
    const slapo_tensor *src = p->ins[j];
    if (!e->maybe_strided[j] || slapo_tensor_is_contiguous(src)) continue;
    slapo_storage *st = &p->copy_storage[j];
    slapo_tensor *c = &p->copies[j];
    size_t nbytes = slapo_tensor_nbytes(src);
    *st = (slapo_storage){.data = (char *)p->scratch + off, .nbytes = nbytes, .refcount = 1,
                          .external = true};
    c->dtype = src->dtype;
    c->ndim = src->ndim;
    memcpy(c->shape, src->shape, sizeof c->shape);
    slapo_shape_contiguous_strides(c->ndim, c->shape, c->strides);
    c->offset = 0;
    c->storage = st;
    slapo_status s = slapo_tensor_copy(c, src);
    SLAPO_ASSERT(s == SLAPO_OK);
    if (!e->logged_copy) {
      char sh[160];
      slapo_logf(1,
                 "exec: node '%s' (op '%s'): input %d ('%s') %s is strided; copying it to "
                 "contiguous scratch on every run",
                 e->node->name, e->node->op->name, j, e->node->inputs[j]->name,
                 slapo_shape_str(src->ndim, src->shape, sh, sizeof sh));
      e->logged_copy = true;
    }
    p->ins[j] = c;
    off += round_up(nbytes);
  }
  return SLAPO_OK;
}

/* Fills a view node's header: starts as a contiguous view of input 0's
 * storage at its offset, then the op's view function sets shape, strides
 * and offset. Inputs of a view are never copied to scratch (the view must
 * alias the real storage), so a view function handles any input strides. */
static void run_view(slapo_plan *p, exec_node *e) {
  const slapo_tensor *in0 = p->ins[0];
  slapo_tensor *o = &e->t;
  slapo_storage *st = in0->storage;
  o->dtype = e->node->dtype;
  o->ndim = e->node->ndim;
  memcpy(o->shape, e->node->shape, sizeof o->shape);
  slapo_shape_contiguous_strides(o->ndim, o->shape, o->strides);
  o->offset = in0->offset;
  o->storage = st;
  /* The executor owns these headers and never releases through them: a
   * view function that takes a storage reference must not leak one. */
  int rc = st->refcount;
  e->node->op->view(e->node, p->ins, o);
  SLAPO_ASSERT(o->storage == st); /* a view shares its input's storage */
  st->refcount = rc;
}

/* Points buffer b at its place for this run: the arena, or under
 * SLAPO_ACC_WRITE its accumulator (find_redirects in plan.c) when that is
 * aligned as planned buffers are. */
static void place_buffer(slapo_plan *p, exec_buf *b, bool write) {
  void *at = (char *)p->placed + b->offset;
  if (write && b->redirect >= 0) {
    void *acc = slapo_tensor_data(p->accumulator[b->redirect]);
    if ((uintptr_t)acc % SLAPO__EXEC_ALIGN == 0) at = acc;
  }
  b->storage.data = at;
}

/* After node e ran: its accumulated values into their accumulators (a
 * value already written in place by its kernel is left alone), each
 * measured once final. */
static void put_accumulated(slapo_plan *p, const exec_node *e, unsigned flags) {
  for (int k = 0; k < e->n_acc; k++) {
    int j = e->acc[k];
    slapo_tensor *acc = p->accumulator[j];
    bool write = flags & SLAPO_ACC_WRITE;
    if (!write || slapo_tensor_data(e->val) != slapo_tensor_data(acc))
      accumulate(acc, e->val, write);
    if (flags & SLAPO_ACC_MEASURE)
      p->sumsq[j] = slapo__sum_squares(slapo_tensor_data(acc), slapo_tensor_numel(acc));
  }
}

slapo_status slapo_plan_run(slapo_plan *p, const slapo_kernel_env *env) {
  return slapo_plan_run_acc(p, env, SLAPO_ACC_ADD);
}

static void place_all(slapo_plan *p, void *mem, int i0);

/* Checks that p can run: flags known, every placeholder and param bound,
 * every accumulated output given its accumulator. `what` names the caller. */
static slapo_status check_runnable(const slapo_plan *p, const char *what, unsigned acc_flags) {
  if (!p) return slapo_error(SLAPO_INVALID_ARG, "%s: plan is NULL", what);
  if (acc_flags & ~(unsigned)(SLAPO_ACC_WRITE | SLAPO_ACC_MEASURE))
    return slapo_error(SLAPO_INVALID_ARG, "%s: unknown accumulation flags 0x%x", what,
                       acc_flags);
  for (int i = 0; i < p->n_nodes; i++) {
    const exec_node *e = &p->nodes[i];
    if (e->kind != EXEC_BOUND || e->val) continue;
    bool ph = e->node->kind == SLAPO_NODE_PLACEHOLDER;
    return slapo_error(SLAPO_STATE,
                       "%s: %s '%s' (node '%s') is not bound; call %s(plan, \"%s\", "
                       "tensor) before running",
                       what, ph ? "placeholder" : "param", e->node->target, e->node->name,
                       ph ? "slapo_plan_bind_input" : "slapo_plan_bind_param", e->node->target);
  }
  for (int i = 0; i < p->n_outputs; i++) {
    if (!accumulated(p, i) || p->accumulator[i]) continue;
    return slapo_error(SLAPO_STATE,
                       "%s: output %d ('%s') is accumulated but has no accumulator; "
                       "call slapo_plan_bind_accumulator(plan, %d, tensor) before running",
                       what, i, p->nodes[p->nodes[p->out_idx].in[i]].node->name, i);
  }
  return SLAPO_OK;
}

/* Runs nodes [i0, i1) in order into the arena the buffers are placed in. */
static slapo_status run_nodes(slapo_plan *p, int i0, int i1, const slapo_kernel_env *env,
                              unsigned acc_flags) {
  slapo_kernel_env dflt = {.seed = 0, .step = 0, .training = true};
  if (!env) env = &dflt;
  p->ran = false;
  p->measured = false;
  p->acc_ms = 0;
  /* Debug allocation mode gives each buffer its own block: values are
   * copied into accumulators there. */
  bool direct = (acc_flags & SLAPO_ACC_WRITE) && !p->opts.debug_alloc;
  size_t live = 0, peak = 0;
  for (int i = i0; i < i1; i++) {
    exec_node *e = &p->nodes[i];
    double t0 = p->opts.timing ? now_ms() : 0;
    if (e->kind == EXEC_KERNEL || e->kind == EXEC_VIEW) {
      for (int j = 0; j < e->n_in; j++) p->ins[j] = p->nodes[e->in[j]].val;
    }
    if (e->kind == EXEC_KERNEL) {
      exec_buf *b = &p->bufs[e->buf];
      bool def = b->def == i; /* else an in-place op on its input's buffer */
      slapo_status s = SLAPO_OK;
      if (def && p->opts.debug_alloc) s = slapo__debugmem_acquire(p, b, e->node);
      else if (def) place_buffer(p, b, direct);
      if (s == SLAPO_OK && e->any_maybe_strided) s = make_contiguous(p, e);
      if (s != SLAPO_OK) {
        if (p->opts.debug_alloc) slapo__debugmem_release_all(p);
        return s;
      }
      e->kernel(e->node, p->ins, &e->t, env);
      if (def) live += b->nbytes;
      if (live > peak) peak = live;
    } else if (e->kind == EXEC_VIEW) {
      run_view(p, e);
    }
    if (p->opts.timing && e->n_acc) {
      double t1 = now_ms();
      put_accumulated(p, e, acc_flags);
      double dt = now_ms() - t1; /* kept out of the node's own time */
      p->acc_ms += dt, t0 += dt;
    } else {
      put_accumulated(p, e, acc_flags);
    }
    for (int k = 0; k < e->n_release; k++) {
      exec_buf *b = &p->bufs[e->release[k]];
      live -= b->nbytes;
      if (p->opts.debug_alloc) slapo__debugmem_poison(b);
    }
    if (p->opts.timing) p->ms[i] = now_ms() - t0;
  }
  p->measured_peak_nbytes = peak;
  p->ran = true;
  p->measured = acc_flags & SLAPO_ACC_MEASURE;
  return SLAPO_OK;
}

slapo_status slapo_plan_run_acc(slapo_plan *p, const slapo_kernel_env *env, unsigned acc_flags) {
  SLAPO_TRY(check_runnable(p, "plan_run", acc_flags));
  if (p->opts.debug_alloc) slapo__debugmem_release_all(p);
  p->placed = p->arena; /* every buffer is placed as its writer runs */
  return run_nodes(p, 0, p->n_nodes, env, acc_flags);
}

/* ------------------------------------------------------------------------ */
/* Spans in arenas of their own                                              */
/* ------------------------------------------------------------------------ */

struct slapo_plan_arena {
  const slapo_plan *plan;
  void *mem; /* plan->peak_nbytes, SLAPO__EXEC_ALIGN-aligned */
};

slapo_status slapo_plan_arena_new(const slapo_plan *p, slapo_plan_arena **out) {
  *out = NULL;
  if (!p) return slapo_error(SLAPO_INVALID_ARG, "plan_arena_new: plan is NULL");
  if (p->opts.debug_alloc)
    return slapo_error(SLAPO_UNSUPPORTED, "plan_arena_new: the plan is in debug allocation "
                                          "mode (SLAPO_DEBUG_MEM), which has no arena to "
                                          "duplicate; run it whole");
  slapo_plan_arena *a = slapo_calloc(1, sizeof *a);
  void *mem = slapo_aligned_alloc(p->peak_nbytes ? p->peak_nbytes : SLAPO__EXEC_ALIGN);
  if (!a || !mem) {
    slapo_free(a);
    slapo_aligned_free(mem);
    return slapo_error(SLAPO_NOMEM, "plan_arena_new: out of memory for %zu bytes",
                       p->peak_nbytes);
  }
  a->plan = p, a->mem = mem;
  *out = a;
  return SLAPO_OK;
}

void slapo_plan_arena_free(slapo_plan_arena *a) {
  if (!a) return;
  slapo_aligned_free(a->mem);
  slapo_free(a);
}

/* Places every buffer in `mem` and refills the headers of the view nodes
 * before node i0, so the nodes from i0 on read the values an earlier span
 * left in `mem` and the tensors bound now. (A view of a buffer keeps its
 * header across arenas, as the buffer's storage moves; a view of a bound
 * tensor, left as a view only when its op has no reference kernel to copy
 * with, points at the tensor bound when it ran.) */
static void place_all(slapo_plan *p, void *mem, int i0) {
  for (int r = 0; r < p->n_bufs; r++) p->bufs[r].storage.data = (char *)mem + p->bufs[r].offset;
  for (int i = 0; i < i0; i++) {
    exec_node *e = &p->nodes[i];
    if (e->kind != EXEC_VIEW) continue;
    for (int j = 0; j < e->n_in; j++) p->ins[j] = p->nodes[e->in[j]].val;
    run_view(p, e);
  }
  p->placed = mem;
}

slapo_status slapo_plan_run_span(slapo_plan *p, slapo_plan_arena *a, const slapo_node *from,
                                 const slapo_node *stop, const slapo_kernel_env *env,
                                 unsigned acc_flags) {
  SLAPO_TRY(check_runnable(p, "plan_run_span", acc_flags));
  if (p->opts.debug_alloc)
    return slapo_error(SLAPO_UNSUPPORTED, "plan_run_span: the plan is in debug allocation mode "
                                          "(SLAPO_DEBUG_MEM); run it whole");
  if (a && a->plan != p)
    return slapo_error(SLAPO_INVALID_ARG, "plan_run_span: the arena was made for another plan");
  int i0 = from ? slapo__plan_index(p, from) : 0;
  int i1 = stop ? slapo__plan_index(p, stop) : p->n_nodes;
  if (i0 < 0 || i1 < 0)
    return slapo_error(SLAPO_INVALID_ARG, "plan_run_span: node '%s' is not in the plan",
                       i0 < 0 ? from->name : stop->name);
  if (i1 < i0)
    return slapo_error(SLAPO_INVALID_ARG, "plan_run_span: node '%s' comes after '%s'",
                       from->name, stop->name);
  place_all(p, a ? a->mem : p->arena, i0);
  return run_nodes(p, i0, i1, env, acc_flags);
}

int slapo_plan_output_count(const slapo_plan *p) {
  return p ? p->nodes[p->out_idx].node->n_inputs : 0;
}

const slapo_tensor *slapo_plan_output(const slapo_plan *p, int i) {
  if (!p || !p->ran || i < 0 || i >= slapo_plan_output_count(p) || accumulated(p, i))
    return NULL;
  return p->nodes[p->nodes[p->out_idx].in[i]].val;
}
