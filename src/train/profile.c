/* train/profile.c - where a training step goes (`slapo profile`): runs
 * TRAIN steps with the executor's per-node timing (opts.timing,
 * slapo_plan_node_ms) and an AdamW update after each, and aggregates the
 * step graph's nodes by the module path that emitted them (node->origin,
 * truncated to a depth): forward and backward milliseconds, and the
 * activation bytes each module holds at the step's live peak. Nothing is
 * printed here; the CLI prints the struct. Layer: train. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/assert.h"
#include "slapo/train.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void slapo_profile_row_path(const char *origin, int depth, char *buf, size_t cap) {
  if (!cap) return;
  if (!origin || !*origin) {
    snprintf(buf, cap, ".");
    return;
  }
  /* Level 0 is the root's child; each later segment is one level deeper,
   * except a list index ("0"), which stays on its list's level, so
   * transformer.h.0 is one level below transformer. */
  int level = 0;
  const char *p = origin, *end = origin;
  for (bool first = true; *p; first = false) {
    const char *q = strchr(p, '.');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    bool index = len > 0 && strspn(p, "0123456789") == len;
    if (!first && !index) level++;
    if (level > depth) break;
    end = p + len;
    p = q ? q + 1 : p + len;
  }
  size_t n = (size_t)(end - origin);
  if (n >= cap) n = cap - 1;
  memcpy(buf, origin, n);
  buf[n] = '\0';
}

void slapo_profile_deinit(slapo_profile *p) {
  if (!p) return;
  for (int i = 0; i < p->n_rows; i++) slapo_free(p->rows[i].path);
  slapo_free(p->rows);
  memset(p, 0, sizeof *p);
}

typedef struct prof {
  slapo_profile *out;
  int cap;
  slapo_map *by_path; /* row path -> row index + 1 */
  int depth;
} prof;

/* The row of node origin `origin`, created on first use; -1 on NOMEM. */
static int row_of(prof *pr, const char *origin) {
  char path[512];
  slapo_profile_row_path(origin, pr->depth, path, sizeof path);
  intptr_t k = (intptr_t)slapo_map_get(pr->by_path, path);
  if (k) return (int)k - 1;
  slapo_profile *o = pr->out;
  if (o->n_rows == pr->cap) {
    int cap = pr->cap ? 2 * pr->cap : 32;
    slapo_profile_row *r = slapo_realloc(o->rows, (size_t)cap * sizeof *r);
    if (!r) return -1;
    o->rows = r, pr->cap = cap;
  }
  slapo_profile_row *r = &o->rows[o->n_rows];
  memset(r, 0, sizeof *r);
  if (!(r->path = slapo_strdup(path))) return -1;
  if (slapo_map_set(pr->by_path, path, (void *)(intptr_t)(o->n_rows + 1)) != SLAPO_OK) {
    slapo_free(r->path);
    return -1;
  }
  return o->n_rows++;
}

static slapo_status nomem(void) { return slapo_error(SLAPO_NOMEM, "profile: out of memory"); }

/* Forward or backward: slapo_step builds the forward (the root's forward
 * from the inputs to the loss), then adds the placeholder "dloss" (the
 * seed dL/dloss) and has slapo_backward append the backward after it; the
 * step passes that follow (fold_grads, fold_index_add) insert their nodes
 * before backward nodes, and drop_identity only removes. So in graph order
 * every node after "dloss" is backward: gradients (which carry the origin
 * of the forward node they differentiate) and the recomputation of
 * checkpointed regions, which runs during the backward. Origin alone cannot
 * tell them apart, since autograd gives gradients their forward origin. */
static bool is_seed(const slapo_node *n) {
  return n->kind == SLAPO_NODE_PLACEHOLDER && n->name && !strcmp(n->name, "dloss");
}

/* Adds the last run's per-node times to the rows. */
static slapo_status add_times(prof *pr, const slapo_plan *plan, const slapo_graph *g) {
  bool bwd = false;
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (is_seed(n)) bwd = true;
    int r = row_of(pr, n->origin);
    if (r < 0) return nomem();
    slapo_profile_row *row = &pr->out->rows[r];
    double ms = slapo_plan_node_ms(plan, n);
    if (bwd) row->bwd_ms += ms;
    else row->fwd_ms += ms;
  }
  return SLAPO_OK;
}

