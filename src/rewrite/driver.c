/* rewrite/driver.c - the one driver every graph rewrite runs through
 * (slapo/rewrite.h): rules in a fixed order, each offered the graph's nodes
 * in order, sweeps repeated to a fixpoint; the shared edit. Layer: rewrite. */
#include <stdio.h>

#include "core/assert.h"
#include "slapo/rewrite.h"

/* A whole sweep that still rewrites after this many is a pair of rules
 * undoing each other (every rule here only removes or merges nodes). */
enum { MAX_SWEEPS = 64 };

/* One rule over the whole graph; *count receives its rewrites. */
static slapo_status sweep_rule(slapo_graph *g, const slapo_rewrite_rule *r,
                               const slapo_rewrite_env *env, int *count) {
  *count = 0;
  if (r->guard && !r->guard(env)) return SLAPO_OK;
  for (slapo_node *n = slapo_graph_first(g); n;) {
    slapo_rewrite_match m = {{NULL}, 0};
    if ((r->anchor && !slapo_node_is_op(n, r->anchor)) || !r->match(n, env, &m)) {
      n = n->next;
      continue;
    }
    slapo_node *resume = NULL;
    slapo_status s = r->rewrite(g, &m, &resume);
    if (s != SLAPO_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", slapo_last_error());
      return slapo_error(s, "rewrite %s: %s", r->name, why);
    }
    (*count)++;
    n = resume ? resume->next : slapo_graph_first(g);
  }
  return SLAPO_OK;
}

slapo_status slapo_rewrite_run(slapo_graph *g, const slapo_rewrite_rule *const *rules, int n_rules,
                               const slapo_rewrite_env *env, int *counts) {
  for (int i = 0; counts && i < n_rules; i++) counts[i] = 0;
  const char *last = NULL;
  for (int sweep = 0; sweep < MAX_SWEEPS; sweep++) {
    int changed = 0;
    for (int i = 0; i < n_rules; i++) {
      int c;
      SLAPO_TRY(sweep_rule(g, rules[i], env, &c));
      if (c) last = rules[i]->name, changed += c;
      if (counts) counts[i] += c;
    }
    if (!changed) return SLAPO_OK;
  }
  return slapo_error(SLAPO_STATE,
                     "rewrite: %d sweeps of %d rules still rewrite (last: %s): two rules undo "
                     "each other",
                     MAX_SWEEPS, n_rules, last ? last : "?");
}

slapo_status slapo_rewrite_emit_before(slapo_graph *g, slapo_node *at, const slapo_op *op,
                                       int n_in, slapo_node *const *in, int n_attrs,
                                       const slapo_attr *attrs, const slapo_node *like,
                                       slapo_node **out) {
  slapo_graph_insert_before(g, at);
  slapo_status s = slapo_graph_add_call_op(g, op->name, op, n_in, in, n_attrs, attrs, out);
  slapo_graph_insert_at_end(g);
  SLAPO_TRY(s);
  SLAPO_TRY(op->infer(*out));
  return slapo_node_set_origin(*out, like->origin ? like->origin : "", like->op_seq);
}
