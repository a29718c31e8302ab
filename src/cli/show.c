/* cli/show.c - `slapo show`: a model's module tree with parameter counts
 * (built on meta tensors: nothing allocated), and with --schedule the
 * schedule's numbered steps, the applied log and the scheduled tree. With
 * --graph PATH, the stored graph of the traced module PATH instead (text, or
 * Graphviz DOT written atomically with --dot FILE). Layer: cli. */
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "slapo/apply.h"
#include "slapo/ir.h"

static void show_usage(void) {
  printf("usage: slapo show [--model NAME] [--config NAME] [--schedule FILE [--disable LIST]]\n"
         "                  [--batch B] [--seq T]\n"
         "       slapo show --graph PATH [--dot FILE] [model options]\n\n"
         "Prints the module tree with parameter counts and the memory training would need\n"
         "(weights, gradients, AdamW state, the planner's activation peaks; computed on\n"
         "meta tensors, nothing allocated). With --schedule, prints the schedule's\n"
         "expanded steps numbered from 1 with their file:line, applies them (skipping\n"
         "--disable'd numbers) and prints the scheduled tree and its log.\n\n"
         "With --graph PATH, applies the schedule and prints the stored graph of the\n"
         "module PATH, which the schedule traces ('PATH trace [flatten=true]'): a header\n"
         "naming the module, its type and the trace options, then one node a line with\n"
         "its module path and shape. With --dot FILE, writes that graph as Graphviz DOT\n"
         "instead (render it with 'dot -Tsvg FILE').\n");
  cli_model_usage(stdout, NULL);
  printf("  --batch B           sequences per micro-batch for the estimate [4]\n"
         "  --seq T             tokens per sequence (0: the context, at most 256) [0]\n"
         "  --optimizer-state D AdamW state dtype for the estimate: f32 or bf16 [f32]\n"
         "  --graph PATH        print the traced module PATH's graph (e.g. transformer.h.0)\n"
         "  --dot FILE          with --graph: write the graph as Graphviz DOT to FILE\n");
}

/* What `slapo train` at this batch and sequence would need. */
static slapo_status print_memory(const cli_model_opts *mo, slapo_module *m, int64_t B, int64_t T,
                                 bool state_bf16) {
  slapo_model_dims d;
  SLAPO_TRY(mo->family->dims(mo->config, &d));
  if (T == 0) T = d.n_ctx < 256 ? d.n_ctx : 256;
  if (T > d.n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "show: --seq %lld exceeds the %s context of %lld",
                       (long long)T, mo->config, (long long)d.n_ctx);
  slapo_memory_estimate e;
  /* Only a causal LM ends training with a sample (train/loop.c). */
  bool samples = mo->family->objective == SLAPO_OBJECTIVE_CAUSAL_LM;
  SLAPO_TRY(slapo_memory_estimate_train(m, B, T, samples ? d.n_ctx : 0, state_bf16, &e));
  char line[512];
  slapo_memory_format(&e, line, sizeof line);
  printf("training memory (batch %lld x seq %lld, estimated): %s\n", (long long)B, (long long)T,
         line);
  return SLAPO_OK;
}

static void print_schedule(const cli_model_opts *mo, const slapo_schedule_run *run) {
  printf("schedule %s%s%s: %zu step%s\n", mo->precision ? "--precision bf16" : "",
         mo->precision && mo->schedule ? " + " : "", mo->schedule ? mo->schedule : "",
         run->steps.n, run->steps.n == 1 ? "" : "s");
  slapo_sched_steps_print(&run->steps, stdout);
  if (mo->n_disabled) {
    printf("disabled:");
    for (size_t i = 0; i < mo->n_disabled; i++) printf(" %zu", mo->disabled[i]);
    printf("\n");
  }
}

static slapo_status write_dot(FILE *fp, const char *tmp_path, void *ud) {
  (void)tmp_path;
  slapo_graph_print_dot(ud, fp);
  return SLAPO_OK;
}

/* What each call_module node of g runs: the called module's type and
 * description (a fused child says which backend runs each result). */
static void print_calls(slapo_module *t, const slapo_graph *g) {
  bool first = true;
  for (const slapo_node *n = slapo_graph_first(g); n; n = n->next) {
    slapo_module *c = NULL;
    if (n->kind != SLAPO_NODE_CALL_MODULE || slapo_module_at(t, n->target, &c) != SLAPO_OK)
      continue;
    char desc[512] = "";
    if (c->type->describe) c->type->describe(c, desc, sizeof desc);
    printf("%s  %%%s: %s(%s)\n", first ? "calls:\n" : "", n->name, c->type->name, desc);
    first = false;
  }
}

/* The stored graph of the traced module `path` of m: a header line, then the
 * text form, or DOT written to `dot`. */
