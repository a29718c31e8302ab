/* schedule/glob.c - module-path globs: parsing ('*', '**', '{a,b}',
 * '{0..5}', literals), matching a path segment by segment (a backtracking
 * matcher with continuations for alternatives, so pieces combine freely
 * within a segment), and slapo_sched_select over a schedule tree, which
 * also checks that every index of a range matched a module.
 * Layer: schedule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule/internal.h"

typedef enum piece_kind { PIECE_LIT, PIECE_STAR, PIECE_RANGE, PIECE_ALT } piece_kind;

typedef struct piece piece;

/* A sequence of pieces matching a whole (part of a) segment. */
typedef struct seq {
  size_t n, cap;
  piece *items;
} seq;

struct piece {
  piece_kind kind;
  char c;         /* PIECE_LIT */
  int64_t lo, hi; /* PIECE_RANGE, inclusive */
  size_t open;    /* PIECE_RANGE: offsets of its '{' and of the '}' */
  size_t close;
  size_t n_alts;  /* PIECE_ALT */
  seq *alts;
};

typedef struct glob_seg {
  bool globstar; /* "**": zero or more segments */
  seq pat;
} glob_seg;

struct slapo__glob {
  size_t n;
  glob_seg *segs;
};

/* ---- parsing ---- */

typedef struct parser {
  slapo_arena *a;
  const char *text;
  size_t pos;
  slapo__glob_error *err;
} parser;

/* Ranges bounds and indices are read with at most this many digits, so
 * they fit in int64_t without overflow checks. */
enum { MAX_DIGITS = 18 };

