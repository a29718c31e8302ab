/* module/step.c - slapo_step: build the step graph by calling the root
 * forward, derive the backward (autograd/), plan memory and run (exec/); the
 * built step is cached by (model version, input shapes and dtypes, mode).
 * Layer: module. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module/internal.h"
#include "slapo/rewrite.h"

typedef struct built_step {
  slapo_graph *g;
  slapo_plan *plan;
  slapo_step_mode mode;
  uint64_t version;
  int n_in;
  slapo_dtype dtypes[SLAPO_STEP_MAX_INPUTS];
  int ndims[SLAPO_STEP_MAX_INPUTS];
  int64_t shapes[SLAPO_STEP_MAX_INPUTS][SLAPO_MAX_DIMS];
  int n_params;              /* TRAIN: outputs 1..n_params are gradients */
  slapo_parameter **params;  /* borrowed from the model                   */
  int n_absent;              /* TRAIN: the model's parameters the graph   */
  slapo_parameter **absent;  /*   does not use (zeroed by a WRITE step)   */
  bool measured;             /* the last run had SLAPO_ACC_MEASURE        */
  char *text;                /* printed graph (SLAPO_DEBUG_STEP)          */
  slapo__index_bound bounds[SLAPO_STEP_MAX_INPUTS]; /* integer inputs' ranges */
} built_step;

struct slapo_runner {
  slapo_module *root;
  slapo_plan_opts opts;
  uint64_t version;
  built_step cur;
  bool have;
  slapo_tensor *dloss; /* f32 [] bound to the train graph's "dloss" input */
  slapo_graph *dec_g;  /* the last decoding step (decode.c), owned */
  slapo_plan *dec_p;
};

slapo_module *slapo__runner_root(const slapo_runner *r) { return r->root; }

void slapo__runner_keep_decode(slapo_runner *r, slapo_graph *g, slapo_plan *p) {
  slapo_plan_free(r->dec_p);
  slapo_graph_free(r->dec_g);
  r->dec_g = g, r->dec_p = p;
}

slapo_status slapo_runner_new(slapo_module *root, const slapo_plan_opts *opts,
                              slapo_runner **out) {
  *out = NULL;
  slapo_runner *r = slapo_calloc(1, sizeof *r);
  if (!r) return slapo_error(SLAPO_NOMEM, "runner: out of memory");
  r->root = root;
  if (opts) r->opts = *opts;
  slapo_status st = slapo_tensor_new(SLAPO_DTYPE_F32, 0, NULL, &r->dloss);
  if (st != SLAPO_OK) {
    slapo_free(r);
    return st;
  }
  *out = r;
  return SLAPO_OK;
}

static void step_clear(built_step *b) {
  slapo_plan_free(b->plan);
  slapo_graph_free(b->g);
  slapo_free(b->params);
  slapo_free(b->absent);
  slapo_free(b->text);
  memset(b, 0, sizeof *b);
}

void slapo_runner_free(slapo_runner *r) {
  if (!r) return;
  step_clear(&r->cur);
  slapo__runner_keep_decode(r, NULL, NULL);
  slapo_tensor_free(r->dloss);
  slapo_free(r);
}

void slapo_runner_invalidate(slapo_runner *r) { r->version++; }

static bool key_matches(const built_step *b, uint64_t version, int n_in,
                        const slapo_tensor *const *in, slapo_step_mode mode) {
  if (b->version != version || b->mode != mode || b->n_in != n_in) return false;
  for (int i = 0; i < n_in; i++)
    if (b->dtypes[i] != in[i]->dtype ||
        !slapo_shape_equal(b->ndims[i], b->shapes[i], in[i]->ndim, in[i]->shape))
      return false;
  return true;
}

typedef struct absent_state {
  built_step *b;
  int cap;
  bool nomem;
} absent_state;

static void note_absent(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  absent_state *st = ud;
  for (int i = 0; i < st->b->n_params; i++)
    if (st->b->params[i] == p) return;
  if (st->b->n_absent == st->cap) {
    int cap = st->cap ? 2 * st->cap : 8;
    slapo_parameter **a = slapo_realloc(st->b->absent, (size_t)cap * sizeof *a);
    if (!a) {
      st->nomem = true;
      return;
    }
    st->b->absent = a, st->cap = cap;
  }
  st->b->absent[st->b->n_absent++] = p;
}

/* The model's parameters the train graph does not use: a SLAPO_ACC_WRITE
 * step zeroes their grads, since no kernel writes them. */
static slapo_status find_absent(slapo_module *root, built_step *b) {
  absent_state st = {b, 0, false};
  SLAPO_TRY(slapo_module_visit_params(root, note_absent, &st));
  return st.nomem ? slapo_error(SLAPO_NOMEM, "step: out of memory") : SLAPO_OK;
}

