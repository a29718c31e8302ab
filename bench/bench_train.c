/* bench/bench_train.c - training-step throughput of slapo for any family of
 * the model registry (GPT-2 by default; --model llama): one step is what
 * slapo_train does (slapo_train_accumulate: forward and backward, the
 * gradients written into the grads and their norm measured; global-norm
 * clipping at 1.0 folded into AdamW's one pass: slapo_adamw_step_scaled),
 * the same work bench/train_peer.py times for PyTorch (see
 * bench/run_train_bench.sh, which runs the two side by side). Inputs are
 * random token ids (no tokenizer). Prints one line: tokens/s from the median
 * step time, step ms (median, min), MFU, the measured GEMM peak, the planned
 * and measured activation peaks, the persistent bytes (weights, gradients,
 * AdamW m, v), the ms outside the GEMM nodes and AdamW, and the share of
 * the step outside the GEMM nodes (from per-node timing, always on).
 *
 * MFU (model FLOPs utilization; PaLM, Chowdhery et al. 2022, appendix B, as
 * llm.c's estimate_mfu): flops per token = 6 N + 12 L T C, with N every
 * parameter (tied wte counted once: it is also lm_head's GEMM; wpe included
 * as llm.c does), L layers, T the sequence length, C the width; the second
 * term is the attention's QK^T and AV products, forward and backward, counted
 * over the full T x T matrix as PaLM does. MFU = flops per token * tokens/s /
 * peak, where the peak is measured here with a 1024^3 f32 matmul through
 * slapo (planned one-node graph; the best sample of 9 taken before the run
 * and one after every timed step). mfu_paired: the median over the steps of
 * each step's MFU against the sample taken right after it, so a neighbour's
 * load, which slows both, cancels in the ratio.
 * --precision bf16: the model under a root autocast (what `slapo train
 * --precision bf16` runs); the peak is then that of a 1024^3 bf16 x bf16
 * matmul, and the line says whether bf16 GEMMs ran on bf16 hardware
 * (bf16_gemm=native) or were widened to f32 (bf16_gemm=widened: a CPU
 * without bf16 units, where `slapo train` itself would refuse bf16; the
 * benchmark runs it anyway to measure the casts' cost). The f32 MFU is
 * printed beside it (mfu_f32, against an f32 probe) so a bf16 row can be
 * set against both peaks.
 * --profile: also prints the mean ms per op type over the timed steps.
 * --machine: prints only the CPU and kernel line (bench_machine.h). */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slapo/exec.h"
#include "slapo/train.h"
#include "bench_machine.h"
#include "bench_model.h"

static void die(const char *what) {
  fprintf(stderr, "bench_train: %s failed: %s\n", what, slapo_last_error());
  exit(1);
}

