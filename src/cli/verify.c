/* cli/verify.c - `slapo verify`: the unscheduled and the scheduled model
 * from the same weights, compared after every schedule step (or bisected).
 * Layer: cli. */
#include <stdlib.h>

#include "cli/common.h"

typedef struct verify_args {
  cli_model_opts mo;
  int64_t batch, seq, seed;
  int64_t grad_accum; /* --pp: the micro-batches of the pipelined step */
  slapo_pp_schedule pp_schedule;
  double dropout, atol, rtol;
  bool bisect, per_entry;
} verify_args;

static slapo_status build_model(void *ud, slapo_module **out) {
  const verify_args *v = ud;
  return slapo_model_new(v->mo.family, v->mo.config, v->dropout, (uint64_t)v->seed, out);
}

static void on_check(const slapo_verify_check *c, const slapo_sched_steps *steps, void *ud) {
  (void)ud;
  const slapo_sched_step *st = NULL;
  for (size_t i = 0; i < steps->n; i++)
    if (steps->items[i].number == c->upto) st = &steps->items[i];
  if (c->upto) printf("steps 1-%zu", c->upto);
  else printf("no steps (the model against a copy of itself)");
  if (st)
    printf(" (last: %s:%d %s %s)", st->entry->file ? st->entry->file : "?", st->entry->line,
           st->path, st->entry->primitive);
  if (c->incomplete) printf(": not checked alone: %s\n", c->what);
  else if (c->bitwise) printf(": %s bitwise%s%s\n", c->ok ? "equal" : "NOT equal", c->ok ? "" : " at ",
                         c->ok ? "" : c->what);
  else printf(": %s, worst error %.3g of tolerance at %s\n", c->ok ? "within tolerance" : "FAILS",
              c->worst, c->what);
  fflush(stdout);
}

static void verify_usage(void) {
  printf("usage: slapo verify --schedule FILE [options]\n"
         "       mpirun -np K slapo verify --pp K [--schedule FILE] [options]\n\n"
         "Builds the unscheduled and the scheduled model from the same weights and seed,\n"
         "runs forward and backward on the same batch with dropout on, and compares the\n"
         "logits, the loss and every parameter gradient by path: bitwise where every\n"
         "applied primitive promises it, otherwise within atol + rtol |x|. Checks after\n"
         "every schedule step unless --final-only.\n\n");
  cli_model_usage(stdout, "tiny");
  cli_pp_usage(stdout);
  printf("                      with --pp, the pipelined step is checked against one\n"
         "                      process running the same schedule over the same\n"
         "                      micro-batches: the loss and untied gradients bitwise, tied\n"
         "                      ones within --atol\n"
         "  --grad-accum M      micro-batches of the pipelined step (--pp) [4]\n"
         "  --bisect            binary-search the first step that breaks equality\n"
         "  --final-only        check only the fully scheduled model\n"
         "  --batch B           [2]\n  --seq T             [32]\n  --seed S            [1337]\n"
         "  --dropout P         dropout during the check [0.1]\n"
         "  --atol X            [1e-05]\n  --rtol X            [0.0001]\n");
}

/* Random token ids for idx and targets of micro-batch `micro`, a function
 * of the seed. */
static slapo_status make_batch(const verify_args *v, int64_t vocab, int64_t micro,
                               slapo_tensor **idx, slapo_tensor **tgt) {
  int64_t shape[2] = {v->batch, v->seq};
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, idx));
  SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, tgt));
  int32_t *a = slapo_tensor_data(*idx), *b = slapo_tensor_data(*tgt); /* [B, T] */
  for (int64_t i = 0; i < v->batch * v->seq; i++) {
    uint64_t at = (uint64_t)(micro * v->batch * v->seq + i);
    a[i] = (int32_t)(slapo_rng_uniform((uint64_t)v->seed, 11, 0, at) * (float)vocab);
    b[i] = (int32_t)(slapo_rng_uniform((uint64_t)v->seed, 12, 0, at) * (float)vocab);
  }
  return SLAPO_OK;
}