/* Runs the step's rules on g to a fixpoint; logs what each rewrote. */
slapo_status slapo__step_rules(slapo_graph *g, bool training) {
  int n_rules, counts[16];
  const slapo_rewrite_rule *const *rules = slapo_rewrite_step_rules(&n_rules);
  SLAPO_ASSERT(n_rules <= (int)SLAPO_ARRAY_LEN(counts));
  SLAPO_TRY(slapo_rewrite_run(g, rules, n_rules, &(slapo_rewrite_env){.training = training},
                              counts));
  for (int i = 0; i < n_rules; i++)
    if (counts[i]) slapo_logf(1, "step: rule %s rewrote %d time(s)", rules[i]->name, counts[i]);
  return SLAPO_OK;
}

static char *graph_text(const slapo_graph *g) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  slapo_graph_print(g, f);
  fclose(f);
  /* open_memstream allocates with libc; copy into our allocator. */
  char *s = slapo_strdup(buf);
  free(buf);
  return s;
}

/* Train mode: the gradients of the loss y w.r.t. every parameter the
 * forward used (bs), as outputs 1..n after y, seeded by an input dloss
 * rather than the constant 1 so that a run can weight them
 * (slapo_step_scaled: micro-batches by valid tokens); fills b's parameter
 * lists. Errors: SLAPO_INVALID_ARG (y not a scalar), those of
 * slapo_backward, NOMEM. */
static slapo_status add_backward(slapo_runner *r, slapo_ctx *ctx, slapo__build_state *bs,
                                 slapo_node *y, built_step *b) {
  if (y->ndim != 0)
    return slapo_error(SLAPO_INVALID_ARG,
                       "step: train mode needs a scalar loss from the %s forward, got shape %s",
                       r->root->type->name,
                       slapo_shape_str(y->ndim, y->shape, (char[64]){0}, 64));
  int n = (int)slapo_map_count(bs->param_nodes);
  slapo_node **wrt = slapo_calloc((size_t)n + 1, sizeof *wrt);
  slapo_node **outs = slapo_calloc((size_t)n + 1, sizeof *outs);
  b->params = slapo_calloc((size_t)n + 1, sizeof *b->params);
  slapo_status s = SLAPO_OK;
  if (!wrt || !outs || !b->params) s = slapo_error(SLAPO_NOMEM, "step: out of memory");
  for (int i = 0; s == SLAPO_OK && i < n; i++) {
    wrt[i] = slapo_map_value_at(bs->param_nodes, (size_t)i);
    b->params[i] = slapo_map_value_at(bs->param_objs, (size_t)i);
  }
  if (s == SLAPO_OK) b->n_params = n, s = find_absent(r->root, b);
  if (s == SLAPO_OK) {
    outs[0] = y;
    slapo_node *dloss = slapo_input(ctx, "dloss", SLAPO_DTYPE_F32, 0, NULL);
    s = dloss ? slapo_backward(ctx, y, dloss, n, wrt, outs + 1) : slapo_ctx_status(ctx);
  }
  if (s == SLAPO_OK && !slapo_output(ctx, n + 1, outs)) s = slapo_ctx_status(ctx);
  slapo_free(wrt);
  slapo_free(outs);
  return s;
}

slapo_status slapo__step_forward(slapo_module *root, slapo_ctx *ctx, slapo__build_state *bs,
                                 int n_in, const slapo_tensor *const *in, slapo_node **ins,
                                 slapo_node **y) {
  *y = NULL;
  slapo_ctx_set_user(ctx, bs);
  for (int i = 0; i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    ins[i] = slapo_input(ctx, name, in[i]->dtype, in[i]->ndim, in[i]->shape);
  }
  slapo_node *v = slapo_ctx_status(ctx) == SLAPO_OK ? slapo__forward(ctx, root, n_in, ins) : NULL;
  SLAPO_TRY(slapo_ctx_status(ctx));
  if (!v) return slapo_error(SLAPO_STATE, "step: the %s forward returned no value", root->type->name);
  if (v->kind == SLAPO_NODE_TUPLE)
    return slapo_error(SLAPO_INVALID_ARG, "step: the %s forward returned a tuple of %d values; a "
                       "step's root returns one value (the loss in train mode, the logits in eval "
                       "mode): return the item it needs", root->type->name, v->n_results);
  SLAPO_TRY(slapo__prune_tuples(slapo_ctx_graph(ctx), 1, &v, bs));
  *y = v;
  return SLAPO_OK;
}

/* Builds the step graph and plans it. With `estimate` non-NULL only the
 * planned activation peak is computed, into *estimate (nothing allocated,
 * parameters may be meta; b is cleared afterwards). */
