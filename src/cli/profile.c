/* cli/profile.c - `slapo profile`: where a training step goes, per module
 * (slapo_profile_run in train/profile.c measures; this prints), for one
 * schedule or two side by side (--compare A,B). Layer: cli. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"

typedef struct profile_args {
  cli_model_opts mo;
  int64_t batch, seq, steps, depth, seed;
  const char *compare; /* "A,B" or NULL */
} profile_args;

static void profile_usage(void) {
  printf("usage: slapo profile [--model NAME] [--config NAME] [--schedule FILE [--disable LIST]]\n"
         "                     [--batch B] [--seq T] [--steps K] [--depth N] [--seed S]\n"
         "       slapo profile --compare A,B [options]\n\n"
         "Builds the model (random init), applies the schedule, runs one warm-up and K\n"
         "measured training steps (forward, backward, AdamW) on random token batches\n"
         "[B, T] with per-node timing, and prints per module: forward and backward ms\n"
         "(mean over the K steps), share of the step, and the activation memory the\n"
         "module holds at the step's live peak. Backward is every node after the loss\n"
         "gradient's seed (gradients and checkpoint recomputation). With --compare,\n"
         "profiles the model under schedule A and under schedule B and prints both with\n"
         "the ratios B/A.\n\n");
  cli_model_usage(stdout, NULL);
  printf("  --batch B           sequences per step [4]\n"
         "  --seq T             tokens per sequence [64, at most the context]\n"
         "  --steps K           measured steps after the warm-up step [5]\n"
         "  --depth N           module levels kept below the root's children (a list\n"
         "                      index stays on its list's level) [2]\n"
         "  --seed S            weights, batches and dropout [1337]\n"
         "  --compare A,B       two schedules, profiled one after the other; each is\n"
         "                      what --schedule takes ('default', 'none' or empty: no\n"
         "                      schedule, or a .sched file)\n");
}

static const double MiB = 1024.0 * 1024.0;

static void count_sharded(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  *(int64_t *)ud += p->shard != NULL;
}

/* As train: --tp K over a model the schedule shards nothing of runs the
 * whole model K times (rank 0 prints). */
static slapo_status warn_unsharded(slapo_module *m, const char *schedule) {
  int tp = slapo_dist_size(SLAPO_GROUP_TP);
  int64_t sharded = 0;
  if (tp < 2) return SLAPO_OK;
  SLAPO_TRY(slapo_module_visit_params(m, count_sharded, &sharded));
  if (!sharded)
    printf("warning: --tp %d but no parameter is sharded (schedule: %s): each of the %d "
           "tensor-parallel ranks runs the whole model\n", tp, schedule ? schedule : "none", tp);
  return SLAPO_OK;
}

/* Builds the model as `slapo train` does: meta, scheduled, materialized. */
static slapo_status run_one(const profile_args *a, const char *schedule, const size_t *disabled,
                            size_t n_disabled, int64_t seq, slapo_profile *out) {
  const slapo_model_family *f = a->mo.family;
  slapo_model_dims d;
  SLAPO_TRY(f->dims(a->mo.config, &d));
  slapo_module *m = NULL;
  slapo_schedule_run run = {0};
  slapo_status s = f->create(a->mo.config, NULL, &m);
  if (s == SLAPO_OK && (schedule || a->mo.precision))
    s = slapo_schedule_file_apply(m, schedule, a->mo.precision, disabled, n_disabled, &run);
  if (s == SLAPO_OK) s = warn_unsharded(m, schedule);
  if (s == SLAPO_OK) s = slapo_module_materialize(m, (uint64_t)a->seed);
  if (s == SLAPO_OK) {
    slapo_profile_opts po = {a->batch, seq, d.vocab_size, (int)a->steps, (int)a->depth,
                             (uint64_t)a->seed};
    s = slapo_profile_run(m, &po, out);
  }
  slapo_schedule_run_deinit(&run);
  slapo_module_free(m);
  return s;
}

