/* schedule/parse.c - the `.sched` reader: one entry per line (path or glob,
 * primitive name, arguments), '#' comments (at a line's start or after a
 * space), quoted strings with \" and \\, numbers and booleans; a leading
 * UTF-8 byte-order mark is skipped; errors as "file:line:column: expected
 * ..., got ...".
 * Each line is scanned into a scratch arena and appended (copied) to the log.
 * Layer: schedule. Grammar: DESIGN.md §7. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "schedule/internal.h"

typedef struct line_parser {
  const char *file;
  int lineno;
  const char *s; /* the line, NUL-terminated, without its line end */
  size_t pos;
  slapo_arena *a; /* reset per line */
} line_parser;

static slapo_status err_at(const line_parser *lp, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static slapo_status err_at(const line_parser *lp, size_t at, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return slapo_error(SLAPO_PARSE, "%s:%d:%zu: %s", lp->file, lp->lineno, at + 1, msg);
}

static bool is_space(char c) { return c == ' ' || c == '\t'; }

static void skip_space(line_parser *lp) {
  while (is_space(lp->s[lp->pos])) lp->pos++;
}

/* What stands at `at`, for "got ..." (borrowed static or arena text). */
static const char *got(line_parser *lp, size_t at) {
  const char *p = lp->s + at;
  if (!*p) return "end of line";
  if (*p == '#' && at > 0 && !is_space(lp->s[at - 1]))
    return "'#' (a comment starts at a line's start or after a space)";
  if (*p == '#') return "a comment";
  if (is_space(*p)) return "a space";
  unsigned char c = (unsigned char)*p;
  if (c < ' ' || c == 0x7f) {
    char *t = slapo_arena_printf(lp->a, "a control character (0x%02x)", (unsigned)c);
    return t ? t : "a control character";
  }
  /* The token, control bytes and non-ASCII bytes shown as \xNN. */
  size_t n = 0;
  while (p[n] && !is_space(p[n])) n++;
  char *t = slapo_arena_alloc(lp->a, 4 * n + 3, 1);
  if (!t) return "text";
  size_t k = 0;
  t[k++] = '\'';
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)p[i];
    if (b < ' ' || b >= 0x7f) k += (size_t)snprintf(t + k, 5, "\\x%02x", (unsigned)b);
    else t[k++] = (char)b;
  }
  t[k++] = '\'';
  t[k] = '\0';
  return t;
}

/* Copies s[from, to) into the arena, NUL-terminated. */
static char *span(line_parser *lp, size_t from, size_t to) {
  char *d = slapo_arena_alloc(lp->a, to - from + 1, 1);
  if (d) memcpy(d, lp->s + from, to - from);
  return d;
}

static slapo_status nomem(void) { return slapo_error(SLAPO_NOMEM, "sched parse: out of memory"); }

/* The error for a '#' at lp->pos right after the token that began at
 * `from`, if there is one. A comment starts at a line's start or after a
 * space, as in shell: read as a comment, name=F#x silently became name=F.
 * The message shows the whole token and how to keep the '#'. */
static slapo_status no_hash_after(line_parser *lp, size_t from) {
  if (lp->s[lp->pos] != '#') return SLAPO_OK;
  size_t end = lp->pos;
  while (lp->s[end] && !is_space(lp->s[end])) end++;
  char *tok = span(lp, from, end);
  if (!tok) return nomem();
  return err_at(lp, lp->pos,
                "expected a space before a comment's '#', got '%s' (a comment "
                "starts at a line's start or after a space; a value that holds '#' is written "
                "in double quotes)",
                tok);
}

