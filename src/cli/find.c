/* cli/find.c - `slapo find`: the matches of a pattern (or of a module regex)
 * in the stored graph of a module the schedule traces, with the nodes'
 * module paths and the bound inputs' shapes. The model is built on meta
 * tensors (nothing allocated). Layer: cli. */
#include <string.h>

#include "cli/common.h"
#include "slapo/apply.h"

static void find_usage(void) {
  printf("usage: slapo find --schedule FILE (--pattern P | --regex RE) [model options] PATH\n\n"
         "Applies the schedule (which must trace PATH: 'PATH trace [flatten=true]') and\n"
         "lists the matches in PATH's stored graph: the graph nodes of each match with\n"
         "the module they belong to, and the values bound to the pattern's inputs with\n"
         "their shapes, then a count. Matches never overlap. The model is built on meta\n"
         "tensors, so nothing is allocated.\n\n"
         "P is a text pattern when it contains '(' (`gelu(linear(x, w, b))`,\n"
         "`add(relu(x), 1)`, `mod('c_.*')(x)`; quote it for the shell), otherwise the\n"
         "name of a registered pattern. --regex RE lists instead every call_module node\n"
         "whose target (path relative to PATH) or last segment the POSIX extended regex\n"
         "RE matches in full.\n\n"
         "With SLAPO_DEBUG=3 in the environment, every rejected candidate is logged\n"
         "with the reason it did not match.\n\n");
  cli_model_usage(stdout, NULL);
  printf("  --pattern P         a text pattern or a registered pattern's name\n"
         "  --regex RE          call_module nodes whose target matches RE\n");
}

static void print_summary(int n, const char *kind, const char *what, const char *path) {
  printf("%d match%s of %s'%s' in %s\n", n, n == 1 ? "" : "es", kind, what, *path ? path : ".");
}

/* The library's message speaks of .sched quoting; on the command line the
 * rule is the '(' (see find_usage). */
static slapo_status unknown_pattern(const char *name) {
  char known[512] = "";
  int n = slapo_pattern_registered_count();
  for (int i = 0; i < n; i++)
    slapo_list_append(known, sizeof known, slapo_pattern_name(slapo_pattern_registered_at(i)));
  return slapo_error(SLAPO_NOT_FOUND,
                     "--pattern '%s': no pattern is registered by that name (registered: %s); "
                     "a pattern containing '(' is read as text, e.g. --pattern 'gelu(x)'",
                     name, n ? known : "none");
}

static slapo_status find(const cli_model_opts *mo, const char *pattern, const char *regex,
                         const char *path) {
  slapo_module *m = NULL;
  slapo_schedule_run run = {0};
  const slapo_pattern *p = NULL;
  bool owned = false;
  slapo_matches ms = {0};
  slapo_sched *node = NULL;
  slapo_status s = mo->family->create(mo->config, NULL, &m);
  if (s == SLAPO_OK) {
    if (mo->schedule || mo->precision)
      s = slapo_schedule_file_apply(m, mo->schedule, mo->precision, mo->disabled, mo->n_disabled,
                                    &run);
    else s = slapo_sched_create(m, &run.tree);
  }
  /* Resolved after the schedule so a bad schedule is reported first. */
  if (s == SLAPO_OK && pattern) {
    bool text = strchr(pattern, '(') != NULL;
    s = slapo_pattern_resolve(pattern, text, &p, &owned);
    if (s == SLAPO_NOT_FOUND && !text) s = unknown_pattern(pattern);
  }
  if (s == SLAPO_OK) s = slapo_sched_at(run.tree, path, &node);
  if (s == SLAPO_OK) {
    if (p) {
      s = slapo_sched_find(node, p, &ms);
    } else {
      s = slapo_find_regex(slapo_sched_module(node), regex, &ms);
    }
  }
  if (s == SLAPO_OK) {
    if (p && !slapo_pattern_is_text(p)) {
      printf("pattern %s = ", pattern);
      slapo_pattern_print(p, stdout);
      printf("\n");
    }
    slapo_matches_print(&ms, p, stdout);
    if (p) print_summary(ms.n, "", pattern, path);
    else print_summary(ms.n, "regex ", regex, path);
  }
  slapo_matches_deinit(&ms);
  if (owned) slapo_pattern_free((slapo_pattern *)p);
  slapo_schedule_run_deinit(&run);
  slapo_module_free(m);
  return s;
}

int cmd_find(int argc, char **argv) {
  static const struct option opts[] = {CLI_MODEL_OPTIONS,
                                       {"pattern", required_argument, 0, OPT_PATTERN},
                                       {"regex", required_argument, 0, OPT_REGEX},
                                       {"help", no_argument, 0, OPT_HELP},
                                       {0, 0, 0, 0}};
  cli_model_opts mo = {0};
  const char *pattern = NULL, *regex = NULL;
  int o, rc = -1;
  opterr = 0;
  while (rc < 0 && (o = cli_getopt(argc, argv, opts)) != -1) {
    bool ok = true;
    if (o == OPT_HELP) find_usage(), rc = 0;
    else if (o == OPT_PATTERN) ok = *(pattern = optarg) != '\0';
    else if (o == OPT_REGEX) ok = *(regex = optarg) != '\0';
    else ok = cli_model_option(&mo, o, optarg) == 1;
    if (!ok) rc = cli_option_error("find", opts, o, argv);
  }
  if (rc < 0 && optind >= argc)
    rc = cli_usage_error("find", "%s", "a module PATH is required (e.g. transformer.h.0)");
  if (rc < 0 && optind + 1 < argc)
    rc = cli_usage_error("find", "unexpected argument '%s'", argv[optind + 1]);
  if (rc < 0 && !pattern == !regex)
    rc = cli_usage_error("find", "%s", "give one of --pattern P and --regex RE");
  if (rc < 0 && (rc = cli_model_finish(&mo, "find")) == 0) {
    slapo_status s = slapo_models_init();
    if (s == SLAPO_OK) s = find(&mo, pattern, regex, argv[optind]);
    rc = s == SLAPO_OK ? 0 : cli_fail(s);
  }
  cli_model_opts_deinit(&mo);
  return rc;
}
