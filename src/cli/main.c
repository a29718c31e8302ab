/* cli/main.c - the `slapo` command: subcommand dispatch, option parsing,
 * progress output and exit codes (0 ok, 1 error, 2 usage). The only layer
 * that prints or exits. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
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
          "  show       print a model's module tree, or a schedule's expanded steps\n"
          "  verify     prove a schedule keeps a model's outputs and gradients\n"
          "  primitives list the schedule primitives\n"
          "  help <primitive>  print a primitive's documentation\n"
          "  version    print the version\n"
          "  help       print this help\n"
          "\n"
          "Run 'slapo <command> --help' for the options of a command.\n");
}

/* The long name of option `val` in `opts`. */
static const char *opt_name(const struct option *opts, int val) {
  for (; opts->name; opts++)
    if (opts->val == val) return opts->name;
  return "?";
}

/* Usage error for getopt_long's result `o` (':' missing value, '?'
 * unknown) or a bad value of option `o`. */
static int option_error(const char *cmd, const struct option *opts, int o, char **argv) {
  char buf[256];
  if (o == ':') snprintf(buf, sizeof buf, "option '--%s' needs a value", opt_name(opts, optopt));
  else if (o == '?') snprintf(buf, sizeof buf, "unknown option '%s'", argv[optind - 1]);
  else snprintf(buf, sizeof buf, "--%s: bad value '%s'", opt_name(opts, o), optarg);
  return usage_error(cmd, "%s", buf);
}

/* ---- numbers ---- */

static bool parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno == ERANGE) return false; /* never clamp silently */
  *out = v;
  return true;
}

static bool parse_f(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno == ERANGE || !isfinite(v)) return false;
  *out = v;
  return true;
}

static void fmt_duration(double s, char *buf, size_t cap) {
  if (s < 0 || s > 1e7) snprintf(buf, cap, "--");
  else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(buf, cap, "%.0fs", s);
}

