/* slapo/ir.h - the dataflow graph IR (DESIGN.md §4): nodes in topological
 * order, one output per node, users, an edit API that keeps users and unique
 * names consistent, lint, dead-code elimination, text and Graphviz printers.
 * Layer: ir (depends on tensor, core). Modelled on torch.fx's Graph. */
#ifndef SLAPO_IR_H
#define SLAPO_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "slapo/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum slapo_node_kind {
  SLAPO_NODE_PLACEHOLDER, /* graph input; target = input name            */
  SLAPO_NODE_PARAM,       /* parameter read; target = parameter path     */
  SLAPO_NODE_CALL_OP,     /* target = op name, op = descriptor, attrs    */
  SLAPO_NODE_CALL_MODULE, /* target = child module path                  */
  SLAPO_NODE_GETITEM,     /* result `item` of a multi-result input[0]    */
  SLAPO_NODE_OUTPUT,      /* graph results = inputs; at most one per graph */
  SLAPO_NODE_TUPLE        /* several values returned together (a module  */
                          /*   forward's tuple): inputs = the values,     */
                          /*   n_results = n_inputs; only while a graph   */
                          /*   is built (the builder resolves a getitem   */
                          /*   of it to the value), never planned         */
} slapo_node_kind;

const char *slapo_node_kind_name(slapo_node_kind k); /* "call_op"; static */

typedef enum slapo_attr_kind {
  SLAPO_ATTR_INT,
  SLAPO_ATTR_FLOAT,
  SLAPO_ATTR_STR,
  SLAPO_ATTR_INTS
} slapo_attr_kind;

/* One attribute of a call_op node (e.g. axis=-1, eps=1e-5, causal=1). When
 * passed to slapo_graph_add_call_op the key, string and int array are copied
 * into the graph's arena. */
typedef struct slapo_attr {
  const char *key;
  slapo_attr_kind kind;
  int64_t i;           /* INT */
  double f;            /* FLOAT */
  const char *s;       /* STR */
  int n;               /* INTS: count */
  const int64_t *ints; /* INTS: values */
} slapo_attr;

/* Convenience constructors for attribute literals. */
slapo_attr slapo_attr_int(const char *key, int64_t v);
slapo_attr slapo_attr_float(const char *key, double v);
slapo_attr slapo_attr_str(const char *key, const char *v);
slapo_attr slapo_attr_ints(const char *key, int n, const int64_t *v);

/* Tensor-parallel layout of a value: which piece of the unsharded model's
 * value this rank's tensor holds (DESIGN.md §3). Set by the ops layer when a
 * node is built (ops/layout.c): parameters from their shard records, every
 * op by its rule; zero-initialized = REPLICATED (graph inputs). Random ops
 * draw the unsharded model's numbers for their part from it. */
typedef enum slapo_layout_kind {
  SLAPO_LAYOUT_REPLICATED = 0, /* every rank holds the whole value            */
  SLAPO_LAYOUT_SPLIT,          /* a slice along one axis (below)              */
  SLAPO_LAYOUT_PARTIAL,        /* a partial sum: the value is the sum over    */
                               /*   the ranks (row-parallel before all-reduce) */
  SLAPO_LAYOUT_UNKNOWN         /* sharded in a way no rule follows            */
} slapo_layout_kind;

/* SPLIT: axis `axis` (local size L) is `parts` equal blocks (c_attn's q|k|v
 * before the split), each of unsharded size full / parts; in every block
 * this rank holds the elements [start, start + L / parts). parts = 1 is one
 * contiguous slice [start, start + L) of an axis of unsharded size `full`. */
typedef struct slapo_layout {
  slapo_layout_kind kind;
  int axis, parts;
  int64_t start, full;
} slapo_layout;

struct slapo_op;    /* descriptor, defined by the ops layer */
struct slapo_graph; /* opaque */
typedef struct slapo_graph slapo_graph;

/* A node. Fields are readable by every layer; change them only through the
 * edit API below (which keeps `users` and names consistent). All pointers
 * are owned by the graph's arena and live until the graph is freed. */
typedef struct slapo_node {
  slapo_node_kind kind;
  const char *name;            /* unique within the graph, e.g. "matmul_2" */
  const char *target;          /* see slapo_node_kind                      */
  const struct slapo_op *op;   /* CALL_OP: descriptor (set by the ops layer) */
  int n_inputs;
  struct slapo_node **inputs;
  int n_users;                 /* one entry per use (a node using x twice  */
  struct slapo_node **users;   /*   appears twice)                          */
  int n_attrs;
  slapo_attr *attrs;
  int item;                    /* GETITEM: result index                    */
  int n_results;               /* > 0: the node's value is a tuple read    */
                               /*   through getitem nodes; 0: one tensor;  */
                               /*   OUTPUT: > 0 returns a tuple            */
  /* Value metadata (shape inference fills it). */
  slapo_dtype dtype;
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
  const char *origin;          /* module path that emitted it ("" = root)  */
  int op_seq;                  /* index of the op within its module forward */
  int recompute;               /* > 0: id of the activation-checkpointing  */
                               /*   region it belongs to (autograd re-emits */
                               /*   the region before its backward)        */
  slapo_layout layout;         /* tensor-parallel layout (ops/layout.c)    */
  int id;                      /* position (0-based), see slapo_graph_renumber */
  void *aux;                   /* scratch for passes; not preserved        */
  struct slapo_node *prev, *next;
  slapo_graph *graph;          /* owning graph; NULL once erased           */
  int cap_users;               /* private: capacity of `users`             */
  uint64_t order;              /* private: strictly increasing along the   */
                               /*   list (O(1) "comes before" checks)      */
} slapo_node;

