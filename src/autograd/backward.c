/* autograd/backward.c - reverse-mode differentiation (slapo_backward): marks
 * the nodes on a path from any wrt to y, walks them in reverse graph order,
 * calls each op's backward rule with the accumulated gradient, and sums the
 * contributions of a value's several users in the users' graph order so the
 * result is bitwise reproducible whatever order rules are visited in.
 * Layer: autograd. Math: reverse-mode AD as in Griewank & Walther,
 * "Evaluating Derivatives" (2008), ch. 3; structure after torch.autograd. */

#include "core/assert.h"
#include "slapo/autograd.h"

/* One gradient contribution to a forward value: the gradient node a user's
 * rule returned, keyed by the user's graph position and the input slot (a
 * user reading the value twice contributes twice). */
typedef struct contrib {
  int user_id;
  int slot;
  int64_t at; /* an unpack view's offset into a packed value; -1: none */
  slapo_node *g;
} contrib;

/* Per forward node scratch, indexed by node->id (positions 0..y->id). */
typedef struct rec {
  bool from_wrt; /* forward-reachable from some wrt (through float values) */
  bool to_y;     /* y depends on it                                      */
  contrib *c;    /* contributions, in arrival (reverse) order            */
  int n_c, cap_c;
  slapo_node *grad; /* accumulated gradient, NULL when none arrived     */
} rec;

typedef struct walk {
  slapo_ctx *ctx;
  slapo_node **nodes; /* nodes[id], 0..n-1 (forward prefix up to y)  */
  rec *recs;          /* recs[id]                                    */
  slapo_node **copy;  /* copy[id]: recomputed twin of a checkpointed node */
  int n;
} walk;

/* Module path for messages: the root is "." (DESIGN.md §7). */
static const char *path_of(const slapo_node *n) {
  return n->origin && n->origin[0] ? n->origin : ".";
}

static slapo_status nomem(slapo_ctx *ctx) {
  return slapo_ctx_fail(ctx, SLAPO_NOMEM, "backward: out of memory");
}

/* The record of a forward node in the prefix, or NULL for a node after y or
 * outside the prefix. */
static rec *rec_of(walk *w, const slapo_node *n) {
  if (n->id < 0 || n->id >= w->n || w->nodes[n->id] != n) return NULL;
  return &w->recs[n->id];
}

static slapo_status add_contrib(walk *w, rec *r, int user_id, int slot, int64_t at,
                               slapo_node *g) {
  if (r->n_c == r->cap_c) {
    int cap = r->cap_c ? 2 * r->cap_c : 4;
    contrib *c = slapo_realloc(r->c, (size_t)cap * sizeof *c);
    if (!c) return nomem(w->ctx);
    r->c = c;
    r->cap_c = cap;
  }
  r->c[r->n_c++] = (contrib){user_id, slot, at, g};
  return SLAPO_OK;
}

/* Constant tensor of n's shape filled with `value` (op "full"). */
static slapo_node *full_like(slapo_ctx *ctx, const slapo_node *n, double value) {
  slapo_attr a[2] = {slapo_attr_ints("shape", n->ndim, n->shape),
                     slapo_attr_float("value", value)};
  return slapo_op_apply(ctx, SLAPO_OP_DESC(full), 0, NULL, 2, a);
}

/* Orders r's contributions by (view offset, user position, slot).
 * Insertion sort: contributions arrive in reverse user order, and there
 * are few per value. */
static void sort_contribs(rec *r) {
  for (int i = 1; i < r->n_c; i++) {
    contrib x = r->c[i];
    int j = i - 1;
    while (j >= 0 && (r->c[j].at > x.at || (r->c[j].at == x.at && r->c[j].user_id > x.user_id) ||
                      (r->c[j].at == x.at && r->c[j].user_id == x.user_id &&
                       r->c[j].slot > x.slot))) {
      r->c[j + 1] = r->c[j];
      j--;
    }
    r->c[j + 1] = x;
  }
}

