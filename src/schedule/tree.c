/* schedule/tree.c - the schedule tree: one node per module, built by
 * walking the module tree; path lookup with messages naming the deepest
 * existing prefix; accessors; pre-order iteration; rebuilding a subtree
 * after its module changed (transactional: build first, then swap).
 * Layer: schedule. */
#include <stdio.h>
#include <string.h>

#include "schedule/internal.h"

/* Frees a node and its subtree (not the log). */
static void node_free(slapo_sched *s) {
  if (!s) return;
  for (int i = 0; i < s->n_children; i++) node_free(s->children[i]);
  slapo_free(s->children);
  slapo_free(s->name);
  slapo_free(s->path);
  slapo_free(s);
}

/* Makes `s`'s children (and theirs) from `m`'s children into *kids_out.
 * On NOMEM nothing allocated remains. */
static slapo_status make_children(slapo_sched *s, const slapo_module *m, slapo_sched ***kids_out);

static slapo_status node_new(slapo_module *m, const char *name, slapo_sched *parent, int index,
                             slapo_sched **out) {
  *out = NULL;
  slapo_sched *s = slapo_calloc(1, sizeof *s);
  if (!s) return slapo_error(SLAPO_NOMEM, "sched: out of memory creating a schedule node");
  s->module = m;
  s->parent = parent;
  s->index = index;
  s->name = slapo_strdup(name);
  if (parent && parent->path[0]) {
    size_t np = strlen(parent->path), nn = strlen(name);
    s->path = slapo_malloc(np + nn + 2);
    if (s->path) {
      memcpy(s->path, parent->path, np);
      s->path[np] = '.';
      memcpy(s->path + np + 1, name, nn + 1);
    }
  } else {
    s->path = slapo_strdup(name);
  }
  if (!s->name || !s->path) {
    node_free(s);
    return slapo_error(SLAPO_NOMEM, "sched: out of memory creating a schedule node");
  }
  slapo_status st = make_children(s, m, &s->children);
  if (st != SLAPO_OK) {
    node_free(s);
    return st;
  }
  s->n_children = m->n_children;
  *out = s;
  return SLAPO_OK;
}

static slapo_status make_children(slapo_sched *s, const slapo_module *m, slapo_sched ***kids_out) {
  *kids_out = NULL;
  if (m->n_children == 0) return SLAPO_OK;
  slapo_sched **kids = slapo_calloc((size_t)m->n_children, sizeof *kids);
  if (!kids) return slapo_error(SLAPO_NOMEM, "sched: out of memory creating a schedule node");
  for (int i = 0; i < m->n_children; i++) {
    slapo_status st = node_new(m->children[i], m->children[i]->name, s, i, &kids[i]);
    if (st != SLAPO_OK) {
      for (int j = 0; j < i; j++) node_free(kids[j]);
      slapo_free(kids);
      return st;
    }
  }
  *kids_out = kids;
  return SLAPO_OK;
}

slapo_status slapo_sched_create(slapo_module *root, slapo_sched **out) {
  *out = NULL;
  slapo_sched *s;
  SLAPO_TRY(node_new(root, "", NULL, 0, &s));
  slapo_status st = slapo_sched_log_new(&s->log);
  if (st != SLAPO_OK) {
    node_free(s);
    return st;
  }
  *out = s;
  return SLAPO_OK;
}

void slapo_sched_free(slapo_sched *root) {
  if (!root) return;
  SLAPO_ASSERT(root->parent == NULL);
  slapo_sched_log_free(root->log);
  node_free(root);
}

const char *slapo_sched_path(const slapo_sched *s) { return s->path; }
const char *slapo_sched_name(const slapo_sched *s) { return s->name; }
slapo_module *slapo_sched_module(const slapo_sched *s) { return s->module; }
slapo_sched *slapo_sched_parent(const slapo_sched *s) { return s->parent; }
int slapo_sched_n_children(const slapo_sched *s) { return s->n_children; }

slapo_sched *slapo_sched_root(const slapo_sched *s) {
  while (s->parent) s = s->parent;
  return (slapo_sched *)s;
}

slapo_sched *slapo_sched_child(const slapo_sched *s, int i) {
  SLAPO_ASSERT(i >= 0 && i < s->n_children);
  return s->children[i];
}

