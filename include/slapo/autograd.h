/* slapo/autograd.h - reverse-mode differentiation of a forward graph into
 * backward nodes appended to the same graph (one joint graph, so backward
 * nodes read forward values directly and the planner sees both).
 * Layer: autograd (depends on ops). */
#ifndef SLAPO_AUTOGRAD_H
#define SLAPO_AUTOGRAD_H

#include "slapo/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Appends the backward of `y` to ctx's graph, seeded with `dy` (same shape
 * as y; NULL means ones, valid for any y). For each wrt[i] (placeholders,
 * params or any forward node) stores its gradient node in grads[i], or a
 * zeros node when y does not depend on it. Nodes are visited in reverse
 * order; when a value has several users their contributions are summed in
 * the users' graph order, so results are bitwise reproducible. Gradients of
 * broadcast inputs are reduced to the input's shape by the rules.
 * Errors (also recorded on ctx): SLAPO_UNSUPPORTED naming the op and its
 * module path when a node on a path from wrt to y has no backward rule;
 * SLAPO_SHAPE when dy's shape differs from y's; anything a rule returns. */
slapo_status slapo_backward(slapo_ctx *ctx, slapo_node *y, slapo_node *dy, int n_wrt,
                            slapo_node *const *wrt, slapo_node **grads);

/* slapo_backward of several values at once: the gradients of
 * sum_k <ys[k], dys[k]> (dys NULL, or dys[k] NULL: ones). A pipeline
 * stage's backward, seeded by the gradients the next stage sent for the
 * values it received. Contributions are summed as slapo_backward sums them,
 * each seed after every contribution from inside the graph, seeds in the
 * order of ys; so when each y has no reader in the graph the gradients are
 * bitwise those of the graph that went on to compute the ys' readers and
 * summed them the same way (one process). Errors: those of slapo_backward,
 * per y, and SLAPO_INVALID_ARG (n_y < 1, ys NULL). */
slapo_status slapo_backward_multi(slapo_ctx *ctx, int n_y, slapo_node *const *ys,
                                  slapo_node *const *dys, int n_wrt, slapo_node *const *wrt,
                                  slapo_node **grads);

#ifdef __cplusplus
}
#endif
#endif
