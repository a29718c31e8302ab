/* examples/fuse_conv_relu.c - the original system's fusion example, in
 * slapo: a model x -> Conv2d(3, 32, 3) -> relu -> + 1, the original's
 * pattern add(relu(conv2d(x, w, b)), 1) found in its traced graph and fused
 * with compiler=auto as "FusedConvReLU" (the convolution runs as oneDNN's
 * own kernel and relu + 1 as one generated cc kernel over its output; the
 * module's description says so); outputs and gradients checked against the
 * unfused model, and the schedule printed. Built by CMake, run by CTest
 * (exit 0 = equal).
 *
 *   build/example_fuse_conv_relu */
#include <math.h>
#include <stdio.h>

#include "slapo/primitives.h"

/* The model: conv, relu, +1, and a loss sum(y * r) to differentiate. */
static slapo_node *model_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                 slapo_node *const *in) {
  (void)n_in;
  slapo_node *y = slapo_call1(ctx, self, "conv", in[0]); /* [N, 32, H-2, W-2] */
  y = slapo_add_scalar(ctx, slapo_relu(ctx, y), 1.0);
  int64_t axes[4] = {0, 1, 2, 3};
  return slapo_sum(ctx, slapo_mul(ctx, y, in[1]), 4, axes, false);
}

static const slapo_module_type k_model = {"ConvReLU", model_forward, NULL, NULL, NULL};

#define CHECK(expr)                                                                \
  do {                                                                             \
    slapo_status s_ = (expr);                                                      \
    if (s_ != SLAPO_OK) {                                                          \
      fprintf(stderr, "%s: %s: %s\n", #expr, slapo_status_name(s_), slapo_last_error()); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

static const int64_t k_x[4] = {2, 3, 10, 10}, k_y[4] = {2, 32, 8, 8};

static int build(slapo_module **out) {
  slapo_module *m, *conv;
  CHECK(slapo_module_new(&k_model, NULL, &m));
  CHECK(slapo_conv2d_new(3, 32, 3, 3, NULL, &conv));
  CHECK(slapo_module_add_child(m, "conv", conv));
  slapo_tensor *ex[2];
  CHECK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, k_x, &ex[0]));
  CHECK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 4, k_y, &ex[1]));
  CHECK(slapo_module_set_example(m, 2, (const slapo_tensor *const *)ex));
  slapo_tensor_free(ex[0]), slapo_tensor_free(ex[1]);
  CHECK(slapo_module_materialize(m, 42));
  *out = m;
  return 0;
}

/* One training step: the loss and the conv's weight and bias gradients. */
static int step(slapo_module *m, slapo_tensor *const *in, float *loss, slapo_tensor **gw,
                slapo_tensor **gb) {
  slapo_runner *r;
  const slapo_tensor *out;
  CHECK(slapo_runner_new(m, NULL, &r));
  slapo_module_zero_grad(m);
  CHECK(slapo_step(r, 2, (const slapo_tensor *const *)in, SLAPO_STEP_TRAIN, NULL, &out));
  *loss = *(const float *)slapo_tensor_data(out);
  slapo_module *conv;
  CHECK(slapo_module_at(m, "conv", &conv));
  CHECK(slapo_tensor_contiguous(slapo_module_param(conv, "weight")->grad, gw));
  CHECK(slapo_tensor_contiguous(slapo_module_param(conv, "bias")->grad, gb));
  slapo_runner_free(r);
  return 0;
}

static double worst(const slapo_tensor *a, const slapo_tensor *b) {
  const float *x = slapo_tensor_data(a), *y = slapo_tensor_data(b);
  double w = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
    double e = fabs((double)x[i] - y[i]) / (1e-5 + 1e-4 * fabs((double)y[i]));
    if (e > w) w = e;
  }
  return w;
}

int main(void) {
  slapo_module *plain, *fused;
  if (build(&plain) || build(&fused)) return 1;
  /* The schedule: trace, find the pattern, fuse it. */
  slapo_sched *sch;
  CHECK(slapo_sched_create(fused, &sch));
  CHECK(slapo_trace(sch, NULL));
  slapo_pattern *p;
  CHECK(slapo_pattern_parse("add(relu(conv2d(x, w, b)), 1)", &p));
  slapo_matches ms;
  CHECK(slapo_sched_find(sch, p, &ms));
  printf("found %d match(es) of %s:\n", ms.n, slapo_pattern_name(p));
  slapo_matches_print(&ms, p, stdout);
  slapo_matches_deinit(&ms);
  CHECK(slapo_fuse(sch, p, "auto", "FusedConvReLU", NULL, false));
  slapo_pattern_free(p);
  printf("\nschedule:\n");
  slapo_sched_log_print(slapo_sched_log_of(sch), stdout);
  printf("\ntraced graph:\n");
  slapo_graph_print(slapo_module_graph(fused), stdout);
  slapo_module_print(fused, stdout);

  /* Inputs, then one step of each model. */
  slapo_tensor *in[2];
  CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, k_x, &in[0]));
  CHECK(slapo_tensor_new(SLAPO_DTYPE_F32, 4, k_y, &in[1]));
  for (int j = 0; j < 2; j++) {
    float *d = slapo_tensor_data(in[j]);
    for (int64_t i = 0; i < slapo_tensor_numel(in[j]); i++)
      d[i] = 2 * slapo_rng_uniform(7, (uint64_t)j, 0, (uint64_t)i) - 1;
  }
  float la, lb;
  slapo_tensor *wa, *ba, *wb, *bb;
  if (step(plain, in, &la, &wa, &ba) || step(fused, in, &lb, &wb, &bb)) return 1;
  double ew = worst(wb, wa), eb = worst(bb, ba);
  printf("\nloss: unfused %.7g, fused %.7g\n", la, lb);
  printf("conv.weight gradient: worst error %.3g of tolerance; conv.bias: %.3g\n", ew, eb);
  bool ok = fabsf(la - lb) <= 1e-5f * (1 + fabsf(la)) && ew <= 1 && eb <= 1;
  printf("%s\n", ok ? "equal within tolerance (1e-5 + 1e-4 |x|)" : "MISMATCH");
  slapo_tensor_free(wa), slapo_tensor_free(ba), slapo_tensor_free(wb), slapo_tensor_free(bb);
  slapo_tensor_free(in[0]), slapo_tensor_free(in[1]);
  slapo_sched_free(sch);
  slapo_module_free(plain);
  slapo_module_free(fused);
  return ok ? 0 : 1;
}
