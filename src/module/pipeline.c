/* module/pipeline.c - pipeline stages: the step's forward split where the
 * `cut` modules end, each stage a joint forward + backward graph of its
 * own, planned once and run in spans, one arena per micro-batch in flight
 * (slapo_pp_stage_*). Layer: module.
 *
 * How a stage is made. The root's forward is built as a step builds it:
 * one flat graph whose nodes carry the module path that emitted them
 * (traced modules included), so no separate trace is needed. Each cut
 * module's last node ends a stage; a node belongs to the stage after the
 * boundaries before it. Stage s copies its nodes, with their attributes
 * (dropout streams, so the one-process masks), module paths and
 * checkpoint regions, into a graph of its own. Placeholders, parameters
 * and ops without inputs (constants) are copied into each stage that
 * reads them; every other value computed before stage s and read at or
 * after it is received, as placeholder pp_recv_<k>, in the order of the
 * forward, which every rank builds alike (a value skipping a stage is
 * received and sent on). The stage sends what stage s + 1 receives. Its
 * backward (slapo_backward_multi) is seeded by the gradients of what it
 * sent (placeholders pp_grad_<k>, f32 values only), or by dloss on the
 * last stage, and yields the gradients of what it received, to send back.
 *
 * Outputs: [the loss (last stage) or the sent values] [the gradients of
 * the received float values] [the parameters' gradients, accumulated into
 * their grads]. The forward span runs up to the first node the backward
 * added. */
#include <stdio.h>
#include <string.h>

#include "module/internal.h"

enum { MAX_BOUNDARY = 256 };

typedef struct pp_slot {
  slapo_plan_arena *arena; /* NULL: the plan's own */
  slapo_tensor **recv;     /* [n_recv] activations received     */
  slapo_tensor **grad;     /* [n_send] gradients received (NULL: not float) */
} pp_slot;

struct slapo_pp_stage {
  int stage, n_stages;
  slapo_module *root;
  slapo_graph *g;
  slapo_plan *plan;
  const slapo_node *bwd_first; /* the backward span starts here */
  int n_in;
  bool has_in[SLAPO_STEP_MAX_INPUTS];
  slapo__index_bound bounds[SLAPO_STEP_MAX_INPUTS];
  int n_recv, n_send, n_rgrad; /* n_rgrad: received float values */
  slapo_node **recv_nodes;     /* [n_recv] placeholders            */
  int *rgrad_of;               /* [n_recv]: output of its gradient, -1 */
  slapo_node **send_nodes;     /* [n_send] outputs 0 .. n_send-1   */
  int n_params;
  slapo_parameter **params;
  slapo_tensor *dloss;
  int n_slots;
  pp_slot *slots;
};

/* ---- the cut modules ---- */

typedef struct cut_list {
  int n;
  char *path[MAX_BOUNDARY];
} cut_list;

static slapo_status collect_cuts(const slapo_module *m, cut_list *c) {
  if (m->pp_cut) {
    if (c->n == MAX_BOUNDARY)
      return slapo_error(SLAPO_LIMIT, "pipeline: more than %d cut modules", MAX_BOUNDARY);
    if (!(c->path[c->n++] = slapo_module_path(m)))
      return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  }
  for (int i = 0; i < m->n_children; i++) SLAPO_TRY(collect_cuts(m->children[i], c));
  return SLAPO_OK;
}

static void cuts_free(cut_list *c) {
  for (int i = 0; i < c->n; i++) slapo_free(c->path[i]);
  c->n = 0;
}

int slapo_pp_stage_count(const slapo_module *root) {
  cut_list c = {0};
  int n = collect_cuts(root, &c) == SLAPO_OK ? c.n + 1 : 1;
  cuts_free(&c);
  return n;
}

/* ---- splitting the forward ---- */

static bool within(const char *origin, const char *path) {
  size_t n = strlen(path);
  return origin && !strncmp(origin, path, n) && (origin[n] == '\0' || origin[n] == '.');
}

/* Copied into every stage that reads it rather than sent. */
static bool is_free(const slapo_node *n) {
  return n->kind == SLAPO_NODE_PLACEHOLDER || n->kind == SLAPO_NODE_PARAM ||
         (n->kind == SLAPO_NODE_CALL_OP && n->n_inputs == 0);
}

