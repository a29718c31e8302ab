/* exec/plan.c - the memory planner: classifies nodes (bound value, kernel,
 * view, output), computes liveness per *storage* (a kernel's buffer lives
 * until the last reader of it or of any view of it; output values live until
 * the next run), and assigns offsets in one activation arena with a greedy
 * best-fit over free intervals, allocating at definition and releasing after
 * the last use (the scheme of TFLite's and ggml's static allocators). Builds
 * every tensor header once so a run does no allocation. Layer: exec. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "exec/internal.h"

/* ------------------------------------------------------------------------ */
/* Free-interval allocator                                                   */
/* ------------------------------------------------------------------------ */

/* Free gaps below `top`, sorted by offset and never adjacent (coalesced); a
 * gap that reaches `top` is folded into it, so every gap is followed by a
 * live buffer. At most one gap per live buffer, hence cap = n_bufs + 1. */
typedef struct gap {
  size_t off, size;
} gap;

typedef struct freelist {
  gap *gaps;
  int n;
  size_t top, peak;
} freelist;

/* Best fit: the smallest gap that holds `size` (lowest offset on ties), or
 * the top of the arena when none does. */
static size_t fl_alloc(freelist *f, size_t size) {
  int best = -1;
  for (int i = 0; i < f->n; i++)
    if (f->gaps[i].size >= size && (best < 0 || f->gaps[i].size < f->gaps[best].size)) best = i;
  if (best < 0) {
    size_t off = f->top;
    f->top += size;
    if (f->top > f->peak) f->peak = f->top;
    return off;
  }
  size_t off = f->gaps[best].off;
  f->gaps[best].off += size;
  f->gaps[best].size -= size;
  if (f->gaps[best].size == 0) {
    memmove(&f->gaps[best], &f->gaps[best + 1], (size_t)(f->n - best - 1) * sizeof(gap));
    f->n--;
  }
  return off;
}

static void fl_release(freelist *f, size_t off, size_t size) {
  if (size == 0) return;
  int i = 0;
  while (i < f->n && f->gaps[i].off < off) i++;
  memmove(&f->gaps[i + 1], &f->gaps[i], (size_t)(f->n - i) * sizeof(gap));
  f->gaps[i] = (gap){off, size};
  f->n++;
  /* Merge with the following gap, then with the preceding one. */
  if (i + 1 < f->n && f->gaps[i].off + f->gaps[i].size == f->gaps[i + 1].off) {
    f->gaps[i].size += f->gaps[i + 1].size;
    memmove(&f->gaps[i + 1], &f->gaps[i + 2], (size_t)(f->n - i - 2) * sizeof(gap));
    f->n--;
  }
  if (i > 0 && f->gaps[i - 1].off + f->gaps[i - 1].size == f->gaps[i].off) {
    f->gaps[i - 1].size += f->gaps[i].size;
    memmove(&f->gaps[i], &f->gaps[i + 1], (size_t)(f->n - i - 1) * sizeof(gap));
    f->n--;
    i--;
  }
  if (f->gaps[i].off + f->gaps[i].size == f->top) {
    f->top = f->gaps[i].off;
    f->n--;
  }
}

/* ------------------------------------------------------------------------ */
/* Node lookup                                                               */
/* ------------------------------------------------------------------------ */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (const slapo_node *const *)a;
  uintptr_t y = (uintptr_t) * (const slapo_node *const *)b;
  return x < y ? -1 : x > y;
}

int slapo__plan_index(const slapo_plan *p, const slapo_node *n) {
  if (!p || !n) return -1;
  const slapo_node **hit = bsearch(&n, p->by_ptr, (size_t)p->n_nodes, sizeof *p->by_ptr, cmp_ptr);
  return hit ? p->by_ptr_idx[hit - p->by_ptr] : -1;
}

/* ------------------------------------------------------------------------ */
/* Planning                                                                  */
/* ------------------------------------------------------------------------ */

#define ALLOC(p, T, count)                                                     \
  ((T *)slapo_arena_alloc((p)->mem, (size_t)(count) * sizeof(T) + 1, _Alignof(T)))

static slapo_status nomem(const char *what) {
  return slapo_error(SLAPO_NOMEM, "plan_new: out of memory (%s)", what);
}

