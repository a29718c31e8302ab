/* bench/bench_schedules.c - GPT-2 training steps with schedules applied vs
 * the unscheduled model, side by side in one run: tokens/s (median of
 * several steps) and planned / measured activation peak memory.
 *   bench_schedules [--config small] [--batch 4] [--seq 256] [--steps 5]
 * Variants: unscheduled; FlashAttention in every block; every block
 * checkpointed; both; the fusions of schedules/gpt2.sched (decompose, bias +
 * GELU, bias + dropout + residual through cc) alone and with
 * FlashAttention; fuse_all. Never run as a test. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/models.h"
#include "bench_machine.h"

/* The fusion lines of schedules/gpt2.sched (without its checkpoint knob). */
#define DECOMPOSE_LINES                                                     \
  "transformer.h.*.attn.c_proj decompose\n"                                \
  "transformer.h.*.mlp.c_fc decompose\n"                                   \
  "transformer.h.*.mlp.c_proj decompose\n"
#define FUSE_LINES                                                          \
  DECOMPOSE_LINES                                                           \
  "transformer.h.* trace flatten=true\n"                                   \
  "transformer.h.* fuse pattern=\"gelu(add(x, b))\" compiler=cc name=FusedBiasGeLU\n" \
  "transformer.h.* fuse pattern=\"add(x, dropout(add(y, b)))\" compiler=cc "   \
  "name=FusedBiasDropoutResidual all=true\n"

typedef struct variant {
  const char *name;
  const char *sched; /* schedule text */
} variant;

static const variant k_variants[] = {
    {"unscheduled", ""},
    {"FlashAttention", "transformer.h.*.attn replace FlashAttention\n"},
    {"checkpoint all blocks", "transformer.h checkpoint ratio=1.0\n"},
    {"FlashAttention + checkpoint",
     "transformer.h.*.attn replace FlashAttention\ntransformer.h checkpoint ratio=1.0\n"},
    {"decompose + fuse (cc)", FUSE_LINES},
    {"FlashAttention + fuse (cc)", "transformer.h.*.attn replace FlashAttention\n" FUSE_LINES},
    {"fuse_all (cc)", DECOMPOSE_LINES "transformer.h.* trace flatten=true\n"
                      "transformer.h.* fuse_all compiler=cc\n"},
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void die(slapo_status s) {
  fprintf(stderr, "bench_schedules: %s: %s\n", slapo_status_name(s), slapo_last_error());
  exit(1);
}

int main(int argc, char **argv) {
  const char *config = "small";
  int64_t B = 4, T = 256;
  int steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--config")) config = argv[i + 1];
    else if (!strcmp(argv[i], "--batch")) B = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--seq")) T = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
  }
  slapo_status s;
  slapo_gpt2_config c;
  if ((s = slapo_gpt2_config_named(config, &c)) || (s = slapo_models_init())) die(s);
  int64_t shape[2] = {B, T};
  slapo_tensor *x, *y;
  if ((s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &x)) ||
      (s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &y)))
    die(s);
  int32_t *xd = slapo_tensor_data(x), *yd = slapo_tensor_data(y);
  for (int64_t i = 0; i < B * T; i++)
    xd[i] = (int32_t)((i * 7919) % c.vocab_size), yd[i] = (int32_t)((i * 104729 + 1) % c.vocab_size);
  bench_print_machine(stdout, "bench_schedules");
  printf("GPT-2 %s, B=%lld T=%lld, %d threads, median of %d steps (after 1 warm-up)\n", config,
         (long long)B, (long long)T, omp_get_max_threads(), steps);
  printf("%-30s %12s %12s %16s %16s\n", "schedule", "tokens/s", "step ms", "planned peak MB",
         "measured peak MB");
  for (size_t v = 0; v < sizeof k_variants / sizeof k_variants[0]; v++) {
    slapo_module *m;
    slapo_sched *root;
    slapo_sched_log *log;
    slapo_runner *r;
    if ((s = slapo_gpt2_new(&c, &m)) || (s = slapo_module_materialize(m, 1)) ||
        (s = slapo_sched_create(m, &root)) ||
        (s = slapo_sched_parse(k_variants[v].sched, "bench", &log)) ||
        (s = slapo_apply_schedule(root, log, NULL, 0, 0, NULL)) ||
        (s = slapo_runner_new(m, NULL, &r)))
      die(s);
    const slapo_tensor *in[2] = {x, y};
    double t[64];
    for (int k = 0; k <= steps && k < 64; k++) {
      slapo_kernel_env env = {1, (uint64_t)k, true};
      double t0 = omp_get_wtime();
      if ((s = slapo_step(r, 2, in, SLAPO_STEP_TRAIN, &env, NULL))) die(s);
      t[k] = omp_get_wtime() - t0;
    }
    qsort(t + 1, (size_t)steps, sizeof *t, cmp_double);
    double med = t[1 + steps / 2];
    printf("%-30s %12.0f %12.1f %16.1f %16.1f\n", k_variants[v].name, (double)(B * T) / med,
           med * 1e3, slapo_runner_peak_nbytes(r) / 1e6,
           slapo_plan_measured_peak_nbytes(slapo_runner_plan(r)) / 1e6);
    fflush(stdout);
    slapo_runner_free(r);
    slapo_sched_log_free(log);
    slapo_sched_free(root);
    slapo_module_free(m);
  }
  slapo_tensor_free(x);
  slapo_tensor_free(y);
  return 0;
}
