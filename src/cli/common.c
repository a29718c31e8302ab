/* cli/common.c - messages and exit codes, number and list parsing, and the
 * model options shared by train, show and verify. Layer: cli. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"

int cli_fail(slapo_status s) {
  if (!slapo_dist_active()) {
    fprintf(stderr, "slapo: %s: %s\n", slapo_status_name(s), slapo_last_error());
    return 1;
  }
  fprintf(stderr, "slapo: rank %d: %s: %s\n", slapo_dist_rank(SLAPO_GROUP_WORLD),
          slapo_status_name(s), slapo_last_error());
  fflush(stdout);
  fflush(stderr);
  slapo_dist_abort(1);
}

int cli_fail_together(slapo_status s) {
  if (!slapo_dist_active()) return cli_fail(s);
  fprintf(stderr, "slapo: rank %d: %s: %s\n", slapo_dist_rank(SLAPO_GROUP_WORLD),
          slapo_status_name(s), slapo_last_error());
  fflush(stderr);
  return 1;
}

int cli_getopt(int argc, char **argv, const struct option *opts) {
  int o = getopt_long(argc, argv, ":h", opts, NULL);
  return o == 'h' ? OPT_HELP : o;
}

int cli_usage_error(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "slapo: usage: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'slapo %s --help'.\n", cmd);
  return 2;
}

int cli_no_options(int argc, char **argv, const char *usage) {
  if (argc < 2) return -1;
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(usage, stdout);
    return 0;
  }
  return cli_usage_error(argv[0], "unexpected argument '%s'", argv[1]);
}

/* The long name of option `val` in `opts`. */
static const char *opt_name(const struct option *opts, int val) {
  for (; opts->name; opts++)
    if (opts->val == val) return opts->name;
  return "?";
}

/* What option `o` takes, for a bad value's message; one meaning per option
 * across the commands. NULL: the message says enough. */
static const char *expected(int o) {
  switch (o) {
  case OPT_STEPS: case OPT_BATCH: case OPT_ACCUM: case OPT_VAL_BATCHES:
    return "an integer >= 1";
  case OPT_SEQ: return "an integer >= 1 (train also takes 0: the config's context)";
  case OPT_WARMUP: case OPT_SEED: case OPT_VAL_EVERY: case OPT_SAVE_EVERY: case OPT_SAMPLE:
  case OPT_TOPK: case OPT_THREADS:
    return "an integer >= 0";
  case OPT_DEPTH: return "an integer from 0 to 64";
  case OPT_TP: case OPT_PP: return "an integer from 1 to 4096";
  case OPT_COMM_TIMEOUT: return "seconds > 0";
  case OPT_LR: case OPT_TEMP: case OPT_ATOL: case OPT_RTOL: return "a number > 0";
  case OPT_MIN_LR: case OPT_WD: case OPT_CLIP: return "a number >= 0";
  case OPT_DROPOUT: return "a probability in [0, 1)";
  case OPT_DISABLE: return "step numbers >= 1 without repeats, e.g. 2,5";
  case OPT_PRECISION: case OPT_OPT_STATE: return "f32 or bf16";
  case OPT_PP_SCHEDULE: return "1f1b or gpipe";
  default: return NULL;
  }
}

int cli_option_error(const char *cmd, const struct option *opts, int o, char **argv) {
  char buf[256];
  const char *want = expected(o);
  if (o == ':') snprintf(buf, sizeof buf, "option '--%s' needs a value", opt_name(opts, optopt));
  else if (o == '?') snprintf(buf, sizeof buf, "unknown option '%s'", argv[optind - 1]);
  else
    snprintf(buf, sizeof buf, "--%s: bad value '%s'%s%s", opt_name(opts, o), optarg,
             want ? "; expected " : "", want ? want : "");
  return cli_usage_error(cmd, "%s", buf);
}

bool cli_parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno == ERANGE) return false; /* never clamp silently */
  *out = v;
  return true;
}

bool cli_parse_f(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno == ERANGE || !isfinite(v)) return false;
  *out = v;
  return true;
}

void cli_fmt_duration(double s, char *buf, size_t cap) {
  if (s < 0 || s > 1e7) snprintf(buf, cap, "--");
  else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(buf, cap, "%.0fs", s);
}

static bool seen(const size_t *v, size_t n, size_t x) {
  for (size_t i = 0; i < n; i++)
    if (v[i] == x) return true;
  return false;
}

bool cli_parse_list(const char *s, size_t **out, size_t *n) {
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  size_t *v = malloc(cap * sizeof *v);
  if (!v) return false;
  size_t k = 0;
  for (const char *p = s; *p;) {
    char *end;
    long long x = strtoll(p, &end, 10);
    /* junk, < 1, a duplicate, or a trailing comma */
    if (end == p || x < 1 || (*end && *end != ',') || seen(v, k, (size_t)x) ||
        (*end == ',' && !end[1])) {
      free(v);
      return false;
    }
    v[k++] = (size_t)x;
    p = *end ? end + 1 : end;
  }
  free(*out);
  *out = v;
  *n = k;
  return k > 0;
}