static slapo_status fail(parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static slapo_status fail(parser *p, size_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  p->err->col = (int)at + 1;
  vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
  va_end(ap);
  return SLAPO_PARSE;
}

/* "got 'x'" or "got end of glob" for the character at `at`. */
static const char *got(const parser *p, size_t at, char *buf, size_t cap) {
  char c = p->text[at];
  if (!c) return "end of glob";
  snprintf(buf, cap, "'%c'", c);
  return buf;
}

/* Grows an arena array of `elem` bytes to hold n + 1 items (old storage is
 * left in the arena, which frees it with everything else). */
static void *grow(slapo_arena *a, void *items, size_t n, size_t *cap, size_t elem) {
  if (n < *cap) return items;
  size_t ncap = *cap ? 2 * *cap : 4;
  void *d = slapo_arena_alloc(a, ncap * elem, 0);
  if (!d) return NULL;
  if (n) memcpy(d, items, n * elem);
  *cap = ncap;
  return d;
}

static slapo_status push(parser *p, seq *q, piece x) {
  piece *it = grow(p->a, q->items, q->n, &q->cap, sizeof *it);
  if (!it) return slapo_error(SLAPO_NOMEM, "glob: out of memory");
  q->items = it;
  q->items[q->n++] = x;
  return SLAPO_OK;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static slapo_status parse_seq(parser *p, bool in_brace, seq *out);

/* Reads digits at p->pos into *v; returns how many (0: none). Fails on more
 * than MAX_DIGITS. */
static slapo_status read_int(parser *p, int64_t *v, size_t *ndigits) {
  size_t start = p->pos;
  *v = 0;
  *ndigits = 0;
  while (is_digit(p->text[p->pos])) {
    if (p->pos - start == MAX_DIGITS)
      return fail(p, start, "range bound has more than %d digits", MAX_DIGITS);
    *v = *v * 10 + (p->text[p->pos++] - '0');
  }
  *ndigits = p->pos - start;
  return SLAPO_OK;
}

/* "{lo..hi}" with p->pos just after '{' and the text there starting with
 * digits followed by "..". */
static slapo_status parse_range(parser *p, piece *x) {
  char g[8];
  x->open = p->pos - 1;
  size_t n = 0;
  SLAPO_TRY(read_int(p, &x->lo, &n));
  p->pos += 2; /* ".." */
  size_t hi_at = p->pos;
  SLAPO_TRY(read_int(p, &x->hi, &n));
  if (n == 0)
    return fail(p, p->pos, "bad range: expected an integer after '..', got %s",
                got(p, p->pos, g, sizeof g));
  if (p->text[p->pos] != '}')
    return fail(p, p->pos, "bad range: expected '}' after '{%lld..%lld', got %s",
                (long long)x->lo, (long long)x->hi, got(p, p->pos, g, sizeof g));
  if (x->lo > x->hi)
    return fail(p, hi_at, "bad range {%lld..%lld}: expected an end >= the start %lld",
                (long long)x->lo, (long long)x->hi, (long long)x->lo);
  x->close = p->pos++;
  x->kind = PIECE_RANGE;
  return SLAPO_OK;
}

/* "{...}" with p->pos at '{'. */
static slapo_status parse_brace(parser *p, piece *x) {
  size_t open = p->pos++;
  size_t d = p->pos;
  while (is_digit(p->text[d])) d++;
  if (d > p->pos && p->text[d] == '.' && p->text[d + 1] == '.') return parse_range(p, x);
  if (p->text[p->pos] == '}') return fail(p, open, "expected alternatives inside '{}', got '}'");
  x->kind = PIECE_ALT;
  size_t cap = 0;
  for (;;) {
    seq *alts = grow(p->a, x->alts, x->n_alts, &cap, sizeof *alts);
    if (!alts) return slapo_error(SLAPO_NOMEM, "glob: out of memory");
    x->alts = alts;
    seq *alt = &x->alts[x->n_alts++];
    memset(alt, 0, sizeof *alt);
    SLAPO_TRY(parse_seq(p, true, alt));
    char c = p->text[p->pos];
    if (c == ',') {
      p->pos++;
      continue;
    }
    if (c == '}') {
      p->pos++;
      return SLAPO_OK;
    }
    if (c == '.' && p->text[p->pos + 1] == '.')
      return fail(p, p->pos, "bad range: expected an integer before '..', got '%.*s'",
                  (int)(p->pos - open - 1), p->text + open + 1);
    if (c == '.')
      return fail(p, p->pos,
                  "expected ',' or '}', got '.' (alternatives in braces are single segments)");
    return fail(p, open, "expected '}' to close this '{', got end of glob");
  }
}

/* Pieces up to the end of the segment (or of the alternative, in braces). */
static slapo_status parse_seq(parser *p, bool in_brace, seq *out) {
  for (;;) {
    char c = p->text[p->pos];
    if (!c || c == '.') return SLAPO_OK;
    if (in_brace && (c == ',' || c == '}')) return SLAPO_OK;
    piece x = {0};
    if (c == '*') {
      if (p->text[p->pos + 1] == '*')
        return fail(p, p->pos, "expected '**' to be a whole segment, got it next to other text");
      x.kind = PIECE_STAR;
      p->pos++;
    } else if (c == '{') {
      SLAPO_TRY(parse_brace(p, &x));
    } else if (c == '}') {
      return fail(p, p->pos, "expected a segment, got '}' without a matching '{'");
    } else if (c == ',') {
      return fail(p, p->pos, "expected a segment, got ',' outside braces (write {a,b})");
    } else if ((unsigned char)c <= ' ' || c == '"' || c == '=' || c == '#' || c == 0x7f) {
      return fail(p, p->pos, "expected a segment, got %s",
                  c == ' ' ? "a space" : (unsigned char)c < ' ' ? "a control character"
                                       : c == '"' ? "'\"'" : c == '=' ? "'='" : "'#'");
    } else {
      x.kind = PIECE_LIT;
      x.c = c;
      p->pos++;
    }
    SLAPO_TRY(push(p, out, x));
  }
}

slapo_status slapo__glob_parse(slapo_arena *a, const char *text, slapo__glob **out,
                               slapo__glob_error *err) {
  *out = NULL;
  parser p = {a, text, 0, err};
  slapo__glob *g = slapo_arena_alloc(a, sizeof *g, 0);
  if (!g) return slapo_error(SLAPO_NOMEM, "glob: out of memory");
  if (!text[0] || !strcmp(text, ".")) {
    *out = g; /* no segments: the node itself */
    return SLAPO_OK;
  }
  size_t cap = 0;
  for (;;) {
    char c = text[p.pos];
    if (!c || c == '.')
      return fail(&p, p.pos, "expected a segment, got %s",
                  c ? "'.' (empty segment)" : "end of glob (trailing '.')");
    glob_seg *segs = grow(a, g->segs, g->n, &cap, sizeof *segs);
    if (!segs) return slapo_error(SLAPO_NOMEM, "glob: out of memory");
    g->segs = segs;
    glob_seg *s = &g->segs[g->n++];
    memset(s, 0, sizeof *s);
    if (c == '*' && text[p.pos + 1] == '*' && (!text[p.pos + 2] || text[p.pos + 2] == '.')) {
      s->globstar = true;
      p.pos += 2;
    } else {
      SLAPO_TRY(parse_seq(&p, false, &s->pat));
    }
    if (!text[p.pos]) break;
    p.pos++; /* '.' */
  }
  *out = g;
  return SLAPO_OK;
}

/* ---- matching ---- */

/* The range indices the matches used, one item a range piece a match, so
 * that a range can be checked to match at every index. */
typedef struct range_hit {
  const piece *x;
  int64_t v;
} range_hit;

typedef struct range_hits {
  range_hit *items;
  size_t n, cap;
  bool nomem; /* an item was lost; reported after the walk */
} range_hits;

static void record_hit(range_hits *h, const piece *x, int64_t v) {
  if (!h) return;
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 16;
    range_hit *it = slapo_realloc(h->items, cap * sizeof *it);
    if (!it) {
      h->nomem = true;
      return;
    }
    h->items = it, h->cap = cap;
  }
  h->items[h->n++] = (range_hit){x, v};
}

/* What to match after the current sequence ends (alternatives resume the
 * sequence that contains them). */
typedef struct cont {
  const seq *q;
  size_t i;
  const struct cont *next;
} cont;

/* Records (when h is not NULL) the index each range matched, on the way
 * back from a whole segment's success only. */
static bool match_seq(const seq *q, size_t i, const char *s, const cont *k, range_hits *h) {
  if (i == q->n) return k ? match_seq(k->q, k->i, s, k->next, h) : *s == '\0';
  const piece *x = &q->items[i];
  switch (x->kind) {
  case PIECE_LIT: return *s == x->c && match_seq(q, i + 1, s + 1, k, h);
  case PIECE_STAR:
    for (const char *t = s;; t++) {
      if (match_seq(q, i + 1, t, k, h)) return true;
      if (!*t) return false;
    }
  case PIECE_RANGE: {
    /* A decimal index without leading zeros ("0", "12"; not "012"). */
    int64_t v = 0;
    for (size_t n = 0; is_digit(s[n]) && n < MAX_DIGITS; n++) {
      if (n == 1 && s[0] == '0') break;
      v = v * 10 + (s[n] - '0');
      if (v >= x->lo && v <= x->hi && match_seq(q, i + 1, s + n + 1, k, h)) {
        record_hit(h, x, v);
        return true;
      }
    }
    return false;
  }
  case PIECE_ALT: {
    cont after = {q, i + 1, k};
    for (size_t j = 0; j < x->n_alts; j++)
      if (match_seq(&x->alts[j], 0, s, &after, h)) return true;
    return false;
  }
  }
  return false;
}

/* Glob segments [gi, g->n) match path segments [pi, np) entirely. A
 * segment that matched before a later one failed drops its range hits. */
static bool match_from(const slapo__glob *g, size_t gi, const char *const *path, size_t pi,
                       size_t np, range_hits *h) {
  if (gi == g->n) return pi == np;
  const glob_seg *s = &g->segs[gi];
  if (s->globstar) {
    for (size_t skip = pi; skip <= np; skip++)
      if (match_from(g, gi + 1, path, skip, np, h)) return true;
    return false;
  }
  size_t mark = h ? h->n : 0;
  if (pi < np && match_seq(&s->pat, 0, path[pi], NULL, h) &&
      match_from(g, gi + 1, path, pi + 1, np, h))
    return true;
  if (h) h->n = mark;
  return false;
}

/* The first k glob segments alone match the whole path. */
static bool match_prefix(const slapo__glob *g, size_t k, const char *const *path, size_t np) {
  slapo__glob head = {k, g->segs};
  return match_from(&head, 0, path, 0, np, NULL);
}

/* ---- selection ---- */

typedef struct walk {
  const slapo__glob *g;
  const char **names; /* [depth] segment names from the start node */
  size_t cap_names;
  slapo_sched_list *out;
  range_hits hits;    /* of the matches so far */
  slapo_sched *best;  /* nearest existing prefix so far */
  size_t best_k;      /* how many glob segments it matches */
  size_t best_depth;
} walk;

static slapo_status list_push(slapo_sched_list *l, slapo_sched *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    slapo_sched **it = slapo_realloc(l->items, cap * sizeof *it);
    if (!it) return slapo_error(SLAPO_NOMEM, "select: out of memory");
    l->items = it;
    l->cap = cap;
  }
  l->items[l->n++] = s;
  return SLAPO_OK;
}

