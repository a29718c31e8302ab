/* slapo/exec.h - memory planner and executor for a graph with known shapes,
 * per-node timing, a debug allocation mode, and a one-op eager helper.
 * Layer: exec (depends on ops). */
#ifndef SLAPO_EXEC_H
#define SLAPO_EXEC_H

#include <stdbool.h>
#include <stdio.h>

#include "slapo/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct slapo_plan_opts {
  /* Give every intermediate buffer its own allocation and fill it with NaN
   * when its lifetime ends, so a use-after-free in planning shows as NaN.
   * Also switched on by the environment variable SLAPO_DEBUG_MEM=1. */
  bool debug_alloc;
  /* Run reference kernels even where a fast kernel exists (tests). */
  bool reference;
  /* Record wall time per node (slapo_plan_node_ms). */
  bool timing;
  /* > 0: output values with index >= accumulate_from are *accumulated*
   * into tensors bound with slapo_plan_bind_accumulator instead of being
   * kept until the next run (slapo_step's parameter gradients): each is
   * added into its tensor right after the node that computes it runs, while
   * it is still in cache, and its buffer is then free for later nodes, so
   * these values no longer count in the planned peak. 0: none. */
  int accumulate_from;
} slapo_plan_opts;

/* A compiled, runnable graph: buffer assignment and execution order. */
typedef struct slapo_plan slapo_plan;

/* Plans `g` (borrowed; must outlive the plan and not change). Values are
 * assigned offsets in one activation arena by liveness: a buffer is freed
 * after the last use of every view of it (views share storage); the output
 * node's values live until the next run. `opts` may be NULL.
 * Errors: SLAPO_STATE (graph fails lint, no output node, a call_module node
 * is left, an op without kernel), SLAPO_NOMEM. *out owned. */
slapo_status slapo_plan_new(const slapo_graph *g, const slapo_plan_opts *opts,
                            slapo_plan **out);
void slapo_plan_free(slapo_plan *p); /* NULL is fine */
/* The activation peak slapo_plan_new would plan for g (same opts), without
 * allocating the arena: for memory estimates before anything is allocated.
 * Errors: those of slapo_plan_new except the arena's NOMEM. */
slapo_status slapo_plan_estimate(const slapo_graph *g, const slapo_plan_opts *opts,
                                 size_t *peak_nbytes);

/* Planned peak of the activation arena in bytes (intermediates and outputs,
 * excluding bound inputs and parameters). Known before running. */
size_t slapo_plan_peak_nbytes(const slapo_plan *p);
/* Measured peak: the high-water mark of live intermediate and output bytes
 * during the last run (a buffer is live from the node that writes it until
 * its last reader, views included); 0 before the first run. At most the
 * planned peak, which also counts fragmentation of the arena. */
size_t slapo_plan_measured_peak_nbytes(const slapo_plan *p);

/* Binds a tensor to every placeholder named `name` / every param node whose
 * path is `path`. The tensor is borrowed until the plan is freed or rebound;
 * its dtype and shape must match the node's (SLAPO_SHAPE / SLAPO_DTYPE with
 * both shapes), it may be strided. Errors: SLAPO_NOT_FOUND (no such node),
 * SLAPO_INVALID_ARG (NULL or meta tensor); on error nothing is bound. */
slapo_status slapo_plan_bind_input(slapo_plan *p, const char *name, const slapo_tensor *t);
slapo_status slapo_plan_bind_param(slapo_plan *p, const char *path, const slapo_tensor *t);

/* Binds `acc` as the accumulator of output value i (i >= the plan's
 * opts.accumulate_from): every run adds value i into it (acc += value,
 * elementwise, the same single f32 addition per element as adding after
 * the run) or writes it (SLAPO_ACC_WRITE). `acc` is borrowed until the plan
 * is freed or rebound; f32, contiguous, of the value's shape, and not the
 * storage of another output's accumulator. Errors: SLAPO_INVALID_ARG (NULL,
 * i not an accumulated output, acc strided, meta, not f32, or shared with
 * output j), SLAPO_SHAPE (both shapes named). */
slapo_status slapo_plan_bind_accumulator(slapo_plan *p, int i, slapo_tensor *acc);

/* Runs every node in order. `env` may be NULL (seed 0, step 0, training).
 * Accumulated outputs are added into their accumulators (SLAPO_ACC_ADD).
 * Errors: SLAPO_STATE naming the first unbound placeholder, param or
 * accumulator, SLAPO_NOMEM. */
slapo_status slapo_plan_run(slapo_plan *p, const slapo_kernel_env *env);

/* How slapo_plan_run_acc puts accumulated outputs into their accumulators
 * (flags, or-ed). */
enum {
  SLAPO_ACC_ADD = 0,     /* acc += value                                       */
  SLAPO_ACC_WRITE = 1,   /* acc = value: a step's first micro-batch. Where the
                          * value is a kernel's whole buffer the kernel writes
                          * it straight into acc (no copy, no zeroing, acc not
                          * read); elsewhere it is copied.                     */
  SLAPO_ACC_MEASURE = 2, /* also record each accumulator's sum of squares once
                          * it is final (slapo_plan_accumulator_sumsq), while
                          * it is still in cache: a step's last micro-batch   */
};

