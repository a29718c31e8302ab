/* primitives/internal.h - helpers shared by the primitive files: logging an
 * applied primitive and formatting errors with the node's path.
 * Layer: primitives (internal). */
#ifndef SLAPO_PRIMITIVES_INTERNAL_H
#define SLAPO_PRIMITIVES_INTERNAL_H

#include "core/assert.h"
#include "slapo/primitives.h"

#define SLAPO_PRIMITIVE_DESCRIPTOR(name) const slapo_primitive slapo__prim_##name

/* The node's path for messages and logs: "." for the root. */
const char *slapo__prim_path(const slapo_sched *node);

/* Parameter `name` of node's module into *out, or SLAPO_NOT_FOUND naming
 * the primitive and path and listing the module's parameters. */
slapo_status slapo__prim_param(slapo_sched *node, const char *primitive, const char *name,
                               slapo_parameter **out);

/* Appends "path primitive args..." to the log of node's tree, with the
 * source of `from` (file, line) when given. Errors: NOMEM. */
slapo_status slapo__prim_log(slapo_sched *node, const char *primitive, int n_args,
                             const slapo_sched_arg *args, const slapo_sched_entry *from,
                             bool replayable);

/* Checks that the line slapo__prim_log would append for node is one the log
 * accepts (it prints as a .sched line that reads back the same), without
 * appending it, so a primitive can refuse before it mutates.
 * Errors: those of slapo_sched_log_append (SLAPO_INVALID_ARG, NOMEM). */
slapo_status slapo__prim_log_check(slapo_sched *node, const char *primitive, int n_args,
                                   const slapo_sched_arg *args);

/* SLAPO_STATE when node's module is inlined into an ancestor's flattened
 * trace (its own schedule state would no longer act), naming both; else
 * SLAPO_OK. */
slapo_status slapo__prim_not_inlined(slapo_sched *node, const char *primitive);
/* The same, and also SLAPO_STATE when node is a module call (a leaf) in the
 * flattened trace of an ancestor: for primitives that change what the
 * module is (replace, replace_all, decompose). */
slapo_status slapo__prim_not_in_trace(slapo_sched *node, const char *primitive);
/* As slapo__prim_not_inlined, for primitives that edit a traced module's
 * graph (fuse, fuse_all, pattern forms): the message points at the traced
 * ancestor, whose graph holds node's ops. */
slapo_status slapo__prim_graph_not_inlined(slapo_sched *node, const char *primitive);
/* SLAPO_NOT_FOUND for a module name with no factory: the registered names,
 * or, for a subgraph module's name, how that one is used (pattern=). */
slapo_status slapo__prim_unregistered(const char *primitive, const char *path,
                                      const char *name);

/* subgraph.c: the subgraph forms with the source line; the pattern= value
 * of an entry (*p NULL when absent; *owned: free it). */
slapo_status slapo__replace_subgraph(slapo_sched *node, const slapo_pattern *p, const char *name,
                                     bool horizontal, const slapo_sched_entry *from);
slapo_status slapo__checkpoint_subgraph(slapo_sched *node, const slapo_pattern *p,
                                        const slapo_sched_entry *from);
slapo_status slapo__prim_pattern(const slapo_sched_entry *e, const char *primitive,
                                 const slapo_pattern **p, bool *owned);

/* The general subgraph replacement (subgraph.c), for replace and fuse: the
 * factory builds each new child from its match(es), with a context. */
typedef struct slapo__sub_factory {
  slapo_status (*fn)(void *ud, slapo_module *owner, int n_matches, const slapo_match *matches,
                     slapo_module **out);
  void *ud;
} slapo__sub_factory;

typedef struct slapo__subgraph_spec {
  const char *primitive;      /* for messages and the log line          */
  const char *child;          /* new children are "<child>_<k>"         */
  slapo__sub_factory factory;
  bool horizontal;            /* one child for all matches              */
  bool escaping_results;      /* inner values used outside are results  */
  bool exactly_one;           /* anything but one match is an error     */
  bool skip_unsupported;      /* a match the factory cannot do is left  */
  bool (*region_ends)(const slapo_op *op); /* fuse_all: a region may end  */
                              /*   in such an op (the backend's)         */
  const slapo_sched_arg *args; /* the log line's arguments               */
  int n_args;
  bool replayable;
  const slapo_sched_entry *from;
} slapo__subgraph_spec;

/* p NULL: the maximal elementwise regions (fuse_all). */
slapo_status slapo__subgraph_apply(slapo_sched *node, const slapo_pattern *p,
                                   const slapo__subgraph_spec *spec);
/* fuse.c: the factory that makes a Fused module from a match, for fuse and
 * fuse_all; ud is a slapo__fuse_req. */
typedef struct slapo__fuse_req {
  const slapo_compiler *compiler; /* NULL: auto */
  const char *name;
  const slapo_compile_opts *opts;
} slapo__fuse_req;
slapo_status slapo__fuse_factory(void *ud, slapo_module *owner, int n, const slapo_match *ms,
                                 slapo_module **out);
/* The backend `name` (NULL for "auto": fuse.c picks per region), or
 * SLAPO_INVALID_ARG listing the known ones. */
slapo_status slapo__compiler_named(slapo_sched *node, const char *primitive, const char *name,
                                   const slapo_compiler **out);
/* The pattern as a .sched argument pattern=...: a registered name (word),
 * text (string), else a word and *replayable false. */
slapo_sched_arg slapo__pattern_arg(const slapo_pattern *p, bool *replayable);

/* Swaps node's module for `mod` (consumed) in the parent's child table and
 * rebuilds node's schedule subtree; on error nothing changes. replace.c. */
slapo_status slapo__prim_swap(slapo_sched *node, slapo_module *mod);

#endif
