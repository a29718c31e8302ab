/* ir/lint.c - the graph invariant checker (use-def consistency and order,
 * see slapo_graph_lint in slapo/ir.h). It reads fields directly, never
 * trusts the bookkeeping it checks, and never allocates, so it can run after
 * a failed allocation and inside other passes. Layer: ir. */
#include <string.h>

#include "core/assert.h"
#include "ir/internal.h"

#define NAME(n) ((n)->name ? (n)->name : "?")

/* Occurrences of x in arr[0..n). */
static int count_in(slapo_node *const *arr, int n, const slapo_node *x) {
  int c = 0;
  for (int i = 0; i < n; i++) c += arr[i] == x;
  return c;
}

/* Links, ownership, count, order keys, names, kinds and per-kind shape. */
static slapo_status lint_nodes(const slapo_graph *g) {
  int count = 0, outputs = 0;
  const slapo_node *prev = NULL;
  for (const slapo_node *n = g->first; n; prev = n, n = n->next) {
    if (++count > g->count)
      return slapo_error(SLAPO_STATE,
                         "lint: node %%%s: the list holds more nodes than the graph's count %d "
                         "(rule: list and count agree; a cycle in the list?)",
                         NAME(n), g->count);
    if (n->prev != prev)
      return slapo_error(SLAPO_STATE,
                         "lint: node %%%s: prev link does not point to the node before it "
                         "(rule: doubly-linked list)",
                         NAME(n));
    if (n->graph != g)
      return slapo_error(SLAPO_STATE,
                         "lint: node %%%s: its graph pointer is not this graph (rule: nodes "
                         "in the list belong to the graph)",
                         NAME(n));
    if (prev && prev->order >= n->order)
      return slapo_error(SLAPO_STATE,
                         "lint: node %%%s: order key not above that of %%%s before it (rule: "
                         "order keys increase along the list; corrupted by a direct edit?)",
                         NAME(n), NAME(prev));
    if (!n->name || !*n->name)
      return slapo_error(SLAPO_STATE, "lint: a node of kind %s has no name (rule: every node "
                         "has a unique name)", slapo_node_kind_name(n->kind));
    if (slapo_map_get(g->names, n->name) != n)
      return slapo_error(SLAPO_STATE,
                         "lint: node %%%s: its name is not unique or not registered (rule: "
                         "unique names)",
                         n->name);
    if ((int)n->kind < 0 || n->kind > SLAPO_NODE_TUPLE)
      return slapo_error(SLAPO_STATE, "lint: node %%%s: unknown kind %d", n->name, (int)n->kind);
    if (!n->target)
      return slapo_error(SLAPO_STATE, "lint: node %%%s: target is NULL (rule: every node has "
                         "a target)", n->name);
    if (n->ndim < 0 || n->ndim > SLAPO_MAX_DIMS)
      return slapo_error(SLAPO_STATE, "lint: node %%%s: ndim %d is outside [0, %d]", n->name,
                         n->ndim, SLAPO_MAX_DIMS);
    if (n->n_inputs < 0 || (n->n_inputs > 0 && !n->inputs))
      return slapo_error(SLAPO_STATE, "lint: node %%%s: bad input array (n_inputs %d)", n->name,
                         n->n_inputs);
    if (n->n_users < 0 || n->n_users > n->cap_users || (n->n_users > 0 && !n->users))
      return slapo_error(SLAPO_STATE, "lint: node %%%s: bad user array (n_users %d, capacity %d)",
                         n->name, n->n_users, n->cap_users);
    if (n->n_results < 0)
      return slapo_error(SLAPO_STATE, "lint: node %%%s: n_results %d is negative", n->name,
                         n->n_results);
    switch (n->kind) {
    case SLAPO_NODE_PLACEHOLDER:
    case SLAPO_NODE_PARAM:
      if (n->n_inputs != 0)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: a %s has %d inputs (rule: no inputs)",
                           n->name, slapo_node_kind_name(n->kind), n->n_inputs);
      break;
    case SLAPO_NODE_CALL_OP:
      if (!*n->target)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: call_op has an empty op name (rule: call_op "
                           "names its op)",
                           n->name);
      break;
    case SLAPO_NODE_CALL_MODULE: break;
    case SLAPO_NODE_TUPLE:
      if (n->n_inputs < 1 || n->n_results != n->n_inputs)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: tuple of %d inputs has n_results %d "
                           "(rule: a tuple has n_results = n_inputs >= 1)", n->name,
                           n->n_inputs, n->n_results);
      break;
    case SLAPO_NODE_GETITEM:
      if (n->n_inputs != 1)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: getitem has %d inputs (rule: exactly "
                           "one)", n->name, n->n_inputs);
      break;
    case SLAPO_NODE_OUTPUT:
      outputs++;
      if (outputs > 1)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: a second output node (rule: at most one output)",
                           n->name);
      if (n->next)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: the output node is followed by %%%s (rule: the "
                           "output node is last)",
                           n->name, NAME(n->next));
      if (n->n_users != 0)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: the output node has %d users (rule: the output "
                           "has no value to use)",
                           n->name, n->n_users);
      if (n->n_results != 0 && n->n_results != n->n_inputs)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: output of %d values has n_results %d "
                           "(rule: 0, or n_inputs for a tuple)", n->name, n->n_inputs,
                           n->n_results);
      if (g->output != n)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: not the graph's recorded output node",
                           n->name);
      break;
    }
  }
  if (prev != g->last)
    return slapo_error(SLAPO_STATE, "lint: the graph's last pointer is not the last node %%%s",
                       prev ? NAME(prev) : "(none)");
  if (count != g->count)
    return slapo_error(SLAPO_STATE, "lint: the list holds %d nodes, the graph counts %d", count,
                       g->count);
  if (outputs == 0 && g->output)
    return slapo_error(SLAPO_STATE, "lint: the recorded output node %%%s is not in the list",
                       NAME(g->output));
  return SLAPO_OK;
}

