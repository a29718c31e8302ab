/* tests/primitives/prim_test.h - helpers the primitive and apply tests share
 * (header only: every test file is its own executable): a tiny materialized
 * GPT-2 and a schedule over it, token batches, one eval + one train step
 * with logits, loss and every gradient by parameter path (of one model, or
 * of a plain and a scheduled one), bitwise and tolerance comparisons, and a
 * snapshot of a schedule (log, module tree, schedule tree, checkpoint flags,
 * parameter tags, model version) to prove a failed primitive changed nothing
 * (PT_EXPECT_REFUSED). Include after <cmocka.h>. */
#ifndef SLAPO_TESTS_PRIM_TEST_H
#define SLAPO_TESTS_PRIM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "slapo/models.h"
#include "slapo/pattern.h"

/* n_layer, n_head, n_embd, n_ctx, vocab, dropout, ln_eps. */
static const slapo_gpt2_config k_tiny = {2, 4, 32, 32, 256, 0.1, 1e-5};
static const slapo_gpt2_config k_tiny4 = {4, 4, 32, 32, 256, 0.1, 1e-5};

#define PT_SEED 7
#define PT_B 2
#define PT_T 16

/* A materialized GPT-2 (same weights for the same config and seed). */
static inline slapo_module *pt_model(const slapo_gpt2_config *cfg) {
  slapo_module *m;
  OK(slapo_gpt2_new(cfg, &m));
  OK(slapo_module_materialize(m, PT_SEED));
  return m;
}

/* A schedule tree over a fresh pt_model(cfg); owned with its model
 * (pt_sched_free). The model is slapo_sched_module(root). */
static inline slapo_sched *pt_sched_new(const slapo_gpt2_config *cfg) {
  slapo_sched *root;
  OK(slapo_sched_create(pt_model(cfg), &root));
  return root;
}

/* Frees root's tree and the model under it (NULL is fine). */
static inline void pt_sched_free(slapo_sched *root) {
  if (!root) return;
  slapo_module *m = slapo_sched_module(root);
  slapo_sched_free(root);
  slapo_module_free(m);
}

/* The schedule node at `path` below root (borrowed from root's tree). */
static inline slapo_sched *pt_at(slapo_sched *root, const char *path) {
  slapo_sched *n;
  OK(slapo_sched_at(root, path, &n));
  return n;
}

/* idx and targets [B, T] i32 token ids below `vocab`. */
static inline void pt_inputs(int64_t B, int64_t T, int64_t vocab, slapo_tensor *in[2]) {
  int64_t bt[2] = {B, T};
  for (int j = 0; j < 2; j++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &in[j]));
    int32_t *d = slapo_tensor_data(in[j]); /* [B, T] */
    for (int64_t i = 0; i < B * T; i++) d[i] = (int32_t)((i * 37 + j * 11 + 5) % vocab);
  }
}

static inline void pt_inputs_free(slapo_tensor *in[2]) {
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
}

/* ---- running a model ---- */

#define PT_MAX_PARAMS 128

typedef struct pt_result {
  float loss;              /* train mode, dropout on       */
  slapo_tensor *logits;    /* eval mode [B, T, V], owned   */
  int n;                   /* parameters, in visit order    */
  char *paths[PT_MAX_PARAMS];
  slapo_tensor *grads[PT_MAX_PARAMS];
  slapo_parameter *params[PT_MAX_PARAMS]; /* borrowed from the model */
  size_t peak_train;       /* planned activation peak, train step */
} pt_result;

static inline void pt_take_grad(slapo_parameter *p, const char *path, void *ud) {
  pt_result *r = ud;
  assert_true(r->n < PT_MAX_PARAMS);
  r->paths[r->n] = slapo_strdup(path);
  r->params[r->n] = p;
  OK(slapo_tensor_contiguous(p->grad, &r->grads[r->n]));
  r->n++;
}

/* One eval step (logits) and one train step (loss, gradients; dropout on)
 * with fresh runners and fixed RNG keys. */
static inline void pt_run(slapo_module *m, slapo_tensor *const *in, pt_result *r) {
  memset(r, 0, sizeof *r);
  slapo_runner *run;
  const slapo_tensor *out;
  OK(slapo_runner_new(m, NULL, &run));
  slapo_kernel_env env = {.seed = 2024, .step = 3, .training = false};
  OK(slapo_step(run, 1, (const slapo_tensor *const *)in, SLAPO_STEP_EVAL, &env, &out));
  OK(slapo_tensor_contiguous(out, &r->logits));
  slapo_runner_free(run);
  OK(slapo_runner_new(m, NULL, &run));
  slapo_module_zero_grad(m);
  env.training = true;
  OK(slapo_step(run, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, &out));
  r->loss = *(const float *)slapo_tensor_data(out);
  r->peak_train = slapo_runner_peak_nbytes(run);
  slapo_runner_free(run);
  OK(slapo_module_visit_params(m, pt_take_grad, r));
}

