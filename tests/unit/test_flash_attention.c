/* tests/unit/test_flash_attention.c - the fused "flash_attention" op and the
 * FlashAttention module: fast vs reference kernels vs the unfused composite
 * (matmul, scale, causal softmax, dropout, matmul) on [2, 3, 37, 16] (T
 * crosses the kernels' tile edges), outputs and gradients, with and without
 * dropout, train and eval; the planned peak memory of forward + backward at
 * T = 512 (fused far below unfused); FlashAttention swapped into a tiny GPT-2
 * with dropout 0.1 (same loss and gradients by parameter path); error cases
 * of the ops, the module factory and slapo_module_replace_child; grouped-query
 * heads and the additive key mask (a fully padded row included). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "common/gradcheck.h"
#include "slapo/autograd.h"
#include "slapo/models.h"

#define STREAM 123457 /* the dropout stream both formulations share */

static const int64_t k_shape[4] = {2, 3, 37, 16};

/* ---- helpers ---- */

static slapo_tensor *random_f32(int ndim, const int64_t *shape, uint64_t stream) {
  slapo_tensor *t;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, ndim, shape, &t));
  float *d = slapo_tensor_data(t); /* [numel] */
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++)
    d[i] = 2.0f * slapo_rng_uniform(5, stream, 0, (uint64_t)i) - 1.0f;
  return t;
}

/* Relative max-norm distance: max |a - b| / max |b|. */
static double rel_diff(const slapo_tensor *a, const slapo_tensor *b) {
  double d, m;
  assert_true(slapo_shape_equal(a->ndim, a->shape, b->ndim, b->shape));
  gc_max_diff(b, a, &d, &m);
  return m > 0 ? d / m : d;
}

typedef struct attn_case {
  bool flash;   /* fused op, or the composite */
  bool causal;
  double p;     /* dropout probability */
} attn_case;

/* Attention of q, k, v [shape] built either way, differentiated with
 * cotangent R: graph outputs y, dq, dk, dv. */
static slapo_graph *build_attention(const attn_case *c, const int64_t *shape) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  const char *names[3] = {"q", "k", "v"};
  slapo_node *in[3];
  for (int i = 0; i < 3; i++) in[i] = slapo_input(ctx, names[i], SLAPO_DTYPE_F32, 4, shape);
  slapo_node *R = slapo_input(ctx, "R", SLAPO_DTYPE_F32, 4, shape);
  double scale = 1.0 / sqrt((double)shape[3]);
  slapo_node *y;
  if (c->flash) {
    slapo_attr a[4] = {slapo_attr_int("causal", c->causal), slapo_attr_float("scale", scale),
                       slapo_attr_float("dropout_p", c->p), slapo_attr_int("stream", STREAM)};
    y = slapo_op_call(ctx, "flash_attention", 3, in, 4, a);
  } else {
    slapo_node *att = slapo_matmul(ctx, in[0], in[1], false, true); /* [B, NH, T, T] */
    att = slapo_softmax(ctx, slapo_mul_scalar(ctx, att, scale), c->causal);
    slapo_attr a[2] = {slapo_attr_float("p", c->p), slapo_attr_int("stream", STREAM)};
    att = slapo_op_call(ctx, "dropout", 1, &att, 2, a);
    y = slapo_matmul(ctx, att, in[2], false, false);
  }
  slapo_node *outs[4] = {y};
  OK(slapo_backward(ctx, y, R, 3, in, outs + 1));
  assert_non_null(slapo_output(ctx, 4, outs));
  OK(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

/* debug_alloc: every buffer starts as NaN, so a kernel that leaves an
 * output element unwritten (the fast ones write o, dq, dk, dv without
 * zeroing them first) fails the comparisons rather than reading a lucky
 * zero. */
static slapo_plan_opts run_opts(bool reference) {
  return (slapo_plan_opts){.reference = reference, .debug_alloc = true};
}

/* Plans g (reference or fast kernels), binds q, k, v, R and runs it; owned
 * contiguous copies of the 4 outputs go to outs. Returns the planned peak. */
static size_t run_attention(const slapo_graph *g, bool reference, slapo_tensor *const *vals,
                            const slapo_kernel_env *env, slapo_tensor **outs) {
  slapo_plan_opts o = run_opts(reference);
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  const char *names[4] = {"q", "k", "v", "R"};
  for (int i = 0; i < 4; i++) OK(slapo_plan_bind_input(p, names[i], vals[i]));
  OK(slapo_plan_run(p, env));
  assert_int_equal(slapo_plan_output_count(p), 4);
  for (int i = 0; i < 4; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &outs[i]));
  size_t peak = slapo_plan_peak_nbytes(p);
  slapo_plan_free(p);
  return peak;
}