/* A double-quoted string at lp->pos ('"'); *out is its unescaped text. */
static slapo_status read_string(line_parser *lp, char **out) {
  size_t open = lp->pos++;
  char *d = slapo_arena_alloc(lp->a, strlen(lp->s + lp->pos) + 1, 1);
  if (!d) return nomem();
  size_t n = 0;
  for (;;) {
    char c = lp->s[lp->pos];
    if (!c)
      return err_at(lp, open, "expected a closing '\"' for the string opened here, got end of "
                              "line");
    if (c == '"') break;
    if ((unsigned char)c < ' ' || c == 0x7f)
      return err_at(lp, lp->pos, "expected a printable character in a string, got a control "
                                 "character (0x%02x)", (unsigned)(unsigned char)c);
    if (c == '\\') {
      char e = lp->s[lp->pos + 1];
      if (!e)
        return err_at(lp, open, "expected a closing '\"' for the string opened here, got end of "
                                "line");
      if (e != '"' && e != '\\')
        return err_at(lp, lp->pos, "expected \\\" or \\\\ after '\\' in a string, got '\\%c'", e);
      c = e;
      lp->pos++;
    }
    d[n++] = c;
    lp->pos++;
  }
  lp->pos++; /* closing quote */
  d[n] = '\0';
  SLAPO_TRY(no_hash_after(lp, open));
  char c = lp->s[lp->pos];
  if (c && !is_space(c))
    return err_at(lp, lp->pos, "expected a space after the closing '\"', got %s", got(lp, lp->pos));
  *out = d;
  return SLAPO_OK;
}

/* Fills a->kind and value from unquoted token `tok` that starts at `at`. */
static slapo_status classify(line_parser *lp, const char *tok, size_t at, slapo_sched_arg *a) {
  switch (slapo__value_classify(tok, a)) {
  case SLAPO__VALUE_OK: return SLAPO_OK;
  case SLAPO__VALUE_BAD_NUMBER:
    return err_at(lp, at, "expected a number (like 3, -1, 0.5 or 1e-5), got '%s'", tok);
  case SLAPO__VALUE_OUT_OF_RANGE:
    return err_at(lp, at, "expected a number that fits (64-bit integer or double), got '%s'",
                  tok);
  }
  return SLAPO_OK;
}

typedef struct arg_list {
  slapo_sched_arg *items;
  size_t *cols; /* column of each argument's start, for duplicate keys */
  size_t n, cap;
} arg_list;

static slapo_status push_arg(line_parser *lp, arg_list *l, slapo_sched_arg a, size_t col) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 8;
    slapo_sched_arg *it = slapo_arena_alloc(lp->a, cap * sizeof *it, 0);
    size_t *cols = slapo_arena_alloc(lp->a, cap * sizeof *cols, 0);
    if (!it || !cols) return nomem();
    if (l->n) memcpy(it, l->items, l->n * sizeof *it), memcpy(cols, l->cols, l->n * sizeof *cols);
    l->items = it, l->cols = cols, l->cap = cap;
  }
  l->cols[l->n] = col;
  l->items[l->n++] = a;
  return SLAPO_OK;
}