static void print_start(const verify_args *v) {
  const cli_model_opts *mo = &v->mo;
  char pp[96] = "";
  if (mo->pp > 1)
    snprintf(pp, sizeof pp, " pp=%lld grad_accum=%lld pp_schedule=%s", (long long)mo->pp,
             (long long)v->grad_accum, cli_pp_schedule_arg(v->pp_schedule));
  printf("slapo verify: model=%s config=%s schedule=%s%s batch=%lld seq=%lld dropout=%g "
         "atol=%g rtol=%g%s%s\n",
         mo->model, mo->config, mo->schedule ? mo->schedule : "none",
         mo->precision ? " precision=bf16" : "", (long long)v->batch, (long long)v->seq, v->dropout,
         v->atol, v->rtol, pp,
         mo->pp > 1 ? "" : v->bisect ? " bisect" : v->per_entry ? " (checked after every step)" : "");
  if (slapo_dist_active()) {
    char layout[160];
    slapo_dist_describe(layout, sizeof layout);
    printf("distributed: %s (every rank also runs the %s)\n", layout,
           mo->pp > 1 ? "whole model in one process"
                      : "unsharded model; sharded gradients are gathered to full shape");
  }
  if (mo->precision) {
    char why[200];
    bool hw = slapo_bf16_gemm_native(why, sizeof why);
    printf("bf16 GEMMs: %s%s\n", hw ? "on bf16 hardware" : "widened to f32 here: ",
           hw ? "" : why);
  }
  if (mo->n_disabled) {
    printf("disabled steps:");
    for (size_t i = 0; i < mo->n_disabled; i++) printf(" %zu", mo->disabled[i]);
    printf("\n");
  }
}

/* The config's dimensions, with --seq checked against its context. */
static slapo_status model_dims(const verify_args *v, slapo_model_dims *dims) {
  SLAPO_TRY(v->mo.family->dims(v->mo.config, dims));
  if (v->seq > dims->n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "verify: --seq %lld exceeds the %s context of %lld",
                       (long long)v->seq, v->mo.config, (long long)dims->n_ctx);
  return SLAPO_OK;
}

static slapo_status verify(verify_args *v) {
  slapo_model_dims dims;
  SLAPO_TRY(model_dims(v, &dims));
  slapo_sched_log *log = NULL;
  slapo_tensor *idx = NULL, *tgt = NULL;
  size_t first_bad = 0;
  slapo_status s = slapo_models_init();
  if (s == SLAPO_OK) s = slapo_schedule_load(v->mo.schedule, v->mo.precision, &log);
  if (s == SLAPO_OK) s = make_batch(v, dims.vocab_size, 0, &idx, &tgt);
  if (s == SLAPO_OK) {
    print_start(v);
    if (slapo_sched_log_count(log) == 0)
      printf("note: %s has no schedule lines: there is nothing to verify\n", v->mo.schedule);
    const slapo_tensor *in[2] = {idx, tgt};
    slapo_verify_opts vo = {2, in, (uint64_t)v->seed, 1, v->atol, v->rtol, v->mo.disabled,
                            v->mo.n_disabled, v->per_entry, v->bisect};
    s = slapo_verify(build_model, v, log, &vo, on_check, NULL, &first_bad);
    if (s == SLAPO_OK) printf("verify: ok\n");
  }
  slapo_tensor_free(idx);
  slapo_tensor_free(tgt);
  slapo_sched_log_free(log);
  return s;
}

/* Builds the model from the seed and applies the schedule: the cut lines
 * mean nothing to one process. */
static slapo_status scheduled_model(const verify_args *v, slapo_module **out) {
  SLAPO_TRY(build_model((void *)v, out));
  if (!v->mo.schedule && !v->mo.precision) return SLAPO_OK;
  slapo_schedule_run run;
  slapo_status s = slapo_schedule_file_apply(*out, v->mo.schedule, v->mo.precision,
                                             v->mo.disabled, v->mo.n_disabled, &run);
  slapo_schedule_run_deinit(&run);
  return s;
}