static void free4(slapo_tensor **t) {
  for (int i = 0; i < 4; i++) slapo_tensor_free(t[i]);
}

/* ---- fused vs reference vs composite ---- */

static void check_shape(const int64_t *shape, bool causal, double p, bool training) {
  slapo_tensor *vals[4];
  for (int i = 0; i < 4; i++) vals[i] = random_f32(4, shape, 10 + (uint64_t)i);
  slapo_kernel_env env = {.seed = 99, .step = 3, .training = training};
  attn_case comp = {false, causal, p}, fused = {true, causal, p};
  slapo_graph *gc = build_attention(&comp, shape), *gf = build_attention(&fused, shape);
  slapo_tensor *base[4], *ref[4], *fast[4];
  run_attention(gc, true, vals, &env, base);
  run_attention(gf, true, vals, &env, ref);
  run_attention(gf, false, vals, &env, fast);
  const char *what[4] = {"y", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    double r = rel_diff(ref[i], base[i]), f = rel_diff(fast[i], base[i]),
           fr = rel_diff(fast[i], ref[i]);
    print_message("T=%lld HS=%lld causal=%d p=%.1f %s %-2s: |ref-composite| %.2e  "
                  "|fast-composite| %.2e  |fast-ref| %.2e\n",
                  (long long)shape[2], (long long)shape[3], causal, p,
                  training ? "train" : "eval ", what[i], r, f, fr);
    if (!(r <= 1e-5 && f <= 1e-5 && fr <= 1e-5))
      fail_msg("%s differs beyond 1e-5 relative (causal=%d p=%g training=%d)", what[i], causal,
               p, training);
  }
  /* Dropout really acts in training (the mask is not trivially all-ones). */
  if (training && p > 0) {
    attn_case nodrop = {true, causal, 0};
    slapo_graph *g0 = build_attention(&nodrop, shape);
    slapo_tensor *plain[4];
    run_attention(g0, false, vals, &env, plain);
    assert_true(rel_diff(plain[0], fast[0]) > 1e-2);
    free4(plain);
    slapo_graph_free(g0);
  }
  free4(base), free4(ref), free4(fast), free4(vals);
  slapo_graph_free(gc);
  slapo_graph_free(gf);
}

static void check_case(bool causal, double p, bool training) {
  check_shape(k_shape, causal, p, training);
}

/* ---- grouped-query heads and the additive key mask ---- */

/* q [2, 4, 37, 16] over k, v [2, 2, 37, 16] (groups of 2), keys masked with
 * Hugging Face's bias -3.4e38: batch row 0 has its last 5 keys padded, row 1
 * every key (a fully padded row must give uniform attention, as softmax
 * does). Composite: heads repeated (slapo_repeat_heads), mask broadcast-added
 * to the scaled scores. Graph outputs y, dq, dk, dv; inputs q, k, v, mask, R. */
static slapo_graph *build_grouped(bool flash, bool causal, double p, const int64_t *qs,
                                  const int64_t *kvs) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *in[4];
  in[0] = slapo_input(ctx, "q", SLAPO_DTYPE_F32, 4, qs);
  in[1] = slapo_input(ctx, "k", SLAPO_DTYPE_F32, 4, kvs);
  in[2] = slapo_input(ctx, "v", SLAPO_DTYPE_F32, 4, kvs);
  int64_t ms[2] = {qs[0], qs[2]};
  in[3] = slapo_input(ctx, "mask", SLAPO_DTYPE_F32, 2, ms);
  slapo_node *R = slapo_input(ctx, "R", SLAPO_DTYPE_F32, 4, qs);
  double scale = 1.0 / sqrt((double)qs[3]);
  slapo_node *y;
  if (flash) {
    slapo_attr a[4] = {slapo_attr_int("causal", causal), slapo_attr_float("scale", scale),
                       slapo_attr_float("dropout_p", p), slapo_attr_int("stream", STREAM)};
    y = slapo_op_call(ctx, "flash_attention", 4, in, 4, a);
  } else {
    int64_t G = qs[1] / kvs[1], m4[4] = {qs[0], 1, 1, qs[2]};
    slapo_node *k = slapo_repeat_heads(ctx, in[1], G), *v = slapo_repeat_heads(ctx, in[2], G);
    slapo_node *att = slapo_mul_scalar(ctx, slapo_matmul(ctx, in[0], k, false, true), scale);
    att = slapo_add(ctx, att, slapo_reshape(ctx, in[3], 4, m4));
    att = slapo_softmax(ctx, att, causal);
    slapo_attr a[2] = {slapo_attr_float("p", p), slapo_attr_int("stream", STREAM)};
    att = slapo_op_call(ctx, "dropout", 1, &att, 2, a);
    y = slapo_matmul(ctx, att, v, false, false);
  }
  slapo_node *outs[4] = {y};
  OK(slapo_backward(ctx, y, R, 3, in, outs + 1));
  assert_non_null(slapo_output(ctx, 4, outs));
  OK(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

static void run_grouped(const slapo_graph *g, bool reference, slapo_tensor *const *vals,
                        const slapo_kernel_env *env, slapo_tensor **outs) {
  slapo_plan_opts o = run_opts(reference);
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  const char *names[5] = {"q", "k", "v", "mask", "R"};
  for (int i = 0; i < 5; i++) OK(slapo_plan_bind_input(p, names[i], vals[i]));
  OK(slapo_plan_run(p, env));
  for (int i = 0; i < 4; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &outs[i]));
  slapo_plan_free(p);
}

