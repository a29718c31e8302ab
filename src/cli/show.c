/* cli/show.c - `slapo show`: a model's module tree with parameter counts
 * (built on meta tensors: nothing allocated), and with --schedule the
 * schedule's numbered steps, the applied log and the scheduled tree.
 * Layer: cli. */
#include <stdlib.h>

#include "cli/common.h"

static void show_usage(void) {
  printf("usage: slapo show [--model NAME] [--config NAME] [--schedule FILE [--disable LIST]]\n"
         "                  [--batch B] [--seq T]\n\n"
         "Prints the module tree with parameter counts and the memory training would need\n"
         "(weights, gradients, AdamW state, the planner's activation peaks; computed on\n"
         "meta tensors, nothing allocated). With --schedule, prints the schedule's\n"
         "expanded steps numbered from 1 with their file:line, applies them (skipping\n"
         "--disable'd numbers) and prints the scheduled tree and its log.\n");
  cli_model_usage(stdout, NULL);
  printf("  --batch B           sequences per micro-batch for the estimate [4]\n"
         "  --seq T             tokens per sequence (0: the context, at most 256) [0]\n");
}

/* What `slapo train` at this batch and sequence would need. */
static slapo_status print_memory(const cli_model_opts *mo, slapo_module *m, int64_t B, int64_t T) {
  slapo_model_dims d;
  SLAPO_TRY(mo->family->dims(mo->config, &d));
  if (T == 0) T = d.n_ctx < 256 ? d.n_ctx : 256;
  if (T > d.n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "show: --seq %lld exceeds the %s context of %lld",
                       (long long)T, mo->config, (long long)d.n_ctx);
  slapo_memory_estimate e;
  SLAPO_TRY(slapo_memory_estimate_train(m, B, T, d.n_ctx, &e));
  char line[512];
  slapo_memory_format(&e, line, sizeof line);
  printf("training memory (batch %lld x seq %lld, estimated): %s\n", (long long)B, (long long)T,
         line);
  return SLAPO_OK;
}

static void print_schedule(const cli_model_opts *mo, const slapo_schedule_run *run) {
  printf("schedule %s: %zu steps\n", mo->schedule, run->steps.n);
  slapo_sched_steps_print(&run->steps, stdout);
  if (mo->n_disabled) {
    printf("disabled:");
    for (size_t i = 0; i < mo->n_disabled; i++) printf(" %zu", mo->disabled[i]);
    printf("\n");
  }
}

static slapo_status show(const cli_model_opts *mo, int64_t B, int64_t T) {
  slapo_module *m = NULL;
  slapo_schedule_run run = {0};
  slapo_status s = mo->family->create(mo->config, -1, &m);
  if (s == SLAPO_OK && mo->schedule) {
    s = slapo_schedule_file_apply(m, mo->schedule, mo->disabled, mo->n_disabled, &run);
    if (run.steps.n) print_schedule(mo, &run);
    if (s == SLAPO_OK) {
      printf("\napplied (%zu disabled):\n", mo->n_disabled);
      slapo_sched_log_print(slapo_sched_log_of(run.tree), stdout);
      printf("\n");
    }
  }
  if (s == SLAPO_OK) {
    slapo_module_print(m, stdout);
    printf("total: %lld parameters\n", (long long)slapo_module_numel(m));
    s = print_memory(mo, m, B, T);
  }
  slapo_schedule_run_deinit(&run);
  slapo_module_free(m);
  return s;
}

int cmd_show(int argc, char **argv) {
  static const struct option opts[] = {CLI_MODEL_OPTIONS,
                                       {"batch", required_argument, 0, OPT_BATCH},
                                       {"seq", required_argument, 0, OPT_SEQ},
                                       {"help", no_argument, 0, OPT_HELP},
                                       {0, 0, 0, 0}};
  cli_model_opts mo = {0};
  int64_t B = 4, T = 0;
  int o, rc = -1;
  opterr = 0;
  while (rc < 0 && (o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    bool ok = true;
    if (o == OPT_HELP) show_usage(), rc = 0;
    else if (o == OPT_BATCH) ok = cli_parse_i64(optarg, &B) && B > 0;
    else if (o == OPT_SEQ) ok = cli_parse_i64(optarg, &T) && T >= 0;
    else ok = cli_model_option(&mo, o, optarg) == 1;
    if (!ok) rc = cli_option_error("show", opts, o, argv);
  }
  if (rc < 0 && optind < argc) rc = cli_usage_error("show", "unexpected argument '%s'", argv[optind]);
  if (rc < 0 && (rc = cli_model_finish(&mo, "show")) == 0) {
    slapo_status s = slapo_models_init();
    if (s == SLAPO_OK) s = show(&mo, B, T);
    rc = s == SLAPO_OK ? 0 : cli_fail(s);
  }
  cli_model_opts_deinit(&mo);
  return rc;
}
