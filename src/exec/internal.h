/* exec/internal.h - the plan structure shared by the files of the exec
 * layer: plan.c (liveness and offsets), run.c (binding and execution),
 * debugmem.c (per-buffer allocations poisoned with NaN), timing.c and
 * eager.c. Layer: exec (internal; other layers use slapo/exec.h). */
#ifndef SLAPO_EXEC_INTERNAL_H
#define SLAPO_EXEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slapo/exec.h"

/* Every planned buffer starts on, and is sized to, a multiple of this, so
 * kernels see AVX-512-aligned data wherever the buffer lands in the arena. */
#define SLAPO__EXEC_ALIGN ((size_t)64)

/* How the executor produces a node's value. */
typedef enum exec_kind {
  EXEC_BOUND,  /* placeholder / param: the tensor given to bind (may be strided) */
  EXEC_KERNEL, /* call_op with a kernel: writes its own planned buffer          */
  EXEC_VIEW,   /* call_op with op->view: a header over input 0's storage        */
  EXEC_OUTPUT  /* the output node: nothing to do                               */
} exec_kind;

/* One planned activation buffer (one *storage*: a kernel node's output and
 * every view of it). Lives from the node that writes it (`def`) until after
 * the last node that reads it or any view of it (`last`); `last` ==
 * n_nodes means "until the next run" (an output value). */
typedef struct exec_buf {
  size_t nbytes;          /* rounded up to SLAPO__EXEC_ALIGN */
  size_t offset;          /* into the activation arena (unused in debug mode) */
  int def, last;          /* def -1: merged into an in-place op's input's */
  int writer;             /* the last kernel node writing it (in place)  */
  int redirect;           /* accumulated output a SLAPO_ACC_WRITE run
                             writes it into (its accumulator), or -1 */
  slapo_dtype dtype;      /* picks the poison pattern in debug mode */
  slapo_storage storage;  /* external: points into the arena or, in debug
                             mode, at this run's own allocation */
} exec_buf;

typedef struct exec_node {
  const slapo_node *node;
  exec_kind kind;
  slapo_kernel_fn kernel;      /* EXEC_KERNEL: fast or ref, fixed at plan time */
  int buf;                     /* EXEC_KERNEL: own buffer; EXEC_VIEW: the buffer
                                  it aliases, -1 when it views a bound tensor */
  int n_in;
  int *in;                     /* input node indices [n_in] */
  bool *maybe_strided;         /* [n_in]: op wants contiguous inputs and this
                                  input is bound or a view (checked per run) */
  bool any_maybe_strided;
  bool logged_copy;            /* the strided-input copy was logged once */
  int group;                   /* origin group (timing) */
  slapo_tensor t;              /* header of the node's value (KERNEL, VIEW) */
  const slapo_tensor *val;     /* the value: &t, or the bound tensor */
  int n_release;
  int *release;                /* buffers whose last reader is this node */
  int n_acc;
  int *acc;                    /* accumulated output values this node
                                  computes (indices into the output node's
                                  inputs), added right after it runs */
} exec_node;

struct slapo_plan {
  const slapo_graph *g;
  slapo_plan_opts opts;        /* effective (SLAPO_DEBUG_MEM folded in) */
  slapo_arena *mem;            /* every plan-time array below */

  int n_nodes;
  exec_node *nodes;            /* graph order */
  int n_bufs;
  exec_buf *bufs;
  int out_idx;                 /* index of the output node */

  /* Node pointer -> index, sorted by pointer (bsearch). */
  const slapo_node **by_ptr;
  int *by_ptr_idx;

  void *arena;                 /* activations, peak_nbytes (not debug mode) */
  void *placed;                /* the arena buffers are placed in now: the
                                  plan's own, or a slapo_plan_arena's */
  size_t peak_nbytes;
  size_t measured_peak_nbytes; /* live bytes high-water of the last run */
  bool ran;                    /* a run completed (outputs valid) */

  /* Per-node scratch, sized for the widest node: input pointers handed to
   * kernels, and headers for inputs copied to contiguous scratch. */
  int max_in;
  const slapo_tensor **ins;
  slapo_tensor *copies;
  slapo_storage *copy_storage;
  void *scratch;               /* grown on demand, reused across runs */
  size_t scratch_nbytes;

  /* Accumulated outputs (opts.accumulate_from > 0): the bound tensor per
   * output value index [n_outputs], NULL where none is bound or the value
   * is kept until the next run. */
  int n_outputs;
  slapo_tensor **accumulator;
  double *sumsq;               /* [n_outputs]: SLAPO_ACC_MEASURE's sums */
  bool measured;               /* the last run had SLAPO_ACC_MEASURE */

  /* Timing (opts.timing): ms per node of the last run (without putting
   * accumulated values into accumulators: acc_ms); origin groups. */
  double *ms;
  double acc_ms;
  int n_groups;
  const char **group_name;     /* borrowed from the graph's nodes */
};

/* Index of `n` in p->nodes, or -1 when it is not part of the plan. */
int slapo__plan_index(const slapo_plan *p, const slapo_node *n);

/* Debug allocation mode (debugmem.c). */
/* Releases every per-buffer allocation of the previous run. */
void slapo__debugmem_release_all(slapo_plan *p);
/* Gives buffer b its own allocation, filled with the poison pattern so that
 * elements a kernel forgets to write read as NaN. Errors: SLAPO_NOMEM. */
slapo_status slapo__debugmem_acquire(slapo_plan *p, exec_buf *b, const slapo_node *writer);
/* Fills buffer b with the poison pattern (its lifetime has ended). */
void slapo__debugmem_poison(exec_buf *b);

#endif
