/* train/pp_auto.c - `--pp K` without cut lines (slapo_pp_auto_cut): the
 * blocks' costs (slapo_pp_block_costs) split into K contiguous stages
 * whose largest cost is least (slapo_pp_balance), marked as `cut` marks
 * them, with the schedule lines that would make the same stages. Layer:
 * train. */
#include <stdio.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"

/* Marks the module list's children ending each stage, and writes their
 * lines into lines [cap]. */
static slapo_status mark(slapo_module *root, const char *list, const int *cut, int k,
                         char *lines, size_t cap) {
  size_t len = 0;
  lines[0] = '\0';
  for (int j = 0; j < k - 1; j++) {
    char path[512];
    snprintf(path, sizeof path, "%s.%d", list, cut[j]);
    slapo_module *m;
    SLAPO_TRY(slapo_module_at(root, path, &m));
    m->pp_cut = true;
    int w = snprintf(lines + len, cap - len, "%s cut\n", path);
    if (w < 0 || (size_t)w >= cap - len)
      return slapo_error(SLAPO_LIMIT, "pp_auto_cut: %d cut lines exceed %zu bytes", k - 1, cap);
    len += (size_t)w;
  }
  return SLAPO_OK;
}

slapo_status slapo_pp_auto_cut(slapo_module *root, int n_in, const slapo_tensor *const *in,
                               int k, char *lines, size_t cap, double *share) {
  if (slapo_pp_stage_count(root) > 1)
    return slapo_error(SLAPO_STATE, "pp_auto_cut: the schedule already cuts %s into %d stages",
                       root->type->name, slapo_pp_stage_count(root));
  char *list;
  double *cost;
  int n, cut[4096];
  if (k < 1 || k > 4096)
    return slapo_error(SLAPO_INVALID_ARG, "pp_auto_cut: %d stages (1 to 4096)", k);
  SLAPO_TRY(slapo_pp_block_costs(root, n_in, in, &list, &cost, &n));
  double max = 0, total = 0;
  for (int i = 0; i < n; i++) total += cost[i];
  slapo_status s = slapo_pp_balance(cost, n, k, cut, &max);
  if (s != SLAPO_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", slapo_last_error());
    s = slapo_error(s, "--pp %d: %s has %d blocks to split into stages: %s", k, list, n, why);
  }
  if (s == SLAPO_OK) s = mark(root, list, cut, k, lines, cap);
  if (share) *share = total > 0 ? max / total : 0;
  slapo_free(list);
  slapo_free(cost);
  return s;
}
