/* train/pp_params.c - the parameters of a pipeline: which stages hold
 * each one (every rank visits the model's parameters in one order, so one
 * all-gather of a byte per parameter tells every rank), and from that the
 * optimizer step of a stage (slapo_pp_train_update: the tied gradients
 * summed over the pipeline as Megatron-LM sums its embedding group's, the
 * norm summed over stages with a tied parameter counted once, AdamW over
 * the stage's own parameters, then a bitwise check of the tied copies); a
 * rank's memory cut to its stage's parameters (slapo_pp_adamw_new,
 * slapo_pp_release) and the whole model on stage 0 again when it must
 * write or sample it (slapo_pp_gather). Layer: train. */
#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/ops/vmath.h"
#include "train/internal.h"

/* The gather's messages: apart from the engine's (tag 0), though no
 * transfer of a step is outstanding when it runs. */
enum { GATHER_TAG = 100 };

static void note_param(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  slapo__pp_owners *o = ud;
  for (int i = 0; i < o->n; i++)
    if (o->params[i] == p) return; /* a tied parameter is visited once per owner */
  if (o->n == o->cap) {
    int cap = o->cap ? 2 * o->cap : 64;
    slapo_parameter **a = slapo_realloc(o->params, (size_t)cap * sizeof *a);
    if (!a) {
      o->nomem = true;
      return;
    }
    o->params = a, o->cap = cap;
  }
  o->params[o->n++] = p;
}

static bool stage_holds(const slapo_pp_stage *st, const slapo_parameter *p) {
  for (int i = 0; i < slapo_pp_stage_n_params(st); i++)
    if (slapo_pp_stage_param(st, i) == p) return true;
  return false;
}

void slapo__pp_owners_free(slapo__pp_owners *o) {
  slapo_free(o->params);
  slapo_free(o->mine);
  slapo_free(o->first);
  slapo_free(o->last);
  slapo_free(o->holders);
}

slapo_status slapo__pp_owners_of(const slapo_pp_stage *st, slapo_module *model,
                                 slapo__pp_owners *o) {
  *o = (slapo__pp_owners){0};
  SLAPO_TRY(slapo_module_visit_params(model, note_param, o));
  int p = slapo_dist_size(SLAPO_GROUP_PP);
  size_t n = (size_t)o->n;
  o->mine = slapo_calloc(n + 1, 1);
  o->first = slapo_calloc(n + 1, sizeof *o->first);
  o->last = slapo_calloc(n + 1, sizeof *o->last);
  o->holders = slapo_calloc(n + 1, sizeof *o->holders);
  uint8_t *all = slapo_calloc(n * (size_t)p + 1, 1);
  slapo_status s = o->nomem || !o->mine || !o->first || !o->last || !o->holders || !all
                       ? slapo_error(SLAPO_NOMEM, "pipeline: out of memory for %zu parameters", n)
                       : SLAPO_OK;
  for (size_t i = 0; s == SLAPO_OK && i < n; i++) o->mine[i] = stage_holds(st, o->params[i]);
  if (s == SLAPO_OK) s = slapo_dist_all_gather_bytes(SLAPO_GROUP_PP, o->mine, all, o->n);
  for (size_t i = 0; s == SLAPO_OK && i < n; i++) {
    o->first[i] = o->last[i] = 0; /* one that no stage reads is stage 0's (its grad zero) */
    for (int r = p - 1; r >= 0; r--)
      if (all[(size_t)r * n + i]) o->first[i] = r, o->holders[i]++;
    for (int r = 0; r < p; r++)
      if (all[(size_t)r * n + i]) o->last[i] = r;
    if (!o->holders[i]) o->mine[i] = slapo_dist_rank(SLAPO_GROUP_PP) == 0;
  }
  slapo_free(all);
  if (s != SLAPO_OK) slapo__pp_owners_free(o);
  return s;
}

/* Sums the gradients of the parameters several stages hold: over the
 * embedding group (SLAPO_GROUP_EMBED) for one the first and the last stage
 * alone hold (GPT-2's wte / lm_head), so the stages between move nothing,
 * else over the pipeline group; *n_tied (may be NULL) counts them. */