/* Whether pipeline stage st holds (reads) the parameter at `path`. */
static inline bool pt_stage_holds(const slapo_pp_stage *st, const char *path) {
  for (int i = 0; i < slapo_pp_stage_n_params(st); i++)
    if (!strcmp(slapo_pp_stage_param(st, i)->path, path)) return true;
  return false;
}

static inline void pt_result_free(pt_result *r) {
  slapo_tensor_free(r->logits);
  for (int i = 0; i < r->n; i++) slapo_free(r->paths[i]), slapo_tensor_free(r->grads[i]);
  memset(r, 0, sizeof *r);
}

/* Runs a plain pt_model(cfg) into *plain and root's model (built from the
 * same cfg, then scheduled) into *sched, both with pt_run on one token batch
 * [PT_B, T] from pt_inputs. Free both with pt_result_free; plain->params
 * are NULL (the plain model is freed here). */
static inline void pt_run_both(slapo_sched *root, const slapo_gpt2_config *cfg, int64_t T,
                               pt_result *plain, pt_result *sched) {
  slapo_tensor *in[2];
  pt_inputs(PT_B, T, cfg->vocab_size, in);
  slapo_module *ref = pt_model(cfg);
  pt_run(ref, in, plain);
  pt_run(slapo_sched_module(root), in, sched);
  slapo_module_free(ref);
  memset(plain->params, 0, sizeof plain->params);
  pt_inputs_free(in);
}

/* A plain pt_model(cfg) and root's model on one batch [B, T]: bitwise
 * equal, or within 1e-5 + 1e-4 |b| when !bitwise. Defined below. */
static inline void pt_expect_same_as_plain(slapo_sched *root, const slapo_gpt2_config *cfg,
                                           int64_t B, int64_t T, bool bitwise);

static inline bool pt_same_bytes(const slapo_tensor *a, const slapo_tensor *b) {
  return slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape) &&
         slapo_tensor_nbytes(a) == slapo_tensor_nbytes(b) &&
         !memcmp(slapo_tensor_data(a), slapo_tensor_data(b), slapo_tensor_nbytes(a));
}

/* Same parameter paths, byte-equal loss, logits and gradients. */
static inline void pt_expect_bitwise(const pt_result *a, const pt_result *b) {
  assert_int_equal(a->n, b->n);
  assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
  if (!pt_same_bytes(a->logits, b->logits)) fail_msg("logits differ bitwise");
  for (int i = 0; i < a->n; i++) {
    assert_string_equal(a->paths[i], b->paths[i]);
    if (!pt_same_bytes(a->grads[i], b->grads[i]))
      fail_msg("gradient of %s differs bitwise", a->paths[i]);
  }
}

/* Worst |x - y| / (atol + rtol |y|) over two tensors of one shape. */
static inline double pt_worst(const slapo_tensor *x, const slapo_tensor *y, double atol,
                              double rtol) {
  assert_true(slapo_shape_equal(x->ndim, x->shape, y->ndim, y->shape));
  const float *a = slapo_tensor_data(x), *b = slapo_tensor_data(y); /* [numel] */
  double worst = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(x); i++) {
    double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  return worst;
}

/* Same parameter paths; loss, logits and gradients within atol + rtol |b|. */
static inline void pt_expect_close(const pt_result *a, const pt_result *b, double atol,
                                   double rtol) {
  assert_int_equal(a->n, b->n);
  double worst = fabs((double)a->loss - b->loss) / (atol + rtol * fabs((double)b->loss));
  if (!(worst <= 1)) fail_msg("loss %.9g vs %.9g", a->loss, b->loss);
  double w = pt_worst(a->logits, b->logits, atol, rtol);
  if (!(w <= 1)) fail_msg("logits differ: %.3g of the tolerance", w);
  worst = w > worst ? w : worst;
  for (int i = 0; i < a->n; i++) {
    assert_string_equal(a->paths[i], b->paths[i]);
    w = pt_worst(a->grads[i], b->grads[i], atol, rtol);
    if (!(w <= 1)) fail_msg("gradient of %s differs: %.3g of the tolerance", a->paths[i], w);
    worst = w > worst ? w : worst;
  }
  print_message("loss %.7f vs %.7f; %d gradients and the logits within tolerance (worst %.3g "
                "of it)\n",
                a->loss, b->loss, a->n, worst);
}

/* ---- text captures ---- */

typedef void (*pt_print_fn)(const void *obj, FILE *f);

static inline char *pt_capture(pt_print_fn fn, const void *obj) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  fn(obj, f);
  fclose(f);
  return buf; /* free() */
}

