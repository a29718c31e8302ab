/* bench/bench_ln_chain.c - the pre-LN transformer's bias + dropout +
 * residual + LayerNorm chain, s = x + dropout(h + b), y = layer_norm(s), as
 * a child module `chain` returning (y, s) (s, the residual stream, is read
 * on: a second result), trained one step at a time with loss mean(y t) +
 * mean(s t). Three forms of the chain, stepped in turn, RUNS rounds:
 *   four ops  the chain unfused (add, dropout, add, layer_norm);
 *   pair      today's default schedules: bias + dropout + residual as one
 *             cc kernel (FusedBiasDropoutResidual), the LayerNorm its own;
 *   fused     the whole chain one cc region (compiler/cc_rows.c).
 * Each line gives the median over rounds of the chain's own time, forward
 * and backward (the step's nodes that belong to `chain`, timed per node),
 * and its ratios. Before every step a 64 MiB buffer is written, so the
 * chain starts with cold caches, as between two blocks of the model.
 * Shapes and dropout: GPT-2 small's residual stream (C = 384, p = 0) at B4
 * T256, 124M's (C = 768, p = 0.1) at B4 T256 and B4 T1024. OMP_NUM_THREADS sets the threads (default: all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/models.h"
#include "slapo/primitives.h"
#include "bench_machine.h"

#define RUNS 9
#define FLUSH_BYTES (64u << 20)

#define CHECK(expr) BENCH_CHECK("bench_ln_chain", expr)

static slapo_node *chain_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  (void)n_in;
  slapo_node *d = slapo_call1(ctx, self, "drop", slapo_add(ctx, in[1], slapo_weight(ctx, self, "b")));
  slapo_node *s = slapo_add(ctx, in[0], d);
  slapo_node *ys[2] = {slapo_call1(ctx, self, "ln", s), s};
  return slapo_tuple(ctx, 2, ys);
}

static slapo_node *root_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                slapo_node *const *in) {
  (void)n_in;
  slapo_node *ys = slapo_call(ctx, self, "chain", 2, in);
  int64_t axes[3] = {0, 1, 2};
  slapo_node *a = slapo_mean(ctx, slapo_mul(ctx, slapo_getitem(ctx, ys, 0), in[2]), 3, axes, false);
  slapo_node *b = slapo_mean(ctx, slapo_mul(ctx, slapo_getitem(ctx, ys, 1), in[2]), 3, axes, false);
  return slapo_add(ctx, a, b);
}

static const slapo_module_type k_chain = {"Chain", chain_forward, NULL, NULL, NULL};
static const slapo_module_type k_root = {"Net", root_forward, NULL, NULL, NULL};

static double g_p; /* the dropout probability of the problem at hand */

static slapo_module *net_new(const int64_t *shape) {
  slapo_module *m, *c, *drop, *ln;
  CHECK(slapo_module_new(&k_root, NULL, &m));
  CHECK(slapo_module_new(&k_chain, NULL, &c));
  CHECK(slapo_module_add_param(c, "b", 1, &shape[2], SLAPO_INIT_NORMAL, 0.02f));
  CHECK(slapo_dropout_new(g_p, &drop));
  CHECK(slapo_module_add_child(c, "drop", drop));
  CHECK(slapo_layernorm_new(shape[2], 1e-5, &ln));
  CHECK(slapo_module_add_child(c, "ln", ln));
  CHECK(slapo_module_add_child(m, "chain", c));
  CHECK(slapo_module_materialize(m, 1));
  slapo_tensor *ex[3];
  for (int j = 0; j < 3; j++) CHECK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 3, shape, &ex[j]));
  CHECK(slapo_module_set_example(m, 3, (const slapo_tensor *const *)ex));
  for (int j = 0; j < 3; j++) slapo_tensor_free(ex[j]);
  return m;
}