static void count_nodes(prof *pr, const slapo_graph *g) {
  bool bwd = false;
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (is_seed(n)) bwd = true;
    int r = row_of(pr, n->origin); /* exists: add_times made it */
    if (r < 0) continue;
    if (bwd) pr->out->rows[r].n_bwd++;
    else pr->out->rows[r].n_fwd++;
  }
}

typedef struct peak_state {
  prof *pr;
  slapo_status s;
} peak_state;

static void add_live(const slapo_node *writer, size_t nbytes, void *ud) {
  peak_state *st = ud;
  int r = st->s == SLAPO_OK ? row_of(st->pr, writer->origin) : -1;
  if (r < 0) {
    if (st->s == SLAPO_OK) st->s = nomem();
    return;
  }
  st->pr->out->rows[r].act_nbytes += nbytes;
  st->pr->out->live_peak_nbytes += nbytes;
}

/* The activation bytes per row at the step's live peak, from the plan's own
 * buffers (slapo_plan_visit_peak): each buffer counts for the module whose
 * node writes it first. */
static slapo_status live_at_peak(prof *pr, const slapo_plan *plan) {
  peak_state st = {pr, SLAPO_OK};
  slapo_plan_visit_peak(plan, add_live, &st);
  return st.s;
}

/* Random ids in [0, vocab) for step `step`: idx from stream 31, targets 32. */
static void fill_batch(const slapo_profile_opts *o, int step, slapo_tensor *idx,
                       slapo_tensor *tgt) {
  int32_t *a = slapo_tensor_data(idx), *b = slapo_tensor_data(tgt);
  int64_t n = o->batch * o->seq;
  for (int64_t i = 0; i < n; i++) {
    int32_t x = (int32_t)(slapo_rng_uniform(o->seed, 31, (uint64_t)step, (uint64_t)i) *
                          (float)o->vocab);
    int32_t y = (int32_t)(slapo_rng_uniform(o->seed, 32, (uint64_t)step, (uint64_t)i) *
                          (float)o->vocab);
    a[i] = x < o->vocab ? x : (int32_t)o->vocab - 1;
    b[i] = y < o->vocab ? y : (int32_t)o->vocab - 1;
  }
}

/* Module paths in tree pre-order -> their position + 1, so rows can be
 * listed as the model nests (a module whose forward was dropped, such as
 * an identity dropout, would otherwise come last, after its backward). */
static slapo_status number_modules(const slapo_module *m, char *path, size_t len, size_t cap,
                                   slapo_map *order, intptr_t *next) {
  SLAPO_TRY(slapo_map_set(order, len ? path : ".", (void *)++*next));
  for (int i = 0; i < m->n_children; i++) {
    const slapo_module *c = m->children[i];
    int n = snprintf(path + len, cap - len, "%s%s", len ? "." : "", c->name);
    if (n < 0 || (size_t)n >= cap - len) continue; /* too long to be a row path */
    SLAPO_TRY(number_modules(c, path, len + (size_t)n, cap, order, next));
  }
  path[len] = '\0';
  return SLAPO_OK;
}

typedef struct keyed_row {
  intptr_t key; /* pre-order position + 1, or past every module */
  int orig;     /* graph order, to keep the sort stable */
  slapo_profile_row row;
} keyed_row;

static int cmp_row(const void *a, const void *b) {
  const keyed_row *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->orig > y->orig) - (x->orig < y->orig);
}

/* Sorts the rows into tree pre-order; rows whose path names no module
 * (which should not happen) go last, in graph order. Call after every
 * row_of: the path map holds row indices. */
static slapo_status sort_rows(slapo_module *model, slapo_profile *out) {
  slapo_map *order;
  SLAPO_TRY(slapo_map_new(&order));
  char path[512] = "";
  intptr_t next = 0;
  slapo_status s = number_modules(model, path, 0, sizeof path, order, &next);
  keyed_row *k = slapo_calloc((size_t)out->n_rows + 1, sizeof *k);
  if (s == SLAPO_OK && !k) s = nomem();
  if (s == SLAPO_OK) {
    for (int i = 0; i < out->n_rows; i++) {
      intptr_t at = (intptr_t)slapo_map_get(order, out->rows[i].path);
      k[i] = (keyed_row){at ? at : next + 1, i, out->rows[i]};
    }
    qsort(k, (size_t)out->n_rows, sizeof *k, cmp_row);
    for (int i = 0; i < out->n_rows; i++) out->rows[i] = k[i].row;
  }
  slapo_free(k);
  slapo_map_free(order);
  return s;
}

