/* cli/primitives.c - `slapo primitives` (every primitive and replacement
 * module with its summary) and `slapo help <primitive>`. Layer: cli. */
#include "cli/common.h"

int cmd_primitives(void) {
  for (int i = 0; i < slapo_primitive_count(); i++) {
    const slapo_primitive *p = slapo_primitive_at(i);
    printf("%-12s %s%s\n", p->name, p->summary, p->bitwise ? " (bitwise)" : "");
  }
  if (slapo_models_init() != SLAPO_OK) return 0;
  if (slapo_module_registered_count() > 0) {
    printf("\nreplacement modules (replace NAME):\n");
    for (int i = 0; i < slapo_module_registered_count(); i++)
      printf("%-16s %s\n", slapo_module_registered_name(i), slapo_module_registered_summary(i));
  }
  if (slapo_subgraph_registered_count() > 0) {
    printf("\nsubgraph modules (replace NAME pattern=P on a traced module):\n");
    for (int i = 0; i < slapo_subgraph_registered_count(); i++)
      printf("%-16s %s\n", slapo_subgraph_registered_name(i), slapo_subgraph_registered_summary(i));
  }
  printf("\npatterns (pattern=NAME; or a quoted text pattern, pattern=\"gelu(x)\"):\n");
  if (slapo_pattern_registered_count() == 0) printf("(none registered)\n");
  for (int i = 0; i < slapo_pattern_registered_count(); i++) {
    const slapo_pattern *p = slapo_pattern_registered_at(i);
    printf("%-16s ", slapo_pattern_name(p));
    slapo_pattern_print(p, stdout);
    printf("\n");
  }
  return 0;
}

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    cli_top_usage(stdout);
    return 0;
  }
  const slapo_primitive *p = slapo_primitive_find(argv[1]);
  if (!p) {
    fprintf(stderr,
            "slapo: not_found: no primitive or command '%s' (run 'slapo primitives' or "
            "'slapo help')\n",
            argv[1]);
    return 1;
  }
  printf("%s - %s\n\n%s", p->name, p->summary, p->doc);
  return 0;
}