/* Sorted pointer index, so that inputs map to node indices in O(log n). */
static slapo_status build_index(slapo_plan *p) {
  p->by_ptr = ALLOC(p, const slapo_node *, p->n_nodes);
  p->by_ptr_idx = ALLOC(p, int, p->n_nodes);
  if (!p->by_ptr || !p->by_ptr_idx) return nomem("node index");
  for (int i = 0; i < p->n_nodes; i++) p->by_ptr[i] = p->nodes[i].node;
  qsort(p->by_ptr, (size_t)p->n_nodes, sizeof *p->by_ptr, cmp_ptr);
  /* The position of each node in graph order, found by a second bsearch on
   * the (still unlabelled) sorted array. */
  for (int i = 0; i < p->n_nodes; i++) {
    const slapo_node *n = p->nodes[i].node;
    const slapo_node **hit =
        bsearch(&n, p->by_ptr, (size_t)p->n_nodes, sizeof *p->by_ptr, cmp_ptr);
    SLAPO_ASSERT(hit);
    p->by_ptr_idx[hit - p->by_ptr] = i;
  }
  return SLAPO_OK;
}

/* Decides how each node is executed; rejects what the executor cannot run. */
static slapo_status classify(slapo_plan *p) {
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    const slapo_node *n = e->node;
    e->buf = -1;
    switch (n->kind) {
    case SLAPO_NODE_PLACEHOLDER:
    case SLAPO_NODE_PARAM: e->kind = EXEC_BOUND; break;
    case SLAPO_NODE_OUTPUT: e->kind = EXEC_OUTPUT; break;
    case SLAPO_NODE_CALL_MODULE:
      return slapo_error(SLAPO_STATE,
                         "plan_new: call_module node '%s' (module '%s') must be inlined before "
                         "planning; the executor runs ops only (flatten the traced module)",
                         n->name, n->target);
    case SLAPO_NODE_TUPLE:
      return slapo_error(SLAPO_STATE,
                         "plan_new: tuple node '%s' (returned by '%s') is still in the graph; "
                         "a built graph reads its items (slapo_getitem) and drops it",
                         n->name, n->origin && n->origin[0] ? n->origin : ".");
    case SLAPO_NODE_GETITEM:
      return slapo_error(SLAPO_STATE,
                         "plan_new: getitem node '%s' reads result %d of '%s'; multi-result "
                         "values must be lowered to single-result ops before planning",
                         n->name, n->item, n->n_inputs ? n->inputs[0]->name : "?");
    case SLAPO_NODE_CALL_OP: {
      const slapo_op *op = n->op;
      if (!op)
        return slapo_error(SLAPO_STATE,
                           "plan_new: call_op node '%s' (op '%s') has no op descriptor; build "
                           "it with slapo_op_call",
                           n->name, n->target);
      if (n->n_results > 0)
        return slapo_error(SLAPO_STATE,
                           "plan_new: node '%s' (op '%s') returns %d results; multi-result "
                           "values must be lowered to single-result ops before planning",
                           n->name, op->name, n->n_results);
      if (op->view) {
        if (n->n_inputs < 1)
          return slapo_error(SLAPO_STATE,
                             "plan_new: view op '%s' (node '%s') has no input to view", op->name,
                             n->name);
        e->kind = EXEC_VIEW;
      } else {
        e->kind = EXEC_KERNEL;
        e->kernel = (!p->opts.reference && op->fast) ? op->fast : op->ref;
        if (!e->kernel)
          return slapo_error(SLAPO_STATE,
                             "plan_new: op '%s' (node '%s') has no kernel (ref is NULL and it "
                             "is not a view op)",
                             op->name, n->name);
      }
      break;
    }
    }
  }
  return SLAPO_OK;
}

/* Byte size of node n's value rounded up to the alignment. */
static slapo_status value_nbytes(const slapo_node *n, size_t *out) {
  uint64_t bytes = slapo_dtype_size(n->dtype);
  for (int d = 0; d < n->ndim; d++) {
    uint64_t dim = (uint64_t)n->shape[d];
    if (dim && bytes > (SIZE_MAX - SLAPO__EXEC_ALIGN) / dim) {
      char buf[160];
      return slapo_error(SLAPO_NOMEM, "plan_new: node '%s' %s%s is too large to address",
                         n->name, slapo_dtype_name(n->dtype),
                         slapo_shape_str(n->ndim, n->shape, buf, sizeof buf));
    }
    bytes *= dim;
  }
  *out = ((size_t)bytes + SLAPO__EXEC_ALIGN - 1) & ~(SLAPO__EXEC_ALIGN - 1);
  return SLAPO_OK;
}

