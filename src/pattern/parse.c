/* pattern/parse.c - text patterns: a recursive-descent parser from the
 * function-call form (`gelu(add(matmul(x, w), b))`) to a pattern graph.
 * Layer: pattern.
 *
 * Grammar (whitespace - space, tab, CR, LF - is free between tokens):
 *   pattern := { 'let' NAME '=' expr ';' } result
 *   result  := expr | '(' expr ',' expr { ',' expr } ')'
 *   expr    := NAME '(' [ arg { ',' arg } ] ')'      op call, NAME from the
 *                                                     op registry
 *            | 'mod' '(' STRING ')' [ '(' [ expr { ',' expr } ] ')' ]
 *                                                     module pattern:
 *                                                     uncalled / called
 *            | NAME                                   a let name, else a
 *                                                     placeholder
 *            | NUMBER                                 a literal
 *   arg     := expr | NAME '=' value                  attributes may come
 *                                                     after or among inputs
 *   value   := NAME                                   STR ('true'/'false':
 *                                                     INT 1/0)
 *            | NUMBER                                 INT when written
 *                                                     without '.' or an
 *                                                     exponent, else FLOAT
 *            | STRING                                 STR
 *            | '[' [ INT { ',' INT } ] ']'            INTS
 *   NAME    := [A-Za-z_][A-Za-z0-9_]*   ('let' and 'mod' are keywords)
 *   NUMBER  := [+-]? (D+ ['.' D*] | '.' D+) [ [eE] [+-]? D+ ]
 *   STRING  := '...' or "..."; \\ \' \" are escapes, any other backslash
 *              stands for itself (so regexes read naturally: mod('h\.0'))
 * A result must be an op call or a module pattern (a bare name or number
 * would match anything). Placeholders are numbered by first appearance:
 * each is created when its name first appears, before the node using it.
 * A let must come before its uses, may not redefine a name, and must be
 * used. A module regex must compile (regcomp, REG_EXTENDED) and stay cheap
 * to compile (at most 1024 nodes with repetitions expanded, groups 64 deep,
 * no repeated operand that matches the empty string). Columns in messages
 * are 1-based byte offsets into the whole text. Texts are bounded (64 KiB)
 * and so is nesting (200 calls deep), so no input can exhaust the stack. */
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/internal.h"
#include "slapo/ops.h"

#define MAX_TEXT (64 * 1024)
#define MAX_DEPTH 200

typedef enum tok_kind { T_END, T_NAME, T_NUMBER, T_STRING, T_PUNCT } tok_kind;

typedef struct token {
  tok_kind kind;
  size_t at, len; /* byte offset and length in the text */
} token;

/* What a name stands for: a placeholder or a let-bound node. */
typedef struct binding {
  bool is_let;
  bool used;       /* lets: referenced at least once */
  size_t at;       /* a let's name, or a placeholder's first appearance */
  slapo_node *node;
} binding;

typedef struct parser {
  const char *s;
  size_t len;
  token tok;         /* the current token */
  slapo_pattern *p;
  slapo_arena *a;    /* scratch: names, arrays, bindings, message pieces */
  slapo_map *names;  /* name -> binding, in order of first appearance */
  const char *shown; /* the text as messages show it */
} parser;

/* Growable arrays of call arguments, kept in the scratch arena. */
typedef struct args {
  slapo_node **in;
  int n_in, cap_in;
  slapo_attr *attrs;
  int n_attrs, cap_attrs;
} args;

static slapo_status nomem(void) { return slapo_error(SLAPO_NOMEM, "pattern: out of memory"); }

/* ---- messages ---- */

/* s[0, n) for a message: control and non-ASCII bytes as \xNN, cut after
 * `max` bytes with "...". Arena text, NULL without memory. */
static char *escaped(parser *ps, const char *s, size_t n, size_t max) {
  size_t k = n < max ? n : max;
  char *t = slapo_arena_alloc(ps->a, 4 * k + 4, 1);
  if (!t) return NULL;
  size_t j = 0;
  for (size_t i = 0; i < k; i++) {
    unsigned char b = (unsigned char)s[i];
    if (b < ' ' || b >= 0x7f) j += (size_t)snprintf(t + j, 5, "\\x%02x", (unsigned)b);
    else t[j++] = (char)b;
  }
  if (k < n) memcpy(t + j, "...", 3), j += 3;
  t[j] = '\0';
  return t;
}