#define CHECK(expr)                                                            \
  do {                                                                         \
    if ((expr) != SLAPO_OK) die(#expr);                                        \
  } while (0)

/* The GEMM peak: GFLOP/s of a 1024^3 matmul through slapo, a planned
 * one-node graph re-run (dispatch included), in samples of >= 50 ms of
 * runs. The peak is the best sample (a peak is what the machine can do),
 * taken over samples spread across the whole run: 9 before it and one
 * after every timed step, since on a shared machine a burst of samples can
 * all land in a window where another VM holds the cores (one such round
 * printed an MFU of 1.35). */
typedef struct gemm_probe {
  slapo_tensor *a, *b; /* f32 or bf16 operands */
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_plan *p;
  double best_s; /* the fastest run's seconds so far */
} gemm_probe;

enum { PEAK_N = 1024 };

/* A PEAK_N x PEAK_N operand of dtype dt (f32 or bf16) filled with a
 * repeating ramp of the given period. */
static slapo_tensor *probe_operand(slapo_dtype dt, int period) {
  int64_t sh[2] = {PEAK_N, PEAK_N}, n = (int64_t)PEAK_N * PEAK_N;
  slapo_tensor *t;
  float *f = malloc((size_t)n * sizeof *f);
  if (!f) die("malloc");
  for (int64_t i = 0; i < n; i++) f[i] = (float)(i % period) / (float)period - 0.5f;
  CHECK(slapo_tensor_new(dt, 2, sh, &t));
  if (dt == SLAPO_DTYPE_BF16)
    slapo_f32_to_bf16_n(f, slapo_tensor_data(t), n);
  else
    memcpy(slapo_tensor_data(t), f, (size_t)n * sizeof *f);
  free(f);
  return t;
}

static void gemm_probe_new(gemm_probe *q, slapo_dtype dt) {
  int64_t sh[2] = {PEAK_N, PEAK_N};
  q->a = probe_operand(dt, 97);
  q->b = probe_operand(dt, 89);
  CHECK(slapo_graph_new(&q->g));
  CHECK(slapo_ctx_new(q->g, &q->ctx));
  slapo_node *y = slapo_matmul(q->ctx, slapo_input(q->ctx, "a", dt, 2, sh),
                               slapo_input(q->ctx, "b", dt, 2, sh), false, false);
  slapo_output(q->ctx, 1, &y);
  CHECK(slapo_ctx_status(q->ctx));
  CHECK(slapo_plan_new(q->g, NULL, &q->p));
  CHECK(slapo_plan_bind_input(q->p, "a", q->a));
  CHECK(slapo_plan_bind_input(q->p, "b", q->b));
  CHECK(slapo_plan_run(q->p, NULL)); /* warm-up: creates the oneDNN primitive */
  q->best_s = 1e30;
}

/* GFLOP/s of one 1024^3 matmul taking s seconds. */
static double probe_gflops(double s) { return 2.0 * (double)PEAK_N * PEAK_N * PEAK_N / s / 1e9; }

/* One sample of >= 50 ms of runs; returns its GFLOP/s. */
static double gemm_probe_sample(gemm_probe *q) {
  int runs = 0;
  double t0 = bench_now_s(), dt;
  do {
    CHECK(slapo_plan_run(q->p, NULL));
    runs++;
  } while ((dt = bench_now_s() - t0) < 0.05);
  q->best_s = dt / runs < q->best_s ? dt / runs : q->best_s;
  return probe_gflops(dt / runs);
}

static double gemm_probe_gflops(const gemm_probe *q) { return probe_gflops(q->best_s); }

static void gemm_probe_free(gemm_probe *q) {
  slapo_plan_free(q->p);
  slapo_ctx_free(q->ctx);
  slapo_graph_free(q->g);
  slapo_tensor_free(q->a);
  slapo_tensor_free(q->b);
}

/* --profile: ms per op type and per distinct node signature (op, input
 * shapes, trans flags), summed over the timed steps. */
typedef struct op_time {
  char key[160];
  double ms;
  int count; /* nodes per step with this key */
} op_time;

typedef struct prof_table {
  op_time *by_op, *by_sig;
  int n_op, n_sig, cap;
} prof_table;

static int cmp_op_time(const void *a, const void *b) {
  double x = ((const op_time *)a)->ms, y = ((const op_time *)b)->ms;
  return (x < y) - (x > y);
}

static void profile_add(op_time *t, int *n, int cap, const char *key, double ms, bool first) {
  int k = 0;
  while (k < *n && strcmp(t[k].key, key)) k++;
  if (k == *n) {
    if (k == cap) return;
    snprintf(t[k].key, sizeof t[k].key, "%s", key);
    t[k].ms = 0, t[k].count = 0;
    (*n)++;
  }
  t[k].ms += ms;
  if (first) t[k].count++;
}

static void add_profile(const slapo_runner *r, prof_table *pr, bool first) {
  const slapo_graph *g = slapo_runner_graph(r);
  const slapo_plan *p = slapo_runner_plan(r);
  for (slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    if (n->kind != SLAPO_NODE_CALL_OP) continue;
    double ms = slapo_plan_node_ms(p, n);
    profile_add(pr->by_op, &pr->n_op, pr->cap, n->target, ms, first);
    char sig[160];
    int len = snprintf(sig, sizeof sig, "%s", n->target);
    for (int i = 0; i < n->n_inputs && len < (int)sizeof sig; i++) {
      char sh[64];
      len += snprintf(sig + len, sizeof sig - (size_t)len, " %s",
                      slapo_shape_str(n->inputs[i]->ndim, n->inputs[i]->shape, sh, sizeof sh));
    }
    if (slapo_node_attr_int(n, "trans_a", 0) && len < (int)sizeof sig)
      len += snprintf(sig + len, sizeof sig - (size_t)len, " ta");
    if (slapo_node_attr_int(n, "trans_b", 0) && len < (int)sizeof sig)
      snprintf(sig + len, sizeof sig - (size_t)len, " tb");
    profile_add(pr->by_sig, &pr->n_sig, pr->cap, sig, ms, first);
  }
  const char *acc = "(gradients into grads)";
  profile_add(pr->by_op, &pr->n_op, pr->cap, acc, slapo_plan_accumulate_ms(p), first);
  profile_add(pr->by_sig, &pr->n_sig, pr->cap, acc, slapo_plan_accumulate_ms(p), first);
}

/* GEMM nodes: what the "time outside GEMMs" leaves out. */
static bool is_gemm(const char *op) { return !strcmp(op, "matmul") || !strcmp(op, "linear"); }

/* Mean ms per step of every node (*all) and of the GEMM nodes (*gemm). */
static void graph_ms(const prof_table *pr, int steps, double *all, double *gemm) {
  *all = *gemm = 0;
  for (int k = 0; k < pr->n_op; k++) {
    *all += pr->by_op[k].ms / steps;
    if (is_gemm(pr->by_op[k].key)) *gemm += pr->by_op[k].ms / steps;
  }
}

/* step_ms, norm_ms: medians of the step and norm phases. */
static void print_profile(prof_table *pr, int steps, double step_ms, double norm_ms) {
  qsort(pr->by_op, (size_t)pr->n_op, sizeof *pr->by_op, cmp_op_time);
  qsort(pr->by_sig, (size_t)pr->n_sig, sizeof *pr->by_sig, cmp_op_time);
  double all, gemm;
  graph_ms(pr, steps, &all, &gemm);
  double out = all - gemm + norm_ms;
  printf("outside GEMMs and AdamW: %.1f ms a step (graph %.1f - GEMM nodes %.1f + norm %.1f; "
         "%.1f%% of graph + norm %.1f)\n",
         out, all, gemm, norm_ms, 100 * out / (step_ms + norm_ms), step_ms + norm_ms);
  all *= steps;
  printf("graph ms per step by op type (mean of %d steps; no optimizer): %.1f ms\n", steps,
         all / steps);
  for (int k = 0; k < pr->n_op; k++)
    printf("  %-24s %8.2f ms %5.1f%%  x%d\n", pr->by_op[k].key, pr->by_op[k].ms / steps,
           100 * pr->by_op[k].ms / all, pr->by_op[k].count);
  printf("top node signatures (op, input shapes, trans flags):\n");
  for (int k = 0; k < pr->n_sig && k < 30; k++)
    printf("  %8.2f ms  x%-3d %s\n", pr->by_sig[k].ms / steps, pr->by_sig[k].count,
           pr->by_sig[k].key);
}

/* One training step of bm as slapo_train runs it (step `it` seeds the
 * dropout masks): the micro-batch writes the grads (no zeroing) and
 * measures their norm as each is final; clipping at norm 1 is folded into
 * AdamW's pass (bitwise what clip-then-step gives). ph[3]: seconds of the
 * graph, the norm and AdamW; returns the step's seconds. */
static double train_step(bench_model *bm, int it, float *loss, double ph[3]) {
  const slapo_tensor *in[2] = {bm->x, bm->y};
  slapo_kernel_env env = {.seed = 1, .step = (uint64_t)it, .training = true};
  double l, t0 = bench_now_s();
  CHECK(slapo_train_accumulate(bm->runner, 1, in, &env, &l, NULL));
  double t1 = bench_now_s();
  float gs = slapo_clip_scale(slapo_train_grad_norm(bm->runner, bm->model), 1.0);
  double t2 = bench_now_s();
  slapo_adamw_step_scaled(bm->opt, 1e-4f, gs, false);
  double t3 = bench_now_s();
  *loss = (float)l;
  ph[0] = t1 - t0, ph[1] = t2 - t1, ph[2] = t3 - t2;
  return t3 - t0;
}

/* --interleave: the unscheduled model (or the --baseline schedule's) and the
 * scheduled one in one process,
 * one step each in turn (ABBA order, so neither always runs first), after
 * 2 warm-up steps each. A neighbour's load that lasts longer than two steps
 * slows both members of a pair, so the median of the pairs' ratios is
 * steadier than a ratio of two separate runs' medians. */
static int interleave(const char *family, const char *config, const char *baseline,
                      const char *schedule, const char *precision, int64_t B, int64_t T,
                      int steps) {
  bench_model m[2];
  CHECK(bench_model_new(family, config, baseline, precision, B, T, false, 12345, &m[0]));
  CHECK(bench_model_new(family, config, schedule, precision, B, T, false, 12345, &m[1]));
  double *t[2] = {malloc((size_t)steps * sizeof(double)), malloc((size_t)steps * sizeof(double))};
  double *ratio = malloc((size_t)steps * sizeof(double)), ph[3];
  float loss[2];
  for (int it = 0; it < steps + 2; it++)
    for (int k = 0; k < 2; k++) {
      int w = (it & 1) ? 1 - k : k; /* ABBA */
      double dt = train_step(&m[w], it, &loss[w], ph);
      if (it >= 2) t[w][it - 2] = dt;
    }
  for (int i = 0; i < steps; i++) ratio[i] = t[0][i] / t[1][i];
  double speedup = bench_median(ratio, steps);
  printf("slapo interleaved model=%s config=%s B=%lld T=%lld baseline=%s schedule=%s "
         "plain_ms=%.1f sched_ms=%.1f speedup=%.3f loss_plain=%.4f loss_sched=%.4f steps=%d "
         "threads=%d\n",
         family, config, (long long)B, (long long)T, baseline ? baseline : "none", schedule,
         1e3 * bench_median(t[0], steps),
         1e3 * bench_median(t[1], steps), speedup, loss[0], loss[1], steps,
         omp_get_max_threads());
  bench_print_machine(stdout, "bench_train");
  for (int k = 0; k < 2; k++) free(t[k]), bench_model_free(&m[k]);
  free(ratio);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_train [--model NAME] [--config NAME] [--batch B] [--seq T] [--steps N]\n"
          "                   [--schedule F [--interleave [--baseline F0]]]\n"
          "                   [--precision f32|bf16]\n"
          "                   [--profile] [--machine]\n"
          "  --model    model family (gpt2, llama, ...)        [gpt2]\n"
          "  --config   the family's config (tiny, small, ...) [small]\n"
          "  --batch    sequences per step                    [4]\n"
          "  --seq      tokens per sequence                   [256]\n"
          "  --steps    timed steps, after 2 warm-up steps    [10]\n"
          "  --schedule a .sched file applied to the model      [none]\n"
          "  --precision bf16: the model under a root autocast; MFU against a bf16\n"
          "             GEMM peak (and an f32 one: mfu_f32)        [f32]\n"
          "  --interleave  steps of the unscheduled and the scheduled model in turn;\n"
          "             prints the median of the pairs' time ratios (speedup)\n"
          "  --baseline with --interleave: the other model runs schedule F0, not none\n"
          "  --profile  print mean ms per op type\n"
          "  --machine  print the CPU and kernel line only\n"
          "OMP_NUM_THREADS sets the threads (default: all processors).\n");
}