static void check_grouped(bool causal, double p) {
  const int64_t qs[4] = {2, 4, 37, 16}, kvs[4] = {2, 2, 37, 16}, ms[2] = {2, 37};
  slapo_tensor *vals[5] = {random_f32(4, qs, 40), random_f32(4, kvs, 41), random_f32(4, kvs, 42),
                           NULL, random_f32(4, qs, 43)};
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ms, &vals[3]));
  float *mask = slapo_tensor_data(vals[3]); /* mask [2, 37] */
  for (int t = 0; t < 37; t++) mask[t] = t >= 32 ? -3.4028235e38f : 0.0f, mask[37 + t] = -3.4028235e38f;
  slapo_kernel_env env = {.seed = 7, .step = 1, .training = true};
  slapo_graph *gc = build_grouped(false, causal, p, qs, kvs);
  slapo_graph *gf = build_grouped(true, causal, p, qs, kvs);
  slapo_tensor *base[4], *ref[4], *fast[4];
  run_grouped(gc, true, vals, &env, base);
  run_grouped(gf, true, vals, &env, ref);
  run_grouped(gf, false, vals, &env, fast);
  const char *what[4] = {"y", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    double r = rel_diff(ref[i], base[i]), f = rel_diff(fast[i], base[i]);
    print_message("grouped causal=%d p=%.1f %-2s: |ref-composite| %.2e  |fast-composite| %.2e\n",
                  causal, p, what[i], r, f);
    if (!(r <= 1e-5 && f <= 1e-5)) fail_msg("%s differs beyond 1e-5 relative", what[i]);
  }
  /* Row 1 is fully padded: without dropout its output is the mean of v's
   * rows of its kv head, for every query. */
  if (p == 0 && !causal) {
    const float *y = slapo_tensor_data(fast[0]), *v = slapo_tensor_data(vals[2]);
    double want = 0;
    for (int s = 0; s < 37; s++) want += v[((1 * 2 + 0) * 37 + s) * 16];
    assert_float_equal(y[((1 * 4 + 1) * 37 + 5) * 16], want / 37, 1e-5);
  }
  free4(base), free4(ref), free4(fast);
  for (int i = 0; i < 5; i++) slapo_tensor_free(vals[i]);
  slapo_graph_free(gc);
  slapo_graph_free(gf);
}

/* flash_attention_qkv on heads packed in [B, T, W] against flash_attention
 * on the same heads split out (slices, reshape, permute and back): the same
 * kernels with other row strides, so bitwise the same y and d(qkv). 4 query
 * heads over 2 kv heads of 16, the mask of check_grouped, dropout 0.2. */
