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
          "  tokenizer train  learn a byte-level BPE tokenizer on text files\n"
          "  tokenizer encode show a tokenizer's ids and tokens for a text\n"
          "  tokenize   encode text files into an llm.c token file\n"
          "  primitives list the schedule primitives\n"
          "  help <primitive>  print a primitive's documentation\n"
          "  help <command>    print a command's options (as <command> --help)\n"
          "  help glob, help pattern  the syntax of module paths and text patterns\n"
          "  version    print the version\n"
          "  help       print this help\n"
          "\n"
          "Run 'slapo <command> --help' for the options of a command.\n");
}

static int cmd_version(int argc, char **argv) {
  int rc = cli_no_options(argc, argv,
                          "usage: slapo version (or slapo --version)\n\n"
                          "Prints the version.\n");
  if (rc >= 0) return rc;
  printf("slapo %s\n", SLAPO_VERSION);
  return 0;
}

/* Every command cli_top_usage lists, one table for dispatch and for
 * `help <command>`, so that no listed command lacks either. Each takes its
 * argv from the command name and prints its usage for --help. */
static const struct {
  const char *name;
  int (*fn)(int argc, char **argv);
} k_commands[] = {
    {"train", cmd_train},     {"show", cmd_show},
    {"verify", cmd_verify},   {"profile", cmd_profile},
    {"find", cmd_find},       {"models", cmd_models},
    {"plot", cmd_plot},       {"primitives", cmd_primitives},
    {"tokenizer", cmd_tokenizer}, {"tokenize", cmd_tokenize},
    {"version", cmd_version}, {"help", cmd_help},
};

static int (*command(const char *name))(int, char **) {
  for (size_t i = 0; i < sizeof k_commands / sizeof *k_commands; i++)
    if (!strcmp(name, k_commands[i].name)) return k_commands[i].fn;
  return NULL;
}

int main(int argc, char **argv) {
  /* Line-buffered even into a pipe or file, so that `2>&1 | tail` keeps an
   * error after the lines printed before it. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    cli_top_usage(stderr);
    return 2;
  }
  /* Checked before any kernel runs: an unreadable cap would otherwise mean
   * the baseline kernels without a word. */
  if (slapo_isa_check_env() != SLAPO_OK) return cli_fail(SLAPO_INVALID_ARG);
  /* The other spellings of two commands, as other CLIs take them. */
  static char version[] = "version", help_cmd[] = "help";
  if (!strcmp(argv[1], "--version")) argv[1] = version;
  else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) argv[1] = help_cmd;
  const char *cmd = argv[1];
  /* `help <command>` is `<command> --help`; other help topics are cmd_help's. */
  if (!strcmp(cmd, "help") && argc > 2 && command(argv[2])) {
    char help[] = "--help";
    char *args[] = {argv[2], help, NULL};
    return command(argv[2])(2, args);
  }
  int (*fn)(int, char **) = command(cmd);
  if (!fn) {
    fprintf(stderr, "slapo: usage: unknown command '%s'\n", cmd);
    cli_top_usage(stderr);
    return 2;
  }
  int rc = fn(argc - 1, argv + 1);
  slapo_dist_finalize(); /* MPI ends only where a command started it */
  return rc;
}