/* Creates an empty graph. *out owned (slapo_graph_free). Errors: SLAPO_NOMEM. */
slapo_status slapo_graph_new(slapo_graph **out);
void slapo_graph_free(slapo_graph *g); /* NULL is fine */
/* The graph's arena (for passes that keep data as long as the graph). */
slapo_arena *slapo_graph_arena(slapo_graph *g);

/* Iteration: first/last node (NULL if empty or g is NULL), then n->next /
 * n->prev. Returned nodes are borrowed: valid until the graph is freed (an
 * erased node's fields stay readable, with graph == NULL). */
slapo_node *slapo_graph_first(const slapo_graph *g); /* NULL if empty */
slapo_node *slapo_graph_last(const slapo_graph *g);
int slapo_graph_count(const slapo_graph *g);
/* The output node, or NULL. */
slapo_node *slapo_graph_output(const slapo_graph *g);
/* Live node with the given unique name, or NULL (also for erased names). */
slapo_node *slapo_graph_find(const slapo_graph *g, const char *name);
/* Sets node->id to each node's position. */
void slapo_graph_renumber(slapo_graph *g);

/* Where new nodes go: at the end (default; that is just before the output
 * node once there is one, so the output stays last), or just before / after
 * `n`. The insertion point persists until changed; inserting "after n"
 * advances so that consecutive inserts keep their order. insert_before(g,
 * NULL) inserts before the current first node (at the beginning; at the end
 * when the graph is empty); insert_after(g, NULL) is insert_at_end. An
 * insertion point whose node is erased moves to the erased node's
 * neighbour. A node outside g is reported by the next constructor
 * (SLAPO_INVALID_ARG); inserting after the output node is SLAPO_STATE. */
void slapo_graph_insert_at_end(slapo_graph *g);
void slapo_graph_insert_before(slapo_graph *g, slapo_node *n);
void slapo_graph_insert_after(slapo_graph *g, slapo_node *n);

/* Node constructors. Each inserts at the insertion point (the output node
 * always goes last), gives the node a unique name derived from its target
 * (a placeholder's name, a path with '.' replaced by '_', the op name;
 * "getitem", "output"; characters outside [A-Za-z0-9_] become '_', a leading
 * digit gets a '_' prefix) by appending _1, _2 … when taken (names of erased
 * nodes are never reused), registers the node as a user of each input, and
 * copies the strings and attributes it is given into the graph arena.
 * Metadata is copied where given; otherwise dtype F32, ndim 0, origin "",
 * op_seq 0, n_results 0. *out borrowed (lives with the graph); `out` may be
 * NULL. On any error the graph is unchanged.
 * Errors: SLAPO_INVALID_ARG (NULL graph/name/path/op name, NULL input, input
 * of another graph or erased, the output node as an input, n_inputs < 0,
 * n_attrs < 0, a malformed or duplicate attribute, ndim out of range or a
 * negative dim, negative item, getitem of a node that is not a tuple or with
 * item >= its n_results, a second output node, an insertion point outside
 * g), SLAPO_STATE (insertion point after the output node), SLAPO_NOMEM. */
slapo_status slapo_graph_add_placeholder(slapo_graph *g, const char *name, slapo_dtype dt,
                                         int ndim, const int64_t *shape, slapo_node **out);
slapo_status slapo_graph_add_param(slapo_graph *g, const char *path, slapo_dtype dt, int ndim,
                                   const int64_t *shape, slapo_node **out);
slapo_status slapo_graph_add_call_op(slapo_graph *g, const char *op_name,
                                     const struct slapo_op *op, int n_inputs,
                                     slapo_node *const *inputs, int n_attrs,
                                     const slapo_attr *attrs, slapo_node **out);
slapo_status slapo_graph_add_call_module(slapo_graph *g, const char *path, int n_inputs,
                                         slapo_node *const *inputs, slapo_node **out);
slapo_status slapo_graph_add_getitem(slapo_graph *g, slapo_node *src, int item,
                                     slapo_node **out);
slapo_status slapo_graph_add_output(slapo_graph *g, int n_inputs, slapo_node *const *inputs,
                                    slapo_node **out);
/* A tuple of n_inputs >= 1 values (n_results = n_inputs); its meta is that
 * of inputs[0]. Errors: as above, SLAPO_INVALID_ARG (n_inputs < 1, a tuple
 * among the inputs: tuples do not nest). */
slapo_status slapo_graph_add_tuple(slapo_graph *g, int n_inputs, slapo_node *const *inputs,
                                   slapo_node **out);