static slapo_graph *build_packed(bool packed) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t xs[3] = {2, 37, 128}, ms[2] = {2, 37}, os[3] = {2, 37, 64};
  slapo_node *qkv = slapo_input(ctx, "qkv", SLAPO_DTYPE_F32, 3, xs);
  slapo_node *mask = slapo_input(ctx, "mask", SLAPO_DTYPE_F32, 2, ms);
  slapo_node *R = slapo_input(ctx, "R", SLAPO_DTYPE_F32, 3, os);
  slapo_attr a[6] = {slapo_attr_int("causal", 1), slapo_attr_float("scale", 0.25),
                     slapo_attr_float("dropout_p", 0.2), slapo_attr_int("stream", STREAM),
                     slapo_attr_int("n_head", 4), slapo_attr_int("n_kv_head", 2)};
  slapo_node *y;
  if (packed) {
    slapo_node *in[2] = {qkv, mask};
    y = slapo_op_call(ctx, "flash_attention_qkv", 2, in, 6, a);
  } else {
    slapo_node *parts[3], *in[4];
    int64_t sizes[3] = {64, 32, 32}, heads[3] = {4, 2, 2}, perm[4] = {0, 2, 1, 3};
    OK(slapo_split(ctx, qkv, 2, 3, sizes, parts));
    for (int i = 0; i < 3; i++) {
      int64_t bthd[4] = {2, 37, heads[i], 16};
      in[i] = slapo_permute(ctx, slapo_reshape(ctx, parts[i], 4, bthd), 4, perm);
    }
    in[3] = mask;
    y = slapo_op_call(ctx, "flash_attention", 4, in, 4, a);
    y = slapo_reshape(ctx, slapo_permute(ctx, y, 4, perm), 3, os);
  }
  slapo_node *outs[2] = {y};
  OK(slapo_backward(ctx, y, R, 1, &qkv, outs + 1));
  assert_non_null(slapo_output(ctx, 2, outs));
  OK(slapo_ctx_status(ctx));
  slapo_ctx_free(ctx);
  return g;
}

static void run_packed(const slapo_graph *g, bool reference, slapo_tensor *const *vals,
                       slapo_tensor **outs) {
  slapo_plan_opts o = run_opts(reference);
  slapo_plan *p;
  OK(slapo_plan_new(g, &o, &p));
  const char *names[3] = {"qkv", "mask", "R"};
  for (int i = 0; i < 3; i++) OK(slapo_plan_bind_input(p, names[i], vals[i]));
  slapo_kernel_env env = {.seed = 3, .step = 4, .training = true};
  OK(slapo_plan_run(p, &env));
  for (int i = 0; i < 2; i++) OK(slapo_tensor_contiguous(slapo_plan_output(p, i), &outs[i]));
  slapo_plan_free(p);
}

static void test_packed_heads_same_as_split(void **state) {
  (void)state;
  int64_t xs[3] = {2, 37, 128}, ms[2] = {2, 37}, os[3] = {2, 37, 64};
  slapo_tensor *vals[3] = {random_f32(3, xs, 50), NULL, random_f32(3, os, 51)};
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, ms, &vals[1]));
  float *mask = slapo_tensor_data(vals[1]); /* mask [2, 37] */
  for (int t = 0; t < 37; t++) mask[t] = t % 5 == 4 ? -3.4028235e38f : 0.0f, mask[37 + t] = 0.0f;
  slapo_graph *gp = build_packed(true), *gs = build_packed(false);
  for (int reference = 0; reference < 2; reference++) {
    slapo_tensor *a[2], *b[2];
    run_packed(gp, reference, vals, a);
    run_packed(gs, reference, vals, b);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(slapo_tensor_numel(a[i]), slapo_tensor_numel(b[i]));
      if (memcmp(slapo_tensor_data(a[i]), slapo_tensor_data(b[i]), slapo_tensor_nbytes(a[i])))
        fail_msg("%s kernels: packed and split heads differ in %s (max rel %.3g)",
                 reference ? "reference" : "fast", i ? "d(qkv)" : "y", rel_diff(a[i], b[i]));
      slapo_tensor_free(a[i]), slapo_tensor_free(b[i]);
    }
  }
  for (int i = 0; i < 3; i++) slapo_tensor_free(vals[i]);
  slapo_graph_free(gp);
  slapo_graph_free(gs);
}

static void test_grouped_heads_masked(void **state) {
  (void)state;
  check_grouped(false, 0.0);
  check_grouped(true, 0.0);
  check_grouped(true, 0.2);
}

static void test_causal_no_dropout(void **state) {
  (void)state;
  check_case(true, 0.0, true);
}

static void test_causal_dropout_train(void **state) {
  (void)state;
  check_case(true, 0.2, true);
}

static void test_causal_dropout_eval(void **state) {
  (void)state;
  check_case(true, 0.2, false);
}

static void test_full_dropout_train(void **state) {
  (void)state;
  check_case(false, 0.2, true);
}

