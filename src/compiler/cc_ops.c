/* compiler/cc_ops.c - what the `cc` backend generates per op: each
 * elementwise op's value and gradients as C expressions, rendered from the
 * op's math (slapo/ops/math.h), and the fast kernels' float helpers
 * (slapo/ops/vmath.h) as text for the generated source to carry.
 *
 * An expression is over `a`, `b` (the op's inputs), `y` (its value), `g`
 * (the gradient w.r.t. its value) and, for a random op, `u` (this
 * element's uniform from the op's Philox stream, as slapo_rng_uniform
 * gives it); cc_gen.c substitutes the region's names for them.
 *
 * Two renderings, as the kernels have two forms:
 *   fast  the math's float form (M = F): what the op's fast kernel
 *         computes, operation for operation; gradients as the backward
 *         rules' nodes compute them with fast kernels.
 *   ref   the double form (M = D) on the float operands, rounded once to
 *         float: what the reference kernel computes. The operands stay
 *         float, so a single +, -, *, / of two of them is float arithmetic
 *         (the same value, since one such operation of two floats is exact
 *         in double), and a double constant or libm call promotes the rest,
 *         as the reference kernels do; gradients that the rules build from
 *         f32 nodes round where those nodes round.
 * Ops without attributes (FIXED in SLAPO_EW_OPS) come from the list with no
 * edit here; ops with attributes, and dropout, are rendered below.
 * Layer: compiler. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compiler/internal.h"
#include "slapo/ops/math.h"
#include "slapo/ops/vmath.h"

const char *slapo__cc_math_src(void) { return SLAPO__CC_STR(SLAPO__VMATH_SRC); }

/* ---- text helpers ---- */

/* Room for any literal lit() writes ("(-2.2250738585072014e-308)"). */
#define LIT_CAP 40

/* v as a C double literal that reads back as v exactly: %.17g, with ".0"
 * added where it would read as an int, parenthesized when its sign bit is
 * set ("(-0.5)", "(-0.0)"). False (lit "") for inf and nan. */
static bool lit(char out[LIT_CAP], double v) {
  out[0] = '\0';
  if (!isfinite(v)) return false;
  char t[32];
  snprintf(t, sizeof t, "%.17g", v);
  snprintf(out, LIT_CAP, signbit(v) ? "(%s%s)" : "%s%s", t, strpbrk(t, ".e") ? "" : ".0");
  return true;
}

/* snprintf into buf [cap]; false when the result does not fit. */
__attribute__((format(printf, 3, 4))) static bool put(char *buf, size_t cap, const char *fmt,
                                                      ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return n >= 0 && (size_t)n < cap;
}

/* Index of the parenthesis that closes the one at e[i]; -1 when none. */
static long closing(const char *e, long i) {
  for (long depth = 0; e[i]; i++) {
    depth += e[i] == '(' ? 1 : e[i] == ')' ? -1 : 0;
    if (depth == 0) return i;
  }
  return -1;
}

/* e with the parentheses its expansion doubled taken off, and the rounding
 * of one operand ("((float)(g))": it is a float already) as well: "((g))"
 * is "(g)", the form cc_gen recognises as the gradient passed through. */
static bool put_form(char *buf, size_t cap, const char *e) {
  static const char cast[] = "((float)(";
  size_t k = sizeof cast - 1;
  if (!strncmp(e, cast, k) && strlen(e) == k + 3 && e[k + 1] == ')' && e[k + 2] == ')')
    return put(buf, cap, "(%c)", e[k]);
  long n = (long)strlen(e);
  while (n >= 4 && e[0] == '(' && e[1] == '(' && closing(e, 0) == n - 1 && closing(e, 1) == n - 2)
    e++, n -= 2;
  return put(buf, cap, "%.*s", (int)n, e);
}

/* tmpl with every P_ replaced by p (the attribute's literal); false when
 * the result does not fit. */
static bool put_p(char *buf, size_t cap, const char *tmpl, const char *p) {
  size_t n = 0, lp = strlen(p);
  for (const char *s = tmpl; *s;) {
    bool hit = s[0] == 'P' && s[1] == '_';
    size_t k = hit ? lp : 1;
    if (n + k >= cap) return false;
    memcpy(buf + n, hit ? p : s, k);
    n += k, s += hit ? 2 : 1;
  }
  buf[n] = '\0';
  return true;
}

/* The attribute `key` of node as a number and its literal; false when it
 * is missing, not a number or not finite. */
