/* cli/main.c - the `slapo` command: subcommand dispatch, option parsing,
 * progress output and exit codes (0 ok, 1 error, 2 usage). The only layer
 * that prints or exits. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/train.h"

#define SLAPO_VERSION "0.1.0"

static int fail(slapo_status s) {
  fprintf(stderr, "slapo: %s: %s\n", slapo_status_name(s), slapo_last_error());
  return 1;
}

static int usage_error(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "slapo: usage: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'slapo %s --help'.\n", cmd);
  return 2;
}

static void top_usage(FILE *f) {
  fprintf(f,
          "usage: slapo <command> [options]\n"
          "\n"
          "slapo: a schedule language for progressive optimization of model training.\n"
          "\n"
          "commands:\n"
          "  train      train a model (GPT-2) on a text or token file\n"
          "  show       print a model's module tree\n"
          "  version    print the version\n"
          "  help       print this help\n"
          "\n"
          "Run 'slapo <command> --help' for the options of a command.\n");
}

/* ---- numbers ---- */

static bool parse_i64(const char *s, int64_t *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end) return false;
  *out = v;
  return true;
}

static bool parse_f(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end) return false;
  *out = v;
  return true;
}

static void fmt_duration(double s, char *buf, size_t cap) {
  if (s < 0 || s > 1e7) snprintf(buf, cap, "--");
  else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(buf, cap, "%.0fs", s);
}

/* ---- train ---- */

typedef struct progress {
  bool tty;
  bool bar_open;
} progress;

static void on_event(const slapo_train_event *e, void *ud) {
  progress *p = ud;
  if (e->message) {
    if (p->bar_open) fputc('\n', stdout), p->bar_open = false;
    printf("%s\n", e->message);
    fflush(stdout);
    return;
  }
  if (e->sample) {
    if (p->bar_open) fputc('\n', stdout), p->bar_open = false;
    printf("\n--- sample (%d tokens) ---\n%s\n---\n", (int)strlen(e->sample), e->sample);
    return;
  }
  double eta = e->step ? e->elapsed_s / (double)e->step * (double)(e->steps - e->step) : 0;
  char etas[32];
  fmt_duration(eta, etas, sizeof etas);
  if (p->tty) {
    int width = 24, done = (int)(width * e->step / (e->steps ? e->steps : 1));
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
    bar[width] = '\0';
    printf("\rstep %5lld/%lld [%s] loss %.4f | lr %.2e | %6.0f tok/s | ETA %-8s",
           (long long)e->step, (long long)e->steps, bar, e->loss, e->lr, e->tokens_per_s, etas);
    p->bar_open = true;
    if (e->has_val) {
      printf("\nstep %5lld: val loss %.4f\n", (long long)e->step, e->val_loss);
      p->bar_open = false;
    }
  } else if (e->has_val || e->step % 10 == 0 || e->step == 1) {
    printf("step %lld/%lld loss %.4f lr %.2e grad_norm %.3f %.0f tok/s ETA %s", (long long)e->step,
           (long long)e->steps, e->loss, e->lr, e->grad_norm, e->tokens_per_s, etas);
    if (e->has_val) printf(" val_loss %.4f", e->val_loss);
    printf("\n");
  }
  fflush(stdout);
}

static void train_usage(FILE *f, const slapo_train_config *d) {
  fprintf(f,
          "usage: slapo train [options]\n"
          "\n"
          "Trains GPT-2 with AdamW (warmup + cosine schedule), printing progress, validation\n"
          "loss and a text sample.\n"
          "\n"
          "options (default in brackets):\n"
          "  --model NAME        model family [gpt2]\n"
          "  --config NAME       tiny, small, 124M, 355M, 774M, 1.5B [%s]\n"
          "  --data PATH         text file, llm.c token file, or directory of text files\n"
          "                      [%s]\n"
          "  --steps N           optimizer steps [%lld]\n"
          "  --batch B           sequences per micro-batch [%lld]\n"
          "  --seq T             tokens per sequence [%lld]\n"
          "  --grad-accum K      micro-batches per step [%lld]\n"
          "  --lr X              peak learning rate [%g]\n"
          "  --min-lr X          final learning rate [%g]\n"
          "  --warmup N          warmup steps [%lld]\n"
          "  --weight-decay X    AdamW decoupled weight decay [%g]\n"
          "  --grad-clip X       clip the global gradient norm (0: off) [%g]\n"
          "  --dropout P         dropout probability (default: the config's)\n"
          "  --seed S            seed for weights, data order and dropout [%llu]\n"
          "  --val-every N       validation loss every N steps (0: only at the end) [%lld]\n"
          "  --val-batches N     batches per validation [%lld]\n"
          "  --metrics FILE      write one JSON object per step to FILE\n"
          "  --save FILE         checkpoint (Hugging Face safetensors; optimizer state in\n"
          "                      FILE's .optim.safetensors sibling)\n"
          "  --save-every N      also checkpoint every N steps [end only]\n"
          "  --resume FILE       continue from a checkpoint written by --save\n"
          "  --init-from FILE    start from Hugging Face GPT-2 weights\n"
          "  --sample N          tokens to sample at the end [%lld]\n"
          "  --temperature X     sampling temperature [%g]\n"
          "  --top-k K           sample from the K most likely tokens [%d]\n"
          "  --threads N         OpenMP threads (0: all cores) [%d]\n",
          d->model_config, d->data, (long long)d->steps, (long long)d->batch, (long long)d->seq,
          (long long)d->grad_accum, d->lr, d->min_lr, (long long)d->warmup, d->weight_decay,
          d->grad_clip, (unsigned long long)d->seed, (long long)d->val_every,
          (long long)d->val_batches, (long long)d->sample_tokens, d->temperature, d->top_k,
          d->threads);
}

