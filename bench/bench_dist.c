/* bench/bench_dist.c - a distributed training step and where its time goes:
 * run alone (one process) or under mpirun -np N with --tp K. One step is
 * what slapo_train does: the micro-batch (forward + backward, the
 * tensor-parallel collectives inside the graph), the data-parallel gradient
 * all-reduce, global-norm clipping and AdamW. Per-node timing is on, so the
 * time inside collective nodes (all_reduce, all_gather, ..., the
 * vocab-parallel loss) is measured; it includes waiting for the slowest
 * rank. Rank 0 prints one line: the layout, global tokens/s from the median
 * step, step ms, the ms in tensor-parallel collectives and in the
 * data-parallel all-reduce (each the maximum over ranks of the rank's
 * median), compute = the rest, the planned activation peak and the peak
 * resident memory of the largest rank. The step's dp all-reduce time
 * includes waiting for the slower rank; with data parallelism a second
 * line times the gradient all-reduce alone (after a barrier) against a
 * memcpy of the same bytes on the same rank, medians of 7. Inputs are
 * random token ids. --grad-accum M runs M micro-batches a step (the same
 * ids, their own dropout steps); --pp K runs them through K pipeline
 * stages balanced by cost (slapo_pp_auto_cut; --gpipe: GPipe, else 1F1B),
 * a stage's activations then being its plan's peak times its slots, the
 * largest rank's, and the compute column includes the pipeline's
 * transfers and its bubble. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slapo/dist.h"
#include "slapo/train.h"
#include "bench_machine.h"
#include "bench_model.h"

static void die(const char *what) {
  fprintf(stderr, "bench_dist: rank %d: %s failed: %s\n", slapo_dist_rank(SLAPO_GROUP_WORLD),
          what, slapo_last_error());
  slapo_dist_abort(1);
}

#define CHECK(expr)                                                            \
  do {                                                                         \
    if ((expr) != SLAPO_OK) die(#expr);                                        \
  } while (0)

/* A /proc/self/status field of this process in MiB: VmHWM (the peak
 * resident set), VmRSS (now). */
static double status_mib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kb = 0;
  size_t n = strlen(field);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':') kb = atof(line + n + 1);
  if (f) fclose(f);
  return kb / 1024;
}

static bool is_collective(const slapo_node *n) {
  return n->op == &slapo_dist_op_all_reduce || n->op == &slapo_dist_op_reduce_grad ||
         n->op == &slapo_dist_op_all_gather || n->op == &slapo_dist_op_reduce_scatter ||
         n->op == &slapo_dist_op_scatter || n->op == &slapo_dist_op_vocab_parallel_cross_entropy;
}

