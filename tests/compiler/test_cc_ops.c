/* tests/compiler/test_cc_ops.c - what the `cc` fusion backend generates per
 * op (compiler/cc_ops.c, slapo__cc_expr): the elementwise ops of the
 * registry are rendered by cc and each has a case (those without attributes
 * taken from the list in slapo/ops/math.h); every case below yields a
 * forward expression and, for differentiable ops, one gradient per input;
 * and the expressions, compiled with the system compiler `cc` into a shared
 * object and dlopen'ed, compute what the op's reference kernel (forward)
 * and its backward rule run with reference kernels (gradients) compute, on
 * 64 random inputs plus signed zeros, within 1e-6 relative (dropout: bit for
 * bit, with u from slapo_rng_uniform at a fixed seed, stream and step).
 * The float forms, compiled with the fast kernels' helpers
 * (slapo__cc_math_src), are checked the same way against the fast kernels.
 * The numeric test is skipped when `cc` is not on PATH. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gradcheck.h"
#include "compiler/internal.h"
#include "slapo/autograd.h"
#include "slapo/core.h"
#include "slapo/exec.h"
#include "slapo/ops.h"
#include "slapo/ops/math.h"


enum { N = 64, EXPR_CAP = 1024 };
#define SEED 42u
#define STEP 3u

/* ---- cases: one node of an op on inputs x [N] ---- */

typedef slapo_node *(*build_fn)(slapo_ctx *ctx, const char *op, slapo_node *const *x);

typedef struct cc_case {
  const char *op, *label;
  build_fn build;
  bool grads; /* differentiable: a gradient expression per input */
} cc_case;

#define B(NAME, CALL)                                                          \
  static slapo_node *b_##NAME(slapo_ctx *ctx, const char *op, slapo_node *const *x) {     \
    (void)op;                                                                  \
    return CALL;                                                               \
  }

/* An op without attributes on its inputs. */
static slapo_node *b_plain(slapo_ctx *ctx, const char *op, slapo_node *const *x) {
  return slapo_op_call(ctx, op, slapo_op_find(op)->n_inputs, x, 0, NULL);
}

static slapo_node *call_attr(slapo_ctx *ctx, const char *op, int n, slapo_node *const *x,
                             const char *approximate) {
  slapo_attr at = slapo_attr_str("approximate", approximate ? approximate : "");
  return slapo_op_call(ctx, op, n, x, approximate ? 1 : 0, &at);
}

B(add_scalar, slapo_add_scalar(ctx, x[0], 0.75))
B(add_scalar_neg, slapo_add_scalar(ctx, x[0], -1e-3))
B(add_scalar_int, slapo_add_scalar(ctx, x[0], 3.0))
B(mul_scalar, slapo_mul_scalar(ctx, x[0], -1.5))
B(mul_scalar_tenth, slapo_mul_scalar(ctx, x[0], 0.1))
B(mul_scalar_nzero, slapo_mul_scalar(ctx, x[0], -0.0))
B(pow, slapo_pow(ctx, x[0], 2.5))
B(pow0, slapo_pow(ctx, x[0], 0.0))
B(pow1, slapo_pow(ctx, x[0], 1.0))
B(pow2, slapo_pow(ctx, x[0], 2.0))
B(pow3, slapo_pow(ctx, x[0], 3.0))
B(pow_neg, slapo_pow(ctx, x[0], -1.5))
B(gelu_tanh, slapo_gelu(ctx, x[0], true))
B(gelu_erf, slapo_gelu(ctx, x[0], false))
B(gelu_default, call_attr(ctx, "gelu", 1, x, NULL))
B(gelu_backward_tanh, call_attr(ctx, "gelu_backward", 2, x, "tanh"))
B(gelu_backward_erf, call_attr(ctx, "gelu_backward", 2, x, "none"))
B(dropout, slapo_dropout(ctx, x[0], 0.1))
B(dropout_half, slapo_dropout(ctx, x[0], 0.5))
B(dropout0, slapo_dropout(ctx, x[0], 0.0))
B(dropout1, slapo_dropout(ctx, x[0], 1.0))

