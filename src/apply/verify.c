/* apply/verify.c - verify: the scheduled model against the unscheduled one
 * from the same weights, on the same batch and RNG keys (dropout on),
 * comparing logits, loss and every parameter gradient by path; bitwise where
 * every applied primitive promises it, else within tolerances. Per-entry
 * checks and bisection to the first failing step. Layer: apply. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/apply.h"
#include "slapo/dist.h"

/* Results of one model on the batch. */
typedef struct outcome {
  slapo_tensor *logits; /* owned copy                                      */
  float loss;
  slapo_module *model;  /* owned; gradients live in its parameters         */
} outcome;

static void outcome_free(outcome *o) {
  slapo_tensor_free(o->logits);
  slapo_module_free(o->model);
  memset(o, 0, sizeof *o);
}

/* Rows [d B / D, (d + 1) B / D) of each train input (views) into part. */
static slapo_status rows_of(const slapo_verify_opts *opt, int d, int D, slapo_tensor **part) {
  int64_t B = opt->in[0]->shape[0];
  if (B % D)
    return slapo_error(SLAPO_INVALID_ARG, "verify: batch %lld does not split over %d "
                       "data-parallel ranks", (long long)B, D);
  for (int i = 0; i < opt->n_in && i < 8; i++)
    SLAPO_TRY(slapo_tensor_slice(opt->in[i], 0, d * B / D, (d + 1) * B / D, 1, &part[i]));
  return SLAPO_OK;
}

/* Train step on batch part d of D with dropout step `step` D + d, weight
 * 1 / D; *loss += its weighted loss. */
static slapo_status train_part(slapo_runner *r, const slapo_verify_opts *opt, int d, int D,
                               double *loss) {
  slapo_tensor *part[8] = {0};
  slapo_status s = rows_of(opt, d, D, part);
  slapo_kernel_env env = {opt->seed, opt->step * (uint64_t)D + (uint64_t)d, true};
  const slapo_tensor *out = NULL;
  if (s == SLAPO_OK)
    s = slapo_step_scaled(r, opt->n_in, (const slapo_tensor *const *)part, SLAPO_STEP_TRAIN,
                          &env, 1.0f / (float)D, &out);
  if (s == SLAPO_OK) *loss += *(const float *)slapo_tensor_data(out) / D;
  for (int i = 0; i < 8; i++) slapo_tensor_free(part[i]);
  return s;
}

/* Data parallelism is gradient accumulation across ranks: the scheduled
 * model on data-parallel rank d trains part d of the batch (dropout step
 * step D + d, weight 1 / D) and the gradients and losses are summed over
 * the group; the reference trains the D parts one after the other, as D
 * micro-batches with the same steps and weights. */
static slapo_status train_dp(slapo_runner *r, slapo_module *m, const slapo_verify_opts *opt,
                             bool scheduled, float *loss) {
  int D = slapo_dist_size(SLAPO_GROUP_DP), d = slapo_dist_rank(SLAPO_GROUP_DP);
  double sum = 0;
  slapo_status s = SLAPO_OK;
  if (!scheduled) {
    for (int k = 0; k < D && s == SLAPO_OK; k++) s = train_part(r, opt, k, D, &sum);
    *loss = (float)sum;
    return s;
  }
  s = train_part(r, opt, d, D, &sum);
  if (s == SLAPO_OK) s = slapo_dist_all_reduce_f64(SLAPO_GROUP_DP, &sum, 1);
  slapo_tensor **g = NULL;
  int n = 0;
  if (s == SLAPO_OK) s = slapo_module_grads(m, &g, &n);
  if (s == SLAPO_OK) s = slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, n, g, NULL);
  slapo_free(g);
  *loss = (float)sum;
  return s;
}

/* Runs eval (logits) and train (loss, gradients) steps on o->model;
 * `scheduled`: the model whose train batch is split over the
 * data-parallel group, when there is one. */
