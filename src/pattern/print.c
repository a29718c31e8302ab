/* pattern/print.c - prints a pattern in the text grammar of parse.c, in a
 * canonical form: `let tN = ...;` for every node used more than once (by
 * pattern nodes or as a result, N counted in graph order and skipping
 * input names of that form) and for chains nested too deep for the parser
 * (199 calls), everything else inline; attributes after the
 * inputs in node order; literals and floats in the shortest text that
 * reads back to the same double. Parsing the printed text gives a pattern
 * that prints the same (inputs are then numbered by first appearance in
 * the printed text). Layer: pattern. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/internal.h"

typedef struct printer {
  const slapo_pattern *p;
  FILE *f;
  const int *let_no; /* by node id: N of `tN`, 0 for a node printed inline */
} printer;

/* The shortest %.Ng text (N = 1..17) that strtod reads back as v: 0.5,
 * 1e-05, 2000 (not 2e+03); 17 digits always read back. */
static void format_double(char buf[40], double v) {
  char t[40];
  buf[0] = '\0';
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(t, sizeof t, "%.*g", prec, v);
    if ((strtod(t, NULL) == v || prec == 17) && (!buf[0] || strlen(t) < strlen(buf)))
      memcpy(buf, t, sizeof t);
  }
}

static bool is_word(const char *s) {
  if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
  for (const char *c = s + 1; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
          *c == '_'))
      return false;
  /* These read back as something else (INT attributes, keywords). */
  return strcmp(s, "true") && strcmp(s, "false") && strcmp(s, "let") && strcmp(s, "mod");
}

/* A single-quoted string. A backslash is doubled only where the parser
 * would otherwise read it as an escape (before \ ' " or the closing
 * quote), so regexes like 'h\.0' print as written. */
static void print_quoted(FILE *f, const char *s) {
  fputc('\'', f);
  for (const char *c = s; *c; c++) {
    if (*c == '\\' && (!c[1] || strchr("\\'\"", c[1]))) fputs("\\\\", f);
    else if (*c == '\'') fputs("\\'", f);
    else fputc(*c, f);
  }
  fputc('\'', f);
}