/* The index of the last node of each cut module in `nodes` [count] (the
 * forward in order), sorted, into ends [c->n]; checks each cut. */
static slapo_status find_ends(const cut_list *c, slapo_node *const *nodes, int count, int *ends,
                              const char **end_path) {
  for (int k = 0; k < c->n; k++) {
    const char *p = c->path[k];
    int first = -1, last = -1;
    for (int i = 0; i < count; i++)
      if (!is_free(nodes[i]) && within(nodes[i]->origin, p)) {
        if (first < 0) first = i;
        last = i;
      }
    if (first < 0)
      return slapo_error(SLAPO_PRECOND,
                         "cut: %s emits no op of its own in the step's forward: it is never "
                         "called, or its ops were fused into a region named after another "
                         "module; cut a module whose ops run as its own",
                         p);
    for (int i = first; i <= last; i++)
      if (!is_free(nodes[i]) && !within(nodes[i]->origin, p))
        return slapo_error(SLAPO_PRECOND,
                           "cut: %s is not called in sequence: %%%s of %s runs between its "
                           "ops (a module called twice, or one its parent's forward "
                           "interleaves with others); cut a module whose forward runs in one "
                           "piece",
                           p, nodes[i]->name, nodes[i]->origin[0] ? nodes[i]->origin : ".");
    /* Insert, sorted. */
    int j = k;
    while (j > 0 && ends[j - 1] > last) ends[j] = ends[j - 1], end_path[j] = end_path[j - 1], j--;
    if (j > 0 && ends[j - 1] == last)
      return slapo_error(SLAPO_PRECOND, "cut: %s and %s end at the same op (%%%s): the stage "
                         "between them would be empty; keep one of the two cut lines",
                         end_path[j - 1], p, nodes[last]->name);
    ends[j] = last, end_path[j] = p;
  }
  if (c->n > 0) {
    int after = 0;
    for (int i = ends[c->n - 1] + 1; i < count; i++) after += !is_free(nodes[i]);
    if (!after)
      return slapo_error(SLAPO_PRECOND, "cut: nothing of the forward runs after %s: the last "
                         "stage would be empty; cut an earlier module",
                         end_path[c->n - 1]);
  }
  return SLAPO_OK;
}

/* ---- building one stage ---- */

typedef struct split {
  slapo_node **nodes; /* the forward, in order [count] */
  int count;
  int *stage_of;      /* [count] */
  int *last_use;      /* [count]: the latest stage reading it */
} split;

/* Values stage s receives: computed before s (not free), read at s or after. */
static bool received_by(const split *sp, int i, int s) {
  return !is_free(sp->nodes[i]) && sp->stage_of[i] < s && sp->last_use[i] >= s;
}

typedef struct copier {
  slapo_ctx *ctx;
  const split *sp;
  slapo__build_state *fbs; /* the forward's: parameter objects by path */
  slapo_node **val;        /* [count]: the stage's node for each forward node */
  int *region;             /* forward region id -> the stage's */
  int n_region;
} copier;

static slapo_node *copy_node(copier *c, int i);

static slapo_node *value_of(copier *c, const slapo_node *n) {
  int i = n->id;
  return c->val[i] ? c->val[i] : copy_node(c, i);
}