static void print_header(const profile_args *a, int64_t seq, const char *what) {
  char cpu[256], kernels[256];
  slapo_cpu_model(cpu, sizeof cpu);
  slapo_kernels_describe(kernels, sizeof kernels);
  printf("slapo profile: model=%s config=%s %s batch=%lld seq=%lld steps=%lld depth=%lld "
         "seed=%lld\n",
         a->mo.model, a->mo.config, what, (long long)a->batch, (long long)seq,
         (long long)a->steps, (long long)a->depth, (long long)a->seed);
  printf("cpu: %s; %s; %d OpenMP threads\n", cpu, kernels, omp_get_max_threads());
  printf("fwd/bwd ms: mean per step over %lld measured steps after 1 warm-up step, the sum of\n"
         "  the executor's per-node wall times (plan timing) of the module's nodes; bwd = the\n"
         "  nodes after the loss-gradient seed 'dloss' (gradients, checkpoint recomputation)\n"
         "act MiB: planned activation buffers alive at the step's live activation peak, by\n"
         "  the module of the node that wrote them (saved forward values and backward\n"
         "  temporaries; weights, gradients and AdamW state not included)\n",
         (long long)a->steps);
}

static int path_width(const slapo_profile *p, const slapo_profile *q) {
  int w = 26;
  for (int k = 0; k < 2; k++) {
    const slapo_profile *x = k ? q : p;
    for (int i = 0; x && i < x->n_rows; i++) {
      int n = (int)strlen(x->rows[i].path);
      if (n > w) w = n;
    }
  }
  return w;
}

static void print_one(const profile_args *a, const char *schedule, int64_t seq,
                      const slapo_profile *p) {
  char what[4200];
  snprintf(what, sizeof what, "schedule=%s", schedule ? schedule : "none");
  print_header(a, seq, what);
  printf("step graph: %d nodes; last loss %.4f\n\n", p->n_nodes, p->loss);
  int w = path_width(p, NULL);
  double t = p->step_ms > 0 ? p->step_ms : 1;
  printf("%-*s %10s %10s %10s %7s %10s\n", w, "module", "fwd ms", "bwd ms", "total ms", "share",
         "act MiB");
  double fwd = 0, bwd = 0;
  for (int i = 0; i < p->n_rows; i++) {
    const slapo_profile_row *r = &p->rows[i];
    fwd += r->fwd_ms, bwd += r->bwd_ms;
    printf("%-*s %10.3f %10.3f %10.3f %6.1f%% %10.2f\n", w, r->path, r->fwd_ms, r->bwd_ms,
           r->fwd_ms + r->bwd_ms, 100 * (r->fwd_ms + r->bwd_ms) / t, (double)r->act_nbytes / MiB);
  }
  printf("%-*s %10s %10s %10.3f %6.1f%% %10s\n", w, "gradients into grads", "", "",
         p->grads_ms, 100 * p->grads_ms / t, "");
  printf("%-*s %10s %10s %10.3f %6.1f%% %10s\n", w, "optimizer (AdamW)", "", "",
         p->optimizer_ms, 100 * p->optimizer_ms / t, "");
  printf("%-*s %10s %10s %10.3f %6.1f%% %10s\n", w, "other (untimed executor)", "", "",
         p->other_ms, 100 * p->other_ms / t, "");
  printf("%-*s %10.3f %10.3f %10.3f %6.1f%% %10.2f\n", w, "total (measured step)", fwd, bwd,
         p->step_ms, 100.0, (double)p->live_peak_nbytes / MiB);
  printf("\nactivation peak: live %.2f MiB (the act MiB total), planned arena %.2f MiB "
         "(with fragmentation)\n",
         (double)p->live_peak_nbytes / MiB, (double)p->planned_peak_nbytes / MiB);
  printf("gradients: written into the grads by the kernels that compute them and measured for "
         "the norm; optimizer: gradient norm + AdamW update, as in slapo train\n");
  if (p->live_peak_nbytes != p->measured_peak_nbytes)
    printf("note: the executor measured a live peak of %.2f MiB, the plan's buffers at its "
           "peak add up to another figure (a bug: please report it)\n",
           (double)p->measured_peak_nbytes / MiB);
}

