/* bench/bench_sample.c - text sampling speed, ms per token, with the KV
 * cache (each token runs alone against the cached keys and values) and
 * without it (the whole n_ctx window recomputed per token), on one model,
 * side by side. Random weights (the speed does not depend on them).
 *   bench_sample [--config 124M] [--tokens 32] [--prompt 16]
 * OMP_NUM_THREADS sets the threads. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slapo/train.h"
#include "bench_machine.h"

static double run(slapo_runner *r, int64_t n_ctx, int prompt, int tokens, bool no_cache,
                  int32_t *out) {
  int32_t *t = calloc((size_t)(prompt + tokens), sizeof *t);
  for (int i = 0; i < prompt; i++) t[i] = (i * 7919) % 256;
  int64_t n = prompt;
  slapo_sample_opts o = {.n_ctx = n_ctx, .temperature = 1.0f, .top_k = 1, .seed = 1,
                         .no_cache = no_cache};
  double t0 = bench_now_s();
  if (slapo_sample(r, &o, t, &n, tokens) != SLAPO_OK) {
    fprintf(stderr, "bench_sample: %s\n", slapo_last_error());
    exit(1);
  }
  double ms = (bench_now_s() - t0) * 1e3 / tokens;
  memcpy(out, t, (size_t)(prompt + tokens) * sizeof *t);
  free(t);
  return ms;
}

int main(int argc, char **argv) {
  const char *config = "124M";
  int tokens = 32, prompt = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--config")) config = argv[i + 1];
    else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
  }
  bench_print_machine(stdout, "bench_sample");
  const slapo_model_family *f = slapo_model_at(0);
  slapo_model_dims d;
  slapo_module *m;
  slapo_runner *r;
  if (f->dims(config, &d) || slapo_model_new(f, config, -1, 1, &m) ||
      slapo_runner_new(m, NULL, &r)) {
    fprintf(stderr, "bench_sample: %s\n", slapo_last_error());
    return 1;
  }
  int32_t *a = calloc((size_t)(prompt + tokens), sizeof *a), *b = calloc((size_t)(prompt + tokens), sizeof *b);
  double cached = run(r, d.n_ctx, prompt, tokens, false, a);
  double window = run(r, d.n_ctx, prompt, tokens, true, b);
  printf("%s %s, prompt %d, %d greedy tokens, %d threads: KV cache %.1f ms/token, window "
         "recompute (n_ctx %lld) %.1f ms/token, %.1fx; same tokens: %s\n",
         f->name, config, prompt, tokens, omp_get_max_threads(), cached, (long long)d.n_ctx,
         window, window / cached,
         memcmp(a, b, (size_t)(prompt + tokens) * sizeof *a) ? "NO" : "yes");
  free(a);
  free(b);
  slapo_runner_free(r);
  slapo_module_free(m);
  return 0;
}