/* One argument at lp->pos (not a space, not a comment, not the end). */
static slapo_status read_arg(line_parser *lp, arg_list *args) {
  size_t start = lp->pos;
  slapo_sched_arg a = {0};
  const char *s = lp->s;
  if (s[start] == '"') {
    char *str;
    SLAPO_TRY(read_string(lp, &str));
    a.kind = SLAPO_SCHED_ARG_STRING;
    a.text = str;
    return push_arg(lp, args, a, start);
  }
  if (s[start] == '=')
    return err_at(lp, start, "expected a key before '=' (write key=value), got %s",
                  got(lp, start));
  while (slapo__is_word_char(s[lp->pos])) lp->pos++;
  /* Nothing scanned: a control character (neither a word character nor a
   * space). Without this the argument loop would push empty arguments
   * forever without advancing. */
  if (lp->pos == start)
    return err_at(lp, start, "expected an argument (a word, number or quoted string), got %s",
                  got(lp, start));
  char *tok = span(lp, start, lp->pos);
  if (!tok) return nomem();
  if (s[lp->pos] == '"')
    return err_at(lp, lp->pos, "expected a space after '%s', got '\"'", tok);
  SLAPO_TRY(no_hash_after(lp, start));
  if (s[lp->pos] != '=') {
    SLAPO_TRY(classify(lp, tok, start, &a));
    a.text = tok;
    return push_arg(lp, args, a, start);
  }
  /* key=value */
  if (!slapo_sched_is_name(tok, true))
    return err_at(lp, start, "expected a key (a name: letters, digits, '_', '.') before '=', "
                             "got '%s'", tok);
  for (size_t k = 0; k < args->n; k++)
    if (args->items[k].key && !strcmp(args->items[k].key, tok))
      return err_at(lp, start, "expected each key once, got '%s' again (first at column %zu)",
                    tok, args->cols[k] + 1);
  a.key = tok;
  size_t vstart = ++lp->pos;
  char c = s[vstart];
  if (c == '"') {
    char *str;
    SLAPO_TRY(read_string(lp, &str));
    a.kind = SLAPO_SCHED_ARG_STRING;
    a.text = str;
    return push_arg(lp, args, a, start);
  }
  if (!slapo__is_word_char(c))
    return err_at(lp, vstart, "expected a value after '%s=', got %s", tok,
                  c == '=' ? "'='" : got(lp, vstart));
  while (slapo__is_word_char(s[lp->pos])) lp->pos++;
  char *val = span(lp, vstart, lp->pos);
  if (!val) return nomem();
  SLAPO_TRY(no_hash_after(lp, start));
  if (s[lp->pos] == '"' || s[lp->pos] == '=')
    return err_at(lp, lp->pos, "expected a space after '%s=%s', got '%c'", tok, val,
                  s[lp->pos]);
  SLAPO_TRY(classify(lp, val, vstart, &a));
  a.text = val;
  return push_arg(lp, args, a, start);
}

/* Parses lp->s; appends an entry to log unless the line is blank or a
 * comment. */
static slapo_status parse_line(line_parser *lp, slapo_sched_log *log) {
  const char *s = lp->s;
  skip_space(lp);
  if (!s[lp->pos] || s[lp->pos] == '#') return SLAPO_OK;

  /* Path or glob. */
  size_t pstart = lp->pos;
  while (s[lp->pos] && !is_space(s[lp->pos]) && s[lp->pos] != '#') lp->pos++;
  SLAPO_TRY(no_hash_after(lp, pstart));
  char *path = span(lp, pstart, lp->pos);
  if (!path) return nomem();
  slapo__glob *g;
  slapo__glob_error gerr;
  slapo_status st = slapo__glob_parse(lp->a, path, &g, &gerr);
  if (st == SLAPO_PARSE) {
    if (strchr(path, '=') || strchr(path, '"'))
      return err_at(lp, pstart, "expected a module path or glob first, got '%s'", path);
    return err_at(lp, pstart + (size_t)gerr.col - 1, "%s (in path or glob '%s')", gerr.msg, path);
  }
  SLAPO_TRY(st);

  /* Primitive name. */
  skip_space(lp);
  size_t qstart = lp->pos;
  if (!s[qstart] || s[qstart] == '#')
    return err_at(lp, qstart, "expected a primitive name after '%s', got %s", path,
                  got(lp, qstart));
  while (s[lp->pos] && !is_space(s[lp->pos]) && s[lp->pos] != '#') lp->pos++;
  SLAPO_TRY(no_hash_after(lp, qstart));
  char *prim = span(lp, qstart, lp->pos);
  if (!prim) return nomem();
  if (!slapo_sched_is_name(prim, false))
    return err_at(lp, qstart, "expected a primitive name after '%s', got %s", path,
                  got(lp, qstart));

  /* Arguments, then an optional comment. */
  arg_list args = {0};
  bool replayable = true;
  for (;;) {
    skip_space(lp);
    char c = s[lp->pos];
    if (!c) break;
    if (c == '#') {
      const char *t = s + lp->pos + 1;
      while (is_space(*t)) t++;
      if (!strncmp(t, "not replayable", 14)) replayable = false;
      break;
    }
    SLAPO_TRY(read_arg(lp, &args));
  }

  slapo_sched_entry e = {.path = path,
                         .primitive = prim,
                         .n_args = (int)args.n,
                         .args = args.items,
                         .file = lp->file,
                         .line = lp->lineno,
                         .replayable = replayable};
  return slapo_sched_log_append(log, &e);
}