static const slapo_profile_row *find_row(const slapo_profile *p, const char *path) {
  for (int i = 0; i < p->n_rows; i++)
    if (!strcmp(p->rows[i].path, path)) return &p->rows[i];
  return NULL;
}

/* B/A, or '-' where a side has no such row (a module only one schedule
 * has: 0.00x read as B being free) or A's figure is 0. */
static void ratio(bool both, double b, double a) {
  if (both && a > 0) printf(" %7.2fx", b / a);
  else printf(" %8s", "-");
}

/* One column group: fwd, bwd, total ms and MiB; a NULL row prints dashes,
 * and a row without nodes (optimizer, other) only its total. */
static void group(const slapo_profile_row *r, bool total_only) {
  if (!r) printf(" | %8s %8s %9s %8s", "-", "-", "-", "-");
  else if (total_only) printf(" | %8s %8s %9.2f %8s", "", "", r->fwd_ms, "");
  else
    printf(" | %8.2f %8.2f %9.2f %8.2f", r->fwd_ms, r->bwd_ms, r->fwd_ms + r->bwd_ms,
           (double)r->act_nbytes / MiB);
}

/* One compare line: A's group, B's, and B/A of time and memory. */
static void compare_line(int w, const char *name, const slapo_profile_row *ra,
                         const slapo_profile_row *rb, bool total_only) {
  printf("%-*s", w, name);
  group(ra, total_only);
  group(rb, total_only);
  printf(" |");
  bool both = ra && rb;
  ratio(both, both ? rb->fwd_ms + rb->bwd_ms : 0, both ? ra->fwd_ms + ra->bwd_ms : 0);
  if (total_only) printf(" %8s", "");
  else ratio(both, both ? (double)rb->act_nbytes : 0, both ? (double)ra->act_nbytes : 0);
  printf("\n");
}