static slapo_status run(outcome *o, const slapo_verify_opts *opt, bool scheduled) {
  slapo_runner *r;
  SLAPO_TRY(slapo_runner_new(o->model, NULL, &r));
  const slapo_tensor *out;
  slapo_kernel_env env = {opt->seed, opt->step, false};
  slapo_status s = slapo_step(r, 1, opt->in, SLAPO_STEP_EVAL, &env, &out);
  if (s == SLAPO_OK) s = slapo_tensor_contiguous(out, &o->logits);
  if (s == SLAPO_OK) {
    slapo_module_zero_grad(o->model);
    env.training = true;
    if (slapo_dist_size(SLAPO_GROUP_DP) > 1) {
      s = train_dp(r, o->model, opt, scheduled, &o->loss);
    } else {
      s = slapo_step(r, opt->n_in, opt->in, SLAPO_STEP_TRAIN, &env, &out);
      if (s == SLAPO_OK) o->loss = *(const float *)slapo_tensor_data(out);
    }
  }
  slapo_runner_free(r);
  return s;
}

typedef struct copy_state {
  slapo_module *dst;
  slapo_status status;
} copy_state;

static void copy_one(slapo_parameter *p, const char *path, void *ud) {
  copy_state *c = ud;
  if (c->status != SLAPO_OK) return;
  slapo_parameter *q = slapo_module_param_at(c->dst, path);
  if (!q) {
    c->status = slapo_error(SLAPO_NOT_FOUND, "verify: the scheduled model has no parameter %s",
                            path);
    return;
  }
  c->status = slapo_tensor_copy(q->value, p->value);
}

/* The bound of a bf16 schedule against plain f32, as a fraction of each
 * tensor's largest magnitude: a sanity bound (bf16 keeps 8 significant
 * bits), where the tight check is against the emulated rounding. */
#define LOOSE_FRACTION 0.05
/* ... of at least this magnitude: a tensor that is zero in exact arithmetic
 * (an attention key's bias gradient: softmax ignores a shift shared by all
 * keys) holds only rounding noise, larger in bf16, and no fraction of that
 * noise bounds it. */
#define LOOSE_FLOOR 1e-3

/* Compares a and b; updates the check's worst value. With loose, the bound
 * is LOOSE_FRACTION of max |b| for every element instead of atol + rtol |b|. */
static void compare(slapo_verify_check *c, const char *what, const slapo_tensor *a,
                    const slapo_tensor *b, double atol, double rtol, bool loose) {
  double worst = 0;
  if (!slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape)) {
    worst = INFINITY;
  } else if (c->bitwise) {
    worst = slapo_tensor_equal(a, b) ? 0 : 1;
  } else if (loose) {
    const float *x = slapo_tensor_data(a), *y = slapo_tensor_data(b);
    double d = 0, m = 0;
    for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
      double e = fabs((double)x[i] - y[i]);
      d = e > d || isnan(e) ? (isnan(e) ? INFINITY : e) : d;
      m = fmax(m, fabs((double)y[i]));
    }
    worst = d == 0 ? 0 : d / (LOOSE_FRACTION * (m > LOOSE_FLOOR ? m : LOOSE_FLOOR));
  } else {
    const float *x = slapo_tensor_data(a), *y = slapo_tensor_data(b);
    for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
      double e = fabs((double)x[i] - y[i]) / (atol + rtol * fabs((double)y[i]));
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
  }
  if (worst > c->worst || (c->what[0] == '\0' && worst == c->worst)) {
    c->worst = worst;
    snprintf(c->what, sizeof c->what, "%s", what);
  }
}

typedef struct grad_state {
  slapo_module *other;
  slapo_verify_check *c;
  double atol, rtol;
  bool loose;
  slapo_status status;
} grad_state;

/* p's gradient at full shape: itself, or gathered from its shards (every
 * rank visits the parameters in the same order, so the gathers meet);
 * *owned is what to free. */