/* escaped(), or "?" without memory (messages are best effort). */
static const char *show(parser *ps, const char *s, size_t n, size_t max) {
  const char *t = escaped(ps, s, n, max);
  return t ? t : "?";
}

static slapo_status err_at(parser *ps, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static slapo_status err_at(parser *ps, size_t at, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return slapo_error(SLAPO_PARSE, "pattern '%s': column %zu: %s", ps->shown, at + 1, msg);
}

static bool tok_text_is(const parser *ps, const token *t, const char *w) {
  size_t n = strlen(w);
  return t->len == n && !memcmp(ps->s + t->at, w, n);
}

static bool is_keyword(const parser *ps, const token *t) {
  return t->kind == T_NAME && (tok_text_is(ps, t, "let") || tok_text_is(ps, t, "mod"));
}

/* The current token, for "got ...". */
static const char *got(parser *ps) {
  const token *t = &ps->tok;
  if (t->kind == T_END) return "end of pattern";
  const char *text = show(ps, ps->s + t->at, t->len, 40);
  const char *fmt = t->kind == T_STRING ? "the string %s" : is_keyword(ps, t) ? "keyword '%s'"
                                                                             : "'%s'";
  char *g = slapo_arena_printf(ps->a, fmt, text);
  return g ? g : text;
}

static slapo_status expected(parser *ps, const char *what) {
  return err_at(ps, ps->tok.at, "expected %s, got %s", what, got(ps));
}

/* ---- lexer ---- */

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Length of the NUMBER at s, 0 when none starts there. */
static size_t number_len(const char *s) {
  size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0, d = i;
  while (is_digit(s[i])) i++;
  bool int_digits = i > d;
  if (s[i] == '.' && (int_digits || is_digit(s[i + 1]))) {
    i++;
    while (is_digit(s[i])) i++;
  } else if (!int_digits) {
    return 0;
  }
  if (s[i] == 'e' || s[i] == 'E') {
    size_t j = i + 1 + (s[i + 1] == '+' || s[i + 1] == '-');
    if (is_digit(s[j])) {
      while (is_digit(s[j])) j++;
      i = j;
    }
  }
  return i;
}

/* A STRING at `at` (its quote): checks that it is closed. */
static slapo_status string_len(parser *ps, size_t at, size_t *len) {
  char q = ps->s[at];
  size_t i = at + 1;
  while (i < ps->len && ps->s[i] != q) i += (ps->s[i] == '\\' && i + 1 < ps->len) ? 2 : 1;
  if (i >= ps->len)
    return err_at(ps, ps->len, "expected %c to close the string at column %zu, got end of pattern",
                  q, at + 1);
  *len = i + 1 - at;
  return SLAPO_OK;
}

/* Reads the token starting at or after byte `at` into ps->tok. Any other
 * character becomes a one-byte punctuation token, which the parser then
 * reports as unexpected with what it expected there. */
static slapo_status lex(parser *ps, size_t at) {
  while (at < ps->len && is_space(ps->s[at])) at++;
  token *t = &ps->tok;
  t->at = at;
  t->len = 0;
  if (at >= ps->len) {
    t->kind = T_END;
    return SLAPO_OK;
  }
  const char *c = ps->s + at;
  size_t n;
  if (is_alpha(*c)) {
    n = 1;
    while (is_alpha(c[n]) || is_digit(c[n])) n++;
    t->kind = T_NAME;
    t->len = n;
  } else if ((n = number_len(c)) > 0) {
    t->kind = T_NUMBER;
    t->len = n;
  } else if (*c == '\'' || *c == '"') {
    t->kind = T_STRING;
    return string_len(ps, at, &t->len);
  } else {
    t->kind = T_PUNCT;
    t->len = 1;
  }
  return SLAPO_OK;
}

static slapo_status advance(parser *ps) { return lex(ps, ps->tok.at + ps->tok.len); }

static bool at_punct(const parser *ps, char c) {
  return ps->tok.kind == T_PUNCT && ps->s[ps->tok.at] == c;
}

/* Consumes punctuation c, else reports "expected <what>". */
static slapo_status eat(parser *ps, char c, const char *what) {
  if (!at_punct(ps, c)) return expected(ps, what);
  return advance(ps);
}

/* The kind of the token after the current one (the parser's one lookahead:
 * NAME '(' is a call, NAME '=' an attribute). */
static slapo_status peek_punct(parser *ps, char *c) {
  token save = ps->tok;
  slapo_status s = advance(ps);
  *c = s == SLAPO_OK && ps->tok.kind == T_PUNCT ? ps->s[ps->tok.at] : '\0';
  ps->tok = save;
  return s;
}

/* The current token's text, NUL-terminated, in the arena. */
static char *tok_text(parser *ps) {
  char *t = slapo_arena_alloc(ps->a, ps->tok.len + 1, 1);
  if (t) memcpy(t, ps->s + ps->tok.at, ps->tok.len);
  return t;
}

/* The current STRING's value (escapes resolved), in the arena. */
static char *string_value(parser *ps) {
  const char *c = ps->s + ps->tok.at + 1;
  size_t n = ps->tok.len - 2;
  char *v = slapo_arena_alloc(ps->a, n + 1, 1);
  if (!v) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (c[i] == '\\' && i + 1 < n && strchr("\\'\"", c[i + 1])) i++;
    v[k++] = c[i];
  }
  v[k] = '\0';
  return v;
}

