/* tests/unit/test_adamw_fused.c - the one-pass optimizer path: clipping
 * folded into AdamW (slapo_clip_grad_norm(model, 0) + slapo_clip_scale +
 * slapo_adamw_step_scaled) gives bitwise the weights and optimizer state of
 * clip-then-step and leaves the gradients unscaled (or zeroes them, when
 * asked, with the same weights); the vector body of every ISA level and
 * the scalar tail of the update agree (parameter sizes that are not
 * multiples of 4 and one large enough to be split over threads). */
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

#include "slapo/train.h"


/* A root module with Linear(301, 257) (77657 weights: a multiple of 4 plus
 * 1, more than 4 chunks of 16384) and Linear(5, 3) (15 + 3). */
static slapo_module *model(void) {
  slapo_module *root, *a, *b;
  assert_ok(slapo_modulelist_new(&root));
  assert_ok(slapo_linear_new(301, 257, true, 0.02f, &a));
  assert_ok(slapo_linear_new(5, 3, true, 0.02f, &b));
  assert_ok(slapo_module_add_child(root, "0", a));
  assert_ok(slapo_module_add_child(root, "1", b));
  assert_ok(slapo_module_materialize(root, 7));
  return root;
}

typedef struct fill {
  int step;
} fill;

/* Gradients as a pure function of (step, element), large enough that the
 * global norm exceeds 1 and clipping applies. */
static void set_grad(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  const fill *f = ud;
  float *g = slapo_tensor_data(p->grad);
  for (int64_t i = 0; i < slapo_tensor_numel(p->grad); i++)
    g[i] = (float)((i * 37 + f->step * 11) % 101 - 50) * 0.01f;
}

typedef struct cmp {
  slapo_module *other;
} cmp;

static void same_value(slapo_parameter *p, const char *path, void *ud) {
  const cmp *c = ud;
  slapo_module *owner = NULL;
  char mod[16];
  snprintf(mod, sizeof mod, "%.*s", (int)(strchr(path, '.') - path), path);
  assert_ok(slapo_module_at(c->other, mod, &owner));
  slapo_parameter *q = slapo_module_param(owner, strchr(path, '.') + 1);
  assert_non_null(q);
  assert_memory_equal(slapo_tensor_data(p->value), slapo_tensor_data(q->value),
                      slapo_tensor_nbytes(p->value));
}

static void test_scaled_step_is_clip_then_step(void **state) {
  (void)state;
  slapo_module *a = model(), *b = model();
  slapo_adamw *oa, *ob;
  slapo_adamw_config cfg = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  assert_ok(slapo_adamw_new(a, &cfg, &oa));
  assert_ok(slapo_adamw_new(b, &cfg, &ob));
  for (int t = 0; t < 3; t++) {
    fill f = {t};
    slapo_module_visit_params(a, set_grad, &f);
    slapo_module_visit_params(b, set_grad, &f);
    double na = slapo_clip_grad_norm(a, 1.0);
    slapo_adamw_step(oa, 1e-2f);
    double nb = slapo_clip_grad_norm(b, 0); /* measure only */
    assert_true(na == nb && nb > 1.0);
    slapo_adamw_step_scaled(ob, 1e-2f, slapo_clip_scale(nb, 1.0), false);
    cmp c = {a};
    slapo_module_visit_params(b, same_value, &c);
  }
  /* zero_grads: the same update, and every gradient 0 afterwards. */
  slapo_module *c = model();
  slapo_adamw *oc;
  assert_ok(slapo_adamw_new(c, &cfg, &oc));
  for (int t = 0; t < 3; t++) {
    fill f = {t};
    slapo_module_visit_params(c, set_grad, &f);
    slapo_adamw_step_scaled(oc, 1e-2f, slapo_clip_scale(slapo_clip_grad_norm(c, 0), 1.0), true);
    assert_true(slapo_clip_grad_norm(c, 0) == 0.0);
  }
  cmp cc = {a};
  slapo_module_visit_params(c, same_value, &cc);
  slapo_adamw_free(oc);
  slapo_module_free(c);
  /* b's gradients were not scaled: their norm is still the measured one. */
  fill f = {2};
  slapo_module_visit_params(a, set_grad, &f);
  assert_true(slapo_clip_grad_norm(b, 0) == slapo_clip_grad_norm(a, 0));
  assert_true(slapo_clip_scale(0.5, 1.0) == 1.0f && slapo_clip_scale(2.0, 0) == 1.0f);
  slapo_adamw_free(oa);
  slapo_adamw_free(ob);
  slapo_module_free(a);
  slapo_module_free(b);
}

/* The first update of every element against the scalar formula written out
 * here (m = v = 0 before it), bitwise: the vector body and the tail agree. */
typedef struct expect {
  float lr, wd;
  float *w0; /* every weight before the step, parameters in visit order */
  int i;
} expect;

static void check_first_update(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  expect *e = ud;
  const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
  const float c1 = (float)(1.0 - pow(b1, 1.0)), c2 = (float)(1.0 - pow(b2, 1.0));
  const float wd = p->no_weight_decay ? 0.0f : e->wd;
  const float *g = slapo_tensor_data(p->grad), *w = slapo_tensor_data(p->value);
  int64_t n = slapo_tensor_numel(p->value);
  for (int64_t i = 0; i < n; i++) {
    float m = (1.0f - b1) * g[i], v = (1.0f - b2) * g[i] * g[i];
    float want = e->w0[e->i + i];
    want -= e->lr * ((m / c1) / (sqrtf(v / c2) + eps) + wd * want);
    if (memcmp(&want, &w[i], sizeof want))
      fail_msg("%s[%lld]: %.9g, formula gives %.9g", path, (long long)i, w[i], want);
  }
  e->i += (int)n;
}

static void gather_w(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  expect *e = ud;
  int64_t n = slapo_tensor_numel(p->value);
  e->w0 = realloc(e->w0, (size_t)(e->i + n) * sizeof(float));
  memcpy(e->w0 + e->i, slapo_tensor_data(p->value), (size_t)n * sizeof(float));
  e->i += (int)n;
}

/* At one ISA level. */
static void update_matches_scalar_formula(void) {
  slapo_module *a = model();
  slapo_adamw *o;
  slapo_adamw_config cfg = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  assert_ok(slapo_adamw_new(a, &cfg, &o));
  fill f = {0};
  slapo_module_visit_params(a, set_grad, &f);
  expect e = {.lr = 1e-2f, .wd = 0.1f};
  slapo_module_visit_params(a, gather_w, &e);
  slapo_adamw_step(o, e.lr);
  e.i = 0;
  slapo_module_visit_params(a, check_first_update, &e);
  free(e.w0);
  slapo_adamw_free(o);
  slapo_module_free(a);
}

/* Every level this host runs (SSE, AVX2, AVX-512 bodies) gives the formula's bits. */
static void test_update_matches_scalar_formula(void **state) {
  (void)state;
  for (int lvl = SLAPO_ISA_BASELINE; lvl <= (int)slapo_isa_host(); lvl++) {
    slapo_isa_set_max((slapo_isa)lvl);
    update_matches_scalar_formula();
  }
  slapo_isa_set_max(slapo_isa_host());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scaled_step_is_clip_then_step),
      cmocka_unit_test(test_update_matches_scalar_formula),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
