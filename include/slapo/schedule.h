/* slapo/schedule.h - the schedule tree over a module tree (one node per
 * module), path lookup and glob selection, the schedule log (one entry per
 * applied primitive), the `.sched` text form (printer and parser) and the
 * expansion of a log's globs into numbered steps.
 * Layer: schedule (depends on module). Grammar: DESIGN.md §7. */
#ifndef SLAPO_SCHEDULE_H
#define SLAPO_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "slapo/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Schedule tree                                                             */
/* ------------------------------------------------------------------------ */

/* A node of the schedule tree: it mirrors one module (every module, list
 * containers such as transformer.h included) and is addressed by the dotted
 * path of that module from the tree's root ("transformer.h.0.attn"; the root
 * is "."). Handles are opaque and borrowed from the tree: valid until the
 * tree is freed or an ancestor of the node is rebuilt. */
typedef struct slapo_sched slapo_sched;

/* The log of applied primitives (see below). */
typedef struct slapo_sched_log slapo_sched_log;

/* Creates the schedule tree for `root` (borrowed: must outlive the tree),
 * one node per module below it, children in the module's order, with an
 * empty schedule log. *out is the root node, owned (slapo_sched_free).
 * Errors: SLAPO_NOMEM (nothing allocated remains). */
slapo_status slapo_sched_create(slapo_module *root, slapo_sched **out);

/* Frees the whole tree and its log. `root` must be a root node (one made by
 * slapo_sched_create); NULL is fine. The modules are not touched. */
void slapo_sched_free(slapo_sched *root);

/* The node at dotted `path` relative to `s` ("h.0.mlp"; list indices are
 * segments; "" and "." are `s` itself). *out is borrowed (see slapo_sched).
 * Errors: SLAPO_NOT_FOUND naming the full path, the deepest existing prefix
 * and its children ("no module 'transformer.h.7': 'transformer.h' has
 * children 0, 1, 2, 3"); SLAPO_INVALID_ARG for an empty segment ("a..b",
 * a leading or trailing '.'). *out is NULL on error. */
slapo_status slapo_sched_at(slapo_sched *s, const char *path, slapo_sched **out);

/* Full dotted path of the node from the tree's root; "" for the root (print
 * it as "."). Borrowed: valid while the node is. */
const char *slapo_sched_path(const slapo_sched *s);
/* The node's name in its parent ("mlp", "3"); "" for the root. Borrowed. */
const char *slapo_sched_name(const slapo_sched *s);
/* The module the node stands for. Borrowed (owned by the module tree). */
slapo_module *slapo_sched_module(const slapo_sched *s);
/* Parent node, or NULL for the root. Borrowed. */
slapo_sched *slapo_sched_parent(const slapo_sched *s);
/* The root of the tree `s` belongs to. Borrowed. */
slapo_sched *slapo_sched_root(const slapo_sched *s);
/* Number of children, and the i-th (0 <= i < count; borrowed). */
int slapo_sched_n_children(const slapo_sched *s);
slapo_sched *slapo_sched_child(const slapo_sched *s, int i);
/* Child named `name` (one segment), or NULL. Borrowed. */
slapo_sched *slapo_sched_child_named(const slapo_sched *s, const char *name);

/* Pre-order iteration over the subtree rooted at `top`: the node after `s`
 * (s itself included in the walk), or NULL after the last one:
 *   for (slapo_sched *n = top; n; n = slapo_sched_next(n, top)) ...
 * `s` must lie in the subtree of `top`. Borrowed. */
slapo_sched *slapo_sched_next(const slapo_sched *s, const slapo_sched *top);
/* Number of nodes in the subtree rooted at `s` (s included). */
size_t slapo_sched_count(const slapo_sched *s);

/* Re-creates the subtree below `node` after its module was replaced or its
 * children changed: the node's module is looked up again by name in the
 * parent node's module (the root keeps its module), and one fresh node is
 * made per child module, recursively. The node's own handle stays valid;
 * handles to its former descendants become invalid. Primitives that swap or
 * restructure a module call this.
 * Errors: SLAPO_NOT_FOUND (the parent's module has no child of this name
 * any more; the tree is unchanged), SLAPO_NOMEM (the tree is unchanged). */