/* Copies forward node i (its inputs copied or received already). */
static slapo_node *copy_node(copier *c, int i) {
  const slapo_node *n = c->sp->nodes[i];
  slapo_ctx *ctx = c->ctx;
  slapo_node *y = NULL;
  switch (n->kind) {
  case SLAPO_NODE_PLACEHOLDER:
    y = slapo_input(ctx, n->target, n->dtype, n->ndim, n->shape);
    break;
  case SLAPO_NODE_PARAM: {
    slapo_parameter *p = slapo_map_get(c->fbs->param_objs, n->target);
    if (!p) {
      slapo_ctx_fail(ctx, SLAPO_STATE, "pipeline: parameter %s has no object", n->target);
      return NULL;
    }
    y = slapo__param_node(ctx, p);
    break;
  }
  case SLAPO_NODE_CALL_OP: {
    slapo_node *args[32];
    if (n->n_inputs > 32) {
      slapo_ctx_fail(ctx, SLAPO_LIMIT, "pipeline: %%%s has %d inputs (at most 32)", n->name,
                     n->n_inputs);
      return NULL;
    }
    for (int k = 0; k < n->n_inputs; k++)
      if (!(args[k] = value_of(c, n->inputs[k]))) return NULL;
    int r = 0;
    if (n->recompute > 0) {
      if (n->recompute >= c->n_region) {
        slapo_ctx_fail(ctx, SLAPO_STATE, "pipeline: region %d out of range", n->recompute);
        return NULL;
      }
      if (!c->region[n->recompute]) c->region[n->recompute] = slapo_ctx_new_region(ctx);
      r = c->region[n->recompute];
    }
    if (slapo_ctx_push_origin(ctx, n->origin ? n->origin : "") != SLAPO_OK) return NULL;
    int outer = slapo_ctx_set_region(ctx, r);
    y = slapo_op_apply(ctx, n->op, n->n_inputs, args, n->n_attrs, n->attrs);
    slapo_ctx_set_region(ctx, outer);
    slapo_ctx_pop_origin(ctx);
    break;
  }
  default:
    slapo_ctx_fail(ctx, SLAPO_UNSUPPORTED, "pipeline: the forward holds a %s node (%%%s)",
                   slapo_node_kind_name(n->kind), n->name);
    return NULL;
  }
  return c->val[i] = y;
}

slapo_status slapo__pp_forward(slapo_module *root, int n_in, const slapo_tensor *const *in,
                               slapo_graph *fg, slapo__build_state *fbs, slapo_node **ins,
                               slapo_node **y) {
  slapo_ctx *ctx;
  SLAPO_TRY(slapo_module_name_params(root)); /* a meta model's paths */
  SLAPO_TRY(slapo_map_new(&fbs->param_nodes));
  SLAPO_TRY(slapo_map_new(&fbs->param_objs));
  SLAPO_TRY(slapo_ctx_new(fg, &ctx));
  slapo_status s = slapo__step_forward(root, ctx, fbs, n_in, in, ins, y);
  slapo_ctx_free(ctx);
  SLAPO_TRY(s);
  if ((*y)->ndim != 0)
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: training needs a scalar loss from the %s "
                       "forward", root->type->name);
  return SLAPO_OK;
}

static slapo_status split_forward(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                  slapo_graph *fg, slapo__build_state *fbs, split *sp,
                                  slapo_node **y, int *n_stages, slapo__index_bound *bounds) {
  slapo_node *ins[SLAPO_STEP_MAX_INPUTS];
  SLAPO_TRY(slapo__pp_forward(root, n_in, in, fg, fbs, ins, y));
  slapo__index_bounds(root, n_in, ins, bounds);
  slapo_graph_renumber(fg);
  sp->count = slapo_graph_count(fg);
  sp->nodes = slapo_calloc((size_t)sp->count, sizeof *sp->nodes);
  sp->stage_of = slapo_calloc((size_t)sp->count, sizeof *sp->stage_of);
  sp->last_use = slapo_calloc((size_t)sp->count, sizeof *sp->last_use);
  if (!sp->nodes || !sp->stage_of || !sp->last_use)
    return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  int i = 0;
  for (slapo_node *n = slapo_graph_first(fg); n; n = n->next) sp->nodes[i++] = n;
  cut_list c = {0};
  int ends[MAX_BOUNDARY];
  const char *end_path[MAX_BOUNDARY];
  slapo_status s = collect_cuts(root, &c);
  if (s == SLAPO_OK) s = find_ends(&c, sp->nodes, sp->count, ends, end_path);
  *n_stages = c.n + 1;
  for (int k = 0, st = 0; s == SLAPO_OK && k < sp->count; k++) {
    while (st < c.n && ends[st] < k) st++;
    sp->stage_of[k] = st;
    sp->last_use[k] = -1;
  }
  cuts_free(&c);
  SLAPO_TRY(s);
  for (int k = 0; k < sp->count; k++)
    for (int u = 0; u < sp->nodes[k]->n_users; u++) {
      const slapo_node *user = sp->nodes[k]->users[u];
      int st = sp->stage_of[user->id];
      if (st > sp->last_use[k]) sp->last_use[k] = st;
    }
  return SLAPO_OK;
}

