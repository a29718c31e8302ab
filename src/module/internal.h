/* module/internal.h - state shared by the module layer's files while a step
 * graph is built. Layer: module (internal). */
#ifndef SLAPO_MODULE_INTERNAL_H
#define SLAPO_MODULE_INTERNAL_H

#include "core/assert.h"
#include "slapo/module.h"

/* Attached to the ctx (slapo_ctx_set_user) while a step is built. */
typedef struct slapo__build_state {
  slapo_map *param_nodes; /* canonical path -> param node */
  slapo_map *param_objs;  /* canonical path -> slapo_parameter */
} slapo__build_state;

#endif