static slapo_status build(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                          slapo_step_mode mode, built_step *b, size_t *estimate) {
  memset(b, 0, sizeof *b);
  b->mode = mode;
  b->version = r->version + slapo_module_version(r->root);
  b->n_in = n_in;
  for (int i = 0; i < n_in; i++) {
    b->dtypes[i] = in[i]->dtype;
    b->ndims[i] = in[i]->ndim;
    memcpy(b->shapes[i], in[i]->shape, sizeof b->shapes[i]);
  }
  slapo_ctx *ctx = NULL;
  slapo__build_state bs = {0};
  slapo_status s = slapo__check_shards(r->root);
  if (s == SLAPO_OK) s = slapo_graph_new(&b->g);
  if (s == SLAPO_OK) s = slapo_ctx_new(b->g, &ctx);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_nodes);
  if (s == SLAPO_OK) s = slapo_map_new(&bs.param_objs);
  if (s != SLAPO_OK) goto done;
  slapo_node *ins[SLAPO_STEP_MAX_INPUTS], *y;
  if ((s = slapo__step_forward(r->root, ctx, &bs, n_in, in, ins, &y)) != SLAPO_OK) goto done;
  slapo__index_bounds(r->root, n_in, ins, b->bounds);
  int n = (int)slapo_map_count(bs.param_nodes);
  if (mode == SLAPO_STEP_TRAIN) s = add_backward(r, ctx, &bs, y, b);
  else if (!slapo_output(ctx, 1, &y)) s = slapo_ctx_status(ctx);
  /* The step's graph rewrites (src/rewrite/step_rules.def): split
   * gradients joined with one concat, an embedding's gradient scattered
   * into its tied weight's, residual adds folded into the norm backwards,
   * identity dropouts removed. */
  if (s == SLAPO_OK) s = slapo__step_rules(b->g, mode == SLAPO_STEP_TRAIN);
  if (s != SLAPO_OK) goto done;
  slapo_logf(1, "step: built %s graph with %d nodes, %d parameters",
             mode == SLAPO_STEP_TRAIN ? "train" : "eval", slapo_graph_count(b->g), n);
  /* Gradients (outputs 1..n) are added into each parameter's grad by the
   * executor as soon as they are computed (while in cache), so they do not
   * stay in the activation arena until the step ends. */
  slapo_plan_opts po = r->opts;
  po.accumulate_from = mode == SLAPO_STEP_TRAIN ? 1 : 0;
  if (estimate) {
    s = slapo_plan_estimate(b->g, &po, estimate);
    step_clear(b);
    goto done;
  }
  s = slapo_plan_new(b->g, &po, &b->plan);
  for (int i = 0; s == SLAPO_OK && i < n; i++) {
    slapo_parameter *p = slapo_map_value_at(bs.param_objs, (size_t)i);
    s = slapo_plan_bind_param(b->plan, p->path, p->value);
    if (s == SLAPO_OK && mode == SLAPO_STEP_TRAIN)
      s = slapo_plan_bind_accumulator(b->plan, i + 1, p->grad);
  }
  if (s == SLAPO_OK && getenv("SLAPO_DEBUG_STEP") && !(b->text = graph_text(b->g)))
    s = slapo_error(SLAPO_NOMEM, "step: out of memory");
done:
  slapo_map_free(bs.param_nodes);
  slapo_map_free(bs.param_objs);
  slapo_ctx_free(ctx);
  if (s != SLAPO_OK) step_clear(b);
  return s;
}

slapo_status slapo_step(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                        slapo_step_mode mode, const slapo_kernel_env *env,
                        const slapo_tensor **out) {
  return slapo_step_scaled(r, n_in, in, mode, env, 1.0f, out);
}

slapo_status slapo_step_scaled(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                               slapo_step_mode mode, const slapo_kernel_env *env,
                               float loss_scale, const slapo_tensor **out) {
  return slapo_step_grads(r, n_in, in, mode, env, loss_scale, SLAPO_ACC_ADD, out);
}

