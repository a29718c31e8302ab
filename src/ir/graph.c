/* ir/graph.c - graph creation and destruction, iteration, the insertion
 * point, unique naming and the node constructors, node metadata setters, and
 * the list primitives (link, unlink, order keys, user arrays) that edit.c
 * shares. Layer: ir. Modelled on torch.fx's Graph (create_node, Namespace,
 * inserting_before/after). */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "ir/internal.h"

const char *slapo_node_kind_name(slapo_node_kind k) {
  switch (k) {
  case SLAPO_NODE_PLACEHOLDER: return "placeholder";
  case SLAPO_NODE_PARAM: return "param";
  case SLAPO_NODE_CALL_OP: return "call_op";
  case SLAPO_NODE_CALL_MODULE: return "call_module";
  case SLAPO_NODE_GETITEM: return "getitem";
  case SLAPO_NODE_OUTPUT: return "output";
  case SLAPO_NODE_TUPLE: return "tuple";
  }
  return "unknown";
}

/* ------------------------------------------------------------------------ */
/* Lifetime and iteration                                                    */
/* ------------------------------------------------------------------------ */

slapo_status slapo_graph_new(slapo_graph **out) {
  if (!out) return slapo_error(SLAPO_INVALID_ARG, "graph_new: out is NULL");
  *out = NULL;
  slapo_graph *g = slapo_calloc(1, sizeof *g);
  if (!g) return slapo_error(SLAPO_NOMEM, "graph_new: out of memory allocating the graph");
  slapo_status s = slapo_arena_new(0, &g->arena);
  if (s == SLAPO_OK) s = slapo_map_new(&g->names);
  if (s == SLAPO_OK) s = slapo_map_new(&g->bases);
  if (s != SLAPO_OK) {
    slapo_graph_free(g);
    return slapo_error(SLAPO_NOMEM, "graph_new: out of memory creating the arena and name maps");
  }
  g->ins_mode = SLAPO__INS_END;
  *out = g;
  return SLAPO_OK;
}

void slapo_graph_free(slapo_graph *g) {
  if (!g) return;
  /* User arrays live on the heap (they grow); erased nodes freed theirs. */
  for (slapo_node *n = g->first; n; n = n->next) slapo_free(n->users);
  slapo_map_free(g->bases);
  slapo_map_free(g->names);
  slapo_arena_free(g->arena);
  slapo_free(g);
}

slapo_arena *slapo_graph_arena(slapo_graph *g) { return g ? g->arena : NULL; }
slapo_node *slapo_graph_first(const slapo_graph *g) { return g ? g->first : NULL; }
slapo_node *slapo_graph_last(const slapo_graph *g) { return g ? g->last : NULL; }
int slapo_graph_count(const slapo_graph *g) { return g ? g->count : 0; }
slapo_node *slapo_graph_output(const slapo_graph *g) { return g ? g->output : NULL; }

slapo_node *slapo_graph_find(const slapo_graph *g, const char *name) {
  if (!g || !name) return NULL;
  slapo_node *n = slapo_map_get(g->names, name);
  return slapo__ir_in_graph(g, n) ? n : NULL; /* erased names stay reserved */
}

void slapo_graph_renumber(slapo_graph *g) {
  if (!g) return;
  int i = 0;
  for (slapo_node *n = g->first; n; n = n->next) n->id = i++;
}

void slapo_graph_insert_at_end(slapo_graph *g) {
  if (!g) return;
  g->ins_mode = SLAPO__INS_END;
  g->ins_node = NULL;
}

void slapo_graph_insert_before(slapo_graph *g, slapo_node *n) {
  if (!g) return;
  /* "At the beginning" is "before the current first node", so that
   * consecutive inserts keep their order. */
  if (!n) n = g->first;
  g->ins_mode = n ? SLAPO__INS_BEFORE : SLAPO__INS_END;
  g->ins_node = n;
}

void slapo_graph_insert_after(slapo_graph *g, slapo_node *n) {
  if (!g) return;
  g->ins_mode = n ? SLAPO__INS_AFTER : SLAPO__INS_END;
  g->ins_node = n;
}

/* ------------------------------------------------------------------------ */
/* List primitives shared with edit.c                                        */
/* ------------------------------------------------------------------------ */

/* Gives every node a fresh, evenly spaced order key. */
static void relabel(slapo_graph *g) {
  uint64_t k = 0;
  for (slapo_node *n = g->first; n; n = n->next) {
    k += SLAPO__ORDER_GAP;
    n->order = k;
  }
}

