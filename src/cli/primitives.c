/* cli/primitives.c - `slapo primitives` (every primitive and replacement
 * module with its summary) and `slapo help <primitive>` (and the topics
 * glob and pattern). Layer: cli. */
#include <string.h>

#include "cli/common.h"

int cmd_primitives(int argc, char **argv) {
  int rc = cli_no_options(argc, argv,
                          "usage: slapo primitives\n\n"
                          "Lists the schedule primitives, the replacement and subgraph modules\n"
                          "and the registered patterns. 'slapo help <primitive>' prints a\n"
                          "primitive's documentation.\n");
  if (rc >= 0) return rc;
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

/* Syntax that every primitive's help refers to, for `slapo help glob` and
 * `slapo help pattern` (the grammars' sources: schedule/glob.c and
 * pattern/parse.c). */
static const char *const k_topics[][2] = {
    {"glob",
     "glob - module paths in .sched lines\n\n"
     "A path names a module from the model's root, segments joined by '.'\n"
     "(transformer.h.0.attn; '.' alone is the root). Within a segment:\n"
     "  *        any characters (transformer.h.*.mlp)\n"
     "  {a,b}    one of the alternatives (transformer.h.0.mlp.{c_fc,c_proj})\n"
     "  {0..5}   each integer in the range, inclusive (transformer.h.{0..2}.attn);\n"
     "           every index must match a module: {0..9} on 4 layers is an error\n"
     "           naming the indices that exist\n"
     "and pieces combine (c_{fc,proj}). A whole segment '**' stands\n"
     "for zero or more segments (transformer.**.c_fc).\n"
     "A line expands to one numbered step per matching module, in tree order\n"
     "(slapo show --schedule lists them; --disable takes the numbers). Every\n"
     "line is matched against the model before the schedule applies, so a\n"
     "module an earlier line creates (fuse's F_0) cannot be named, and a glob\n"
     "that matches nothing is an error naming the nearest existing path.\n"},
    {"pattern",
     "pattern - text patterns for find, fuse, checkpoint and replace pattern=\n\n"
     "A pattern is written in the function-call form of the graph it matches:\n"
     "  gelu(add(x, b))              ops by registry name (slapo show --graph\n"
     "                               prints a traced graph's names)\n"
     "  add(relu(x), 1)              a number is a literal (a constant, or the\n"
     "                               value of add_scalar / mul_scalar)\n"
     "  matmul(x, w, trans_b=1)      attributes that must be equal; absent ones\n"
     "                               match anything\n"
     "  gelu(mod('mlp.c_fc')(x))     a module call: a POSIX extended regex over\n"
     "                               its path (or last segment), then its inputs\n"
     "  let a = add(x, y); mul(a, a) a value used twice\n"
     "  (p, q)                       several results\n"
     "Any other name is a wildcard: it matches any value, and the same name\n"
     "the same value. A call matches an op with those inputs in order (either\n"
     "order for commutative ops such as add and mul), or a module whose op form\n"
     "it is (linear(x, w, b) matches a Linear, w bound to its weight). In a\n"
     ".sched line a pattern is a double-quoted value (pattern=\"gelu(add(x, b))\");\n"
     "a bare word names a registered pattern. slapo find lists matches, and\n"
     "SLAPO_DEBUG=3 says why a near miss failed.\n"},
};

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    cli_top_usage(stdout);
    return 0;
  }
  /* `slapo help help` arrives here as `help --help` (main.c). */
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs("usage: slapo help [<command> | <primitive> | glob | pattern]\n\n"
          "Without an argument, lists the commands. With a command, prints its options (as\n"
          "'slapo <command> --help'); with a primitive, its documentation ('slapo primitives'\n"
          "lists them); 'glob' and 'pattern' give the syntax of module paths and text\n"
          "patterns in .sched files.\n",
          stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof k_topics / sizeof *k_topics; i++)
    if (!strcmp(argv[1], k_topics[i][0])) {
      fputs(k_topics[i][1], stdout);
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
