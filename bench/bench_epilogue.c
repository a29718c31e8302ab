/* bench/bench_epilogue.c - GEMM and convolution epilogues through `fuse`:
 * the original system's recipe y = relu(conv(x)) + 1 (and its Linear twin,
 * an MLP-sized y = relu(x w^T + b) + 1), one training step (forward and
 * backward, loss mean((y - t)^2)) of the model unfused and fused with each
 * backend: none (the ops re-emitted), cc (the oneDNN op on its own, relu
 * and + 1 in one generated kernel), dnnl (one oneDNN matmul with post-ops;
 * Linear only) and auto. The variants are stepped in turn, RUNS rounds, and
 * each line gives the median step time and its ratio to unfused.
 * OMP_NUM_THREADS sets the threads (default: all processors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/models.h"
#include "slapo/primitives.h"
#include "bench_machine.h"

#define RUNS 9

#define CHECK(expr) BENCH_CHECK("bench_epilogue", expr)

static slapo_node *chain_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  slapo_node *y = slapo_add_scalar(ctx, slapo_relu(ctx, slapo_call1(ctx, self, "head", in[0])), 1.0);
  if (n_in == 1) return y;
  slapo_node *d = slapo_sub(ctx, y, in[1]);
  int64_t axes[4] = {0, 1, 2, 3};
  return slapo_mean(ctx, slapo_mul(ctx, d, d), d->ndim, axes, false);
}

static const slapo_module_type k_chain = {"Chain", chain_forward, NULL, NULL, NULL};

typedef struct problem {
  const char *name;
  bool conv;
  int64_t x[4], y[4]; /* input and output shapes */
  int64_t in, out;    /* channels (conv) or features (linear) */
} problem;

static slapo_module *chain_new(const problem *pb) {
  slapo_module *m, *head;
  CHECK(slapo_module_new(&k_chain, NULL, &m));
  if (pb->conv) {
    slapo_conv2d_opts o = SLAPO_CONV2D_OPTS_DEFAULT;
    o.padding[0] = o.padding[1] = 1;
    CHECK(slapo_conv2d_new(pb->in, pb->out, 3, 3, &o, &head));
  } else {
    CHECK(slapo_linear_new(pb->in, pb->out, true, 0.02f, &head));
  }
  CHECK(slapo_module_add_child(m, "head", head));
  CHECK(slapo_module_materialize(m, 1));
  slapo_tensor *ex[2];
  CHECK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, pb->x, &ex[0]));
  CHECK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, pb->y, &ex[1]));
  CHECK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  slapo_tensor_free(ex[0]);
  slapo_tensor_free(ex[1]);
  return m;
}

/* A model of pb, fused with `compiler` (NULL: unfused); NULL when the
 * backend refuses the region (reported). */
static slapo_module *variant(const problem *pb, const char *compiler, slapo_sched **root) {
  slapo_module *m = chain_new(pb);
  CHECK(slapo_sched_create(m, root));
  if (!compiler) return m;
  CHECK(slapo_trace(*root, NULL));
  slapo_pattern *p;
  CHECK(slapo_pattern_parse(pb->conv ? "add(relu(conv2d(x, w, b)), 1)"
                                     : "add(relu(linear(x, w, b)), 1)",
                            &p));
  slapo_status s = slapo_fuse(*root, p, compiler, "Epi", NULL, false);
  slapo_pattern_free(p);
  if (s != SLAPO_OK) {
    printf("  %-6s refused: %s\n", compiler, slapo_last_error());
    slapo_sched_free(*root);
    slapo_module_free(m);
    return NULL;
  }
  return m;
}

static void bench(const problem *pb) {
  const char *names[5] = {"unfused", "none", "cc", "dnnl", "auto"};
  const char *compilers[5] = {NULL, "none", "cc", "dnnl", "auto"};
  slapo_module *m[5];
  slapo_sched *root[5];
  slapo_runner *r[5];
  slapo_tensor *in[2];
  in[0] = bench_filled("bench_epilogue", 4, pb->x, 1);
  in[1] = bench_filled("bench_epilogue", 4, pb->y, 2);
  printf("%s: x [%lld, %lld, %lld, %lld] -> y [%lld, %lld, %lld, %lld]\n", pb->name,
         (long long)pb->x[0], (long long)pb->x[1], (long long)pb->x[2], (long long)pb->x[3],
         (long long)pb->y[0], (long long)pb->y[1], (long long)pb->y[2], (long long)pb->y[3]);
  slapo_kernel_env env = {.seed = 1, .training = true};
  for (int v = 0; v < 5; v++) {
    r[v] = NULL;
    if (!(m[v] = variant(pb, compilers[v], &root[v]))) continue;
    slapo_plan_opts po = {.timing = getenv("BENCH_TIMING") != NULL};
    CHECK(slapo_runner_new(m[v], &po, &r[v]));
    for (int w = 0; w < 2; w++)
      CHECK(slapo_step(r[v], 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, NULL));
  }
  double t[5][RUNS];
  for (int k = 0; k < RUNS; k++)
    for (int v = 0; v < 5; v++) {
      if (!r[v]) continue;
      slapo_module_zero_grad(m[v]);
      double t0 = bench_now_s();
      CHECK(slapo_step(r[v], 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, NULL));
      t[v][k] = bench_now_s() - t0;
    }
  if (getenv("BENCH_TIMING"))
    for (int v = 0; v < 5; v++) {
      if (!r[v]) continue;
      printf("-- %s\n", names[v]);
      slapo_plan_print_timing(slapo_runner_plan(r[v]), stdout);
      for (const slapo_node *n = slapo_graph_first(slapo_runner_graph(r[v])); n; n = n->next)
        if (n->kind == SLAPO_NODE_CALL_OP)
          printf("   %8.3f ms  %s\n", slapo_plan_node_ms(slapo_runner_plan(r[v]), n), n->target);
    }
  double base = bench_median(t[0], RUNS);
  for (int v = 0; v < 5; v++) {
    if (!r[v]) continue;
    double med = v ? bench_median(t[v], RUNS) : base;
    printf("  %-8s step %8.2f ms  %5.2fx unfused\n", names[v], med * 1e3, base / med);
    slapo_runner_free(r[v]);
    slapo_sched_free(root[v]);
    slapo_module_free(m[v]);
  }
  slapo_tensor_free(in[0]);
  slapo_tensor_free(in[1]);
}

int main(void) {
  bench_print_machine(stdout, "bench_epilogue");
  if (slapo_models_init() != SLAPO_OK) bench_die("bench_epilogue", "slapo_models_init");
  const problem pbs[2] = {
      {"conv3x3 64->64 + relu + 1", true, {8, 64, 56, 56}, {8, 64, 56, 56}, 64, 64},
      {"linear 768->3072 + relu + 1", false, {4, 1, 256, 768}, {4, 1, 256, 3072}, 768, 3072},
  };
  for (int i = 0; i < 2; i++) bench(&pbs[i]);
  return 0;
}