/* Parses "2,5,7" into a malloc'd array. */
static bool parse_list(const char *s, size_t **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  size_t *v = malloc(cap * sizeof *v);
  if (!v) return false;
  *n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long long x = strtoll(p, &end, 10);
    if (end == p || x < 1 || (*end && *end != ',')) {
      free(v);
      return false;
    }
    for (size_t i = 0; i < *n; i++)
      if (v[i] == (size_t)x) { /* a duplicate */
        free(v);
        return false;
      }
    v[(*n)++] = (size_t)x;
    if (*end == ',' && !end[1]) { /* a trailing comma */
      free(v);
      return false;
    }
    p = *end ? end + 1 : end;
  }
  free(*out);
  *out = v;
  return *n > 0;
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
    printf("\n--- sample ---\n%s\n---\n", e->sample);
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
          "  --seq T             tokens per sequence (0: the config's context, at most\n"
          "                      256) [%lld]\n"
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
          "  --threads N         OpenMP threads (0: all cores) [%d]\n"
          "  --schedule FILE     apply a .sched file to the model before training\n"
          "  --disable LIST      skip these schedule steps (numbers from 'slapo show\n"
          "                      --schedule', e.g. 2,5)\n",
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
  OPT_TEMP, OPT_TOPK, OPT_THREADS, OPT_HELP, OPT_SCHEDULE, OPT_DISABLE, OPT_BISECT,
  OPT_PER_ENTRY, OPT_ATOL, OPT_RTOL
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
      {"schedule", required_argument, 0, OPT_SCHEDULE},
      {"disable", required_argument, 0, OPT_DISABLE}, {0, 0, 0, 0}};
  const char *model = "gpt2";
  size_t *disabled = NULL;
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    int64_t i = 0;
    double f = 0;
    bool ok = true;
    switch (o) {
    case OPT_MODEL: model = optarg; break;
    case OPT_CONFIG: c.model_config = optarg; break;
    case OPT_DATA: c.data = optarg; break;
    case OPT_STEPS: ok = parse_i64(optarg, &c.steps) && c.steps > 0; break;
    case OPT_BATCH: ok = parse_i64(optarg, &c.batch) && c.batch > 0; break;
    case OPT_SEQ: ok = parse_i64(optarg, &c.seq) && c.seq >= 0; break;
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
    case OPT_TOPK: ok = parse_i64(optarg, &i) && i >= 0 && i <= INT_MAX, c.top_k = (int)i; break;
    case OPT_THREADS:
      ok = parse_i64(optarg, &i) && i >= 0 && i <= INT_MAX, c.threads = (int)i;
      break;
    case OPT_SCHEDULE: c.schedule = optarg; break;
    case OPT_DISABLE: ok = parse_list(optarg, &disabled, &c.n_disabled); break;
    case OPT_HELP: free(disabled); train_usage(stdout, &d); return 0;
    default:
      free(disabled);
      return option_error("train", opts, o, argv);
    }
    if (!ok) {
      free(disabled);
      return option_error("train", opts, o, argv);
    }
  }
  c.disabled = disabled;
  if (c.n_disabled && !c.schedule) {
    free(disabled);
    return usage_error("train", "%s", "--disable needs --schedule");
  }
  if (optind < argc || strcmp(model, "gpt2")) {
    free(disabled);
    if (optind < argc) return usage_error("train", "unexpected argument '%s'", argv[optind]);
    return usage_error("train", "unknown model '%s' (known: gpt2)", model);
  }
  char seqs[32];
  if (c.seq) snprintf(seqs, sizeof seqs, "%lld", (long long)c.seq);
  else snprintf(seqs, sizeof seqs, "auto");
  printf("slapo train: model=%s config=%s data=%s steps=%lld batch=%lld seq=%s "
         "grad_accum=%lld lr=%g min_lr=%g warmup=%lld weight_decay=%g grad_clip=%g seed=%llu\n",
         model, c.model_config, c.data, (long long)c.steps, (long long)c.batch, seqs,
         (long long)c.grad_accum, c.lr, c.min_lr, (long long)c.warmup, c.weight_decay,
         c.grad_clip, (unsigned long long)c.seed);
  char cpu[256], kernels[256];
  slapo_cpu_model(cpu, sizeof cpu);
  slapo_kernels_describe(kernels, sizeof kernels);
  printf("cpu: %s; %s\n", cpu, kernels);
  fflush(stdout);
  progress p = {isatty(STDOUT_FILENO) != 0, false};
  slapo_status s = slapo_train(&c, on_event, &p);
  if (p.bar_open) fputc('\n', stdout);
  free(disabled);
  return s == SLAPO_OK ? 0 : fail(s);
}

/* ---- show ---- */