/* ---- values ---- */

static bool grow(parser *ps, void **arr, int *cap, int n, size_t elem) {
  if (n < *cap) return true;
  int cap2 = *cap ? 2 * *cap : 4;
  void *a = slapo_arena_alloc(ps->a, (size_t)cap2 * elem, 0);
  if (!a) return false;
  if (n) memcpy(a, *arr, (size_t)n * elem);
  *arr = a;
  *cap = cap2;
  return true;
}

static bool number_is_integral(const parser *ps) {
  for (size_t i = 0; i < ps->tok.len; i++)
    if (strchr(".eE", ps->s[ps->tok.at + i])) return false;
  return true;
}

/* The current NUMBER as an int64 (it must be integral and in range). */
static slapo_status int_value(parser *ps, int64_t *v) {
  if (ps->tok.kind != T_NUMBER || !number_is_integral(ps)) return expected(ps, "an integer");
  char *t = tok_text(ps);
  if (!t) return nomem();
  errno = 0;
  long long x = strtoll(t, NULL, 10);
  if (errno == ERANGE) return expected(ps, "a 64-bit integer");
  *v = (int64_t)x;
  return advance(ps);
}

/* The current NUMBER as a finite double. */
static slapo_status float_value(parser *ps, double *v) {
  char *t = tok_text(ps);
  if (!t) return nomem();
  *v = strtod(t, NULL);
  if (!isfinite(*v)) return expected(ps, "a finite number");
  return advance(ps);
}

/* '[' [ INT { ',' INT } ] ']' at the current '['. */
static slapo_status ints_value(parser *ps, slapo_attr *a) {
  SLAPO_TRY(advance(ps));
  int64_t *v = NULL;
  int n = 0, cap = 0;
  if (!at_punct(ps, ']')) {
    for (;;) {
      if (!grow(ps, (void **)&v, &cap, n, sizeof *v)) return nomem();
      SLAPO_TRY(int_value(ps, &v[n]));
      n++;
      if (at_punct(ps, ']')) break;
      SLAPO_TRY(eat(ps, ',', "',' or ']'"));
    }
  }
  a->kind = SLAPO_ATTR_INTS;
  a->n = n;
  a->ints = v;
  return advance(ps);
}