/* The sum of sorted contributions c[i0 .. i1) in order; one is kept as is. */
static slapo_node *sum_contribs(walk *w, const rec *r, int i0, int i1) {
  slapo_node *g = i1 > i0 ? r->c[i0].g : NULL;
  for (int i = i0 + 1; i < i1 && g; i++) {
    slapo_node *in[2] = {g, r->c[i].g};
    g = slapo_op_apply(w->ctx, SLAPO_OP_DESC(add), 2, in, 0, NULL);
  }
  return g;
}

/* Sums the contributions of r in (user position, slot) order; a value with
 * one user keeps its gradient node as is. */
static slapo_node *accumulate(walk *w, rec *r) {
  sort_contribs(r);
  return sum_contribs(w, r, 0, r->n_c);
}

/* The dtype of a value's gradient: f32 for the 16-bit floats (autocast's
 * bf16 operands accumulate their gradients in f32, as PyTorch's master
 * gradients do), the value's own otherwise. */
static slapo_dtype grad_dtype(slapo_dtype dt) {
  return dt == SLAPO_DTYPE_BF16 || dt == SLAPO_DTYPE_F16 ? SLAPO_DTYPE_F32 : dt;
}

/* Checks a rule's output for input `i` of `n` before it is accumulated: a
 * rule must hand back gradients already reduced to the input's shape. */
static slapo_status check_dx(slapo_ctx *ctx, const slapo_node *n, int i, const slapo_node *dx) {
  const slapo_node *x = n->inputs[i];
  if (slapo_shape_equal(dx->ndim, dx->shape, x->ndim, x->shape) &&
      dx->dtype == grad_dtype(x->dtype))
    return SLAPO_OK;
  char sd[128], sx[128];
  return slapo_ctx_fail(ctx, SLAPO_STATE,
                        "backward: the rule of op '%s' (node %%%s, module %s) returned a %s%s "
                        "gradient for input %d (%%%s), which is %s%s and takes %s gradients; "
                        "a rule must reduce broadcast gradients to the input's shape "
                        "(slapo__grad_to)",
                        n->target, n->name, path_of(n), slapo_dtype_name(dx->dtype),
                        slapo_shape_str(dx->ndim, dx->shape, sd, sizeof sd), i, x->name,
                        slapo_dtype_name(x->dtype),
                        slapo_shape_str(x->ndim, x->shape, sx, sizeof sx),
                        slapo_dtype_name(grad_dtype(x->dtype)));
}

/* Re-emits every call_op node of checkpoint region `region` (graph order),
 * reading recomputed twins where an input has one and the original values
 * otherwise (the region's inputs, parameters). Attributes are copied, so
 * random ops keep their RNG stream and draw the same masks. */
static slapo_status recompute_region(walk *w, int region) {
  slapo_ctx *ctx = w->ctx;
  if (!w->copy && !(w->copy = slapo_calloc((size_t)w->n, sizeof *w->copy))) return nomem(ctx);
  slapo_node *local[8];
  for (int id = 0; id < w->n; id++) {
    slapo_node *n = w->nodes[id];
    if (n->recompute != region || n->kind != SLAPO_NODE_CALL_OP) continue;
    slapo_node **in = n->n_inputs <= 8 ? local : slapo_calloc((size_t)n->n_inputs, sizeof *in);
    if (!in) return nomem(ctx);
    for (int i = 0; i < n->n_inputs; i++) {
      rec *ri = rec_of(w, n->inputs[i]);
      slapo_node *twin = ri ? w->copy[n->inputs[i]->id] : NULL;
      in[i] = twin ? twin : n->inputs[i];
    }
    slapo_status s = slapo_ctx_push_origin(ctx, n->origin ? n->origin : "");
    if (s == SLAPO_OK) {
      w->copy[id] = slapo_op_apply(ctx, n->op, n->n_inputs, in, n->n_attrs, n->attrs);
      slapo_ctx_pop_origin(ctx);
    }
    if (in != local) slapo_free(in);
    if (s == SLAPO_OK) s = slapo_ctx_status(ctx);
    if (s != SLAPO_OK) return s;
  }
  return SLAPO_OK;
}