int main(int argc, char **argv) {
  const char *family_name = "gpt2", *config = "small", *schedule = NULL, *precision = NULL;
  const char *baseline = NULL;
  int64_t B = 4, T = 256;
  int steps = 10;
  bool profile = false, inter = false;
  static const struct option longs[] = {{"model", required_argument, NULL, 'M'},
                                        {"config", required_argument, NULL, 'c'},
                                        {"batch", required_argument, NULL, 'b'},
                                        {"seq", required_argument, NULL, 't'},
                                        {"steps", required_argument, NULL, 's'},
                                        {"profile", no_argument, NULL, 'p'},
                                        {"schedule", required_argument, NULL, 'S'},
                                        {"precision", required_argument, NULL, 'P'},
                                        {"machine", no_argument, NULL, 'm'},
                                        {"interleave", no_argument, NULL, 'i'},
                                        {"baseline", required_argument, NULL, 'B'},
                                        {"help", no_argument, NULL, 'h'},
                                        {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "", longs, NULL)) != -1;) {
    switch (c) {
    case 'M': family_name = optarg; break;
    case 'c': config = optarg; break;
    case 'b': B = atoll(optarg); break;
    case 't': T = atoll(optarg); break;
    case 's': steps = atoi(optarg); break;
    case 'p': profile = true; break;
    case 'i': inter = true; break;
    case 'S': schedule = optarg; break;
    case 'B': baseline = optarg; break;
    case 'P': precision = optarg; break;
    case 'm': bench_print_machine(stdout, "bench_train"); return 0;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  bool bf16 = precision && strcmp(precision, "bf16") == 0;
  if (B < 1 || T < 1 || steps < 1 || (inter && !schedule) || (baseline && !inter) ||
      (precision && !bf16 && strcmp(precision, "f32") != 0)) {
    usage(stderr);
    return 2;
  }
  if (inter) return interleave(family_name, config, baseline, schedule, precision, B, T, steps);

  /* peak: the GEMM probe in the run's precision; peak32: an f32 one (the
   * same probe when the run is f32), sampled alongside for mfu_f32. */
  gemm_probe peak, peak32;
  gemm_probe_new(&peak, bf16 ? SLAPO_DTYPE_BF16 : SLAPO_DTYPE_F32);
  if (bf16) gemm_probe_new(&peak32, SLAPO_DTYPE_F32);
  for (int k = 0; k < 9; k++) {
    gemm_probe_sample(&peak);
    if (bf16) gemm_probe_sample(&peak32);
  }

  /* idx, targets [B, T] i32: random ids in [0, V) from a fixed LCG. */
  bench_model bm;
  /* Node timing always (two clock reads a node, ~0.05 ms a step): the
   * first line reports the time outside the GEMM nodes. */
  CHECK(bench_model_new(family_name, config, schedule, precision, B, T, true, 12345, &bm));
  slapo_module *model = bm.model;
  slapo_runner *r = bm.runner;
  const slapo_model_dims dims = bm.dims;

  int total = steps + 2;
  double *times = malloc((size_t)steps * sizeof *times);
  double *beside = malloc((size_t)steps * sizeof *beside); /* GFLOP/s right after step i */
  prof_table pr = {.cap = 512};
  pr.by_op = calloc((size_t)pr.cap, sizeof *pr.by_op);
  pr.by_sig = calloc((size_t)pr.cap, sizeof *pr.by_sig);
  float loss = 0;
  double *phase[3]; /* step, clip norm, adamw: seconds per timed step */
  for (int k = 0; k < 3; k++) phase[k] = malloc((size_t)steps * sizeof *phase[k]);
  for (int it = 0; it < total; it++) {
    double ph[3], dt = train_step(&bm, it, &loss, ph);
    if (it < 2) continue;
    times[it - 2] = dt;
    for (int k = 0; k < 3; k++) phase[k][it - 2] = ph[k];
    add_profile(r, &pr, it == 2);
    beside[it - 2] = gemm_probe_sample(&peak); /* after the step's timings: not inside them */
    if (bf16) gemm_probe_sample(&peak32);
  }
  double peak_gflops = gemm_probe_gflops(&peak);
  double peak32_gflops = bf16 ? gemm_probe_gflops(&peak32) : peak_gflops;
  gemm_probe_free(&peak);
  if (bf16) gemm_probe_free(&peak32);

  int64_t N = slapo_module_numel(model);
  double flops_per_tok = 6.0 * (double)N + 12.0 * dims.n_layer * (double)T * (double)dims.width;
  /* mfu_paired: the median over steps of each step's MFU against the probe
   * sample taken right after it (before bench_median sorts the times). A
   * neighbour's load slows both alike, so the pair's ratio cancels it where
   * the best-sample peak cannot. */
  for (int i = 0; i < steps; i++)
    beside[i] = flops_per_tok * (double)(B * T) / times[i] / (beside[i] * 1e9);
  double mfu_paired = bench_median(beside, steps);
  double min_s = times[0];
  for (int i = 1; i < steps; i++) min_s = times[i] < min_s ? times[i] : min_s;
  double med = bench_median(times, steps);
  double tok_s = (double)(B * T) / med;
  double mfu = flops_per_tok * tok_s / (peak_gflops * 1e9);
  double mfu_f32 = flops_per_tok * tok_s / (peak32_gflops * 1e9);
  char why[256] = "";
  const char *gemm_kind = !bf16 ? "none" : slapo_bf16_gemm_native(why, sizeof why) ? "native" : "widened";
  /* Persistent: weights, gradients and AdamW's m and v, f32 each. */
  double persistent_mb = 4.0 * 4.0 * (double)N / 1e6;
  /* outside_ms: outside the GEMM nodes and AdamW (the other nodes, putting
   * gradients into grads, the norm); non_gemm_share: the share of the
   * whole step outside the GEMM nodes (AdamW included). */
  double all, gemm, norm_ms = 1e3 * bench_median(phase[1], steps);
  graph_ms(&pr, steps, &all, &gemm);
  printf("slapo model=%s config=%s B=%lld T=%lld tokens_per_s=%.1f step_ms=%.1f min_ms=%.1f "
         "mfu=%.3f mfu_paired=%.3f model_gflops=%.1f peak_gflops=%.1f planned_peak_mb=%.1f "
         "measured_peak_mb=%.1f persistent_mb=%.1f outside_ms=%.1f non_gemm_share=%.3f "
         "loss=%.4f params=%lld threads=%d precision=%s bf16_gemm=%s mfu_f32=%.3f "
         "peak_f32_gflops=%.1f\n",
         family_name, config, (long long)B, (long long)T, tok_s, med * 1e3, min_s * 1e3, mfu,
         mfu_paired,
         flops_per_tok * tok_s / 1e9, peak_gflops, (double)slapo_runner_peak_nbytes(r) / 1e6,
         (double)slapo_plan_measured_peak_nbytes(slapo_runner_plan(r)) / 1e6, persistent_mb,
         all - gemm + norm_ms, 1 - gemm / (med * 1e3), loss, (long long)N,
         omp_get_max_threads(), bf16 ? "bf16" : "f32", gemm_kind, mfu_f32, peak32_gflops);
  if (*why) printf("# bf16 GEMMs widened to f32: %s\n", why);
  printf("phases (median ms): step (graph + grad accumulation) %.1f, clip norm %.1f, "
         "adamw %.1f\n",
         1e3 * bench_median(phase[0], steps), 1e3 * bench_median(phase[1], steps),
         1e3 * bench_median(phase[2], steps));
  bench_print_machine(stdout, "bench_train");
  if (profile)
    print_profile(&pr, steps, 1e3 * bench_median(phase[0], steps),
                  1e3 * bench_median(phase[1], steps));
  for (int k = 0; k < 3; k++) free(phase[k]);
  free(pr.by_op);
  free(pr.by_sig);
  free(times);
  free(beside);
  bench_model_free(&bm);
  return 0;
}
