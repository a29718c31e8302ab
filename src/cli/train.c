/* cli/train.c - `slapo train`: options into slapo_train_config, the
 * effective configuration and kernels printed at start, then a progress bar
 * on a terminal (plain lines otherwise). Layer: cli. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/common.h"

typedef struct progress {
  bool tty;
  bool bar_open;
} progress;

static void close_bar(progress *p) {
  if (p->bar_open) fputc('\n', stdout), p->bar_open = false;
}

static void on_step(const slapo_train_event *e, progress *p) {
  double eta = e->step ? e->elapsed_s / (double)e->step * (double)(e->steps - e->step) : 0;
  char etas[32];
  cli_fmt_duration(eta, etas, sizeof etas);
  if (p->tty) {
    int width = 24, done = (int)(width * e->step / (e->steps ? e->steps : 1));
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
    bar[width] = '\0';
    printf("\rstep %5lld/%lld [%s] loss %.4f | lr %.2e | %6.0f tok/s | ETA %-8s",
           (long long)e->step, (long long)e->steps, bar, e->loss, e->lr, e->tokens_per_s, etas);
    p->bar_open = true;
    if (e->has_val) {
      printf("\nstep %5lld: val loss %.4f", (long long)e->step, e->val_loss);
      if (isfinite(e->val_nats_per_byte)) printf(" (%.4f nats/byte)", e->val_nats_per_byte);
      printf("\n");
      p->bar_open = false;
    }
  } else if (e->has_val || e->step % 10 == 0 || e->step == 1) {
    printf("step %lld/%lld loss %.4f lr %.2e grad_norm %.3f %.0f tok/s ETA %s", (long long)e->step,
           (long long)e->steps, e->loss, e->lr, e->grad_norm, e->tokens_per_s, etas);
    if (e->has_val) printf(" val_loss %.4f", e->val_loss);
    if (e->has_val && isfinite(e->val_nats_per_byte))
      printf(" val_nats_per_byte %.4f", e->val_nats_per_byte);
    printf("\n");
  }
}

static void on_event(const slapo_train_event *e, void *ud) {
  progress *p = ud;
  if (e->message) {
    close_bar(p);
    printf("%s\n", e->message);
  } else if (e->sample) {
    close_bar(p);
    printf("\n--- sample ---\n%s\n---\n", e->sample);
  } else if (e->sample_total) {
    /* a line per tenth of the sample off a terminal, a counter on one */
    if (p->tty) printf("\rsampling %lld/%lld tokens", (long long)e->sample_done,
                       (long long)e->sample_total), p->bar_open = true;
    else if (e->sample_done == e->sample_total || e->sample_done % (e->sample_total / 10 + 1) == 0)
      printf("sampling %lld/%lld tokens\n", (long long)e->sample_done, (long long)e->sample_total);
  } else {
    on_step(e, p);
  }
  fflush(stdout);
}