/* --pp: the pipelined step against one process over grad_accum
 * micro-batches (slapo_pp_verify); the tied gradients within --atol. */
static slapo_status verify_pp(verify_args *v) {
  slapo_model_dims dims;
  SLAPO_TRY(model_dims(v, &dims));
  int m = (int)v->grad_accum;
  slapo_tensor **in = slapo_calloc(2 * (size_t)m, sizeof *in);
  slapo_kernel_env *envs = slapo_calloc((size_t)m, sizeof *envs);
  slapo_module *pp = NULL, *one = NULL;
  slapo_status s = in && envs ? slapo_models_init() : slapo_error(SLAPO_NOMEM, "out of memory");
  for (int i = 0; s == SLAPO_OK && i < m; i++) {
    s = make_batch(v, dims.vocab_size, i, &in[2 * i], &in[2 * i + 1]);
    envs[i] = (slapo_kernel_env){(uint64_t)v->seed, (uint64_t)i, true};
  }
  if (s == SLAPO_OK) s = scheduled_model(v, &pp);
  if (s == SLAPO_OK) s = scheduled_model(v, &one);
  slapo_pp_verify_report r;
  if (s == SLAPO_OK) print_start(v);
  if (s == SLAPO_OK && slapo_pp_stage_count(pp) == 1) { /* no cut lines: balanced */
    char lines[4096];
    double share;
    s = slapo_pp_auto_cut(pp, 2, (const slapo_tensor *const *)in, (int)v->mo.pp, lines,
                          sizeof lines, &share);
    if (s == SLAPO_OK)
      printf("pipeline: no cut lines in the schedule; %lld stages balanced by cost (the largest "
             "%.0f%% of the forward's):\n%s", (long long)v->mo.pp, 100 * share, lines);
  }
  if (s == SLAPO_OK) {
    s = slapo_pp_verify(pp, one, v->pp_schedule, m, (const slapo_tensor *const *)in, envs,
                        v->atol, &r);
  }
  if (s == SLAPO_OK)
    printf("pipeline: %lld stages (%s, %d micro-batches) against one process running "
           "--grad-accum %d: loss equal bitwise (%.8g); %d gradients equal bitwise, %d tied "
           "within %g (worst %.3g)\nverify: ok\n", (long long)v->mo.pp,
           slapo_pp_schedule_name(v->pp_schedule), m, m, r.loss, r.n_bitwise,
           r.n_tied, v->atol, r.tied_worst);
  for (int i = 0; in && i < 2 * m; i++) slapo_tensor_free(in[i]);
  slapo_free(in);
  slapo_free(envs);
  slapo_module_free(pp);
  slapo_module_free(one);
  return s;
}

/* One verify option into v: false for a bad value. */
static bool verify_option(verify_args *v, int o, const char *a) {
  switch (o) {
  case OPT_BISECT: v->bisect = true; return true;
  case OPT_PER_ENTRY: v->per_entry = false; return true;
  case OPT_BATCH: return cli_parse_i64(a, &v->batch) && v->batch > 0;
  case OPT_ACCUM:
    return cli_parse_i64(a, &v->grad_accum) && v->grad_accum > 0 && v->grad_accum <= 4096;
  case OPT_PP_SCHEDULE: return cli_parse_pp_schedule(a, &v->pp_schedule);
  case OPT_SEQ: return cli_parse_i64(a, &v->seq) && v->seq > 0;
  case OPT_SEED: return cli_parse_i64(a, &v->seed) && v->seed >= 0;
  case OPT_DROPOUT: return cli_parse_f(a, &v->dropout) && v->dropout >= 0 && v->dropout < 1;
  case OPT_ATOL: return cli_parse_f(a, &v->atol) && v->atol > 0;
  case OPT_RTOL: return cli_parse_f(a, &v->rtol) && v->rtol > 0;
  default: return false;
  }
}

