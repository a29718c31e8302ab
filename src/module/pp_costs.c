/* module/pp_costs.c - what each block of a model costs, for `--pp K`
 * without cut lines (slapo_pp_block_costs): the blocks are the children
 * of the model's longest module list, and a block's cost is that of the
 * ops of the step's forward it emits, each costed from its shapes alone by
 * a roofline (the larger of its FLOPs / 8 and its bytes), so every rank
 * finds the same costs. Layer: module. */
#include <stdlib.h>
#include <string.h>

#include "module/internal.h"

/* FLOPs one byte of memory traffic buys on a CPU core: f32 FMA at ~100
 * GFLOP/s against ~12 GB/s of DRAM bandwidth (AVX2 or AVX-512 cores of
 * 2024-2026). Only the ratio matters: it decides whether a node is
 * counted by its arithmetic or by its memory traffic. */
#define FLOPS_PER_BYTE 8.0

/* A list: children named 0 .. n-1 in order (ModuleList). */
static int list_len(const slapo_module *m) {
  for (int i = 0; i < m->n_children; i++) {
    char *end;
    long v = strtol(m->children[i]->name, &end, 10);
    if (*end || end == m->children[i]->name || v != i) return 0;
  }
  return m->n_children;
}

/* The module with the longest list of children under m (the first found,
 * depth first, among equals), into *best of *n. */
static void longest_list(const slapo_module *m, const slapo_module **best, int *n) {
  int k = list_len(m);
  if (k > *n) *best = m, *n = k;
  for (int i = 0; i < m->n_children; i++) longest_list(m->children[i], best, n);
}

static bool within(const char *origin, const char *path, size_t len) {
  return origin && !strncmp(origin, path, len) && (origin[len] == '\0' || origin[len] == '.');
}

/* The block of `origin` under list path `lp` (len bytes), or -1. */
static int block_of(const char *origin, const char *lp, size_t len, int n) {
  if (!within(origin, lp, len) || origin[len] != '.') return -1;
  char *end;
  long b = strtol(origin + len + 1, &end, 10);
  return end != origin + len + 1 && (*end == '\0' || *end == '.') && b >= 0 && b < n ? (int)b
                                                                                     : -1;
}

/* Each op's roofline cost into costs [n] by block: before the first
 * block into block 0, after it (once a block was seen) into block n-1. */
static void sum_costs(const slapo_graph *g, const char *lp, int n, double *costs) {
  size_t len = strlen(lp);
  bool seen = false;
  for (slapo_node *x = slapo_graph_first(g); x; x = x->next) {
    if (x->kind != SLAPO_NODE_CALL_OP) continue;
    double f = slapo_node_flops(x) / FLOPS_PER_BYTE, b = slapo_node_bytes(x);
    int k = block_of(x->origin, lp, len, n);
    if (k >= 0) seen = true;
    else k = seen ? n - 1 : 0;
    costs[k] += f > b ? f : b;
  }
}

slapo_status slapo_pp_block_costs(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                  char **list, double **costs, int *n) {
  *list = NULL, *costs = NULL, *n = 0;
  const slapo_module *best = NULL;
  int len = 0;
  longest_list(root, &best, &len);
  if (!best)
    return slapo_error(SLAPO_NOT_FOUND, "pipeline: %s has no module list (children named 0, 1, "
                       "...) to split into stages; give cut lines", root->type->name);
  slapo_graph *fg = NULL;
  slapo__build_state fbs = {0};
  slapo_node *ins[SLAPO_STEP_MAX_INPUTS], *y;
  char *lp = slapo_module_path(best);
  double *c = slapo_calloc((size_t)len, sizeof *c);
  slapo_status s = lp && c ? slapo_graph_new(&fg) : slapo_error(SLAPO_NOMEM, "out of memory");
  if (s == SLAPO_OK) s = slapo__pp_forward(root, n_in, in, fg, &fbs, ins, &y);
  if (s == SLAPO_OK) sum_costs(fg, lp, len, c);
  slapo_map_free(fbs.param_nodes);
  slapo_map_free(fbs.param_objs);
  slapo_graph_free(fg);
  if (s != SLAPO_OK) {
    slapo_free(lp);
    slapo_free(c);
    return s;
  }
  *list = lp, *costs = c, *n = len;
  return SLAPO_OK;
}
