/* slapo/rewrite.h - graph rewrites as rules, and the one driver that runs
 * them.
 *
 * A rule is a matcher, a guard and a rewrite. The driver offers the rule
 * every node of the graph in order (those of the rule's anchor op, when it
 * names one); where the guard admits the graph and the matcher matches, it
 * rewrites, then goes on after the node the rewrite names. It runs a list
 * of rules in their fixed order, and the list again while a sweep changed
 * anything, so the result is a fixpoint and depends only on the graph and
 * the list (deterministic: no hashing, no addresses). A new graph pass is
 * one rule: its own file in src/rewrite/ and one line in a table such as
 * the step's (src/rewrite/step_rules.def, which slapo_step runs).
 *
 * Rules work on ops only (call_op nodes and their attributes), so this
 * layer sits above ops and below module and compiler.
 * Layer: rewrite. */
#ifndef SLAPO_REWRITE_H
#define SLAPO_REWRITE_H

#include <stdbool.h>

#include "slapo/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a rule may depend on besides the graph. */
typedef struct slapo_rewrite_env {
  bool training; /* the step trains: dropout draws, the graph holds a backward */
} slapo_rewrite_env;

/* The nodes a match binds, by the rule's own convention (the anchor first). */
enum { SLAPO_REWRITE_MAX_BOUND = 8 };
typedef struct slapo_rewrite_match {
  slapo_node *node[SLAPO_REWRITE_MAX_BOUND];
  int k; /* a rule's small integer (which operand matched, ...) */
} slapo_rewrite_match;

typedef struct slapo_rewrite_rule {
  const char *name;    /* "fold_index_add": SLAPO_DEBUG=1 logs each rule's count */
  const char *summary; /* one line: what it does                            */
  /* The op every match is anchored at (the driver offers only its nodes),
   * or NULL: every node. */
  const slapo_op *anchor;
  /* Whether the rule applies to this graph at all, or NULL: always. */
  bool (*guard)(const slapo_rewrite_env *env);
  /* Whether the subgraph at n matches; fills m. Must not change the graph. */
  bool (*match)(slapo_node *n, const slapo_rewrite_env *env, slapo_rewrite_match *m);
  /* Rewrites a match: afterwards the graph lints and computes the same
   * values (to the rounding the rule's file documents). *resume: a node
   * still in the graph after which the sweep goes on (usually the new
   * node), or NULL to restart from the first. Errors: those of the graph
   * edits (NOMEM; the graph then still lints). */
  slapo_status (*rewrite)(slapo_graph *g, const slapo_rewrite_match *m, slapo_node **resume);
} slapo_rewrite_rule;

/* Runs rules[0 .. n_rules) over g in order, again and again until a whole
 * sweep rewrites nothing. counts (NULL, or n_rules ints) receives how many
 * times each rule rewrote. Errors: a rule's rewrite status (naming the
 * rule); SLAPO_STATE when 64 sweeps still rewrite (rules that undo each
 * other), naming the last rule that fired. */
slapo_status slapo_rewrite_run(slapo_graph *g, const slapo_rewrite_rule *const *rules, int n_rules,
                               const slapo_rewrite_env *env, int *counts);

/* The rules of a built step graph (step_rules.def), in the order they run:
 * *n receives the count. Static. */
const slapo_rewrite_rule *const *slapo_rewrite_step_rules(int *n);

/* The registered rule `name` (any table), or NULL. */
const slapo_rewrite_rule *slapo_rewrite_rule_find(const char *name);

/* A call_op node of `op` on in[n_in] with attrs[n_attrs], inserted before
 * `at`, its dtype and shape from the op's own shape inference, its origin
 * (module path, op_seq) copied from `like`: the edit rules share. Errors:
 * those of slapo_graph_add_call_op and of the op's infer. */
slapo_status slapo_rewrite_emit_before(slapo_graph *g, slapo_node *at, const slapo_op *op,
                                       int n_in, slapo_node *const *in, int n_attrs,
                                       const slapo_attr *attrs, const slapo_node *like,
                                       slapo_node **out);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_REWRITE_H */