/* Builds stage st->stage's graph from the split forward. */
static slapo_status build_stage(slapo_pp_stage *st, const split *sp, slapo__build_state *fbs,
                                slapo_node *fy) {
  const int s = st->stage;
  const bool last = s == st->n_stages - 1;
  slapo_ctx *ctx = NULL;
  slapo__build_state bs = {0};
  copier c = {0};
  slapo_node **ys = NULL, **dys = NULL, **wrt = NULL, **outs = NULL;
  slapo_status e = slapo_graph_new(&st->g);
  if (e == SLAPO_OK) e = slapo_ctx_new(st->g, &ctx);
  if (e == SLAPO_OK) e = slapo_map_new(&bs.param_nodes);
  if (e == SLAPO_OK) e = slapo_map_new(&bs.param_objs);
  if (e != SLAPO_OK) goto done;
  slapo_ctx_set_user(ctx, &bs);
  int max_region = 0;
  for (int i = 0; i < sp->count; i++)
    if (sp->nodes[i]->recompute > max_region) max_region = sp->nodes[i]->recompute;
  c = (copier){ctx, sp, fbs, slapo_calloc((size_t)sp->count, sizeof *c.val),
               slapo_calloc((size_t)max_region + 1, sizeof *c.region), max_region + 1};
  st->recv_nodes = slapo_calloc((size_t)sp->count + 1, sizeof *st->recv_nodes);
  st->rgrad_of = slapo_calloc((size_t)sp->count + 1, sizeof *st->rgrad_of);
  st->send_nodes = slapo_calloc((size_t)sp->count + 1, sizeof *st->send_nodes);
  ys = slapo_calloc((size_t)sp->count + 1, sizeof *ys);
  dys = slapo_calloc((size_t)sp->count + 1, sizeof *dys);
  if (!c.val || !c.region || !st->recv_nodes || !st->rgrad_of || !st->send_nodes || !ys || !dys) {
    e = slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
    goto done;
  }
  /* Received values, in forward order. */
  for (int i = 0; i < sp->count; i++) {
    if (!received_by(sp, i, s)) continue;
    const slapo_node *n = sp->nodes[i];
    char name[32];
    snprintf(name, sizeof name, "pp_recv_%d", st->n_recv);
    slapo_node *ph = slapo_input(ctx, name, n->dtype, n->ndim, n->shape);
    c.val[i] = ph;
    st->recv_nodes[st->n_recv++] = ph;
  }
  /* The stage's own nodes, in forward order. */
  slapo_node *last_fwd = NULL;
  for (int i = 0; i < sp->count && slapo_ctx_status(ctx) == SLAPO_OK; i++)
    if (!is_free(sp->nodes[i]) && sp->stage_of[i] == s && !c.val[i])
      last_fwd = copy_node(&c, i);
  if ((e = slapo_ctx_status(ctx)) != SLAPO_OK) goto done;
  /* What it sends (what stage s + 1 receives), or the loss. */
  int n_y = 0;
  if (last) {
    ys[n_y++] = c.val[fy->id];
    dys[0] = slapo_input(ctx, "dloss", SLAPO_DTYPE_F32, 0, NULL);
  } else {
    for (int i = 0; i < sp->count; i++) {
      if (!received_by(sp, i, s + 1)) continue;
      slapo_node *v = st->send_nodes[st->n_send] = c.val[i];
      if (slapo_dtype_is_float(v->dtype)) {
        char name[32];
        snprintf(name, sizeof name, "pp_grad_%d", st->n_send);
        ys[n_y] = v; /* seeds: the float values, compacted */
        dys[n_y++] = slapo_input(ctx, name, SLAPO_DTYPE_F32, v->ndim, v->shape);
      }
      st->n_send++;
    }
    if (n_y == 0) {
      e = slapo_error(SLAPO_PRECOND, "pipeline: stage %d sends no floating-point value to stage "
                      "%d, so no gradient reaches it; move its cut line", s, s + 1);
      goto done;
    }
  }
  /* Differentiate: w.r.t. the parameters, then the received floats. */
  int n_p = (int)slapo_map_count(bs.param_nodes);
  wrt = slapo_calloc((size_t)(n_p + st->n_recv) + 1, sizeof *wrt);
  outs = slapo_calloc((size_t)(n_p + st->n_recv + st->n_send) + 2, sizeof *outs);
  st->params = slapo_calloc((size_t)n_p + 1, sizeof *st->params);
  if (!wrt || !outs || !st->params) {
    e = slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
    goto done;
  }
  int n_w = 0;
  for (int i = 0; i < n_p; i++) {
    wrt[n_w++] = slapo_map_value_at(bs.param_nodes, (size_t)i);
    st->params[i] = slapo_map_value_at(bs.param_objs, (size_t)i);
  }
  st->n_params = n_p;
  for (int k = 0; k < st->n_recv; k++) {
    st->rgrad_of[k] = -1;
    if (slapo_dtype_is_float(st->recv_nodes[k]->dtype)) wrt[n_w++] = st->recv_nodes[k];
  }
  slapo_node **g = slapo_calloc((size_t)n_w + 1, sizeof *g);
  if (!g) {
    e = slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
    goto done;
  }
  e = slapo_backward_multi(ctx, n_y, ys, dys, n_w, wrt, g);
  /* Outputs: loss or sent values; received floats' gradients; parameters'. */
  int n_out = 0;
  if (e == SLAPO_OK) {
    if (last) outs[n_out++] = ys[0];
    for (int k = 0; k < st->n_send; k++) outs[n_out++] = st->send_nodes[k];
    for (int k = 0, j = n_p; k < st->n_recv; k++)
      if (slapo_dtype_is_float(st->recv_nodes[k]->dtype))
        st->rgrad_of[k] = n_out, outs[n_out++] = g[j++];
    st->n_rgrad = n_out - (last ? 1 : st->n_send);
    for (int i = 0; i < n_p; i++) outs[n_out++] = g[i];
    if (!slapo_output(ctx, n_out, outs)) e = slapo_ctx_status(ctx);
  }
  slapo_free(g);
  if (e == SLAPO_OK) e = slapo__step_rules(st->g, true);
  if (e == SLAPO_OK) {
    /* The forward span ends after the last forward node (an output, which
     * no rule erases). */
    SLAPO_ASSERT(last_fwd && last_fwd->graph == st->g);
    st->bwd_first = last_fwd->next;
  }
done:
  slapo_free(c.val);
  slapo_free(c.region);
  slapo_free(ys);
  slapo_free(dys);
  slapo_free(wrt);
  slapo_free(outs);
  slapo_map_free(bs.param_nodes);
  slapo_map_free(bs.param_objs);
  slapo_ctx_free(ctx);
  return e;
}

