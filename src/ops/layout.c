/* ops/layout.c - tensor-parallel layouts of values (DESIGN.md §3: random
 * ops draw the unsharded model's numbers for this rank's part). A node's
 * layout says which piece of the unsharded model's value its tensor holds:
 * replicated, a slice along one axis (slapo_layout in slapo/ir.h), a partial
 * sum, or unknown. Parameters get theirs from their shard records (module
 * layer, slapo_weight); every op's node gets one here, after shape inference,
 * by the op's own rule (op->layout: the collectives, fused regions) or the
 * table below. A rule maps a layout only where the mapping is exact; anything
 * else on a sharded input is UNKNOWN, which is harmless until a random op
 * reads it (then it is refused: slapo__rng_shard_attrs). Layer: ops. */
#include <stdio.h>
#include <string.h>

#include "ops/internal.h"

static slapo_layout of_kind(slapo_layout_kind k) { return (slapo_layout){.kind = k}; }

static bool same_split(const slapo_layout *a, const slapo_layout *b) {
  return a->kind == SLAPO_LAYOUT_SPLIT && b->kind == SLAPO_LAYOUT_SPLIT &&
         a->parts == b->parts && a->start == b->start && a->full == b->full;
}

static slapo_layout moved(slapo_layout l, int axis) {
  l.axis = axis;
  return l;
}

bool slapo_layout_sharded(const slapo_layout *l) { return l->kind != SLAPO_LAYOUT_REPLICATED; }

const char *slapo_layout_str(const slapo_layout *l, char *buf, size_t cap) {
  switch (l->kind) {
  case SLAPO_LAYOUT_REPLICATED: snprintf(buf, cap, "replicated"); break;
  case SLAPO_LAYOUT_PARTIAL: snprintf(buf, cap, "a partial sum"); break;
  case SLAPO_LAYOUT_UNKNOWN: snprintf(buf, cap, "unknown"); break;
  case SLAPO_LAYOUT_SPLIT:
    if (l->parts == 1)
      snprintf(buf, cap, "split on axis %d (this rank: from %lld of %lld)", l->axis,
               (long long)l->start, (long long)l->full);
    else
      snprintf(buf, cap, "split on axis %d in %d blocks (this rank: from %lld of %lld each)",
               l->axis, l->parts, (long long)l->start, (long long)(l->full / l->parts));
    break;
  }
  return buf;
}

/* ---- rules ---- */

/* Any op: replicated inputs give a replicated value, anything else one no
 * rule follows. */
static slapo_layout rule_default(const slapo_node *n) {
  for (int i = 0; i < n->n_inputs; i++)
    if (slapo_layout_sharded(&n->inputs[i]->layout)) return of_kind(SLAPO_LAYOUT_UNKNOWN);
  return of_kind(SLAPO_LAYOUT_REPLICATED);
}

/* Partial sums pass through ops linear in them: a + b and a - b of two
 * partial sums, a * r and a / r with r replicated, scaling, negation. */
static slapo_layout rule_partial(const slapo_node *n) {
  int n_partial = 0, n_rep = 0;
  for (int i = 0; i < n->n_inputs; i++) {
    slapo_layout_kind k = n->inputs[i]->layout.kind;
    n_partial += k == SLAPO_LAYOUT_PARTIAL;
    n_rep += k == SLAPO_LAYOUT_REPLICATED;
  }
  const slapo_op *op = n->op;
  bool linear =
      ((op == SLAPO_OP_DESC(add) || op == SLAPO_OP_DESC(sub)) && n_partial == n->n_inputs) ||
      (op == SLAPO_OP_DESC(mul) && n_partial == 1 && n_rep == 1) ||
      (op == SLAPO_OP_DESC(div) && n->inputs[0]->layout.kind == SLAPO_LAYOUT_PARTIAL &&
       n_rep == 1) ||
      op == SLAPO_OP_DESC(mul_scalar) || op == SLAPO_OP_DESC(neg) ||
      op == SLAPO_OP_DESC(dropout) || op == SLAPO_OP_DESC(contiguous);
  return of_kind(linear ? SLAPO_LAYOUT_PARTIAL : SLAPO_LAYOUT_UNKNOWN);
}