/* Whether n is an unpack view of a value that packs an op's results. */
static bool views_packed(const slapo_node *n) {
  const slapo_node *p = n->n_inputs == 1 ? n->inputs[0] : NULL;
  return n->op == SLAPO_OP_DESC(unpack) && p->kind == SLAPO_NODE_CALL_OP && p->op &&
         p->op->backward_packed;
}

/* The rule of an op whose value packs results: r's contributions, each an
 * unpack view's gradient, summed per view offset (graph order), at once. */
static slapo_status packed_rule(walk *w, slapo_node *n, slapo_node *fwd, rec *r, const bool *need,
                                slapo_node **dx) {
  sort_contribs(r);
  for (int i = 0; i < r->n_c; i++)
    if (r->c[i].at < 0)
      return slapo_ctx_fail(w->ctx, SLAPO_UNSUPPORTED,
                            "backward: %%%s packs the results of op '%s' (module %s) and node "
                            "%%%s reads it other than through an unpack view; its gradient "
                            "cannot be split into the results'",
                            n->name, n->target, path_of(n), w->nodes[r->c[i].user_id]->name);
  int64_t *offs = slapo_calloc((size_t)r->n_c + 1, sizeof *offs);
  slapo_node **dys = slapo_calloc((size_t)r->n_c + 1, sizeof *dys);
  int k = 0;
  for (int i = 0; offs && dys && i < r->n_c; k++) {
    int j = i;
    while (j < r->n_c && r->c[j].at == r->c[i].at) j++;
    offs[k] = r->c[i].at, dys[k] = sum_contribs(w, r, i, j);
    i = j;
  }
  slapo_status s = offs && dys ? n->op->backward_packed(w->ctx, fwd, k, offs, dys, need, dx)
                               : nomem(w->ctx);
  slapo_free(offs);
  slapo_free(dys);
  return s;
}

/* Runs n's backward rule with its accumulated gradient r->grad (a packed
 * value: with each result's) and queues the input gradients; an unpack
 * view of a packed value queues its gradient for the packer's rule. */
