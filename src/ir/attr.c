/* ir/attr.c - call_op attributes: literal constructors, copying into a
 * graph's arena (with validation), and lookup by key with typed getters.
 * Layer: ir. */
#include <string.h>

#include "ir/internal.h"

slapo_attr slapo_attr_int(const char *key, int64_t v) {
  return (slapo_attr){.key = key, .kind = SLAPO_ATTR_INT, .i = v};
}

slapo_attr slapo_attr_float(const char *key, double v) {
  return (slapo_attr){.key = key, .kind = SLAPO_ATTR_FLOAT, .f = v};
}

slapo_attr slapo_attr_str(const char *key, const char *v) {
  return (slapo_attr){.key = key, .kind = SLAPO_ATTR_STR, .s = v};
}

slapo_attr slapo_attr_ints(const char *key, int n, const int64_t *v) {
  return (slapo_attr){.key = key, .kind = SLAPO_ATTR_INTS, .n = n, .ints = v};
}

/* Checks one attribute literal; `i` is its index for messages. */
static slapo_status check_attr(const char *what, int i, const slapo_attr *a) {
  if (!a->key || !*a->key)
    return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %d has a NULL or empty key", what, i);
  switch (a->kind) {
  case SLAPO_ATTR_INT:
  case SLAPO_ATTR_FLOAT: return SLAPO_OK;
  case SLAPO_ATTR_STR:
    if (!a->s)
      return slapo_error(SLAPO_INVALID_ARG, "%s: string attribute %s is NULL", what, a->key);
    return SLAPO_OK;
  case SLAPO_ATTR_INTS:
    if (a->n < 0 || (a->n > 0 && !a->ints))
      return slapo_error(SLAPO_INVALID_ARG,
                         "%s: int-array attribute %s has n %d and %s values; n must be >= 0 "
                         "and values non-NULL when n > 0",
                         what, a->key, a->n, a->ints ? "non-NULL" : "NULL");
    return SLAPO_OK;
  }
  return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %s has unknown kind %d", what, a->key,
                     (int)a->kind);
}

slapo_status slapo__ir_attrs_copy(slapo_arena *arena, const char *what, int n,
                                  const slapo_attr *src, slapo_attr **out) {
  *out = NULL;
  for (int i = 0; i < n; i++) {
    slapo_status s = check_attr(what, i, &src[i]);
    if (s != SLAPO_OK) return s;
    for (int j = 0; j < i; j++)
      if (!strcmp(src[j].key, src[i].key))
        return slapo_error(SLAPO_INVALID_ARG, "%s: attribute %s is given twice", what,
                           src[i].key);
  }
  if (n == 0) return SLAPO_OK;
  slapo_attr *dst = slapo_arena_alloc(arena, (size_t)n * sizeof *dst, 0);
  if (!dst) goto nomem;
  for (int i = 0; i < n; i++) {
    dst[i] = src[i];
    dst[i].key = slapo_arena_strdup(arena, src[i].key);
    if (!dst[i].key) goto nomem;
    if (src[i].kind == SLAPO_ATTR_STR) {
      dst[i].s = slapo_arena_strdup(arena, src[i].s);
      if (!dst[i].s) goto nomem;
    } else {
      dst[i].s = NULL;
    }
    if (src[i].kind == SLAPO_ATTR_INTS) {
      int64_t *v = NULL;
      if (src[i].n > 0) {
        v = slapo_arena_alloc(arena, (size_t)src[i].n * sizeof *v, 0);
        if (!v) goto nomem;
        memcpy(v, src[i].ints, (size_t)src[i].n * sizeof *v);
      }
      dst[i].ints = v;
    } else {
      dst[i].n = 0;
      dst[i].ints = NULL;
    }
  }
  *out = dst;
  return SLAPO_OK;
nomem:
  return slapo_error(SLAPO_NOMEM, "%s: out of memory copying attributes", what);
}

const slapo_attr *slapo_node_attr(const slapo_node *n, const char *key) {
  if (!n || !key) return NULL;
  for (int i = 0; i < n->n_attrs; i++)
    if (!strcmp(n->attrs[i].key, key)) return &n->attrs[i];
  return NULL;
}

int64_t slapo_node_attr_int(const slapo_node *n, const char *key, int64_t dflt) {
  const slapo_attr *a = slapo_node_attr(n, key);
  return a && a->kind == SLAPO_ATTR_INT ? a->i : dflt;
}

double slapo_node_attr_float(const slapo_node *n, const char *key, double dflt) {
  const slapo_attr *a = slapo_node_attr(n, key);
  return a && a->kind == SLAPO_ATTR_FLOAT ? a->f : dflt;
}

const char *slapo_node_attr_str(const slapo_node *n, const char *key, const char *dflt) {
  const slapo_attr *a = slapo_node_attr(n, key);
  return a && a->kind == SLAPO_ATTR_STR ? a->s : dflt;
}

bool slapo_node_is_op(const slapo_node *n, const struct slapo_op *op) {
  return n && op && n->kind == SLAPO_NODE_CALL_OP && n->op == op;
}