enum {
  OPT_MODEL = 256, OPT_CONFIG, OPT_DATA, OPT_STEPS, OPT_BATCH, OPT_SEQ, OPT_ACCUM, OPT_LR,
  OPT_MIN_LR, OPT_WARMUP, OPT_WD, OPT_CLIP, OPT_DROPOUT, OPT_SEED, OPT_VAL_EVERY,
  OPT_VAL_BATCHES, OPT_METRICS, OPT_SAVE, OPT_SAVE_EVERY, OPT_RESUME, OPT_INIT, OPT_SAMPLE,
  OPT_TEMP, OPT_TOPK, OPT_THREADS, OPT_HELP
};

static int cmd_train(int argc, char **argv) {
  slapo_train_config c, d;
  slapo_train_config_default(&c);
  d = c;
  static const struct option opts[] = {
      {"model", required_argument, 0, OPT_MODEL}, {"config", required_argument, 0, OPT_CONFIG},
      {"data", required_argument, 0, OPT_DATA}, {"steps", required_argument, 0, OPT_STEPS},
      {"batch", required_argument, 0, OPT_BATCH}, {"seq", required_argument, 0, OPT_SEQ},
      {"grad-accum", required_argument, 0, OPT_ACCUM}, {"lr", required_argument, 0, OPT_LR},
      {"min-lr", required_argument, 0, OPT_MIN_LR}, {"warmup", required_argument, 0, OPT_WARMUP},
      {"weight-decay", required_argument, 0, OPT_WD}, {"grad-clip", required_argument, 0, OPT_CLIP},
      {"dropout", required_argument, 0, OPT_DROPOUT}, {"seed", required_argument, 0, OPT_SEED},
      {"val-every", required_argument, 0, OPT_VAL_EVERY},
      {"val-batches", required_argument, 0, OPT_VAL_BATCHES},
      {"metrics", required_argument, 0, OPT_METRICS}, {"save", required_argument, 0, OPT_SAVE},
      {"save-every", required_argument, 0, OPT_SAVE_EVERY},
      {"resume", required_argument, 0, OPT_RESUME}, {"init-from", required_argument, 0, OPT_INIT},
      {"sample", required_argument, 0, OPT_SAMPLE},
      {"temperature", required_argument, 0, OPT_TEMP}, {"top-k", required_argument, 0, OPT_TOPK},
      {"threads", required_argument, 0, OPT_THREADS}, {"help", no_argument, 0, OPT_HELP},
      {0, 0, 0, 0}};
  const char *model = "gpt2";
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    int64_t i = 0;
    double f = 0;
    bool ok = true;
    switch (o) {
    case OPT_MODEL: model = optarg; break;
    case OPT_CONFIG: c.model_config = optarg; break;
    case OPT_DATA: c.data = optarg; break;
    case OPT_STEPS: ok = parse_i64(optarg, &c.steps) && c.steps > 0; break;
    case OPT_BATCH: ok = parse_i64(optarg, &c.batch) && c.batch > 0; break;
    case OPT_SEQ: ok = parse_i64(optarg, &c.seq) && c.seq > 0; break;
    case OPT_ACCUM: ok = parse_i64(optarg, &c.grad_accum) && c.grad_accum > 0; break;
    case OPT_LR: ok = parse_f(optarg, &f) && f > 0, c.lr = (float)f; break;
    case OPT_MIN_LR: ok = parse_f(optarg, &f) && f >= 0, c.min_lr = (float)f; break;
    case OPT_WARMUP: ok = parse_i64(optarg, &c.warmup) && c.warmup >= 0; break;
    case OPT_WD: ok = parse_f(optarg, &f) && f >= 0, c.weight_decay = (float)f; break;
    case OPT_CLIP: ok = parse_f(optarg, &f) && f >= 0, c.grad_clip = (float)f; break;
    case OPT_DROPOUT: ok = parse_f(optarg, &c.dropout) && c.dropout >= 0 && c.dropout < 1; break;
    case OPT_SEED: ok = parse_i64(optarg, &i) && i >= 0, c.seed = (uint64_t)i; break;
    case OPT_VAL_EVERY: ok = parse_i64(optarg, &c.val_every) && c.val_every >= 0; break;
    case OPT_VAL_BATCHES: ok = parse_i64(optarg, &c.val_batches) && c.val_batches > 0; break;
    case OPT_METRICS: c.metrics = optarg; break;
    case OPT_SAVE: c.save = optarg; break;
    case OPT_SAVE_EVERY: ok = parse_i64(optarg, &c.save_every) && c.save_every >= 0; break;
    case OPT_RESUME: c.resume = optarg; break;
    case OPT_INIT: c.init_from = optarg; break;
    case OPT_SAMPLE: ok = parse_i64(optarg, &c.sample_tokens) && c.sample_tokens >= 0; break;
    case OPT_TEMP: ok = parse_f(optarg, &f) && f > 0, c.temperature = (float)f; break;
    case OPT_TOPK: ok = parse_i64(optarg, &i) && i >= 0, c.top_k = (int)i; break;
    case OPT_THREADS: ok = parse_i64(optarg, &i) && i >= 0, c.threads = (int)i; break;
    case OPT_HELP: train_usage(stdout, &d); return 0;
    default:
      return usage_error("train", "unknown or incomplete option '%s'", argv[optind - 1]);
    }
    if (!ok) return usage_error("train", "bad value '%s'", optarg);
  }
  if (optind < argc) return usage_error("train", "unexpected argument '%s'", argv[optind]);
  if (strcmp(model, "gpt2"))
    return usage_error("train", "unknown model '%s' (known: gpt2)", model);
  printf("slapo train: model=%s config=%s data=%s steps=%lld batch=%lld seq=%lld "
         "grad_accum=%lld lr=%g min_lr=%g warmup=%lld weight_decay=%g grad_clip=%g seed=%llu\n",
         model, c.model_config, c.data, (long long)c.steps, (long long)c.batch, (long long)c.seq,
         (long long)c.grad_accum, c.lr, c.min_lr, (long long)c.warmup, c.weight_decay,
         c.grad_clip, (unsigned long long)c.seed);
  fflush(stdout);
  progress p = {isatty(STDOUT_FILENO) != 0, false};
  slapo_status s = slapo_train(&c, on_event, &p);
  if (p.bar_open) fputc('\n', stdout);
  return s == SLAPO_OK ? 0 : fail(s);
}