/* In-place ops (op->inplace): node i takes over the buffer r of its input 0
 * when input 0 is a kernel's value (not a bound tensor: the caller's; not a
 * view: part of another buffer), i is r's last reader (no later node, view
 * or kept output reads the value i overwrites), no other input of i is in r
 * (a kernel reading src while writing base in the same buffer), and the
 * sizes agree. i's own buffer dies (def = -1); r lives on until i's last
 * reader. In graph order, so chains of in-place ops share one buffer.
 * Why: index_add into a tied embedding's [V, C] gradient otherwise copies
 * the table (308 MB of traffic a step on GPT-2 124M) to add N rows. */
static void share_inplace(slapo_plan *p) {
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    if (e->kind != EXEC_KERNEL || !e->node->op->inplace || e->n_in < 1) continue;
    const exec_node *in0 = &p->nodes[e->in[0]];
    int r = in0->buf, own = e->buf;
    if (in0->kind != EXEC_KERNEL || r < 0 || p->bufs[r].last != i ||
        p->bufs[r].nbytes != p->bufs[own].nbytes || p->bufs[r].dtype != p->bufs[own].dtype)
      continue;
    bool other_reader = false;
    for (int j = 1; j < e->n_in; j++) other_reader |= p->nodes[e->in[j]].buf == r;
    if (other_reader) continue;
    p->bufs[r].last = p->bufs[own].last;
    p->bufs[own].def = -1;
    for (int k = i; k < p->n_nodes; k++) /* i and the views of its value */
      if (p->nodes[k].buf == own) p->nodes[k].buf = r;
  }
}

/* Buffers a SLAPO_ACC_WRITE run may place in an accumulator instead of the
 * arena: the value of the buffer's last writer (its def node or the last
 * in-place op on it) is accumulated, and no kept output reads the buffer.
 * The kernels then write the gradient straight into the parameter's grad:
 * no copy, no zeroing beforehand. */
static void find_redirects(slapo_plan *p) {
  for (int r = 0; r < p->n_bufs; r++) p->bufs[r].redirect = -1, p->bufs[r].writer = -1;
  for (int i = 0; i < p->n_nodes; i++)
    if (p->nodes[i].kind == EXEC_KERNEL) p->bufs[p->nodes[i].buf].writer = i;
  for (int r = 0; r < p->n_bufs; r++) {
    exec_buf *b = &p->bufs[r];
    if (b->def < 0 || b->last >= p->n_nodes) continue;
    const exec_node *w = &p->nodes[b->writer];
    if (w->n_acc > 0) b->redirect = w->acc[0];
  }
}