/* ms the last step spent in collective nodes. */
static double collective_ms(const slapo_runner *r) {
  double ms = 0;
  const slapo_plan *p = slapo_runner_plan(r);
  for (slapo_node *n = slapo_graph_first(slapo_runner_graph(r)); n; n = n->next)
    if (n->kind == SLAPO_NODE_CALL_OP && is_collective(n)) ms += slapo_plan_node_ms(p, n);
  return ms;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ms of the gradient all-reduce alone and of copying the same bytes into
 * one buffer, medians over reps, the maximum over ranks; *mb the size. */
static void time_grad_all_reduce(slapo_module *model, double *ar_ms, double *copy_ms,
                                 double *mb) {
  enum { REPS = 7 };
  slapo_tensor **g;
  int n;
  CHECK(slapo_module_grads(model, &g, &n));
  size_t total = 0;
  for (int i = 0; i < n; i++) total += slapo_tensor_nbytes(g[i]);
  char *scratch = malloc(total);
  if (!scratch) die("malloc");
  memset(scratch, 0, total); /* first touch outside the timing */
  double ar[REPS], cp[REPS];
  for (int r = 0; r < REPS; r++) {
    CHECK(slapo_dist_barrier(SLAPO_GROUP_WORLD));
    double t0 = bench_now_s();
    CHECK(slapo_dist_all_reduce_tensors(SLAPO_GROUP_DP, n, g, NULL));
    ar[r] = 1e3 * (bench_now_s() - t0);
    t0 = bench_now_s();
    for (size_t i = 0, at = 0; i < (size_t)n; at += slapo_tensor_nbytes(g[i]), i++)
      memcpy(scratch + at, slapo_tensor_data(g[i]), slapo_tensor_nbytes(g[i]));
    cp[r] = 1e3 * (bench_now_s() - t0);
  }
  qsort(ar, REPS, sizeof *ar, cmp_double);
  qsort(cp, REPS, sizeof *cp, cmp_double);
  double m[2] = {ar[REPS / 2], cp[REPS / 2]};
  CHECK(slapo_dist_max_f64(SLAPO_GROUP_WORLD, m, 2));
  *ar_ms = m[0], *copy_ms = m[1], *mb = (double)total / 1e6;
  free(scratch);
  slapo_free(g);
}

int main(int argc, char **argv) {
  const char *config = "small", *schedule = NULL;
  int64_t B = 4, T = 256, tp = 1;
  int steps = 8, pp = 1, M = 1;
  bool gpipe = false;
  static const struct option longs[] = {
      {"config", required_argument, NULL, 'c'}, {"batch", required_argument, NULL, 'b'},
      {"seq", required_argument, NULL, 't'},    {"steps", required_argument, NULL, 's'},
      {"schedule", required_argument, NULL, 'S'}, {"tp", required_argument, NULL, 'p'},
      {"pp", required_argument, NULL, 'P'}, {"grad-accum", required_argument, NULL, 'm'},
      {"gpipe", no_argument, NULL, 'g'}, {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "", longs, NULL)) != -1;) {
    switch (c) {
    case 'c': config = optarg; break;
    case 'b': B = atoll(optarg); break;
    case 't': T = atoll(optarg); break;
    case 's': steps = atoi(optarg); break;
    case 'S': schedule = optarg; break;
    case 'p': tp = atoll(optarg); break;
    case 'P': pp = atoi(optarg); break;
    case 'm': M = atoi(optarg); break;
    case 'g': gpipe = true; break;
    default:
      fprintf(stderr, "usage: [mpirun -np N] bench_dist [--config C] [--batch B per data-parallel "
                      "rank] [--seq T] [--steps N] [--schedule F] [--tp K] [--pp K [--gpipe]] "
                      "[--grad-accum M]\n");
      return 2;
    }
  }
  if (M < 1 || slapo_dist_init_pp((int)tp, pp) != SLAPO_OK) die("slapo_dist_init_pp");
  int rank = slapo_dist_rank(SLAPO_GROUP_WORLD), D = slapo_dist_size(SLAPO_GROUP_DP);
  /* Each data-parallel replica its own ids; ranks of one replica the same. */
  bench_model bm;
  uint64_t seed = 12345 + (uint64_t)slapo_dist_rank(SLAPO_GROUP_DP);
  CHECK(bench_model_new("gpt2", config, schedule, NULL, B, T, true, seed, &bm));
  slapo_module *model = bm.model;
  slapo_runner *r = bm.runner;
  slapo_adamw *opt = bm.opt;
  const slapo_tensor *in[2] = {bm.x, bm.y};
  const slapo_tensor **micro = calloc(2 * (size_t)M, sizeof *micro);
  slapo_kernel_env *envs = calloc((size_t)M, sizeof *envs);
  if (!micro || !envs) die("calloc");
  for (int i = 0; i < 2 * M; i++) micro[i] = in[i % 2];
  slapo_pp_stage *st = NULL;
  double act_mib = 0;
  if (pp > 1) {
    char lines[1024];
    int s = slapo_dist_rank(SLAPO_GROUP_PP);
    int slots = slapo_pp_slots(gpipe ? SLAPO_PP_GPIPE : SLAPO_PP_1F1B, pp, s, M);
    CHECK(slapo_pp_auto_cut(model, 2, in, pp, lines, sizeof lines, NULL));
    CHECK(slapo_pp_stage_new(model, 2, in, s, slots, NULL, &st));
    /* The stage's own weights, gradients and AdamW state, as slapo train
     * keeps them (bench_model_new's whole model counts in the peak, not in
     * the resident set after the steps). */
    slapo_adamw_free(bm.opt);
    CHECK(slapo_pp_release(st, model, NULL));
    CHECK(slapo_pp_adamw_new(st, model, &(slapo_adamw_config){0.9f, 0.95f, 1e-8f, 0.1f, false},
                             &bm.opt));
    opt = bm.opt;
    act_mib = (double)slapo_plan_peak_nbytes(slapo_pp_stage_plan(st)) * slots / (1024.0 * 1024.0);
  }
  double *step = calloc((size_t)steps, sizeof *step), *tpc = calloc((size_t)steps, sizeof *tpc);
  double *dpc = calloc((size_t)steps, sizeof *dpc);
  if (!step || !tpc || !dpc) die("calloc");
  for (int s = -2; s < steps; s++) { /* two warm-up steps: build, plan, first touch */
    CHECK(slapo_dist_barrier(SLAPO_GROUP_WORLD));
    double t0 = bench_now_s(), loss, comm;
    for (int i = 0; i < M; i++)
      envs[i] = (slapo_kernel_env){1, (uint64_t)((s + 2) * M + i), true};
    double t_graph = 0;
    if (st) {
      CHECK(slapo_pp_train_accumulate(st, gpipe ? SLAPO_PP_GPIPE : SLAPO_PP_1F1B, M, micro, envs,
                                      &loss, NULL));
      CHECK(slapo_pp_train_update(st, model, opt, 6e-4f, 1.0, NULL, &comm));
    } else {
      CHECK(slapo_train_accumulate(r, M, micro, envs, &loss, NULL));
      t_graph = collective_ms(r);
      CHECK(slapo_train_update(r, model, opt, 6e-4f, 1.0, NULL, &comm));
    }
    if (s >= 0) step[s] = 1e3 * (bench_now_s() - t0), tpc[s] = t_graph, dpc[s] = 1e3 * comm;
  }
  /* The slowest rank sets the pace: the maximum over ranks of each median. */
  double m[6] = {bench_median(step, steps), bench_median(tpc, steps), bench_median(dpc, steps),
                 status_mib("VmHWM"),
                 st ? act_mib : (double)slapo_runner_peak_nbytes(r) / (1024.0 * 1024.0),
                 status_mib("VmRSS")};
  CHECK(slapo_dist_max_f64(SLAPO_GROUP_WORLD, m, 6));
  if (rank == 0) {
    char layout[160];
    slapo_dist_describe(layout, sizeof layout);
    char *semi = strchr(layout, ';');
    if (semi) *semi = '\0';
    double tokens = (double)(B * T * D * M);
    char mb[64] = "";
    if (M > 1 || pp > 1)
      snprintf(mb, sizeof mb, " x %d micro-batches%s", M, pp > 1 ? gpipe ? " GPipe" : " 1F1B" : "");
    printf("bench_dist: %s %s B%lld/rank T%lld%s: %.1f tok/s, step %.1f ms = compute %.1f + tp "
           "collectives %.1f + dp all-reduce %.1f ms (%.0f%% communication), planned "
           "activations %.0f MiB, peak RSS %.0f MiB a rank (%.0f MiB after the steps)%s%s\n",
           layout, config, (long long)B, (long long)T, mb, tokens / (m[0] / 1e3), m[0],
           m[0] - m[1] - m[2], m[1], m[2], 100 * (m[1] + m[2]) / m[0], m[4], m[3], m[5],
           schedule ? ", schedule " : "", schedule ? schedule : "");
  }
  if (D > 1) {
    double ar, cp, mb;
    time_grad_all_reduce(model, &ar, &cp, &mb);
    if (rank == 0)
      printf("bench_dist: gradient all-reduce alone %.2f ms for %.1f MB = %.2fx a memcpy of the "
             "same bytes (%.2f ms)\n", ar, mb, ar / cp, cp);
  }
  free(step), free(tpc), free(dpc), free(micro), free(envs);
  slapo_pp_stage_free(st);
  bench_model_free(&bm);
  slapo_dist_finalize();
  return 0;
}
