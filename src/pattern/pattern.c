/* pattern/pattern.c - building pattern graphs (from pattern functions,
 * traced shapelessly; helpers the text parser shares), module patterns, and
 * the registry of named patterns. Layer: pattern. */
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "pattern/internal.h"

slapo_status slapo__pattern_new(const char *name, slapo_pattern **out) {
  *out = NULL;
  slapo_pattern *p = slapo_calloc(1, sizeof *p);
  if (!p || !(p->name = slapo_strdup(name)) || slapo_graph_new(&p->g) != SLAPO_OK) {
    slapo_pattern_free(p);
    return slapo_error(SLAPO_NOMEM, "pattern: out of memory");
  }
  *out = p;
  return SLAPO_OK;
}

void slapo_pattern_free(slapo_pattern *p) {
  if (!p) return;
  slapo_graph_free(p->g);
  slapo_free(p->inputs);
  slapo_free(p->outputs);
  slapo_free(p->any);
  slapo_free(p->name);
  slapo_free(p);
}

slapo_status slapo__pattern_mark_any(slapo_pattern *p, slapo_node *n) {
  slapo_node **a = slapo_realloc(p->any, (size_t)(p->n_any + 1) * sizeof *a);
  if (!a) return slapo_error(SLAPO_NOMEM, "pattern: out of memory");
  p->any = a;
  p->any[p->n_any++] = n;
  return SLAPO_OK;
}

bool slapo_pattern_any_inputs(const slapo_pattern *p, const slapo_node *n) {
  for (int i = 0; i < p->n_any; i++)
    if (p->any[i] == n) return true;
  return false;
}

slapo_status slapo__pattern_literal(slapo_pattern *p, double v, slapo_node **out) {
  slapo_attr a = slapo_attr_float("value", v);
  return slapo_graph_add_call_op(p->g, SLAPO__PATTERN_LITERAL, NULL, 0, NULL, 1, &a, out);
}

bool slapo__pattern_is_literal(const slapo_node *n, double *v) {
  if (n->kind != SLAPO_NODE_CALL_OP || n->op || strcmp(n->target, SLAPO__PATTERN_LITERAL))
    return false;
  if (v) *v = slapo_node_attr_float(n, "value", 0);
  return true;
}

slapo_status slapo__pattern_finish(slapo_pattern *p, int n, slapo_node *const *outs) {
  if (n < 1) return slapo_error(SLAPO_INVALID_ARG, "pattern '%s' has no result", p->name);
  for (int i = 0; i < n; i++)
    if (outs[i]->kind == SLAPO_NODE_PLACEHOLDER || slapo__pattern_is_literal(outs[i], NULL))
      return slapo_error(SLAPO_INVALID_ARG, "pattern '%s': result %d is a bare %s; a result "
                         "must be an op or module call", p->name, i + 1,
                         outs[i]->kind == SLAPO_NODE_PLACEHOLDER ? "wildcard" : "number");
  p->outputs = slapo_calloc((size_t)n, sizeof *p->outputs);
  if (!p->outputs) return slapo_error(SLAPO_NOMEM, "pattern: out of memory");
  for (int i = 0; i < n; i++) p->outputs[i] = outs[i];
  p->n_outputs = n;
  SLAPO_TRY(slapo_graph_add_output(p->g, n, outs, NULL));
  slapo_graph_dce(p->g);
  int n_ph = 0;
  for (slapo_node *x = slapo_graph_first(p->g); x; x = x->next)
    n_ph += x->kind == SLAPO_NODE_PLACEHOLDER;
  p->inputs = slapo_calloc((size_t)(n_ph ? n_ph : 1), sizeof *p->inputs);
  if (!p->inputs) return slapo_error(SLAPO_NOMEM, "pattern: out of memory");
  for (slapo_node *x = slapo_graph_first(p->g); x; x = x->next) {
    if (x->kind != SLAPO_NODE_PLACEHOLDER) continue;
    if (x->n_users == 0)
      return slapo_error(SLAPO_INVALID_ARG,
                         "pattern '%s': input '%s' is not used by any result; a wildcard "
                         "must constrain the match",
                         p->name, x->target);
    p->inputs[p->n_inputs++] = x;
  }
  /* Uncalled module patterns the results do not reach are gone with DCE. */
  int k = 0;
  for (int i = 0; i < p->n_any; i++)
    if (p->any[i]->graph) p->any[k++] = p->any[i];
  p->n_any = k;
  slapo_graph_renumber(p->g);
  return SLAPO_OK;
}

/* ---- pattern functions ---- */