static int cmd_show(int argc, char **argv) {
  const char *model = "gpt2", *config = "small", *schedule = NULL;
  size_t *disabled = NULL, n_disabled = 0;
  static const struct option opts[] = {{"model", required_argument, 0, OPT_MODEL},
                                       {"config", required_argument, 0, OPT_CONFIG},
                                       {"schedule", required_argument, 0, OPT_SCHEDULE},
                                       {"disable", required_argument, 0, OPT_DISABLE},
                                       {"help", no_argument, 0, OPT_HELP},
                                       {0, 0, 0, 0}};
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (o) {
    case OPT_MODEL: model = optarg; break;
    case OPT_CONFIG: config = optarg; break;
    case OPT_SCHEDULE: schedule = optarg; break;
    case OPT_DISABLE:
      if (!parse_list(optarg, &disabled, &n_disabled)) {
        free(disabled);
        return option_error("show", opts, o, argv);
      }
      break;
    case OPT_HELP:
      printf("usage: slapo show [--model gpt2] [--config NAME] [--schedule FILE [--disable LIST]]\n\n"
             "Prints the module tree with parameter counts. With --schedule, prints the\n"
             "schedule's expanded steps numbered from 1 with their file:line, applies them\n"
             "(skipping --disable'd numbers) and prints the scheduled tree and its log.\n"
             "  --model NAME     model family [gpt2]\n"
             "  --config NAME    tiny, small, 124M, 355M, 774M, 1.5B [small]\n"
             "  --schedule FILE  a .sched file\n"
             "  --disable LIST   step numbers to skip, e.g. 2,5\n");
      free(disabled);
      return 0;
    default:
      free(disabled);
      return option_error("show", opts, o, argv);
    }
  }
  if (optind < argc || strcmp(model, "gpt2") || (n_disabled && !schedule)) {
    free(disabled);
    if (optind < argc) return usage_error("show", "unexpected argument '%s'", argv[optind]);
    if (!schedule) return usage_error("show", "%s", "--disable needs --schedule");
    return usage_error("show", "unknown model '%s' (known: gpt2)", model);
  }
  slapo_gpt2_config mc;
  slapo_module *m = NULL;
  slapo_sched *root = NULL;
  slapo_sched_log *log = NULL;
  slapo_sched_steps steps = {0};
  slapo_status s = slapo_gpt2_config_named(config, &mc);
  if (s == SLAPO_OK) s = slapo_gpt2_new(&mc, &m);
  if (s == SLAPO_OK && schedule) {
    s = slapo_models_init();
    if (s == SLAPO_OK) s = slapo_sched_parse_file(schedule, &log);
    if (s == SLAPO_OK) s = slapo_sched_create(m, &root);
    if (s == SLAPO_OK) s = slapo_sched_expand(log, root, &steps);
    if (s == SLAPO_OK) {
      printf("schedule %s: %zu steps\n", schedule, steps.n);
      slapo_sched_steps_print(&steps, stdout);
      if (n_disabled) {
        printf("disabled:");
        for (size_t i = 0; i < n_disabled; i++) printf(" %zu", disabled[i]);
        printf("\n");
      }
      s = slapo_apply_schedule(root, log, disabled, n_disabled, 0, NULL);
    }
    if (s == SLAPO_OK) {
      printf("\napplied (%zu disabled):\n", n_disabled);
      slapo_sched_log_print(slapo_sched_log_of(root), stdout);
      printf("\n");
    }
  }
  if (s == SLAPO_OK) {
    slapo_module_print(m, stdout);
    printf("total: %lld parameters (lm_head.weight tied to transformer.wte.weight)\n",
           (long long)slapo_module_numel(m));
  }
  slapo_sched_steps_deinit(&steps);
  slapo_sched_free(root);
  slapo_sched_log_free(log);
  slapo_module_free(m);
  free(disabled);
  return s == SLAPO_OK ? 0 : fail(s);
}

/* ---- verify ---- */

typedef struct verify_model {
  slapo_gpt2_config cfg;
  uint64_t seed;
} verify_model;

static slapo_status build_model(void *ud, slapo_module **out) {
  const verify_model *v = ud;
  slapo_status s = slapo_gpt2_new(&v->cfg, out);
  if (s == SLAPO_OK && (s = slapo_module_materialize(*out, v->seed)) != SLAPO_OK) {
    slapo_module_free(*out);
    *out = NULL;
  }
  return s;
}

static void on_check(const slapo_verify_check *c, const slapo_sched_steps *steps, void *ud) {
  (void)ud;
  const slapo_sched_step *st = NULL;
  for (size_t i = 0; i < steps->n; i++)
    if (steps->items[i].number == c->upto) st = &steps->items[i];
  printf("steps 1-%zu", c->upto);
  if (st)
    printf(" (last: %s:%d %s %s)", st->entry->file ? st->entry->file : "?", st->entry->line,
           st->path, st->entry->primitive);
  if (c->bitwise) printf(": %s bitwise%s%s\n", c->ok ? "equal" : "NOT equal", c->ok ? "" : " at ",
                         c->ok ? "" : c->what);
  else printf(": %s, worst error %.3g of tolerance at %s\n", c->ok ? "within tolerance" : "FAILS",
              c->worst, c->what);
  fflush(stdout);
}