/* slapo_plan_run with `acc_flags` (SLAPO_ACC_*). Under SLAPO_ACC_WRITE an
 * accumulator is scratch for the run's nodes until its value is final, so
 * it must not be bound as an input or param of the same plan. Errors: those
 * of slapo_plan_run, SLAPO_INVALID_ARG (unknown flags). */
slapo_status slapo_plan_run_acc(slapo_plan *p, const slapo_kernel_env *env, unsigned acc_flags);

/* Spans: a plan run in pieces, each piece's values in an arena of the
 * caller's choosing (pipeline parallelism: a stage runs micro-batch i's
 * forward, later other micro-batches' forwards in other arenas, then i's
 * backward in i's arena, which still holds the activations i's forward
 * left there). An arena is slapo_plan_peak_nbytes(p) bytes of activation
 * memory for one plan; owned by the caller (slapo_plan_arena_free), and
 * borrowed by the plan only during a run. Errors: SLAPO_NOMEM,
 * SLAPO_UNSUPPORTED (a plan in debug allocation mode, which has no arena),
 * SLAPO_INVALID_ARG (p NULL). */
typedef struct slapo_plan_arena slapo_plan_arena;
slapo_status slapo_plan_arena_new(const slapo_plan *p, slapo_plan_arena **out);
void slapo_plan_arena_free(slapo_plan_arena *a); /* NULL is fine */

/* Runs the nodes from `from` up to, not including, `stop` (graph order;
 * NULL: the first node / past the last) in arena `a` (NULL: the plan's
 * own), as slapo_plan_run_acc runs them all. The nodes read the values
 * earlier nodes left in `a` and the tensors bound now: a span that reads a
 * value computed by an earlier span must run in the same arena, with the
 * same inputs bound, and no span in that arena may have overwritten it
 * since (a buffer is reused after its last reader, so run an arena's spans
 * in graph order). After the run, slapo_plan_output reads the outputs as
 * they are in `a`. Bitwise what a whole run computes. Errors: those of
 * slapo_plan_run_acc, SLAPO_INVALID_ARG (a node not in the plan, `stop`
 * before `from`, an arena made for another plan), SLAPO_UNSUPPORTED (debug
 * allocation mode). */
slapo_status slapo_plan_run_span(slapo_plan *p, slapo_plan_arena *a, const slapo_node *from,
                                 const slapo_node *stop, const slapo_kernel_env *env,
                                 unsigned acc_flags);

/* Sum of squares (double, fixed order: ops/sum_squares.c) of accumulator i
 * after the last run, which had SLAPO_ACC_MEASURE; NAN when it did not or i
 * is not an accumulated output. */
double slapo_plan_accumulator_sumsq(const slapo_plan *p, int i);

/* Number of values of the output node, and value i after a run (NULL for
 * an accumulated value: it went into its accumulator). Borrowed: valid
 * until the next run or slapo_plan_free. */
int slapo_plan_output_count(const slapo_plan *p);
const slapo_tensor *slapo_plan_output(const slapo_plan *p, int i);

/* Timing (opts.timing): milliseconds spent in `n` during the last run; 0
 * when timing is off or n is not a node of the planned graph. */
double slapo_plan_node_ms(const slapo_plan *p, const slapo_node *n);
/* The buffers live at the plan's live-bytes peak: the first node at which
 * the running total of live bytes, counted as the executor counts it for
 * slapo_plan_measured_peak_nbytes (a buffer from the node that writes it,
 * before that node's dead inputs are released, until its last reader), is
 * largest. Calls fn once per buffer with the node that first writes it
 * (an in-place op's value lives in its input's buffer) and the buffer's
 * bytes; known before any run, as the plan decides it. */
typedef void (*slapo_plan_buffer_fn)(const slapo_node *writer, size_t nbytes, void *ud);
void slapo_plan_visit_peak(const slapo_plan *p, slapo_plan_buffer_fn fn, void *ud);

/* Timing: milliseconds the last run spent putting accumulated values into
 * their accumulators (adding, copying, measuring), which no node's
 * slapo_plan_node_ms includes; 0 when timing is off. */
double slapo_plan_accumulate_ms(const slapo_plan *p);
/* Prints total ms and share per origin module path, largest first. */
void slapo_plan_print_timing(const slapo_plan *p, FILE *f);

/* Eager helper (tests, small tools): builds a one-op graph over placeholders
 * shaped like `in`, plans and runs it, and returns an owned contiguous copy
 * of the result. `env` may be NULL (seed 0, step 0, training). Errors: those
 * of slapo_op_call (SHAPE, DTYPE, NOT_FOUND for an unknown op) and NOMEM. */
slapo_status slapo_eager(const char *op, int n_in, const slapo_tensor *const *in, int n_attrs,
                         const slapo_attr *attrs, const slapo_kernel_env *env,
                         const slapo_plan_opts *opts, slapo_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