static slapo_status sum_tied(const slapo__pp_owners *o, int *n_tied) {
  if (n_tied) *n_tied = 0;
  int p_size = slapo_dist_size(SLAPO_GROUP_PP);
  for (int i = 0; i < o->n; i++) {
    if (o->holders[i] < 2) continue;
    if (n_tied) (*n_tied)++;
    slapo_parameter *p = o->params[i];
    if (o->holders[i] == 2 && o->first[i] == 0 && o->last[i] == p_size - 1) {
      if (o->mine[i])
        SLAPO_TRY(slapo_dist_all_reduce_f32(SLAPO_GROUP_EMBED, slapo_tensor_data(p->grad),
                                            slapo_tensor_numel(p->grad)));
      continue;
    }
    /* Stages without it add zeros (exact) from its grad, which their
     * steps never write (allocated once where the stage alone was
     * materialized): the whole pipeline group takes part, rather than a
     * group per tie. */
    if (!p->grad)
      SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_F32, p->value->ndim, p->value->shape, &p->grad));
    slapo_tensor *g = p->grad;
    if (!o->mine[i]) memset(slapo_tensor_data(g), 0, slapo_tensor_nbytes(g));
    SLAPO_TRY(slapo_dist_all_reduce_f32(SLAPO_GROUP_PP, slapo_tensor_data(g),
                                        slapo_tensor_numel(g)));
  }
  return SLAPO_OK;
}

slapo_status slapo_pp_sum_tied_grads(const slapo_pp_stage *st, slapo_module *model, int *n_tied) {
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, model, &o));
  slapo_status s = sum_tied(&o, n_tied);
  slapo__pp_owners_free(&o);
  return s;
}

/* The stage's gradients summed over the data-parallel group. */
static slapo_status dp_reduce(const slapo__pp_owners *o, double *comm_s) {
  if (slapo_dist_size(SLAPO_GROUP_DP) == 1) return SLAPO_OK;
  slapo_tensor **g = slapo_calloc((size_t)o->n + 1, sizeof *g);
  if (!g) return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  int k = 0;
  for (int i = 0; i < o->n; i++)
    if (o->mine[i]) g[k++] = o->params[i]->grad;
  slapo_status s = slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, k, g, comm_s);
  slapo_free(g);
  return s;
}

/* The global norm: each parameter's squares on its first holder only, then
 * summed over the pipeline. NaN when the all-reduce fails. */
static double grad_norm(const slapo__pp_owners *o) {
  double sq = 0;
  int me = slapo_dist_rank(SLAPO_GROUP_PP);
  for (int i = 0; i < o->n; i++)
    if (o->first[i] == me)
      sq += slapo__sum_squares(slapo_tensor_data(o->params[i]->grad),
                               slapo_tensor_numel(o->params[i]->grad));
  if (slapo_dist_all_reduce_f64(SLAPO_GROUP_PP, &sq, 1) != SLAPO_OK) return NAN;
  return sqrt(sq);
}

/* After the update every holder of a tied parameter must have the same
 * bits (the same summed gradient, moments and weights): a digest each,
 * all-gathered. */
static slapo_status check_tied(const slapo__pp_owners *o, int64_t step) {
  int p = slapo_dist_size(SLAPO_GROUP_PP);
  uint64_t *all = slapo_calloc((size_t)p, sizeof *all);
  if (!all) return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < o->n; i++) {
    if (o->holders[i] < 2) continue;
    const slapo_tensor *w = o->params[i]->value;
    uint64_t h = o->mine[i] ? slapo_hash64(slapo_tensor_data(w), slapo_tensor_nbytes(w), 0) : 0;
    s = slapo_dist_all_gather_bytes(SLAPO_GROUP_PP, &h, all, sizeof h);
    for (int r = 0; s == SLAPO_OK && r < p; r++)
      if (all[r] && all[r] != all[o->first[i]])
        s = slapo_error(SLAPO_VERIFY, "pipeline: after step %lld the tied parameter %s differs "
                        "between stage %d and stage %d (digests %016llx, %016llx)",
                        (long long)step, o->params[i]->path, o->first[i], r,
                        (unsigned long long)all[o->first[i]], (unsigned long long)all[r]);
  }
  slapo_free(all);
  return s;
}

static bool is_mine(const slapo_parameter *p, void *ud) {
  const slapo__pp_owners *o = ud;
  for (int i = 0; i < o->n; i++)
    if (o->params[i] == p) return o->mine[i];
  return false;
}

