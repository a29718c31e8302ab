/* module/internal.h - state shared by the module layer's files while a step
 * graph is built. Layer: module (internal). */
#ifndef SLAPO_MODULE_INTERNAL_H
#define SLAPO_MODULE_INTERNAL_H

#include "core/assert.h"
#include "slapo/module.h"

/* While a decoding step is built (decode.c): the cache it reads and the
 * present keys and values the attention modules record. */
typedef struct slapo__decode_state {
  slapo_kv_cache *cache;
  int n, cap;
  char **paths;        /* attention module path of each record (owned)   */
  slapo_node **k, **v; /* present keys / values [B, NH, P + T, HS]       */
} slapo__decode_state;

/* While a module's forward is traced (trace.c). */
typedef struct slapo__tracing {
  slapo_module *m;               /* the module traced                       */
  const char *path;              /* its full path                           */
  const slapo_trace_opts *opts;
  int leaf_depth;                /* > 0 while a leaf runs for its meta      */
  char **inlined;                /* relative paths inlined (owned)          */
  int n_inlined;
  bool decode_sensitive;         /* the forward asked slapo_decode_past     */
  uint64_t leaves_used;          /* bit k: entry k of opts->leaves matched  */
} slapo__tracing;

/* While the root is built on example inputs to capture one module's trace. */
typedef struct slapo__capture {
  slapo_module *m;
  const slapo_trace_opts *opts;
  bool done;
  slapo_status status;
  char message[1024];            /* the trace's error message               */
  slapo_graph *g;                /* the captured graph (owned by the caller) */
  slapo__tracing tracing;        /* its inlined list etc.                    */
  struct trace_sig_pub { int n_in; int call; slapo_dtype dt[8]; int ndim[8];
                         int64_t shape[8][SLAPO_MAX_DIMS]; } sig_in;
} slapo__capture;

/* Attached to the ctx (slapo_ctx_set_user) while a step is built. */
typedef struct slapo__build_state {
  slapo_map *param_nodes; /* canonical path -> param node */
  slapo_map *param_objs;  /* canonical path -> slapo_parameter */
  slapo__decode_state *decode; /* NULL unless a decoding step is built */
  slapo__tracing *trace;  /* non-NULL while a module is traced */
  slapo__capture *capture; /* non-NULL while a trace is captured */
} slapo__build_state;

/* shard.c: frees p's shard record; checks before a step is built that every
 * use of a sharded parameter declared the shard (SLAPO_PRECOND naming the
 * use that did not and the module that sharded it). */
void slapo__param_free_shard(slapo_parameter *p);
slapo_status slapo__check_shards(slapo_module *root);
/* Applies m's syncs at `where` to x (call.c). */
slapo_node *slapo__apply_syncs(slapo_ctx *ctx, const slapo_module *m, slapo_sync_where where,
                               slapo_node *x);

/* Runs m's forward, or emits its traced graph, or captures it (call.c). */
slapo_node *slapo__forward(slapo_ctx *ctx, slapo_module *m, int n_in, slapo_node *const *in);
/* After a forward that built tuples (call.c): removes the nodes none of
 * keep [n_keep] (the values the graph will output) depends on: the tuples,
 * which getitem leaves without users and the planner refuses, and the
 * values of returned tuples nobody took, with their inputs, so a step
 * neither computes nor differentiates them; forgets from bs the parameters
 * only those read (their gradients are then zero, as for any parameter the
 * forward does not use). A graph without tuples is left exactly as built.
 * Call before the graph has an output node. Errors: NOMEM. */
slapo_status slapo__prune_tuples(slapo_graph *g, int n_keep, slapo_node *const *keep,
                                 slapo__build_state *bs);
/* The one param node of p (materialized, with its path) in ctx's graph,
 * made on first use and recorded in the build state (call.c). */
slapo_node *slapo__param_node(slapo_ctx *ctx, slapo_parameter *p);
/* The root's forward over placeholders in0, in1, .. shaped like `in`
 * (ins [n_in] receives them) into ctx's graph, with bs attached as the
 * ctx's user; *y the value it returns, tuples pruned (step.c). Errors:
 * the ctx's, SLAPO_STATE (no value), SLAPO_INVALID_ARG (a tuple). */
slapo_status slapo__step_forward(slapo_module *root, slapo_ctx *ctx, slapo__build_state *bs,
                                 int n_in, const slapo_tensor *const *in, slapo_node **ins,
                                 slapo_node **y);
/* The step's forward of root for inputs shaped like in [n_in] into fg
 * (pipeline.c), as slapo_step builds it: fbs's maps are created here
 * (the caller frees them, also on error); ins [SLAPO_STEP_MAX_INPUTS]
 * receives the placeholders, *y the loss. Errors: SLAPO_INVALID_ARG (a
 * loss that is not a scalar), those of building the step, NOMEM. */
slapo_status slapo__pp_forward(slapo_module *root, int n_in, const slapo_tensor *const *in,
                               slapo_graph *fg, slapo__build_state *fbs, slapo_node **ins,
                               slapo_node **y);
/* Materializes p (if meta) as slapo_module_materialize would, its values a
 * function of seed, path and index (module.c). Errors: NOMEM. */
slapo_status slapo__param_materialize(slapo_parameter *p, const char *path, uint64_t seed);
/* Runs the step's rewrite rules on g to a fixpoint (step.c). */
slapo_status slapo__step_rules(slapo_graph *g, bool training);
/* slapo_call without the tracer's interception (call.c). */
slapo_node *slapo__call_module(slapo_ctx *ctx, slapo_module *self, const char *name, int n_in,
                               slapo_node *const *in);
/* trace.c: a child call while tracing (leaf -> call_module node, else
 * inlined); emission of a traced module; capture; freeing. */
slapo_node *slapo__trace_call(slapo_ctx *ctx, slapo__tracing *t, slapo_module *self,
                              const char *name, slapo_module *child, const char *path,
                              int n_in, slapo_node *const *in);
slapo_node *slapo__trace_emit(slapo_ctx *ctx, slapo_module *m, int n_in, slapo_node *const *in);
slapo_node *slapo__trace_capture(slapo_ctx *ctx, slapo__capture *c, slapo_module *m, int n_in,
                                 slapo_node *const *in);
void slapo__trace_free(slapo_trace_state *t);

/* The runner's root module; and the last decoding step's graph and plan,
 * kept (owned by the runner) so its logits stay valid until the next one:
 * the previous pair is freed. */
slapo_module *slapo__runner_root(const slapo_runner *r);
void slapo__runner_keep_decode(slapo_runner *r, slapo_graph *g, slapo_plan *p);

/* The range an integer step input must lie in (module/index_check.c):
 * [0, hi), or `ignore` when has_ignore; unchecked (the
 * input reaches no embedding ids or cross-entropy targets: node ""). */
typedef struct slapo__index_bound {
  int64_t hi, ignore;
  bool has_ignore;
  char node[64]; /* the narrowest reader's name (a copy: passes may rename) */
} slapo__index_bound;
/* Fills out[i] for each of a step graph's inputs ins[i] (after the forward
 * is built; vocab-parallel embeddings are bound by their full table). */
void slapo__index_bounds(slapo_module *root, int n_in, slapo_node *const *ins,
                         slapo__index_bound *out);
/* SLAPO_INVALID_ARG naming input i, the value, its element and the reader
 * when t holds a value outside b; NOMEM. */
slapo_status slapo__index_check(const slapo__index_bound *b, int i, const slapo_tensor *t);

#endif