int cli_model_option(cli_model_opts *m, int o, const char *arg) {
  switch (o) {
  case OPT_MODEL: m->model = arg; return 1;
  case OPT_CONFIG: m->config = arg; return 1;
  case OPT_SCHEDULE: m->schedule = arg; return 1;
  case OPT_DISABLE: return cli_parse_list(arg, &m->disabled, &m->n_disabled) ? 1 : -1;
  case OPT_TP: return cli_parse_i64(arg, &m->tp) && m->tp >= 1 && m->tp <= 4096 ? 1 : -1;
  case OPT_PP: return cli_parse_i64(arg, &m->pp) && m->pp >= 1 && m->pp <= 4096 ? 1 : -1;
  case OPT_COMM_TIMEOUT:
    return cli_parse_f(arg, &m->comm_timeout) && m->comm_timeout > 0 ? 1 : -1;
  case OPT_PRECISION: {
    bool bf16;
    if (!cli_parse_precision(arg, &bf16)) return -1;
    m->precision = bf16 ? "bf16" : NULL;
    return 1;
  }
  default: return 0;
  }
}

/* Where `--schedule default` looks: $SLAPO_SCHEDULE_DIR, else the
 * repository's schedules/ (compiled in). */
static const char *schedule_dir(void) {
  const char *d = getenv("SLAPO_SCHEDULE_DIR");
  return d && *d ? d : SLAPO_SCHEDULE_DIR;
}

bool cli_parse_precision(const char *s, bool *bf16) {
  *bf16 = !strcmp(s, "bf16");
  return *bf16 || !strcmp(s, "f32");
}

bool cli_parse_pp_schedule(const char *s, slapo_pp_schedule *out) {
  *out = strcmp(s, cli_pp_schedule_arg(SLAPO_PP_GPIPE)) ? SLAPO_PP_1F1B : SLAPO_PP_GPIPE;
  return !strcmp(s, cli_pp_schedule_arg(*out));
}

const char *cli_pp_schedule_arg(slapo_pp_schedule sched) {
  return sched == SLAPO_PP_GPIPE ? "gpipe" : "1f1b";
}

void cli_precision_for_speed(cli_model_opts *m, const char *cmd) {
  char why[200];
  if (!m->precision || slapo_bf16_gemm_native(why, sizeof why)) return;
  fprintf(stderr, "slapo %s: --precision bf16: %s; running in f32 instead (bf16 GEMMs would "
                  "be widened to f32 here, slower than f32)\n", cmd, why);
  m->precision = NULL;
}

int cli_schedule_resolve(const slapo_model_family *f, const char *name, const char *cmd, char *path,
                         size_t cap, const char **out) {
  *out = name;
  if (!*name || !strcmp(name, "none")) *out = NULL;
  if (strcmp(name, "default")) return 0;
  if (!f->default_schedule)
    return cli_usage_error(cmd, "model '%s' has no default schedule", f->name);
  snprintf(path, cap, "%s/%s", schedule_dir(), f->default_schedule);
  *out = path;
  return 0;
}

int cli_model_resolve(cli_model_opts *m, const char *cmd) {
  if (!m->model) m->model = slapo_model_at(0)->name;
  if (slapo_model_find(m->model, &m->family) != SLAPO_OK)
    return cli_usage_error(cmd, "%s", slapo_last_error());
  if (!m->config) m->config = m->family->default_config;
  slapo_model_dims d;
  if (m->family->dims(m->config, &d) != SLAPO_OK)
    return cli_usage_error(cmd, "%s", slapo_last_error());
  if (m->schedule) {
    int rc = cli_schedule_resolve(m->family, m->schedule, cmd, m->schedule_path,
                                  sizeof m->schedule_path, &m->schedule);
    if (rc) return rc;
  }
  if (m->n_disabled && !m->schedule)
    return cli_usage_error(cmd, "%s", "--disable needs --schedule");
  if (m->tp > 1 && m->pp > 1)
    return cli_usage_error(cmd, "%s", "--tp and --pp together (tensor-parallel stages) are not "
                           "built yet; give one of them (data parallelism combines with either)");
  return 0;
}

/* The model options every rank must share: the command, family, config,
 * the schedule's content (the file --schedule resolves to), --disable and
 * --tp and --pp (they decide how the world is split into groups). */
static void model_fields(cli_fields *a, const cli_model_opts *m, const char *cmd) {
  cli_fields_str(a, "command", cmd);
  cli_fields_str(a, "--model", m->model);
  cli_fields_str(a, "--config", m->config);
  cli_fields_file(a, "--schedule", m->schedule);
  cli_fields_str(a, "--precision", m->precision ? m->precision : "f32");
  char list[SLAPO_DIST_FIELD_SHOWN] = "(none)";
  size_t len = 0;
  for (size_t i = 0; i < m->n_disabled && len < sizeof list; i++) {
    int w = snprintf(list + len, sizeof list - len, "%s%zu", i ? "," : "", m->disabled[i]);
    if (w < 0) break;
    len += (size_t)w;
  }
  cli_fields_digest(a, "--disable", list,
                    slapo_hash64(m->disabled, m->n_disabled * sizeof *m->disabled, 0));
  cli_fields_i64(a, "--tp", m->tp ? m->tp : 1);
  cli_fields_i64(a, "--pp", m->pp ? m->pp : 1);
}