/* ---- slots, planning ---- */

/* A tensor of n's shape, of dtype dt. */
static slapo_status new_tensor(const slapo_node *n, slapo_dtype dt, slapo_tensor **out) {
  return slapo_tensor_new(dt, n->ndim, n->shape, out);
}

static slapo_status make_slots(slapo_pp_stage *st, int n_slots) {
  st->slots = slapo_calloc((size_t)n_slots, sizeof *st->slots);
  if (!st->slots) return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  st->n_slots = n_slots;
  for (int j = 0; j < n_slots; j++) {
    pp_slot *sl = &st->slots[j];
    sl->recv = slapo_calloc((size_t)st->n_recv + 1, sizeof *sl->recv);
    sl->grad = slapo_calloc((size_t)st->n_send + 1, sizeof *sl->grad);
    if (!sl->recv || !sl->grad) return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
    /* Slot 0 runs in the plan's own arena. */
    if (j > 0) SLAPO_TRY(slapo_plan_arena_new(st->plan, &sl->arena));
    for (int k = 0; k < st->n_recv; k++)
      SLAPO_TRY(new_tensor(st->recv_nodes[k], st->recv_nodes[k]->dtype, &sl->recv[k]));
    for (int k = 0; k < st->n_send; k++)
      if (slapo_dtype_is_float(st->send_nodes[k]->dtype))
        SLAPO_TRY(new_tensor(st->send_nodes[k], SLAPO_DTYPE_F32, &sl->grad[k]));
  }
  return SLAPO_OK;
}

/* The first output that accumulates (the parameters' gradients): after
 * the loss or the sent values, and the received values' gradients. */
static int accumulate_from(const slapo_pp_stage *st) {
  return (slapo_pp_stage_is_last(st) ? 1 : st->n_send) + st->n_rgrad;
}