slapo_status slapo_pp_train_update(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt,
                                   float lr, double max_norm, double *norm, double *comm_s) {
  if (comm_s) *comm_s = 0;
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, model, &o));
  /* A parameter no stage reads has a zero gradient, as in one process:
   * weight decay still moves it, on stage 0. */
  for (int i = 0; i < o.n; i++)
    if (!o.holders[i] && o.mine[i])
      memset(slapo_tensor_data(o.params[i]->grad), 0, slapo_tensor_nbytes(o.params[i]->grad));
  slapo_status s = sum_tied(&o, NULL);
  if (s == SLAPO_OK) s = dp_reduce(&o, comm_s);
  double nm = s == SLAPO_OK ? grad_norm(&o) : NAN;
  if (s == SLAPO_OK && isnan(nm))
    s = slapo_error(SLAPO_COMM, "pipeline: the gradient norm's all-reduce failed");
  /* Only the stage's own parameters move (a no-op after slapo_pp_adamw_new
   * or a previous step; after slapo_pp_gather it releases the moments that
   * came for a checkpoint). */
  if (s == SLAPO_OK) s = slapo_adamw_select(opt, is_mine, &o);
  if (s == SLAPO_OK) {
    slapo_adamw_step_scaled(opt, lr, slapo_clip_scale(nm, max_norm), false);
    s = check_tied(&o, slapo_adamw_steps(opt));
  }
  if (norm) *norm = nm;
  slapo__pp_owners_free(&o);
  return s;
}

slapo_status slapo_pp_adamw_new(const slapo_pp_stage *st, slapo_module *model,
                                const slapo_adamw_config *cfg, slapo_adamw **out) {
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, model, &o));
  slapo_status s = slapo_adamw_new_select(model, cfg, is_mine, &o, out);
  slapo__pp_owners_free(&o);
  return s;
}

/* p's value as a meta tensor of its shape (storage freed), or back as a
 * materialized one (zeros, to be filled). */
static slapo_status to_meta(slapo_parameter *p) {
  if (slapo_tensor_is_meta(p->value)) return SLAPO_OK;
  slapo_tensor *m;
  SLAPO_TRY(slapo_tensor_new_meta(p->value->dtype, p->value->ndim, p->value->shape, &m));
  slapo_tensor_free(p->value);
  p->value = m;
  return SLAPO_OK;
}

static slapo_status from_meta(slapo_parameter *p) {
  if (!slapo_tensor_is_meta(p->value)) return SLAPO_OK;
  slapo_tensor *t;
  SLAPO_TRY(slapo_tensor_new(p->value->dtype, p->value->ndim, p->value->shape, &t));
  slapo_tensor_free(p->value);
  p->value = t;
  return SLAPO_OK;
}

slapo_status slapo_pp_release(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt) {
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, model, &o));
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < o.n; i++) {
    if (o.mine[i]) continue;
    s = to_meta(o.params[i]);
    /* (A tie held by other stages than the first and the last one gets a
     * zero buffer again in the tie sum, where needed.) */
    slapo_tensor_free(o.params[i]->grad);
    o.params[i]->grad = NULL;
  }
  if (s == SLAPO_OK && opt) s = slapo_adamw_select(opt, is_mine, &o);
  slapo__pp_owners_free(&o);
  return s;
}

/* Parameter i's weights (and moments) from its first holder to stage 0. */
static slapo_status gather_one(const slapo__pp_owners *o, int i, slapo_adamw *opt) {
  int me = slapo_dist_rank(SLAPO_GROUP_PP), from = o->first[i];
  if (from == 0 || (me != 0 && me != from)) return SLAPO_OK;
  slapo_parameter *p = o->params[i];
  slapo_tensor *t[3] = {p->value, NULL, NULL};
  if (me == 0) SLAPO_TRY(from_meta(p));
  t[0] = p->value;
  if (opt) SLAPO_TRY(slapo_adamw_moments(opt, p, &t[1], &t[2]));
  int n = opt ? 3 : 1;
  if (me == 0) return slapo_dist_pp_exchange(-1, 0, NULL, from, n, t, GATHER_TAG);
  return slapo_dist_pp_exchange(0, n, (const slapo_tensor *const *)t, -1, 0, NULL, GATHER_TAG);
}

slapo_status slapo_pp_gather(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt) {
  slapo__pp_owners o;
  SLAPO_TRY(slapo__pp_owners_of(st, model, &o));
  slapo_status s = SLAPO_OK;
  for (int i = 0; s == SLAPO_OK && i < o.n; i++) s = gather_one(&o, i, opt);
  slapo__pp_owners_free(&o);
  return s;
}