static int cmd_verify(int argc, char **argv) {
  const char *model = "gpt2", *config = "tiny", *schedule = NULL;
  size_t *disabled = NULL, n_disabled = 0;
  int64_t batch = 2, seq = 32, seed = 1337;
  double dropout = 0.1, atol = 1e-5, rtol = 1e-4;
  bool bisect = false, per_entry = true;
  static const struct option opts[] = {
      {"model", required_argument, 0, OPT_MODEL}, {"config", required_argument, 0, OPT_CONFIG},
      {"schedule", required_argument, 0, OPT_SCHEDULE},
      {"disable", required_argument, 0, OPT_DISABLE}, {"bisect", no_argument, 0, OPT_BISECT},
      {"final-only", no_argument, 0, OPT_PER_ENTRY}, {"batch", required_argument, 0, OPT_BATCH},
      {"seq", required_argument, 0, OPT_SEQ}, {"seed", required_argument, 0, OPT_SEED},
      {"dropout", required_argument, 0, OPT_DROPOUT}, {"atol", required_argument, 0, OPT_ATOL},
      {"rtol", required_argument, 0, OPT_RTOL}, {"help", no_argument, 0, OPT_HELP},
      {0, 0, 0, 0}};
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    bool ok = true;
    switch (o) {
    case OPT_MODEL: model = optarg; break;
    case OPT_CONFIG: config = optarg; break;
    case OPT_SCHEDULE: schedule = optarg; break;
    case OPT_DISABLE: ok = parse_list(optarg, &disabled, &n_disabled); break;
    case OPT_BISECT: bisect = true; break;
    case OPT_PER_ENTRY: per_entry = false; break;
    case OPT_BATCH: ok = parse_i64(optarg, &batch) && batch > 0; break;
    case OPT_SEQ: ok = parse_i64(optarg, &seq) && seq > 0; break;
    case OPT_SEED: ok = parse_i64(optarg, &seed) && seed >= 0; break;
    case OPT_DROPOUT: ok = parse_f(optarg, &dropout) && dropout >= 0 && dropout < 1; break;
    case OPT_ATOL: ok = parse_f(optarg, &atol) && atol > 0; break;
    case OPT_RTOL: ok = parse_f(optarg, &rtol) && rtol > 0; break;
    case OPT_HELP:
      printf("usage: slapo verify --schedule FILE [options]\n\n"
             "Builds the unscheduled and the scheduled model from the same weights and seed,\n"
             "runs forward and backward on the same batch with dropout on, and compares the\n"
             "logits, the loss and every parameter gradient by path: bitwise where every\n"
             "applied primitive promises it, otherwise within atol + rtol |x|. Checks after\n"
             "every schedule step unless --final-only.\n\n"
             "  --model NAME     model family [gpt2]\n"
             "  --config NAME    [tiny]\n"
             "  --schedule FILE  the .sched file (required)\n"
             "  --disable LIST   step numbers to skip, e.g. 2,5\n"
             "  --bisect         binary-search the first step that breaks equality\n"
             "  --final-only     check only the fully scheduled model\n"
             "  --batch B        [2]\n  --seq T          [32]\n  --seed S         [1337]\n"
             "  --dropout P      dropout during the check [0.1]\n"
             "  --atol X         [1e-05]\n  --rtol X         [0.0001]\n");
      free(disabled);
      return 0;
    default:
      free(disabled);
      return option_error("verify", opts, o, argv);
    }
    if (!ok) {
      free(disabled);
      return option_error("verify", opts, o, argv);
    }
  }
  if (optind < argc || strcmp(model, "gpt2") || !schedule) {
    free(disabled);
    if (optind < argc) return usage_error("verify", "unexpected argument '%s'", argv[optind]);
    if (!schedule) return usage_error("verify", "%s", "--schedule FILE is required");
    return usage_error("verify", "unknown model '%s' (known: gpt2)", model);
  }
  verify_model vm = {.seed = (uint64_t)seed};
  slapo_sched_log *log = NULL;
  slapo_tensor *idx = NULL, *tgt = NULL;
  size_t first_bad = 0;
  slapo_status s = slapo_gpt2_config_named(config, &vm.cfg);
  if (s == SLAPO_OK && seq > vm.cfg.n_ctx)
    s = slapo_error(SLAPO_INVALID_ARG, "verify: --seq %lld exceeds the %s context of %lld",
                    (long long)seq, config, (long long)vm.cfg.n_ctx);
  vm.cfg.dropout = dropout;
  int64_t shape[2] = {batch, seq};
  if (s == SLAPO_OK) s = slapo_models_init();
  if (s == SLAPO_OK) s = slapo_sched_parse_file(schedule, &log);
  if (s == SLAPO_OK) s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &idx);
  if (s == SLAPO_OK) s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &tgt);
  if (s == SLAPO_OK) {
    int32_t *a = slapo_tensor_data(idx), *b = slapo_tensor_data(tgt);
    for (int64_t i = 0; i < batch * seq; i++) {
      a[i] = (int32_t)(slapo_rng_uniform((uint64_t)seed, 11, 0, (uint64_t)i) * vm.cfg.vocab_size);
      b[i] = (int32_t)(slapo_rng_uniform((uint64_t)seed, 12, 0, (uint64_t)i) * vm.cfg.vocab_size);
    }
    printf("slapo verify: model=%s config=%s schedule=%s batch=%lld seq=%lld dropout=%g "
           "atol=%g rtol=%g%s\n",
           model, config, schedule, (long long)batch, (long long)seq, dropout, atol, rtol,
           bisect ? " bisect" : per_entry ? " (checked after every step)" : "");
    if (n_disabled) {
      printf("disabled steps:");
      for (size_t i = 0; i < n_disabled; i++) printf(" %zu", disabled[i]);
      printf("\n");
    }
    const slapo_tensor *in[2] = {idx, tgt};
    slapo_verify_opts vo = {2, in, (uint64_t)seed, 1, atol, rtol, disabled, n_disabled,
                            per_entry, bisect};
    s = slapo_verify(build_model, &vm, log, &vo, on_check, NULL, &first_bad);
    if (s == SLAPO_OK) printf("verify: ok\n");
  }
  slapo_tensor_free(idx);
  slapo_tensor_free(tgt);
  slapo_sched_log_free(log);
  free(disabled);
  return s == SLAPO_OK ? 0 : fail(s);
}