static slapo_status plan_stage(slapo_pp_stage *st, const slapo_plan_opts *opts) {
  slapo_plan_opts po = opts ? *opts : (slapo_plan_opts){0};
  po.accumulate_from = accumulate_from(st);
  po.debug_alloc = false; /* spans need arenas */
  SLAPO_TRY(slapo_plan_new(st->g, &po, &st->plan));
  for (int i = 0; i < st->n_params; i++) {
    slapo_parameter *p = st->params[i];
    SLAPO_TRY(slapo_plan_bind_param(st->plan, p->path, p->value));
    SLAPO_TRY(slapo_plan_bind_accumulator(st->plan, po.accumulate_from + i, p->grad));
  }
  return slapo_tensor_new(SLAPO_DTYPE_F32, 0, NULL, &st->dloss);
}

/* The stage's graph (no plan, no slots) into *out: what slapo_pp_stage_new,
 * _estimate and _materialize share. The model may be meta. read (may be
 * NULL) receives the parameters the whole forward reads, by canonical path
 * (owned, slapo_map_free). */
static slapo_status stage_graph(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                int stage, const char *what, slapo_pp_stage **out,
                                slapo_map **read) {
  *out = NULL;
  SLAPO_NEED(root, what);
  if (n_in < 0 || n_in > SLAPO_STEP_MAX_INPUTS || (n_in > 0 && !in))
    return slapo_error(SLAPO_INVALID_ARG, "%s: %d inputs (at most %d)", what, n_in,
                       SLAPO_STEP_MAX_INPUTS);
  SLAPO_TRY(slapo__check_shards(root));
  slapo_pp_stage *st = slapo_calloc(1, sizeof *st);
  if (!st) return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  st->root = root;
  st->stage = stage;
  st->n_in = n_in;
  slapo_graph *fg = NULL;
  slapo__build_state fbs = {0};
  split sp = {0};
  slapo_node *fy = NULL;
  slapo_status s = slapo_graph_new(&fg);
  if (s == SLAPO_OK)
    s = split_forward(root, n_in, in, fg, &fbs, &sp, &fy, &st->n_stages, st->bounds);
  if (s == SLAPO_OK && (stage < 0 || stage >= st->n_stages))
    s = slapo_error(SLAPO_INVALID_ARG, "%s: stage %d of %d (the schedule's cut lines make %d "
                    "stages)", what, stage, st->n_stages, st->n_stages);
  if (s == SLAPO_OK) s = build_stage(st, &sp, &fbs, fy);
  for (int i = 0; s == SLAPO_OK && i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    for (slapo_node *n = slapo_graph_first(st->g); n; n = n->next)
      if (n->kind == SLAPO_NODE_PLACEHOLDER && !strcmp(n->target, name)) st->has_in[i] = true;
  }
  slapo_free(sp.nodes);
  slapo_free(sp.stage_of);
  slapo_free(sp.last_use);
  slapo_map_free(fbs.param_nodes);
  if (s == SLAPO_OK && read) *read = fbs.param_objs;
  else slapo_map_free(fbs.param_objs);
  slapo_graph_free(fg);
  if (s != SLAPO_OK) {
    slapo_pp_stage_free(st);
    return s;
  }
  *out = st;
  return SLAPO_OK;
}

slapo_status slapo_pp_stage_new(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                int stage, int n_slots, const slapo_plan_opts *opts,
                                slapo_pp_stage **out) {
  *out = NULL;
  if (n_slots < 1)
    return slapo_error(SLAPO_INVALID_ARG, "pp_stage_new: %d slots (need >= 1)", n_slots);
  slapo_pp_stage *st;
  SLAPO_TRY(stage_graph(root, n_in, in, stage, "pp_stage_new", &st, NULL));
  slapo_status s = SLAPO_OK;
  /* Only what the stage reads must be materialized. */
  for (int i = 0; s == SLAPO_OK && i < st->n_params; i++)
    if (slapo_tensor_is_meta(st->params[i]->value))
      s = slapo_error(SLAPO_STATE, "pp_stage_new: parameter %s of stage %d is not materialized "
                      "(slapo_pp_stage_materialize or slapo_module_materialize allocates it)",
                      st->params[i]->path, stage);
  if (s == SLAPO_OK) s = plan_stage(st, opts);
  if (s == SLAPO_OK) s = make_slots(st, n_slots);
  if (s != SLAPO_OK) {
    slapo_pp_stage_free(st);
    return s;
  }
  slapo_logf(1, "pipeline: stage %d of %d: %d nodes, receives %d values, sends %d, %d parameters",
             stage, st->n_stages, slapo_graph_count(st->g), st->n_recv, st->n_send, st->n_params);
  *out = st;
  return SLAPO_OK;
}