/* Input indices, buffers, liveness and release lists. */
static slapo_status liveness(slapo_plan *p) {
  /* A bound tensor may be strided, and a view function cannot copy: a view
   * op reading a bound value runs its reference kernel into a buffer of its
   * own instead (view ops' reference kernels accept strided input). Views of
   * kernel outputs stay views: those buffers are contiguous. A view op
   * without a reference kernel stays a view and requires what it reads to
   * be laid out as its view function expects. */
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    if (e->kind != EXEC_VIEW) continue;
    int k = slapo__plan_index(p, e->node->inputs[0]);
    if (p->nodes[k].kind == EXEC_BOUND && e->node->op->ref) {
      e->kind = EXEC_KERNEL;
      e->kernel = e->node->op->ref;
    }
  }
  int n_bufs = 0;
  for (int i = 0; i < p->n_nodes; i++) n_bufs += p->nodes[i].kind == EXEC_KERNEL;
  p->n_bufs = n_bufs;
  p->bufs = ALLOC(p, exec_buf, n_bufs);
  if (!p->bufs) return nomem("buffers");

  int b = 0;
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    const slapo_node *n = e->node;
    e->n_in = n->n_inputs;
    e->in = ALLOC(p, int, e->n_in);
    e->maybe_strided = ALLOC(p, bool, e->n_in);
    if (!e->in || !e->maybe_strided) return nomem("input lists");
    if (e->n_in > p->max_in) p->max_in = e->n_in;
    for (int j = 0; j < e->n_in; j++) {
      int k = slapo__plan_index(p, n->inputs[j]);
      SLAPO_ASSERT(k >= 0 && k < i); /* lint checked order and membership */
      e->in[j] = k;
      /* Only bound values and views can be strided: kernels write
       * contiguous buffers. */
      if (e->kind == EXEC_KERNEL && n->op->contiguous_inputs &&
          (p->nodes[k].kind == EXEC_BOUND || p->nodes[k].kind == EXEC_VIEW)) {
        e->maybe_strided[j] = true;
        e->any_maybe_strided = true;
      }
    }
    if (e->kind == EXEC_KERNEL) {
      exec_buf *buf = &p->bufs[b];
      SLAPO_TRY(value_nbytes(n, &buf->nbytes));
      buf->def = buf->last = i;
      buf->dtype = n->dtype;
      e->buf = b++;
    } else if (e->kind == EXEC_VIEW) {
      e->buf = p->nodes[e->in[0]].buf; /* the storage it shares (-1: bound) */
    }
    /* A read of any view of a buffer is a read of the buffer. The output
     * node's reads last until the next run, except those of accumulated
     * values, which are read (added into their accumulator) by the node
     * that computes them. */
    for (int j = 0; j < e->n_in; j++) {
      int r = p->nodes[e->in[j]].buf;
      if (r < 0) continue;
      bool acc = e->kind == EXEC_OUTPUT && p->opts.accumulate_from > 0 &&
                 j >= p->opts.accumulate_from;
      int until = e->kind == EXEC_OUTPUT && !acc ? p->n_nodes : acc ? e->in[j] : i;
      if (until > p->bufs[r].last) p->bufs[r].last = until;
    }
  }

  /* Accumulated outputs: each value's node gets the output indices it adds. */
  const exec_node *on = &p->nodes[p->out_idx];
  p->n_outputs = on->n_in;
  p->accumulator = ALLOC(p, slapo_tensor *, p->n_outputs);
  p->sumsq = ALLOC(p, double, p->n_outputs);
  if (!p->accumulator || !p->sumsq) return nomem("accumulators");
  memset(p->accumulator, 0, (size_t)p->n_outputs * sizeof *p->accumulator);
  if (p->opts.accumulate_from > 0) {
    for (int j = p->opts.accumulate_from; j < on->n_in; j++) p->nodes[on->in[j]].n_acc++;
    for (int i = 0; i < p->n_nodes; i++) {
      exec_node *e = &p->nodes[i];
      e->acc = ALLOC(p, int, e->n_acc);
      if (!e->acc) return nomem("accumulators");
      e->n_acc = 0;
    }
    for (int j = p->opts.accumulate_from; j < on->n_in; j++) {
      exec_node *v = &p->nodes[on->in[j]];
      v->acc[v->n_acc++] = j;
    }
  }

  share_inplace(p);
  find_redirects(p);

  /* Release lists: buffer r is released right after node bufs[r].last. */
  int *count = ALLOC(p, int, p->n_nodes);
  if (!count) return nomem("release lists");
  for (int r = 0; r < n_bufs; r++)
    if (p->bufs[r].def >= 0 && p->bufs[r].last < p->n_nodes) count[p->bufs[r].last]++;
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    e->release = ALLOC(p, int, count[i]);
    if (!e->release) return nomem("release lists");
  }
  for (int r = 0; r < n_bufs; r++) {
    int last = p->bufs[r].last;
    if (p->bufs[r].def >= 0 && last < p->n_nodes)
      p->nodes[last].release[p->nodes[last].n_release++] = r;
  }
  return SLAPO_OK;
}

/* Simulates the run: a kernel's buffer is taken before its inputs are
 * released, so an output never aliases an input (except an in-place op's,
 * which shares input 0's buffer: share_inplace). */
static slapo_status assign_offsets(slapo_plan *p) {
  freelist f = {0};
  f.gaps = ALLOC(p, gap, p->n_bufs + 1);
  if (!f.gaps) return nomem("free list");
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    if (e->kind == EXEC_KERNEL && p->bufs[e->buf].def == i)
      p->bufs[e->buf].offset = fl_alloc(&f, p->bufs[e->buf].nbytes);
    for (int k = 0; k < e->n_release; k++) {
      exec_buf *b = &p->bufs[e->release[k]];
      fl_release(&f, b->offset, b->nbytes);
    }
  }
  p->peak_nbytes = f.peak;
  return SLAPO_OK;
}

