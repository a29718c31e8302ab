/* cli/main.c - the `slapo` command: dispatches subcommands.
 * Layer: cli (the only layer that prints or exits). */
#include <stdio.h>
#include <string.h>

#include "slapo/core.h"

#define SLAPO_VERSION "0.1.0"

static int usage(FILE *f) {
  fprintf(f,
          "usage: slapo <command> [options]\n"
          "\n"
          "commands:\n"
          "  version    print the version\n"
          "  help       print this help\n");
  return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  const char *cmd = argv[1];
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    printf("slapo %s\n", SLAPO_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) return usage(stdout);
  fprintf(stderr, "slapo: usage: unknown command '%s'\n", cmd);
  return usage(stderr);
}