/* An attribute's value; the key is set by the caller. */
static slapo_status parse_value(parser *ps, slapo_attr *a) {
  if (ps->tok.kind == T_NAME) {
    bool t = tok_text_is(ps, &ps->tok, "true"), f = tok_text_is(ps, &ps->tok, "false");
    if (t || f) {
      a->kind = SLAPO_ATTR_INT;
      a->i = t;
    } else {
      a->kind = SLAPO_ATTR_STR;
      if (!(a->s = tok_text(ps))) return nomem();
    }
    return advance(ps);
  }
  if (ps->tok.kind == T_NUMBER && number_is_integral(ps)) {
    a->kind = SLAPO_ATTR_INT;
    return int_value(ps, &a->i);
  }
  if (ps->tok.kind == T_NUMBER) {
    a->kind = SLAPO_ATTR_FLOAT;
    return float_value(ps, &a->f);
  }
  if (ps->tok.kind == T_STRING) {
    a->kind = SLAPO_ATTR_STR;
    if (!(a->s = string_value(ps))) return nomem();
    return advance(ps);
  }
  if (at_punct(ps, '[')) return ints_value(ps, a);
  return expected(ps, "a value (a word, a number, true/false, a string or [ints])");
}

/* ---- expressions ---- */

static slapo_status parse_expr(parser *ps, int depth, slapo_node **out);

/* NAME '=' value at the current NAME, appended to `as` unless the call
 * already has that attribute. */
static slapo_status parse_attr(parser *ps, args *as) {
  size_t at = ps->tok.at;
  char *key = tok_text(ps);
  if (!key) return nomem();
  for (int i = 0; i < as->n_attrs; i++)
    if (!strcmp(as->attrs[i].key, key)) return err_at(ps, at, "duplicate attribute '%s'", key);
  SLAPO_TRY(advance(ps));
  SLAPO_TRY(eat(ps, '=', "'='"));
  if (!grow(ps, (void **)&as->attrs, &as->cap_attrs, as->n_attrs, sizeof *as->attrs))
    return nomem();
  slapo_attr *a = &as->attrs[as->n_attrs];
  *a = (slapo_attr){.key = key};
  SLAPO_TRY(parse_value(ps, a));
  as->n_attrs++;
  return SLAPO_OK;
}

/* '(' [ arg { ',' arg } ] ')' at the current '('; attributes only when
 * `with_attrs` (op calls; a module call takes inputs only). */
static slapo_status parse_args(parser *ps, int depth, bool with_attrs, args *as) {
  SLAPO_TRY(eat(ps, '(', "'('"));
  if (at_punct(ps, ')')) return advance(ps);
  for (;;) {
    char next = '\0';
    if (with_attrs && ps->tok.kind == T_NAME) SLAPO_TRY(peek_punct(ps, &next));
    if (next == '=') {
      SLAPO_TRY(parse_attr(ps, as));
    } else {
      if (!grow(ps, (void **)&as->in, &as->cap_in, as->n_in, sizeof *as->in)) return nomem();
      SLAPO_TRY(parse_expr(ps, depth + 1, &as->in[as->n_in]));
      as->n_in++;
    }
    if (at_punct(ps, ')')) return advance(ps);
    SLAPO_TRY(eat(ps, ',', "',' or ')'"));
  }
}

/* NAME '(' ... ')' at the current NAME: an op call. */
static slapo_status parse_call(parser *ps, int depth, slapo_node **out) {
  size_t at = ps->tok.at;
  char *name = tok_text(ps);
  if (!name) return nomem();
  const slapo_op *op = slapo_op_find(name);
  if (!op) return err_at(ps, at, "unknown op '%s'", name);
  SLAPO_TRY(advance(ps));
  args as = {0};
  SLAPO_TRY(parse_args(ps, depth, true, &as));
  if (op->n_inputs >= 0 && as.n_in != op->n_inputs)
    return err_at(ps, at, "%s takes %d input%s, got %d", op->name, op->n_inputs,
                  op->n_inputs == 1 ? "" : "s", as.n_in);
  if (op->n_inputs < 0 && as.n_in < 1)
    return err_at(ps, at, "%s takes at least 1 input, got 0", op->name);
  return slapo_graph_add_call_op(ps->p->g, op->name, op, as.n_in, as.in, as.n_attrs, as.attrs,
                                 out);
}

/* Checks that the module regex compiles as regcomp will see it in the
 * matcher; `at` is its string's column. */