slapo_sched *slapo_sched_child_named(const slapo_sched *s, const char *name) {
  for (int i = 0; i < s->n_children; i++)
    if (!strcmp(s->children[i]->name, name)) return s->children[i];
  return NULL;
}

/* Same as slapo_sched_child_named for a segment given as (ptr, len). */
static slapo_sched *child_seg(const slapo_sched *s, const char *seg, size_t len) {
  for (int i = 0; i < s->n_children; i++)
    if (strlen(s->children[i]->name) == len && !memcmp(s->children[i]->name, seg, len))
      return s->children[i];
  return NULL;
}

slapo_sched_log *slapo_sched_log_of(const slapo_sched *s) { return slapo_sched_root(s)->log; }

void slapo__sched_children_text(const slapo_sched *s, char *buf, size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < s->n_children; i++) slapo_list_append(buf, cap, s->children[i]->name);
}

/* "'transformer.h' has children 0, 1, 2, 3" or "'x' has no children". */
static slapo_status not_found(const slapo_sched *s, const char *path, const slapo_sched *deepest) {
  char kids[768];
  slapo__sched_children_text(deepest, kids, sizeof kids);
  const char *full_sep = s->path[0] ? "." : "";
  if (!deepest->n_children)
    return slapo_error(SLAPO_NOT_FOUND, "no module '%s%s%s': '%s' has no children", s->path,
                       full_sep, path, slapo__sched_display_path(deepest));
  return slapo_error(SLAPO_NOT_FOUND, "no module '%s%s%s': '%s' has children %s", s->path,
                     full_sep, path, slapo__sched_display_path(deepest), kids);
}

slapo_status slapo_sched_at(slapo_sched *s, const char *path, slapo_sched **out) {
  *out = NULL;
  SLAPO_NEED(s, "sched_at");
  SLAPO_NEED(path, "sched_at");
  if (!path[0] || !strcmp(path, ".")) {
    *out = s;
    return SLAPO_OK;
  }
  slapo_sched *cur = s;
  const char *p = path;
  for (;;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len == 0 || (dot && !dot[1]))
      return slapo_error(SLAPO_INVALID_ARG,
                         "bad module path '%s': empty segment at column %d (segments are "
                         "separated by single dots, e.g. 'transformer.h.0')",
                         path, (int)(p - path) + 1 + (len == 0 ? 0 : (int)len));
    slapo_sched *next = child_seg(cur, p, len);
    if (!next) return not_found(s, path, cur);
    cur = next;
    if (!dot) break;
    p = dot + 1;
  }
  *out = cur;
  return SLAPO_OK;
}

slapo_sched *slapo_sched_next(const slapo_sched *s, const slapo_sched *top) {
  if (s->n_children) return s->children[0];
  while (s != top && s->parent) {
    const slapo_sched *par = s->parent;
    if (s->index + 1 < par->n_children) return par->children[s->index + 1];
    s = par;
  }
  return NULL;
}

size_t slapo_sched_count(const slapo_sched *s) {
  size_t n = 1;
  for (int i = 0; i < s->n_children; i++) n += slapo_sched_count(s->children[i]);
  return n;
}

slapo_status slapo_sched_rebuild(slapo_sched *node) {
  slapo_module *m = node->module;
  if (node->parent) {
    m = slapo_module_child(node->parent->module, node->name);
    if (!m)
      return slapo_error(SLAPO_NOT_FOUND,
                         "sched: cannot rebuild '%s': module '%s' has no child '%s' any more",
                         node->path, slapo__sched_display_path(node->parent), node->name);
  }
  slapo_sched **kids;
  SLAPO_TRY(make_children(node, m, &kids));
  for (int i = 0; i < node->n_children; i++) node_free(node->children[i]);
  slapo_free(node->children);
  node->children = kids;
  node->n_children = m->n_children;
  node->module = m;
  return SLAPO_OK;
}

static void print_rec(const slapo_sched *s, FILE *f, int depth) {
  fprintf(f, "%*s%s  (%s)\n", 2 * depth, "", slapo__sched_display_path(s), s->module->type->name);
  for (int i = 0; i < s->n_children; i++) print_rec(s->children[i], f, depth + 1);
}

void slapo_sched_print(const slapo_sched *s, FILE *f) { print_rec(s, f, 0); }
