/* slapo/pattern.h - pattern graphs for `find` (DESIGN.md §5): built from
 * pattern functions (traced without shapes, with the ordinary op API) or
 * parsed from text, a registry of named patterns, and the dataflow subgraph
 * matcher that searches a traced module's graph.
 * Layer: pattern (depends on module). */
#ifndef SLAPO_PATTERN_H
#define SLAPO_PATTERN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "slapo/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Pattern graphs                                                            */
/* ------------------------------------------------------------------------ */

/* A pattern: a slapo_graph whose nodes are constraints.
 *   placeholder       a wildcard input; matches any value (a node, or a
 *                     parameter of a leaf module); used twice, it binds one
 *                     value. Inputs are numbered in declaration order.
 *   call_op OP        a node of that op descriptor, or a call_module of a
 *                     module whose type declares OP as its op form
 *                     (relu ~ ReLU); the attributes present must be equal
 *                     (ints and floats compare by value), absent ones match
 *                     anything, "stream" is never compared.
 *   call_op "literal" (op NULL, FLOAT attribute "value") a number: matches a
 *                     scalar-op constant (add_scalar's value) or a `full`
 *                     node of that value.
 *   call_module RE    a module pattern: a call_module whose target (path
 *                     relative to the traced module) or last segment the
 *                     POSIX extended regex RE matches in full; its inputs
 *                     are matched in order, or not at all for the uncalled
 *                     form (slapo_pattern_any_inputs).
 *   output            the pattern's results (one, or several for `(p, q)`).
 * Opaque; owned by whoever created it (slapo_pattern_free) or by the
 * registry. */
typedef struct slapo_pattern slapo_pattern;

/* A pattern function: builds the pattern on `in` (n_inputs placeholders
 * without shapes) with op calls (slapo_gelu, slapo_linear, ...) and module
 * patterns (slapo_pattern_module) and returns its result, or an output node
 * (slapo_output) or a tuple (slapo_tuple) for several results. Shape inference does not run while
 * it is traced, so builders that derive attributes from input shapes
 * (transpose, split, sum_to) cannot be used; call the op they emit. */
typedef slapo_node *(*slapo_pattern_fn)(slapo_ctx *ctx, slapo_node *const *in, void *ud);

/* Traces fn into a pattern named `name` (copied; used in messages and
 * printing) with n_inputs placeholders named input_names[i] (NULL: "x0",
 * "x1", ...). Random ops' "stream" attributes are dropped (never compared).
 * *out owned (slapo_pattern_free).
 * Errors: SLAPO_INVALID_ARG (NULL fn, n_inputs outside [0, 16], fn returned
 * NULL, a placeholder the result does not use), errors recorded while
 * tracing (unknown op ...), SLAPO_NOMEM. */
slapo_status slapo_pattern_from_fn(const char *name, int n_inputs, const char *const *input_names,
                                   slapo_pattern_fn fn, void *ud, slapo_pattern **out);

/* In a pattern function: "a call of any child whose path matches `regex`"
 * (POSIX extended, matched in full against the call_module target or its
 * last segment) on in[0..n_in); n_in < 0 is the uncalled form, matching a
 * call with any inputs. NULL on error (recorded on ctx: a malformed regex,
 * with regerror's text). */
slapo_node *slapo_pattern_module(slapo_ctx *ctx, const char *regex, int n_in,
                                 slapo_node *const *in);

/* Parses a text pattern (grammar in src/pattern/parse.c and
 * docs/ARCHITECTURE.md): function-call form with op names as in ops.def
 * (`add(relu(x), x)`, `gelu(add(matmul(x, w), b))`); free names are
 * placeholders, numbered by first appearance; numbers are literals;
 * `name=value` attributes (`gelu(x, approximate=tanh)`; value a word, a
 * number, true/false, a 'string' or [1, 2]); `mod('c_.*')` a module pattern
 * and `mod('c_.*')(x)` its call; `let a = add(x, y); mul(a, a)` names a
 * shared node; `(p, q)` several results. *out owned.
 * Errors: SLAPO_PARSE "pattern 'TEXT': column C: expected E, got G" (an
 * unknown op also names the column; wrong input counts name the op and
 * both counts), SLAPO_NOMEM. */
slapo_status slapo_pattern_parse(const char *text, slapo_pattern **out);

void slapo_pattern_free(slapo_pattern *p); /* NULL is fine */

/* The name (from_fn) or the source text (parse). Borrowed. */
const char *slapo_pattern_name(const slapo_pattern *p);
/* True when p was parsed from text (its name is the source text). */
bool slapo_pattern_is_text(const slapo_pattern *p);
/* The constraint graph. Borrowed, lives with p. */
const slapo_graph *slapo_pattern_graph(const slapo_pattern *p);
/* Number of placeholders, and the i-th's name (declaration order). */
int slapo_pattern_n_inputs(const slapo_pattern *p);
const char *slapo_pattern_input_name(const slapo_pattern *p, int i);
/* Whether a call_module node of p is the uncalled module-pattern form. */
bool slapo_pattern_any_inputs(const slapo_pattern *p, const slapo_node *n);

/* Prints p in the text grammar (canonical form: `let` for every node used
 * more than once, attributes in node order), so parsing the printed text
 * gives a pattern that prints the same. */
void slapo_pattern_print(const slapo_pattern *p, FILE *f);