slapo_status slapo_pp_stage_estimate(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                     int stage, int n_slots, int64_t *param_numel,
                                     size_t *act_nbytes) {
  slapo_pp_stage *st;
  SLAPO_TRY(stage_graph(root, n_in, in, stage, "pp_stage_estimate", &st, NULL));
  *param_numel = 0;
  for (int i = 0; i < st->n_params; i++) *param_numel += slapo_tensor_numel(st->params[i]->value);
  slapo_plan_opts po = {.accumulate_from = accumulate_from(st)};
  size_t peak = 0;
  slapo_status s = slapo_plan_estimate(st->g, &po, &peak);
  *act_nbytes = peak * (size_t)(n_slots > 0 ? n_slots : 1);
  slapo_pp_stage_free(st);
  return s;
}

typedef struct unread_state {
  const slapo_map *read; /* canonical path -> parameter, of the forward */
  uint64_t seed;
  slapo_status status;
} unread_state;

/* A parameter no stage reads is materialized on stage 0: one process's
 * AdamW still decays it, and a checkpoint holds it. */
static void materialize_unread(slapo_parameter *p, const char *path, void *ud) {
  unread_state *u = ud;
  if (u->status == SLAPO_OK && !slapo_map_get(u->read, p->path ? p->path : path))
    u->status = slapo__param_materialize(p, path, u->seed);
}

slapo_status slapo_pp_stage_materialize(slapo_module *root, int n_in,
                                        const slapo_tensor *const *in, int stage, uint64_t seed) {
  slapo_pp_stage *st;
  slapo_map *read = NULL;
  SLAPO_TRY(stage_graph(root, n_in, in, stage, "pp_stage_materialize", &st, &read));
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < st->n_params; i++)
    s = slapo__param_materialize(st->params[i], st->params[i]->path, seed);
  slapo_pp_stage_free(st);
  unread_state u = {read, seed, SLAPO_OK};
  if (s == SLAPO_OK && stage == 0) s = slapo_module_visit_params(root, materialize_unread, &u);
  if (s == SLAPO_OK) s = u.status;
  slapo_map_free(read);
  return s;
}

void slapo_pp_stage_free(slapo_pp_stage *st) {
  if (!st) return;
  for (int j = 0; st->slots && j < st->n_slots; j++) {
    pp_slot *sl = &st->slots[j];
    slapo_plan_arena_free(sl->arena);
    for (int k = 0; sl->recv && k < st->n_recv; k++) slapo_tensor_free(sl->recv[k]);
    for (int k = 0; sl->grad && k < st->n_send; k++) slapo_tensor_free(sl->grad[k]);
    slapo_free(sl->recv);
    slapo_free(sl->grad);
  }
  slapo_free(st->slots);
  slapo_plan_free(st->plan);
  slapo_graph_free(st->g);
  slapo_free(st->recv_nodes);
  slapo_free(st->rgrad_of);
  slapo_free(st->send_nodes);
  slapo_free(st->params);
  slapo_tensor_free(st->dloss);
  slapo_free(st);
}

/* ---- running ---- */

int slapo_pp_stage_index(const slapo_pp_stage *st) { return st->stage; }
int slapo_pp_stage_n_stages(const slapo_pp_stage *st) { return st->n_stages; }
bool slapo_pp_stage_is_last(const slapo_pp_stage *st) { return st->stage == st->n_stages - 1; }
int slapo_pp_stage_n_recv(const slapo_pp_stage *st) { return st->n_recv; }
int slapo_pp_stage_n_send(const slapo_pp_stage *st) { return st->n_send; }
int slapo_pp_stage_n_params(const slapo_pp_stage *st) { return st->n_params; }
int slapo_pp_stage_n_slots(const slapo_pp_stage *st) { return st->n_slots; }
slapo_parameter *slapo_pp_stage_param(const slapo_pp_stage *st, int i) {
  return i >= 0 && i < st->n_params ? st->params[i] : NULL;
}
const slapo_graph *slapo_pp_stage_graph(const slapo_pp_stage *st) { return st->g; }
const slapo_plan *slapo_pp_stage_plan(const slapo_pp_stage *st) { return st->plan; }

