/* bench/bench_bf16_parity.c - loss parity of bf16 against f32 training:
 * the same model, seed, data and schedule trained twice through the library
 * (slapo_train), once in f32 and once with --precision bf16 and AdamW state
 * in bf16, validation loss every V steps. Prints both curves' final
 * validation loss, their relative difference, and the mean difference of
 * the training-loss curves. The library runs the bf16 numerics on any CPU
 * (on one without bf16 GEMMs their operands are widened to f32, so the
 * rounding is the same and only the speed is f32's); the CLI would fall
 * back to f32 there, hence this program.
 * Usage: bench_bf16_parity DATA [CONFIG [STEPS [BATCH [SEQ [SEED]]]]]
 *        (defaults: small 2000 4 64 1337). With SEED given, a third run,
 *        f32 at SEED, gives the noise floor: how far two f32 runs that
 *        differ only in their seed (weights, data order, dropout) end apart. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_machine.h"
#include "slapo/train.h"

typedef struct curve {
  int64_t n;
  double *loss, val, val_at;
} curve;

static void on_event(const slapo_train_event *e, void *ud) {
  curve *c = ud;
  if (e->message || e->sample || e->sample_total) return;
  c->loss[c->n++] = e->loss;
  if (e->has_val) c->val = e->val_loss, c->val_at = (double)e->step;
}

static int train(const char *data, const char *config, int64_t steps, int64_t batch, int64_t seq,
                 uint64_t seed, bool bf16, curve *out) {
  slapo_train_config c;
  slapo_train_config_default(&c);
  c.model_config = config;
  c.data = data;
  c.steps = steps, c.batch = batch, c.seq = seq, c.seed = seed;
  c.val_every = steps / 10 > 0 ? steps / 10 : 1;
  c.sample_tokens = 0;
  c.precision = bf16 ? "bf16" : NULL;
  c.optimizer_state_bf16 = bf16;
  out->loss = calloc((size_t)steps, sizeof *out->loss);
  slapo_status s = slapo_train(&c, on_event, out);
  if (s != SLAPO_OK) {
    fprintf(stderr, "bench_bf16_parity: %s: %s\n", slapo_status_name(s), slapo_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_bf16_parity DATA [CONFIG [STEPS [BATCH [SEQ]]]]\n");
    return 2;
  }
  const char *config = argc > 2 ? argv[2] : "small";
  int64_t steps = argc > 3 ? atoll(argv[3]) : 2000, batch = argc > 4 ? atoll(argv[4]) : 4;
  int64_t seq = argc > 5 ? atoll(argv[5]) : 64;
  uint64_t seed = 1337;
  bench_print_machine(stdout, "bench_bf16_parity");
  char why[200];
  bool hw = slapo_bf16_gemm_native(why, sizeof why);
  printf("bf16 GEMMs: %s%s\n", hw ? "bf16 hardware" : "widened to f32: ", hw ? "" : why);
  curve f = {0}, h = {0}, o = {0};
  if (train(argv[1], config, steps, batch, seq, seed, false, &f) ||
      train(argv[1], config, steps, batch, seq, seed, true, &h))
    return 1;
  if (argc > 6) {
    if (train(argv[1], config, steps, batch, seq, (uint64_t)atoll(argv[6]), false, &o)) return 1;
    printf("noise floor: f32 at seed %s ends at validation loss %.4f (%+.3f%% from seed %llu's)\n",
           argv[6], o.val, 100.0 * (o.val - f.val) / f.val, (unsigned long long)seed);
    free(o.loss);
  }
  double d = 0;
  int64_t n = f.n < h.n ? f.n : h.n;
  for (int64_t i = 0; i < n; i++) d += h.loss[i] - f.loss[i];
  printf("%s B%lld T%lld, %lld steps: final validation loss f32 %.4f, bf16 %.4f (relative "
         "difference %+.3f%%); training loss curves: mean difference bf16 - f32 %+.4f over %lld "
         "steps\n",
         config, (long long)batch, (long long)seq, (long long)steps, f.val, h.val,
         100.0 * (h.val - f.val) / f.val, d / (double)n, (long long)n);
  free(f.loss), free(h.loss);
  return 0;
}