/* Picks n's key from its neighbours, relabelling when they are adjacent. */
static void assign_order(slapo_graph *g, slapo_node *n) {
  uint64_t lo = n->prev ? n->prev->order : 0;
  if (!n->next) {
    if (lo <= UINT64_MAX - SLAPO__ORDER_GAP) {
      n->order = lo + SLAPO__ORDER_GAP;
      return;
    }
  } else if (n->next->order - lo >= 2) {
    n->order = lo + (n->next->order - lo) / 2;
    return;
  }
  relabel(g);
}

void slapo__ir_link_before(slapo_graph *g, slapo_node *n, slapo_node *pos) {
  if (pos) {
    SLAPO_ASSERT(pos->graph == g);
    n->prev = pos->prev;
    n->next = pos;
    if (pos->prev) pos->prev->next = n;
    else g->first = n;
    pos->prev = n;
  } else {
    n->prev = g->last;
    n->next = NULL;
    if (g->last) g->last->next = n;
    else g->first = n;
    g->last = n;
  }
  g->count++;
  assign_order(g, n);
}

void slapo__ir_unlink(slapo_graph *g, slapo_node *n) {
  if (n->prev) n->prev->next = n->next;
  else g->first = n->next;
  if (n->next) n->next->prev = n->prev;
  else g->last = n->prev;
  n->prev = n->next = NULL;
  g->count--;
}

slapo_status slapo__ir_users_reserve(slapo_node *n, int extra) {
  if (n->n_users + extra <= n->cap_users) return SLAPO_OK;
  if (extra > INT32_MAX / 2 - n->n_users)
    return slapo_error(SLAPO_NOMEM, "node %%%s: too many users", n->name);
  int cap = n->cap_users ? n->cap_users * 2 : 4;
  if (cap < n->n_users + extra) cap = n->n_users + extra;
  slapo_node **u = slapo_realloc(n->users, (size_t)cap * sizeof *u);
  if (!u)
    return slapo_error(SLAPO_NOMEM, "node %%%s: out of memory growing its user list to %d",
                       n->name, cap);
  n->users = u;
  n->cap_users = cap;
  return SLAPO_OK;
}

void slapo__ir_users_push(slapo_node *n, slapo_node *u) {
  SLAPO_ASSERT(n->n_users < n->cap_users);
  n->users[n->n_users++] = u;
}

void slapo__ir_users_remove(slapo_node *n, slapo_node *u) {
  for (int i = 0; i < n->n_users; i++) {
    if (n->users[i] != u) continue;
    memmove(&n->users[i], &n->users[i + 1], (size_t)(n->n_users - i - 1) * sizeof *n->users);
    n->n_users--;
    return;
  }
  SLAPO_ASSERT(!"user missing from its input's user list");
}

/* ------------------------------------------------------------------------ */
/* Constructors                                                              */
/* ------------------------------------------------------------------------ */

static int is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_';
}

/* Room after the base for "_<int>" and the NUL. */
#define SUFFIX_ROOM 16

/* Makes a unique name for a new node from `hint` into the arena. On success
 * *name is registered in neither map yet; *counter (possibly NULL) must be
 * set to *next_suffix once the node is committed. The base's counter entry
 * may be created; that is harmless if the node is not. */
static slapo_status make_name(slapo_graph *g, const char *what, const char *hint, char **name,
                              int **counter, int *next_suffix) {
  size_t len = strlen(hint);
  int digit = hint[0] >= '0' && hint[0] <= '9';
  size_t base_len = len + (size_t)digit;
  const char *fallback = "node";
  if (len == 0) base_len = strlen(fallback);
  char *buf = slapo_arena_alloc(g->arena, base_len + SUFFIX_ROOM, 1);
  if (!buf) return slapo_error(SLAPO_NOMEM, "%s: out of memory naming the node", what);
  if (len == 0) {
    memcpy(buf, fallback, base_len);
  } else {
    size_t j = 0;
    if (digit) buf[j++] = '_';
    for (size_t i = 0; i < len; i++) buf[j++] = is_ident_char(hint[i]) ? hint[i] : '_';
  }
  buf[base_len] = '\0';
  *name = buf;
  *counter = NULL;
  *next_suffix = 0;
  if (!slapo_map_has(g->names, buf)) return SLAPO_OK;

  /* Taken: continue from the last suffix handed out for this base, so that
   * naming k nodes of one op costs O(k), not O(k^2). */
  int *c = slapo_map_get(g->bases, buf);
  if (!c) {
    c = slapo_arena_alloc(g->arena, sizeof *c, 0);
    if (!c) return slapo_error(SLAPO_NOMEM, "%s: out of memory naming the node", what);
    *c = 1;
    if (slapo_map_set(g->bases, buf, c) != SLAPO_OK)
      return slapo_error(SLAPO_NOMEM, "%s: out of memory naming the node", what);
  }
  int k = *c;
  for (;; k++) {
    if (k == INT32_MAX)
      return slapo_error(SLAPO_LIMIT, "%s: no free name with base \"%.*s\"", what,
                         (int)base_len, buf);
    snprintf(buf + base_len, SUFFIX_ROOM, "_%d", k);
    if (!slapo_map_has(g->names, buf)) break;
  }
  *counter = c;
  *next_suffix = k + 1;
  return SLAPO_OK;
}

