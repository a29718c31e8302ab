/* ir/edit.c - graph edits that keep user lists consistent: set_input,
 * replace_all_uses, erase, move_before, and dead-code elimination. Every
 * edit checks and allocates before it changes anything, so a failed edit
 * leaves the graph as it was. Layer: ir. Modelled on torch.fx's
 * Node.replace_input_with / replace_all_uses_with / Graph.erase_node. */
#include "core/assert.h"
#include "ir/internal.h"

slapo_status slapo_node_set_input(slapo_node *n, int i, slapo_node *v) {
  if (!n) return slapo_error(SLAPO_INVALID_ARG, "set_input: node is NULL");
  slapo_graph *g = n->graph;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "set_input: %%%s was erased", n->name);
  if (i < 0 || i >= n->n_inputs)
    return slapo_error(SLAPO_INVALID_ARG, "set_input %%%s: input %d is out of range (%d inputs)",
                       n->name, i, n->n_inputs);
  if (!v) return slapo_error(SLAPO_INVALID_ARG, "set_input %%%s: new input %d is NULL", n->name, i);
  if (v->graph != g)
    return slapo_error(SLAPO_INVALID_ARG,
                       "set_input %%%s: new input %%%s is not a node of this graph (erased, or "
                       "of another graph)",
                       n->name, v->name ? v->name : "?");
  if (v->kind == SLAPO_NODE_OUTPUT)
    return slapo_error(SLAPO_INVALID_ARG,
                       "set_input %%%s: the output node %%%s has no value to use", n->name,
                       v->name);
  if (n->kind == SLAPO_NODE_GETITEM && v->n_results <= n->item)
    return slapo_error(SLAPO_INVALID_ARG,
                       "set_input %%%s: getitem reads item %d but %%%s has %d results", n->name,
                       n->item, v->name, v->n_results);
  slapo_node *old = n->inputs[i];
  if (old == v) return SLAPO_OK;
  SLAPO_TRY(slapo__ir_users_reserve(v, 1));
  slapo__ir_users_remove(old, n);
  n->inputs[i] = v;
  slapo__ir_users_push(v, n);
  return SLAPO_OK;
}

slapo_status slapo_node_replace_all_uses(slapo_node *old, slapo_node *repl) {
  if (!old || !repl)
    return slapo_error(SLAPO_INVALID_ARG, "replace_all_uses: %s node is NULL",
                       old ? "replacement" : "old");
  slapo_graph *g = old->graph;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "replace_all_uses: %%%s was erased", old->name);
  if (repl->graph != g)
    return slapo_error(SLAPO_INVALID_ARG,
                       "replace_all_uses %%%s: replacement %%%s is not a node of this graph "
                       "(erased, or of another graph)",
                       old->name, repl->name ? repl->name : "?");
  if (repl->kind == SLAPO_NODE_OUTPUT)
    return slapo_error(SLAPO_INVALID_ARG,
                       "replace_all_uses %%%s: the output node %%%s has no value to use",
                       old->name, repl->name);
  if (old == repl) return SLAPO_OK;
  for (int k = 0; k < old->n_users; k++) {
    const slapo_node *u = old->users[k];
    if (u->order <= repl->order)
      return slapo_error(SLAPO_STATE,
                         "replace_all_uses %%%s: replacement %%%s does not come before %%%s's "
                         "user %%%s (a value must be defined before it is used); insert the "
                         "replacement earlier or move it with slapo_graph_move_before",
                         old->name, repl->name, old->name, u->name);
    if (u->kind == SLAPO_NODE_GETITEM && u->item >= repl->n_results)
      return slapo_error(SLAPO_STATE,
                         "replace_all_uses %%%s: user %%%s reads item %d but replacement %%%s "
                         "has %d results",
                         old->name, u->name, u->item, repl->name, repl->n_results);
  }
  SLAPO_TRY(slapo__ir_users_reserve(repl, old->n_users));
  /* A user listed k times uses old in k input slots: the first visit
   * rewrites all of them, later visits find none left. */
  for (int k = 0; k < old->n_users; k++) {
    slapo_node *u = old->users[k];
    for (int i = 0; i < u->n_inputs; i++) {
      if (u->inputs[i] != old) continue;
      u->inputs[i] = repl;
      slapo__ir_users_push(repl, u);
    }
  }
  old->n_users = 0;
  return SLAPO_OK;
}

/* Moves the insertion point off n, which is about to leave the list, to the
 * same place relative to n's neighbours. */
static void move_insertion_point(slapo_graph *g, slapo_node *n) {
  if (g->ins_node != n) return;
  if (g->ins_mode == SLAPO__INS_AFTER && n->prev) {
    g->ins_node = n->prev;
  } else { /* before n, or after n when n is first: before n's successor */
    g->ins_node = n->next;
    g->ins_mode = n->next ? SLAPO__INS_BEFORE : SLAPO__INS_END;
  }
}

slapo_status slapo_graph_erase(slapo_graph *g, slapo_node *n) {
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "erase: graph is NULL");
  if (!n) return slapo_error(SLAPO_INVALID_ARG, "erase: node is NULL");
  if (n->graph != g)
    return slapo_error(SLAPO_INVALID_ARG,
                       "erase: %%%s is not a node of this graph (erased, or of another graph)",
                       n->name ? n->name : "?");
  if (n->n_users > 0)
    return slapo_error(SLAPO_STATE,
                       "erase: %%%s still has %d user%s (first: %%%s); replace its uses or "
                       "erase the users first",
                       n->name, n->n_users, n->n_users == 1 ? "" : "s", n->users[0]->name);
  for (int i = 0; i < n->n_inputs; i++) slapo__ir_users_remove(n->inputs[i], n);
  move_insertion_point(g, n);
  slapo__ir_unlink(g, n);
  if (g->output == n) g->output = NULL;
  slapo_free(n->users);
  n->users = NULL;
  n->cap_users = 0;
  /* The node stays in the arena and in the name map (so its name is never
   * handed out again); graph == NULL marks it erased. */
  n->graph = NULL;
  return SLAPO_OK;
}

slapo_status slapo_graph_move_before(slapo_graph *g, slapo_node *n, slapo_node *pos) {
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "move_before: graph is NULL");
  if (!n || !pos) return slapo_error(SLAPO_INVALID_ARG, "move_before: node is NULL");
  if (n->graph != g || pos->graph != g)
    return slapo_error(SLAPO_INVALID_ARG,
                       "move_before %%%s: %%%s is not a node of this graph (erased, or of "
                       "another graph)",
                       n->name ? n->name : "?",
                       n->graph != g ? (n->name ? n->name : "?") : pos->name ? pos->name : "?");
  if (n->kind == SLAPO_NODE_OUTPUT)
    return slapo_error(SLAPO_INVALID_ARG,
                       "move_before %%%s: the output node must stay last", n->name);
  if (n == pos || n->next == pos) return SLAPO_OK;
  slapo__ir_unlink(g, n);
  slapo__ir_link_before(g, n, pos);
  return SLAPO_OK;
}

int slapo_graph_dce(slapo_graph *g) {
  if (!g) return 0;
  int removed = 0;
  slapo_node *n = g->last;
  while (n) {
    slapo_node *prev = n->prev;
    if (n->n_users == 0 && n->kind != SLAPO_NODE_OUTPUT && n->kind != SLAPO_NODE_PLACEHOLDER) {
      slapo_status s = slapo_graph_erase(g, n);
      SLAPO_ASSERT(s == SLAPO_OK); /* no users: erase cannot fail */
      removed++;
    }
    n = prev;
  }
  return removed;
}