/* Every op without attributes, from the list that registers it (a new
 * one is tested with no edit here); the others by hand. */
#define CASE_FIXED(op, grads) {#op, #op, b_plain, (grads) > 0},
#define CASE_ATTR(op, grads)
#define CASE_(op, n, grads, form) CASE_##form(op, grads)

static const cc_case CASES[] = {
    SLAPO_EW_OPS(CASE_)
    {"add_scalar", "add_scalar(0.75)", b_add_scalar, true},
    {"add_scalar", "add_scalar(-1e-3)", b_add_scalar_neg, true},
    {"add_scalar", "add_scalar(3)", b_add_scalar_int, true},
    {"mul_scalar", "mul_scalar(-1.5)", b_mul_scalar, true},
    {"mul_scalar", "mul_scalar(0.1)", b_mul_scalar_tenth, true},
    {"mul_scalar", "mul_scalar(-0.0)", b_mul_scalar_nzero, true},
    {"pow", "pow(2.5)", b_pow, true},
    {"pow", "pow(0)", b_pow0, true},
    {"pow", "pow(1)", b_pow1, true},
    {"pow", "pow(2)", b_pow2, true},
    {"pow", "pow(3)", b_pow3, true},
    {"pow", "pow(-1.5)", b_pow_neg, true},
    {"gelu", "gelu(tanh)", b_gelu_tanh, true},
    {"gelu", "gelu(none)", b_gelu_erf, true},
    {"gelu", "gelu(default)", b_gelu_default, true},
    {"gelu_backward", "gelu_backward(tanh)", b_gelu_backward_tanh, false},
    {"gelu_backward", "gelu_backward(none)", b_gelu_backward_erf, false},
    {"dropout", "dropout(0.1)", b_dropout, true},
    {"dropout", "dropout(0.5)", b_dropout_half, true},
    {"dropout", "dropout(0)", b_dropout0, true},
    {"dropout", "dropout(1)", b_dropout1, true},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

/* A case's node in graph g with placeholders x0 [N], x1 [N]. */
typedef struct built {
  slapo_graph *g;
  slapo_ctx *ctx;
  slapo_node *x[2], *y;
  int n_in;
} built;

static void build_case(const cc_case *c, built *b) {
  static const int64_t shape[1] = {N};
  const slapo_op *op = slapo_op_find(c->op);
  assert_non_null(op);
  b->n_in = op->n_inputs;
  assert_true(b->n_in == 1 || b->n_in == 2);
  assert_ok(slapo_graph_new(&b->g));
  assert_ok(slapo_ctx_new(b->g, &b->ctx));
  b->x[0] = slapo_input(b->ctx, "x0", SLAPO_DTYPE_F32, 1, shape);
  b->x[1] = b->n_in == 2 ? slapo_input(b->ctx, "x1", SLAPO_DTYPE_F32, 1, shape) : NULL;
  b->y = c->build(b->ctx, c->op, b->x);
  if (slapo_ctx_status(b->ctx) != SLAPO_OK)
    fail_msg("%s: building failed: %s", c->label, slapo_ctx_message(b->ctx));
  assert_true(b->y->op == op);
}

static void built_free(built *b) {
  slapo_ctx_free(b->ctx);
  slapo_graph_free(b->g);
}

/* ---- structural checks ---- */

/* Every elementwise op of the registry is rendered by cc and has a case
 * here, so none can exist without codegen. */
static void test_registry(void **state) {
  (void)state;
  int bad = 0, seen = 0;
  for (int i = 0; i < slapo_op_count(); i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->elementwise) continue;
    seen++;
    if (!slapo__cc_renders(op)) {
      print_message("op '%s' is elementwise but cc does not render it\n", op->name);
      bad++;
    }
    bool has = false;
    for (int k = 0; k < N_CASES; k++) has |= !strcmp(CASES[k].op, op->name);
    if (!has) {
      print_message("op '%s' has no case in this test\n", op->name);
      bad++;
    }
  }
  assert_true(seen >= 22); /* the list of slapo/ops/math.h and dropout */
  if (bad) fail_msg("%d problem(s) with the elementwise ops' codegen", bad);
}

