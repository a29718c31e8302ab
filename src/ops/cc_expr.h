/* ops/cc_expr.h - helpers for the ops' cc_expr callbacks (slapo_op.cc_expr:
 * C expressions for the `cc` fusion backend): double literals, bounded
 * formatting, a generator for ops without attributes, and the fast
 * kernels' helpers as text for the float forms (cc_expr_fast).
 * Layer: ops (internal). */
#ifndef SLAPO_OPS_CC_EXPR_H
#define SLAPO_OPS_CC_EXPR_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The fast kernels' scalar float helpers (ops/vmath.h: slapo__gelu_tanh,
 * slapo__gelu_tanh_grad, slapo__exp_bounded_f, ...) as one line of C that
 * needs <stdint.h> and <string.h>; the cc backend pastes it into a
 * generated source whose expressions call them (ops/cc_math.c). Static. */
const char *slapo__cc_math_src(void);

/* Room for any literal cc_lit writes ("(-2.2250738585072014e-308)"). */
#define CC_LIT_CAP 40

/* v as a C double literal that reads back as v exactly: %.17g, with ".0"
 * added where it would read as an int, parenthesized when its sign bit is
 * set ("(-0.5)", "(-0.0)"). False (lit "") for inf and nan. */
static inline bool cc_lit(char lit[CC_LIT_CAP], double v) {
  lit[0] = '\0';
  if (!isfinite(v)) return false;
  char t[32];
  snprintf(t, sizeof t, "%.17g", v);
  snprintf(lit, CC_LIT_CAP, signbit(v) ? "(%s%s)" : "%s%s", t, strpbrk(t, ".e") ? "" : ".0");
  return true;
}

/* snprintf into buf [cap]; false when the result does not fit. */
__attribute__((format(printf, 3, 4))) static inline bool cc_put(char *buf, size_t cap,
                                                                const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  return n >= 0 && (size_t)n < cap;
}

/* NAME_cc for an op without attributes: FWD for which = -1, G0 / G1 for the
 * gradients w.r.t. inputs 0 / 1 (NULL: the op has none). */
#define CC_EXPR_FIXED(NAME, FWD, G0, G1)                                       \
  static bool NAME##_cc(const slapo_node *node, int which, char *buf, size_t cap) { \
    (void)node;                                                                \
    const char *e = which == -1 ? (FWD) : which == 0 ? (G0) : which == 1 ? (G1) : NULL; \
    return e && cc_put(buf, cap, "%s", e);                                     \
  }

#endif
