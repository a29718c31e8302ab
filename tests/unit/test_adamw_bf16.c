/* tests/unit/test_adamw_bf16.c - AdamW with its state in bf16
 * (slapo_adamw_config.state_bf16): under a constant gradient for 10,000
 * steps, v (exp_avg_sq) stays within 1% of the f32 state's on average, and
 * m too, where round-to-nearest bf16 would stall v far below (shown by a
 * scalar replay in this test); the stochastic rounding is deterministic (two
 * runs give the same bits); the file stores bf16 and converts both ways
 * (f32 <-> bf16 state) on load. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/train.h"

static char g_dir[64];

static slapo_module *model(void) {
  slapo_module *m;
  assert_ok(slapo_linear_new(64, 64, true, 0.02f, &m));
  assert_ok(slapo_module_materialize(m, 7));
  return m;
}

static const float G = 1e-2f;

static void set_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path, (void)ud;
  float *g = slapo_tensor_data(p->grad);
  for (int64_t i = 0; i < slapo_tensor_numel(p->grad); i++) g[i] = G;
}

static slapo_adamw *run(slapo_module *m, bool bf16, int steps) {
  slapo_adamw *o;
  slapo_adamw_config cfg = {0.9f, 0.999f, 1e-8f, 0.0f, bf16};
  assert_ok(slapo_adamw_new(m, &cfg, &o));
  for (int t = 0; t < steps; t++) {
    slapo_module_visit_params(m, set_grad, NULL);
    slapo_adamw_step(o, 0.0f); /* the state alone: weights stay put */
  }
  return o;
}

static char *path_of(const char *name) {
  static char buf[2][128];
  static int k;
  k ^= 1;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

/* Element i of tensor `name` in the optimizer file, as double. */
static slapo_tensor *state_of(const char *file, const char *name) {
  slapo_safetensors *f;
  assert_ok(slapo_safetensors_read(file, &f));
  slapo_tensor *t, *w;
  assert_ok(slapo_safetensors_get(f, name, &t));
  assert_ok(slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &w));
  slapo_tensor_free(t);
  slapo_safetensors_free(f);
  return w;
}

static double mean_ratio(const slapo_tensor *a, const slapo_tensor *b) {
  const float *x = slapo_tensor_data(a), *y = slapo_tensor_data(b);
  double s = 0;
  int64_t n = slapo_tensor_numel(a);
  for (int64_t i = 0; i < n; i++) s += (double)x[i] / (double)y[i];
  return s / (double)n;
}

static void v_tracks_f32(void **state) {
  (void)state;
  enum { STEPS = 10000 };
  slapo_module *a = model(), *b = model();
  slapo_adamw *oa = run(a, false, STEPS), *ob = run(b, true, STEPS);
  assert_ok(slapo_adamw_save(oa, path_of("f32.safetensors"), NULL));
  assert_ok(slapo_adamw_save(ob, path_of("bf16.safetensors"), NULL));
  {
    slapo_safetensors *f;
    assert_ok(slapo_safetensors_read(path_of("bf16.safetensors"), &f));
    slapo_tensor *meta;
    assert_ok(slapo_safetensors_meta(f, "weight.exp_avg_sq", &meta));
    assert_int_equal(meta->dtype, SLAPO_DTYPE_BF16); /* stored as kept */
    slapo_tensor_free(meta);
    slapo_safetensors_free(f);
  }
  const char *names[2] = {"weight.exp_avg_sq", "weight.exp_avg"};
  for (int k = 0; k < 2; k++) {
    slapo_tensor *vf = state_of(path_of("f32.safetensors"), names[k]);
    slapo_tensor *vb = state_of(path_of("bf16.safetensors"), names[k]);
    double r = mean_ratio(vb, vf);
    print_message("%s after %d steps: bf16 / f32 = %.5f on average\n", names[k], STEPS, r);
    assert_true(fabs(r - 1.0) < 0.01);
    slapo_tensor_free(vf);
    slapo_tensor_free(vb);
  }
  /* Round-to-nearest bf16 with the same arithmetic stalls v: once
   * (1 - b2) (g^2 - v) is under half an ulp of v, v never moves again. */
  float v_rne = 0.0f, v_f32 = 0.0f;
  for (int t = 0; t < STEPS; t++) {
    v_rne = slapo_bf16_to_f32(slapo_f32_to_bf16(0.999f * v_rne + 0.001f * G * G));
    v_f32 = 0.999f * v_f32 + 0.001f * G * G;
  }
  print_message("round-to-nearest v / f32 v = %.3f\n", v_rne / v_f32);
  assert_true(v_rne / v_f32 < 0.5);
  slapo_adamw_free(oa), slapo_adamw_free(ob);
  slapo_module_free(a), slapo_module_free(b);
}