/* What every rank must share beyond the model options: every option of
 * verify decides the batch, the checks made (and so the collectives of
 * each) or their verdicts. */
static void verify_fields(cli_fields *a, const void *ud) {
  const verify_args *v = ud;
  cli_fields_i64(a, "--batch", v->batch);
  cli_fields_i64(a, "--seq", v->seq);
  cli_fields_i64(a, "--seed", v->seed);
  cli_fields_f64(a, "--dropout", v->dropout);
  cli_fields_f64(a, "--atol", v->atol);
  cli_fields_f64(a, "--rtol", v->rtol);
  cli_fields_i64(a, "--bisect", v->bisect);
  cli_fields_i64(a, "--final-only", !v->per_entry);
  cli_fields_i64(a, "--grad-accum", v->grad_accum);
  cli_fields_str(a, "--pp-schedule", cli_pp_schedule_arg(v->pp_schedule));
}

int cmd_verify(int argc, char **argv) {
  static const struct option opts[] = {
      CLI_MODEL_OPTIONS, CLI_PP_OPTIONS, {"grad-accum", required_argument, 0, OPT_ACCUM},
      {"bisect", no_argument, 0, OPT_BISECT}, {"final-only", no_argument, 0, OPT_PER_ENTRY},
      {"batch", required_argument, 0, OPT_BATCH}, {"seq", required_argument, 0, OPT_SEQ},
      {"seed", required_argument, 0, OPT_SEED}, {"dropout", required_argument, 0, OPT_DROPOUT},
      {"atol", required_argument, 0, OPT_ATOL}, {"rtol", required_argument, 0, OPT_RTOL},
      {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  verify_args v = {.mo = {.config = "tiny"}, .batch = 2, .seq = 32, .seed = 1337,
                   .dropout = 0.1, .atol = 1e-5, .rtol = 1e-4, .per_entry = true,
                   .grad_accum = 4};
  int o, rc = -1;
  opterr = 0;
  while (rc < 0 && (o = cli_getopt(argc, argv, opts)) != -1) {
    int taken = cli_model_option(&v.mo, o, optarg);
    if (o == OPT_HELP) verify_usage(), rc = 0;
    else if (taken < 0 || (!taken && !verify_option(&v, o, optarg)))
      rc = cli_option_error("verify", opts, o, argv);
  }
  if (rc < 0 && optind < argc) rc = cli_usage_error("verify", "unexpected argument '%s'", argv[optind]);
  if (rc < 0 && !v.mo.schedule && !v.mo.precision && v.mo.pp <= 1)
    rc = cli_usage_error("verify", "%s", "--schedule FILE (or --precision bf16) is required");
  if (rc < 0 && v.bisect && v.mo.pp > 1)
    rc = cli_usage_error("verify", "%s", "--bisect checks prefixes of a schedule in one "
                         "process; --pp checks the whole schedule's pipeline: give one of them");
  if (rc < 0 && v.bisect && !v.per_entry)
    rc = cli_usage_error("verify", "%s",
                         "--bisect checks prefixes of the schedule; --final-only checks only the "
                         "whole: give one of them");
  if (rc < 0 && (rc = cli_model_resolve(&v.mo, "verify")) == 0 &&
      (rc = cli_model_start(&v.mo, "verify", verify_fields, &v)) == 0) {
    if (!v.mo.schedule && !v.mo.precision && v.mo.pp <= 1) { /* resolved from 'none' or '' */
      rc = cli_usage_error("verify", "%s",
                           "--schedule none leaves nothing to verify; give a "
                           ".sched file or 'default'");
    } else {
      slapo_status s = v.mo.pp > 1 ? verify_pp(&v) : verify(&v);
      /* --pp: a verdict or an argument every rank reached alike */
      bool together = v.mo.pp > 1 && (s == SLAPO_VERIFY || s == SLAPO_INVALID_ARG);
      rc = s == SLAPO_OK ? 0 : together ? cli_fail_together(s) : cli_fail(s);
    }
  }
  cli_model_opts_deinit(&v.mo);
  return rc;
}