static slapo_status visit(walk *w, slapo_node *n, rec *r) {
  slapo_node *g = r->grad;
  slapo_ctx *ctx = w->ctx;
  bool any = false;
  bool need_local[8];
  slapo_node *dx_local[8];
  bool *need = n->n_inputs <= 8 ? need_local : slapo_calloc((size_t)n->n_inputs, sizeof *need);
  slapo_node **dx =
      n->n_inputs <= 8 ? dx_local : slapo_calloc((size_t)n->n_inputs, sizeof *dx);
  slapo_status s = SLAPO_OK;
  if (!need || !dx) {
    s = nomem(ctx);
    goto done;
  }
  for (int i = 0; i < n->n_inputs; i++) {
    rec *ri = rec_of(w, n->inputs[i]);
    need[i] = ri && ri->from_wrt && ri->to_y;
    dx[i] = NULL;
    any |= need[i];
  }
  /* A wrt that nothing else flows into stops here (leaves too). */
  if (!any) goto done;
  if (views_packed(n)) {
    s = add_contrib(w, rec_of(w, n->inputs[0]), n->id, 0, slapo_node_attr_int(n, "offset", 0),
                    g);
    goto done;
  }

  if (n->kind != SLAPO_NODE_CALL_OP) {
    s = slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                       "backward: %s node %%%s (target '%s', module %s) is on the path from "
                       "wrt to y; inline the module (trace it with flatten=true) before "
                       "differentiating",
                       slapo_node_kind_name(n->kind), n->name, n->target, path_of(n));
    goto done;
  }
  if (!n->op || (!n->op->backward && !n->op->backward_packed)) {
    s = slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED,
                       "backward: op '%s' (node %%%s, module %s) has no backward rule; it is "
                       "on the path from a wrt value to y, so y's gradient cannot flow "
                       "through it",
                       n->target, n->name, path_of(n));
    goto done;
  }

  /* A checkpointed node is differentiated through its recomputed twin, so
   * the rule reads recomputed values and the original intermediates are
   * dead once the forward has used them. The region is re-emitted when its
   * last node (in graph order) is the first one reached by the reverse walk. */
  slapo_node *fwd = n;
  if (n->recompute > 0) {
    if (!w->copy || !w->copy[n->id]) {
      s = recompute_region(w, n->recompute);
      if (s != SLAPO_OK) goto done;
    }
    fwd = w->copy[n->id];
    SLAPO_ASSERT(fwd);
  }
  /* Gradient nodes belong to the forward node's module (per-module time and
   * memory reports). */
  s = slapo_ctx_push_origin(ctx, n->origin ? n->origin : "");
  if (s != SLAPO_OK) goto done;
  s = n->op->backward_packed ? packed_rule(w, n, fwd, r, need, dx)
                             : n->op->backward(ctx, fwd, g, need, dx);
  slapo_ctx_pop_origin(ctx);
  if (s == SLAPO_OK) s = slapo_ctx_status(ctx);
  if (s != SLAPO_OK) {
    /* A rule that fails without recording it still leaves a trace. */
    if (slapo_ctx_status(ctx) == SLAPO_OK)
      s = slapo_ctx_fail(ctx, s, "backward: the rule of op '%s' (node %%%s, module %s) "
                                 "failed: %s",
                         n->target, n->name, path_of(n), slapo_last_error());
    goto done;
  }
  for (int i = 0; i < n->n_inputs && s == SLAPO_OK; i++) {
    if (!need[i] || !dx[i]) continue;
    s = check_dx(ctx, n, i, dx[i]);
    if (s == SLAPO_OK) s = add_contrib(w, rec_of(w, n->inputs[i]), n->id, i, -1, dx[i]);
  }

done:
  if (need != need_local) slapo_free(need);
  if (dx != dx_local) slapo_free(dx);
  return s;
}

static slapo_status check_args(slapo_ctx *ctx, slapo_graph *g, slapo_node *y, slapo_node *dy,
                               int n_wrt, slapo_node *const *wrt, slapo_node **grads) {
  if (!y) return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "backward: y is NULL");
  if (y->graph != g)
    return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                          "backward: y (%%%s) is not a live node of the context's graph",
                          y->name);
  if (y->kind == SLAPO_NODE_OUTPUT || y->n_results > 0)
    return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                          "backward: y (%%%s) is a %s node, not a single tensor value; pass "
                          "the value to differentiate",
                          y->name, y->kind == SLAPO_NODE_OUTPUT ? "output" : "multi-result");
  if (!slapo_dtype_is_float(y->dtype))
    return slapo_ctx_fail(ctx, SLAPO_DTYPE,
                          "backward: y (%%%s) has dtype %s; only floating-point values have "
                          "gradients",
                          y->name, slapo_dtype_name(y->dtype));
  if (n_wrt < 0 || (n_wrt > 0 && (!wrt || !grads)))
    return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                          "backward: n_wrt is %d with wrt %s and grads %s", n_wrt,
                          wrt ? "set" : "NULL", grads ? "set" : "NULL");
  for (int i = 0; i < n_wrt; i++) {
    if (!wrt[i]) return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "backward: wrt[%d] is NULL", i);
    if (wrt[i]->graph != g)
      return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                            "backward: wrt[%d] (%%%s) is not a live node of the context's "
                            "graph",
                            i, wrt[i]->name);
    if (wrt[i]->kind == SLAPO_NODE_OUTPUT)
      return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                            "backward: wrt[%d] is the output node; pass a value", i);
  }
  if (dy) {
    if (dy->graph != g)
      return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG,
                            "backward: dy (%%%s) is not a live node of the context's graph",
                            dy->name);
    char sd[128], sy[128];
    if (!slapo_shape_equal(dy->ndim, dy->shape, y->ndim, y->shape))
      return slapo_ctx_fail(ctx, SLAPO_SHAPE,
                            "backward: dy (%%%s) has shape %s but y (%%%s) has shape %s; the "
                            "seed gradient must have y's shape",
                            dy->name, slapo_shape_str(dy->ndim, dy->shape, sd, sizeof sd),
                            y->name, slapo_shape_str(y->ndim, y->shape, sy, sizeof sy));
    if (dy->dtype != grad_dtype(y->dtype))
      return slapo_ctx_fail(ctx, SLAPO_DTYPE,
                            "backward: dy (%%%s) has dtype %s but y (%%%s), of dtype %s, "
                            "takes %s gradients",
                            dy->name, slapo_dtype_name(dy->dtype), y->name,
                            slapo_dtype_name(y->dtype), slapo_dtype_name(grad_dtype(y->dtype)));
  }
  return SLAPO_OK;
}