/* Stochastic rounding keyed by (path, step, element): the same bits twice. */
static void deterministic(void **state) {
  (void)state;
  slapo_module *a = model(), *b = model();
  slapo_adamw *oa = run(a, true, 50), *ob = run(b, true, 50);
  assert_ok(slapo_adamw_save(oa, path_of("d1.safetensors"), NULL));
  assert_ok(slapo_adamw_save(ob, path_of("d2.safetensors"), NULL));
  slapo_tensor *x = state_of(path_of("d1.safetensors"), "weight.exp_avg_sq");
  slapo_tensor *y = state_of(path_of("d2.safetensors"), "weight.exp_avg_sq");
  assert_true(slapo_tensor_equal(x, y));
  slapo_tensor_free(x), slapo_tensor_free(y);
  slapo_adamw_free(oa), slapo_adamw_free(ob);
  slapo_module_free(a), slapo_module_free(b);
}

/* An f32-state file loads into a bf16-state optimizer (rounded to nearest)
 * and a bf16 one into an f32 optimizer (exactly). */
static void files_convert(void **state) {
  (void)state;
  slapo_module *a = model(), *b = model();
  slapo_adamw *of = run(a, false, 20), *ob = run(b, true, 20);
  assert_ok(slapo_adamw_save(of, path_of("cf.safetensors"), NULL));
  assert_ok(slapo_adamw_save(ob, path_of("cb.safetensors"), NULL));
  slapo_module *c = model(), *d = model();
  slapo_adamw *lb = run(c, true, 0), *lf = run(d, false, 0);
  assert_ok(slapo_adamw_load(lb, path_of("cf.safetensors"), NULL));
  assert_ok(slapo_adamw_load(lf, path_of("cb.safetensors"), NULL));
  assert_int_equal(slapo_adamw_steps(lb), 20);
  assert_ok(slapo_adamw_save(lb, path_of("lb.safetensors"), NULL));
  assert_ok(slapo_adamw_save(lf, path_of("lf.safetensors"), NULL));
  slapo_tensor *f32 = state_of(path_of("cf.safetensors"), "weight.exp_avg");
  slapo_tensor *to_b = state_of(path_of("lb.safetensors"), "weight.exp_avg");
  const float *x = slapo_tensor_data(f32), *y = slapo_tensor_data(to_b);
  for (int64_t i = 0; i < slapo_tensor_numel(f32); i++)
    assert_int_equal(f32_bits(y[i]), (uint32_t)slapo_f32_to_bf16(x[i]) << 16);
  slapo_tensor *bf = state_of(path_of("cb.safetensors"), "weight.exp_avg");
  slapo_tensor *to_f = state_of(path_of("lf.safetensors"), "weight.exp_avg");
  assert_true(slapo_tensor_equal(bf, to_f));
  slapo_tensor_free(f32), slapo_tensor_free(to_b), slapo_tensor_free(bf), slapo_tensor_free(to_f);
  slapo_adamw_free(of), slapo_adamw_free(ob), slapo_adamw_free(lb), slapo_adamw_free(lf);
  slapo_module_free(a), slapo_module_free(b), slapo_module_free(c), slapo_module_free(d);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/slapo_test_adamw_bf16_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  const char *files[] = {"f32", "bf16", "d1", "d2", "cf", "cb", "lb", "lf"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s.safetensors", g_dir, files[i]);
    unlink(p);
  }
  rmdir(g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(v_tracks_f32),
      cmocka_unit_test(deterministic),
      cmocka_unit_test(files_convert),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
