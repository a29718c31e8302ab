/* cli/main.c - the `slapo` command: subcommand dispatch. Each command lives
 * in its own file (train.c, show.c, verify.c, find.c, models.c, plot.c,
 * primitives.c); what they share is in common.c. The only layer that prints
 * or exits; exit codes 0 ok, 1 error, 2 usage. */
#include <string.h>

#include "cli/common.h"

#define SLAPO_VERSION "0.1.0"

void cli_top_usage(FILE *f) {
  fprintf(f,
          "usage: slapo <command> [options]\n"
          "\n"
          "slapo: a schedule language for progressive optimization of model training.\n"
          "\n"
          "commands:\n"
          "  train      train a model on a text or token file\n"
          "  show       print a model's module tree, a schedule's expanded steps, or\n"
          "             (--graph PATH) a traced module's graph\n"
          "  verify     prove a schedule keeps a model's outputs and gradients\n"
          "  profile    time a training step per module (forward, backward, memory)\n"
          "  find       list the matches of a pattern in a traced module's graph\n"
          "  models     list the model families and their configs\n"
          "  plot       draw a metrics file as an SVG loss plot\n"
          "  primitives list the schedule primitives\n"
          "  help <primitive>  print a primitive's documentation\n"
          "  help <command>    print a command's options (as <command> --help)\n"
          "  help glob, help pattern  the syntax of module paths and text patterns\n"
          "  version    print the version\n"
          "  help       print this help\n"
          "\n"
          "Run 'slapo <command> --help' for the options of a command.\n");
}

static int run(const char *cmd, int argc, char **argv);

static bool is_command(const char *s) {
  static const char *const k_cmds[] = {"train", "show",   "verify", "profile",
                                       "find",  "models", "plot"};
  for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
    if (!strcmp(s, k_cmds[i])) return true;
  return false;
}

int main(int argc, char **argv) {
  /* Line-buffered even into a pipe or file, so that `2>&1 | tail` keeps an
   * error after the lines printed before it. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    cli_top_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  /* Checked before any kernel runs: an unreadable cap would otherwise mean
   * the baseline kernels without a word. */
  if (slapo_isa_check_env() != SLAPO_OK) return cli_fail(SLAPO_INVALID_ARG);
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("slapo %s\n", SLAPO_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help") && argc > 2 && is_command(argv[2])) {
    char help[] = "--help";
    char *args[] = {argv[0], argv[2], help, NULL};
    return run(argv[2], 3, args);
  }
  if (!strcmp(cmd, "help")) return cmd_help(argc - 1, argv + 1);
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    cli_top_usage(stdout);
    return 0;
  }
  int rc = run(cmd, argc, argv);
  slapo_dist_finalize(); /* MPI ends only where a command started it */
  return rc;
}

/* The commands that may start MPI (through cli_model_finish). */
static int run(const char *cmd, int argc, char **argv) {
  if (!strcmp(cmd, "primitives")) return cmd_primitives();
  if (!strcmp(cmd, "models")) return cmd_models(argc - 1, argv + 1);
  if (!strcmp(cmd, "plot")) return cmd_plot(argc - 1, argv + 1);
  if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
  if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
  if (!strcmp(cmd, "show")) return cmd_show(argc - 1, argv + 1);
  if (!strcmp(cmd, "find")) return cmd_find(argc - 1, argv + 1);
  if (!strcmp(cmd, "profile")) return cmd_profile(argc - 1, argv + 1);
  fprintf(stderr, "slapo: usage: unknown command '%s'\n", cmd);
  cli_top_usage(stderr);
  return 2;
}