/* Sets value metadata (dtype, shape [ndim] copied).
 * Errors: SLAPO_INVALID_ARG (NULL node, erased node, unknown dtype, ndim out
 * of [0, SLAPO_MAX_DIMS], NULL shape with ndim > 0, a negative dim). */
slapo_status slapo_node_set_meta(slapo_node *n, slapo_dtype dt, int ndim,
                                 const int64_t *shape);
/* Sets the origin module path (copied; "" = root) and op index within that
 * module. Errors: SLAPO_INVALID_ARG (NULL node or path, erased node),
 * SLAPO_NOMEM (node unchanged). */
slapo_status slapo_node_set_origin(slapo_node *n, const char *path, int op_seq);
/* Marks a call_op or call_module node as multi-result: its value is a tuple
 * of `n_results` values read through getitem nodes (0: one tensor). On an
 * output node n_results = n_inputs says the graph returns its values as
 * one tuple (a traced module whose forward returned slapo_tuple, a 1-tuple
 * included); 0 (the default) returns them as they are.
 * Errors: SLAPO_INVALID_ARG (NULL/erased node, other kinds, n_results < 0,
 * an output's n_results neither 0 nor its n_inputs),
 * SLAPO_STATE (a getitem user reads an item >= n_results; node unchanged). */
slapo_status slapo_node_set_n_results(slapo_node *n, int n_results);

/* True when n is a call_op node of the op descriptor `op` (compared by
 * identity; passes name ops by descriptor, never by string). */
bool slapo_node_is_op(const slapo_node *n, const struct slapo_op *op);

/* Attribute lookup: the attribute named `key`, or NULL. Typed getters return
 * `dflt` when absent or of another kind. */
const slapo_attr *slapo_node_attr(const slapo_node *n, const char *key);
int64_t slapo_node_attr_int(const slapo_node *n, const char *key, int64_t dflt);
double slapo_node_attr_float(const slapo_node *n, const char *key, double dflt);
const char *slapo_node_attr_str(const slapo_node *n, const char *key, const char *dflt);

/* Edits. Each keeps user lists consistent and, on error, changes nothing.
 * None of them checks the topological order of the result except
 * replace_all_uses; slapo_graph_lint does.
 * set_input: replaces input i of n by `v`. Errors: SLAPO_INVALID_ARG (NULL,
 *   erased or foreign nodes, i out of range, v the output node, v not a
 *   tuple with more than n->item results when n is a getitem), SLAPO_NOMEM.
 * replace_all_uses: every use of `old` becomes a use of `repl` (old keeps
 *   no users; repl == old is a no-op). `repl` must come before every user
 *   of `old` in order, and have more results than every getitem user of
 *   `old` reads, else SLAPO_STATE (nothing changed).
 *   Errors: SLAPO_INVALID_ARG (NULL, erased, other graph, repl the output
 *   node), SLAPO_STATE, SLAPO_NOMEM.
 * erase: removes n (its memory stays in the arena until the graph is freed;
 *   n->graph becomes NULL). Errors: SLAPO_INVALID_ARG (n NULL or not in g),
 *   SLAPO_STATE when n still has users (message names n and its first user).
 * move_before: moves n just before `pos` (lint checks the order after).
 *   Errors: SLAPO_INVALID_ARG (NULL, not in g, n the output node). */
slapo_status slapo_node_set_input(slapo_node *n, int i, slapo_node *v);
slapo_status slapo_node_replace_all_uses(slapo_node *old, slapo_node *repl);
slapo_status slapo_graph_erase(slapo_graph *g, slapo_node *n);
slapo_status slapo_graph_move_before(slapo_graph *g, slapo_node *n, slapo_node *pos);

/* Removes nodes without users that are not the output and not placeholders
 * (and not call_op nodes whose op has side effects: none yet), walking
 * backwards so that chains of dead nodes go in one call; unused params go
 * too. Never allocates. Returns the number of nodes removed (0 for NULL). */
int slapo_graph_dce(slapo_graph *g);

/* Checks invariants: list links and node count; unique names; every input is
 * in the graph and comes before its user; user lists match inputs exactly
 * (with multiplicity); at most one output node, which is last and has no
 * users; placeholders and params have no inputs; getitem has one input, a
 * node with n_results > item; a tuple has n_results = n_inputs >= 1 and no
 * tuple input; call_op has an op name; ndim in range. Never
 * allocates. Errors: SLAPO_INVALID_ARG (g NULL), SLAPO_STATE with a message
 * naming the first broken node and rule. */
slapo_status slapo_graph_lint(const slapo_graph *g);

/* One node a line, e.g.
 *   %x : f32[2, 3] = placeholder[x]
 *   %linear : f32[2, 4] = call_op linear(%x, %w, %b) {axis=-1}  # h.0.mlp
 *   output(%linear)
 * (exact format documented atop src/ir/print.c). NULL g or f prints nothing. */
void slapo_graph_print(const slapo_graph *g, FILE *f);
/* Graphviz DOT: one box per node labelled name/target/shape, edges input->user. */
void slapo_graph_print_dot(const slapo_graph *g, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_IR_H */