static void test_every_case_has_expressions(void **state) {
  (void)state;
  char buf[EXPR_CAP];
  for (int k = 0; k < N_CASES; k++) {
    const cc_case *c = &CASES[k];
    built b;
    build_case(c, &b);
    const slapo_op *op = b.y->op;
    assert_true(op->elementwise);
    buf[0] = '\0';
    if (!slapo__cc_expr(b.y, -1, false, buf, sizeof buf) || !buf[0])
      fail_msg("%s: no forward expression", c->label);
    assert_true(buf[0] == '(' && buf[strlen(buf) - 1] == ')');
    print_message("%-22s fwd   %s\n", c->label, buf);
    for (int w = 0; w < b.n_in; w++) {
      buf[0] = '\0';
      bool ok = slapo__cc_expr(b.y, w, false, buf, sizeof buf);
      if (ok != c->grads)
        fail_msg("%s: slapo__cc_expr(which = %d) returned %d, expected %d", c->label, w, ok, c->grads);
      if (!ok) continue;
      assert_true(buf[0] == '(' && buf[strlen(buf) - 1] == ')');
      print_message("%-22s grad%d %s\n", c->label, w, buf);
    }
    /* Out of range: no input there. */
    assert_false(slapo__cc_expr(b.y, b.n_in, false, buf, sizeof buf));
    assert_false(slapo__cc_expr(b.y, -2, false, buf, sizeof buf));
    /* Too small a buffer is refused, not truncated silently. */
    assert_false(slapo__cc_expr(b.y, -1, false, buf, 3));
    built_free(&b);
  }
}

static void test_unsupported(void **state) {
  (void)state;
  static const int64_t shape[1] = {N};
  slapo_graph *g;
  slapo_ctx *ctx;
  assert_ok(slapo_graph_new(&g));
  assert_ok(slapo_ctx_new(g, &ctx));
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 1, shape);
  /* A shard of a dropout (offset != 0) is not supported yet. */
  slapo_attr at[2] = {slapo_attr_float("p", 0.1), slapo_attr_int("offset", 64)};
  slapo_node *d = slapo_op_call(ctx, "dropout", 1, &x, 2, at);
  assert_non_null(d);
  char buf[EXPR_CAP];
  assert_false(slapo__cc_expr(d, -1, false, buf, sizeof buf));
  assert_false(slapo__cc_expr(d, 0, true, buf, sizeof buf));
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

/* ---- numeric checks: compile the expressions ---- */

typedef float (*expr_fn)(float a, float b, float y, float g, float u);

typedef struct job {
  int case_i, which;
  bool fast; /* the float form, checked against the fast kernels */
  char expr[EXPR_CAP];
  expr_fn fn;
} job;

static void fill(float *v, uint64_t stream, float lo, float hi) {
  for (int i = 0; i < N; i++) v[i] = lo + (hi - lo) * slapo_rng_uniform(7, stream, 0, (uint64_t)i);
}

static bool same(float e, float r) {
  uint32_t be, br;
  memcpy(&be, &e, 4), memcpy(&br, &r, 4);
  if (be == br || (isnan(e) && isnan(r))) return true;
  return fabs((double)e - (double)r) <= 1e-6 * fabs((double)r);
}

/* Runs case c with reference kernels: outputs y and, for differentiable
 * ops, the gradient of every input for the cotangent dy; checks each
 * compiled expression of the case on every element. Returns mismatches. */