/* ---- primitives, help ---- */

static int cmd_primitives(void) {
  for (int i = 0; i < slapo_primitive_count(); i++) {
    const slapo_primitive *p = slapo_primitive_at(i);
    printf("%-12s %s%s\n", p->name, p->summary, p->bitwise ? " (bitwise)" : "");
  }
  if (slapo_models_init() == SLAPO_OK && slapo_module_registered_count() > 0) {
    printf("\nreplacement modules:\n");
    for (int i = 0; i < slapo_module_registered_count(); i++)
      printf("%-16s %s\n", slapo_module_registered_name(i), slapo_module_registered_summary(i));
  }
  return 0;
}

static int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    top_usage(stdout);
    return 0;
  }
  const slapo_primitive *p = slapo_primitive_find(argv[1]);
  if (!p) {
    fprintf(stderr, "slapo: not_found: no primitive '%s' (run 'slapo primitives')\n", argv[1]);
    return 1;
  }
  printf("%s - %s\n\n%s", p->name, p->summary, p->doc);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    top_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  /* Checked before any kernel runs: an unreadable cap would otherwise mean
   * the baseline kernels without a word. */
  if (slapo_isa_check_env() != SLAPO_OK) return fail(SLAPO_INVALID_ARG);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("slapo %s\n", SLAPO_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help")) return cmd_help(argc - 1, argv + 1);
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    top_usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "primitives")) return cmd_primitives();
  if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
  if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "show")) return cmd_show(argc - 1, argv + 1);
  fprintf(stderr, "slapo: usage: unknown command '%s'\n", cmd);
  top_usage(stderr);
  return 2;
}
