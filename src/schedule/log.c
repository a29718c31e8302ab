/* schedule/log.c - the schedule log: an arena of entries (path or glob,
 * primitive, ordered arguments, source file:line, replayable flag), copied
 * in on append after checking that each entry prints as a `.sched` line
 * that reads back the same; the printer with aligned columns.
 * Layer: schedule. Format: DESIGN.md §7. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "schedule/internal.h"

struct slapo_sched_log {
  slapo_arena *arena;          /* entries, arguments and strings */
  slapo_sched_entry **entries; /* [n], pointers into the arena   */
  size_t n, cap;
};

slapo_status slapo_sched_log_new(slapo_sched_log **out) {
  *out = NULL;
  slapo_sched_log *log = slapo_calloc(1, sizeof *log);
  if (!log) return slapo_error(SLAPO_NOMEM, "sched log: out of memory");
  slapo_status s = slapo_arena_new(0, &log->arena);
  if (s != SLAPO_OK) {
    slapo_free(log);
    return s;
  }
  *out = log;
  return SLAPO_OK;
}

void slapo_sched_log_free(slapo_sched_log *log) {
  if (!log) return;
  slapo_arena_free(log->arena);
  slapo_free(log->entries);
  slapo_free(log);
}

size_t slapo_sched_log_count(const slapo_sched_log *log) { return log->n; }

const slapo_sched_entry *slapo_sched_log_entry(const slapo_sched_log *log, size_t i) {
  SLAPO_ASSERT(i < log->n);
  return log->entries[i];
}

/* ---- argument constructors ---- */

slapo_sched_arg slapo_sched_arg_word(const char *key, const char *word) {
  return (slapo_sched_arg){.key = key, .kind = SLAPO_SCHED_ARG_WORD, .text = word};
}
slapo_sched_arg slapo_sched_arg_int(const char *key, int64_t v) {
  return (slapo_sched_arg){.key = key, .kind = SLAPO_SCHED_ARG_INT, .i = v, .f = (double)v};
}
slapo_sched_arg slapo_sched_arg_float(const char *key, double v) {
  return (slapo_sched_arg){.key = key, .kind = SLAPO_SCHED_ARG_FLOAT, .f = v};
}
slapo_sched_arg slapo_sched_arg_bool(const char *key, bool v) {
  return (slapo_sched_arg){.key = key, .kind = SLAPO_SCHED_ARG_BOOL, .b = v};
}
slapo_sched_arg slapo_sched_arg_string(const char *key, const char *s) {
  return (slapo_sched_arg){.key = key, .kind = SLAPO_SCHED_ARG_STRING, .text = s};
}

/* ---- append ---- */

static const char *kind_name(slapo_sched_arg_kind k) {
  switch (k) {
  case SLAPO_SCHED_ARG_WORD: return "word";
  case SLAPO_SCHED_ARG_INT: return "integer";
  case SLAPO_SCHED_ARG_FLOAT: return "decimal";
  case SLAPO_SCHED_ARG_BOOL: return "boolean";
  case SLAPO_SCHED_ARG_STRING: return "string";
  }
  return "?";
}

/* Checks argument j of e (see slapo_sched_log_append) and writes the text it
 * will be stored with into buf (numbers and booleans without text). */
static slapo_status check_arg(const slapo_sched_entry *e, int j, char *buf, size_t cap,
                              const char **text) {
  const slapo_sched_arg *a = &e->args[j];
  const char *pfx = e->primitive;
  if (a->key && !slapo_sched_is_name(a->key, true))
    return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: argument %d: bad key '%s' (expected "
                       "a name: letters, digits, '_', '.')", pfx, j + 1, a->key);
  for (int k = 0; k < j && a->key; k++)
    if (e->args[k].key && !strcmp(e->args[k].key, a->key))
      return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: key '%s' given twice", pfx, a->key);
  const char *key = a->key ? a->key : "(positional)";
  *text = a->text;
  switch (a->kind) {
  case SLAPO_SCHED_ARG_STRING:
    if (!a->text) return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: %s: NULL string", pfx, key);
    for (const char *p = a->text; *p; p++)
      if ((unsigned char)*p < ' ' || *p == 0x7f)
        return slapo_error(SLAPO_INVALID_ARG,
                           "sched log: %s: %s: string holds a control character (0x%02x), which "
                           "a .sched line cannot hold", pfx, key, (unsigned)(unsigned char)*p);
    return SLAPO_OK;
  case SLAPO_SCHED_ARG_INT:
    if (!a->text) snprintf(buf, cap, "%lld", (long long)a->i), *text = buf;
    break;
  case SLAPO_SCHED_ARG_FLOAT:
    if (!isfinite(a->f))
      return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: %s: %g is not a finite number", pfx,
                         key, a->f);
    if (!a->text) slapo__format_float(a->f, buf, cap), *text = buf;
    break;
  case SLAPO_SCHED_ARG_BOOL:
    if (!a->text) *text = a->b ? "true" : "false";
    break;
  case SLAPO_SCHED_ARG_WORD:
    if (!a->text || !a->text[0])
      return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: %s: empty word", pfx, key);
    break;
  }
  for (const char *p = *text; *p; p++)
    if (!slapo__is_word_char(*p))
      return slapo_error(SLAPO_INVALID_ARG,
                         "sched log: %s: %s: '%s' cannot be a bare %s (it holds whitespace, "
                         "'\"', '=' or '#'); use a string", pfx, key, *text, kind_name(a->kind));
  slapo_sched_arg back;
  slapo__value_verdict v = slapo__value_classify(*text, &back);
  bool same = v == SLAPO__VALUE_OK && back.kind == a->kind &&
              (a->kind != SLAPO_SCHED_ARG_INT || back.i == a->i) &&
              (a->kind != SLAPO_SCHED_ARG_FLOAT || back.f == a->f) &&
              (a->kind != SLAPO_SCHED_ARG_BOOL || back.b == a->b);
  if (!same)
    return slapo_error(SLAPO_INVALID_ARG,
                       "sched log: %s: %s: '%s' would not read back as the %s given%s", pfx, key,
                       *text, kind_name(a->kind),
                       a->kind == SLAPO_SCHED_ARG_WORD ? " (use a string)" : "");
  return SLAPO_OK;
}