static bool attr_lit(const slapo_node *node, const char *key, double *v, char out[LIT_CAP]) {
  const slapo_attr *at = slapo_node_attr(node, key);
  if (!at || (at->kind != SLAPO_ATTR_FLOAT && at->kind != SLAPO_ATTR_INT)) return false;
  *v = at->kind == SLAPO_ATTR_FLOAT ? at->f : (double)at->i;
  return lit(out, *v);
}

/* ---- ops without attributes, from the list ---- */

#define STR SLAPO__CC_STR
#define FAST(...) "(" STR(__VA_ARGS__) ")"
#define REF(...) "((float)" STR(__VA_ARGS__) ")"
#define VAL1_(M, op) SLAPO_EW_##op(M, a)
#define VAL2_(M, op) SLAPO_EW_##op(M, a, b)
#define GRAD_(M, op, i) SLAPO_EW_##op##_grad##i(M, a, b, y, g)
#define GRADS0_(op) {{NULL, NULL}, {NULL, NULL}}
#define GRADS1_(op) {{FAST(GRAD_(F, op, 0)), REF(GRAD_(D, op, 0))}, {NULL, NULL}}
#define GRADS2_(op)                                                            \
  {{FAST(GRAD_(F, op, 0)), REF(GRAD_(D, op, 0))}, {FAST(GRAD_(F, op, 1)), REF(GRAD_(D, op, 1))}}
