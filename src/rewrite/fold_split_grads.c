/* rewrite/fold_split_grads.c - a rule for a step's joint graph (the
 * backward derived): the gradient of a value that was split (slapo_split
 * emits one `slice` per piece) arrives as one zero-padded `slice_backward`
 * per piece, summed by autograd with `add` nodes; when the pieces tile the
 * sliced dim exactly, that sum is the pieces' gradients joined with one
 * `concat`. Layer: rewrite.
 * Why: GPT-2's attention splits c_attn's [B, T, 3C] output into q, k, v;
 * its backward then wrote three zero-filled [B, T, 3C] buffers and added
 * them twice (about 13 passes over 3C-wide data) where a concat writes the
 * result once (2 passes). Exact: each element of the sum is one piece's
 * value plus zeros (x + 0 = x; only the sign of a zero can differ). */
#include "rewrite/internal.h"

/* One piece: the gradient node it carries and its range along the dim. */
typedef struct piece {
  slapo_node *dy;
  int64_t start, end;
} piece;

#define MAX_PIECES 16

typedef struct tree {
  const slapo_node *root;
  int n;
  piece p[MAX_PIECES];
  slapo_node *inner[2 * MAX_PIECES]; /* adds and slice_backwards to erase */
  int n_inner;
  int dim;   /* normalized sliced dim */
  bool have_dim;
} tree;

/* Python slice-index normalization, as the slice ops do it. */
static int64_t clamp_index(int64_t i, int64_t n) {
  if (i < 0) i = i < -n ? 0 : i + n;
  return i > n ? n : i;
}

/* Adds the leaves under `n` (the root add, or a node used only by the add
 * above it) to t; false when the subtree is not a sum of step-1
 * slice_backwards of the root's shape along one dim. */
static bool collect(tree *t, slapo_node *n) {
  const slapo_node *r = t->root;
  if (n != r && n->n_users != 1) return false;
  if (n->dtype != r->dtype || !slapo_shape_equal(n->ndim, n->shape, r->ndim, r->shape))
    return false;
  if (t->n_inner == 2 * MAX_PIECES) return false;
  if (slapo_node_is_op(n, SLAPO_OP_DESC(add))) {
    t->inner[t->n_inner++] = n;
    return collect(t, n->inputs[0]) && collect(t, n->inputs[1]);
  }
  if (!slapo_node_is_op(n, SLAPO_OP_DESC(slice_backward)) || t->n == MAX_PIECES) return false;
  if (slapo_node_attr_int(n, "step", 1) != 1) return false;
  int64_t dim = slapo_node_attr_int(n, "dim", 0);
  if (dim < 0) dim += n->ndim;
  if (dim < 0 || dim >= n->ndim) return false;
  if (t->have_dim && dim != t->dim) return false;
  t->dim = (int)dim;
  t->have_dim = true;
  int64_t len = n->shape[dim];
  int64_t start = clamp_index(slapo_node_attr_int(n, "start", 0), len);
  int64_t extent = n->inputs[0]->shape[dim]; /* dy holds the slice */
  t->inner[t->n_inner++] = n;
  t->p[t->n++] = (piece){n->inputs[0], start, start + extent};
  return true;
}

/* Sorts pieces by start and checks that they tile [0, len) exactly. */
static bool tiles(tree *t) {
  for (int i = 1; i < t->n; i++) {
    piece x = t->p[i];
    int j = i - 1;
    while (j >= 0 && t->p[j].start > x.start) {
      t->p[j + 1] = t->p[j];
      j--;
    }
    t->p[j + 1] = x;
  }
  int64_t at = 0;
  for (int i = 0; i < t->n; i++) {
    if (t->p[i].start != at) return false;
    at = t->p[i].end;
  }
  return at == t->root->shape[t->dim];
}

/* A sum rooted at the add n whose leaves tile a dim. */
static bool match(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m) {
  (void)env;
  tree t = {.root = n};
  m->node[0] = n;
  return collect(&t, n) && t.n >= 2 && tiles(&t);
}

/* The sum becomes one concat of the pieces' gradients, in order. */
static slapo_status rewrite(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **resume) {
  slapo_node *root = m->node[0];
  tree t = {.root = root};
  bool ok = collect(&t, root) && tiles(&t);
  SLAPO_ASSERT(ok); /* as match found it */
  slapo_node *ins[MAX_PIECES];
  for (int i = 0; i < t.n; i++) ins[i] = t.p[i].dy;
  slapo_attr dim = slapo_attr_int("dim", t.dim);
  slapo_node *cat;
  SLAPO_TRY(slapo_rewrite_emit_before(g, root, SLAPO_OP_DESC(concat), t.n, ins, 1, &dim, root,
                                      &cat));
  SLAPO_TRY(slapo_node_replace_all_uses(root, cat));
  /* inner[] lists every node of the tree parents-first, so each has no
   * users left by the time it is erased. */
  for (int i = 0; i < t.n_inner; i++) SLAPO_TRY(slapo_graph_erase(g, t.inner[i]));
  *resume = cat;
  return SLAPO_OK;
}

const slapo_rewrite_rule slapo__rule_fold_split_grads = {
    .name = "fold_split_grads",
    .summary = "a sum of slice_backwards that tile a dim -> concat of the pieces",
    .anchor = SLAPO_OP_DESC(add),
    .guard = slapo__rule_training,
    .match = match,
    .rewrite = rewrite,
};