slapo_status slapo_sched_rebuild(slapo_sched *node);

/* The log of the tree `s` belongs to (held by its root). Primitives append
 * to it. Borrowed: valid until slapo_sched_free. */
slapo_sched_log *slapo_sched_log_of(const slapo_sched *s);

/* Prints the subtree, one node a line, indented by depth, as
 * "path  (Type)" (the root as "."), to f. */
void slapo_sched_print(const slapo_sched *s, FILE *f);

/* ------------------------------------------------------------------------ */
/* Selection by glob                                                         */
/* ------------------------------------------------------------------------ */

/* A list of nodes, caller-allocated. `items` is owned by the list (free it
 * with slapo_sched_list_deinit); the nodes themselves are borrowed from the
 * tree. A zeroed struct is an empty list. */
typedef struct slapo_sched_list {
  size_t n;
  slapo_sched **items; /* [n]                                  */
  size_t cap;          /* capacity of items, for the library   */
} slapo_sched_list;

/* Frees the list's array and empties it. NULL and empty lists are fine. */
void slapo_sched_list_deinit(slapo_sched_list *list);

/* Every node below `s` whose path relative to `s` matches `glob`, in tree
 * pre-order, each once. Glob syntax, per '.'-separated segment:
 *   name       a literal segment ("mlp", "3")
 *   *          any characters within one segment ("*", "c_*")
 *   **         (a whole segment) zero or more segments
 *   {a,b,c}    any of the alternatives (each may hold * and literals)
 *   {0..5}     a decimal index in the inclusive range 0..5
 * "" and "." select `s` itself. Pieces combine within a segment
 * ("c_{fc,proj}", "h{0..3}"). `out` is overwritten (its old contents are
 * not freed); on error it is left empty.
 * Errors: SLAPO_PARSE for a malformed glob, naming the 1-based column
 * ("glob 'h.{0,1': column 3: expected '}' to close this '{', got end of
 * glob"); SLAPO_NO_MATCH naming the glob and the nearest existing prefix
 * (the deepest node matching the longest leading run of the glob's
 * segments) with its children; SLAPO_NOMEM. */
slapo_status slapo_sched_select(slapo_sched *s, const char *glob, slapo_sched_list *out);

/* ------------------------------------------------------------------------ */
/* The schedule log                                                          */
/* ------------------------------------------------------------------------ */

/* The kind of an argument value in a `.sched` line. */
typedef enum slapo_sched_arg_kind {
  SLAPO_SCHED_ARG_WORD,   /* bare word: FlashAttention, cc                  */
  SLAPO_SCHED_ARG_INT,    /* 3, -1                                          */
  SLAPO_SCHED_ARG_FLOAT,  /* 0.5, 1e-05: has a '.' or an exponent           */
  SLAPO_SCHED_ARG_BOOL,   /* true, false                                    */
  SLAPO_SCHED_ARG_STRING  /* "double quoted", with \" and \\ escapes        */
} slapo_sched_arg_kind;

/* One argument: positional (key NULL) or key=value. `text` is the value as
 * written for WORD, INT, FLOAT and BOOL ("0.50" stays "0.50" when printed)
 * and the unescaped contents for STRING. The number fields hold the value:
 * `i` for INT, `f` for FLOAT and INT, `b` for BOOL. */
typedef struct slapo_sched_arg {
  const char *key;
  slapo_sched_arg_kind kind;
  const char *text;
  int64_t i;
  double f;
  bool b;
} slapo_sched_arg;

/* Argument constructors for appending entries from C. `key` NULL makes a
 * positional argument; strings are borrowed until the append copies them.
 * For INT, FLOAT and BOOL `text` is left NULL and the log formats the value
 * (floats as the shortest text that reads back exactly, with a '.' or an
 * exponent, so "1.0" rather than "1"). */
slapo_sched_arg slapo_sched_arg_word(const char *key, const char *word);
slapo_sched_arg slapo_sched_arg_int(const char *key, int64_t v);
slapo_sched_arg slapo_sched_arg_float(const char *key, double v);
slapo_sched_arg slapo_sched_arg_bool(const char *key, bool v);
slapo_sched_arg slapo_sched_arg_string(const char *key, const char *s);