slapo_status slapo_step_grads(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                              slapo_step_mode mode, const slapo_kernel_env *env, float loss_scale,
                              unsigned grads, const slapo_tensor **out) {
  if (out) *out = NULL;
  SLAPO_NEED(r, "step");
  if (n_in > 0) SLAPO_NEED(in, "step");
  for (int i = 0; i < n_in && i < SLAPO_STEP_MAX_INPUTS; i++)
    if (!in[i]) return slapo_error(SLAPO_INVALID_ARG, "step: input %d is NULL", i);
  if (grads & ~(unsigned)(SLAPO_ACC_WRITE | SLAPO_ACC_MEASURE))
    return slapo_error(SLAPO_INVALID_ARG, "step: unknown gradient flags 0x%x", grads);
  if (n_in < 0 || n_in > SLAPO_STEP_MAX_INPUTS)
    return slapo_error(SLAPO_INVALID_ARG, "step: %d inputs (at most %d, SLAPO_STEP_MAX_INPUTS)",
                       n_in, SLAPO_STEP_MAX_INPUTS);
  bool debug = getenv("SLAPO_DEBUG_STEP") != NULL;
  uint64_t version = r->version + slapo_module_version(r->root);
  if (!r->have || debug || !key_matches(&r->cur, version, n_in, in, mode)) {
    SLAPO_TRY(slapo_module_check_materialized(r->root, "step"));
    built_step nb;
    SLAPO_TRY(build(r, n_in, in, mode, &nb, NULL));
    if (debug && r->have && key_matches(&r->cur, nb.version, n_in, in, mode) && r->cur.text &&
        strcmp(r->cur.text, nb.text)) {
      step_clear(&nb);
      return slapo_error(SLAPO_STATE, "step: rebuilt graph differs from the cached one "
                                      "(SLAPO_DEBUG_STEP); the model changed without "
                                      "slapo_runner_invalidate");
    }
    step_clear(&r->cur);
    r->cur = nb;
    r->have = true;
  }
  built_step *b = &r->cur;
  for (int i = 0; i < n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "in%d", i);
    SLAPO_TRY(slapo_plan_bind_input(b->plan, name, in[i]));
    SLAPO_TRY(slapo__index_check(&b->bounds[i], i, in[i]));
  }
  if (mode == SLAPO_STEP_TRAIN) {
    *(float *)slapo_tensor_data(r->dloss) = loss_scale;
    SLAPO_TRY(slapo_plan_bind_input(b->plan, "dloss", r->dloss));
  }
  slapo_kernel_env e = env ? *env : (slapo_kernel_env){0};
  e.training = mode == SLAPO_STEP_TRAIN && (!env || env->training);
  /* TRAIN: the run also adds (or writes) each gradient into its
   * parameter's grad. */
  b->measured = false;
  if (mode == SLAPO_STEP_TRAIN && (grads & SLAPO_ACC_WRITE))
    for (int i = 0; i < b->n_absent; i++)
      if (b->absent[i]->grad)
        memset(slapo_tensor_data(b->absent[i]->grad), 0, slapo_tensor_nbytes(b->absent[i]->grad));
  SLAPO_TRY(slapo_plan_run_acc(b->plan, &e, mode == SLAPO_STEP_TRAIN ? grads : SLAPO_ACC_ADD));
  b->measured = mode == SLAPO_STEP_TRAIN && (grads & SLAPO_ACC_MEASURE);
  if (out) *out = slapo_plan_output(b->plan, 0);
  return SLAPO_OK;
}

slapo_status slapo_runner_grad_sumsq(const slapo_runner *r, double *replicated, double *sharded) {
  *replicated = *sharded = 0;
  const built_step *b = &r->cur;
  if (!r->have || !b->measured)
    return slapo_error(SLAPO_STATE, "runner_grad_sumsq: the last step was not a TRAIN step run "
                                    "with SLAPO_ACC_MEASURE");
  for (int i = 0; i < b->n_params; i++) {
    const slapo_parameter *p = b->params[i];
    double sq = slapo_plan_accumulator_sumsq(b->plan, i + 1);
    if (slapo_parameter_is_sharded(p)) *sharded += sq;
    else *replicated += sq;
  }
  return SLAPO_OK;
}

slapo_status slapo_runner_estimate(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                                   slapo_step_mode mode, size_t *peak_nbytes) {
  *peak_nbytes = 0;
  if (n_in < 0 || n_in > SLAPO_STEP_MAX_INPUTS)
    return slapo_error(SLAPO_INVALID_ARG, "step: %d inputs (at most %d, SLAPO_STEP_MAX_INPUTS)",
                       n_in, SLAPO_STEP_MAX_INPUTS);
  /* A meta model's parameters get their paths, which building needs. */
  SLAPO_TRY(slapo_module_name_params(r->root));
  built_step b;
  return build(r, n_in, in, mode, &b, peak_nbytes);
}

size_t slapo_runner_peak_nbytes(const slapo_runner *r) {
  return r->have ? slapo_plan_peak_nbytes(r->cur.plan) : 0;
}
const slapo_plan *slapo_runner_plan(const slapo_runner *r) { return r->have ? r->cur.plan : NULL; }
const slapo_graph *slapo_runner_graph(const slapo_runner *r) { return r->have ? r->cur.g : NULL; }
