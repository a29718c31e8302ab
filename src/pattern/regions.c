/* pattern/regions.c - the maximal elementwise regions of a traced graph
 * (for `fuse_all`): connected elementwise nodes whose values, but for one
 * (the region's result), are used only inside the region, so a region
 * never swallows a value something else reads. A node is elementwise when
 * its op descriptor says so, or when it calls a leaf whose op form is
 * elementwise (ReLU, GELU, Dropout); `full` constants join the region that
 * reads them. Built from the sinks up: a node joins the region of its users
 * when all of them belong to one region; otherwise it starts its own, as its
 * result. A node the caller's `ends` accepts (a norm a backend generates
 * with the ops before it) always starts its own region, which its
 * elementwise producers may join: a region may end in it. Regions of one op
 * are left out (nothing to fuse). Layer: pattern. */
#include <stdio.h>
#include <string.h>

#include "pattern/internal.h"

/* The op n computes: its own, or its leaf's op form; NULL for others. */
static const slapo_op *op_of(slapo_module *m, const slapo_node *n) {
  if (n->kind == SLAPO_NODE_CALL_OP) return n->op;
  if (n->kind != SLAPO_NODE_CALL_MODULE) return NULL;
  slapo_module *leaf;
  slapo_op_form f;
  return slapo_module_at(m, n->target, &leaf) == SLAPO_OK && leaf->type->op_form &&
                 leaf->type->op_form(leaf, &f)
             ? f.op
             : NULL;
}

static bool elementwise(const slapo_op *op) {
  return op && (op->elementwise || op == SLAPO_OP_DESC(full));
}

/* region[id] for every node, -1 outside; returns the number of regions. */
static int assign(slapo_module *m, slapo_graph *g, bool (*ends)(const slapo_op *), int *region) {
  int n_regions = 0;
  for (slapo_node *n = slapo_graph_last(g); n; n = n->prev) {
    region[n->id] = -1;
    const slapo_op *op = op_of(m, n);
    if (op && ends && ends(op)) {
      region[n->id] = n_regions++;
      continue;
    }
    if (!elementwise(op)) continue;
    int r = -2; /* -2: no user yet */
    for (int u = 0; u < n->n_users && r != -1; u++) {
      int ru = region[n->users[u]->id];
      r = ru < 0 ? -1 : r == -2 || r == ru ? ru : -1;
    }
    region[n->id] = r >= 0 ? r : n_regions++;
  }
  return n_regions;
}

static slapo_match_value value_of(slapo_node *x) {
  slapo_match_value v = {.node = x, .dtype = x->dtype, .ndim = x->ndim};
  memcpy(v.shape, x->shape, sizeof v.shape);
  return v;
}

/* One match per region with at least two ops, in graph order of results. */
static slapo_status collect(slapo_graph *g, const int *region, int n_regions, slapo_arena *a,
                            slapo_matches *out) {
  int count = slapo_graph_count(g);
  slapo_node **nodes = slapo_arena_alloc(a, sizeof *nodes * (size_t)count + 1, 16);
  slapo_node **ext = slapo_arena_alloc(a, sizeof *ext * (size_t)count + 1, 16);
  out->items = slapo_calloc((size_t)n_regions + 1, sizeof *out->items);
  if (!nodes || !ext || !out->items) return slapo_error(SLAPO_NOMEM, "regions: out of memory");
  /* Regions by result, in graph order of results. */
  for (slapo_node *root = slapo_graph_first(g); root; root = root->next) {
    int r = region[root->id];
    if (r < 0) continue;
    bool is_root = true;
    for (int u = 0; u < root->n_users && is_root; u++) is_root = region[root->users[u]->id] != r;
    if (!is_root) continue;
    int k = 0, n_ext = 0, ops = 0;
    for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
      if (region[n->id] != r) continue;
      nodes[k++] = n;
      ops += !(n->kind == SLAPO_NODE_CALL_OP && n->op == SLAPO_OP_DESC(full));
      for (int i = 0; i < n->n_inputs; i++) {
        slapo_node *x = n->inputs[i];
        bool seen = region[x->id] == r;
        for (int e = 0; e < n_ext && !seen; e++) seen = ext[e] == x;
        if (!seen) ext[n_ext++] = x;
      }
    }
    if (ops < 2) continue;
    slapo_match *mm = &out->items[out->n++];
    mm->n_nodes = k, mm->n_outputs = 1, mm->replaceable = true;
    mm->nodes = slapo_arena_alloc(a, sizeof *mm->nodes * (size_t)k, 16);
    mm->paths = slapo_arena_alloc(a, sizeof *mm->paths * (size_t)k, 16);
    mm->outputs = slapo_arena_alloc(a, sizeof *mm->outputs, 16);
    mm->inputs = slapo_arena_alloc(a, sizeof *mm->inputs * (size_t)(n_ext + 1), 16);
    if (!mm->nodes || !mm->paths || !mm->outputs || !mm->inputs)
      return slapo_error(SLAPO_NOMEM, "regions: out of memory");
    for (int j = 0; j < k; j++) {
      mm->nodes[j] = nodes[j];
      mm->paths[j] = nodes[j]->kind == SLAPO_NODE_CALL_MODULE ? nodes[j]->target : nodes[j]->origin;
    }
    mm->outputs[0] = root;
    for (int e = 0; e < n_ext; e++) mm->inputs[mm->n_inputs++] = value_of(ext[e]);
  }
  return SLAPO_OK;
}

slapo_status slapo_find_elementwise(slapo_module *m, slapo_graph *g,
                                    bool (*ends)(const slapo_op *op), slapo_matches *out) {
  memset(out, 0, sizeof *out);
  slapo_graph_renumber(g);
  slapo_arena *a;
  SLAPO_TRY(slapo_arena_new(4096, &a));
  int *region = slapo_calloc((size_t)slapo_graph_count(g) + 1, sizeof *region);
  slapo_status s = region ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "regions: out of memory");
  if (s == SLAPO_OK) s = collect(g, region, assign(m, g, ends, region), a, out);
  slapo_free(region);
  out->impl = a;
  if (s != SLAPO_OK) slapo_matches_deinit(out);
  return s;
}