/* ------------------------------------------------------------------------ */
/* Registered patterns (names usable in .sched files)                        */
/* ------------------------------------------------------------------------ */

/* Registers `p` (ownership passes to the registry, also on error) under its
 * name. Registering the same name twice is SLAPO_INVALID_ARG.
 * Errors: SLAPO_INVALID_ARG, SLAPO_NOMEM. Thread-safe. */
slapo_status slapo_pattern_register(slapo_pattern *p);
/* The registered pattern `name`, or NULL. Borrowed (lives until exit). */
const slapo_pattern *slapo_pattern_lookup(const char *name);
int slapo_pattern_registered_count(void);
const slapo_pattern *slapo_pattern_registered_at(int i);

/* A pattern from a .sched value: a registered name, or a text pattern when
 * `is_text` (a double-quoted value). *out is either borrowed from the
 * registry (*owned false) or owned by the caller (*owned true).
 * Errors: SLAPO_NOT_FOUND (unknown name, listing the registered ones),
 * those of slapo_pattern_parse. */
slapo_status slapo_pattern_resolve(const char *value, bool is_text, const slapo_pattern **out,
                                   bool *owned);

/* ------------------------------------------------------------------------ */
/* Matching                                                                  */
/* ------------------------------------------------------------------------ */

/* A value a pattern input is bound to: a node of the traced graph, or a
 * parameter of a leaf module matched through its op form (node NULL,
 * `param` its path relative to the traced module, "c_fc.weight"). */
typedef struct slapo_match_value {
  slapo_node *node;    /* borrowed from the traced graph, or NULL          */
  const char *param;   /* relative parameter path when node is NULL        */
  slapo_dtype dtype;
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
} slapo_match_value;

/* One match: the graph nodes it covers (graph order), each with the module
 * path it belongs to (relative to the traced module: a call_module's target,
 * or the node's origin; "" the module itself), the values bound to the
 * pattern's inputs (pattern order; the uncalled module form appends its
 * call's inputs), and its results (pattern output order). `replaceable` is
 * false when an inner value is also used outside the match: `why` names the
 * node and the outside user. Everything is borrowed from the match list. */
typedef struct slapo_match {
  int n_nodes;
  slapo_node **nodes;
  const char **paths;
  int n_inputs;
  slapo_match_value *inputs;
  int n_outputs;
  slapo_node **outputs;
  bool replaceable;
  const char *why;
} slapo_match;

/* A caller-allocated list of matches; a zeroed struct is empty. */
typedef struct slapo_matches {
  int n;
  slapo_match *items; /* [n] */
  void *impl;         /* owned storage */
} slapo_matches;

void slapo_matches_deinit(slapo_matches *m); /* NULL is fine */

/* Every match of `p` in the traced graph of `m`, in graph order of each
 * match's first result; matches never overlap (the first wins). Matching
 * follows use-def edges from the results (see docs/ARCHITECTURE.md,
 * "Pattern matching"): interleaved unrelated nodes and any topological
 * order are fine, commutative ops (descriptor flag) are tried both ways.
 * With SLAPO_DEBUG >= 3 each rejected candidate is logged with the reason.
 * `out` is overwritten. Errors: SLAPO_PRECOND (m is not traced: "trace it
 * first"), SLAPO_NOMEM. */
slapo_status slapo_find(slapo_module *m, const slapo_pattern *p, slapo_matches *out);

/* slapo_find on graph g of module m (one of m's stored graphs, e.g. a
 * re-traced one while a graph edit is replayed; m resolves call_module
 * targets). Renumbers g. Errors: SLAPO_PARSE (bad module regex), NOMEM. */
slapo_status slapo_find_in(slapo_module *m, slapo_graph *g, const slapo_pattern *p,
                           slapo_matches *out);

/* The maximal elementwise regions of graph g of module m (pattern/
 * regions.c), one match each, in graph order of their results: connected
 * elementwise nodes (ops with the `elementwise` flag, `full` constants,
 * calls of leaves whose op form is elementwise) whose values are used only
 * inside the region but for its one result; regions of one op are left
 * out. A node whose op (or leaf's op form) `ends` accepts (NULL: none; a
 * LayerNorm for the cc backend) is a region's result with the elementwise
 * nodes that feed it alone: a region may end in it, never continue past.
 * Inputs: the outside values the region reads, in graph order.
 * Errors: SLAPO_NOMEM. */
slapo_status slapo_find_elementwise(slapo_module *m, slapo_graph *g,
                                    bool (*ends)(const slapo_op *op), slapo_matches *out);

/* A copy of p (same graph, names and flags). *out owned.
 * Errors: SLAPO_NOMEM. */
slapo_status slapo_pattern_clone(const slapo_pattern *p, slapo_pattern **out);

/* Every call_module node of m's traced graph whose target or last segment
 * the POSIX extended regex matches in full, one match each (no inputs
 * bound but the call's). Errors: SLAPO_PRECOND (not traced), SLAPO_PARSE
 * (bad regex, with regerror's text), SLAPO_NOMEM. */
slapo_status slapo_find_regex(slapo_module *m, const char *regex, slapo_matches *out);

/* Prints matches one a line group: "match 1: %gelu (act) <- %linear (c_fc)
 * ...; inputs x=%in0 f32[2, 8, 128], w=c_fc.weight f32[512, 128]". */
void slapo_matches_print(const slapo_matches *m, const slapo_pattern *p, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_PATTERN_H */