static inline void pt_print_module(const void *m, FILE *f) { slapo_module_print(m, f); }
static inline void pt_print_sched(const void *s, FILE *f) { slapo_sched_print(s, f); }
static inline void pt_print_log(const void *l, FILE *f) { slapo_sched_log_print(l, f); }
static inline void pt_print_entry(const void *e, FILE *f) { slapo_sched_entry_print(e, f); }

/* Paths of every checkpointed module below m, one a line. */
static inline void pt_print_ckpt_rec(const slapo_module *m, FILE *f) {
  if (m->checkpoint) {
    char *p = slapo_module_path(m);
    fprintf(f, "%s\n", p[0] ? p : ".");
    slapo_free(p);
  }
  for (int i = 0; i < m->n_children; i++) pt_print_ckpt_rec(m->children[i], f);
}
static inline void pt_print_ckpt(const void *m, FILE *f) { pt_print_ckpt_rec(m, f); }

/* Every parameter's tags (annotate), "path key=value ..." one a line. */
static inline void pt_print_tags_one(slapo_parameter *p, const char *path, void *ud) {
  FILE *f = ud;
  fprintf(f, "%s", path);
  for (size_t i = 0; p->tags && i < slapo_map_count(p->tags); i++)
    fprintf(f, " %s=%s", slapo_map_key_at(p->tags, i),
            (const char *)slapo_map_value_at(p->tags, i));
  fprintf(f, " no_weight_decay=%d\n", p->no_weight_decay);
}
static inline void pt_print_tags(const void *m, FILE *f) {
  OK(slapo_module_visit_params((slapo_module *)m, pt_print_tags_one, f));
}

/* Collapses runs of spaces and tabs into one space and drops trailing ones;
 * owned (free()). */
static inline char *pt_collapse(const char *s) {
  char *d = malloc(strlen(s) + 1), *o = d;
  assert_non_null(d);
  for (; *s; s++) {
    if (*s == ' ' || *s == '\t') {
      if (o > d && o[-1] != ' ' && o[-1] != '\n') *o++ = ' ';
    } else {
      if (*s == '\n' && o > d && o[-1] == ' ') o--;
      *o++ = *s;
    }
  }
  if (o > d && o[-1] == ' ') o--;
  *o = '\0';
  return d;
}

/* The last log entry of root's tree as a .sched line, spaces collapsed;
 * owned (free()). */
static inline char *pt_last_line(slapo_sched *root) {
  const slapo_sched_log *log = slapo_sched_log_of(root);
  assert_true(slapo_sched_log_count(log) > 0);
  const slapo_sched_entry *last = slapo_sched_log_entry(log, slapo_sched_log_count(log) - 1);
  char *raw = pt_capture(pt_print_entry, last);
  char *c = pt_collapse(raw);
  free(raw);
  return c;
}

/* The last data line of the printed log (slapo_sched_log_print), spaces
 * collapsed; owned (free()). */
static inline char *pt_last_printed_line(slapo_sched *root) {
  char *raw = pt_capture(pt_print_log, slapo_sched_log_of(root));
  char *c = pt_collapse(raw);
  free(raw);
  size_t n = strlen(c);
  if (n && c[n - 1] == '\n') c[--n] = '\0';
  char *nl = strrchr(c, '\n');
  char *line = strdup(nl ? nl + 1 : c);
  free(c);
  return line;
}

/* ---- snapshots: a failed primitive changes nothing ---- */

typedef struct pt_snap {
  size_t n_log;
  uint64_t version;
  char *module_text, *sched_text, *ckpt_text, *log_text, *tags_text;
} pt_snap;

static inline void pt_snap_take(slapo_sched *root, pt_snap *s) {
  slapo_module *m = slapo_sched_module(root);
  s->n_log = slapo_sched_log_count(slapo_sched_log_of(root));
  s->version = slapo_module_version(m);
  s->module_text = pt_capture(pt_print_module, m);
  s->sched_text = pt_capture(pt_print_sched, root);
  s->ckpt_text = pt_capture(pt_print_ckpt, m);
  s->log_text = pt_capture(pt_print_log, slapo_sched_log_of(root));
  s->tags_text = pt_capture(pt_print_tags, m);
}

static inline void pt_snap_free(pt_snap *s) {
  free(s->module_text), free(s->sched_text), free(s->ckpt_text), free(s->log_text);
  free(s->tags_text);
  memset(s, 0, sizeof *s);
}

/* Checks the tree, its log, checkpoint flags and version equal `before`;
 * frees `before`. */