/* Checks the insertion point and returns the node to link before (NULL:
 * at the end). */
static slapo_status resolve_position(slapo_graph *g, const char *what, slapo_node_kind kind,
                                     slapo_node **pos) {
  *pos = NULL;
  if (kind == SLAPO_NODE_OUTPUT) return SLAPO_OK; /* the output always goes last */
  switch (g->ins_mode) {
  case SLAPO__INS_END:
    *pos = g->output;
    return SLAPO_OK;
  case SLAPO__INS_BEFORE:
    if (!slapo__ir_in_graph(g, g->ins_node))
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: the insertion point (before %%%s) is not a node of this graph",
                         what, g->ins_node->name ? g->ins_node->name : "?");
    *pos = g->ins_node;
    return SLAPO_OK;
  case SLAPO__INS_AFTER:
    if (!slapo__ir_in_graph(g, g->ins_node))
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: the insertion point (after %%%s) is not a node of this graph",
                         what, g->ins_node && g->ins_node->name ? g->ins_node->name : "?");
    if (g->ins_node->kind == SLAPO_NODE_OUTPUT)
      return slapo_error(SLAPO_STATE,
                         "%s: the insertion point is after the output node %%%s; the output "
                         "must stay last (insert before it instead)",
                         what, g->ins_node->name);
    *pos = g->ins_node->next;
    return SLAPO_OK;
  }
  SLAPO_ASSERT(!"bad insertion mode");
  return SLAPO_STATE;
}

static slapo_status check_inputs(slapo_graph *g, const char *what, int n_inputs,
                                 slapo_node *const *inputs) {
  if (n_inputs < 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: n_inputs is %d; it must be >= 0", what, n_inputs);
  if (n_inputs > 0 && !inputs)
    return slapo_error(SLAPO_INVALID_ARG, "%s: inputs is NULL with n_inputs %d", what,
                       n_inputs);
  for (int i = 0; i < n_inputs; i++) {
    const slapo_node *v = inputs[i];
    if (!v) return slapo_error(SLAPO_INVALID_ARG, "%s: input %d is NULL", what, i);
    if (v->graph != g)
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: input %d (%%%s) is not a node of this graph (erased, or of "
                         "another graph)",
                         what, i, v->name ? v->name : "?");
    if (v->kind == SLAPO_NODE_OUTPUT)
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: input %d is the output node %%%s, which has no value to use",
                         what, i, v->name);
  }
  return SLAPO_OK;
}

/* Validates a shape given to a constructor or set_meta. */
static slapo_status check_meta(const char *what, slapo_dtype dt, int ndim,
                               const int64_t *shape) {
  if ((int)dt < 0 || dt >= SLAPO_DTYPE_COUNT)
    return slapo_error(SLAPO_INVALID_ARG, "%s: unknown dtype %d", what, (int)dt);
  if (ndim < 0 || ndim > SLAPO_MAX_DIMS)
    return slapo_error(SLAPO_INVALID_ARG, "%s: ndim %d is outside [0, %d]", what, ndim,
                       SLAPO_MAX_DIMS);
  if (ndim > 0 && !shape)
    return slapo_error(SLAPO_INVALID_ARG, "%s: shape is NULL with ndim %d", what, ndim);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0)
      return slapo_error(SLAPO_INVALID_ARG, "%s: dim %d is %lld; dims must be >= 0", what, d,
                         (long long)shape[d]);
  if (!slapo_shape_addressable(ndim, shape, slapo_dtype_size(dt))) {
    char buf[160];
    return slapo_error(SLAPO_SHAPE, "%s: %s%s is too large to address (its strides overflow "
                       "64 bits, zero dims counted as 1)", what, slapo_dtype_name(dt),
                       slapo_shape_str(ndim, shape, buf, sizeof buf));
  }
  return SLAPO_OK;
}

