/* ir/internal.h - the graph structure and helpers shared by the files of the
 * ir layer (graph.c, edit.c, lint.c, print.c, attr.c); not installed.
 * Layer: ir. */
#ifndef SLAPO_IR_INTERNAL_H
#define SLAPO_IR_INTERNAL_H

#include "slapo/ir.h"

/* Where the next constructor puts its node (see slapo_graph_insert_*). */
typedef enum slapo__ins_mode {
  SLAPO__INS_END,    /* last, or just before the output node            */
  SLAPO__INS_BEFORE, /* just before ins_node                            */
  SLAPO__INS_AFTER   /* just after ins_node, then after the new node    */
} slapo__ins_mode;

struct slapo_graph {
  slapo_arena *arena; /* nodes, names, targets, attributes, input arrays */
  slapo_map *names;   /* unique name -> node; erased nodes stay (with
                         graph == NULL) so that names are never reused */
  slapo_map *bases;   /* name base -> int* next suffix to try          */
  slapo_node *first, *last;
  slapo_node *output; /* the output node or NULL                      */
  int count;
  slapo__ins_mode ins_mode;
  slapo_node *ins_node;
};

/* Spacing of order keys after a relabel; a relabel happens only when two
 * neighbours have no key left between them. */
#define SLAPO__ORDER_GAP ((uint64_t)1 << 32)

/* Links n into g's list just before `pos` (NULL: at the end), assigns its
 * order key and counts it. Never fails. */
void slapo__ir_link_before(slapo_graph *g, slapo_node *n, slapo_node *pos);
/* Unlinks n from g's list (counts it out). Never fails. */
void slapo__ir_unlink(slapo_graph *g, slapo_node *n);

/* Ensures n->users has room for `extra` more entries.
 * Errors: SLAPO_NOMEM (n unchanged). */
slapo_status slapo__ir_users_reserve(slapo_node *n, int extra);
/* Appends u to n->users; capacity must have been reserved. */
void slapo__ir_users_push(slapo_node *n, slapo_node *u);
/* Removes the first occurrence of u from n->users (keeping the order of the
 * others). It must be there. */
void slapo__ir_users_remove(slapo_node *n, slapo_node *u);

/* True when n is a live node of g. */
static inline int slapo__ir_in_graph(const slapo_graph *g, const slapo_node *n) {
  return n != NULL && g != NULL && n->graph == g;
}

/* Copies `n` attributes into the arena (keys, strings, int arrays); `what`
 * names the node for messages. Errors: SLAPO_INVALID_ARG (NULL key, NULL
 * string, negative or NULL int array, duplicate key, unknown kind),
 * SLAPO_NOMEM. */
slapo_status slapo__ir_attrs_copy(slapo_arena *a, const char *what, int n,
                                  const slapo_attr *src, slapo_attr **out);

#endif