int cli_model_start(cli_model_opts *m, const char *cmd, cli_fields_fn extra, const void *ud) {
  /* Under mpirun the world checks its arguments before the groups are
   * formed from --tp and before any collective sized by the arguments. */
  /* The timeout first: the argument check is a collective too. */
  slapo_status s = m->comm_timeout > 0 ? slapo_dist_set_timeout(m->comm_timeout) : SLAPO_OK;
  if (s == SLAPO_OK) s = slapo_dist_start();
  if (s != SLAPO_OK) return cli_fail(s);
  if (slapo_dist_active()) {
    cli_fields *a = calloc(1, sizeof *a);
    if (!a) return cli_fail(slapo_error(SLAPO_NOMEM, "out of memory"));
    model_fields(a, m, cmd);
    if (extra) extra(a, ud);
    s = slapo_dist_agree(a->f, a->n);
    free(a);
    if (s == SLAPO_INVALID_ARG) return cli_fail_together(s);
    if (s != SLAPO_OK) return cli_fail(s);
  }
  s = slapo_dist_init_pp(m->tp ? (int)m->tp : 1, m->pp ? (int)m->pp : 1);
  /* A layout the world cannot make is the same on every rank. */
  if (s == SLAPO_INVALID_ARG) return cli_fail_together(s);
  if (s != SLAPO_OK) return cli_fail(s);
  /* Rank 0 alone reports; errors still reach stderr from any rank. */
  if (slapo_dist_rank(SLAPO_GROUP_WORLD) != 0 && !freopen("/dev/null", "w", stdout))
    return cli_fail(slapo_error(SLAPO_IO, "cannot silence stdout of rank %d",
                                slapo_dist_rank(SLAPO_GROUP_WORLD)));
  return 0;
}

int cli_model_finish(cli_model_opts *m, const char *cmd) {
  int rc = cli_model_resolve(m, cmd);
  return rc ? rc : cli_model_start(m, cmd, NULL, NULL);
}

void cli_model_opts_deinit(cli_model_opts *m) {
  free(m->disabled);
  m->disabled = NULL;
  m->n_disabled = 0;
}

void cli_model_usage(FILE *f, const char *default_config) {
  const slapo_model_family *first = slapo_model_at(0);
  fprintf(f, "  --model NAME        model family: ");
  for (int i = 0; i < slapo_model_count(); i++)
    fprintf(f, "%s%s", slapo_model_at(i)->name, i + 1 < slapo_model_count() ? ", " : "");
  fprintf(f, " [%s]\n", first->name);
  fprintf(f, "  --config NAME       the family's config (slapo models lists them) [%s]\n",
          default_config ? default_config : "the family's default");
  for (int i = 0; i < slapo_model_count(); i++) {
    const slapo_model_family *fam = slapo_model_at(i);
    fprintf(f, "                      %s: ", fam->name);
    for (const char *const *c = fam->configs; *c; c++) fprintf(f, "%s%s", *c, c[1] ? ", " : "\n");
  }
  fprintf(f, "  --schedule FILE     a .sched file applied to the model ('default': the\n"
             "                      family's default schedule, schedules/<family>.sched;\n"
             "                      'none' or '': no schedule)\n"
             "  --disable LIST      skip these schedule steps (numbers from 'slapo show\n"
             "                      --schedule', e.g. 2,5)\n"
             "  --precision P       f32, or bf16: the schedule starts with '. autocast\n"
             "                      dtype=bf16' (GEMMs with bf16 operands, f32 accumulation;\n"
             "                      needs a CPU with AVX512_BF16 or AMX-BF16 to be faster) [f32]\n"
             "  --tp K              tensor-parallel group size under mpirun -np N (N = K x\n"
             "                      data-parallel size) [1]\n"
             "  --comm-timeout S    under mpirun, end the job when a collective waits longer\n"
             "                      than S seconds (a lost link or a stopped rank); also\n"
             "                      $SLAPO_COMM_TIMEOUT [300]\n");
}

void cli_pp_usage(FILE *f) {
  fprintf(f, "  --pp K              pipeline stages under mpirun -np N (N = K x data-parallel\n"
             "                      size); the schedule's cut lines make the K stages (none:\n"
             "                      balanced by cost, the cut lines printed), run over the\n"
             "                      --grad-accum micro-batches [1]\n"
             "  --pp-schedule S     1f1b (at most K - s micro-batches in flight on stage s)\n"
             "                      or gpipe (every forward, then every backward) [1f1b]\n");
}