/* Everything a constructor needs besides the graph. */
typedef struct node_spec {
  const char *what; /* "call_op matmul", for messages */
  slapo_node_kind kind;
  const char *target; /* copied */
  const char *hint;   /* name base before sanitizing */
  int n_inputs;
  slapo_node *const *inputs;
  int n_attrs;
  const slapo_attr *attrs; /* copied */
  int item;
  bool has_meta;
  slapo_dtype dtype;
  int ndim;
  const int64_t *shape;
} node_spec;

/* Builds, names, links and registers a node. All allocation happens before
 * the first change that is visible, so an error leaves the graph as it was
 * (some arena bytes and spare user-array capacity aside). */
static slapo_status add_node(slapo_graph *g, const node_spec *sp, slapo_node **out) {
  if (out) *out = NULL;
  slapo_node *pos;
  SLAPO_TRY(check_inputs(g, sp->what, sp->n_inputs, sp->inputs));
  if (sp->has_meta) SLAPO_TRY(check_meta(sp->what, sp->dtype, sp->ndim, sp->shape));
  SLAPO_TRY(resolve_position(g, sp->what, sp->kind, &pos));

  char *name = NULL;
  int *counter = NULL;
  int next_suffix = 0;
  SLAPO_TRY(make_name(g, sp->what, sp->hint, &name, &counter, &next_suffix));

  slapo_node *n = slapo_arena_alloc(g->arena, sizeof *n, 0);
  char *target = slapo_arena_strdup(g->arena, sp->target);
  slapo_node **inputs = NULL;
  if (n && sp->n_inputs > 0)
    inputs = slapo_arena_alloc(g->arena, (size_t)sp->n_inputs * sizeof *inputs, 0);
  if (!n || !target || (sp->n_inputs > 0 && !inputs))
    return slapo_error(SLAPO_NOMEM, "%s: out of memory allocating the node", sp->what);
  slapo_attr *attrs = NULL;
  SLAPO_TRY(slapo__ir_attrs_copy(g->arena, sp->what, sp->n_attrs, sp->attrs, &attrs));

  /* Room in each input's user list for every use this node makes of it. */
  for (int i = 0; i < sp->n_inputs; i++) {
    int uses = 0;
    for (int j = 0; j < sp->n_inputs; j++) uses += sp->inputs[j] == sp->inputs[i];
    SLAPO_TRY(slapo__ir_users_reserve(sp->inputs[i], uses));
  }
  if (slapo_map_set(g->names, name, n) != SLAPO_OK)
    return slapo_error(SLAPO_NOMEM, "%s: out of memory registering the name %s", sp->what,
                       name);

  /* Commit: nothing below fails. */
  if (counter) *counter = next_suffix;
  n->kind = sp->kind;
  n->name = name;
  n->target = target;
  n->n_inputs = sp->n_inputs;
  n->inputs = inputs;
  n->n_attrs = sp->n_attrs;
  n->attrs = attrs;
  n->item = sp->item;
  n->dtype = SLAPO_DTYPE_F32;
  if (sp->has_meta) {
    n->dtype = sp->dtype;
    n->ndim = sp->ndim;
    for (int d = 0; d < sp->ndim; d++) n->shape[d] = sp->shape[d];
  }
  n->origin = "";
  n->graph = g;
  for (int i = 0; i < sp->n_inputs; i++) {
    inputs[i] = sp->inputs[i];
    slapo__ir_users_push(inputs[i], n);
  }
  slapo__ir_link_before(g, n, pos);
  if (sp->kind == SLAPO_NODE_OUTPUT) g->output = n;
  if (sp->kind != SLAPO_NODE_OUTPUT && g->ins_mode == SLAPO__INS_AFTER) g->ins_node = n;
  if (out) *out = n;
  return SLAPO_OK;
}

slapo_status slapo_graph_add_placeholder(slapo_graph *g, const char *name, slapo_dtype dt,
                                         int ndim, const int64_t *shape, slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "placeholder: graph is NULL");
  if (!name || !*name)
    return slapo_error(SLAPO_INVALID_ARG, "placeholder: name is NULL or empty");
  char what[96];
  snprintf(what, sizeof what, "placeholder %s", name);
  node_spec sp = {.what = what, .kind = SLAPO_NODE_PLACEHOLDER, .target = name, .hint = name,
                  .has_meta = true, .dtype = dt, .ndim = ndim, .shape = shape};
  return add_node(g, &sp, out);
}