static slapo_status check_regex(parser *ps, size_t at, const char *re) {
  const char *shape = slapo__regex_hazard(re);
  if (shape)
    return err_at(ps, at, "bad module regex '%s': %s", show(ps, re, strlen(re), 80), shape);
  regex_t rx;
  int rc = regcomp(&rx, re, REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char why[256];
    regerror(rc, &rx, why, sizeof why);
    return err_at(ps, at, "bad module regex '%s': %s", show(ps, re, strlen(re), 80), why);
  }
  regfree(&rx);
  return SLAPO_OK;
}

/* 'mod' '(' STRING ')' [ '(' inputs ')' ] at the current 'mod'. */
static slapo_status parse_mod(parser *ps, int depth, slapo_node **out) {
  SLAPO_TRY(advance(ps));
  SLAPO_TRY(eat(ps, '(', "'(' after mod"));
  if (ps->tok.kind != T_STRING) return expected(ps, "a quoted module regex");
  size_t at = ps->tok.at;
  char *re = string_value(ps);
  if (!re) return nomem();
  SLAPO_TRY(check_regex(ps, at, re));
  SLAPO_TRY(advance(ps));
  SLAPO_TRY(eat(ps, ')', "')'"));
  if (!at_punct(ps, '(')) {
    SLAPO_TRY(slapo_graph_add_call_module(ps->p->g, re, 0, NULL, out));
    return slapo__pattern_mark_any(ps->p, *out);
  }
  args as = {0};
  SLAPO_TRY(parse_args(ps, depth, false, &as));
  return slapo_graph_add_call_module(ps->p->g, re, as.n_in, as.in, out);
}

/* A NAME not followed by '(': its let, else its placeholder (created on
 * first appearance, so placeholders are numbered by it). */
static slapo_status parse_name(parser *ps, slapo_node **out) {
  char *name = tok_text(ps);
  if (!name) return nomem();
  binding *b = slapo_map_get(ps->names, name);
  if (!b) {
    b = slapo_arena_alloc(ps->a, sizeof *b, 0);
    if (!b) return nomem();
    *b = (binding){.at = ps->tok.at};
    SLAPO_TRY(slapo_graph_add_placeholder(ps->p->g, name, SLAPO_DTYPE_F32, 0, NULL, &b->node));
    SLAPO_TRY(slapo_map_set(ps->names, name, b));
  }
  b->used = true;
  *out = b->node;
  return advance(ps);
}

static slapo_status parse_expr(parser *ps, int depth, slapo_node **out) {
  if (depth > MAX_DEPTH)
    return err_at(ps, ps->tok.at, "pattern nests deeper than %d", MAX_DEPTH);
  if (ps->tok.kind == T_NUMBER) {
    double v;
    SLAPO_TRY(float_value(ps, &v));
    return slapo__pattern_literal(ps->p, v, out);
  }
  if (ps->tok.kind != T_NAME || tok_text_is(ps, &ps->tok, "let"))
    return expected(ps, "an expression");
  if (tok_text_is(ps, &ps->tok, "mod")) return parse_mod(ps, depth, out);
  char next;
  SLAPO_TRY(peek_punct(ps, &next));
  return next == '(' ? parse_call(ps, depth, out) : parse_name(ps, out);
}

/* ---- pattern ---- */

/* 'let' NAME '=' expr ';' at the current 'let'. */
static slapo_status parse_let(parser *ps) {
  SLAPO_TRY(advance(ps));
  if (ps->tok.kind != T_NAME || is_keyword(ps, &ps->tok)) return expected(ps, "a name after let");
  size_t at = ps->tok.at;
  char *name = tok_text(ps);
  if (!name) return nomem();
  SLAPO_TRY(advance(ps));
  SLAPO_TRY(eat(ps, '=', "'='"));
  slapo_node *v;
  SLAPO_TRY(parse_expr(ps, 0, &v));
  /* Checked after the value, which may itself use the name (let a =
   * relu(a) makes `a` an input first): a let must precede every use. */
  const binding *old = slapo_map_get(ps->names, name);
  if (old && old->is_let)
    return err_at(ps, at, "let '%s' is already defined at column %zu", name, old->at + 1);
  if (old)
    return err_at(ps, at, "let '%s' comes after a use of '%s' at column %zu; a let must "
                          "precede its uses", name, name, old->at + 1);
  SLAPO_TRY(eat(ps, ';', "';'"));
  binding *b = slapo_arena_alloc(ps->a, sizeof *b, 0);
  if (!b) return nomem();
  *b = (binding){.is_let = true, .at = at, .node = v};
  return slapo_map_set(ps->names, name, b);
}