static int check_case(int k, bool fast, const job *jobs, int n_jobs, int *exact, int *total) {
  const cc_case *c = &CASES[k];
  static const int64_t shape[1] = {N};
  built b;
  build_case(c, &b);
  gc_settings st = gc_settings_of(b.y->op);
  float in[2][N], dy[N], u[N];
  for (int j = 0; j < b.n_in; j++) {
    fill(in[j], 100 + (uint64_t)(2 * k + j), st.lo, st.hi);
    /* Signed zeros, and 0 against every op's edge (log, div, rsqrt). */
    in[j][0] = 0.0f, in[j][1] = -0.0f;
  }
  fill(dy, 900 + (uint64_t)k, -1.0f, 1.0f);
  bool random = b.y->op->random;
  uint64_t stream = (uint64_t)slapo_node_attr_int(b.y, "stream", 0);
  for (int i = 0; i < N; i++)
    u[i] = random ? slapo_rng_uniform(SEED, stream, STEP, (uint64_t)i) : NAN;

  slapo_node *outs[3] = {b.y, NULL, NULL};
  int n_out = 1;
  if (c->grads) {
    slapo_node *d = slapo_input(b.ctx, "dy", SLAPO_DTYPE_F32, 1, shape);
    assert_non_null(d);
    assert_ok(slapo_backward(b.ctx, b.y, d, b.n_in, b.x, outs + 1));
    n_out += b.n_in;
  }
  slapo_output(b.ctx, n_out, outs);
  if (slapo_ctx_status(b.ctx) != SLAPO_OK)
    fail_msg("%s: %s", c->label, slapo_ctx_message(b.ctx));

  slapo_plan_opts o = {.reference = !fast};
  slapo_plan *p;
  assert_ok(slapo_plan_new(b.g, &o, &p));
  slapo_tensor *t[3] = {NULL, NULL, NULL};
  for (int j = 0; j < b.n_in; j++) {
    assert_ok(slapo_tensor_wrap(SLAPO_DTYPE_F32, 1, shape, in[j], &t[j]));
    assert_ok(slapo_plan_bind_input(p, j ? "x1" : "x0", t[j]));
  }
  if (c->grads) {
    assert_ok(slapo_tensor_wrap(SLAPO_DTYPE_F32, 1, shape, dy, &t[2]));
    assert_ok(slapo_plan_bind_input(p, "dy", t[2]));
  }
  slapo_kernel_env env = {.seed = SEED, .step = STEP, .training = true};
  assert_ok(slapo_plan_run(p, &env));

  const slapo_tensor *yt = slapo_plan_output(p, 0);
  assert_true(slapo_tensor_is_contiguous(yt));
  const float *y = slapo_tensor_data(yt);
  int bad = 0;
  for (int q = 0; q < n_jobs; q++) {
    const job *jb = &jobs[q];
    if (jb->case_i != k || jb->fast != fast) continue;
    const slapo_tensor *rt = slapo_plan_output(p, jb->which + 1);
    assert_true(slapo_tensor_is_contiguous(rt));
    const float *r = slapo_tensor_data(rt);
    int miss = 0;
    for (int i = 0; i < N; i++) {
      float a = in[0][i], bv = b.n_in == 2 ? in[1][i] : NAN;
      /* The forward sees no y or g: NaN shows a misuse. */
      float e = jb->which < 0 ? jb->fn(a, bv, NAN, NAN, u[i]) : jb->fn(a, bv, y[i], dy[i], u[i]);
      uint32_t be, br;
      memcpy(&be, &e, 4), memcpy(&br, &r[i], 4);
      bool ok = random ? be == br : same(e, r[i]);
      *exact += be == br || (isnan(e) && isnan(r[i]));
      (*total)++;
      if (!ok && miss++ < 3)
        print_message("%s which=%d%s elem %d (a=%.9g b=%.9g u=%.9g): expr %.9g, %s %.9g\n"
                      "  expr: %s\n",
                      c->label, jb->which, fast ? " (float form)" : "", i, a, bv, u[i], e,
                      fast ? "fast kernel" : "reference", r[i], jb->expr);
    }
    bad += miss;
  }
  slapo_plan_free(p);
  for (int j = 0; j < 3; j++) slapo_tensor_free(t[j]);
  built_free(&b);
  return bad;
}