static void train_usage(FILE *f, const slapo_train_config *d) {
  fprintf(f, "usage: slapo train [options]\n\n"
             "Trains a model with AdamW (warmup + cosine schedule), printing progress,\n"
             "validation loss and a text sample.\n\noptions (default in brackets):\n");
  cli_model_usage(f, d->model_config);
  cli_pp_usage(f);
  fprintf(f,
          "  --data PATH         text file, llm.c token file, or directory of text files\n"
          "                      [%s]\n"
          "  --tokenizer T       how text becomes tokens: bytes, gpt2 (GPT-2's own BPE),\n"
          "                      a tokenizer.json or a directory with one, or bpe:N (learn\n"
          "                      an N-token BPE on the training split); byte-sized configs\n"
          "                      take its vocabulary [text read as bytes]\n"
          "  --steps N           optimizer steps [%lld]\n"
          "  --batch B           sequences per micro-batch [%lld]\n"
          "  --seq T             tokens per sequence (0: the config's context, at most\n"
          "                      256) [%lld]\n"
          "  --grad-accum K      micro-batches per step, weighted by valid tokens [%lld]\n"
          "  --lr X              peak learning rate [%g; bert: 5e-4]\n"
          "  --min-lr X          final learning rate [%g; a tenth of a family's own]\n"
          "  --warmup N          warmup steps [%lld]\n"
          "  --weight-decay X    AdamW decoupled weight decay [%g]\n"
          "  --optimizer-state D AdamW's m and v in f32, or bf16 (half the memory; stored\n"
          "                      with stochastic rounding; files convert both ways) [f32]\n"
          "  --grad-clip X       clip the global gradient norm (0: off) [%g]\n"
          "  --dropout P         dropout probability (default: the config's)\n"
          "  --seed S            seed for weights, data order and dropout [%llu]\n"
          "  --val-every N       validation loss every N steps (0: only at the end) [%lld]\n"
          "  --val-batches N     batches per validation [%lld]\n"
          "  --metrics FILE      write one JSON object per step to FILE\n"
          "  --plot FILE         draw the metrics as an SVG loss plot at the end\n"
          "  --save FILE         checkpoint (Hugging Face safetensors; optimizer state in\n"
          "                      FILE's .optim.safetensors sibling)\n"
          "  --save-every N      also checkpoint every N steps [end only]\n"
          "  --resume FILE       continue from a checkpoint written by --save\n"
          "  --init-from FILE    start from Hugging Face weights of the model\n"
          "  --sample N          tokens to sample at the end [%lld]\n"
          "  --temperature X     sampling temperature [%g]\n"
          "  --top-k K           sample from the K most likely tokens (0: all) [%d]\n"
          "  --threads N         OpenMP threads (0: all cores) [%d]\n",
          d->data, (long long)d->steps, (long long)d->batch, (long long)d->seq,
          (long long)d->grad_accum, d->lr, d->min_lr, (long long)d->warmup, d->weight_decay,
          d->grad_clip, (unsigned long long)d->seed, (long long)d->val_every,
          (long long)d->val_batches, (long long)d->sample_tokens, d->temperature, d->top_k,
          d->threads);
}

static const struct option k_opts[] = {
    CLI_MODEL_OPTIONS, CLI_PP_OPTIONS,
    {"data", required_argument, 0, OPT_DATA}, {"steps", required_argument, 0, OPT_STEPS},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"batch", required_argument, 0, OPT_BATCH}, {"seq", required_argument, 0, OPT_SEQ},
    {"grad-accum", required_argument, 0, OPT_ACCUM}, {"lr", required_argument, 0, OPT_LR},
    {"min-lr", required_argument, 0, OPT_MIN_LR}, {"warmup", required_argument, 0, OPT_WARMUP},
    {"weight-decay", required_argument, 0, OPT_WD},
    {"optimizer-state", required_argument, 0, OPT_OPT_STATE}, {"grad-clip", required_argument, 0, OPT_CLIP},
    {"dropout", required_argument, 0, OPT_DROPOUT}, {"seed", required_argument, 0, OPT_SEED},
    {"val-every", required_argument, 0, OPT_VAL_EVERY},
    {"val-batches", required_argument, 0, OPT_VAL_BATCHES},
    {"metrics", required_argument, 0, OPT_METRICS}, {"plot", required_argument, 0, OPT_PLOT},
    {"save", required_argument, 0, OPT_SAVE},
    {"save-every", required_argument, 0, OPT_SAVE_EVERY},
    {"resume", required_argument, 0, OPT_RESUME}, {"init-from", required_argument, 0, OPT_INIT},
    {"sample", required_argument, 0, OPT_SAMPLE}, {"temperature", required_argument, 0, OPT_TEMP},
    {"top-k", required_argument, 0, OPT_TOPK}, {"threads", required_argument, 0, OPT_THREADS},
    {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};