/* Shapes the kernels take other paths on: T % 4 == 0 (dropout factors a
 * whole tile at a time; 68 leaves a partial last tile), head sizes 64 and
 * 128 (vector accumulation at every level), 160 (q packed in chunks per key
 * tile; the scalar accumulation on AVX-512), T = 1056 > 1024 (the backward
 * recomputes the scores instead of keeping them between its passes). */
static const int64_t k_shapes[4][4] = {
    {1, 2, 68, 64}, {1, 1, 36, 128}, {1, 2, 40, 160}, {1, 1, 1056, 16}};

static void test_tile_paths(void **state) {
  (void)state;
  for (int i = 0; i < 4; i++) {
    check_shape(k_shapes[i], true, 0.2, true);
    check_shape(k_shapes[i], false, 0.2, true);
  }
  check_shape(k_shapes[0], true, 0.0, true);
}

/* Every ISA level the host runs gives the same bytes as the host's own, with
 * 1 and 2 threads (the same float operations in the same order), on each
 * tile path, causal with dropout and not. */
static void test_fast_kernels_isa_identical(void **state) {
  (void)state;
  const int64_t *shapes[5] = {k_shape, k_shapes[0], k_shapes[1], k_shapes[2], k_shapes[3]};
  int saved = omp_get_max_threads();
  for (int si = 0; si < 5; si++)
    for (int causal = 0; causal < 2; causal++) {
      slapo_tensor *vals[4];
      for (int i = 0; i < 4; i++) vals[i] = random_f32(4, shapes[si], 50 + (uint64_t)i);
      attn_case fused = {true, causal, 0.2};
      slapo_graph *g = build_attention(&fused, shapes[si]);
      slapo_kernel_env env = {.seed = 6, .step = 2, .training = true};
      slapo_tensor *want[4];
      run_attention(g, false, vals, &env, want);
      for (int lv = 0; lv <= (int)slapo_isa_host(); lv++)
        for (int th = 1; th <= 2; th++) {
          slapo_isa_set_max((slapo_isa)lv);
          omp_set_num_threads(th);
          slapo_tensor *got[4];
          run_attention(g, false, vals, &env, got);
          for (int i = 0; i < 4; i++)
            if (memcmp(slapo_tensor_data(got[i]), slapo_tensor_data(want[i]),
                       slapo_tensor_nbytes(want[i])))
              fail_msg("output %d of [%lld, %lld, %lld, %lld] causal=%d differs at %s with %d "
                       "threads",
                       i, (long long)shapes[si][0], (long long)shapes[si][1],
                       (long long)shapes[si][2], (long long)shapes[si][3], causal,
                       slapo_isa_name((slapo_isa)lv), th);
          free4(got);
        }
      slapo_isa_set_max(slapo_isa_host());
      omp_set_num_threads(saved);
      free4(want), free4(vals);
      slapo_graph_free(g);
    }
}

/* The fast kernels give the same bytes with 1 and 2 threads (each output
 * row is summed by one thread in a fixed order). */
static void test_fast_kernels_thread_count_independent(void **state) {
  (void)state;
  slapo_tensor *vals[4];
  for (int i = 0; i < 4; i++) vals[i] = random_f32(4, k_shape, 30 + (uint64_t)i);
  attn_case fused = {true, true, 0.2};
  slapo_graph *g = build_attention(&fused, k_shape);
  slapo_kernel_env env = {.seed = 4, .step = 1, .training = true};
  slapo_tensor *one[4], *two[4];
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run_attention(g, false, vals, &env, one);
  omp_set_num_threads(2);
  run_attention(g, false, vals, &env, two);
  omp_set_num_threads(saved);
  for (int i = 0; i < 4; i++)
    assert_memory_equal(slapo_tensor_data(one[i]), slapo_tensor_data(two[i]),
                        slapo_tensor_nbytes(one[i]));
  free4(one), free4(two), free4(vals);
  slapo_graph_free(g);
}

/* ---- memory ---- */