static bool slot_ok(const slapo_pp_stage *st, int slot) { return slot >= 0 && slot < st->n_slots; }

slapo_tensor *slapo_pp_stage_recv_buf(slapo_pp_stage *st, int slot, int i) {
  return slot_ok(st, slot) && i >= 0 && i < st->n_recv ? st->slots[slot].recv[i] : NULL;
}

slapo_tensor *slapo_pp_stage_grad_buf(slapo_pp_stage *st, int slot, int i) {
  return slot_ok(st, slot) && i >= 0 && i < st->n_send ? st->slots[slot].grad[i] : NULL;
}

/* Binds slot's tensors and the step's inputs; the forward checks the
 * token ids (its backward reads the same inputs). */
static slapo_status bind_slot(slapo_pp_stage *st, int slot, int n_in,
                              const slapo_tensor *const *in, bool forward, const char *what) {
  if (!slot_ok(st, slot))
    return slapo_error(SLAPO_INVALID_ARG, "%s: slot %d of %d", what, slot, st->n_slots);
  if (n_in != st->n_in)
    return slapo_error(SLAPO_INVALID_ARG, "%s: %d inputs, the stage was built for %d", what,
                       n_in, st->n_in);
  for (int i = 0; i < n_in; i++) {
    if (!in[i]) return slapo_error(SLAPO_INVALID_ARG, "%s: input %d is NULL", what, i);
    if (!st->has_in[i]) continue;
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    SLAPO_TRY(slapo_plan_bind_input(st->plan, name, in[i]));
    if (forward) SLAPO_TRY(slapo__index_check(&st->bounds[i], i, in[i]));
  }
  pp_slot *sl = &st->slots[slot];
  for (int k = 0; k < st->n_recv; k++) {
    char name[32];
    snprintf(name, sizeof name, "pp_recv_%d", k);
    SLAPO_TRY(slapo_plan_bind_input(st->plan, name, sl->recv[k]));
  }
  for (int k = 0; k < st->n_send; k++) {
    if (!sl->grad[k]) continue;
    char name[32];
    snprintf(name, sizeof name, "pp_grad_%d", k);
    SLAPO_TRY(slapo_plan_bind_input(st->plan, name, sl->grad[k]));
  }
  if (slapo_pp_stage_is_last(st)) SLAPO_TRY(slapo_plan_bind_input(st->plan, "dloss", st->dloss));
  return SLAPO_OK;
}

static slapo_plan_arena *arena_of(slapo_pp_stage *st, int slot) { return st->slots[slot].arena; }

slapo_status slapo_pp_stage_forward(slapo_pp_stage *st, int slot, int n_in,
                                    const slapo_tensor *const *in, const slapo_kernel_env *env) {
  SLAPO_NEED(st, "pp_stage_forward");
  SLAPO_TRY(bind_slot(st, slot, n_in, in, true, "pp_stage_forward"));
  return slapo_plan_run_span(st->plan, arena_of(st, slot), NULL, st->bwd_first, env,
                             SLAPO_ACC_ADD);
}

slapo_status slapo_pp_stage_backward(slapo_pp_stage *st, int slot, int n_in,
                                     const slapo_tensor *const *in, const slapo_kernel_env *env,
                                     float loss_scale, unsigned grads) {
  SLAPO_NEED(st, "pp_stage_backward");
  SLAPO_TRY(bind_slot(st, slot, n_in, in, false, "pp_stage_backward"));
  *(float *)slapo_tensor_data(st->dloss) = loss_scale;
  return slapo_plan_run_span(st->plan, arena_of(st, slot), st->bwd_first, NULL, env, grads);
}

const slapo_tensor *slapo_pp_stage_loss(const slapo_pp_stage *st) {
  return slapo_pp_stage_is_last(st) ? slapo_plan_output(st->plan, 0) : NULL;
}

const slapo_tensor *slapo_pp_stage_sent(const slapo_pp_stage *st, int i) {
  return i >= 0 && i < st->n_send ? slapo_plan_output(st->plan, i) : NULL;
}

const slapo_tensor *slapo_pp_stage_recv_grad(const slapo_pp_stage *st, int i) {
  if (i < 0 || i >= st->n_recv || st->rgrad_of[i] < 0) return NULL;
  return slapo_plan_output(st->plan, st->rgrad_of[i]);
}
