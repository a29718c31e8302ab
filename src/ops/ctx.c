/* ops/ctx.c - the graph-building context: target graph, sticky error, the
 * origin-path stack with each frame's call ordinal, per-path op counters
 * (op_seq) and per-call random-op counters (which key the RNG streams of
 * random ops, DESIGN.md §3). Layer: ops. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/ops.h"

struct slapo_ctx {
  slapo_graph *g;
  slapo_status status;
  char message[1024];
  char **origins; /* stack of owned paths; origins[0] = "" */
  int *calls;     /* call ordinal of each frame (parallel to origins) */
  int n_origins, cap_origins;
  slapo_map *op_counts;   /* path -> (intptr_t) next op_seq + 1 */
  slapo_map *call_counts; /* path -> (intptr_t) module calls so far + 1 */
  slapo_map *rand_counts; /* "path#call" -> (intptr_t) random ops drawn + 1 */
  int region, n_regions; /* current checkpoint region; regions handed out */
  bool shapeless;        /* skip shape inference (pattern graphs) */
  bool copy_rng;         /* slapo_ctx_set_copy_rng: random ops copy shard attrs */
  slapo_autocast autocast; /* slapo_ctx_set_autocast: GEMM operands' precision */
  void *user;
};

slapo_status slapo_ctx_new(slapo_graph *g, slapo_ctx **out) {
  *out = NULL;
  slapo_ctx *c = slapo_calloc(1, sizeof *c);
  if (!c) return slapo_error(SLAPO_NOMEM, "ctx: out of memory");
  c->g = g;
  if (slapo_map_new(&c->op_counts) != SLAPO_OK || slapo_map_new(&c->call_counts) != SLAPO_OK ||
      slapo_map_new(&c->rand_counts) != SLAPO_OK) {
    slapo_ctx_free(c);
    return SLAPO_NOMEM;
  }
  if (slapo_ctx_push_origin(c, "") != SLAPO_OK) {
    slapo_ctx_free(c);
    return SLAPO_NOMEM;
  }
  *out = c;
  return SLAPO_OK;
}

void slapo_ctx_free(slapo_ctx *c) {
  if (!c) return;
  for (int i = 0; i < c->n_origins; i++) slapo_free(c->origins[i]);
  slapo_free(c->origins);
  slapo_free(c->calls);
  slapo_map_free(c->op_counts);
  slapo_map_free(c->call_counts);
  slapo_map_free(c->rand_counts);
  slapo_free(c);
}

slapo_graph *slapo_ctx_graph(const slapo_ctx *c) { return c->g; }
slapo_status slapo_ctx_status(const slapo_ctx *c) { return c->status; }
const char *slapo_ctx_message(const slapo_ctx *c) { return c->message; }

slapo_status slapo_ctx_fail(slapo_ctx *c, slapo_status s, const char *fmt, ...) {
  if (c->status != SLAPO_OK) return c->status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->message, sizeof c->message, fmt, ap);
  va_end(ap);
  c->status = s;
  slapo_error(s, "%s", c->message);
  return s;
}

/* Counters live in maps as n + 1, so that a present entry is never NULL. */
static int count_of(const slapo_map *m, const char *key) {
  intptr_t n = (intptr_t)slapo_map_get(m, key);
  return n ? (int)(n - 1) : 0;
}

static slapo_status push_frame(slapo_ctx *c, const char *path, int call) {
  if (c->n_origins == c->cap_origins) {
    int cap = c->cap_origins ? 2 * c->cap_origins : 8;
    char **o = slapo_realloc(c->origins, (size_t)cap * sizeof *o);
    if (o) c->origins = o;
    int *k = o ? slapo_realloc(c->calls, (size_t)cap * sizeof *k) : NULL;
    if (k) c->calls = k;
    if (!o || !k) return slapo_ctx_fail(c, SLAPO_NOMEM, "ctx: out of memory");
    c->cap_origins = cap;
  }
  char *p = slapo_strdup(path);
  if (!p) return slapo_ctx_fail(c, SLAPO_NOMEM, "ctx: out of memory");
  c->calls[c->n_origins] = call;
  c->origins[c->n_origins++] = p;
  return SLAPO_OK;
}

slapo_status slapo_ctx_push_origin(slapo_ctx *c, const char *path) {
  /* Not a call: the frame belongs to the path's latest call (backward and
   * recompute stamp nodes this way, and must not shift later calls). */
  int calls = count_of(c->call_counts, path);
  return push_frame(c, path, calls ? calls - 1 : 0);
}

slapo_status slapo_ctx_enter_call(slapo_ctx *c, const char *path) {
  int call = count_of(c->call_counts, path);
  if (slapo_map_set(c->call_counts, path, (void *)(intptr_t)(call + 2)) != SLAPO_OK)
    return slapo_ctx_fail(c, SLAPO_NOMEM, "ctx: out of memory");
  return push_frame(c, path, call);
}

int slapo_ctx_call(const slapo_ctx *c) { return c->calls[c->n_origins - 1]; }

void slapo_ctx_pop_origin(slapo_ctx *c) {
  SLAPO_ASSERT(c->n_origins > 1);
  slapo_free(c->origins[--c->n_origins]);
}

const char *slapo_ctx_origin(const slapo_ctx *c) { return c->origins[c->n_origins - 1]; }

int slapo_ctx_new_region(slapo_ctx *c) { return ++c->n_regions; }

int slapo_ctx_set_region(slapo_ctx *c, int region) {
  int prev = c->region;
  c->region = region;
  return prev;
}

int slapo_ctx_region(const slapo_ctx *c) { return c->region; }

slapo_autocast slapo_ctx_set_autocast(slapo_ctx *c, slapo_autocast mode) {
  slapo_autocast prev = c->autocast;
  c->autocast = mode;
  return prev;
}

slapo_autocast slapo_ctx_autocast(const slapo_ctx *c) { return c->autocast; }

void slapo_ctx_set_shapeless(slapo_ctx *c, bool on) { c->shapeless = on; }
bool slapo_ctx_shapeless(const slapo_ctx *c) { return c->shapeless; }

void slapo_ctx_set_user(slapo_ctx *c, void *user) { c->user = user; }
void *slapo_ctx_user(const slapo_ctx *c) { return c->user; }

/* Next op index within the current origin path (internal to ops/). */
int slapo__ctx_next_op_seq(slapo_ctx *c) {
  const char *path = slapo_ctx_origin(c);
  int seq = count_of(c->op_counts, path);
  if (slapo_map_set(c->op_counts, path, (void *)(intptr_t)(seq + 2)) != SLAPO_OK) return -1;
  return seq;
}

/* Next random-op index within the current frame's module call (internal to
 * ops/): only random ops that get a new stream count, so copies that carry
 * their stream (backward, recompute) and ordinary ops never shift it. */
int slapo__ctx_next_random(slapo_ctx *c) {
  char key[1100];
  snprintf(key, sizeof key, "%s#%d", slapo_ctx_origin(c), slapo_ctx_call(c));
  int idx = count_of(c->rand_counts, key);
  if (slapo_map_set(c->rand_counts, key, (void *)(intptr_t)(idx + 2)) != SLAPO_OK) return -1;
  return idx;
}

bool slapo_ctx_set_copy_rng(slapo_ctx *ctx, bool on) {
  bool prev = ctx->copy_rng;
  ctx->copy_rng = on;
  return prev;
}

bool slapo_ctx_copy_rng(const slapo_ctx *ctx) { return ctx->copy_rng; }