slapo_status slapo_graph_add_param(slapo_graph *g, const char *path, slapo_dtype dt, int ndim,
                                   const int64_t *shape, slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "param: graph is NULL");
  if (!path || !*path) return slapo_error(SLAPO_INVALID_ARG, "param: path is NULL or empty");
  char what[160];
  snprintf(what, sizeof what, "param %s", path);
  node_spec sp = {.what = what, .kind = SLAPO_NODE_PARAM, .target = path, .hint = path,
                  .has_meta = true, .dtype = dt, .ndim = ndim, .shape = shape};
  return add_node(g, &sp, out);
}

slapo_status slapo_graph_add_call_op(slapo_graph *g, const char *op_name,
                                     const struct slapo_op *op, int n_inputs,
                                     slapo_node *const *inputs, int n_attrs,
                                     const slapo_attr *attrs, slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "call_op: graph is NULL");
  if (!op_name || !*op_name)
    return slapo_error(SLAPO_INVALID_ARG, "call_op: op name is NULL or empty");
  char what[96];
  snprintf(what, sizeof what, "call_op %s", op_name);
  if (n_attrs < 0)
    return slapo_error(SLAPO_INVALID_ARG, "%s: n_attrs is %d; it must be >= 0", what, n_attrs);
  if (n_attrs > 0 && !attrs)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attrs is NULL with n_attrs %d", what, n_attrs);
  node_spec sp = {.what = what, .kind = SLAPO_NODE_CALL_OP, .target = op_name,
                  .hint = op_name, .n_inputs = n_inputs, .inputs = inputs,
                  .n_attrs = n_attrs, .attrs = attrs};
  slapo_node *n;
  SLAPO_TRY(add_node(g, &sp, &n));
  n->op = op;
  if (out) *out = n;
  return SLAPO_OK;
}

slapo_status slapo_graph_add_call_module(slapo_graph *g, const char *path, int n_inputs,
                                         slapo_node *const *inputs, slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "call_module: graph is NULL");
  if (!path) return slapo_error(SLAPO_INVALID_ARG, "call_module: path is NULL");
  char what[160];
  snprintf(what, sizeof what, "call_module %s", path);
  node_spec sp = {.what = what, .kind = SLAPO_NODE_CALL_MODULE, .target = path, .hint = path,
                  .n_inputs = n_inputs, .inputs = inputs};
  return add_node(g, &sp, out);
}

slapo_status slapo_graph_add_getitem(slapo_graph *g, slapo_node *src, int item,
                                     slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "getitem: graph is NULL");
  if (!src) return slapo_error(SLAPO_INVALID_ARG, "getitem: source node is NULL");
  if (item < 0) return slapo_error(SLAPO_INVALID_ARG, "getitem: item %d is negative", item);
  if (src->graph == g && src->n_results <= item) {
    if (src->n_results == 0)
      return slapo_error(SLAPO_INVALID_ARG,
                         "getitem: %%%s is not a tuple (n_results 0); getitem reads one "
                         "result of a multi-result node",
                         src->name);
    return slapo_error(SLAPO_INVALID_ARG, "getitem: item %d of %%%s is out of range (%d results)",
                       item, src->name, src->n_results);
  }
  slapo_node *inputs[1] = {src};
  node_spec sp = {.what = "getitem", .kind = SLAPO_NODE_GETITEM, .target = "getitem",
                  .hint = "getitem", .n_inputs = 1, .inputs = inputs, .item = item};
  return add_node(g, &sp, out);
}

slapo_status slapo_graph_add_output(slapo_graph *g, int n_inputs, slapo_node *const *inputs,
                                    slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "output: graph is NULL");
  if (g->output)
    return slapo_error(SLAPO_INVALID_ARG,
                       "output: the graph already has an output node %%%s; a graph has at "
                       "most one (change its inputs with slapo_node_set_input)",
                       g->output->name);
  node_spec sp = {.what = "output", .kind = SLAPO_NODE_OUTPUT, .target = "output",
                  .hint = "output", .n_inputs = n_inputs, .inputs = inputs};
  return add_node(g, &sp, out);
}