static void print_compare(const profile_args *a, const char *sa, const char *sb, int64_t seq,
                          const slapo_profile *pa, const slapo_profile *pb) {
  char what[8400];
  snprintf(what, sizeof what, "compare A=%s B=%s", sa ? sa : "none", sb ? sb : "none");
  print_header(a, seq, what);
  printf("step graphs: A %d nodes, B %d nodes; last loss A %.4f, B %.4f\n\n", pa->n_nodes,
         pb->n_nodes, pa->loss, pb->loss);
  int w = path_width(pa, pb);
  printf("%-*s | %-36s | %-36s | B/A (- : A or B has none)\n", w, "", "A", "B");
  printf("%-*s | %8s %8s %9s %8s | %8s %8s %9s %8s | %8s %8s\n", w, "module", "fwd ms", "bwd ms",
         "total ms", "act MiB", "fwd ms", "bwd ms", "total ms", "act MiB", "time", "memory");
  for (int i = 0; i < pa->n_rows; i++)
    compare_line(w, pa->rows[i].path, &pa->rows[i], find_row(pb, pa->rows[i].path), false);
  for (int i = 0; i < pb->n_rows; i++)
    if (!find_row(pa, pb->rows[i].path))
      compare_line(w, pb->rows[i].path, NULL, &pb->rows[i], false);
  slapo_profile_row ga = {.fwd_ms = pa->grads_ms}, gb = {.fwd_ms = pb->grads_ms};
  compare_line(w, "gradients into grads", &ga, &gb, true);
  slapo_profile_row oa = {.fwd_ms = pa->optimizer_ms}, ob = {.fwd_ms = pb->optimizer_ms};
  compare_line(w, "optimizer (AdamW)", &oa, &ob, true);
  slapo_profile_row xa = {.fwd_ms = pa->other_ms}, xb = {.fwd_ms = pb->other_ms};
  compare_line(w, "other (untimed executor)", &xa, &xb, true);
  slapo_profile_row ta = {.act_nbytes = pa->live_peak_nbytes};
  slapo_profile_row tb = {.act_nbytes = pb->live_peak_nbytes};
  for (int i = 0; i < pa->n_rows; i++)
    ta.fwd_ms += pa->rows[i].fwd_ms, ta.bwd_ms += pa->rows[i].bwd_ms;
  for (int i = 0; i < pb->n_rows; i++)
    tb.fwd_ms += pb->rows[i].fwd_ms, tb.bwd_ms += pb->rows[i].bwd_ms;
  printf("%-*s | %8.2f %8.2f %9.2f %8.2f | %8.2f %8.2f %9.2f %8.2f |", w,
         "total (measured step)", ta.fwd_ms, ta.bwd_ms, pa->step_ms, (double)ta.act_nbytes / MiB,
         tb.fwd_ms, tb.bwd_ms, pb->step_ms, (double)tb.act_nbytes / MiB);
  ratio(true, pb->step_ms, pa->step_ms);
  ratio(true, (double)pb->live_peak_nbytes, (double)pa->live_peak_nbytes);
  printf("\n\nplanned activation arena (with fragmentation): A %.2f MiB, B %.2f MiB\n",
         (double)pa->planned_peak_nbytes / MiB, (double)pb->planned_peak_nbytes / MiB);
  for (int k = 0; k < 2; k++) {
    const slapo_profile *p = k ? pb : pa;
    if (p->live_peak_nbytes != p->measured_peak_nbytes)
      printf("note: %c: the executor measured a live peak of %.2f MiB; the per-module figures "
             "repeat the planner's liveness and disagree with it\n",
             k ? 'B' : 'A', (double)p->measured_peak_nbytes / MiB);
  }
}

/* Splits "A,B" into two schedule names (malloc'd copy in *buf); either
 * may be empty, the unscheduled model. */
static bool split_compare(const char *s, char **buf, const char **a, const char **b) {
  *buf = strdup(s);
  if (!*buf) return false;
  char *c = strchr(*buf, ',');
  if (!c || strchr(c + 1, ',')) return false;
  *c = '\0';
  *a = *buf, *b = c + 1;
  return true;
}

/* Profiles a->mo's schedule or, with --compare, schedules ca and cb (NULL:
 * none). */
static slapo_status profile(profile_args *a, const char *ca, const char *cb) {
  slapo_model_dims d;
  SLAPO_TRY(a->mo.family->dims(a->mo.config, &d));
  int64_t seq = a->seq;
  if (seq == 0) seq = d.n_ctx < 64 ? d.n_ctx : 64;
  if (seq > d.n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "profile: --seq %lld exceeds the %s context of %lld",
                       (long long)seq, a->mo.config, (long long)d.n_ctx);
  SLAPO_TRY(slapo_models_init());
  slapo_profile pa = {0}, pb = {0};
  slapo_status s;
  if (!a->compare) {
    s = run_one(a, a->mo.schedule, a->mo.disabled, a->mo.n_disabled, seq, &pa);
    if (s == SLAPO_OK) print_one(a, a->mo.schedule, seq, &pa);
  } else {
    s = run_one(a, ca, NULL, 0, seq, &pa);
    if (s == SLAPO_OK) s = run_one(a, cb, NULL, 0, seq, &pb);
    if (s == SLAPO_OK) print_compare(a, ca, cb, seq, &pa, &pb);
  }
  slapo_profile_deinit(&pa);
  slapo_profile_deinit(&pb);
  return s;
}