slapo_status slapo_sched_parse(const char *text, const char *filename, slapo_sched_log **out) {
  *out = NULL;
  SLAPO_NEED(text, "sched_parse");
  slapo_sched_log *log;
  SLAPO_TRY(slapo_sched_log_new(&log));
  slapo_arena *a;
  slapo_status st = slapo_arena_new(0, &a);
  if (st != SLAPO_OK) {
    slapo_sched_log_free(log);
    return st;
  }
  char *buf = NULL;
  size_t cap = 0;
  line_parser lp = {.file = filename ? filename : "<string>", .a = a};
  /* Editors on Windows save UTF-8 with a byte-order mark; kept, it became
   * part of the first path, invisible in the message. Skipped as Python's
   * utf-8-sig does; columns count from after it. */
  if (!strncmp(text, "\xef\xbb\xbf", 3)) text += 3;
  for (const char *p = text; st == SLAPO_OK && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    size_t keep = len && p[len - 1] == '\r' ? len - 1 : len;
    if (keep + 1 > cap) {
      char *nb = slapo_realloc(buf, keep + 1);
      if (!nb) {
        st = nomem();
        break;
      }
      buf = nb, cap = keep + 1;
    }
    memcpy(buf, p, keep);
    buf[keep] = '\0';
    lp.lineno++;
    lp.s = buf;
    lp.pos = 0;
    slapo_arena_reset(a);
    st = parse_line(&lp, log);
    p = nl ? nl + 1 : p + len;
  }
  slapo_free(buf);
  slapo_arena_free(a);
  if (st != SLAPO_OK) {
    slapo_sched_log_free(log);
    return st;
  }
  *out = log;
  return SLAPO_OK;
}

slapo_status slapo_sched_parse_file(const char *path, slapo_sched_log **out) {
  *out = NULL;
  SLAPO_NEED(path, "sched_parse_file");
  FILE *f = fopen(path, "rb");
  if (!f) return slapo_error(SLAPO_IO, "cannot read schedule file '%s': %s", path, strerror(errno));
  char *text = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (cap - n < 4096) {
      size_t ncap = cap ? 2 * cap : 8192;
      char *t = slapo_realloc(text, ncap);
      if (!t) {
        slapo_free(text);
        fclose(f);
        return slapo_error(SLAPO_NOMEM, "sched parse: out of memory reading '%s'", path);
      }
      text = t, cap = ncap;
    }
    size_t got_n = fread(text + n, 1, cap - n - 1, f);
    n += got_n;
    if (got_n == 0) break;
  }
  int failed = ferror(f);
  int saved = errno;
  fclose(f);
  if (failed) {
    slapo_free(text);
    return slapo_error(SLAPO_IO, "cannot read schedule file '%s': %s", path, strerror(saved));
  }
  text[n] = '\0';
  const char *nul = memchr(text, '\0', n);
  if (nul) {
    int line = 1;
    const char *ls = text;
    for (const char *p = text; p < nul; p++)
      if (*p == '\n') line++, ls = p + 1;
    slapo_free(text);
    return slapo_error(SLAPO_PARSE, "%s:%d:%d: expected text, got a NUL byte", path, line,
                       (int)(nul - ls) + 1);
  }
  slapo_status st = slapo_sched_parse(text, path, out);
  slapo_free(text);
  return st;
}