static void print_attr(FILE *f, const slapo_attr *a) {
  char num[40];
  fprintf(f, "%s=", a->key);
  switch (a->kind) {
  case SLAPO_ATTR_INT: fprintf(f, "%" PRId64, a->i); break;
  case SLAPO_ATTR_FLOAT:
    /* A FLOAT must not read back as an INT: 1.0 prints "1.0", not "1". */
    format_double(num, a->f);
    fprintf(f, "%s%s", num, strpbrk(num, ".eEni") ? "" : ".0");
    break;
  case SLAPO_ATTR_STR:
    if (is_word(a->s)) fputs(a->s, f);
    else print_quoted(f, a->s);
    break;
  case SLAPO_ATTR_INTS:
    fputc('[', f);
    for (int i = 0; i < a->n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", a->ints[i]);
    fputc(']', f);
    break;
  }
}

static void print_expr(const printer *pr, const slapo_node *n, bool define);

static void print_inputs(const printer *pr, const slapo_node *n) {
  for (int i = 0; i < n->n_inputs; i++) {
    fputs(i ? ", " : "", pr->f);
    print_expr(pr, n->inputs[i], false);
  }
}

/* n inline, or its let name unless `define` (printing the let itself). */
static void print_expr(const printer *pr, const slapo_node *n, bool define) {
  FILE *f = pr->f;
  double v;
  if (!define && pr->let_no[n->id]) {
    fprintf(f, "t%d", pr->let_no[n->id]);
  } else if (n->kind == SLAPO_NODE_PLACEHOLDER) {
    fputs(n->target, f);
  } else if (slapo__pattern_is_literal(n, &v)) {
    char num[40];
    format_double(num, v);
    fputs(num, f);
  } else if (n->kind == SLAPO_NODE_CALL_OP) {
    fprintf(f, "%s(", n->target);
    print_inputs(pr, n);
    for (int i = 0; i < n->n_attrs; i++) {
      fputs(n->n_inputs || i ? ", " : "", f);
      print_attr(f, &n->attrs[i]);
    }
    fputc(')', f);
  } else if (n->kind == SLAPO_NODE_CALL_MODULE) {
    fputs("mod(", f);
    print_quoted(f, n->target);
    fputc(')', f);
    if (!slapo_pattern_any_inputs(pr->p, n)) {
      fputc('(', f);
      print_inputs(pr, n);
      fputc(')', f);
    }
  } else {
    /* Nodes the grammar has no form for (a getitem a pattern function
     * made): named so a reader sees what is there. */
    fprintf(f, "<%s %s>", slapo_node_kind_name(n->kind), n->name);
  }
}

/* The parser's nesting bound (parse.c MAX_DEPTH is 200): a node nested
 * LET_HEIGHT calls deep inside a user that is not the output becomes a let
 * so that the printed text parses again (results sit one level down in a
 * tuple, so at most 199 levels are printed inline). */
#define LET_HEIGHT 199

/* Whether n prints as a let: used more than once (placeholders print by
 * name anyway), or too deep to print inline under its only user. */
static bool needs_let(const slapo_node *n, int height) {
  if (n->kind == SLAPO_NODE_PLACEHOLDER) return false;
  return n->n_users > 1 ||
         (n->n_users == 1 && height >= LET_HEIGHT && n->users[0]->kind != SLAPO_NODE_OUTPUT);
}

/* Numbers the let nodes in graph order into let_no [count], skipping N
 * where an input is named tN; height and taken are [count + 1] scratch
 * (height: levels of calls printed inline below a node). */
static void number_lets(const slapo_pattern *p, int count, int *let_no, int *height,
                        int *taken) {
  for (int i = 0; i < p->n_inputs; i++) {
    const char *t = p->inputs[i]->target;
    if (t[0] != 't' || t[1] < '1' || t[1] > '9' || strspn(t + 1, "0123456789") != strlen(t + 1))
      continue;
    long k = strlen(t) < 12 ? strtol(t + 1, NULL, 10) : 0;
    if (k >= 1 && k <= count) taken[k] = 1;
  }
  int next = 1, pos = 0;
  for (const slapo_node *x = slapo_graph_first(p->g); x; x = x->next, pos++) {
    SLAPO_ASSERT(x->id == pos); /* slapo__pattern_finish renumbered */
    for (int i = 0; i < x->n_inputs; i++) {
      int in = x->inputs[i]->id, h = let_no[in] ? 1 : 1 + height[in];
      if (h > height[pos]) height[pos] = h;
    }
    if (x->kind == SLAPO_NODE_OUTPUT || !needs_let(x, height[pos])) continue;
    while (next <= count && taken[next]) next++;
    let_no[pos] = next++;
  }
}

void slapo_pattern_print(const slapo_pattern *p, FILE *f) {
  if (!p || !f) return;
  int count = slapo_graph_count(p->g);
  int *scratch = slapo_calloc(3 * ((size_t)count + 1), sizeof *scratch);
  if (!scratch) {
    fputs("<out of memory>", f);
    return;
  }
  int *let_no = scratch, *height = scratch + count + 1, *taken = scratch + 2 * (count + 1);
  number_lets(p, count, let_no, height, taken);
  printer pr = {p, f, let_no};
  for (const slapo_node *x = slapo_graph_first(p->g); x; x = x->next) {
    if (!let_no[x->id]) continue;
    fprintf(f, "let t%d = ", let_no[x->id]);
    print_expr(&pr, x, true);
    fputs("; ", f);
  }
  if (p->n_outputs > 1) fputc('(', f);
  for (int i = 0; i < p->n_outputs; i++) {
    fputs(i ? ", " : "", f);
    print_expr(&pr, p->outputs[i], false);
  }
  if (p->n_outputs > 1) fputc(')', f);
  slapo_free(scratch);
}
