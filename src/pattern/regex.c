/* pattern/regex.c - module-pattern regexes: a cheap scan that refuses the
 * regexes glibc's regcomp would spend seconds or gigabytes on (found by the
 * pattern fuzzer), and compiling with a message. Every regex a user gives
 * (text patterns, pattern functions, find --regex) goes through here.
 * Layer: pattern. */
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/internal.h"

/* glibc's regcomp copies a repetition's operand (a+ is aa*, a{m,n} n
 * copies), so nested ones multiply: ((a{99}){99}){99} is a million nodes,
 * 28 nested + a quarter billion; and its epsilon closures grow
 * exponentially with repeated operands that match the empty string
 * ((()?()?...()?)* with 22 takes seconds). Module regexes are bounded in
 * the nodes they expand to and in group nesting, may not repeat an
 * operand that matches the empty string, and have no back-references.
 * Word boundaries (\b, \B) split glibc's closures by word context: 30 of
 * them in a row take 47 MB, 40 of \b[ab]* 385 MB (growing ~2.5x every 5),
 * so a regex has at most 8 once repetitions are expanded (see
 * slapo__regex_hazard). */
#define MAX_REGEX_SIZE 1024
#define MAX_REGEX_GROUPS 64
#define MAX_REGEX_WORD_BOUNDARIES 8
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Length of the bracket expression at c ('['), up to and with its ']'
 * (a leading ']' and [:class:] [.x.] [=x=] items are part of it), or to
 * the end when it is not closed (regcomp then rejects it). */
static size_t bracket_len(const char *c) {
  size_t i = 1;
  if (c[i] == '^') i++;
  if (c[i] == ']') i++;
  while (c[i] && c[i] != ']') {
    if (c[i] == '[' && c[i + 1] && strchr(":.=", c[i + 1])) {
      char k = c[i + 1];
      i += 2;
      while (c[i] && !(c[i] == k && c[i + 1] == ']')) i++;
      if (c[i]) i += 2;
    } else {
      i++;
    }
  }
  return c[i] ? i + 1 : i;
}

/* The bound at c ('{' then a digit or ','; glibc reads a missing lower
 * bound as 0, so {,n} repeats too): *min its lower bound; returns the
 * copies regcomp makes, n for {n} and {m,n} (m when larger), m + 1 for
 * {m,}; *len its length. */
static double bound_count(const char *c, size_t *len, double *min) {
  char *end;
  double m = (double)strtol(c + 1, &end, 10), n = m;
  if (*end == ',') n = is_digit(end[1]) ? (double)strtol(end + 1, &end, 10) : m + 1;
  while (*end && *end != '}') end++;
  *len = (size_t)(end - c) + (*end == '}');
  *min = m;
  return fmax(fmax(m, n), 1);
}

/* One group while scanning a regex: node estimate and nullability (can
 * it match the empty string) of the group so far, its current branch, and
 * its last operand. */
typedef struct rx_group {
  double total, last;   /* nodes so far; nodes of the last operand */
  double wb, last_wb;   /* the same for word boundaries (\b, \B) */
  bool alt_nullable;    /* a finished branch (before '|') is nullable */
  bool seq_nullable;    /* the current branch so far is nullable */
  bool before_nullable; /* the current branch before the last operand */
  bool has_last, last_nullable;
} rx_group;

static void rx_operand(rx_group *g, double nodes, double wb, bool nullable) {
  g->total += nodes;
  g->last = nodes;
  g->wb += wb;
  g->last_wb = wb;
  g->before_nullable = g->seq_nullable;
  g->seq_nullable = g->seq_nullable && nullable;
  g->has_last = true;
  g->last_nullable = nullable;
}

/* Why glibc's regcomp could take too long or too much memory on re, or
 * NULL: an upper estimate of its nodes (an atom counts 1, a group the sum
 * of its parts, a repetition copies its operand: + twice, {m,n} max(m, n)
 * times), group nesting, a repeated operand that matches the empty
 * string (a**, (a?)+, ()?), back-references and word boundaries (counted
 * like nodes). Exact ERE syntax is regcomp's business: a malformed regex
 * only has to be scanned without harm. */