slapo_status slapo_graph_add_tuple(slapo_graph *g, int n_inputs, slapo_node *const *inputs,
                                   slapo_node **out) {
  if (out) *out = NULL;
  if (!g) return slapo_error(SLAPO_INVALID_ARG, "tuple: graph is NULL");
  if (n_inputs < 1 || !inputs)
    return slapo_error(SLAPO_INVALID_ARG, "tuple: needs at least one value, got %d", n_inputs);
  for (int i = 0; i < n_inputs; i++)
    if (inputs[i] && inputs[i]->kind == SLAPO_NODE_TUPLE)
      return slapo_error(SLAPO_INVALID_ARG, "tuple: value %d (%%%s) is a tuple itself; tuples "
                         "do not nest (pass its items)", i, inputs[i]->name);
  const slapo_node *m = inputs[0];
  node_spec sp = {.what = "tuple", .kind = SLAPO_NODE_TUPLE, .target = "tuple", .hint = "tuple",
                  .n_inputs = n_inputs, .inputs = inputs, .has_meta = m != NULL,
                  .dtype = m ? m->dtype : SLAPO_DTYPE_F32, .ndim = m ? m->ndim : 0,
                  .shape = m ? m->shape : NULL};
  slapo_node *n;
  SLAPO_TRY(add_node(g, &sp, &n));
  n->n_results = n_inputs;
  if (out) *out = n;
  return SLAPO_OK;
}

/* ------------------------------------------------------------------------ */
/* Metadata                                                                  */
/* ------------------------------------------------------------------------ */

static slapo_status check_live(const slapo_node *n, const char *what) {
  if (!n) return slapo_error(SLAPO_INVALID_ARG, "%s: node is NULL", what);
  if (!n->graph) return slapo_error(SLAPO_INVALID_ARG, "%s: %%%s was erased", what, n->name);
  return SLAPO_OK;
}

slapo_status slapo_node_set_meta(slapo_node *n, slapo_dtype dt, int ndim,
                                 const int64_t *shape) {
  SLAPO_TRY(check_live(n, "set_meta"));
  char what[96];
  snprintf(what, sizeof what, "set_meta %%%s", n->name);
  SLAPO_TRY(check_meta(what, dt, ndim, shape));
  n->dtype = dt;
  n->ndim = ndim;
  for (int d = 0; d < SLAPO_MAX_DIMS; d++) n->shape[d] = d < ndim ? shape[d] : 0;
  return SLAPO_OK;
}

slapo_status slapo_node_set_origin(slapo_node *n, const char *path, int op_seq) {
  SLAPO_TRY(check_live(n, "set_origin"));
  if (!path) return slapo_error(SLAPO_INVALID_ARG, "set_origin %%%s: path is NULL", n->name);
  const char *copy = "";
  if (*path) {
    copy = slapo_arena_strdup(n->graph->arena, path);
    if (!copy)
      return slapo_error(SLAPO_NOMEM, "set_origin %%%s: out of memory copying the path",
                         n->name);
  }
  n->origin = copy;
  n->op_seq = op_seq;
  return SLAPO_OK;
}

slapo_status slapo_node_set_n_results(slapo_node *n, int n_results) {
  SLAPO_TRY(check_live(n, "set_n_results"));
  if (n->kind == SLAPO_NODE_OUTPUT) {
    if (n_results != 0 && n_results != n->n_inputs)
      return slapo_error(SLAPO_INVALID_ARG, "set_n_results %%%s: an output node of %d values "
                         "returns them as a tuple (n_results %d) or as they are (0), not %d",
                         n->name, n->n_inputs, n->n_inputs, n_results);
    n->n_results = n_results;
    return SLAPO_OK;
  }
  if (n->kind != SLAPO_NODE_CALL_OP && n->kind != SLAPO_NODE_CALL_MODULE)
    return slapo_error(SLAPO_INVALID_ARG,
                       "set_n_results %%%s: a %s node has one value; only call_op and "
                       "call_module nodes can be multi-result",
                       n->name, slapo_node_kind_name(n->kind));
  if (n_results < 0)
    return slapo_error(SLAPO_INVALID_ARG, "set_n_results %%%s: n_results %d is negative",
                       n->name, n_results);
  for (int i = 0; i < n->n_users; i++) {
    const slapo_node *u = n->users[i];
    if (u->kind == SLAPO_NODE_GETITEM && u->item >= n_results)
      return slapo_error(SLAPO_STATE,
                         "set_n_results %%%s: getitem %%%s reads item %d, which %d results "
                         "would not have; erase it first",
                         n->name, u->name, u->item, n_results);
  }
  n->n_results = n_results;
  return SLAPO_OK;
}