static slapo_status backward(slapo_ctx *ctx, int n_y, slapo_node *const *ys,
                             slapo_node *const *dys, int n_wrt, slapo_node *const *wrt,
                             slapo_node **grads) {
  SLAPO_ASSERT(ctx);
  for (int i = 0; i < n_wrt && grads; i++) grads[i] = NULL;
  if (slapo_ctx_status(ctx) != SLAPO_OK) return slapo_ctx_status(ctx);
  slapo_graph *g = slapo_ctx_graph(ctx);
  if (n_y < 1 || !ys)
    return slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "backward: %d values to differentiate", n_y);
  for (int k = 0; k < n_y; k++)
    SLAPO_TRY(check_args(ctx, g, ys[k], dys ? dys[k] : NULL, n_wrt, wrt, grads));

  /* Snapshot the forward prefix: new nodes go after it, and ids are
   * positions, so nodes[id] finds a forward node's record in O(1). */
  slapo_graph_renumber(g);
  int last = 0;
  for (int k = 0; k < n_y; k++)
    if (ys[k]->id > last) last = ys[k]->id;
  walk w = {.ctx = ctx, .n = last + 1};
  w.nodes = slapo_calloc((size_t)w.n, sizeof *w.nodes);
  w.recs = slapo_calloc((size_t)w.n, sizeof *w.recs);
  slapo_status s = SLAPO_OK;
  if (!w.nodes || !w.recs) {
    s = nomem(ctx);
    goto out;
  }
  {
    int i = 0;
    for (slapo_node *n = slapo_graph_first(g); n && i < w.n; n = n->next) w.nodes[i++] = n;
    SLAPO_ASSERT(i == w.n);
  }

  /* Forward reachability from the wrt values, through float values only
   * (index tensors carry no gradient). */
  for (int i = 0; i < n_wrt; i++) {
    rec *r = rec_of(&w, wrt[i]);
    if (r && slapo_dtype_is_float(wrt[i]->dtype)) r->from_wrt = true;
  }
  for (int id = 0; id < w.n; id++) {
    slapo_node *n = w.nodes[id];
    if (w.recs[id].from_wrt || !slapo_dtype_is_float(n->dtype)) continue;
    for (int i = 0; i < n->n_inputs; i++) {
      rec *ri = rec_of(&w, n->inputs[i]);
      if (!ri) {
        s = slapo_ctx_fail(ctx, SLAPO_STATE,
                           "backward: input %d (%%%s) of %%%s does not come before it; run "
                           "slapo_graph_lint",
                           i, n->inputs[i]->name, n->name);
        goto out;
      }
      if (ri->from_wrt) w.recs[id].from_wrt = true;
    }
  }
  /* Backward reachability from the ys. */
  for (int k = 0; k < n_y; k++) w.recs[ys[k]->id].to_y = true;
  for (int id = w.n - 1; id >= 0; id--) {
    if (!w.recs[id].to_y) continue;
    slapo_node *n = w.nodes[id];
    for (int i = 0; i < n->n_inputs; i++) {
      rec *ri = rec_of(&w, n->inputs[i]);
      if (ri) ri->to_y = true;
    }
  }

  /* Seeds, as contributions of users after every node of the graph, in
   * the ys' order: a y also read inside the graph gets its seed added
   * after its readers' contributions. */
  for (int k = 0; k < n_y; k++) {
    slapo_node *y = ys[k];
    rec *ry = &w.recs[y->id];
    if (!ry->from_wrt) continue;
    slapo_node *seed = dys ? dys[k] : NULL;
    if (!seed) {
      s = slapo_ctx_push_origin(ctx, y->origin ? y->origin : "");
      if (s != SLAPO_OK) goto out;
      seed = full_like(ctx, y, 1.0);
      slapo_ctx_pop_origin(ctx);
      if (!seed) {
        s = slapo_ctx_status(ctx);
        goto out;
      }
    }
    s = add_contrib(&w, ry, w.n + k, 0, -1, seed);
    if (s != SLAPO_OK) goto out;
  }

  /* Reverse walk over the nodes on a path. */
  for (int id = w.n - 1; id >= 0; id--) {
    rec *r = &w.recs[id];
    if (!r->from_wrt || !r->to_y || r->n_c == 0) continue;
    slapo_node *n = w.nodes[id];
    s = slapo_ctx_push_origin(ctx, n->origin ? n->origin : "");
    if (s != SLAPO_OK) goto out;
    /* A packed value's rule sums its results' gradients apart. */
    if (!n->op || !n->op->backward_packed) r->grad = accumulate(&w, r);
    slapo_ctx_pop_origin(ctx);
    s = slapo_ctx_status(ctx);
    if (s != SLAPO_OK) goto out;
    s = visit(&w, n, r);
    if (s != SLAPO_OK) goto out;
  }

  /* Results; zeros where y does not depend on a wrt value. */
  for (int i = 0; i < n_wrt; i++) {
    rec *r = rec_of(&w, wrt[i]);
    slapo_node *gi = r ? r->grad : NULL;
    if (!gi) {
      s = slapo_ctx_push_origin(ctx, wrt[i]->origin ? wrt[i]->origin : "");
      if (s != SLAPO_OK) goto out;
      gi = full_like(ctx, wrt[i], 0.0);
      slapo_ctx_pop_origin(ctx);
      if (!gi) {
        s = slapo_ctx_status(ctx);
        goto out;
      }
    }
    grads[i] = gi;
  }