/* Elementwise (with broadcasting): slices of one axis, placed alike, stay a
 * slice; a replicated input must broadcast along that axis (size 1 there or
 * no such dim: a bias [C] against a split batch axis, a mask [B, 1, 1, T]
 * against split heads). */
static slapo_layout rule_elementwise(const slapo_node *n) {
  slapo_layout out = of_kind(SLAPO_LAYOUT_REPLICATED);
  for (int i = 0; i < n->n_inputs; i++) {
    const slapo_node *x = n->inputs[i];
    if (x->layout.kind == SLAPO_LAYOUT_UNKNOWN) return of_kind(SLAPO_LAYOUT_UNKNOWN);
    if (x->layout.kind == SLAPO_LAYOUT_PARTIAL) return rule_partial(n);
    if (x->layout.kind != SLAPO_LAYOUT_SPLIT) continue;
    int axis = x->layout.axis + (n->ndim - x->ndim);
    if (x->shape[x->layout.axis] != n->shape[axis]) return of_kind(SLAPO_LAYOUT_UNKNOWN);
    slapo_layout l = moved(x->layout, axis);
    if (out.kind == SLAPO_LAYOUT_SPLIT && (out.axis != axis || !same_split(&out, &l)))
      return of_kind(SLAPO_LAYOUT_UNKNOWN);
    out = l;
  }
  if (out.kind != SLAPO_LAYOUT_SPLIT) return out;
  for (int i = 0; i < n->n_inputs; i++) {
    const slapo_node *x = n->inputs[i];
    int j = out.axis - (n->ndim - x->ndim);
    if (x->layout.kind == SLAPO_LAYOUT_REPLICATED && j >= 0 && x->shape[j] != 1)
      return of_kind(SLAPO_LAYOUT_UNKNOWN);
  }
  return out;
}

/* Ops that work along the last `k` axes of input 0 (softmax, norms, rotary):
 * a slice of an earlier axis stays; their other inputs (weights over the
 * last axis) must be replicated. */