/* ---- show ---- */

static int cmd_show(int argc, char **argv) {
  const char *model = "gpt2", *config = "small";
  static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                       {"config", required_argument, 0, OPT_CONFIG},
                                       {"help", no_argument, 0, OPT_HELP},
                                       {0, 0, 0, 0}};
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case OPT_MODEL: model = optarg; break;
    case OPT_CONFIG: config = optarg; break;
    case OPT_HELP:
      printf("usage: slapo show [--model gpt2] [--config NAME]\n\n"
             "Prints the module tree with parameter counts.\n"
             "  --model NAME   model family [gpt2]\n"
             "  --config NAME  tiny, small, 124M, 355M, 774M, 1.5B [small]\n");
      return 0;
    default: return usage_error("show", "unknown or incomplete option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return usage_error("show", "unexpected argument '%s'", argv[optind]);
  if (strcmp(model, "gpt2")) return usage_error("show", "unknown model '%s' (known: gpt2)", model);
  slapo_gpt2_config mc;
  slapo_status s = slapo_gpt2_config_named(config, &mc);
  if (s != SLAPO_OK) return fail(s);
  slapo_module *m;
  if ((s = slapo_gpt2_new(&mc, &m)) != SLAPO_OK) return fail(s);
  slapo_module_print(m, stdout);
  printf("total: %lld parameters (lm_head.weight tied to transformer.wte.weight)\n",
         (long long)slapo_module_numel(m));
  slapo_module_free(m);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    top_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("slapo %s\n", SLAPO_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    top_usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "show")) return cmd_show(argc - 1, argv + 1);
  fprintf(stderr, "slapo: usage: unknown command '%s'\n", cmd);
  top_usage(stderr);
  return 2;
}
