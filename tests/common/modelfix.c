/* tests/common/modelfix.c - see modelfix.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/modelfix.h"
#include "common/torchfix.h"

typedef struct inputs {
  slapo_tensor *t[4];
  const slapo_tensor *in[4];
} inputs;

static inputs get_inputs(const modelfix *c) {
  inputs x;
  memset(&x, 0, sizeof x);
  for (int i = 0; i < c->n_in; i++) x.in[i] = x.t[i] = torchfix_get(c->fix, c->inputs[i]);
  return x;
}

static void free_inputs(inputs *x) {
  for (int i = 0; i < 4; i++) slapo_tensor_free(x->t[i]);
}

static slapo_runner *runner(const modelfix *c) {
  slapo_runner *r;
  if (slapo_runner_new(c->model, NULL, &r) != SLAPO_OK) fail_msg("runner: %s", slapo_last_error());
  return r;
}

/* The train loss of one step (gradients accumulate into the model). */
static float train_loss(slapo_runner *r, const modelfix *c, const inputs *x) {
  const slapo_tensor *out;
  slapo_status s = slapo_step(r, c->n_in, x->in, SLAPO_STEP_TRAIN, NULL, &out);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  return *(const float *)slapo_tensor_data(out);
}

void modelfix_logits_and_loss(const modelfix *c, double tol) {
  slapo_runner *r = runner(c);
  inputs x = get_inputs(c);
  slapo_tensor *want_logits = torchfix_get(c->fix, "logits"), *want_loss = torchfix_get(c->fix, "loss");
  const slapo_tensor *out;
  /* Without the labels: the logits. */
  slapo_status s = slapo_step(r, c->n_in - 1, x.in, SLAPO_STEP_EVAL, NULL, &out);
  if (s != SLAPO_OK) fail_msg("eval: %s", slapo_last_error());
  double e = torchfix_rel_err(out, want_logits);
  print_message("logits: max error %.3g of max |logit|\n", e);
  assert_true(e < tol);
  float loss = train_loss(r, c, &x), want = *(const float *)slapo_tensor_data(want_loss);
  print_message("loss: %.7f vs torch %.7f\n", loss, want);
  assert_true(fabs(loss - want) <= tol * fabs(want));
  free_inputs(&x);
  slapo_tensor_free(want_logits), slapo_tensor_free(want_loss);
  slapo_runner_free(r);
}

typedef struct grad_check {
  const modelfix *c;
  int n;
  double worst;
  char worst_path[256];
} grad_check;

static void check_grad(slapo_parameter *p, const char *path, void *ud) {
  grad_check *g = ud;
  char name[512];
  snprintf(name, sizeof name, "grad.%s", path);
  slapo_tensor *want = torchfix_get(g->c->fix, name), *tmp = NULL;
  if (g->c->transposed && g->c->transposed(path)) { /* fixture [in, out]; ours [out, in] */
    int perm[2] = {1, 0};
    slapo_tensor *v;
    assert_int_equal(slapo_tensor_permute(want, perm, &v), SLAPO_OK);
    assert_int_equal(slapo_tensor_contiguous(v, &tmp), SLAPO_OK);
    slapo_tensor_free(v);
  }
  double e = torchfix_rel_err(p->grad, tmp ? tmp : want);
  if (e > g->worst) g->worst = e, snprintf(g->worst_path, sizeof g->worst_path, "%s", path);
  g->n++;
  slapo_tensor_free(tmp);
  slapo_tensor_free(want);
}

void modelfix_gradients(const modelfix *c, int n_params, double tol) {
  slapo_runner *r = runner(c);
  inputs x = get_inputs(c);
  slapo_module_zero_grad(c->model);
  train_loss(r, c, &x);
  grad_check g = {.c = c};
  assert_int_equal(slapo_module_visit_params(c->model, check_grad, &g), SLAPO_OK);
  print_message("%d gradients: worst %.3g (%s)\n", g.n, g.worst, g.worst_path);
  assert_int_equal(g.n, n_params);
  assert_true(g.worst < tol);
  free_inputs(&x);
  slapo_runner_free(r);
}

void modelfix_adamw(const modelfix *c, double tol) {
  slapo_runner *r = runner(c);
  slapo_adamw *opt;
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, 0.1f, false};
  assert_int_equal(slapo_adamw_new(c->model, &ac, &opt), SLAPO_OK);
  inputs x = get_inputs(c);
  slapo_tensor *want = torchfix_get(c->fix, "adamw_losses");
  const float *w = slapo_tensor_data(want);
  for (int step = 0; step <= 5; step++) {
    slapo_module_zero_grad(c->model);
    float loss = train_loss(r, c, &x);
    if (step > 0) {
      print_message("adamw step %d: loss %.6f vs torch %.6f\n", step, loss, w[step - 1]);
      assert_true(fabs(loss - w[step - 1]) <= tol * fabs(w[step - 1]) + 1e-5);
    }
    slapo_clip_grad_norm(c->model, 1.0);
    slapo_adamw_step(opt, 1e-2f);
  }
  free_inputs(&x);
  slapo_tensor_free(want);
  slapo_adamw_free(opt);
  slapo_runner_free(r);
}