static slapo_layout rule_rows(const slapo_node *n, int k) {
  const slapo_layout *l = &n->inputs[0]->layout;
  for (int i = 1; i < n->n_inputs; i++)
    if (slapo_layout_sharded(&n->inputs[i]->layout)) return of_kind(SLAPO_LAYOUT_UNKNOWN);
  if (l->kind == SLAPO_LAYOUT_REPLICATED) return *l;
  if (l->kind == SLAPO_LAYOUT_SPLIT && l->axis < n->inputs[0]->ndim - k) return *l;
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

static slapo_layout rule_permute(const slapo_node *n) {
  const slapo_layout *l = &n->inputs[0]->layout;
  if (l->kind != SLAPO_LAYOUT_SPLIT) return *l;
  const slapo_attr *p = slapo_node_attr(n, "perm");
  for (int b = 0; p && b < p->n; b++) {
    int64_t src = p->ints[b] < 0 ? p->ints[b] + p->n : p->ints[b];
    if (src == l->axis) return moved(*l, b);
  }
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

static int64_t prod(const int64_t *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s[i];
  return p;
}

/* Reshape: the split axis a (local size L, `inner` elements after it) must
 * be carried by one output axis b whose elements before it are the same
 * (prefix products equal). If b is a merged with the axes after it (size L
 * r), the slice scales by r; if b is a's outer factor (a = b x r, the
 * [B, T, C] -> [B, T, NH, HS] head split with r = HS), the slice must be
 * aligned to r (whole heads). Anything else mixes the sharded axis. Local
 * shapes alone cannot tell [B, T, 32] -> [B, T, 1, 32] as one of 2 heads of
 * 32 from 32 of 64 columns of one head; the outermost axis that fits is
 * taken (the heads axis), as the models' head splits mean. */
static slapo_layout rule_reshape(const slapo_node *n) {
  const slapo_node *x = n->inputs[0];
  slapo_layout l = x->layout;
  if (l.kind != SLAPO_LAYOUT_SPLIT) return l;
  if (l.parts != 1) return of_kind(SLAPO_LAYOUT_UNKNOWN);
  int a = l.axis;
  int64_t outer = prod(x->shape, 0, a), L = x->shape[a], inner = prod(x->shape, a + 1, x->ndim);
  for (int b = 0; b < n->ndim; b++) {
    if (prod(n->shape, 0, b) != outer) continue;
    int64_t inner_b = prod(n->shape, b + 1, n->ndim);
    if (inner_b > 0 && inner % inner_b == 0) { /* b = a merged with later axes */
      int64_t r = inner / inner_b;
      return (slapo_layout){SLAPO_LAYOUT_SPLIT, b, 1, l.start * r, l.full * r};
    }
    if (inner > 0 && inner_b % inner == 0) { /* a = b x r */
      int64_t r = inner_b / inner;
      if (r > 0 && L % r == 0 && l.start % r == 0 && l.full % r == 0)
        return (slapo_layout){SLAPO_LAYOUT_SPLIT, b, 1, l.start / r, l.full / r};
    }
    return of_kind(SLAPO_LAYOUT_UNKNOWN);
  }
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

/* Slice: along another axis the slice stays; along the split axis only a
 * whole block of a blocked layout (split q|k|v into q, k, v) is exact. */
static slapo_layout rule_slice(const slapo_node *n) {
  const slapo_node *x = n->inputs[0];
  slapo_layout l = x->layout;
  if (l.kind != SLAPO_LAYOUT_SPLIT) return l;
  int64_t dim = slapo_node_attr_int(n, "dim", 0);
  if (dim < 0) dim += x->ndim;
  if (dim != l.axis) return l;
  int64_t L = x->shape[dim], len = n->shape[dim], start = slapo_node_attr_int(n, "start", 0);
  if (start < 0) start += L;
  if (len == L) return l;
  int64_t block = L / l.parts;
  if (block <= 0 || slapo_node_attr_int(n, "step", 1) != 1 || len != block || start % block)
    return of_kind(SLAPO_LAYOUT_UNKNOWN);
  return (slapo_layout){SLAPO_LAYOUT_SPLIT, l.axis, 1, l.start, l.full / l.parts};
}

/* Matmul: roles of the split axes. a [.., M, K], b [.., K, N] (trans flags
 * swap the last two): a split on M or b on N gives a slice of the output's
 * M or N; both split alike on K a partial sum; a batch axis split alike in
 * both (or broadcast in one) stays; a partial sum times a replicated value
 * stays partial. */
typedef enum { ROLE_NONE, ROLE_BATCH, ROLE_M, ROLE_N, ROLE_K } role;

static role role_of(const slapo_node *x, bool is_a, bool trans) {
  const slapo_layout *l = &x->layout;
  if (l->kind != SLAPO_LAYOUT_SPLIT) return ROLE_NONE;
  if (l->axis < x->ndim - 2) return ROLE_BATCH;
  bool second_last = l->axis == x->ndim - 2;
  if (is_a) return second_last != trans ? ROLE_M : ROLE_K;
  return second_last != trans ? ROLE_K : ROLE_N;
}

static slapo_layout rule_matmul(const slapo_node *n) {
  const slapo_node *a = n->inputs[0], *b = n->inputs[1];
  slapo_layout_kind ka = a->layout.kind, kb = b->layout.kind;
  if (ka == SLAPO_LAYOUT_REPLICATED && kb == SLAPO_LAYOUT_REPLICATED) return a->layout;
  if ((ka == SLAPO_LAYOUT_PARTIAL && kb == SLAPO_LAYOUT_REPLICATED) ||
      (kb == SLAPO_LAYOUT_PARTIAL && ka == SLAPO_LAYOUT_REPLICATED))
    return of_kind(SLAPO_LAYOUT_PARTIAL);
  if (ka == SLAPO_LAYOUT_UNKNOWN || kb == SLAPO_LAYOUT_UNKNOWN || ka == SLAPO_LAYOUT_PARTIAL ||
      kb == SLAPO_LAYOUT_PARTIAL)
    return of_kind(SLAPO_LAYOUT_UNKNOWN);
  bool ta = slapo_node_attr_int(n, "trans_a", 0), tb = slapo_node_attr_int(n, "trans_b", 0);
  role ra = role_of(a, true, ta), rb = role_of(b, false, tb);
  int nd = n->ndim;
  if (ra == ROLE_M && rb == ROLE_NONE) return moved(a->layout, nd - 2);
  if (rb == ROLE_N && ra == ROLE_NONE) return moved(b->layout, nd - 1);
  if (ra == ROLE_K && rb == ROLE_K && same_split(&a->layout, &b->layout))
    return of_kind(SLAPO_LAYOUT_PARTIAL);
  if (ra == ROLE_BATCH || rb == ROLE_BATCH) {
    const slapo_node *s = ra == ROLE_BATCH ? a : b, *o = s == a ? b : a;
    int axis = s->layout.axis + (nd - s->ndim), j = axis - (nd - o->ndim);
    bool other_ok = o->layout.kind == SLAPO_LAYOUT_SPLIT
                        ? same_split(&o->layout, &s->layout) && o->layout.axis == j
                        : j < 0 || o->shape[j] == 1;
    if (other_ok && s->shape[s->layout.axis] == n->shape[axis]) return moved(s->layout, axis);
  }
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

/* linear(x, w [N, K], b [N]) = x w^T + b: w split on N (with b split alike
 * or absent) is column parallel, the output a slice of its last axis; w
 * split on K with x split alike on its last axis (no bias) is row parallel,
 * a partial sum; a replicated w keeps x's batch-axis slice or partial sum. */
static slapo_layout rule_linear(const slapo_node *n) {
  const slapo_node *x = n->inputs[0], *w = n->inputs[1];
  const slapo_node *b = n->n_inputs > 2 ? n->inputs[2] : NULL;
  const slapo_layout *lx = &x->layout, *lw = &w->layout;
  bool brep = !b || b->layout.kind == SLAPO_LAYOUT_REPLICATED;
  if (lw->kind == SLAPO_LAYOUT_REPLICATED && brep) {
    if (lx->kind == SLAPO_LAYOUT_REPLICATED) return *lx;
    if (lx->kind == SLAPO_LAYOUT_PARTIAL && !b) return *lx;
    if (lx->kind == SLAPO_LAYOUT_SPLIT && lx->axis < x->ndim - 1) return *lx;
    return of_kind(SLAPO_LAYOUT_UNKNOWN);
  }
  if (lw->kind != SLAPO_LAYOUT_SPLIT) return of_kind(SLAPO_LAYOUT_UNKNOWN);
  if (lw->axis == 0 && lx->kind == SLAPO_LAYOUT_REPLICATED &&
      (!b || (b->layout.axis == 0 && same_split(&b->layout, lw))))
    return moved(*lw, n->ndim - 1);
  if (lw->axis == 1 && !b && lx->kind == SLAPO_LAYOUT_SPLIT && lx->axis == x->ndim - 1 &&
      same_split(lx, lw))
    return of_kind(SLAPO_LAYOUT_PARTIAL);
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

/* embedding(table [V, C], ids): a table split on its rows (a vocab-parallel
 * embedding: other ranks' ids read zeros) gives a partial sum, one split on
 * its columns a slice of the last axis; replicated tables keep the ids'
 * slice. */
static slapo_layout rule_embedding(const slapo_node *n) {
  const slapo_node *w = n->inputs[0], *idx = n->inputs[1];
  if (idx->layout.kind == SLAPO_LAYOUT_REPLICATED) {
    if (w->layout.kind == SLAPO_LAYOUT_REPLICATED) return w->layout;
    if (w->layout.kind == SLAPO_LAYOUT_SPLIT && w->layout.axis == 0 && w->layout.parts == 1)
      return of_kind(SLAPO_LAYOUT_PARTIAL);
    if (w->layout.kind == SLAPO_LAYOUT_SPLIT && w->layout.axis == 1)
      return moved(w->layout, n->ndim - 1);
    return of_kind(SLAPO_LAYOUT_UNKNOWN);
  }
  if (w->layout.kind == SLAPO_LAYOUT_REPLICATED && idx->layout.kind == SLAPO_LAYOUT_SPLIT)
    return idx->layout;
  return of_kind(SLAPO_LAYOUT_UNKNOWN);
}

static slapo_layout rule_of(const slapo_node *n) {
  const slapo_op *op = n->op;
  if (op == SLAPO_OP_DESC(reshape)) return rule_reshape(n);
  if (op == SLAPO_OP_DESC(permute)) return rule_permute(n);
  if (op == SLAPO_OP_DESC(slice)) return rule_slice(n);
  if (op == SLAPO_OP_DESC(contiguous) || op == SLAPO_OP_DESC(broadcast_to))
    return rule_elementwise(n);
  if (op == SLAPO_OP_DESC(matmul)) return rule_matmul(n);
  if (op == SLAPO_OP_DESC(linear)) return rule_linear(n);
  if (op == SLAPO_OP_DESC(embedding)) return rule_embedding(n);
  if (op == SLAPO_OP_DESC(layer_norm) || op == SLAPO_OP_DESC(rms_norm)) return rule_rows(n, 1);
  /* Rotary turns pairs along the last axis by the position (axis -2); the
   * causal mask of softmax reads both last axes. */
  if (op == SLAPO_OP_DESC(rotary)) return rule_rows(n, 2);
  if (op == SLAPO_OP_DESC(softmax))
    return rule_rows(n, slapo_node_attr_int(n, "causal", 0) ? 2 : 1);
  if (op->elementwise) return rule_elementwise(n);
  return rule_default(n);
}

slapo_status slapo_layout_infer(slapo_node *node) {
  if (!node->op) return SLAPO_OK;
  if (node->op->layout) return node->op->layout(node);
  node->layout = rule_of(node);
  return SLAPO_OK;
}

slapo_status slapo_layout_elementwise(slapo_node *node) {
  node->layout = rule_elementwise(node);
  return SLAPO_OK;
}

/* ---- random ops ---- */

slapo_status slapo__rng_shard_attrs(const slapo_node *x, const char *op, slapo_attr *out,
                                    int *n_out) {
  const slapo_layout *l = &x->layout;
  char ls[160];
  *n_out = 0;
  if (l->kind == SLAPO_LAYOUT_REPLICATED) return SLAPO_OK;
  if (l->kind == SLAPO_LAYOUT_SPLIT) {
    out[0] = slapo_attr_int("shard_dim", l->axis);
    out[1] = slapo_attr_int("shard_start", l->start);
    out[2] = slapo_attr_int("shard_full", l->full);
    *n_out = 3;
    if (l->parts != 1) out[(*n_out)++] = slapo_attr_int("shard_parts", l->parts);
    return SLAPO_OK;
  }
  char from[512];
  snprintf(from, sizeof from, "%s%s%s",
           x->kind == SLAPO_NODE_CALL_OP ? x->target : slapo_node_kind_name(x->kind),
           x->origin && x->origin[0] ? " in " : "", x->origin ? x->origin : "");
  if (l->kind == SLAPO_LAYOUT_PARTIAL)
    return slapo_error(SLAPO_UNSUPPORTED,
                       "%s of %%%s %s (from %s): the value is a partial sum over the "
                       "tensor-parallel ranks (a row-parallel Linear before its all-reduce), so "
                       "random numbers drawn on it would not be the unsharded model's; put the "
                       "all-reduce first (sync fwd_post all_reduce)",
                       op, x->name, slapo__shape_of(x), from);
  return slapo_error(SLAPO_UNSUPPORTED,
                     "%s of %%%s %s (from %s): its tensor-parallel layout is %s (an op such as "
                     "a reshape mixes the sharded axis with others), so this rank's part of the "
                     "unsharded model's random numbers is not known; refused rather than drawn "
                     "as if replicated",
                     op, x->name, slapo__shape_of(x), from, slapo_layout_str(l, ls, sizeof ls));
}
