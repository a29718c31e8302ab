/* schedule/expand.c - expanding a schedule log against a tree: each entry's
 * path or glob becomes one numbered step per selected module (tree
 * pre-order, entries in order, numbers from 1, as `slapo show --schedule`,
 * `--disable` and `--bisect` count them), and printing the steps.
 * Layer: schedule. */
#include <stdio.h>
#include <string.h>

#include "schedule/internal.h"

void slapo_sched_steps_deinit(slapo_sched_steps *steps) {
  if (!steps) return;
  slapo_free(steps->items);
  slapo_arena_free(steps->impl);
  memset(steps, 0, sizeof *steps);
}

static slapo_status add_step(slapo_sched_steps *out, size_t *cap, const slapo_sched_entry *e,
                             const slapo_sched *node) {
  if (out->n == *cap) {
    size_t ncap = *cap ? 2 * *cap : 16;
    slapo_sched_step *it = slapo_realloc(out->items, ncap * sizeof *it);
    if (!it) return slapo_error(SLAPO_NOMEM, "sched expand: out of memory");
    out->items = it;
    *cap = ncap;
  }
  char *path = slapo_arena_strdup(out->impl, slapo__sched_display_path(node));
  if (!path) return slapo_error(SLAPO_NOMEM, "sched expand: out of memory");
  out->items[out->n] = (slapo_sched_step){out->n + 1, path, e};
  out->n++;
  return SLAPO_OK;
}

/* Whether the last segment of path is <Name>_<k>, the name fuse and a
 * pattern replace give the modules they create. */
static bool created_name(const char *path) {
  const char *seg = strrchr(path, '.'), *u = strrchr(path, '_');
  seg = seg ? seg + 1 : path;
  if (!u || u < seg || !u[1]) return false;
  for (const char *c = u + 1; *c; c++)
    if (*c < '0' || *c > '9') return false;
  return true;
}

slapo_status slapo_sched_expand(const slapo_sched_log *log, slapo_sched *root,
                                slapo_sched_steps *out) {
  memset(out, 0, sizeof *out);
  slapo_arena *a;
  SLAPO_TRY(slapo_arena_new(0, &a));
  out->impl = a;
  size_t cap = 0;
  slapo_status st = SLAPO_OK;
  for (size_t i = 0; st == SLAPO_OK && i < slapo_sched_log_count(log); i++) {
    const slapo_sched_entry *e = slapo_sched_log_entry(log, i);
    slapo_sched_list sel;
    st = slapo_sched_select(root, e->path, &sel);
    if (st != SLAPO_OK && st != SLAPO_NOMEM) {
      /* Every line is expanded against the model as built, before any line
       * applies (so steps are numbered up front for --disable): a module an
       * earlier line creates (fuse's F_0, named <Name>_<k>) has no path yet. */
      char msg[1200];
      snprintf(msg, sizeof msg, "%s%s", slapo_last_error(),
               st == SLAPO_NO_MATCH && created_name(e->path)
                   ? " (paths are matched against the model before the schedule applies: a "
                     "module an earlier line creates cannot be named)"
                   : "");
      if (e->file && e->line > 0) st = slapo_error(st, "%s:%d: %s", e->file, e->line, msg);
      else if (e->file) st = slapo_error(st, "%s: %s", e->file, msg);
      else st = slapo_error(st, "%s", msg);
    }
    for (size_t k = 0; st == SLAPO_OK && k < sel.n; k++) st = add_step(out, &cap, e, sel.items[k]);
    slapo_sched_list_deinit(&sel);
  }
  if (st != SLAPO_OK) slapo_sched_steps_deinit(out);
  return st;
}

/* Bytes slapo__arg_print writes for a. */
static int arg_width(const slapo_sched_arg *a) {
  int n = a->key ? (int)strlen(a->key) + 1 : 0;
  if (a->kind != SLAPO_SCHED_ARG_STRING) return n + (int)strlen(a->text);
  n += 2;
  for (const char *p = a->text; *p; p++) n += (*p == '"' || *p == '\\') ? 2 : 1;
  return n;
}

static int args_width(const slapo_sched_entry *e) {
  int n = 0;
  for (int j = 0; j < e->n_args; j++) n += (j ? 1 : 0) + arg_width(&e->args[j]);
  return n;
}

void slapo_sched_steps_print(const slapo_sched_steps *steps, FILE *f) {
  int wnum = 1, wpath = 1, wprim = 1, wargs = 0;
  for (size_t i = 0; i < steps->n; i++) {
    const slapo_sched_step *s = &steps->items[i];
    int d = snprintf(NULL, 0, "%zu", s->number), lp = (int)strlen(s->path);
    int lq = (int)strlen(s->entry->primitive), la = args_width(s->entry);
    if (d > wnum) wnum = d;
    if (lp > wpath) wpath = lp;
    if (lq > wprim) wprim = lq;
    if (la > wargs) wargs = la;
  }
  for (size_t i = 0; i < steps->n; i++) {
    const slapo_sched_step *s = &steps->items[i];
    const slapo_sched_entry *e = s->entry;
    bool note = e->file || !e->replayable;
    /* Columns: number, path, primitive, arguments, "# file:line"; no
     * trailing spaces when a line ends early. */
    fprintf(f, "%*zu  %-*s  %-*s", wnum, s->number, wpath, s->path,
            e->n_args || note ? wprim : 0, e->primitive);
    int w = 0;
    if (e->n_args) {
      fputs("  ", f);
      for (int j = 0; j < e->n_args; j++) {
        if (j) w += fprintf(f, " ");
        w += slapo__arg_print(&e->args[j], f);
      }
    }
    if (note) {
      if (wargs) fprintf(f, "%*s", wargs - w + (e->n_args ? 0 : 2), "");
      fputs("  #", f);
      if (e->file && e->line > 0) fprintf(f, " %s:%d", e->file, e->line);
      else if (e->file) fprintf(f, " %s", e->file);
      if (!e->replayable) fprintf(f, "%s not replayable", e->file ? "," : "");
    }
    fputc('\n', f);
  }
}