out:
  if (w.recs)
    for (int id = 0; id < w.n; id++) slapo_free(w.recs[id].c);
  slapo_free(w.recs);
  slapo_free(w.nodes);
  slapo_free(w.copy);
  slapo_graph_renumber(g);
  if (s != SLAPO_OK) {
    for (int i = 0; i < n_wrt; i++) grads[i] = NULL;
    if (slapo_ctx_status(ctx) == SLAPO_OK) s = slapo_ctx_fail(ctx, s, "%s", slapo_last_error());
    return slapo_ctx_status(ctx);
  }
  return SLAPO_OK;
}

/* Random ops built from here on (backward rules, recomputed regions) copy
 * the forward's shard attributes rather than derive them from the layouts
 * of gradients (ops.h: slapo_ctx_set_copy_rng). */
slapo_status slapo_backward(slapo_ctx *ctx, slapo_node *y, slapo_node *dy, int n_wrt,
                            slapo_node *const *wrt, slapo_node **grads) {
  SLAPO_ASSERT(ctx);
  return slapo_backward_multi(ctx, 1, &y, &dy, n_wrt, wrt, grads);
}

slapo_status slapo_backward_multi(slapo_ctx *ctx, int n_y, slapo_node *const *ys,
                                  slapo_node *const *dys, int n_wrt, slapo_node *const *wrt,
                                  slapo_node **grads) {
  SLAPO_ASSERT(ctx);
  bool prev = slapo_ctx_set_copy_rng(ctx, true);
  slapo_status s = backward(ctx, n_y, ys, dys, n_wrt, wrt, grads);
  slapo_ctx_set_copy_rng(ctx, prev);
  return s;
}
