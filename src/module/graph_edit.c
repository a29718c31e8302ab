/* module/graph_edit.c - the one edit the step graph passes share: a new
 * call_op node in front of an existing one. Layer: module. */
#include "module/internal.h"
#include "slapo/ops.h"

slapo_status slapo__emit_before(slapo_graph *g, slapo_node *at, const struct slapo_op *op,
                                int n_in, slapo_node *const *in, int n_attrs,
                                const slapo_attr *attrs, const slapo_node *like,
                                slapo_node **out) {
  slapo_graph_insert_before(g, at);
  slapo_status s = slapo_graph_add_call_op(g, op->name, op, n_in, in, n_attrs, attrs, out);
  slapo_graph_insert_at_end(g);
  SLAPO_TRY(s);
  SLAPO_TRY(op->infer(*out));
  return slapo_node_set_origin(*out, like->origin ? like->origin : "", like->op_seq);
}
