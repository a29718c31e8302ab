/* ops/registry.c - the op registry: built-in descriptors from slapo/ops.def
 * (declared in slapo/ops.h) plus ops registered at run time (fused kernels,
 * collectives). Layer: ops. */
#include <pthread.h>
#include <string.h>

#include "ops/internal.h"

static const slapo_op *const k_builtin[] = {
#define SLAPO_OP(name) SLAPO_OP_DESC(name),
#include "slapo/ops.def"
#undef SLAPO_OP
    NULL};

#define N_BUILTIN ((int)(sizeof k_builtin / sizeof k_builtin[0]) - 1)

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const slapo_op **g_runtime;
static int g_n_runtime, g_cap_runtime;

static const slapo_op *find_locked(const char *name) {
  for (int i = 0; i < N_BUILTIN; i++)
    if (!strcmp(k_builtin[i]->name, name)) return k_builtin[i];
  for (int i = 0; i < g_n_runtime; i++)
    if (!strcmp(g_runtime[i]->name, name)) return g_runtime[i];
  return NULL;
}

const slapo_op *slapo_op_find(const char *name) {
  /* A linear scan over ~60 names costs less than a node allocation; built
   * graphs cache the descriptor pointer in the node. */
  pthread_mutex_lock(&g_lock);
  const slapo_op *op = find_locked(name);
  pthread_mutex_unlock(&g_lock);
  return op;
}

slapo_status slapo_op_register(const slapo_op *op) {
  if (!op || !op->name || !op->name[0])
    return slapo_error(SLAPO_INVALID_ARG, "op_register: op has no name");
  if (!op->infer || (!op->ref && !op->view))
    return slapo_error(SLAPO_INVALID_ARG, "op_register: op '%s' needs infer and a kernel",
                       op->name);
  pthread_mutex_lock(&g_lock);
  slapo_status s = SLAPO_OK;
  if (find_locked(op->name)) {
    s = slapo_error(SLAPO_INVALID_ARG, "op_register: an op named '%s' is already registered",
                    op->name);
  } else {
    if (g_n_runtime == g_cap_runtime) {
      int cap = g_cap_runtime ? 2 * g_cap_runtime : 16;
      const slapo_op **r = slapo_realloc(g_runtime, (size_t)cap * sizeof *r);
      if (!r) s = slapo_error(SLAPO_NOMEM, "op_register: out of memory");
      else g_runtime = r, g_cap_runtime = cap;
    }
    if (s == SLAPO_OK) g_runtime[g_n_runtime++] = op;
  }
  pthread_mutex_unlock(&g_lock);
  return s;
}

int slapo_op_count(void) {
  pthread_mutex_lock(&g_lock);
  int n = N_BUILTIN + g_n_runtime;
  pthread_mutex_unlock(&g_lock);
  return n;
}

const slapo_op *slapo_op_at(int i) {
  if (i < 0) return NULL;
  if (i < N_BUILTIN) return k_builtin[i];
  pthread_mutex_lock(&g_lock);
  const slapo_op *op = i - N_BUILTIN < g_n_runtime ? g_runtime[i - N_BUILTIN] : NULL;
  pthread_mutex_unlock(&g_lock);
  return op;
}
