/* cli/plot.c - `slapo plot METRICS.jsonl --output loss.svg`. Layer: cli. */
#include "cli/common.h"

int cmd_plot(int argc, char **argv) {
  static const struct option opts[] = {{"output", required_argument, 0, OPT_OUTPUT},
                                       {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *output = "loss.svg";
  int o;
  opterr = 0;
  while ((o = cli_getopt(argc, argv, opts)) != -1) {
    if (o == OPT_OUTPUT) {
      output = optarg;
    } else if (o == OPT_HELP) {
      printf("usage: slapo plot METRICS.jsonl [--output FILE]\n\n"
             "Draws a metrics file written by 'slapo train --metrics' as a self-contained SVG:\n"
             "loss and validation loss against step, tokens/s below.\n"
             "  --output FILE   the SVG to write [loss.svg]\n");
      return 0;
    } else {
      return cli_option_error("plot", opts, o, argv);
    }
  }
  if (optind + 1 != argc)
    return cli_usage_error("plot", "%s", optind >= argc ? "a metrics file is required"
                                                        : "give exactly one metrics file");
  slapo_status s = slapo_plot_metrics(argv[optind], output);
  if (s != SLAPO_OK) return cli_fail(s);
  printf("plot: wrote %s\n", output);
  return 0;
}
