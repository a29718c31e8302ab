/* ops/internal.h - helpers shared by op files: descriptor declaration,
 * shape-inference helpers (broadcasting, axes), builder shorthands and
 * gradient helpers. Layer: ops (internal; other layers use slapo/ops.h). */
#ifndef SLAPO_OPS_INTERNAL_H
#define SLAPO_OPS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/assert.h"
#include "slapo/ops.h"

/* Defines built-in op `name`'s descriptor (listed in slapo/ops.def, declared
 * in slapo/ops.h, so the definition is checked against the declaration). */
#define SLAPO_OP_DESCRIPTOR(name) const slapo_op slapo__op_##name

/* slapo_op.flops of an op contracting its first input's last axis K into
 * each output element (matmul, linear): 2 K per element (ops/cost.c). */
double slapo__flops_contract_last(const slapo_node *node);

/* Next op index for the ctx's current origin path; -1 on allocation failure. */
int slapo__ctx_next_op_seq(slapo_ctx *ctx);
int slapo__ctx_next_random(slapo_ctx *ctx);
/* The shard attributes (shard_dim, shard_start, shard_full[, shard_parts])
 * that make random op `op` on x draw the unsharded model's numbers for this
 * rank's part, from x's layout, into out [4], *n_out of them (none when x is
 * replicated). Errors: SLAPO_UNSUPPORTED naming x, its shape and producer,
 * when x is a partial sum or of unknown layout (ops/layout.c). */
slapo_status slapo__rng_shard_attrs(const slapo_node *x, const char *op, slapo_attr *out,
                                    int *n_out);

/* Shape inference helpers. Each returns SLAPO_OK or sets a message naming
 * `node->target` and the offending shapes. */
/* NumPy broadcasting of a's and b's shapes into (ndim, shape). */
slapo_status slapo__broadcast_shapes(const char *op, int na, const int64_t *a, int nb,
                                     const int64_t *b, int *ndim, int64_t *shape);
/* Requires input i of node to have dtype dt (SLAPO_DTYPE otherwise). */
slapo_status slapo__want_dtype(const slapo_node *node, int i, slapo_dtype dt);
/* Requires a GEMM's inputs 0 and 1 to be both f32 or both bf16 (SLAPO_DTYPE
 * naming both otherwise). ops/cast.c. */
slapo_status slapo__want_gemm_operands(const slapo_node *node);
/* dy as the backward GEMMs of GEMM `node` read it: cast to bf16 when the
 * node's operands are bf16, else dy itself. */
slapo_node *slapo__gemm_grad_operand(slapo_ctx *ctx, const slapo_node *node, slapo_node *dy);
/* A GEMM operand as its backward reads it: a weight's bf16 cast is made
 * again right there (a new to_bf16 of the parameter), so the forward's cast
 * dies after the forward instead of living until the backward: a model's
 * weights in bf16 never all sit in the activation arena at once, for one
 * more pass over them. Anything else unchanged. */
slapo_node *slapo__gemm_recast(slapo_ctx *ctx, slapo_node *x);
/* Under autocast (slapo_ctx_autocast): an f32 GEMM operand cast as the mode
 * says (to_bf16, or round_bf16 when emulated), reusing a cast of the same
 * value in the same checkpoint region; anything else unchanged. */
slapo_node *slapo__autocast_operand(slapo_ctx *ctx, slapo_node *x);
/* Under BF16_EMULATED: y through round_bf16_dy; otherwise y. */
slapo_node *slapo__autocast_result(slapo_ctx *ctx, slapo_node *y);
/* Requires input i to have an integer dtype (I32 or I64). */
slapo_status slapo__want_index(const slapo_node *node, int i);
/* Sets node meta to input i's dtype and shape. */
slapo_status slapo__same_as_input(slapo_node *node, int i);
/* "[2, 3]" for node n's shape (thread-local rotating buffers, 8 slots). */
const char *slapo__shape_of(const slapo_node *n);

/* Builder shorthands for slapo_op_apply; `op` is SLAPO_OP_DESC(name). */
slapo_node *slapo__call1(slapo_ctx *ctx, const slapo_op *op, slapo_node *x, int n_attrs,
                         const slapo_attr *attrs);
slapo_node *slapo__call2(slapo_ctx *ctx, const slapo_op *op, slapo_node *a, slapo_node *b,
                         int n_attrs, const slapo_attr *attrs);
/* Builds a node with the same op (like->op) and attributes as `like` on new
 * inputs (backward rules reuse forward attributes, e.g. dropout's RNG
 * stream). */
slapo_node *slapo__call_like(slapo_ctx *ctx, const slapo_node *like, int n_inputs,
                             slapo_node *const *inputs);

/* Gradient helper: reduces g (the gradient of a broadcast result) to the
 * shape of `input` (sum over broadcast axes), or returns g unchanged when
 * the shapes already agree. */
slapo_node *slapo__grad_to(slapo_ctx *ctx, slapo_node *g, const slapo_node *input);

/* Elementwise loop helpers for kernels: for out of shape (ndim, shape)
 * contiguous, the element offset into an input of shape (in_ndim, in_shape)
 * with strides `in_strides`, broadcast NumPy style. */
void slapo__broadcast_strides(int ndim, const int64_t *shape, const slapo_tensor *in,
                              int64_t *strides_out);

/* Number of OpenMP threads worth using for `work` elementwise operations
 * (1 for small tensors: thread start-up costs more than it saves). */
int slapo__threads_for(int64_t work);

#endif
