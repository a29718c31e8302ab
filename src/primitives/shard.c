/* primitives/shard.c - the `shard` primitive: split a parameter along an
 * axis across the tensor-parallel group (Shoeybi et al. 2019, Megatron-LM).
 * Layer: primitives.
 *
 * Its form, effect, errors and how verify checks it are documented once,
 * in the descriptor's .doc below (`slapo help shard` prints it). */
#include <stdio.h>
#include <string.h>

#include "primitives/internal.h"
#include "slapo/dist.h"

static slapo_status shard_impl(slapo_sched *node, const char *param, int axis, int parts,
                               int64_t pad, const slapo_sched_entry *from) {
  const char *path = slapo__prim_path(node);
  slapo_module *m = slapo_sched_module(node);
  slapo_parameter *p;
  SLAPO_TRY(slapo__prim_param(node, "shard", param, &p));
  SLAPO_TRY(slapo__prim_not_inlined(node, "shard"));
  /* A traced graph bakes the shapes it was captured at (head counts in
   * reshapes): shard first, then trace, and the graph has the local ones. */
  for (const slapo_module *a = m; a; a = a->parent)
    if (slapo_module_graph(a)) {
      char *ap = slapo_module_path(a);
      slapo_status st = slapo_error(SLAPO_STATE, "shard: %s: %s is traced already, with the "
                                    "unsharded shapes; shard before trace", path,
                                    ap && ap[0] ? ap : "the root");
      slapo_free(ap);
      return st;
    }
  if (parts > 1 && !strcmp(m->type->name, "Embedding"))
    return slapo_error(SLAPO_INVALID_ARG, "shard: %s.%s: an Embedding splits its vocabulary "
                       "in one block (parts=1), got parts=%d", path, param, parts);
  int64_t full[SLAPO_MAX_DIMS];
  int nd = slapo_parameter_full_shape(p, full);
  slapo_shard s;
  slapo_status st = slapo_shard_make(nd, full, axis, parts, slapo_dist_rank(SLAPO_GROUP_TP),
                                     slapo_dist_size(SLAPO_GROUP_TP), pad, &s);
  if (st != SLAPO_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", slapo_last_error()); /* slapo_error overwrites it */
    char dims[96], own[1100], tied[1200] = "";
    slapo_shape_str(nd, full, dims, sizeof dims);
    snprintf(own, sizeof own, "%s.%s", path, param);
    if (p->path && strcmp(p->path, own)) snprintf(tied, sizeof tied, ", tied to %s", p->path);
    return slapo_error(st, "shard: %s (%s%s) across the tensor-parallel group of %d: %s", own,
                       dims, tied, slapo_dist_size(SLAPO_GROUP_TP), why);
  }
  slapo_sched_arg args[3] = {slapo_sched_arg_word(NULL, param),
                             slapo_sched_arg_int("axis", axis)};
  int na = 2;
  if (parts > 1) args[na++] = slapo_sched_arg_int("parts", parts);
  if (pad > 1) args[na++] = slapo_sched_arg_int("pad", pad);
  SLAPO_TRY(slapo__prim_log_check(node, "shard", na, args));
  char *user = slapo_module_path(m);
  if (!user) return slapo_error(SLAPO_NOMEM, "shard: out of memory");
  st = slapo_parameter_shard(p, &s, SLAPO_GROUP_TP, user);
  slapo_free(user);
  if (st != SLAPO_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", slapo_last_error());
    return slapo_error(st, "shard: %s.%s: %s", path, param, why);
  }
  slapo_module_touch(m);
  return slapo__prim_log(node, "shard", na, args, from, true);
}

slapo_status slapo_shard_param(slapo_sched *node, const char *param, int axis, int parts,
                               int64_t pad) {
  if (!param) return slapo_error(SLAPO_INVALID_ARG, "shard: parameter name is NULL");
  return shard_impl(node, param, axis, parts, pad, NULL);
}

static slapo_status apply(slapo_sched *node, const slapo_sched_entry *e) {
  SLAPO_TRY(slapo_sched_entry_check_args(e, (const char *const[]){"axis", "parts", "pad", NULL},
                                         1));
  const slapo_sched_arg *p = slapo_sched_entry_positional(e, 0);
  if (!p || p->kind != SLAPO_SCHED_ARG_WORD)
    return slapo_error(SLAPO_INVALID_ARG, "shard: expected a parameter name and axis=A, e.g. "
                       "'shard weight axis=0'");
  int64_t axis = 0, parts = 1, pad = 1;
  SLAPO_TRY(slapo_sched_entry_get_int(e, "axis", true, &axis));
  SLAPO_TRY(slapo_sched_entry_get_int(e, "parts", false, &parts));
  SLAPO_TRY(slapo_sched_entry_get_int(e, "pad", false, &pad));
  if (pad < 1 || pad > 65536)
    return slapo_error(SLAPO_INVALID_ARG, "shard: pad=%lld: expected 1 to 65536", (long long)pad);
  if (parts < 1 || parts > 64)
    return slapo_error(SLAPO_INVALID_ARG, "shard: parts=%lld: expected 1 to 64", (long long)parts);
  return shard_impl(node, p->text, (int)axis, (int)parts, pad, e);
}

SLAPO_PRIMITIVE_DESCRIPTOR(shard) = {
    .name = "shard",
    .summary = "split a parameter along an axis across the tensor-parallel group",
    .doc = "shard <param> axis=A [parts=P] [pad=M]\n"
           "  C: slapo_shard_param(node, \"weight\", 0, 1, 1)\n"
           "  Applies to a parameter of the node's module (before trace).\n"
           "  Effect: this rank keeps chunk r of each of the P blocks of the axis. A\n"
           "  Linear's weight on axis 0 is column parallel (output split along its last\n"
           "  axis; shard the bias too), on axis 1 row parallel (partial sums: add\n"
           "  'sync fwd_post all_reduce'); an Embedding's weight on axis 0 is vocab\n"
           "  parallel. Attention modules read their local heads from c_attn\n"
           "  (parts=3 keeps q, k, v of a head on one rank). pad=M pads axis 0 with\n"
           "  zero rows to a multiple of M x group size (GPT-2's vocabulary of 50257;\n"
           "  the padding is masked out of the loss and not saved). Shard every use of\n"
           "  a tied parameter the same way.\n"
           "  Fails: NOT_FOUND for an unknown parameter; SHAPE when the size is not\n"
           "  divisible by parts x group size; STATE when sharded another way.\n"
           "  Verified: across ranks against the unsharded model, within tolerance.\n",
    .bitwise = false,
    .apply = apply,
};
