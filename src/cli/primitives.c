/* cli/primitives.c - `slapo primitives` (every primitive and replacement
 * module with its summary) and `slapo help <primitive>`. Layer: cli. */
#include "cli/common.h"

int cmd_primitives(void) {
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

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    cli_top_usage(stdout);
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
