/* schedule/internal.h - what the schedule layer's files share: the tree node
 * struct, the parsed glob (glob.c) and the `.sched` value grammar
 * (value.c), used by the printer, the parser and the argument accessors.
 * Layer: schedule (internal). */
#ifndef SLAPO_SCHEDULE_INTERNAL_H
#define SLAPO_SCHEDULE_INTERNAL_H

#include "core/assert.h"
#include "slapo/schedule.h"

struct slapo_sched {
  slapo_module *module;   /* borrowed from the module tree              */
  char *name;             /* name in the parent; "" for the root; owned  */
  char *path;             /* full dotted path; "" for the root; owned    */
  slapo_sched *parent;    /* NULL for the root                           */
  int index;              /* position in the parent's children           */
  int n_children;
  slapo_sched **children; /* [n_children], owned                         */
  slapo_sched_log *log;   /* the tree's log; owned by the root only      */
};

/* The path for messages: "." for the root. */
static inline const char *slapo__sched_display_path(const slapo_sched *s) {
  return s->path[0] ? s->path : ".";
}

/* Writes the children's names as "a, b, c" into buf for messages ("" when
 * there are none), ending in ", ..." when they do not fit. */
void slapo__sched_children_text(const slapo_sched *s, char *buf, size_t cap);

/* ---- globs (glob.c) ---- */

/* A parsed glob; lives in the arena it was parsed into. */
typedef struct slapo__glob slapo__glob;

/* Where and why a glob is malformed: 1-based column in the glob text and a
 * phrase "expected '}' to close this '{', got end of glob". */
typedef struct slapo__glob_error {
  int col;
  char msg[192];
} slapo__glob_error;

/* Parses `text` into arena `a`. Returns SLAPO_PARSE with *err filled (the
 * thread's error message is not set), or SLAPO_NOMEM (set). */
slapo_status slapo__glob_parse(slapo_arena *a, const char *text, slapo__glob **out,
                               slapo__glob_error *err);

/* ---- the value grammar (value.c) ---- */

typedef enum slapo__value_verdict {
  SLAPO__VALUE_OK,
  SLAPO__VALUE_BAD_NUMBER,  /* looks like a number but is not one: 0.5.1, 3x */
  SLAPO__VALUE_OUT_OF_RANGE /* an integer beyond 64 bits, a float beyond double */
} slapo__value_verdict;

/* Classifies an unquoted token as INT, FLOAT, BOOL or WORD and fills
 * out->kind, i, f, b (not key or text). A token "looks like a number" when
 * it starts with a digit, or with '+', '-' or '.' followed by a digit (or
 * '+'/'-' then '.'); such a token must match
 * [+-]?digits(.digits)?([eE][+-]?digits)? entirely. */
slapo__value_verdict slapo__value_classify(const char *tok, slapo_sched_arg *out);

/* c may appear in a bare word or an unquoted value. */
bool slapo__is_word_char(char c);
/* Shortest "%.Ng" text of a finite v that reads back exactly, with ".0"
 * appended when it has neither '.' nor an exponent. buf holds >= 32 bytes. */
void slapo__format_float(double v, char *buf, size_t cap);

/* Prints one argument as written in a `.sched` line (key=value or value;
 * strings quoted and escaped); returns the number of bytes written. */
int slapo__arg_print(const slapo_sched_arg *a, FILE *f);

#endif