static slapo_status full_grad(const slapo_parameter *p, const slapo_tensor **out,
                              slapo_tensor **owned) {
  *owned = NULL;
  *out = p->grad;
  if (!p->shard || p->shard->count == 1) return SLAPO_OK;
  SLAPO_TRY(slapo_dist_gather_shards((slapo_group)p->shard_group, p->shard, p->grad, owned));
  *out = *owned;
  return SLAPO_OK;
}

static void compare_grad(slapo_parameter *p, const char *path, void *ud) {
  grad_state *g = ud;
  if (g->status != SLAPO_OK) return;
  slapo_parameter *q = slapo_module_param_at(g->other, path);
  if (!q) {
    g->status = slapo_error(SLAPO_NOT_FOUND, "verify: the scheduled model has no parameter %s",
                            path);
    return;
  }
  char what[300];
  snprintf(what, sizeof what, "grad %s", path);
  /* Either side may be sharded (the bf16 emulation is the scheduled model). */
  const slapo_tensor *a, *b;
  slapo_tensor *fa = NULL, *fb = NULL;
  g->status = full_grad(q, &a, &fa);
  if (g->status == SLAPO_OK) g->status = full_grad(p, &b, &fb);
  if (g->status == SLAPO_OK) compare(g->c, what, a, b, g->atol, g->rtol, g->loose);
  slapo_tensor_free(fa);
  slapo_tensor_free(fb);
}

static bool disabled(const slapo_verify_opts *o, size_t number) {
  for (size_t k = 0; k < o->n_disabled; k++)
    if (o->disabled[k] == number) return true;
  return false;
}

/* Whether every step up to `upto` (not disabled) uses a bitwise primitive. */
static bool all_bitwise(const slapo_sched_steps *steps, size_t upto, const slapo_verify_opts *o) {
  for (size_t i = 0; i < steps->n && steps->items[i].number <= upto; i++) {
    const slapo_primitive *p = slapo_primitive_find(steps->items[i].entry->primitive);
    if (!disabled(o, steps->items[i].number) && p && !p->bitwise) return false;
  }
  return true;
}

static bool is_tp(const slapo_sched_step *st) {
  return !strcmp(st->entry->primitive, "shard") || !strcmp(st->entry->primitive, "sync");
}

/* Whether the prefix 1..upto ends inside the schedule's tensor-parallel
 * part (its first to its last `shard` or `sync` step, disabled ones left
 * out): until every shard has its sync and its row-parallel partner (a
 * column-parallel c_attn before c_proj takes the local heads), the model
 * computes parts of outputs or does not build, so such a prefix is not
 * checked alone; the part is checked as a whole after its last step. Then
 * *c is that prefix's check, incomplete, with the part's steps in `what`. */
static bool inside_tp(const slapo_sched_steps *steps, size_t upto, const slapo_verify_opts *o,
                      slapo_verify_check *c) {
  size_t first = 0, last = 0;
  for (size_t i = 0; i < steps->n; i++) {
    const slapo_sched_step *st = &steps->items[i];
    if (!is_tp(st) || disabled(o, st->number)) continue;
    if (!first) first = st->number;
    last = st->number;
  }
  if (!first || upto < first || upto >= last) return false;
  *c = (slapo_verify_check){.upto = upto, .ok = true, .incomplete = true};
  snprintf(c->what, sizeof c->what,
           "steps %zu-%zu shard the model for tensor parallelism and are checked together, "
           "after step %zu",
           first, last, last);
  return true;
}

static bool is_autocast(const slapo_sched_step *st) {
  return !strcmp(st->entry->primitive, "autocast");
}

/* The steps to skip for the schedule without its autocast lines: the
 * disabled ones and every autocast step up to upto, into *skip (owned).
 * Returns how many autocast steps would apply (0: *skip is NULL). */