static slapo_status profile(slapo_module *model, const slapo_profile_opts *o, prof *pr,
                            slapo_runner *r, slapo_adamw *opt, slapo_tensor *idx,
                            slapo_tensor *tgt) {
  slapo_profile *out = pr->out;
  const slapo_tensor *in[2] = {idx, tgt};
  double step_ms = 0, opt_ms = 0;
  const slapo_graph *g = NULL;
  for (int step = 0; step <= o->steps; step++) {
    fill_batch(o, step, idx, tgt);
    slapo_kernel_env env = {o->seed, (uint64_t)step, true};
    double loss, t0 = now_ms();
    /* As slapo_train's step: the grads written and their norm measured by
     * the step, then AdamW with the clip factor. */
    SLAPO_TRY(slapo_train_accumulate(r, 1, in, &env, &loss, NULL));
    double t1 = now_ms();
    SLAPO_TRY(slapo_train_update(r, model, opt, 6e-4f, 1.0, NULL, NULL));
    double t2 = now_ms();
    out->loss = (float)loss;
    if (step == 0) continue; /* warm-up: builds and plans the step, first touch */
    step_ms += t2 - t0;
    opt_ms += t2 - t1;
    g = slapo_runner_graph(r);
    SLAPO_TRY(add_times(pr, slapo_runner_plan(r), g));
    out->grads_ms += slapo_plan_accumulate_ms(slapo_runner_plan(r));
  }
  double k = (double)o->steps;
  out->steps = o->steps;
  out->step_ms = step_ms / k;
  out->optimizer_ms = opt_ms / k;
  out->grads_ms /= k;
  for (int i = 0; i < out->n_rows; i++) {
    out->rows[i].fwd_ms /= k;
    out->rows[i].bwd_ms /= k;
    out->nodes_ms += out->rows[i].fwd_ms + out->rows[i].bwd_ms;
  }
  out->other_ms = out->step_ms - out->nodes_ms - out->grads_ms - out->optimizer_ms;
  count_nodes(pr, g);
  out->n_nodes = slapo_graph_count(g);
  const slapo_plan *plan = slapo_runner_plan(r);
  out->planned_peak_nbytes = slapo_plan_peak_nbytes(plan);
  out->measured_peak_nbytes = slapo_plan_measured_peak_nbytes(plan);
  SLAPO_TRY(live_at_peak(pr, plan));
  return sort_rows(model, out);
}

slapo_status slapo_profile_run(slapo_module *model, const slapo_profile_opts *opts,
                               slapo_profile *out) {
  memset(out, 0, sizeof *out);
  const slapo_profile_opts *o = opts;
  if (!model || !o)
    return slapo_error(SLAPO_INVALID_ARG, "profile: model or options are NULL");
  if (o->batch < 1 || o->seq < 1 || o->vocab < 1 || o->vocab > INT32_MAX || o->steps < 1 ||
      o->depth < 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "profile: batch %lld, seq %lld, vocab %lld, steps %d, depth %d (batch, "
                       "seq, vocab and steps must be >= 1, depth >= 0)",
                       (long long)o->batch, (long long)o->seq, (long long)o->vocab, o->steps,
                       o->depth);
  prof pr = {.out = out, .depth = o->depth};
  slapo_runner *r = NULL;
  slapo_adamw *opt = NULL;
  slapo_tensor *idx = NULL, *tgt = NULL;
  int64_t shape[2] = {o->batch, o->seq};
  slapo_plan_opts po = {.timing = true};
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  slapo_status s = slapo_map_new(&pr.by_path);
  if (s == SLAPO_OK) s = slapo_runner_new(model, &po, &r);
  if (s == SLAPO_OK) s = slapo_adamw_new(model, &ac, &opt);
  if (s == SLAPO_OK) s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx);
  if (s == SLAPO_OK) s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &tgt);
  if (s == SLAPO_OK) s = profile(model, o, &pr, r, opt, idx, tgt);
  slapo_tensor_free(idx);
  slapo_tensor_free(tgt);
  slapo_adamw_free(opt);
  slapo_runner_free(r);
  slapo_map_free(pr.by_path);
  if (s != SLAPO_OK) slapo_profile_deinit(out);
  return s;
}