/* Whether s is a name in `.sched` syntax: [A-Za-z_][A-Za-z0-9_]*, and with
 * with_dot '.' also allowed after the first character. Primitive names,
 * argument keys, and the names of modules a primitive creates (fuse's
 * <name>_<k>, which later paths must be able to spell) are names. */
bool slapo_sched_is_name(const char *s, bool with_dot);

/* One entry: a line of a `.sched` file, or one applied primitive. */
typedef struct slapo_sched_entry {
  const char *path;      /* module path or glob as written; "." is the root */
  const char *primitive; /* "replace", "checkpoint"                         */
  int n_args;
  const slapo_sched_arg *args; /* [n_args], in order                        */
  const char *file;      /* source: the .sched file or the C file that made
                            it; NULL when unknown                           */
  int line;              /* 1-based line in `file`; 0 when unknown          */
  bool replayable;       /* false: refers to a C-only object (an
                            unregistered module), printed with a trailing
                            "# not replayable"                              */
} slapo_sched_entry;

/* Creates an empty log. *out owned (slapo_sched_log_free). Errors: NOMEM. */
slapo_status slapo_sched_log_new(slapo_sched_log **out);
void slapo_sched_log_free(slapo_sched_log *log); /* NULL is fine */

/* Appends a deep copy of `e` (all strings and the argument array are copied,
 * so `e` may live on the stack). A path "" is stored as ".".
 * Errors (log unchanged): SLAPO_INVALID_ARG when the entry could not be
 * printed as a `.sched` line that reads back the same: a path that is not
 * a well-formed path or glob (whitespace, '"', '=', '#', an unclosed
 * brace ...); a primitive that is not a name
 * ([A-Za-z_][A-Za-z0-9_]*); a key not a name ([A-Za-z_][A-Za-z0-9_.]*) or
 * repeated; a WORD that is empty, holds whitespace, '"', '=' or '#', or
 * would read back as a number or boolean; a STRING holding a control
 * character; a non-finite FLOAT; a `text` that does not read back as the
 * given kind and value. SLAPO_NOMEM. */
slapo_status slapo_sched_log_append(slapo_sched_log *log, const slapo_sched_entry *e);

/* Number of entries, and the i-th (0 <= i < count). The entry and every
 * string in it are borrowed: valid until the log is freed. */
size_t slapo_sched_log_count(const slapo_sched_log *log);
const slapo_sched_entry *slapo_sched_log_entry(const slapo_sched_log *log, size_t i);

/* Prints the log as a `.sched` file to f: a header comment, then one line
 * per entry with the path and primitive columns aligned (path column: the
 * widest path or header + 2 spaces; primitive column: the widest primitive
 * + 3), as in DESIGN.md §7. Printing, parsing and printing again gives the
 * same text. */
void slapo_sched_log_print(const slapo_sched_log *log, FILE *f);

/* Prints one entry as a `.sched` line (single spaces, no newline) to f. */
void slapo_sched_entry_print(const slapo_sched_entry *e, FILE *f);

/* ------------------------------------------------------------------------ */
/* Reading arguments of an entry                                             */
/* ------------------------------------------------------------------------ */

/* Error messages below start with the entry's location ("m.sched:3: ",
 * or the path when the file is unknown) and the primitive, and name the
 * key: "m.sched:3: checkpoint: ratio=abc: expected a number, got 'abc'". */

/* The argument named `key`, or NULL. Borrowed from the entry. */
const slapo_sched_arg *slapo_sched_entry_find(const slapo_sched_entry *e, const char *key);
/* The i-th positional argument (0-based, counting only unkeyed ones), or
 * NULL. Borrowed. */
const slapo_sched_arg *slapo_sched_entry_positional(const slapo_sched_entry *e, int i);

/* Typed lookups of key=value arguments. When the key is absent: with
 * `required` the result is SLAPO_INVALID_ARG ("missing argument 'axis'"),
 * otherwise SLAPO_OK with *out left as it was (preset it to the default).
 * A value of the wrong kind is SLAPO_INVALID_ARG: get_int wants INT,
 * get_float INT or FLOAT, get_bool true/false, get_string a WORD or a
 * STRING (borrowed from the entry). */
