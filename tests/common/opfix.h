/* tests/common/opfix.h - the fixture the op tests share (tests/unit/test_ops_*
 * and tests/errors/test_ops_*_errors): a graph with its building ctx, inputs
 * and tensors to feed it, one node's reference or fast kernel run directly,
 * and the checks on the results (shape, values) and on a failed op call
 * (status, message, a clean graph). A failed check fails the running cmocka
 * test; the file:line it names is in opfix.c, so the message says which node,
 * kernel and element. */
#ifndef SLAPO_TESTS_OPFIX_H
#define SLAPO_TESTS_OPFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "slapo/ops.h"

/* A graph under construction and its ctx; both owned. */
typedef struct opfix {
  slapo_graph *g;
  slapo_ctx *ctx;
} opfix;

void opfix_init(opfix *f);
void opfix_deinit(opfix *f);
/* cmocka setup and teardown: *state is an opfix made by opfix_setup. */
int opfix_setup(void **state);
int opfix_teardown(void **state);

/* A placeholder of f's graph (f32, or dtype dt); borrowed from the graph.
 * Fails the test when the ctx refuses it. */
slapo_node *opfix_input(opfix *f, const char *name, int ndim, const int64_t *shape);
slapo_node *opfix_input_dt(opfix *f, const char *name, slapo_dtype dt, int ndim,
                           const int64_t *shape);

/* ---- tensors (owned: slapo_tensor_free) ---- */

/* f32 [shape] holding data [numel] (row-major), or zeros if data is NULL. */
slapo_tensor *opfix_tensor(int ndim, const int64_t *shape, const float *data);
/* f32 [shape] holding 0, 1, 2, ... in row-major order. */
slapo_tensor *opfix_arange(int ndim, const int64_t *shape);
/* The same in dtype dt, modulo 251 unless f32 (so each value is exact in
 * u8 and f16). */
slapo_tensor *opfix_arange_dt(slapo_dtype dt, int ndim, const int64_t *shape);
/* f32 [shape] uniform in [lo, hi) from one LCG per test program, seeded the
 * same in every program, so a test's values depend only on its own calls. */
slapo_tensor *opfix_random(int ndim, const int64_t *shape, float lo, float hi);

/* ---- running one node ---- */

/* Runs node's reference kernel (fast = false) or its fast kernel (which must
 * exist) on `in` (borrowed, may be strided where the op allows), with a zero
 * kernel env. The output has the node's dtype and shape and is poisoned
 * with 0xff bytes first (NaN in f32), so an element the kernel does not
 * write shows up. Owned result. */
slapo_tensor *opfix_run(const slapo_node *node, const slapo_tensor *const *in, bool fast);

/* Applies y's backward rule to a new placeholder "dy" shaped like y, asking
 * for the gradient of every input: dx [y->n_inputs] gets them (borrowed
 * nodes of f's graph). */
void opfix_backward(opfix *f, slapo_node *y, slapo_node **dx);

/* ---- checks ---- */

/* n's shape is [shape]. */
void opfix_assert_shape(const slapo_node *n, int ndim, const int64_t *shape);
/* t (contiguous f32) has n elements and |t[i] - want[i]| <= atol + rtol *
 * |want[i]| for each (exact where atol = rtol = 0). */
void opfix_assert_values(const slapo_tensor *t, int64_t n, const float *want, float atol,
                         float rtol);
/* Runs node's reference kernel, and its fast kernel where it has one, on
 * `in` and checks each result against want [n] as opfix_assert_values does. */
void opfix_check_kernels(const slapo_node *node, const slapo_tensor *const *in, int64_t n,
                         const float *want, float atol, float rtol);

/* A graph-building call on f returned `got` == NULL because it failed with
 * `want`: the ctx holds `want`, the ctx's message is the thread's
 * (slapo_last_error) and contains every string of subs (NULL-terminated,
 * see OPFIX_SUBS), and the graph holds just n_nodes nodes (nothing
 * half-built stayed) and lints clean. */
void opfix_expect_fail(opfix *f, const slapo_node *got, slapo_status want, int n_nodes,
                       const char *const *subs);
/* The same for a call that returns its status (slapo_split): got == want. */
void opfix_expect_fail_status(opfix *f, slapo_status got, slapo_status want, int n_nodes,
                              const char *const *subs);

#define OPFIX_SUBS(...) ((const char *const[]){__VA_ARGS__, NULL})

#endif