/* Headers for every value, the arena, per-node scratch headers. */
static slapo_status build_headers(slapo_plan *p) {
  if (!p->opts.debug_alloc) {
    p->arena = slapo_aligned_alloc(p->peak_nbytes ? p->peak_nbytes : SLAPO__EXEC_ALIGN);
    if (!p->arena) {
      return slapo_error(SLAPO_NOMEM, "plan_new: out of memory for the activation arena (%zu bytes)",
                         p->peak_nbytes);
    }
  }
  p->placed = p->arena;
  for (int r = 0; r < p->n_bufs; r++) {
    exec_buf *b = &p->bufs[r];
    b->storage.data = p->arena ? (char *)p->arena + b->offset : NULL;
    b->storage.nbytes = b->nbytes;
    b->storage.refcount = 1;
    b->storage.external = true;
  }
  for (int i = 0; i < p->n_nodes; i++) {
    exec_node *e = &p->nodes[i];
    const slapo_node *n = e->node;
    if (e->kind != EXEC_KERNEL && e->kind != EXEC_VIEW) continue;
    e->t.dtype = n->dtype;
    e->t.ndim = n->ndim;
    memcpy(e->t.shape, n->shape, sizeof e->t.shape);
    slapo_shape_contiguous_strides(n->ndim, e->t.shape, e->t.strides);
    e->t.offset = 0;
    e->t.storage = e->kind == EXEC_KERNEL ? &p->bufs[e->buf].storage : NULL;
    e->val = &e->t;
  }
  p->ins = ALLOC(p, const slapo_tensor *, p->max_in);
  p->copies = ALLOC(p, slapo_tensor, p->max_in);
  p->copy_storage = ALLOC(p, slapo_storage, p->max_in);
  p->ms = ALLOC(p, double, p->n_nodes);
  if (!p->ins || !p->copies || !p->copy_storage || !p->ms) return nomem("run scratch");
  return SLAPO_OK;
}

/* Origin groups for slapo_plan_print_timing (call_op nodes only). */
static slapo_status build_groups(slapo_plan *p) {
  slapo_map *m;
  if (slapo_map_new(&m) != SLAPO_OK) return nomem("origin groups");
  slapo_status s = SLAPO_OK;
  for (int i = 0; i < p->n_nodes && s == SLAPO_OK; i++) {
    exec_node *e = &p->nodes[i];
    e->group = -1;
    if (e->node->kind != SLAPO_NODE_CALL_OP) continue;
    const char *o = e->node->origin ? e->node->origin : "";
    intptr_t g = (intptr_t)slapo_map_get(m, o);
    if (!g) {
      g = ++p->n_groups;
      if (slapo_map_set(m, o, (void *)g) != SLAPO_OK) s = nomem("origin groups");
    }
    e->group = (int)g - 1;
  }
  if (s == SLAPO_OK) {
    p->group_name = ALLOC(p, const char *, p->n_groups);
    if (!p->group_name) s = nomem("origin groups");
  }
  for (int i = 0; i < p->n_nodes && s == SLAPO_OK; i++) {
    exec_node *e = &p->nodes[i];
    if (e->group >= 0) p->group_name[e->group] = e->node->origin ? e->node->origin : "";
  }
  slapo_map_free(m);
  return s;
}

static bool env_debug_mem(void) {
  const char *s = getenv("SLAPO_DEBUG_MEM");
  return s && atoi(s) > 0;
}

/* The ops' per-plan checks (slapo_op.prepare), in graph order. */
static slapo_status prepare_nodes(const slapo_graph *g) {
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next)
    if (n->op && n->op->prepare) SLAPO_TRY(n->op->prepare(n));
  return SLAPO_OK;
}

/* Plans g; with `runnable` false stops after the offsets (no arena, no
 * headers: the plan only tells its peak). */