slapo_status slapo_sched_entry_get_int(const slapo_sched_entry *e, const char *key, bool required,
                                       int64_t *out);
slapo_status slapo_sched_entry_get_float(const slapo_sched_entry *e, const char *key,
                                         bool required, double *out);
slapo_status slapo_sched_entry_get_bool(const slapo_sched_entry *e, const char *key,
                                        bool required, bool *out);
slapo_status slapo_sched_entry_get_string(const slapo_sched_entry *e, const char *key,
                                          bool required, const char **out);

/* Checks that every keyed argument is one of `known` (NULL-terminated) and
 * that there are at most `max_positional` positional ones.
 * Errors: SLAPO_INVALID_ARG naming the unknown key and listing the known
 * ones, or the surplus positional argument. */
slapo_status slapo_sched_entry_check_args(const slapo_sched_entry *e, const char *const *known,
                                          int max_positional);

/* ------------------------------------------------------------------------ */
/* .sched files                                                              */
/* ------------------------------------------------------------------------ */

/* Parses `.sched` text (DESIGN.md §7) into a new log: one entry per line
 * (path-or-glob, primitive name, arguments separated by spaces or tabs),
 * '#' outside a string starts a comment, blank lines are skipped, "\r\n"
 * line ends are accepted. A trailing comment "# not replayable" marks the
 * entry as not replayable. Each entry remembers `filename` (NULL: "<string>")
 * and its line. *out owned (slapo_sched_log_free); NULL on error.
 * Errors: SLAPO_PARSE "file:line:column: expected ..., got ..." for the
 * first problem (unterminated string, unknown escape, missing primitive
 * name, '=' without a key, a missing value, a bad number such as
 * ratio=0.5.1, a repeated key, a malformed glob); SLAPO_NOMEM. */
slapo_status slapo_sched_parse(const char *text, const char *filename, slapo_sched_log **out);

/* Reads and parses the file at `path` (named in messages as given).
 * Errors: SLAPO_IO naming the file and the system's reason when it cannot be
 * read; those of slapo_sched_parse. */
slapo_status slapo_sched_parse_file(const char *path, slapo_sched_log **out);

/* ------------------------------------------------------------------------ */
/* Expansion: one numbered step per matched module                           */
/* ------------------------------------------------------------------------ */

/* One step of an expanded log. */
typedef struct slapo_sched_step {
  size_t number;                  /* 1-based, in expansion order            */
  const char *path;               /* concrete path from the tree's root
                                     ("." the root); owned by the list      */
  const slapo_sched_entry *entry; /* the line it came from (file, line,
                                     primitive, arguments); borrowed from
                                     the log                                */
} slapo_sched_step;

/* A caller-allocated list of steps; a zeroed struct is empty. */
typedef struct slapo_sched_steps {
  size_t n;
  slapo_sched_step *items; /* [n], owned                  */
  void *impl;              /* storage of the paths; owned */
} slapo_sched_steps;

void slapo_sched_steps_deinit(slapo_sched_steps *steps); /* NULL is fine */

/* Expands each entry of `log` against the tree below `root` (usually the
 * tree's root): an entry becomes one step per node its path or glob selects,
 * in tree pre-order, entries in log order, numbered from 1. Paths are stored
 * as strings (not node handles) because applying a step may rebuild the
 * nodes later steps name. `out` is overwritten; empty on error.
 * Errors: those of slapo_sched_select prefixed with the entry's
 * "file:line: " (SLAPO_NO_MATCH, SLAPO_PARSE); SLAPO_NOMEM. */
slapo_status slapo_sched_expand(const slapo_sched_log *log, slapo_sched *root,
                                slapo_sched_steps *out);

/* Prints the steps as `slapo show --schedule` does: the number, the
 * concrete path, the primitive and arguments, and "# file:line", columns
 * aligned, one a line. */
void slapo_sched_steps_print(const slapo_sched_steps *steps, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_SCHEDULE_H */