static slapo_status show_graph(slapo_module *m, const char *path, const char *dot) {
  slapo_module *t = NULL;
  SLAPO_TRY(slapo_module_at(m, path, &t));
  slapo_graph *g = slapo_module_graph(t);
  if (!g) {
    slapo_module *by = slapo_module_inlined_by(t);
    if (by) {
      char *bp = slapo_module_path(by);
      slapo_status s = slapo_error(SLAPO_PRECOND,
                                   "%s is not traced: it is inlined into the flattened trace of "
                                   "%s; show --graph %s",
                                   path, bp && *bp ? bp : ".", bp && *bp ? bp : ".");
      free(bp);
      return s;
    }
    bool list = !strcmp(t->type->name, "ModuleList"); /* traced through its items */
    return slapo_error(SLAPO_PRECOND, "%s is not traced; add '%s%s trace' to the schedule%s",
                       path, path, list ? ".*" : "",
                       list ? " (a ModuleList is traced through its items) and show one item" : "");
  }
  const slapo_trace_opts *o = slapo_module_trace_options(t);
  printf("graph of %s (%s), traced flatten=%s", *path ? path : ".", t->type->name,
         o && o->flatten ? "true" : "false");
  if (o && o->leaves) printf(" leaves=\"%s\"", o->leaves);
  printf(": %d nodes\n", slapo_graph_count(g));
  if (!dot) {
    slapo_graph_print(g, stdout);
    print_calls(t, g);
    return SLAPO_OK;
  }
  SLAPO_TRY(slapo_write_atomic(dot, "show --dot", write_dot, g));
  printf("show: wrote %s (Graphviz DOT; render with 'dot -Tsvg %s')\n", dot, dot);
  return SLAPO_OK;
}

static slapo_status show(const cli_model_opts *mo, int64_t B, int64_t T, bool state_bf16,
                         const char *graph,
                         const char *dot) {
  slapo_module *m = NULL;
  slapo_schedule_run run = {0};
  slapo_status s = mo->family->create(mo->config, NULL, &m);
  if (s == SLAPO_OK && graph) {
    if (mo->schedule || mo->precision)
      s = slapo_schedule_file_apply(m, mo->schedule, mo->precision, mo->disabled, mo->n_disabled,
                                    &run);
    if (s == SLAPO_OK) s = show_graph(m, graph, dot);
  } else if (s == SLAPO_OK && (mo->schedule || mo->precision)) {
    s = slapo_schedule_file_apply(m, mo->schedule, mo->precision, mo->disabled, mo->n_disabled,
                                  &run);
    if (run.steps.n) print_schedule(mo, &run);
    if (s == SLAPO_OK) {
      printf("\napplied (%zu disabled):\n", mo->n_disabled);
      slapo_sched_log_print(slapo_sched_log_of(run.tree), stdout);
      printf("\n");
    }
  }
  if (s == SLAPO_OK && !graph) {
    slapo_module_print(m, stdout);
    printf("total: %lld parameters\n", (long long)slapo_module_numel(m));
    s = print_memory(mo, m, B, T, state_bf16);
  }
  slapo_schedule_run_deinit(&run);
  slapo_module_free(m);
  return s;
}

int cmd_show(int argc, char **argv) {
  static const struct option opts[] = {CLI_MODEL_OPTIONS,
                                       {"batch", required_argument, 0, OPT_BATCH},
                                       {"seq", required_argument, 0, OPT_SEQ},
                                       {"graph", required_argument, 0, OPT_GRAPH},
                                       {"dot", required_argument, 0, OPT_DOT},
                                       {"optimizer-state", required_argument, 0, OPT_OPT_STATE},
                                       {"help", no_argument, 0, OPT_HELP},
                                       {0, 0, 0, 0}};
  cli_model_opts mo = {0};
  int64_t B = 4, T = 0;
  bool state_bf16 = false;
  const char *graph = NULL, *dot = NULL;
  int o, rc = -1;
  opterr = 0;
  while (rc < 0 && (o = cli_getopt(argc, argv, opts)) != -1) {
    bool ok = true;
    if (o == OPT_HELP) show_usage(), rc = 0;
    else if (o == OPT_BATCH) ok = cli_parse_i64(optarg, &B) && B > 0;
    else if (o == OPT_SEQ) ok = cli_parse_i64(optarg, &T) && T >= 0;
    else if (o == OPT_GRAPH) graph = optarg;
    else if (o == OPT_DOT) ok = *(dot = optarg) != '\0';
    else if (o == OPT_OPT_STATE) ok = cli_parse_precision(optarg, &state_bf16);
    else ok = cli_model_option(&mo, o, optarg) == 1;
    if (!ok) rc = cli_option_error("show", opts, o, argv);
  }
  if (rc < 0 && optind < argc) rc = cli_usage_error("show", "unexpected argument '%s'", argv[optind]);
  if (rc < 0 && dot && !graph) rc = cli_usage_error("show", "%s", "--dot needs --graph PATH");
  if (rc < 0 && (rc = cli_model_finish(&mo, "show")) == 0) {
    slapo_status s = slapo_models_init();
    if (s == SLAPO_OK) s = show(&mo, B, T, state_bf16, graph, dot);
    rc = s == SLAPO_OK ? 0 : cli_fail(s);
  }
  cli_model_opts_deinit(&mo);
  return rc;
}