const char *slapo__regex_hazard(const char *re) {
  rx_group st[MAX_REGEX_GROUPS + 1] = {{.seq_nullable = true}};
  int d = 0;
  for (const char *c = re; *c; c++) {
    rx_group *g = &st[d];
    double copies = 0;
    size_t n = 1;
    bool optional = false;
    if (*c == '(') {
      if (++d > MAX_REGEX_GROUPS) return "groups nest deeper than " STRINGIFY(MAX_REGEX_GROUPS);
      st[d] = (rx_group){.seq_nullable = true};
      continue;
    }
    if (*c == ')' && d > 0) {
      bool nullable = g->alt_nullable || g->seq_nullable;
      double nodes = g->total + 1, wb = g->wb;
      g = &st[--d];
      rx_operand(g, nodes, wb, nullable);
    } else if (*c == '|') {
      g->alt_nullable = g->alt_nullable || g->seq_nullable;
      g->seq_nullable = true;
      g->has_last = false;
      g->total += 1;
    } else if (g->has_last && (*c == '*' || *c == '?' || *c == '+')) {
      copies = *c == '+' ? 2 : 1;
      optional = *c != '+';
    } else if (g->has_last && *c == '{' && (is_digit(c[1]) || c[1] == ',')) {
      double min;
      copies = bound_count(c, &n, &min);
      optional = min == 0;
    } else if (*c == '\\' && is_digit(c[1])) {
      /* A back-reference matches what its group did, the empty string
       * too, and glibc's matcher backtracks on them: (\b)(\b\1+()){,40}
       * compiled for 90 s. Paths never need one. */
      return "it has a back-reference (\\1 to \\9), which module regexes do not allow";
    } else if (*c == '^' || *c == '$' || (*c == '\\' && c[1] && strchr("bB<>`'", c[1]))) {
      rx_operand(g, 1, *c == '\\' && strchr("bB", c[1]), true); /* anchors match "" */
      n = *c == '\\' ? 2 : 1;
    } else {
      if (*c == '[') n = bracket_len(c);
      else if (*c == '\\' && c[1]) n = 2;
      rx_operand(g, 1, 0, false);
    }
    if (copies > 0) {
      if (g->last_nullable)
        return "it repeats an operand that matches the empty string (like a**, (a?)+ or ()?)";
      g->total += g->last * (copies - 1) + 1;
      g->last *= copies;
      g->wb += g->last_wb * (copies - 1);
      g->last_wb *= copies;
      g->last_nullable = optional;
      g->seq_nullable = g->before_nullable && optional;
    }
    if (g->wb > MAX_REGEX_WORD_BOUNDARIES)
      return "more than " STRINGIFY(MAX_REGEX_WORD_BOUNDARIES) " word boundaries (\\b, \\B) "
             "once repetitions are expanded";
    if (g->total > MAX_REGEX_SIZE)
      return "too complex (more than " STRINGIFY(MAX_REGEX_SIZE) " nodes once repetitions are "
             "expanded)";
    c += n - 1;
  }
  double total = 0;
  for (; d >= 0; d--) total += st[d].total; /* groups left open */
  return total > MAX_REGEX_SIZE ? "too complex (more than " STRINGIFY(MAX_REGEX_SIZE) " nodes)"
                                : NULL;
}


slapo_status slapo__regex_compile(const char *re, regex_t *out, const char *what) {
  const char *hazard = slapo__regex_hazard(re);
  if (hazard) return slapo_error(SLAPO_PARSE, "%s '%s': %s", what, re, hazard);
  int rc = regcomp(out, re, REG_EXTENDED);
  if (rc == 0) return SLAPO_OK;
  char why[256];
  regerror(rc, out, why, sizeof why);
  return slapo_error(SLAPO_PARSE, "%s '%s': %s", what, re, why);
}
