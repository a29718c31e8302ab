/* module/shard.c - parameters split across a process group (the shard
 * primitive's effect on the module tree) and module syncs. A module learns
 * its local sizes from its parameters' shapes, so nothing else in the tree
 * changes; the shard record says which piece of the unsharded tensor the
 * value holds, for materialization, weight copies and gathered saves.
 * Layer: module. */
#include <stdio.h>
#include <string.h>

#include "module/internal.h"

void slapo__param_free_shard(slapo_parameter *p) {
  for (int i = 0; i < p->n_shard_users; i++) slapo_free(p->shard_users[i]);
  slapo_free(p->shard_users);
  slapo_free(p->shard);
  p->shard = NULL, p->shard_users = NULL, p->n_shard_users = 0;
}

bool slapo_parameter_is_sharded(const slapo_parameter *p) {
  return p->shard && p->shard->count > 1;
}

slapo_layout slapo_parameter_layout(const slapo_parameter *p) {
  if (!slapo_parameter_is_sharded(p)) return (slapo_layout){.kind = SLAPO_LAYOUT_REPLICATED};
  const slapo_shard *s = p->shard;
  int64_t full = s->full[s->axis], block = full / s->parts / s->count;
  return (slapo_layout){SLAPO_LAYOUT_SPLIT, s->axis, s->parts, (int64_t)s->index * block, full};
}

int slapo_parameter_full_shape(const slapo_parameter *p, int64_t *shape) {
  if (p->shard) {
    slapo_shard_orig_shape(p->shard, shape);
    return p->shard->ndim;
  }
  memcpy(shape, p->value->shape, sizeof(int64_t) * (size_t)p->value->ndim);
  return p->value->ndim;
}

static bool same_layout(const slapo_shard *a, const slapo_shard *b) {
  return a->axis == b->axis && a->parts == b->parts && a->index == b->index &&
         a->count == b->count && a->valid == b->valid &&
         slapo_shape_equal(a->ndim, a->full, b->ndim, b->full);
}

static slapo_status add_user(slapo_parameter *p, const char *user) {
  for (int i = 0; i < p->n_shard_users; i++)
    if (!strcmp(p->shard_users[i], user)) return SLAPO_OK;
  char **u = slapo_realloc(p->shard_users, sizeof *u * (size_t)(p->n_shard_users + 1));
  if (!u) return slapo_error(SLAPO_NOMEM, "shard: out of memory");
  p->shard_users = u;
  if (!(u[p->n_shard_users] = slapo_strdup(user)))
    return slapo_error(SLAPO_NOMEM, "shard: out of memory");
  p->n_shard_users++;
  return SLAPO_OK;
}

/* The new value (and grad) of p for layout s. */
static slapo_status local_tensors(const slapo_parameter *p, const slapo_shard *s,
                                  slapo_tensor **value, slapo_tensor **grad) {
  int64_t shape[SLAPO_MAX_DIMS];
  slapo_shard_local_shape(s, shape);
  *value = *grad = NULL;
  if (slapo_tensor_is_meta(p->value))
    return slapo_tensor_new_meta(SLAPO_DTYPE_F32, s->ndim, shape, value);
  SLAPO_TRY(slapo_shard_slice(s, p->value, value));
  slapo_status st = slapo_tensor_new(SLAPO_DTYPE_F32, s->ndim, shape, grad);
  if (st != SLAPO_OK) {
    slapo_tensor_free(*value);
    *value = NULL;
  }
  return st;
}

slapo_status slapo_parameter_shard(slapo_parameter *p, const slapo_shard *s, int group,
                                   const char *user) {
  if (p->shard) {
    if (!same_layout(p->shard, s) || p->shard_group != group)
      return slapo_error(SLAPO_STATE, "%s is already sharded along axis %d (parts %d); a tied "
                         "use must shard it the same way (asked: axis %d, parts %d)",
                         p->path ? p->path : "parameter", p->shard->axis, p->shard->parts,
                         s->axis, s->parts);
    return add_user(p, user);
  }
  int64_t orig[SLAPO_MAX_DIMS];
  slapo_shard_orig_shape(s, orig);
  if (!slapo_shape_equal(p->value->ndim, p->value->shape, s->ndim, orig))
    return slapo_error(SLAPO_SHAPE, "shard: layout does not match the parameter's shape");
  slapo_shard *rec = slapo_malloc(sizeof *rec);
  char *u = slapo_strdup(user);
  char **users = slapo_malloc(sizeof *users);
  slapo_tensor *value = NULL, *grad = NULL;
  slapo_status st = rec && u && users ? local_tensors(p, s, &value, &grad)
                                      : slapo_error(SLAPO_NOMEM, "shard: out of memory");
  if (st != SLAPO_OK) {
    slapo_free(rec), slapo_free(u), slapo_free(users);
    return st;
  }
  *rec = *s;
  users[0] = u;
  slapo_tensor_free(p->value);
  slapo_tensor_free(p->grad);
  p->value = value, p->grad = grad;
  p->shard = rec, p->shard_group = group;
  p->shard_users = users, p->n_shard_users = 1;
  return SLAPO_OK;
}

slapo_status slapo_module_add_sync(slapo_module *m, const slapo_module_sync *sync) {
  if (m->n_syncs == 8) return slapo_error(SLAPO_LIMIT, "a module holds at most 8 syncs");
  if (!sync->emit) return slapo_error(SLAPO_INVALID_ARG, "a sync needs an emit function");
  slapo_module_sync *s = slapo_realloc(m->syncs, sizeof *s * (size_t)(m->n_syncs + 1));
  if (!s) return slapo_error(SLAPO_NOMEM, "sync: out of memory");
  m->syncs = s;
  s[m->n_syncs++] = *sync;
  return SLAPO_OK;
}

slapo_node *slapo__apply_syncs(slapo_ctx *ctx, const slapo_module *m, slapo_sync_where where,
                               slapo_node *x) {
  for (int i = 0; i < m->n_syncs && x; i++)
    if (m->syncs[i].where == where) x = m->syncs[i].emit(ctx, x, m->syncs[i].args);
  return x;
}

/* ---- every use of a sharded parameter declared it ---- */

static slapo_status check_module(const slapo_module *m, char *path, size_t len, size_t cap) {
  for (int i = 0; i < m->n_params; i++) {
    const slapo_parameter *p = m->params[i];
    if (!p->shard) continue;
    bool declared = false;
    for (int k = 0; k < p->n_shard_users && !declared; k++)
      declared = !strcmp(p->shard_users[k], path);
    if (!declared)
      return slapo_error(SLAPO_PRECOND, "%s%s%s is %s, sharded by %s, but %s does not shard "
                         "it: shard every use of a tied parameter the same way (e.g. '%s "
                         "shard %s axis=%d')", path, path[0] ? "." : "", m->param_names[i],
                         p->path ? p->path : "a tied parameter", p->shard_users[0],
                         path[0] ? path : "(root)", path[0] ? path : ".", m->param_names[i],
                         p->shard->axis);
  }
  for (int i = 0; i < m->n_children; i++) {
    int w = snprintf(path + len, cap - len, "%s%s", len ? "." : "", m->children[i]->name);
    if (w < 0 || len + (size_t)w >= cap) return slapo_error(SLAPO_LIMIT, "module path too long");
    SLAPO_TRY(check_module(m->children[i], path, len + (size_t)w, cap));
    path[len] = '\0';
  }
  return SLAPO_OK;
}

slapo_status slapo__check_shards(slapo_module *root) {
  char path[1024] = "";
  return check_module(root, path, 0, sizeof path);
}