static slapo_status plan_build(const slapo_graph *g, const slapo_plan_opts *opts, bool runnable,
                               slapo_plan **out) {
  if (!out) return slapo_error(SLAPO_INVALID_ARG, "plan_new: out is NULL");
  *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "plan_new: graph is NULL");
  if (slapo_graph_lint(g) != SLAPO_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    return slapo_error(SLAPO_STATE, "plan_new: the graph fails lint: %s", msg);
  }
  slapo_node *outn = slapo_graph_output(g);
  if (!outn)
    return slapo_error(SLAPO_STATE,
                       "plan_new: the graph has no output node; mark its results with "
                       "slapo_output");
  if (runnable) SLAPO_TRY(prepare_nodes(g));

  slapo_plan *p = slapo_calloc(1, sizeof *p);
  if (!p) return nomem("plan");
  p->g = g;
  if (opts) p->opts = *opts;
  if (env_debug_mem()) p->opts.debug_alloc = true;
  p->n_nodes = slapo_graph_count(g);

  slapo_status s = slapo_arena_new(0, &p->mem);
  if (s != SLAPO_OK) {
    slapo_free(p);
    return nomem("plan arena");
  }
  p->nodes = ALLOC(p, exec_node, p->n_nodes);
  if (!p->nodes) s = nomem("nodes");
  if (s == SLAPO_OK) {
    int i = 0;
    for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
      if (n == outn) p->out_idx = i;
      p->nodes[i++].node = n;
    }
    SLAPO_ASSERT(i == p->n_nodes);
    s = build_index(p);
  }
  if (s == SLAPO_OK) s = classify(p);
  if (s == SLAPO_OK) s = liveness(p);
  if (s == SLAPO_OK) s = assign_offsets(p);
  if (s == SLAPO_OK && runnable) s = build_headers(p);
  if (s == SLAPO_OK && runnable) s = build_groups(p);
  if (s != SLAPO_OK) {
    slapo_plan_free(p);
    return s;
  }
  slapo_logf(1, "plan: %d nodes, %d buffers, activation peak %zu bytes%s", p->n_nodes,
             p->n_bufs, p->peak_nbytes, p->opts.debug_alloc ? " (debug allocation mode)" : "");
  *out = p;
  return SLAPO_OK;
}

slapo_status slapo_plan_new(const slapo_graph *g, const slapo_plan_opts *opts,
                            slapo_plan **out) {
  return plan_build(g, opts, true, out);
}

slapo_status slapo_plan_estimate(const slapo_graph *g, const slapo_plan_opts *opts,
                                 size_t *peak_nbytes) {
  *peak_nbytes = 0;
  slapo_plan *p;
  slapo_plan_opts o = opts ? *opts : (slapo_plan_opts){0};
  o.debug_alloc = false; /* the arena's size is what is asked */
  SLAPO_TRY(plan_build(g, &o, false, &p));
  *peak_nbytes = p->peak_nbytes;
  slapo_plan_free(p);
  return SLAPO_OK;
}

void slapo_plan_free(slapo_plan *p) {
  if (!p) return;
  if (p->bufs) slapo__debugmem_release_all(p);
  slapo_aligned_free(p->arena);
  slapo_aligned_free(p->scratch);
  slapo_arena_free(p->mem);
  slapo_free(p);
}

void slapo_plan_visit_peak(const slapo_plan *p, slapo_plan_buffer_fn fn, void *ud) {
  if (!p || !fn) return;
  size_t live = 0, peak = 0;
  int at = -1;
  for (int i = 0; i < p->n_nodes; i++) {
    const exec_node *e = &p->nodes[i];
    if (e->kind == EXEC_KERNEL && p->bufs[e->buf].def == i) {
      live += p->bufs[e->buf].nbytes;
      if (live > peak) peak = live, at = i;
    }
    for (int k = 0; k < e->n_release; k++) live -= p->bufs[e->release[k]].nbytes;
  }
  for (int r = 0; at >= 0 && r < p->n_bufs; r++) {
    const exec_buf *b = &p->bufs[r];
    if (b->def >= 0 && b->def <= at && b->last >= at) fn(p->nodes[b->def].node, b->nbytes, ud);
  }
}

size_t slapo_plan_peak_nbytes(const slapo_plan *p) { return p ? p->peak_nbytes : 0; }

size_t slapo_plan_measured_peak_nbytes(const slapo_plan *p) {
  return p ? p->measured_peak_nbytes : 0;
}