static void test_peak_memory_far_below_composite(void **state) {
  (void)state;
  int64_t shape[4] = {1, 2, 512, 16};
  slapo_tensor *vals[4];
  for (int i = 0; i < 4; i++) vals[i] = random_f32(4, shape, 20 + (uint64_t)i);
  attn_case comp = {false, true, 0.1}, fused = {true, true, 0.1};
  slapo_graph *gc = build_attention(&comp, shape), *gf = build_attention(&fused, shape);
  slapo_kernel_env env = {.seed = 1, .step = 0, .training = true};
  slapo_tensor *a[4], *b[4];
  size_t peak_c = run_attention(gc, false, vals, &env, a);
  size_t peak_f = run_attention(gf, false, vals, &env, b);
  print_message("planned peak, forward + backward, [1, 2, 512, 16]: composite %zu B, "
                "flash_attention %zu B (%.1fx less)\n",
                peak_c, peak_f, (double)peak_c / (double)peak_f);
  assert_true(peak_f < peak_c / 2);
  for (int i = 0; i < 4; i++) assert_true(rel_diff(b[i], a[i]) <= 1e-5);
  free4(a), free4(b), free4(vals);
  slapo_graph_free(gc);
  slapo_graph_free(gf);
}

/* ---- the module swapped into GPT-2 ---- */

typedef struct grads {
  int n;
  char *paths[64];
  slapo_tensor *g[64];
} grads;

static void take_grad(slapo_parameter *p, const char *path, void *ud) {
  grads *gs = ud;
  assert_true(gs->n < 64);
  gs->paths[gs->n] = slapo_strdup(path);
  OK(slapo_tensor_contiguous(p->grad, &gs->g[gs->n]));
  gs->n++;
}

static void grads_free(grads *gs) {
  for (int i = 0; i < gs->n; i++) slapo_free(gs->paths[i]), slapo_tensor_free(gs->g[i]);
}

/* One train step (fresh runner) -> loss; gradients by path into gs. */
static float train_step(slapo_module *m, slapo_tensor *const *in, grads *gs, int *n_flash) {
  slapo_runner *r;
  OK(slapo_runner_new(m, NULL, &r));
  slapo_module_zero_grad(m);
  slapo_kernel_env env = {.seed = 2024, .step = 5, .training = true};
  const slapo_tensor *out;
  OK(slapo_step(r, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, &env, &out));
  float loss = *(const float *)slapo_tensor_data(out);
  *n_flash = 0;
  for (slapo_node *n = slapo_graph_first(slapo_runner_graph(r)); n; n = n->next)
    *n_flash += n->kind == SLAPO_NODE_CALL_OP && !strcmp(n->target, "flash_attention_qkv");
  memset(gs, 0, sizeof *gs);
  OK(slapo_module_visit_params(m, take_grad, gs));
  slapo_runner_free(r);
  return loss;
}

static float eval_loss(slapo_module *m, slapo_tensor *const *in) {
  slapo_runner *r;
  OK(slapo_runner_new(m, NULL, &r));
  const slapo_tensor *out;
  OK(slapo_step(r, 2, (const slapo_tensor *const *)in, SLAPO_STEP_EVAL, NULL, &out));
  float loss = *(const float *)slapo_tensor_data(out);
  slapo_runner_free(r);
  return loss;
}

/* Weights x10 (std 0.2): sharper attention, so dropout on the attention
 * probabilities moves the loss and gradients well beyond the tolerance. */
static void scale_weight(slapo_parameter *p, const char *path, void *ud) {
  (void)path, (void)ud;
  float *w = slapo_tensor_data(p->value); /* [numel] */
  if (p->value->ndim == 2)
    for (int64_t i = 0; i < slapo_tensor_numel(p->value); i++) w[i] *= 10.0f;
}

