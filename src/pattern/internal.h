/* pattern/internal.h - the pattern struct shared by the pattern layer's
 * files (pattern.c: construction, registry; parse.c: text patterns;
 * print.c: text printer; match.c: the matcher). Layer: pattern (internal). */
#ifndef SLAPO_PATTERN_INTERNAL_H
#define SLAPO_PATTERN_INTERNAL_H

#include <regex.h>

#include "core/assert.h"
#include "slapo/pattern.h"

/* Target of a literal node: call_op with op NULL and FLOAT attr "value". */
#define SLAPO__PATTERN_LITERAL "literal"

struct slapo_pattern {
  char *name;            /* owned: fn name or the source text            */
  slapo_graph *g;        /* owned: constraint graph (see slapo/pattern.h) */
  int n_inputs;
  slapo_node **inputs;   /* owned array: placeholders, declaration order */
  int n_outputs;
  slapo_node **outputs;  /* owned array: results, in order               */
  int n_any;
  slapo_node **any;      /* owned array: uncalled module-pattern nodes   */
  bool text;             /* parsed from text (name = the source)        */
};

/* Makes an empty pattern named `name` (copied) with a new graph.
 * Errors: SLAPO_NOMEM. */
slapo_status slapo__pattern_new(const char *name, slapo_pattern **out);
/* Records the results: adds the graph's output node over outs[0..n) and
 * fills p->outputs; removes nodes no result depends on (dead pattern code);
 * fills p->inputs from the placeholders in graph order; renumbers.
 * Errors: SLAPO_INVALID_ARG (n < 1, a placeholder no result uses: message
 * names it), SLAPO_NOMEM. */
slapo_status slapo__pattern_finish(slapo_pattern *p, int n, slapo_node *const *outs);
/* Marks a call_module node as the uncalled module form. Errors: NOMEM. */
slapo_status slapo__pattern_mark_any(slapo_pattern *p, slapo_node *n);
/* A literal node for value v. Errors: NOMEM. */
slapo_status slapo__pattern_literal(slapo_pattern *p, double v, slapo_node **out);
/* True for a literal node; *v receives its value. */
bool slapo__pattern_is_literal(const slapo_node *n, double *v);

/* regex.c: why glibc's regcomp would take too long or too much memory on
 * re (a static string), or NULL. */
const char *slapo__regex_hazard(const char *re);
/* Compiles re (REG_EXTENDED) into *out after the hazard scan; on error
 * SLAPO_PARSE "WHAT 'RE': reason" and *out is not to be freed. */
slapo_status slapo__regex_compile(const char *re, regex_t *out, const char *what);

#endif