static slapo_status visit(walk *w, slapo_sched *s, size_t depth) {
  if (match_from(w->g, 0, w->names, 0, depth, &w->hits)) SLAPO_TRY(list_push(w->out, s));
  if (w->out->n == 0) {
    /* Track the nearest prefix only while nothing matched (for the message):
     * the longest leading run of glob segments matched, then the shallowest
     * node (so "**.x" names the start node, not some leaf), then the first. */
    for (size_t k = w->g->n; k-- > w->best_k;) {
      if (k == w->best_k && depth >= w->best_depth) break;
      if (match_prefix(w->g, k, w->names, depth)) {
        w->best = s, w->best_k = k, w->best_depth = depth;
        break;
      }
    }
  }
  if (s->n_children && depth == w->cap_names) {
    size_t cap = w->cap_names ? 2 * w->cap_names : 16;
    const char **nm = slapo_realloc(w->names, cap * sizeof *nm);
    if (!nm) return slapo_error(SLAPO_NOMEM, "select: out of memory");
    w->names = nm;
    w->cap_names = cap;
  }
  for (int i = 0; i < s->n_children; i++) {
    w->names[depth] = s->children[i]->name;
    SLAPO_TRY(visit(w, s->children[i], depth + 1));
  }
  return SLAPO_OK;
}