/* One training option into c: false for a bad value. */
static bool train_option(slapo_train_config *c, int o, const char *a) {
  int64_t i = 0;
  double f = 0;
  switch (o) {
  case OPT_DATA: c->data = a; return true;
  case OPT_TOKENIZER: c->tokenizer = !strcmp(a, "gpt2") ? cli_gpt2_tokenizer_dir() : a; return true;
  case OPT_STEPS: return cli_parse_i64(a, &c->steps) && c->steps > 0;
  case OPT_BATCH: return cli_parse_i64(a, &c->batch) && c->batch > 0;
  case OPT_SEQ: return cli_parse_i64(a, &c->seq) && c->seq >= 0;
  case OPT_ACCUM: return cli_parse_i64(a, &c->grad_accum) && c->grad_accum > 0 && c->grad_accum <= INT_MAX;
  case OPT_LR: return cli_parse_f(a, &f) && f > 0 && (c->lr = (float)f, true);
  case OPT_MIN_LR: return cli_parse_f(a, &f) && f >= 0 && (c->min_lr = (float)f, true);
  case OPT_WARMUP: return cli_parse_i64(a, &c->warmup) && c->warmup >= 0;
  case OPT_WD: return cli_parse_f(a, &f) && f >= 0 && (c->weight_decay = (float)f, true);
  case OPT_CLIP: return cli_parse_f(a, &f) && f >= 0 && (c->grad_clip = (float)f, true);
  case OPT_OPT_STATE: return cli_parse_precision(a, &c->optimizer_state_bf16);
  case OPT_DROPOUT: return cli_parse_f(a, &c->dropout) && c->dropout >= 0 && c->dropout < 1;
  case OPT_SEED: return cli_parse_i64(a, &i) && i >= 0 && (c->seed = (uint64_t)i, true);
  case OPT_VAL_EVERY: return cli_parse_i64(a, &c->val_every) && c->val_every >= 0;
  case OPT_VAL_BATCHES: return cli_parse_i64(a, &c->val_batches) && c->val_batches > 0;
  case OPT_METRICS: c->metrics = a; return true;
  case OPT_PLOT: c->plot = a; return true;
  case OPT_SAVE: c->save = a; return true;
  case OPT_SAVE_EVERY: return cli_parse_i64(a, &c->save_every) && c->save_every >= 0;
  case OPT_RESUME: c->resume = a; return true;
  case OPT_INIT: c->init_from = a; return true;
  case OPT_SAMPLE: return cli_parse_i64(a, &c->sample_tokens) && c->sample_tokens >= 0;
  case OPT_TEMP: return cli_parse_f(a, &f) && f > 0 && (c->temperature = (float)f, true);
  case OPT_TOPK: return cli_parse_i64(a, &i) && i >= 0 && i <= INT_MAX && (c->top_k = (int)i, true);
  case OPT_PP_SCHEDULE: return cli_parse_pp_schedule(a, &c->pp_schedule);
  case OPT_THREADS:
    return cli_parse_i64(a, &i) && i >= 0 && i <= INT_MAX && (c->threads = (int)i, true);
  default: return false;
  }
}

/* What every rank must share beyond the model options (README "What may
 * differ between ranks"): everything that shapes a step, the numbers it
 * computes or the collectives it calls. Not here: --threads (speed; each
 * rank's results stay within rounding), --metrics and --plot (rank 0 alone
 * writes them). The data by the digest of its whole content, checkpoints
 * to resume or start from by path and size. */
static void train_fields(cli_fields *a, const void *ud) {
  const slapo_train_config *c = ud;
  uint64_t h = 0;
  int64_t nbytes = 0;
  char shown[SLAPO_DIST_FIELD_SHOWN];
  if (slapo_dataset_digest(c->data, &h, &nbytes) == SLAPO_OK) {
    size_t n = strlen(c->data), cap = sizeof shown - 24;
    snprintf(shown, sizeof shown, "%s%s (%lld bytes)", n > cap ? "..." : "",
             n > cap ? c->data + n - (cap - 3) : c->data, (long long)nbytes);
  } else { /* unreadable here: a difference unless every rank says so */
    snprintf(shown, sizeof shown, "%s (unreadable)", c->data);
    h = slapo_hash_str(slapo_last_error());
  }
  cli_fields_digest(a, "--data", shown, h);
  /* The tokenizer by its content too (a path may hold other files on
   * another machine); bpe:N is learned from the data, which is checked. */
  h = 0;
  if (c->tokenizer && strncmp(c->tokenizer, "bpe:", 4) && strcmp(c->tokenizer, "bytes") &&
      slapo_dataset_digest(c->tokenizer, &h, &nbytes) != SLAPO_OK)
    h = slapo_hash_str(slapo_last_error());
  cli_fields_digest(a, "--tokenizer", c->tokenizer ? c->tokenizer : "none", h);
  cli_fields_i64(a, "--steps", c->steps);
  cli_fields_i64(a, "--batch", c->batch);
  cli_fields_i64(a, "--seq", c->seq);
  cli_fields_i64(a, "--grad-accum", c->grad_accum);
  cli_fields_str(a, "--pp-schedule", cli_pp_schedule_arg(c->pp_schedule));
  cli_fields_f64(a, "--lr", c->lr);
  cli_fields_f64(a, "--min-lr", c->min_lr);
  cli_fields_i64(a, "--warmup", c->warmup);
  cli_fields_f64(a, "--weight-decay", c->weight_decay);
  cli_fields_str(a, "--optimizer-state", c->optimizer_state_bf16 ? "bf16" : "f32");
  cli_fields_f64(a, "--grad-clip", c->grad_clip);
  cli_fields_f64(a, "--dropout", c->dropout);
  cli_fields_i64(a, "--seed", (int64_t)c->seed);
  cli_fields_i64(a, "--val-every", c->val_every);
  cli_fields_i64(a, "--val-batches", c->val_batches);
  cli_fields_str(a, "--save", c->save);
  cli_fields_i64(a, "--save-every", c->save_every);
  cli_fields_file_size(a, "--resume", c->resume);
  cli_fields_file_size(a, "--init-from", c->init_from);
  cli_fields_i64(a, "--sample", c->sample_tokens);
  cli_fields_f64(a, "--temperature", c->temperature);
  cli_fields_i64(a, "--top-k", c->top_k);
}