static void test_compiled_matches_reference(void **state) {
  (void)state;
  if (system("cc --version >/dev/null 2>&1") != 0) {
    print_message("no `cc` on PATH: the compiled-expression check is skipped\n");
    skip();
  }
  job *jobs = calloc(N_CASES * 6, sizeof *jobs);
  assert_non_null(jobs);
  int n_jobs = 0, n_fast = 0;
  for (int k = 0; k < N_CASES; k++) {
    built b;
    build_case(&CASES[k], &b);
    for (int w = -1; w < (CASES[k].grads ? b.n_in : 0); w++) {
      job *jb = &jobs[n_jobs++];
      jb->case_i = k, jb->which = w;
      assert_true(slapo__cc_expr(b.y, w, false, jb->expr, sizeof jb->expr));
      jb = &jobs[n_jobs];
      /* The float form where it differs from the reference one (ops with
       * attributes such as add_scalar have the reference form only). */
      if (slapo__cc_expr(b.y, w, true, jb->expr, sizeof jb->expr) &&
          strcmp(jb->expr, jobs[n_jobs - 1].expr)) {
        assert_true(jb->expr[0] == '(' && jb->expr[strlen(jb->expr) - 1] == ')');
        jb->case_i = k, jb->which = w, jb->fast = true;
        n_jobs++, n_fast++;
      }
    }
    built_free(&b);
  }
  assert_true(n_fast >= 10); /* gelu (both forms), silu, sigmoid, exp, ... */

  char dir[] = "/tmp/slapo_cc_expr_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char src[256], so[256], log[256], cmd[1024];
  snprintf(src, sizeof src, "%s/exprs.c", dir);
  snprintf(so, sizeof so, "%s/exprs.so", dir);
  snprintf(log, sizeof log, "%s/cc.log", dir);
  FILE *f = fopen(src, "w");
  assert_non_null(f);
  fprintf(f, "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n%s\n",
          slapo__cc_math_src());
  for (int q = 0; q < n_jobs; q++)
    fprintf(f,
            "float e%d(float a, float b, float y, float g, float u) {\n"
            "  (void)a, (void)b, (void)y, (void)g, (void)u;\n  return %s;\n}\n",
            q, jobs[q].expr);
  assert_int_equal(fclose(f), 0);
  /* Plain C99, warnings as errors; no FMA contraction, so that the
   * expressions round like the reference kernels on any target. */
  snprintf(cmd, sizeof cmd,
           "cc -std=c99 -O2 -Wall -Wextra -Werror -ffp-contract=off -fPIC -shared -o %s %s -lm "
           ">%s 2>&1",
           so, src, log);
  int rc = system(cmd);
  if (rc != 0) {
    char text[4096] = "";
    FILE *lf = fopen(log, "r");
    if (lf) {
      size_t n = fread(text, 1, sizeof text - 1, lf);
      text[n] = '\0';
      fclose(lf);
    }
    fail_msg("compiling the expressions failed (%s):\n%s", src, text);
  }
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail_msg("dlopen %s: %s", so, dlerror());
  for (int q = 0; q < n_jobs; q++) {
    char name[32];
    snprintf(name, sizeof name, "e%d", q);
    *(void **)&jobs[q].fn = dlsym(h, name);
    assert_non_null(jobs[q].fn);
  }

  int bad = 0, exact = 0, total = 0;
  for (int k = 0; k < N_CASES; k++) bad += check_case(k, false, jobs, n_jobs, &exact, &total);
  print_message("%d reference forms, %d elements compared, %d bit-exact\n", n_jobs - n_fast, total,
                exact);
  int fexact = 0, ftotal = 0;
  for (int k = 0; k < N_CASES; k++) bad += check_case(k, true, jobs, n_jobs, &fexact, &ftotal);
  print_message("%d float forms, %d elements compared with the fast kernels, %d bit-exact\n",
                n_fast, ftotal, fexact);

  dlclose(h);
  free(jobs);
  unlink(src), unlink(so), unlink(log), rmdir(dir);
  if (bad) fail_msg("%d element(s) differ from the reference", bad);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),
      cmocka_unit_test(test_every_case_has_expressions),
      cmocka_unit_test(test_unsupported),
      cmocka_unit_test(test_compiled_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
