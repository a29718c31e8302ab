/* compiler/cc_gen.h - what the cc backend's two source generators share:
 * the elementwise one (cc_gen.c: one loop over the output) and the row one
 * (cc_rows.c: a region holding a LayerNorm, in row phases). A generator
 * state, the growing source text, and the emitters of one phase's
 * per-element statements, which the row generator calls per phase with a
 * node mask, loads and seeds of its own. Layer: compiler (internal). */
#ifndef SLAPO_COMPILER_CC_GEN_H
#define SLAPO_COMPILER_CC_GEN_H

#include "compiler/internal.h"

typedef struct slapo__cc_sbuf {
  char *s;
  size_t n, cap;
  bool oom;
} slapo__cc_sbuf;

/* Appends printf-style text; on allocation failure sets b->oom and keeps
 * what it had. */
void slapo__cc_put(slapo__cc_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct slapo__cc_gen {
  const slapo_graph *g;
  slapo__cc_plan *plan;
  int n;                /* nodes */
  bool *need;           /* node id -> the backward needs its value */
  int *rand_of;         /* node id -> random slot, or -1 */
  int *ph_of;           /* node id -> input index, or -1 */
  const slapo_node *out; /* the result (elementwise) or the norm's input (rows) */
  bool fast;            /* the ops' float forms, else their reference forms */
  slapo__cc_sbuf b;
  /* Set by the row generator around each phase (NULL: every node; no
   * override; dy at the result): */
  const bool *mask;        /* node id -> emitted in this phase */
  const char *const *as;   /* node id -> an expression its value is read as */
  const char *const *seed; /* node id -> its adjoint's seed ("0.0f" when NULL) */
  const slapo_node *row;   /* a row region's norm (cc_rows.c), or NULL */
} slapo__cc_gen;

/* Element count of a shape. */
int64_t slapo__cc_numel(int ndim, const int64_t *shape);

/* Forms of ops: the C expression of node n's value (which = -1) or of its
 * gradient w.r.t. input `which`. Errors: SLAPO_UNSUPPORTED naming the op. */
slapo_status slapo__cc_expr_of(slapo__cc_gen *G, const slapo_node *n, int which, char *buf,
                               size_t cap);

/* The per-element statements, into G->b, of the masked nodes: their
 * forward values (the backward: those it needs), then (adjoints) reverse
 * mode through them, adjoint ga<id> seeded by G->seed. */
slapo_status slapo__cc_emit_values(slapo__cc_gen *G, const char *indent, bool bwd);
slapo_status slapo__cc_emit_adjoints(slapo__cc_gen *G, const char *indent);
/* Before a block's column loop: the masked random nodes' uniforms for the
 * elements r * C + c0 .. r * C + c1 - 1. */
void slapo__cc_emit_uniforms(slapo__cc_gen *G, const char *indent);

/* The backward's reductions (cc_gen.c says how): each row block's ROW
 * partials acc<k> and SCALAR sums s<k>, declared and zeroed; the masked
 * placeholders' gradients of one element (FULL written at pk + off[k],
 * ROW and SCALAR added to the partials); after the block loop, closing
 * it, the partials summed in block order into pk. */
void slapo__cc_emit_partials(slapo__cc_gen *G, const char *indent);
void slapo__cc_emit_grads(slapo__cc_gen *G, const char *indent);
void slapo__cc_emit_sums(slapo__cc_gen *G);

/* The row generator (cc_rows.c). Whether op is a row op it generates. */
bool slapo__cc_row_op(const slapo_op *op);
/* Checks the region around its row op G->row... fills G->plan's row
 * fields and the phases; then emits both kernels. Errors:
 * SLAPO_UNSUPPORTED naming what cc cannot generate. */
slapo_status slapo__cc_rows_emit(slapo__cc_gen *G);
/* LayerNorm's row routines as text (slapo/ops/rowmath.h). */
const char *slapo__cc_rows_src(void);

#endif
