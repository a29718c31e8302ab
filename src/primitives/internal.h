/* primitives/internal.h - helpers shared by the primitive files: logging an
 * applied primitive and formatting errors with the node's path.
 * Layer: primitives (internal). */
#ifndef SLAPO_PRIMITIVES_INTERNAL_H
#define SLAPO_PRIMITIVES_INTERNAL_H

#include "core/assert.h"
#include "slapo/primitives.h"

#define SLAPO_PRIMITIVE_DESCRIPTOR(name) const slapo_primitive slapo__prim_##name

/* The node's path for messages and logs: "." for the root. */
const char *slapo__prim_path(const slapo_sched *node);

/* Appends "path primitive args..." to the log of node's tree, with the
 * source of `from` (file, line) when given. Errors: NOMEM. */
slapo_status slapo__prim_log(slapo_sched *node, const char *primitive, int n_args,
                             const slapo_sched_arg *args, const slapo_sched_entry *from,
                             bool replayable);

#endif
