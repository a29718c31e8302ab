/* module/call.c - calling child modules and reading parameters while a step
 * graph is built. Children are looked up by name at call time, so `replace`
 * only swaps a table entry; each parameter becomes one param node per graph,
 * so tied uses accumulate into one gradient. Layer: module. */
#include <stdio.h>
#include <string.h>

#include "module/internal.h"

/* The child `name` of self and its full path, or NULL (error recorded). */
static slapo_module *child_of(slapo_ctx *ctx, slapo_module *self, const char *name,
                              char *path, size_t cap) {
  slapo_module *child = NULL;
  const char *origin = slapo_ctx_origin(ctx);
  snprintf(path, cap, "%s%s%s", origin, origin[0] ? "." : "", name);
  if (slapo_module_at(self, name, &child) != SLAPO_OK) {
    slapo_ctx_fail(ctx, SLAPO_NOT_FOUND, "%s: %s", origin[0] ? origin : "(root)",
                   slapo_last_error());
    return NULL;
  }
  return child;
}

static slapo_node *forward(slapo_ctx *ctx, slapo_module *m, int n_in, slapo_node *const *in) {
  slapo__build_state *bs = slapo_ctx_user(ctx);
  if (bs && bs->capture && !bs->capture->done && bs->capture->m == m)
    return slapo__trace_capture(ctx, bs->capture, m, n_in, in);
  if (m->trace) return slapo__trace_emit(ctx, m, n_in, in);
  return m->type->forward(ctx, m, n_in, in);
}

slapo_node *slapo__forward(slapo_ctx *ctx, slapo_module *m, int n_in, slapo_node *const *in) {
  /* autocast: the module's GEMMs (and its children's, unless they set
   * their own) are built in its precision; a trace records the casts. */
  slapo_autocast prev = slapo_ctx_autocast(ctx);
  if (m->autocast_set) slapo_ctx_set_autocast(ctx, m->autocast);
  slapo_node *y = forward(ctx, m, n_in, in);
  slapo_ctx_set_autocast(ctx, prev);
  return y;
}

/* A module takes values, not tuples: the caller unpacks with getitem. */
static bool no_tuple_inputs(slapo_ctx *ctx, const char *name, int n_in, slapo_node *const *in) {
  for (int i = 0; i < n_in; i++)
    if (in[i] && in[i]->kind == SLAPO_NODE_TUPLE) {
      const char *o = slapo_ctx_origin(ctx);
      char user[1024];
      snprintf(user, sizeof user, "call of %s%s%s", o, o[0] ? "." : "", name);
      slapo__tuple_misuse(in[i], user, i);
      slapo_ctx_fail(ctx, SLAPO_INVALID_ARG, "%s: %s", o[0] ? o : ".", slapo_last_error());
      return false;
    }
  return true;
}

slapo_status slapo__prune_tuples(slapo_graph *g, int n_keep, slapo_node *const *keep,
                                 slapo__build_state *bs) {
  bool any = false;
  for (slapo_node *x = slapo_graph_first(g); x && !any; x = x->next)
    any = x->kind == SLAPO_NODE_TUPLE;
  if (!any) return SLAPO_OK;
  slapo_node *o;
  SLAPO_TRY(slapo_graph_add_output(g, n_keep, keep, &o)); /* keeps them and what they read */
  slapo_graph_dce(g);
  SLAPO_TRY(slapo_graph_erase(g, o));
  for (size_t i = slapo_map_count(bs->param_nodes); i-- > 0;) {
    const slapo_node *p = slapo_map_value_at(bs->param_nodes, i);
    if (p->graph) continue;
    char key[1024];
    snprintf(key, sizeof key, "%s", slapo_map_key_at(bs->param_nodes, i));
    slapo_map_remove(bs->param_nodes, key);
    slapo_map_remove(bs->param_objs, key);
  }
  return SLAPO_OK;
}