static size_t autocast_steps(const slapo_sched_steps *steps, size_t upto,
                             const slapo_verify_opts *o, size_t **skip, size_t *n_skip) {
  size_t n = 0;
  *skip = NULL, *n_skip = 0;
  for (size_t i = 0; i < steps->n && steps->items[i].number <= upto; i++)
    n += is_autocast(&steps->items[i]) && !disabled(o, steps->items[i].number);
  if (!n || !(*skip = slapo_calloc(o->n_disabled + n + 1, sizeof **skip))) return n;
  for (size_t i = 0; i < o->n_disabled; i++) (*skip)[(*n_skip)++] = o->disabled[i];
  for (size_t i = 0; i < steps->n && steps->items[i].number <= upto; i++)
    if (is_autocast(&steps->items[i])) (*skip)[(*n_skip)++] = steps->items[i].number;
  return n;
}

/* A fresh model with from's weights, the log's steps 1..upto applied but
 * those in skip, bf16 autocast emulated in f32 when `emulated`, run into
 * *o. */
static slapo_status scheduled(slapo_model_builder build, void *ud, slapo_module *from,
                              const slapo_sched_log *log, const size_t *skip, size_t n_skip,
                              size_t upto, bool emulated, const slapo_verify_opts *opt,
                              outcome *o) {
  SLAPO_TRY(build(ud, &o->model));
  copy_state cs = {o->model, SLAPO_OK};
  slapo_status s = slapo_module_visit_params(from, copy_one, &cs);
  if (s == SLAPO_OK) s = cs.status;
  if (s == SLAPO_OK && emulated) slapo_module_autocast_emulate(o->model);
  slapo_sched *root = NULL;
  if (s == SLAPO_OK) s = slapo_sched_create(o->model, &root);
  if (s == SLAPO_OK && upto > 0) s = slapo_apply_schedule(root, log, skip, n_skip, upto, NULL);
  if (s == SLAPO_OK) s = run(o, opt, true);
  slapo_sched_free(root);
  return s;
}

/* Compares logits, loss and every gradient of sch against ref into c. */
static slapo_status compare_outcomes(slapo_verify_check *c, const outcome *sch,
                                     const outcome *ref, double atol, double rtol, bool loose) {
  compare(c, "logits", sch->logits, ref->logits, atol, rtol, loose);
  slapo_tensor *la, *lb;
  int64_t one = 1;
  slapo_status s = slapo_tensor_from_data(SLAPO_DTYPE_F32, 1, &one, &sch->loss, &la);
  if (s == SLAPO_OK) {
    s = slapo_tensor_from_data(SLAPO_DTYPE_F32, 1, &one, &ref->loss, &lb);
    if (s == SLAPO_OK) compare(c, "loss", la, lb, atol, rtol, loose), slapo_tensor_free(lb);
    slapo_tensor_free(la);
  }
  if (s == SLAPO_OK) {
    grad_state g = {sch->model, c, atol, rtol, loose, SLAPO_OK};
    s = slapo_module_visit_params(ref->model, compare_grad, &g);
    if (s == SLAPO_OK) s = g.status;
  }
  return s;
}

/* Folds the sub-check l, labelled, into c when it is worse. */
static void fold(slapo_verify_check *c, const slapo_verify_check *l, const char *label) {
  if (l->worst <= c->worst) return;
  c->worst = l->worst;
  snprintf(c->what, sizeof c->what, "%.110s (%.70s)", l->what, label);
}

/* Verifies the prefix of steps 1..upto. A schedule with autocast lines is
 * checked in three parts, so that neither hides the other: the schedule
 * without them against the unscheduled model (its structure, at the
 * tolerance); the schedule in bf16 against itself with the autocast
 * emulated in f32 (the same rounding points: at the tolerance); and
 * against the unscheduled f32 model within LOOSE_FRACTION (a sanity bound:
 * bf16 keeps 8 significant bits). */