static void test_gpt2_swap_same_loss_and_grads(void **state) {
  (void)state;
  slapo_gpt2_config cfg = {2, 2, 16, 16, 32, 0.1, 1e-5};
  slapo_module *m;
  OK(slapo_gpt2_new(&cfg, &m));
  OK(slapo_module_materialize(m, 7));
  OK(slapo_module_visit_params(m, scale_weight, NULL));
  int64_t bt[2] = {2, 11};
  slapo_tensor *in[2];
  for (int j = 0; j < 2; j++) {
    OK(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &in[j]));
    int32_t *d = slapo_tensor_data(in[j]); /* [B, T] token ids */
    for (int i = 0; i < 22; i++) d[i] = (int32_t)((i * 7 + j * 3 + 1) % 32);
  }
  grads before, after;
  int n_flash;
  float loss0 = train_step(m, in, &before, &n_flash);
  assert_int_equal(n_flash, 0);
  float eval0 = eval_loss(m, in);

  slapo_module *blk, *old, *fa;
  OK(slapo_module_at(m, "transformer.h.0", &blk));
  OK(slapo_flash_attention_new(slapo_module_child(blk, "attn"), &fa));
  OK(slapo_module_replace_child(blk, "attn", fa, &old));
  assert_ptr_equal(slapo_module_child(blk, "attn"), fa);
  assert_null(old->parent);
  /* Same parameter objects: the swap keeps weights and paths. */
  assert_ptr_equal(slapo_module_param(slapo_module_child(fa, "c_attn"), "weight"),
                   slapo_module_param(slapo_module_child(old, "c_attn"), "weight"));
  slapo_module_free(old);

  float loss1 = train_step(m, in, &after, &n_flash);
  assert_int_equal(n_flash, 1);
  float eval1 = eval_loss(m, in);
  print_message("GPT-2 train loss: original %.7f, with FlashAttention in h.0 %.7f; eval %.7f "
                "vs %.7f\n",
                loss0, loss1, eval0, eval1);
  assert_true(fabs(loss0 - loss1) <= 1e-5 * fabs(loss0));
  assert_true(fabs(eval0 - eval1) <= 1e-5 * fabs(eval0));
  assert_true(fabs(loss0 - eval0) > 1e-2); /* dropout is active in train mode */
  assert_int_equal(before.n, after.n);
  double worst = 0;
  for (int i = 0; i < before.n; i++) {
    assert_string_equal(before.paths[i], after.paths[i]);
    double r = rel_diff(after.g[i], before.g[i]);
    worst = r > worst ? r : worst;
    if (!(r <= 1e-5)) fail_msg("gradient of %s differs: %.3g relative", before.paths[i], r);
  }
  print_message("%d parameter gradients agree, worst %.2e relative\n", before.n, worst);
  grads_free(&before), grads_free(&after);
  slapo_tensor_free(in[0]), slapo_tensor_free(in[1]);
  slapo_module_free(m);
}

/* ---- errors ---- */

/* Builds flash_attention (or its backward) on inputs of the given shapes and
 * dtype and returns the ctx's status; msg gets the message. */
static slapo_status try_build(const char *op, int n, const int64_t (*shapes)[4], int ndim,
                              slapo_dtype dt, int n_attrs, const slapo_attr *attrs, char *msg) {
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  slapo_node *in[5];
  const char *names[5] = {"q", "k", "v", "out", "dout"};
  for (int i = 0; i < n; i++)
    in[i] = slapo_input(ctx, names[i], i == 0 ? dt : SLAPO_DTYPE_F32, ndim, shapes[i]);
  assert_null(slapo_op_call(ctx, op, n, in, n_attrs, attrs));
  slapo_status s = slapo_ctx_status(ctx);
  snprintf(msg, 1024, "%s", slapo_ctx_message(ctx));
  OK(slapo_graph_lint(g));
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  return s;
}