slapo_node *slapo_call(slapo_ctx *ctx, slapo_module *self, const char *name, int n_in,
                       slapo_node *const *in) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  if (!no_tuple_inputs(ctx, name, n_in, in)) return NULL;
  slapo__build_state *bs = slapo_ctx_user(ctx);
  if (!bs || !bs->trace || bs->trace->leaf_depth > 0)
    return slapo__call_module(ctx, self, name, n_in, in);
  /* Tracing: the child becomes a call_module node or is inlined. */
  char path[1024];
  slapo_module *child = child_of(ctx, self, name, path, sizeof path);
  return child ? slapo__trace_call(ctx, bs->trace, self, name, child, path, n_in, in) : NULL;
}

slapo_node *slapo__call_module(slapo_ctx *ctx, slapo_module *self, const char *name, int n_in,
                               slapo_node *const *in) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  char path[1024];
  slapo_module *child = child_of(ctx, self, name, path, sizeof path);
  if (!child) return NULL;
  if (slapo_ctx_enter_call(ctx, path) != SLAPO_OK) return NULL;
  /* A checkpointed module's nodes form one recompute region (nested
   * checkpoints fold into the outermost: its recompute covers them). */
  int prev = slapo_ctx_region(ctx);
  if (child->checkpoint && prev == 0) slapo_ctx_set_region(ctx, slapo_ctx_new_region(ctx));
  slapo_node *out;
  if (child->n_syncs) { /* the sync primitive's collectives around the call */
    slapo_node *ins[8];
    int n = n_in;
    if (n > 8) {
      slapo_ctx_fail(ctx, SLAPO_LIMIT, "%s: a module with syncs takes at most 8 inputs", path);
      n = 0;
    }
    memcpy(ins, in, sizeof *ins * (size_t)n);
    if (n > 0) ins[0] = slapo__apply_syncs(ctx, child, SLAPO_SYNC_INPUT, ins[0]);
    out = slapo_ctx_status(ctx) == SLAPO_OK ? slapo__forward(ctx, child, n, ins) : NULL;
    out = slapo__apply_syncs(ctx, child, SLAPO_SYNC_OUTPUT, out);
  } else {
    out = slapo__forward(ctx, child, n_in, in);
  }
  slapo_ctx_set_region(ctx, prev);
  slapo_ctx_pop_origin(ctx);
  if (!out && slapo_ctx_status(ctx) == SLAPO_OK)
    slapo_ctx_fail(ctx, SLAPO_STATE, "%s: forward of %s returned no value", path,
                   child->type->name);
  return out;
}

slapo_node *slapo_call1(slapo_ctx *ctx, slapo_module *self, const char *name, slapo_node *x) {
  return slapo_call(ctx, self, name, 1, &x);
}

slapo_node *slapo_weight(slapo_ctx *ctx, slapo_module *self, const char *name) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  slapo_parameter *p = slapo_module_param(self, name);
  const char *origin = slapo_ctx_origin(ctx);
  if (!p) {
    slapo_ctx_fail(ctx, SLAPO_NOT_FOUND, "%s: a %s has no parameter '%s'",
                   origin[0] ? origin : "(root)", self->type->name, name);
    return NULL;
  }
  if (!p->path) {
    slapo_ctx_fail(ctx, SLAPO_STATE, "%s.%s: parameter is not materialized", origin, name);
    return NULL;
  }
  return slapo__param_node(ctx, p);
}

slapo_node *slapo__param_node(slapo_ctx *ctx, slapo_parameter *p) {
  slapo__build_state *bs = slapo_ctx_user(ctx);
  if (bs) {
    slapo_node *n = slapo_map_get(bs->param_nodes, p->path);
    if (n) return n;
  }
  slapo_node *n = slapo_param(ctx, p->path, p->value->dtype, p->value->ndim, p->value->shape);
  if (n) n->layout = slapo_parameter_layout(p);
  if (n && bs && slapo_map_set(bs->param_nodes, p->path, n) != SLAPO_OK) {
    slapo_ctx_fail(ctx, SLAPO_NOMEM, "out of memory");
    return NULL;
  }
  if (n && bs && slapo_map_set(bs->param_objs, p->path, p) != SLAPO_OK) {
    slapo_ctx_fail(ctx, SLAPO_NOMEM, "out of memory");
    return NULL;
  }
  return n;
}