static slapo_status check_prefix(slapo_model_builder build, void *ud, const slapo_sched_log *log,
                                 const slapo_sched_steps *steps, size_t upto,
                                 const slapo_verify_opts *o, slapo_verify_check *c) {
  memset(c, 0, sizeof *c);
  c->upto = upto;
  c->bitwise = all_bitwise(steps, upto, o);
  double atol = o->atol > 0 ? o->atol : 1e-5, rtol = o->rtol > 0 ? o->rtol : 1e-4;
  outcome ref = {0}, sch = {0}, plain = {0}, emu = {0};
  size_t *skip = NULL, n_skip = 0;
  size_t n_autocast = autocast_steps(steps, upto, o, &skip, &n_skip);
  slapo_status s = n_autocast && !skip ? slapo_error(SLAPO_NOMEM, "verify: out of memory")
                                       : build(ud, &ref.model);
  if (s == SLAPO_OK) s = run(&ref, o, false);
  if (s == SLAPO_OK)
    s = scheduled(build, ud, ref.model, log, o->disabled, o->n_disabled, upto, false, o, &sch);
  if (s == SLAPO_OK && !n_autocast) s = compare_outcomes(c, &sch, &ref, atol, rtol, false);
  if (s == SLAPO_OK && n_autocast) {
    slapo_verify_check part[3];
    for (int i = 0; i < 3; i++) part[i] = (slapo_verify_check){.upto = upto};
    s = scheduled(build, ud, ref.model, log, skip, n_skip, upto, false, o, &plain);
    if (s == SLAPO_OK) s = compare_outcomes(&part[0], &plain, &ref, atol, rtol, false);
    if (s == SLAPO_OK)
      s = scheduled(build, ud, ref.model, log, o->disabled, o->n_disabled, upto, true, o, &emu);
    if (s == SLAPO_OK) s = compare_outcomes(&part[1], &sch, &emu, atol, rtol, false);
    if (s == SLAPO_OK) s = compare_outcomes(&part[2], &sch, &ref, atol, rtol, true);
    fold(c, &part[0], "the schedule without autocast vs unscheduled");
    fold(c, &part[1], "bf16 vs its rounding emulated in f32");
    char label[72];
    snprintf(label, sizeof label, "bf16 vs plain f32, bound %g x max(|max|, %g)", LOOSE_FRACTION,
             LOOSE_FLOOR);
    fold(c, &part[2], label);
    size_t len = strlen(c->what);
    snprintf(c->what + len, sizeof c->what - len,
             "; parts: structure %.3g, bf16 vs emulated %.3g, vs f32 %.3g", part[0].worst,
             part[1].worst, part[2].worst);
  }
  /* Ranks agree on the verdict: the worst over all of them. */
  double worst = c->worst;
  if (s == SLAPO_OK) s = slapo_dist_max_f64(SLAPO_GROUP_WORLD, &worst, 1);
  if (worst > c->worst) snprintf(c->what, sizeof c->what, "another rank");
  c->worst = worst;
  c->ok = s == SLAPO_OK && (c->bitwise ? c->worst == 0 : c->worst <= 1.0);
  slapo_free(skip);
  outcome_free(&ref);
  outcome_free(&sch);
  outcome_free(&plain);
  outcome_free(&emu);
  return s;
}