/* Inputs: in the graph, before their users, of the right kind. */
static slapo_status lint_inputs(const slapo_graph *g) {
  for (const slapo_node *n = g->first; n; n = n->next) {
    for (int i = 0; i < n->n_inputs; i++) {
      const slapo_node *v = n->inputs[i];
      if (!v)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: input %d is NULL (rule: inputs are "
                           "nodes of the graph)", n->name, i);
      if (v->graph != g)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: input %d (%%%s) is not in the graph (rule: inputs "
                           "are nodes of the graph; erased while used?)",
                           n->name, i, NAME(v));
      if (v->order >= n->order)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: input %%%s %s (rule: inputs come before their "
                           "users)",
                           n->name, v->name, v == n ? "is the node itself" : "comes after it");
      if (v->kind == SLAPO_NODE_OUTPUT)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: uses the output node %%%s (rule: the "
                           "output has no value to use)", n->name, v->name);
      if (n->kind == SLAPO_NODE_TUPLE && v->kind == SLAPO_NODE_TUPLE)
        return slapo_error(SLAPO_STATE, "lint: node %%%s: tuple input %%%s is a tuple (rule: "
                           "tuples do not nest)", n->name, v->name);
      if (n->kind == SLAPO_NODE_GETITEM && v->n_results <= n->item)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: getitem reads item %d of %%%s, which has %d results "
                           "(rule: getitem reads a multi-result node with n_results > item)",
                           n->name, n->item, v->name, v->n_results);
    }
  }
  return SLAPO_OK;
}

/* User lists equal to the uses, with multiplicity. Uses are checked for the
 * whole graph first so that a broken use is reported at its user, which is
 * the more telling message, before any stray user entry. */
static slapo_status lint_users(const slapo_graph *g) {
  for (const slapo_node *n = g->first; n; n = n->next) {
    for (int i = 0; i < n->n_inputs; i++) {
      const slapo_node *v = n->inputs[i];
      /* Check each distinct input once, at its first slot. */
      if (count_in(n->inputs, i, v) > 0) continue;
      int uses = count_in(n->inputs, n->n_inputs, v);
      int listed = count_in(v->users, v->n_users, n);
      if (uses != listed)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: uses %%%s %d time%s but appears %d time%s in its "
                           "user list (rule: user lists match inputs)",
                           n->name, v->name, uses, uses == 1 ? "" : "s", listed,
                           listed == 1 ? "" : "s");
    }
  }
  for (const slapo_node *n = g->first; n; n = n->next) {
    /* Every listed user must use n; with the counts above equal, the user
     * list is exactly the multiset of uses. */
    for (int k = 0; k < n->n_users; k++) {
      const slapo_node *u = n->users[k];
      if (!u || u->graph != g)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: user %d (%%%s) is not in the graph (rule: user "
                           "lists match inputs)",
                           n->name, k, u ? NAME(u) : "NULL");
      if (count_in(u->inputs, u->n_inputs, n) == 0)
        return slapo_error(SLAPO_STATE,
                           "lint: node %%%s: lists %%%s as a user but %%%s does not use it "
                           "(rule: user lists match inputs)",
                           n->name, NAME(u), NAME(u));
    }
  }
  return SLAPO_OK;
}

slapo_status slapo_graph_lint(const slapo_graph *g) {
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "lint: graph is NULL");
  SLAPO_TRY(lint_nodes(g));
  SLAPO_TRY(lint_inputs(g));
  return lint_users(g);
}