#define ROW_FIXED(op, n, grads)                                                \
  {#op, {FAST(VAL##n##_(F, op)), REF(VAL##n##_(D, op))}, GRADS##grads##_(op)},
#define ROW_ATTR(op, n, grads)
#define ROW_(op, n, grads, form) ROW_##form(op, n, grads)

typedef struct fixed_form {
  const char *op;
  const char *val[2];     /* [fast, ref] */
  const char *grad[2][2]; /* [input][fast, ref]; NULL: no gradient */
} fixed_form;

static const fixed_form FIXED[] = {SLAPO_EW_OPS(ROW_)};

static const fixed_form *fixed_of(const char *op) {
  for (size_t i = 0; i < sizeof FIXED / sizeof FIXED[0]; i++)
    if (!strcmp(FIXED[i].op, op)) return &FIXED[i];
  return NULL;
}

/* ---- ops with attributes ---- */

static bool add_scalar_cc(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  double v;
  char V[LIT_CAP];
  if (!attr_lit(node, "value", &v, V)) return false;
  (void)fast; /* x + (float)p and (double)x + p differ: the reference form serves both */
  if (which == -1) return put_p(buf, cap, REF(SLAPO_EW_add_scalar(D, a, P_)), V);
  return which == 0 && put(buf, cap, "(g)");
}

static bool mul_scalar_cc(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  double v;
  char V[LIT_CAP];
  if (!attr_lit(node, "value", &v, V)) return false;
  (void)fast;
  if (which == -1) return put_p(buf, cap, REF(SLAPO_EW_mul_scalar(D, a, P_)), V);
  return which == 0 && put_p(buf, cap, REF(SLAPO_EW_mul_scalar(D, g, P_)), V);
}

/* The gradient as pow's backward rule builds it: g * (x^(p-1) * p), with
 * p = 0, 1, 2 as the rule's special cases. */
static bool pow_cc(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  double p;
  char P[LIT_CAP], PM1[LIT_CAP], t[2 * LIT_CAP + 64];
  if (!attr_lit(node, "exponent", &p, P)) return false;
  (void)fast;
  if (which == -1) return put_p(buf, cap, REF(SLAPO_EW_pow(D, a, P_)), P);
  if (which != 0) return false;
  if (p == 0.0) return put(buf, cap, "((float)((double)g * 0.0))");
  if (p == 1.0) return put(buf, cap, "(g)");
  if (p == 2.0) return put(buf, cap, "(g * (float)((double)a * 2.0))");
  return lit(PM1, p - 1.0) && put_p(t, sizeof t, REF(SLAPO_EW_pow(D, a, P_)), PM1) &&
         put(buf, cap, "(g * (float)((double)%s * %s))", t, P);
}

/* gelu's "approximate": 1 tanh, 0 none (the default), -1 another value. */
static int gelu_tanh_of(const slapo_node *node) {
  const slapo_attr *at = slapo_node_attr(node, "approximate");
  if (!at) return 0;
  if (at->kind != SLAPO_ATTR_STR) return -1;
  return !strcmp(at->s, "tanh") ? 1 : !strcmp(at->s, "none") ? 0 : -1;
}

/* gelu's value (which -1) and gradient (0), gelu_backward's value (-1):
 * [tanh][kind][fast, ref], kind 0 gelu, 1 its gradient, 2 gelu_backward. */
static const char *const GELU[2][3][2] = {
    {{FAST(SLAPO_EW_gelu_erf(F, a)), REF(SLAPO_EW_gelu_erf(D, a))},
     {FAST(SLAPO_EW_gelu_erf_backward(F, a, g)), REF(SLAPO_EW_gelu_erf_backward(D, a, g))},
     {FAST(SLAPO_EW_gelu_erf_backward(F, a, b)), REF(SLAPO_EW_gelu_erf_backward(D, a, b))}},
    {{FAST(SLAPO_EW_gelu_tanh(F, a)), REF(SLAPO_EW_gelu_tanh(D, a))},
     {FAST(SLAPO_EW_gelu_tanh_backward(F, a, g)), REF(SLAPO_EW_gelu_tanh_backward(D, a, g))},
     {FAST(SLAPO_EW_gelu_tanh_backward(F, a, b)), REF(SLAPO_EW_gelu_tanh_backward(D, a, b))}},
};

static bool gelu_cc(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  int t = gelu_tanh_of(node);
  return t >= 0 && (which == -1 || which == 0) && put_form(buf, cap, GELU[t][which == 0][!fast]);
}

static bool gelu_backward_cc(const slapo_node *node, int which, bool fast, char *buf,
                             size_t cap) {
  int t = gelu_tanh_of(node);
  return t >= 0 && which == -1 && put_form(buf, cap, GELU[t][2][!fast]);
}

/* dropout: dropout_ref's keep test and scale on this element's uniform u,
 * over a (forward) or g (the backward re-applies the mask); the identity
 * when p == 0. Whether the run trains is the backend's to decide. Sharded
 * offsets (offset != 0) are not supported yet.
 * The test is in float, exactly dropout_ref's (double)u >= p: u = k * 2^-24
 * for an integer k < 2^24, so u >= p iff k >= T = ceil(p * 2^24) (as the
 * fast kernel decides) iff u >= T * 2^-24, a float (T <= 2^24), written as
 * a hex literal, exact. The kept value is selected before the scale,
 * slapo__keep(v, kept) * s (v or +0, slapo/ops/vmath.h), which equals
 * kept ? v * s : 0 (s >= 1, or 0 for p = 1; +0 * s is +0), so no
 * floating-point operation is conditional and the loop vectorizes. Both
 * renderings are this one: it is exact. */
static bool dropout_cc(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  (void)fast;
  if (which != -1 && which != 0) return false;
  const char *v = which == -1 ? "a" : "g";
  double p = slapo_node_attr_float(node, "p", 0.0);
  char P[LIT_CAP], S[LIT_CAP + 32];
  if (slapo_node_attr_int(node, "offset", 0) != 0 ||
      slapo_node_attr_int(node, "shard_dim", -1) >= 0 || !lit(P, p))
    return false;
  if (p == 0) return put(buf, cap, "(%s)", v);
  /* The scale exactly as the kernel computes it. */
  if (p < 1) snprintf(S, sizeof S, "(float)(1.0 / (1.0 - %s))", P);
  else snprintf(S, sizeof S, "0.0f");
  float t = (float)(ceil(p * 16777216.0) / 16777216.0);
  return put(buf, cap, "(slapo__keep(%s, u >= %af) * %s)", v, (double)t, S);
}

typedef bool (*render_fn)(const slapo_node *node, int which, bool fast, char *buf, size_t cap);

static const struct {
  const char *op;
  render_fn fn;
} BY_HAND[] = {
    {"add_scalar", add_scalar_cc}, {"mul_scalar", mul_scalar_cc}, {"pow", pow_cc},
    {"gelu", gelu_cc},             {"gelu_backward", gelu_backward_cc},
    {"dropout", dropout_cc},
};

static render_fn by_hand_of(const char *op) {
  for (size_t i = 0; i < sizeof BY_HAND / sizeof BY_HAND[0]; i++)
    if (!strcmp(BY_HAND[i].op, op)) return BY_HAND[i].fn;
  return NULL;
}

/* ---- the entry points ---- */

bool slapo__cc_renders(const slapo_op *op) {
  return op && op->elementwise && (fixed_of(op->name) || by_hand_of(op->name));
}

bool slapo__cc_expr(const slapo_node *node, int which, bool fast, char *buf, size_t cap) {
  if (!node->op || which < -1 || which >= node->n_inputs) return false;
  render_fn fn = by_hand_of(node->op->name);
  if (fn) return fn(node, which, fast, buf, cap);
  const fixed_form *f = fixed_of(node->op->name);
  if (!f) return false;
  const char *e = which == -1 ? f->val[!fast] : which < 2 ? f->grad[which][!fast] : NULL;
  return e && put_form(buf, cap, e);
}