static void print_start(const slapo_train_config *c) {
  char seqs[32], cpu[256], kernels[256];
  if (c->seq) snprintf(seqs, sizeof seqs, "%lld", (long long)c->seq);
  else snprintf(seqs, sizeof seqs, "auto");
  printf("slapo train: model=%s config=%s data=%s tokenizer=%s steps=%lld batch=%lld seq=%s "
         "grad_accum=%lld lr=%g min_lr=%g warmup=%lld weight_decay=%g grad_clip=%g seed=%llu\n",
         c->model, c->model_config, c->data, c->tokenizer ? c->tokenizer : "none (bytes)",
         (long long)c->steps, (long long)c->batch, seqs,
         (long long)c->grad_accum, c->lr, c->min_lr, (long long)c->warmup, c->weight_decay,
         c->grad_clip, (unsigned long long)c->seed);
  slapo_cpu_model(cpu, sizeof cpu);
  slapo_kernels_describe(kernels, sizeof kernels);
  printf("cpu: %s; %s\n", cpu, kernels);
  fflush(stdout);
}

int cmd_train(int argc, char **argv) {
  slapo_train_config c, d;
  slapo_train_config_default(&c);
  d = c;
  cli_model_opts mo = {0};
  int o, rc = -1;
  bool lr_set = false, min_lr_set = false, started = false;
  opterr = 0;
  while (rc < 0 && (o = cli_getopt(argc, argv, k_opts)) != -1) {
    lr_set |= o == OPT_LR, min_lr_set |= o == OPT_MIN_LR;
    int taken = cli_model_option(&mo, o, optarg);
    if (o == OPT_HELP) train_usage(stdout, &d), rc = 0;
    else if (taken < 0 || (!taken && !train_option(&c, o, optarg)))
      rc = cli_option_error("train", k_opts, o, argv);
  }
  if (rc < 0 && optind < argc) rc = cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
  if (rc < 0 && (rc = cli_model_resolve(&mo, "train")) == 0) {
    cli_precision_for_speed(&mo, "train");
    c.model = mo.model, c.model_config = mo.config, c.schedule = mo.schedule;
    c.precision = mo.precision;
    c.disabled = mo.disabled, c.n_disabled = mo.n_disabled;
    /* A family's own learning rate (BERT's post-LN blocks want a smaller
     * one) unless the user gave one. */
    if (!lr_set && mo.family->lr > 0) c.lr = mo.family->lr;
    if (!min_lr_set && !lr_set && mo.family->lr > 0) c.min_lr = c.lr / 10;
    started = (rc = cli_model_start(&mo, "train", train_fields, &c)) == 0;
  }
  if (started) {
    print_start(&c);
    /* A bar only on a terminal. Under mpirun a rank's stdout is Open MPI's
     * pty whatever mpirun's own output is (a log file), so ranks print
     * lines. */
    progress p = {isatty(STDOUT_FILENO) != 0 && !slapo_dist_active(), false};
    slapo_status s = slapo_train(&c, on_event, &p);
    close_bar(&p);
    rc = s == SLAPO_OK ? 0 : cli_fail(s);
  }
  cli_model_opts_deinit(&mo);
  return rc;
}
