/* primitives/registry.c - the primitive table (primitives.def), applying a
 * schedule-file entry, the registry of replacement modules, and the log
 * helper every primitive uses. Layer: primitives. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"

#define SLAPO_PRIMITIVE(name) extern const slapo_primitive slapo__prim_##name;
#include "primitives/primitives.def"
#undef SLAPO_PRIMITIVE

static const slapo_primitive *const k_prims[] = {
#define SLAPO_PRIMITIVE(name) &slapo__prim_##name,
#include "primitives/primitives.def"
#undef SLAPO_PRIMITIVE
};

#define N_PRIMS ((int)(sizeof k_prims / sizeof k_prims[0]))

const slapo_primitive *slapo_primitive_find(const char *name) {
  for (int i = 0; i < N_PRIMS; i++)
    if (!strcmp(k_prims[i]->name, name)) return k_prims[i];
  return NULL;
}

int slapo_primitive_count(void) { return N_PRIMS; }
const slapo_primitive *slapo_primitive_at(int i) { return i >= 0 && i < N_PRIMS ? k_prims[i] : NULL; }

slapo_status slapo_primitive_apply(slapo_sched *node, const slapo_sched_entry *e) {
  const slapo_primitive *p = slapo_primitive_find(e->primitive);
  slapo_status s;
  if (!p) {
    char known[256] = "";
    for (int i = 0; i < N_PRIMS; i++) slapo_list_append(known, sizeof known, k_prims[i]->name);
    s = slapo_error(SLAPO_NOT_FOUND, "unknown primitive '%s' (known: %s)", e->primitive, known);
  } else {
    s = p->apply(node, e);
  }
  if (s != SLAPO_OK && e->file) {
    char msg[1024], loc[512];
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    snprintf(loc, sizeof loc, "%s:%d: ", e->file, e->line);
    /* Argument getters already start their messages with the location. */
    if (strncmp(msg, loc, strlen(loc))) slapo_error(s, "%s%s", loc, msg);
  }
  return s;
}

const char *slapo__prim_path(const slapo_sched *node) {
  const char *p = slapo_sched_path(node);
  return p[0] ? p : ".";
}

slapo_status slapo__prim_param(slapo_sched *node, const char *primitive, const char *name,
                               slapo_parameter **out) {
  slapo_module *m = slapo_sched_module(node);
  if ((*out = slapo_module_param(m, name))) return SLAPO_OK;
  char known[256] = "";
  for (int i = 0; i < m->n_params; i++) slapo_list_append(known, sizeof known, m->param_names[i]);
  return slapo_error(SLAPO_NOT_FOUND, "%s: %s (a %s) has no parameter '%s'; its parameters: %s",
                     primitive, slapo__prim_path(node), m->type->name, name,
                     known[0] ? known : "(none)");
}

static slapo_status log_append_to(slapo_sched_log *log, slapo_sched *node, const char *primitive,
                                  int n_args, const slapo_sched_arg *args,
                                  const slapo_sched_entry *from, bool replayable) {
  slapo_sched_entry e = {
      .path = slapo__prim_path(node),
      .primitive = primitive,
      .n_args = n_args,
      .args = args,
      .file = from ? from->file : NULL,
      .line = from ? from->line : 0,
      .replayable = replayable,
  };
  return slapo_sched_log_append(log, &e);
}

slapo_status slapo__prim_log(slapo_sched *node, const char *primitive, int n_args,
                             const slapo_sched_arg *args, const slapo_sched_entry *from,
                             bool replayable) {
  return log_append_to(slapo_sched_log_of(node), node, primitive, n_args, args, from, replayable);
}

slapo_status slapo__prim_log_check(slapo_sched *node, const char *primitive, int n_args,
                                   const slapo_sched_arg *args) {
  slapo_sched_log *scratch;
  SLAPO_TRY(slapo_sched_log_new(&scratch));
  slapo_status s = log_append_to(scratch, node, primitive, n_args, args, NULL, true);
  slapo_sched_log_free(scratch);
  if (s == SLAPO_INVALID_ARG) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", slapo_last_error());
    s = slapo_error(s, "%s: %s: the request cannot be logged as a .sched line: %s", primitive,
                    slapo__prim_path(node), msg);
  }
  return s;
}

/* What a primitive on a module inside a flattened trace should do instead. */
typedef enum advice { BEFORE_OR_PATTERN, BEFORE, ON_OWNER } advice;

/* SLAPO_STATE for node inside the flattened trace of `owner`, lying there
 * `how` (inlined into it, or a module call in it), with the advice. */