/* One result: an expression that constrains something (a bare wildcard
 * or number would match every value). */
static slapo_status parse_one_result(parser *ps, int depth, slapo_node **out) {
  token at = ps->tok;
  SLAPO_TRY(parse_expr(ps, depth, out));
  bool wildcard = (*out)->kind == SLAPO_NODE_PLACEHOLDER;
  if (!wildcard && !slapo__pattern_is_literal(*out, NULL)) return SLAPO_OK;
  ps->tok = at; /* for got() and the column */
  return err_at(ps, at.at, "expected an op call or a module pattern as a result, got the %s %s",
                wildcard ? "wildcard" : "number", got(ps));
}

/* result := expr | '(' expr ',' expr { ',' expr } ')' */
static slapo_status parse_result(parser *ps, slapo_node ***outs, int *n) {
  args as = {0};
  bool tuple = at_punct(ps, '(');
  if (tuple) SLAPO_TRY(advance(ps));
  for (;;) {
    if (!grow(ps, (void **)&as.in, &as.cap_in, as.n_in, sizeof *as.in)) return nomem();
    SLAPO_TRY(parse_one_result(ps, tuple, &as.in[as.n_in]));
    as.n_in++;
    if (!tuple) break;
    if (as.n_in >= 2 && at_punct(ps, ')')) {
      SLAPO_TRY(advance(ps));
      break;
    }
    SLAPO_TRY(eat(ps, ',', as.n_in >= 2 ? "',' or ')'" : "','"));
  }
  *outs = as.in;
  *n = as.n_in;
  return SLAPO_OK;
}

static slapo_status check_lets_used(parser *ps) {
  size_t n = slapo_map_count(ps->names);
  for (size_t i = 0; i < n; i++) {
    const binding *b = slapo_map_value_at(ps->names, i);
    if (b->is_let && !b->used)
      return err_at(ps, b->at, "let '%s' is never used", slapo_map_key_at(ps->names, i));
  }
  return SLAPO_OK;
}

static slapo_status parse_pattern(parser *ps) {
  SLAPO_TRY(lex(ps, 0));
  while (ps->tok.kind == T_NAME && tok_text_is(ps, &ps->tok, "let")) SLAPO_TRY(parse_let(ps));
  slapo_node **outs = NULL;
  int n = 0;
  SLAPO_TRY(parse_result(ps, &outs, &n));
  if (ps->tok.kind != T_END) return expected(ps, "end of pattern");
  SLAPO_TRY(check_lets_used(ps));
  return slapo__pattern_finish(ps->p, n, outs);
}

slapo_status slapo_pattern_parse(const char *text, slapo_pattern **out) {
  if (!out) return slapo_error(SLAPO_INVALID_ARG, "pattern_parse: NULL out");
  *out = NULL;
  if (!text) return slapo_error(SLAPO_INVALID_ARG, "pattern_parse: NULL text");
  parser ps = {.s = text, .len = strnlen(text, MAX_TEXT + 1)};
  slapo_status s = slapo_arena_new(0, &ps.a);
  if (s == SLAPO_OK && !(ps.shown = escaped(&ps, text, ps.len, 200))) s = nomem();
  if (s == SLAPO_OK && ps.len > MAX_TEXT)
    s = err_at(&ps, MAX_TEXT, "pattern is longer than %d bytes", MAX_TEXT);
  if (s == SLAPO_OK) s = slapo_map_new(&ps.names);
  if (s == SLAPO_OK && (s = slapo__pattern_new(text, &ps.p)) == SLAPO_OK) {
    ps.p->text = true;
    s = parse_pattern(&ps);
  }
  slapo_map_free(ps.names);
  slapo_arena_free(ps.a);
  if (s != SLAPO_OK) {
    slapo_pattern_free(ps.p);
    return s;
  }
  ps.p->text = true;
  *out = ps.p;
  return SLAPO_OK;
}