static bool profile_option(profile_args *a, int o, const char *v) {
  switch (o) {
  case OPT_BATCH: return cli_parse_i64(v, &a->batch) && a->batch > 0;
  case OPT_SEQ: return cli_parse_i64(v, &a->seq) && a->seq > 0;
  case OPT_STEPS: return cli_parse_i64(v, &a->steps) && a->steps > 0 && a->steps <= 100000;
  case OPT_DEPTH: return cli_parse_i64(v, &a->depth) && a->depth >= 0 && a->depth <= 64;
  case OPT_SEED: return cli_parse_i64(v, &a->seed) && a->seed >= 0;
  case OPT_COMPARE: a->compare = v; return *v != '\0';
  default: return false;
  }
}

typedef struct profile_ctx {
  const profile_args *a;
  const char *const *compare; /* the two resolved schedules, or NULL */
} profile_ctx;

/* What every rank must share beyond the model options: what is built and
 * run (and so the collectives). --depth only groups the printed rows. */
static void profile_fields(cli_fields *f, const void *ud) {
  const profile_ctx *pc = ud;
  cli_fields_i64(f, "--batch", pc->a->batch);
  cli_fields_i64(f, "--seq", pc->a->seq);
  cli_fields_i64(f, "--steps", pc->a->steps);
  cli_fields_i64(f, "--seed", pc->a->seed);
  cli_fields_file(f, "--compare A", pc->compare ? pc->compare[0] : NULL);
  cli_fields_file(f, "--compare B", pc->compare ? pc->compare[1] : NULL);
}

int cmd_profile(int argc, char **argv) {
  static const struct option opts[] = {
      CLI_MODEL_OPTIONS,
      {"batch", required_argument, 0, OPT_BATCH}, {"seq", required_argument, 0, OPT_SEQ},
      {"steps", required_argument, 0, OPT_STEPS}, {"depth", required_argument, 0, OPT_DEPTH},
      {"seed", required_argument, 0, OPT_SEED}, {"compare", required_argument, 0, OPT_COMPARE},
      {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  profile_args a = {.batch = 4, .seq = 0, .steps = 5, .depth = 2, .seed = 1337};
  char *buf = NULL, path_a[4096], path_b[4096];
  const char *ca = NULL, *cb = NULL;
  int o, rc = -1;
  opterr = 0;
  while (rc < 0 && (o = cli_getopt(argc, argv, opts)) != -1) {
    int taken = cli_model_option(&a.mo, o, optarg);
    if (o == OPT_HELP) profile_usage(), rc = 0;
    else if (taken < 0 || (!taken && !profile_option(&a, o, optarg)))
      rc = cli_option_error("profile", opts, o, argv);
  }
  if (rc < 0 && optind < argc)
    rc = cli_usage_error("profile", "unexpected argument '%s'", argv[optind]);
  if (rc < 0 && a.compare && (a.mo.schedule || a.mo.n_disabled))
    rc = cli_usage_error("profile", "%s", "--compare A,B names both schedules: drop --schedule "
                                          "and --disable");
  if (rc < 0 && a.compare && !split_compare(a.compare, &buf, &ca, &cb))
    rc = cli_usage_error("profile", "--compare wants two schedules A,B, got '%s'", a.compare);
  bool ready = rc < 0 && (rc = cli_model_resolve(&a.mo, "profile")) == 0;
  if (ready) cli_precision_for_speed(&a.mo, "profile");
  if (ready && a.compare) { /* each side as --schedule takes it */
    rc = cli_schedule_resolve(a.mo.family, ca, "profile", path_a, sizeof path_a, &ca);
    if (!rc) rc = cli_schedule_resolve(a.mo.family, cb, "profile", path_b, sizeof path_b, &cb);
    ready = rc == 0;
  }
  if (ready) {
    const char *sides[2] = {ca, cb};
    profile_ctx pc = {&a, a.compare ? sides : NULL};
    ready = (rc = cli_model_start(&a.mo, "profile", profile_fields, &pc)) == 0;
  }
  if (ready) {
    slapo_status s = profile(&a, ca, cb);
    rc = s == SLAPO_OK ? 0 : cli_fail(s);
  }
  free(buf);
  cli_model_opts_deinit(&a.mo);
  return rc;
}