static slapo_status in_trace(slapo_sched *node, const char *primitive, const slapo_module *owner,
                             const char *how, advice a) {
  char *op = slapo_module_path(owner);
  const char *o = op && op[0] ? op : ".";
  char what[1400];
  if (a == ON_OWNER)
    snprintf(what, sizeof what, "apply %s to %s, whose graph holds its ops", primitive, o);
  else
    snprintf(what, sizeof what, "apply %s before that trace line%s", primitive,
             a == BEFORE ? ": its graph and edits keep the module as it was"
                         : ", or edit the graph with a pattern (replace or checkpoint pattern=...)");
  slapo_status s = slapo_error(SLAPO_STATE, "%s: %s is %s the flattened trace of %s; %s",
                               primitive, slapo__prim_path(node), how, o, what);
  slapo_free(op);
  return s;
}

slapo_status slapo__prim_not_inlined(slapo_sched *node, const char *primitive) {
  slapo_module *owner = slapo_module_inlined_by(slapo_sched_module(node));
  return owner ? in_trace(node, primitive, owner, "inlined into", BEFORE_OR_PATTERN) : SLAPO_OK;
}

slapo_status slapo__prim_graph_not_inlined(slapo_sched *node, const char *primitive) {
  slapo_module *owner = slapo_module_inlined_by(slapo_sched_module(node));
  return owner ? in_trace(node, primitive, owner, "inlined into", ON_OWNER) : SLAPO_OK;
}

slapo_status slapo__prim_not_in_trace(slapo_sched *node, const char *primitive) {
  SLAPO_TRY(slapo__prim_not_inlined(node, primitive));
  slapo_module *owner = slapo_module_flattened_by(slapo_sched_module(node));
  return owner ? in_trace(node, primitive, owner, "a module call in", BEFORE) : SLAPO_OK;
}

/* The registered replacement modules' names, "A, B", into buf ("none" when
 * there are none); truncated to cap. */
static void registered_text(char *buf, size_t cap) {
  int n = slapo_module_registered_count();
  buf[0] = '\0';
  for (int i = 0; i < n; i++) slapo_list_append(buf, cap, slapo_module_registered_name(i));
  if (n == 0) snprintf(buf, cap, "none");
}

slapo_status slapo__prim_unregistered(const char *primitive, const char *path,
                                      const char *name) {
  for (int i = 0; i < slapo_subgraph_registered_count(); i++)
    if (!strcmp(slapo_subgraph_registered_name(i), name))
      return slapo_error(SLAPO_NOT_FOUND,
                         "%s: %s: '%s' is a subgraph module: it replaces the matches of a "
                         "pattern in a traced module (<traced path> replace %s pattern=P), not "
                         "a module",
                         primitive, path, name, name);
  char known[256];
  registered_text(known, sizeof known);
  return slapo_error(SLAPO_NOT_FOUND, "%s: %s: no module is registered as '%s' (registered: %s)",
                     primitive, path, name, known);
}

/* ---- replacement modules ---- */

typedef struct reg_module {
  const char *name, *summary;
  slapo_module_factory factory;
} reg_module;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_module *g_mods;
static int g_n, g_cap;

slapo_status slapo_module_register(const char *name, const char *summary,
                                   slapo_module_factory factory) {
  slapo_status s = SLAPO_OK;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n && s == SLAPO_OK; i++)
    if (!strcmp(g_mods[i].name, name))
      s = g_mods[i].factory == factory
              ? SLAPO_OK /* registering the same factory twice is harmless */
              : slapo_error(SLAPO_INVALID_ARG, "a module named '%s' is already registered", name);
  bool present = false;
  for (int i = 0; i < g_n; i++) present |= !strcmp(g_mods[i].name, name);
  if (s == SLAPO_OK && !present) {
    if (g_n == g_cap) {
      int cap = g_cap ? 2 * g_cap : 8;
      reg_module *m = slapo_realloc(g_mods, (size_t)cap * sizeof *m);
      if (!m) s = slapo_error(SLAPO_NOMEM, "module registry: out of memory");
      else g_mods = m, g_cap = cap;
    }
    if (s == SLAPO_OK) g_mods[g_n++] = (reg_module){name, summary, factory};
  }
  pthread_mutex_unlock(&g_lock);
  return s;
}

slapo_module_factory slapo_module_factory_find(const char *name) {
  slapo_module_factory f = NULL;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_n; i++)
    if (!strcmp(g_mods[i].name, name)) f = g_mods[i].factory;
  pthread_mutex_unlock(&g_lock);
  return f;
}

int slapo_module_registered_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = g_n;
  pthread_mutex_unlock(&g_lock);
  return n;
}

const char *slapo_module_registered_name(int i) {
  pthread_mutex_lock(&g_lock);
  const char *s = i >= 0 && i < g_n ? g_mods[i].name : NULL;
  pthread_mutex_unlock(&g_lock);
  return s;
}

const char *slapo_module_registered_summary(int i) {
  pthread_mutex_lock(&g_lock);
  const char *s = i >= 0 && i < g_n ? g_mods[i].summary : NULL;
  pthread_mutex_unlock(&g_lock);
  return s;
}