static void expect(slapo_status got, slapo_status want, const char *msg, const char *needle) {
  assert_int_equal(got, want);
  if (!strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
}

static void test_op_errors(void **state) {
  (void)state;
  char msg[1024];
  const int64_t same[5][4] = {{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4},
                              {2, 3, 5, 4}};
  const int64_t bad_k[3][4] = {{2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 5, 4}};
  expect(try_build("flash_attention", 3, same, 3, SLAPO_DTYPE_F32, 0, NULL, msg), SLAPO_SHAPE,
         msg, "flash_attention: q [2, 3, 5] must be 4-d [B, NH, T, HS]");
  expect(try_build("flash_attention", 3, bad_k, 4, SLAPO_DTYPE_F32, 0, NULL, msg), SLAPO_SHAPE,
         msg, "k [2, 3, 6, 4] differs from q [2, 3, 5, 4]");
  const int64_t bad_kv[3][4] = {{2, 6, 5, 4}, {2, 4, 5, 4}, {2, 4, 5, 4}};
  expect(try_build("flash_attention", 3, bad_kv, 4, SLAPO_DTYPE_F32, 0, NULL, msg), SLAPO_SHAPE,
         msg, "with NKV dividing q's NH (grouped-query heads)");
  expect(try_build("flash_attention", 3, same, 4, SLAPO_DTYPE_I32, 0, NULL, msg), SLAPO_DTYPE,
         msg, "expected f32");
  slapo_attr causal = slapo_attr_int("causal", 2);
  expect(try_build("flash_attention", 3, same, 4, SLAPO_DTYPE_F32, 1, &causal, msg),
         SLAPO_INVALID_ARG, msg, "causal = 2; use 0 or 1");
  slapo_attr p = slapo_attr_float("dropout_p", 1.5);
  expect(try_build("flash_attention", 3, same, 4, SLAPO_DTYPE_F32, 1, &p, msg),
         SLAPO_INVALID_ARG, msg, "dropout_p = 1.5 is outside [0, 1]");
  slapo_attr sc = slapo_attr_float("scale", INFINITY);
  expect(try_build("flash_attention", 3, same, 4, SLAPO_DTYPE_F32, 1, &sc, msg),
         SLAPO_INVALID_ARG, msg, "scale = inf is not finite");
  slapo_attr off = slapo_attr_int("offset", -1);
  expect(try_build("flash_attention", 3, same, 4, SLAPO_DTYPE_F32, 1, &off, msg),
         SLAPO_INVALID_ARG, msg, "offset = -1; it must be >= 0");
  const int64_t bad_out[5][4] = {{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4},
                                 {2, 3, 5, 8}};
  expect(try_build("flash_attention_backward", 5, bad_out, 4, SLAPO_DTYPE_F32, 0, NULL, msg),
         SLAPO_SHAPE, msg, "flash_attention_backward: dout [2, 3, 5, 8] differs from q");
}

static void test_module_errors(void **state) {
  (void)state;
  slapo_module *lin, *fa = NULL;
  OK(slapo_linear_new(4, 4, true, 0.02f, &lin));
  slapo_status s = slapo_flash_attention_new(lin, &fa);
  expect(s, SLAPO_INVALID_ARG, slapo_last_error(), "(GPT2Attention, LlamaAttention, BertSelfAttention) only, got Linear");
  assert_null(fa);
  /* The module's forward checks its input. */
  slapo_gpt2_config cfg = {1, 2, 16, 8, 32, 0.1, 1e-5};
  slapo_module *gpt, *attn;
  OK(slapo_gpt2_new(&cfg, &gpt));
  OK(slapo_module_at(gpt, "transformer.h.0.attn", &attn));
  OK(slapo_flash_attention_new(attn, &fa));
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t bad[3] = {2, 5, 12};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, bad);
  assert_null(fa->type->forward(ctx, fa, 1, &x));
  expect(slapo_ctx_status(ctx), SLAPO_SHAPE, slapo_ctx_message(ctx),
         "FlashAttention expects one input x [B, T, 16], got 1 input(s) x [2, 5, 12]");
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
  slapo_module_free(fa);
  slapo_module_free(gpt);

  slapo_module *list, *old = lin;
  OK(slapo_modulelist_new(&list));
  OK(slapo_module_add_child(list, "0", lin));
  slapo_module *other;
  OK(slapo_relu_new(&other));
  s = slapo_module_replace_child(list, "nope", other, &old);
  expect(s, SLAPO_NOT_FOUND, slapo_last_error(), "has no child 'nope' to replace; its children: 0");
  assert_null(old);
  assert_ptr_equal(slapo_module_child(list, "0"), lin);
  slapo_module_free(list);
}

/* The stream helper is the formula slapo_op_call stamps on random ops. */
static void test_rng_stream_matches_op_call(void **state) {
  (void)state;
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t shape[2] = {3, 5};
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 2, shape);
  OK(slapo_ctx_enter_call(ctx, "transformer.h.0.attn.attn_dropout"));
  slapo_node *d0 = slapo_dropout(ctx, x, 0.1), *d1 = slapo_dropout(ctx, x, 0.1);
  slapo_ctx_pop_origin(ctx);
  assert_int_equal(slapo_node_attr_int(d0, "stream", -1),
                   (int64_t)slapo_rng_stream("transformer.h.0.attn.attn_dropout", 0, 0));
  assert_int_equal(slapo_node_attr_int(d1, "stream", -1),
                   (int64_t)slapo_rng_stream("transformer.h.0.attn.attn_dropout", 0, 1));
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_causal_no_dropout),
      cmocka_unit_test(test_causal_dropout_train),
      cmocka_unit_test(test_causal_dropout_eval),
      cmocka_unit_test(test_full_dropout_train),
      cmocka_unit_test(test_tile_paths),
      cmocka_unit_test(test_fast_kernels_isa_identical),
      cmocka_unit_test(test_fast_kernels_thread_count_independent),
      cmocka_unit_test(test_grouped_heads_masked),
      cmocka_unit_test(test_packed_heads_same_as_split),
      cmocka_unit_test(test_peak_memory_far_below_composite),
      cmocka_unit_test(test_gpt2_swap_same_loss_and_grads),
      cmocka_unit_test(test_op_errors),
      cmocka_unit_test(test_module_errors),
      cmocka_unit_test(test_rng_stream_matches_op_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