slapo_node *slapo_pattern_module(slapo_ctx *ctx, const char *regex, int n_in,
                                 slapo_node *const *in) {
  if (slapo_ctx_status(ctx) != SLAPO_OK) return NULL;
  slapo_pattern *p = slapo_ctx_user(ctx);
  if (!p || !slapo_ctx_shapeless(ctx)) {
    slapo_ctx_fail(ctx, SLAPO_STATE, "slapo_pattern_module('%s') outside a pattern function",
                   regex ? regex : "(null)");
    return NULL;
  }
  regex_t re;
  if (!regex) {
    slapo_ctx_fail(ctx, SLAPO_PARSE, "module pattern: NULL regex");
    return NULL;
  }
  if (slapo__regex_compile(regex, &re, "module pattern") != SLAPO_OK) {
    slapo_ctx_fail(ctx, SLAPO_PARSE, "%s", slapo_last_error());
    return NULL;
  }
  regfree(&re);
  slapo_node *n = NULL;
  slapo_status s = slapo_graph_add_call_module(slapo_ctx_graph(ctx), regex, n_in < 0 ? 0 : n_in,
                                               in, &n);
  if (s == SLAPO_OK && n_in < 0) s = slapo__pattern_mark_any(p, n);
  if (s != SLAPO_OK) {
    slapo_ctx_fail(ctx, s, "%s", slapo_last_error());
    return NULL;
  }
  return n;
}

/* Random ops' streams come from the tracing ctx; a pattern never compares
 * them, so they are removed rather than left to mislead a reader. */
static void drop_streams(slapo_graph *g) {
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    int k = 0;
    for (int i = 0; i < n->n_attrs; i++)
      if (strcmp(n->attrs[i].key, "stream")) n->attrs[k++] = n->attrs[i];
    n->n_attrs = k;
  }
}

slapo_status slapo_pattern_from_fn(const char *name, int n_inputs, const char *const *input_names,
                                   slapo_pattern_fn fn, void *ud, slapo_pattern **out) {
  *out = NULL;
  if (!fn || !name || n_inputs < 0 || n_inputs > 16)
    return slapo_error(SLAPO_INVALID_ARG, "pattern_from_fn: need a name, a function and 0..16 "
                                          "inputs (got %d)", n_inputs);
  slapo_pattern *p;
  SLAPO_TRY(slapo__pattern_new(name, &p));
  slapo_ctx *ctx = NULL;
  slapo_status s = slapo_ctx_new(p->g, &ctx);
  slapo_node *in[16];
  if (s == SLAPO_OK) {
    slapo_ctx_set_shapeless(ctx, true);
    slapo_ctx_set_user(ctx, p);
    for (int i = 0; i < n_inputs; i++) {
      char def[16];
      snprintf(def, sizeof def, "x%d", i);
      in[i] = slapo_input(ctx, input_names && input_names[i] ? input_names[i] : def,
                          SLAPO_DTYPE_F32, 0, NULL);
    }
    slapo_node *y = slapo_ctx_status(ctx) == SLAPO_OK ? fn(ctx, in, ud) : NULL;
    s = slapo_ctx_status(ctx);
    if (s == SLAPO_OK && !y)
      s = slapo_error(SLAPO_INVALID_ARG, "pattern '%s': the function returned no result", name);
    if (s == SLAPO_OK) {
      drop_streams(p->g);
      if (y->kind == SLAPO_NODE_OUTPUT || y->kind == SLAPO_NODE_TUPLE) {
        /* Several results: take them over into the pattern's own output. */
        int n = y->n_inputs;
        slapo_node *outs[16];
        for (int i = 0; i < n && i < 16; i++) outs[i] = y->inputs[i];
        for (int i = 0; i < n; i++) slapo_node_set_input(y, i, y->inputs[0]);
        slapo_graph_erase(p->g, y);
        s = slapo__pattern_finish(p, n < 16 ? n : 16, outs);
      } else {
        s = slapo__pattern_finish(p, 1, &y);
      }
    }
  }
  if (s != SLAPO_OK && s != SLAPO_NOMEM && ctx && slapo_ctx_status(ctx) != SLAPO_OK)
    s = slapo_error(s, "pattern '%s': %s", name, slapo_ctx_message(ctx));
  slapo_ctx_free(ctx);
  if (s != SLAPO_OK) {
    slapo_pattern_free(p);
    return s;
  }
  *out = p;
  return SLAPO_OK;
}

/* Copies node n of p into q, its inputs read from map (by id). */
static slapo_status clone_node(const slapo_pattern *p, slapo_pattern *q, const slapo_node *n,
                               slapo_node **map) {
  slapo_node *in[64], *c = NULL;
  if (n->n_inputs > 64) return slapo_error(SLAPO_LIMIT, "pattern: node with > 64 inputs");
  for (int i = 0; i < n->n_inputs; i++) in[i] = map[n->inputs[i]->id];
  slapo_status s;
  switch (n->kind) {
  case SLAPO_NODE_PLACEHOLDER:
    s = slapo_graph_add_placeholder(q->g, n->target, n->dtype, 0, NULL, &c);
    break;
  case SLAPO_NODE_CALL_MODULE:
    s = slapo_graph_add_call_module(q->g, n->target, n->n_inputs, in, &c);
    if (s == SLAPO_OK && slapo_pattern_any_inputs(p, n)) s = slapo__pattern_mark_any(q, c);
    break;
  case SLAPO_NODE_CALL_OP:
    s = slapo_graph_add_call_op(q->g, n->target, n->op, n->n_inputs, in, n->n_attrs, n->attrs,
                                &c);
    break;
  default: return SLAPO_OK; /* the output node is rebuilt by finish */
  }
  map[n->id] = c;
  return s;
}