static inline void pt_snap_expect_same(slapo_sched *root, pt_snap *before) {
  pt_snap now;
  pt_snap_take(root, &now);
  assert_int_equal(now.n_log, before->n_log);
  assert_int_equal(now.version, before->version);
  assert_string_equal(now.module_text, before->module_text);
  assert_string_equal(now.sched_text, before->sched_text);
  assert_string_equal(now.ckpt_text, before->ckpt_text);
  assert_string_equal(now.log_text, before->log_text);
  assert_string_equal(now.tags_text, before->tags_text);
  pt_snap_free(&now);
  pt_snap_free(before);
}

/* Checks status and that the thread's message holds every needle
 * (NULL-terminated). */
static inline void pt_expect_error(slapo_status got, slapo_status want,
                                   const char *const *needles) {
  const char *msg = slapo_last_error();
  print_message("%s: %s\n", slapo_status_name(got), msg);
  assert_int_equal(got, want);
  for (; *needles; needles++)
    if (!strstr(msg, *needles)) fail_msg("message '%s' lacks '%s'", msg, *needles);
}

#define PT_EXPECT_ERROR(got, want, ...) \
  pt_expect_error((got), (want), (const char *const[]){__VA_ARGS__, NULL})

/* A primitive refuses: `call` (evaluated once, after the snapshot) returns
 * `want` with a message holding every needle, and root's tree, log,
 * checkpoint flags, tags and model version are exactly as before it.
 * `root` is evaluated twice. */
#define PT_EXPECT_REFUSED(root, call, want, ...)  \
  do {                                            \
    pt_snap before_;                              \
    pt_snap_take((root), &before_);               \
    PT_EXPECT_ERROR((call), (want), __VA_ARGS__); \
    pt_snap_expect_same((root), &before_);        \
  } while (0)

static inline void pt_expect_same_as_plain(slapo_sched *root, const slapo_gpt2_config *cfg,
                                           int64_t B, int64_t T, bool bitwise) {
  slapo_tensor *in[2];
  pt_inputs(B, T, cfg->vocab_size, in);
  slapo_module *ref = pt_model(cfg);
  pt_result a, b;
  pt_run(ref, in, &a);
  pt_run(slapo_sched_module(root), in, &b);
  if (bitwise) pt_expect_bitwise(&a, &b);
  else pt_expect_close(&a, &b, 1e-5, 1e-4);
  pt_result_free(&a);
  pt_result_free(&b);
  slapo_module_free(ref);
  pt_inputs_free(in);
}

/* A text pattern (fails the test when it does not parse). */
static inline slapo_pattern *pt_parse(const char *text) {
  slapo_pattern *p;
  if (slapo_pattern_parse(text, &p) != SLAPO_OK) fail_msg("%s", slapo_last_error());
  return p;
}

/* Applies .sched text to root's tree (globs expand per block), failing the
 * test with the primitive's message on error. */
static inline void pt_apply(slapo_sched *root, const char *text) {
  slapo_sched_log *log;
  if (slapo_sched_parse(text, "test.sched", &log) != SLAPO_OK ||
      slapo_apply_schedule(root, log, NULL, 0, 0, NULL) != SLAPO_OK)
    fail_msg("%s", slapo_last_error());
  slapo_sched_log_free(log);
}

/* ---- replay: the log of `root` read back and applied to a fresh model
 * gives the same schedule tree, checkpoint flags and tags ---- */

static inline void pt_expect_replays(slapo_sched *root, const slapo_gpt2_config *cfg) {
  char *text = pt_capture(pt_print_log, slapo_sched_log_of(root));
  slapo_sched_log *log;
  OK(slapo_sched_parse(text, "replay.sched", &log));
  slapo_module *m = pt_model(cfg);
  slapo_sched *r2;
  OK(slapo_sched_create(m, &r2));
  size_t n = 0;
  OK(slapo_apply_schedule(r2, log, NULL, 0, 0, &n));
  assert_int_equal(n, slapo_sched_log_count(slapo_sched_log_of(root)));
  char *a = pt_capture(pt_print_sched, root), *b = pt_capture(pt_print_sched, r2);
  assert_string_equal(a, b);
  free(a), free(b);
  a = pt_capture(pt_print_ckpt, slapo_sched_module(root));
  b = pt_capture(pt_print_ckpt, m);
  assert_string_equal(a, b);
  free(a), free(b);
  a = pt_capture(pt_print_tags, slapo_sched_module(root));
  b = pt_capture(pt_print_tags, m);
  assert_string_equal(a, b);
  free(a), free(b);
  /* The replayed log prints the same lines (the source file aside). */
  char *text2 = pt_capture(pt_print_log, slapo_sched_log_of(r2));
  assert_string_equal(text, text2);
  free(text), free(text2);
  slapo_sched_free(r2);
  slapo_module_free(m);
  slapo_sched_log_free(log);
}

#endif