static char *dup(slapo_arena *a, const char *s, bool *ok) {
  if (!s) return NULL;
  char *d = slapo_arena_strdup(a, s);
  if (!d) *ok = false;
  return d;
}

slapo_status slapo_sched_log_append(slapo_sched_log *log, const slapo_sched_entry *e) {
  const char *path = e->path && e->path[0] ? e->path : ".";
  if (!e->primitive || !slapo_sched_is_name(e->primitive, false))
    return slapo_error(SLAPO_INVALID_ARG,
                       "sched log: bad primitive name '%s' (expected [A-Za-z_][A-Za-z0-9_]*)",
                       e->primitive ? e->primitive : "(null)");
  if (e->n_args < 0 || (e->n_args > 0 && !e->args))
    return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: %d arguments but no array",
                       e->primitive, e->n_args);
  /* The path must read back as one well-formed path or glob. */
  slapo_arena *scratch;
  SLAPO_TRY(slapo_arena_new(0, &scratch));
  slapo__glob *g;
  slapo__glob_error gerr;
  slapo_status s = slapo__glob_parse(scratch, path, &g, &gerr);
  slapo_arena_free(scratch);
  if (s == SLAPO_PARSE)
    return slapo_error(SLAPO_INVALID_ARG, "sched log: %s: bad path or glob '%s': column %d: %s",
                       e->primitive, path, gerr.col, gerr.msg);
  SLAPO_TRY(s);

  for (int j = 0; j < e->n_args; j++) {
    char buf[40];
    const char *text;
    SLAPO_TRY(check_arg(e, j, buf, sizeof buf, &text));
  }

  /* Checked; now copy. The entry array grows first so that a failure leaves
   * the log's visible contents unchanged (the arena may keep some bytes). */
  if (log->n == log->cap) {
    size_t cap = log->cap ? 2 * log->cap : 16;
    slapo_sched_entry **es = slapo_realloc(log->entries, cap * sizeof *es);
    if (!es) return slapo_error(SLAPO_NOMEM, "sched log: out of memory");
    log->entries = es;
    log->cap = cap;
  }
  slapo_arena *a = log->arena;
  bool ok = true;
  slapo_sched_entry *d = slapo_arena_alloc(a, sizeof *d, 0);
  slapo_sched_arg *args =
      e->n_args ? slapo_arena_alloc(a, (size_t)e->n_args * sizeof *args, 0) : NULL;
  if (!d || (e->n_args && !args)) return slapo_error(SLAPO_NOMEM, "sched log: out of memory");
  for (int j = 0; j < e->n_args; j++) {
    char buf[40];
    const char *text;
    SLAPO_TRY(check_arg(e, j, buf, sizeof buf, &text)); /* passed above: only sets text */
    args[j] = e->args[j];
    args[j].key = dup(a, e->args[j].key, &ok);
    args[j].text = dup(a, text, &ok);
    if (args[j].kind == SLAPO_SCHED_ARG_INT) args[j].f = (double)args[j].i;
  }
  d->path = dup(a, path, &ok);
  d->primitive = dup(a, e->primitive, &ok);
  d->file = dup(a, e->file, &ok);
  d->line = e->line;
  d->n_args = e->n_args;
  d->args = args;
  d->replayable = e->replayable;
  if (!ok) return slapo_error(SLAPO_NOMEM, "sched log: out of memory");
  log->entries[log->n++] = d;
  return SLAPO_OK;
}

/* ---- printing ---- */

static const char k_header_path[] = "# path-or-glob";
static const char k_header_prim[] = "primitive";

static void print_args(const slapo_sched_entry *e, FILE *f) {
  for (int j = 0; j < e->n_args; j++) {
    if (j) fputc(' ', f);
    slapo__arg_print(&e->args[j], f);
  }
}

void slapo_sched_entry_print(const slapo_sched_entry *e, FILE *f) {
  fprintf(f, "%s %s", e->path, e->primitive);
  if (e->n_args) fputc(' ', f);
  print_args(e, f);
  if (!e->replayable) fprintf(f, "  # not replayable");
}

void slapo_sched_log_print(const slapo_sched_log *log, FILE *f) {
  int wpath = (int)strlen(k_header_path), wprim = (int)strlen(k_header_prim);
  for (size_t i = 0; i < log->n; i++) {
    int lp = (int)strlen(log->entries[i]->path), lq = (int)strlen(log->entries[i]->primitive);
    if (lp > wpath) wpath = lp;
    if (lq > wprim) wprim = lq;
  }
  wpath += 2;
  wprim += 3;
  fprintf(f, "%-*s%-*s%s\n", wpath, k_header_path, wprim, k_header_prim, "arguments");
  for (size_t i = 0; i < log->n; i++) {
    const slapo_sched_entry *e = log->entries[i];
    if (e->n_args) {
      fprintf(f, "%-*s%-*s", wpath, e->path, wprim, e->primitive);
      print_args(e, f);
    } else {
      fprintf(f, "%-*s%s", wpath, e->path, e->primitive);
    }
    if (!e->replayable) fprintf(f, "  # not replayable");
    fputc('\n', f);
  }
}