/* The net with its chain fused by `pattern` (NULL: unfused). */
static slapo_module *variant(const int64_t *shape, const char *pattern, slapo_sched **root) {
  slapo_module *m = net_new(shape);
  CHECK(slapo_sched_create(m, root));
  if (!pattern) return m;
  slapo_sched *chain;
  CHECK(slapo_sched_at(*root, "chain", &chain));
  CHECK(slapo_trace(chain, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p;
  CHECK(slapo_pattern_parse(pattern, &p));
  CHECK(slapo_fuse(chain, p, "cc", "F", NULL, false));
  slapo_pattern_free(p);
  return m;
}

/* The time of the step's nodes that belong to the chain, forward and
 * backward (gradient nodes carry their forward node's module). */
static double chain_ms(slapo_runner *r) {
  double ms = 0;
  for (const slapo_node *n = slapo_graph_first(slapo_runner_graph(r)); n; n = n->next)
    if (n->kind == SLAPO_NODE_CALL_OP && n->origin && !strncmp(n->origin, "chain", 5))
      ms += slapo_plan_node_ms(slapo_runner_plan(r), n);
  return ms;
}

static void bench(const char *name, const int64_t *shape, double p, unsigned char *flush) {
  g_p = p;
  const char *names[3] = {"four ops", "pair", "fused"};
  const char *patterns[3] = {NULL, "add(x, dropout(add(y, b)))",
                             "layer_norm(add(x, dropout(add(y, b))), w, c)"};
  slapo_module *m[3];
  slapo_sched *root[3];
  slapo_runner *r[3];
  slapo_tensor *in[3];
  for (int j = 0; j < 3; j++) in[j] = bench_filled("bench_ln_chain", 3, shape, j + 1);
  printf("%s: [%lld, %lld, %lld], dropout p = %g\n", name, (long long)shape[0],
         (long long)shape[1], (long long)shape[2], p);
  slapo_kernel_env env = {.seed = 1, .training = true};
  slapo_plan_opts po = {.timing = true};
  for (int v = 0; v < 3; v++) {
    m[v] = variant(shape, patterns[v], &root[v]);
    CHECK(slapo_runner_new(m[v], &po, &r[v]));
    for (int w = 0; w < 2; w++)
      CHECK(slapo_step(r[v], 3, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, NULL));
  }
  double t[3][RUNS];
  for (int k = 0; k < RUNS; k++)
    for (int v = 0; v < 3; v++) {
      slapo_module_zero_grad(m[v]);
      memset(flush, k + v, FLUSH_BYTES);
      CHECK(slapo_step(r[v], 3, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, NULL));
      t[v][k] = chain_ms(r[v]);
    }
  if (getenv("BENCH_TIMING")) /* the last round's chain nodes */
    for (int v = 0; v < 3; v++) {
      printf("-- %s\n", names[v]);
      for (const slapo_node *n = slapo_graph_first(slapo_runner_graph(r[v])); n; n = n->next)
        if (n->kind == SLAPO_NODE_CALL_OP && n->origin && !strncmp(n->origin, "chain", 5))
          printf("   %8.3f ms  %s\n", slapo_plan_node_ms(slapo_runner_plan(r[v]), n), n->target);
    }
  double med[3];
  for (int v = 0; v < 3; v++) med[v] = bench_median(t[v], RUNS);
  for (int v = 0; v < 3; v++) {
    printf("  %-8s chain fwd+bwd %8.3f ms  %5.2fx four ops  %5.2fx pair\n", names[v], med[v],
           med[0] / med[v], med[1] / med[v]);
    slapo_runner_free(r[v]);
    slapo_sched_free(root[v]);
    slapo_module_free(m[v]);
  }
  for (int j = 0; j < 3; j++) slapo_tensor_free(in[j]);
}

int main(void) {
  bench_print_machine(stdout, "bench_ln_chain");
  if (slapo_models_init() != SLAPO_OK) bench_die("bench_ln_chain", "slapo_models_init");
  unsigned char *flush = malloc(FLUSH_BYTES);
  if (!flush) bench_die("bench_ln_chain", "malloc");
  const int64_t small[3] = {4, 256, 384}, m124[3] = {4, 256, 768}, m124_long[3] = {4, 1024, 768};
  bench("GPT-2 small (bytes) B4 T256", small, 0.0, flush);
  bench("GPT-2 124M B4 T256", m124, 0.1, flush);
  bench("GPT-2 124M B4 T1024", m124_long, 0.1, flush);
  free(flush);
  return 0;
}
