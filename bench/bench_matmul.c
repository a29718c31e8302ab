/* bench/bench_matmul.c - fp32 GEMM throughput through slapo (a planned
 * one-node graph re-run, so graph dispatch, the primitive cache lookup and
 * memory-object setup are included) against the bare oneDNN matmul
 * primitive on the same shapes, created once and executed directly.
 * Shapes: 1024^3, the GEMMs of GPT-2 124M at B*T = 1024 rows and some of
 * GPT-2 `small` (width 384). Prints GFLOP/s (2*M*N*K / median time of 7
 * samples, each >= 20 ms of repeated runs, the two sides alternating) and
 * slapo/bare: about 1 where slapo hands the problem to oneDNN as one
 * primitive, above 1 where it gives each thread its own share of C and a
 * single-thread primitive instead (the backward layouts, ops/gemm_dnnl.c).
 * OMP_NUM_THREADS defaults to the number of processors. */
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slapo/exec.h"
#include "slapo/ops.h"
#include "bench_machine.h"

#define RUNS 7

static void die(const char *what, int s) {
  fprintf(stderr, "bench_matmul: %s failed (%d): %s\n", what, s, slapo_last_error());
  exit(1);
}

#define CHECK(expr)                                                            \
  do {                                                                         \
    int s_ = (int)(expr);                                                      \
    if (s_ != 0) die(#expr, s_);                                               \
  } while (0)

static slapo_tensor *filled(int64_t rows, int64_t cols, unsigned seed) {
  return bench_filled("bench_matmul", 2, (int64_t[]){rows, cols}, seed);
}

/* slapo side: a planned one-node graph C = A @ op(B). */
typedef struct slapo_side {
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_plan *p;
} slapo_side;

static void slapo_side_init(slapo_side *s, slapo_tensor *a, slapo_tensor *b, int trans_a,
                            int trans_b) {
  CHECK(slapo_graph_new(&s->g));
  CHECK(slapo_ctx_new(s->g, &s->ctx));
  slapo_node *na = slapo_input(s->ctx, "a", SLAPO_DTYPE_F32, 2, a->shape);
  slapo_node *nb = slapo_input(s->ctx, "b", SLAPO_DTYPE_F32, 2, b->shape);
  slapo_node *y = slapo_matmul(s->ctx, na, nb, trans_a, trans_b);
  slapo_output(s->ctx, 1, &y);
  CHECK(slapo_ctx_status(s->ctx));
  CHECK(slapo_plan_new(s->g, NULL, &s->p));
  CHECK(slapo_plan_bind_input(s->p, "a", a));
  CHECK(slapo_plan_bind_input(s->p, "b", b));
}

static void slapo_side_run(slapo_side *s) { CHECK(slapo_plan_run(s->p, NULL)); }

static void slapo_side_free(slapo_side *s) {
  slapo_plan_free(s->p);
  slapo_ctx_free(s->ctx);
  slapo_graph_free(s->g);
}

/* Bare oneDNN side: the same GEMM as one matmul primitive with 2-D strided
 * descriptors (A / B read transposed when trans_a / trans_b), created once. */
typedef struct dnnl_side {
  dnnl_engine_t eng;
  dnnl_stream_t st;
  dnnl_primitive_t prim;
  dnnl_memory_t m[3];
  dnnl_exec_arg_t args[3];
} dnnl_side;

static void dnnl_side_init(dnnl_side *d, slapo_tensor *a, slapo_tensor *b, int trans_a,
                           int trans_b, slapo_tensor *c) {
  int64_t M = trans_a ? a->shape[1] : a->shape[0], K = trans_a ? a->shape[0] : a->shape[1];
  int64_t N = trans_b ? b->shape[0] : b->shape[1];
  CHECK(dnnl_engine_create(&d->eng, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&d->st, d->eng, dnnl_stream_default_flags));
  dnnl_memory_desc_t md[3];
  dnnl_dims_t ad = {M, K}, as = {trans_a ? 1 : K, trans_a ? M : 1};
  dnnl_dims_t bd = {K, N}, cd = {M, N}, cs = {N, 1};
  dnnl_dims_t bs = {trans_b ? 1 : N, trans_b ? K : 1};
  CHECK(dnnl_memory_desc_init_by_strides(&md[0], 2, ad, dnnl_f32, as));
  CHECK(dnnl_memory_desc_init_by_strides(&md[1], 2, bd, dnnl_f32, bs));
  CHECK(dnnl_memory_desc_init_by_strides(&md[2], 2, cd, dnnl_f32, cs));
  dnnl_matmul_desc_t mm;
  CHECK(dnnl_matmul_desc_init(&mm, &md[0], &md[1], NULL, &md[2]));
  dnnl_primitive_desc_t pd;
  CHECK(dnnl_primitive_desc_create(&pd, &mm, NULL, d->eng, NULL));
  CHECK(dnnl_primitive_create(&d->prim, pd));
  dnnl_primitive_desc_destroy(pd);
  void *h[3] = {slapo_tensor_data(a), slapo_tensor_data(b), slapo_tensor_data(c)};
  int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  for (int i = 0; i < 3; i++) {
    CHECK(dnnl_memory_create(&d->m[i], &md[i], d->eng, h[i]));
    d->args[i] = (dnnl_exec_arg_t){arg[i], d->m[i]};
  }
}

static void dnnl_side_run(dnnl_side *d) {
  CHECK(dnnl_primitive_execute(d->prim, d->st, 3, d->args));
  CHECK(dnnl_stream_wait(d->st));
}

static void dnnl_side_free(dnnl_side *d) {
  for (int i = 0; i < 3; i++) dnnl_memory_destroy(d->m[i]);
  dnnl_primitive_destroy(d->prim);
  dnnl_stream_destroy(d->st);
  dnnl_engine_destroy(d->eng);
}

int main(void) {
  if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads(omp_get_num_procs());
  bench_print_machine(stdout, "bench_matmul");
  struct {
    const char *name;
    int64_t M, K, N;
    int trans_a; /* A stored [K, M] (weight gradients x^T @ dy) */
    int trans_b; /* B stored [N, K], as a Linear weight [out, in] */
  } cases[] = {
      {"square 1024^3", 1024, 1024, 1024, 0, 0},
      {"gpt2 c_attn  x@W^T", 1024, 768, 2304, 0, 1},
      {"gpt2 attn.c_proj x@W^T", 1024, 768, 768, 0, 1},
      {"gpt2 mlp.c_fc x@W^T", 1024, 768, 3072, 0, 1},
      {"gpt2 mlp.c_fc x@W", 1024, 768, 3072, 0, 0},
      {"gpt2 mlp.c_proj x@W^T", 1024, 3072, 768, 0, 1},
      {"gpt2 c_fc dx=dy@W", 1024, 3072, 768, 0, 0},
      {"gpt2 c_fc dW=dy^T@x", 3072, 1024, 768, 1, 0},
      {"gpt2 lm_head x@E^T", 1024, 768, 50304, 0, 1},
      {"small 64x768x768", 64, 768, 768, 0, 0},
      {"`small` c_attn dx=dy@W", 1024, 1152, 384, 0, 0},
      {"`small` c_fc dW=dy^T@x", 1536, 1024, 384, 1, 0},
      {"`small` c_proj dW", 384, 1024, 1536, 1, 0},
  };
  printf("bench_matmul: fp32, %d threads, median of %d samples (each >= 20 ms of repeated "
         "runs, after a warm-up)\n",
         omp_get_max_threads(), RUNS);
  printf("%-22s %18s %12s %12s %8s %10s\n", "case", "M x K x N", "slapo GF/s", "dnnl GF/s",
         "ratio", "max|diff|");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t M = cases[i].M, K = cases[i].K, N = cases[i].N;
    int ta = cases[i].trans_a, tb = cases[i].trans_b;
    slapo_tensor *a = ta ? filled(K, M, 1) : filled(M, K, 1);
    slapo_tensor *b = tb ? filled(N, K, 2) : filled(K, N, 2), *c, *ys;
    CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, (int64_t[]){M, N}, &c));
    slapo_side ss;
    dnnl_side ds;
    slapo_side_init(&ss, a, b, ta, tb);
    dnnl_side_init(&ds, a, b, ta, tb, c);
    /* Warm-up (primitive creation, JIT, page faults), then enough
     * repetitions per sample for ~20 ms, the two sides alternating so that
     * both see the same machine load. */
    slapo_side_run(&ss);
    dnnl_side_run(&ds);
    double t0 = bench_now_s();
    dnnl_side_run(&ds);
    int reps = (int)(0.02 / (bench_now_s() - t0)) + 1;
    double ts[RUNS], td[RUNS];
    for (int r = 0; r < RUNS; r++) {
      t0 = bench_now_s();
      for (int k = 0; k < reps; k++) slapo_side_run(&ss);
      ts[r] = (bench_now_s() - t0) / reps;
      t0 = bench_now_s();
      for (int k = 0; k < reps; k++) dnnl_side_run(&ds);
      td[r] = (bench_now_s() - t0) / reps;
    }
    double tsm = bench_median(ts, RUNS), tdm = bench_median(td, RUNS);
    CHECK(slapo_tensor_contiguous(slapo_plan_output(ss.p, 0), &ys));
    slapo_side_free(&ss);
    dnnl_side_free(&ds);
    /* Same primitive kind on the same data: the results should agree. */
    const float *p = slapo_tensor_data(ys), *q = slapo_tensor_data(c);
    double md = 0;
    for (int64_t e = 0; e < M * N; e++) md = fmax(md, fabs((double)p[e] - (double)q[e]));
    double flop = 2.0 * (double)M * (double)N * (double)K;
    char dims[64];
    snprintf(dims, sizeof dims, "%lld%sx%lldx%lld%s", (long long)M, ta ? "^T" : "", (long long)K,
             (long long)N, tb ? "^T" : "");
    printf("%-22s %18s %12.1f %12.1f %8.3f %10.2g\n", cases[i].name, dims, flop / tsm * 1e-9,
           flop / tdm * 1e-9, tdm / tsm, md);
    slapo_tensor_free(a);
    slapo_tensor_free(b);
    slapo_tensor_free(c);
    slapo_tensor_free(ys);
  }
  printf("ratio = slapo GF/s / dnnl GF/s (1.000 = no dispatch overhead; above 1: slapo's "
         "own split between threads)\n");
  return 0;
}