/* ---- every index of a range ---- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The distinct indices the matches used for range x, sorted, into v (room
 * for h->n); returns how many. */
static size_t range_values(const range_hits *h, const piece *x, int64_t *v) {
  size_t n = 0;
  for (size_t i = 0; i < h->n; i++)
    if (h->items[i].x == x) v[n++] = h->items[i].v;
  qsort(v, n, sizeof *v, cmp_i64);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (!m || v[m - 1] != v[i]) v[m++] = v[i];
  return m;
}

/* Appends "a" or "a..b" to buf (cap bytes, NUL-terminated), after ", "
 * unless buf is empty; a full buffer keeps what fits. */
static void append_run(char *buf, size_t cap, int64_t a, int64_t b) {
  size_t n = strlen(buf);
  const char *sep = n ? ", " : "";
  if (a == b) snprintf(buf + n, cap - n, "%s%lld", sep, (long long)a);
  else snprintf(buf + n, cap - n, "%s%lld..%lld", sep, (long long)a, (long long)b);
}

/* The first range of seq q (alternatives included) that some index of
 * matched nothing, or NULL; v and *nv hold the indices that matched. */
static const piece *short_range(const seq *q, const range_hits *h, int64_t *v, size_t *nv) {
  for (size_t i = 0; i < q->n; i++) {
    const piece *x = &q->items[i];
    if (x->kind == PIECE_RANGE) {
      *nv = range_values(h, x, v);
      if ((uint64_t)*nv < (uint64_t)(x->hi - x->lo) + 1) return x;
    }
    for (size_t j = 0; x->kind == PIECE_ALT && j < x->n_alts; j++) {
      const piece *r = short_range(&x->alts[j], h, v, nv);
      if (r) return r;
    }
  }
  return NULL;
}

/* A range is a promise of each of its indices, as a literal path is: an
 * overshooting {0..9} on 4 layers silently meant {0..3} while {4..9} alone
 * was an error. The error names the indices missed and those that match.
 * `below` is the start node's path ("" at the root). */