slapo_status slapo_pattern_clone(const slapo_pattern *p, slapo_pattern **out) {
  *out = NULL;
  slapo_pattern *q;
  SLAPO_TRY(slapo__pattern_new(p->name, &q));
  slapo_graph_renumber(p->g);
  slapo_node **map = slapo_calloc((size_t)slapo_graph_count(p->g) + 1, sizeof *map);
  slapo_node *outs[64];
  slapo_status s = map ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "pattern: out of memory");
  for (slapo_node *n = slapo_graph_first(p->g); s == SLAPO_OK && n; n = n->next)
    s = clone_node(p, q, n, map);
  for (int i = 0; s == SLAPO_OK && i < p->n_outputs && i < 64; i++) outs[i] = map[p->outputs[i]->id];
  if (s == SLAPO_OK) s = slapo__pattern_finish(q, p->n_outputs < 64 ? p->n_outputs : 64, outs);
  slapo_free(map);
  if (s != SLAPO_OK) {
    slapo_pattern_free(q);
    return s;
  }
  q->text = p->text;
  *out = q;
  return SLAPO_OK;
}

const char *slapo_pattern_name(const slapo_pattern *p) { return p->name; }
bool slapo_pattern_is_text(const slapo_pattern *p) { return p->text; }
const slapo_graph *slapo_pattern_graph(const slapo_pattern *p) { return p->g; }
int slapo_pattern_n_inputs(const slapo_pattern *p) { return p->n_inputs; }
const char *slapo_pattern_input_name(const slapo_pattern *p, int i) {
  return i >= 0 && i < p->n_inputs ? p->inputs[i]->target : NULL;
}

/* ---- registry ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static slapo_pattern **g_pats;
static int g_n, g_cap;

slapo_status slapo_pattern_register(slapo_pattern *p) {
  if (!p) return slapo_error(SLAPO_INVALID_ARG, "pattern_register: NULL pattern");
  slapo_status s = SLAPO_OK;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n && s == SLAPO_OK; i++)
    if (!strcmp(g_pats[i]->name, p->name))
      s = slapo_error(SLAPO_INVALID_ARG, "a pattern named '%s' is already registered", p->name);
  if (s == SLAPO_OK && g_n == g_cap) {
    int cap = g_cap ? 2 * g_cap : 8;
    slapo_pattern **a = slapo_realloc(g_pats, (size_t)cap * sizeof *a);
    if (!a) s = slapo_error(SLAPO_NOMEM, "pattern registry: out of memory");
    else g_pats = a, g_cap = cap;
  }
  if (s == SLAPO_OK) g_pats[g_n++] = p;
  pthread_mutex_unlock(&g_lock);
  if (s != SLAPO_OK) slapo_pattern_free(p);
  return s;
}

const slapo_pattern *slapo_pattern_lookup(const char *name) {
  const slapo_pattern *p = NULL;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n && !p; i++)
    if (!strcmp(g_pats[i]->name, name)) p = g_pats[i];
  pthread_mutex_unlock(&g_lock);
  return p;
}

int slapo_pattern_registered_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_n;
  pthread_mutex_unlock(&g_lock);
  return n;
}

const slapo_pattern *slapo_pattern_registered_at(int i) {
  pthread_mutex_lock(&g_lock);
  const slapo_pattern *p = i >= 0 && i < g_n ? g_pats[i] : NULL;
  pthread_mutex_unlock(&g_lock);
  return p;
}

slapo_status slapo_pattern_resolve(const char *value, bool is_text, const slapo_pattern **out,
                                   bool *owned) {
  *out = NULL;
  *owned = false;
  if (is_text) {
    slapo_pattern *p;
    SLAPO_TRY(slapo_pattern_parse(value, &p));
    *out = p;
    *owned = true;
    return SLAPO_OK;
  }
  if ((*out = slapo_pattern_lookup(value))) return SLAPO_OK;
  char known[512] = "";
  int n = slapo_pattern_registered_count();
  for (int i = 0; i < n; i++) slapo_list_append(known, sizeof known, slapo_pattern_registered_at(i)->name);
  return slapo_error(SLAPO_NOT_FOUND,
                     "no pattern is registered as '%s' (registered: %s); a text pattern is "
                     "written in double quotes, pattern=\"add(relu(x), 1)\"",
                     value, n ? known : "none");
}