slapo_status slapo_verify(slapo_model_builder build, void *ud, const slapo_sched_log *log,
                          const slapo_verify_opts *opts, slapo_verify_cb cb, void *cb_ud,
                          size_t *first_bad) {
  *first_bad = 0;
  SLAPO_NEED(build, "verify");
  SLAPO_NEED(log, "verify");
  /* Expand against a throw-away copy of the model to number the steps. */
  slapo_module *m = NULL;
  slapo_sched *root = NULL;
  slapo_sched_steps steps = {0};
  slapo_status s = build(ud, &m);
  if (s == SLAPO_OK) s = slapo_sched_create(m, &root);
  if (s == SLAPO_OK) s = slapo_sched_expand(log, root, &steps);
  size_t n = steps.n ? steps.items[steps.n - 1].number : 0;
  for (size_t i = 0; s == SLAPO_OK && i < opts->n_disabled; i++)
    if (opts->disabled[i] < 1 || opts->disabled[i] > n)
      s = slapo_error(SLAPO_INVALID_ARG,
                      "disabled step %zu does not exist: the schedule expands to %zu steps on "
                      "this model (see slapo show --schedule)",
                      opts->disabled[i], n);
  slapo_verify_check c, bad = {0};
  if (s == SLAPO_OK && opts->bisect && n > 0) {
    /* Invariant: prefix lo passes, prefix hi fails. */
    s = check_prefix(build, ud, log, &steps, n, opts, &c);
    if (s == SLAPO_OK && cb) cb(&c, &steps, cb_ud);
    if (s == SLAPO_OK && !c.ok) {
      bad = c;
      size_t lo = 0, hi = n;
      while (s == SLAPO_OK && hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (inside_tp(&steps, mid, opts, &c)) { /* as a prefix that passes */
          if (cb) cb(&c, &steps, cb_ud);
          lo = mid;
          continue;
        }
        s = check_prefix(build, ud, log, &steps, mid, opts, &c);
        if (s == SLAPO_PRECOND) { /* incomplete on its own: not where it breaks */
          c.incomplete = true, c.ok = true, s = SLAPO_OK;
          snprintf(c.what, sizeof c.what, "%s", slapo_last_error());
        }
        if (s == SLAPO_OK && cb) cb(&c, &steps, cb_ud);
        if (c.ok) lo = mid;
        else hi = mid, bad = c;
      }
      if (s == SLAPO_OK) *first_bad = hi;
    }
  } else if (s == SLAPO_OK) {
    for (size_t k = opts->per_entry ? 1 : n; s == SLAPO_OK && k <= n; k++) {
      if (inside_tp(&steps, k, opts, &c)) {
        if (cb) cb(&c, &steps, cb_ud);
        continue;
      }
      s = check_prefix(build, ud, log, &steps, k, opts, &c);
      if (s == SLAPO_PRECOND && k < n) { /* only valid together with later steps */
        c.incomplete = true, c.ok = true, s = SLAPO_OK;
        snprintf(c.what, sizeof c.what, "%s", slapo_last_error());
      }
      if (s == SLAPO_OK && cb) cb(&c, &steps, cb_ud);
      if (s == SLAPO_OK && !c.ok) {
        *first_bad = k;
        bad = c;
        break;
      }
    }
    if (s == SLAPO_OK && n == 0) {
      s = check_prefix(build, ud, log, &steps, 0, opts, &c);
      if (s == SLAPO_OK && cb) cb(&c, &steps, cb_ud);
      if (s == SLAPO_OK && !c.ok) *first_bad = 1, bad = c;
    }
  }
  if (s == SLAPO_OK && *first_bad) {
    const slapo_sched_step *st = NULL;
    for (size_t i = 0; i < steps.n; i++)
      if (steps.items[i].number == *first_bad) st = &steps.items[i];
    s = slapo_error(SLAPO_VERIFY,
                    "step %zu (%s:%d: %s %s) breaks %s: worst %s %.3g at %s",
                    *first_bad, st && st->entry->file ? st->entry->file : "?",
                    st ? st->entry->line : 0, st ? st->path : "?",
                    st ? st->entry->primitive : "?",
                    bad.bitwise ? "bitwise equality" : "the tolerance",
                    bad.bitwise ? "difference" : "error/tolerance", bad.worst, bad.what);
  }
  slapo_sched_steps_deinit(&steps);
  slapo_sched_free(root);
  slapo_module_free(m);
  return s;
}