static slapo_status check_ranges(const slapo__glob *g, const char *glob, const char *below,
                                 const range_hits *h) {
  if (h->nomem) return slapo_error(SLAPO_NOMEM, "select: out of memory");
  int64_t *v = slapo_malloc((h->n ? h->n : 1) * sizeof *v);
  if (!v) return slapo_error(SLAPO_NOMEM, "select: out of memory");
  const piece *x = NULL;
  size_t nv = 0;
  for (size_t i = 0; !x && i < g->n; i++) x = short_range(&g->segs[i].pat, h, v, &nv);
  if (!x) {
    slapo_free(v);
    return SLAPO_OK;
  }
  char missed[256] = "", has[256] = "";
  int64_t next = x->lo; /* the first index not yet accounted for */
  for (size_t i = 0; i <= nv; i++) {
    int64_t end = i < nv ? v[i] - 1 : x->hi; /* a gap [next, end] before v[i] */
    if (end >= next) append_run(missed, sizeof missed, next, end);
    if (i == nv) break;
    size_t j = i; /* the run of consecutive matched indices from v[i] */
    while (j + 1 < nv && v[j + 1] == v[j] + 1) j++;
    append_run(has, sizeof has, v[i], v[j]);
    next = v[j] + 1, i = j;
  }
  /* What matches, in the glob's own words: the range replaced by its hits. */
  char shown[768] = "no index of it matches";
  if (nv)
    snprintf(shown, sizeof shown, "the model has '%.*s%s%s%s%s'", (int)x->open, glob,
             nv > 1 ? "{" : "", has, nv > 1 ? "}" : "", glob + x->close + 1);
  slapo_free(v);
  return slapo_error(SLAPO_NO_MATCH,
                     "no module matches '%s'%s%s%s at %s %s of the range {%lld..%lld}: %s "
                     "(every index of a range must match a module)",
                     glob, below[0] ? " below '" : "", below, below[0] ? "'" : "",
                     strpbrk(missed, ".,") ? "indices" : "index", missed, (long long)x->lo,
                     (long long)x->hi, shown);
}

void slapo_sched_list_deinit(slapo_sched_list *list) {
  if (!list) return;
  slapo_free(list->items);
  memset(list, 0, sizeof *list);
}

slapo_status slapo_sched_select(slapo_sched *s, const char *glob, slapo_sched_list *out) {
  memset(out, 0, sizeof *out);
  slapo_arena *a;
  SLAPO_TRY(slapo_arena_new(0, &a));
  slapo__glob *g;
  slapo__glob_error err;
  slapo_status st = slapo__glob_parse(a, glob, &g, &err);
  if (st == SLAPO_PARSE)
    st = slapo_error(SLAPO_PARSE, "glob '%s': column %d: %s", glob, err.col, err.msg);
  walk w = {.g = g, .out = out, .best = s};
  if (st == SLAPO_OK) st = visit(&w, s, 0);
  if (st == SLAPO_OK && out->n > 0) st = check_ranges(g, glob, s->path, &w.hits);
  if (st == SLAPO_OK && out->n == 0) {
    char kids[768];
    slapo__sched_children_text(w.best, kids, sizeof kids);
    /* The matched leading run of the glob, as written: its first best_k
     * segments (recovered by counting top-level dots). */
    size_t end = 0;
    for (size_t k = 0, depth = 0; glob[end]; end++) {
      if (glob[end] == '{') depth++;
      else if (glob[end] == '}' && depth) depth--;
      else if (glob[end] == '.' && !depth && ++k == w.best_k)
        break;
    }
    if (w.best_k == 0) end = 0;
    const char *full = s->path[0] ? s->path : "";
    st = slapo_error(SLAPO_NO_MATCH,
                     "no module matches '%s'%s%s%s: the nearest existing prefix is '%s'%s%.*s%s, "
                     "which has %s%s",
                     glob, full[0] ? " below '" : "", full, full[0] ? "'" : "",
                     slapo__sched_display_path(w.best), end ? " (matching '" : "", (int)end,
                     glob, end ? "')" : "", w.best->n_children ? "children " : "no children",
                     kids);
  }
  slapo_free(w.names);
  slapo_free(w.hits.items);
  slapo_arena_free(a);
  if (st != SLAPO_OK) slapo_sched_list_deinit(out);
  return st;
}
