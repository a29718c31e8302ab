/* schedule/value.c - the value grammar of `.sched` arguments shared by the
 * parser, the log (which checks appended entries read back the same) and
 * the printer: classifying unquoted tokens as integers, decimals, booleans
 * or bare words; names; shortest round-trip float text; quoting strings.
 * Layer: schedule. Grammar: DESIGN.md §7. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule/internal.h"

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool slapo__is_word_char(char c) {
  return (unsigned char)c > ' ' && c != 0x7f && c != '"' && c != '=' && c != '#';
}

bool slapo_sched_is_name(const char *s, bool with_dot) {
  if (!is_alpha(s[0])) return false;
  for (const char *p = s + 1; *p; p++)
    if (!is_alpha(*p) && !is_digit(*p) && !(with_dot && *p == '.')) return false;
  return true;
}

/* [+-]?digits(.digits)?([eE][+-]?digits)? over the whole token; *is_float
 * says whether it has a fraction or an exponent. */
static bool is_number(const char *t, bool *is_float) {
  const char *p = t;
  *is_float = false;
  if (*p == '+' || *p == '-') p++;
  if (!is_digit(*p)) return false;
  while (is_digit(*p)) p++;
  if (*p == '.') {
    p++;
    if (!is_digit(*p)) return false;
    while (is_digit(*p)) p++;
    *is_float = true;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!is_digit(*p)) return false;
    while (is_digit(*p)) p++;
    *is_float = true;
  }
  return *p == '\0';
}

slapo__value_verdict slapo__value_classify(const char *tok, slapo_sched_arg *out) {
  out->i = 0, out->f = 0.0, out->b = false;
  const char *p = tok;
  if (*p == '+' || *p == '-') p++;
  bool numeric = is_digit(*p) || (*p == '.' && is_digit(p[1])) || (p != tok && *p == '.');
  if (!numeric) {
    if (!strcmp(tok, "true") || !strcmp(tok, "false")) {
      out->kind = SLAPO_SCHED_ARG_BOOL;
      out->b = tok[0] == 't';
    } else {
      out->kind = SLAPO_SCHED_ARG_WORD;
    }
    return SLAPO__VALUE_OK;
  }
  bool is_float;
  if (!is_number(tok, &is_float)) return SLAPO__VALUE_BAD_NUMBER;
  errno = 0;
  if (is_float) {
    out->kind = SLAPO_SCHED_ARG_FLOAT;
    out->f = strtod(tok, NULL);
    /* Underflow to a tiny or zero value is fine; overflow is not. */
    if (errno == ERANGE && isinf(out->f)) return SLAPO__VALUE_OUT_OF_RANGE;
  } else {
    out->kind = SLAPO_SCHED_ARG_INT;
    long long v = strtoll(tok, NULL, 10);
    if (errno == ERANGE) return SLAPO__VALUE_OUT_OF_RANGE;
    out->i = v;
    out->f = (double)v;
  }
  return SLAPO__VALUE_OK;
}

void slapo__format_float(double v, char *buf, size_t cap) {
  SLAPO_ASSERT(cap >= 32 && isfinite(v));
  if (!buf) return; /* (also tells GCC's -Wformat-truncation it is not NULL) */
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
}

int slapo__arg_print(const slapo_sched_arg *a, FILE *f) {
  int n = 0;
  if (a->key) n += fprintf(f, "%s=", a->key);
  if (a->kind != SLAPO_SCHED_ARG_STRING) return n + fprintf(f, "%s", a->text);
  n += fprintf(f, "\"");
  for (const char *p = a->text; *p; p++) {
    if (*p == '"' || *p == '\\') n += fprintf(f, "\\");
    fputc(*p, f);
    n++;
  }
  return n + fprintf(f, "\"");
}
