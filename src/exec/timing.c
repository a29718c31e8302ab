/* exec/timing.c - per-node wall time of the last run (opts.timing) and a
 * report grouped by the module path that emitted each node (node->origin),
 * so time is attributed to modules as DESIGN.md §3 asks. Layer: exec. */
#include <stdio.h>

#include "exec/internal.h"

double slapo_plan_node_ms(const slapo_plan *p, const slapo_node *n) {
  if (!p || !p->opts.timing) return 0;
  int i = slapo__plan_index(p, n);
  return i < 0 ? 0 : p->ms[i];
}

double slapo_plan_accumulate_ms(const slapo_plan *p) {
  return p && p->opts.timing ? p->acc_ms : 0;
}

/* Total ms and call_op node count of origin group g. */
static double group_ms(const slapo_plan *p, int g, int *n_nodes) {
  double ms = 0;
  int n = 0;
  for (int i = 0; i < p->n_nodes; i++) {
    if (p->nodes[i].group != g) continue;
    ms += p->ms[i];
    n++;
  }
  *n_nodes = n;
  return ms;
}

void slapo_plan_print_timing(const slapo_plan *p, FILE *f) {
  if (!p || !f) return;
  if (!p->opts.timing) {
    fprintf(f, "timing: not recorded (plan built without opts.timing)\n");
    return;
  }
  double total = 0;
  for (int i = 0; i < p->n_nodes; i++) total += p->ms[i];
  fprintf(f, "timing: %.3f ms in %d nodes, by origin module\n", total, p->n_nodes);
  fprintf(f, "%12s %7s %6s  %s\n", "ms", "share", "nodes", "origin");
  /* Largest first by repeated selection: the number of modules is small and
   * printing must not allocate or reorder the plan. */
  double prev = 1e300;
  int prev_g = -1, printed = 0;
  while (printed < p->n_groups) {
    int best = -1, best_n = 0;
    double best_ms = -1;
    for (int g = 0; g < p->n_groups; g++) {
      int n;
      double ms = group_ms(p, g, &n);
      /* Strictly after (prev, prev_g) in (ms desc, g asc) order. */
      bool after = ms < prev || (ms == prev && g > prev_g);
      if (after && (ms > best_ms || best < 0)) best = g, best_ms = ms, best_n = n;
    }
    if (best < 0) break;
    const char *name = p->group_name[best][0] ? p->group_name[best] : "(root)";
    fprintf(f, "%12.3f %6.1f%% %6d  %s\n", best_ms, total > 0 ? 100.0 * best_ms / total : 0.0,
            best_n, name);
    prev = best_ms;
    prev_g = best;
    printed++;
  }
}
