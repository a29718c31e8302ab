/* dist/internal.h - what the dist files share: the communicator of a group
 * and the sticky status of collective kernels. Layer: dist (internal). */
#ifndef SLAPO_DIST_INTERNAL_H
#define SLAPO_DIST_INTERNAL_H

#include <mpi.h>

#include "core/assert.h"
#include "slapo/dist.h"

/* The communicator of group g, or MPI_COMM_NULL without MPI (one rank). */
MPI_Comm slapo__dist_comm(int g);

/* Kernels cannot fail (slapo_kernel_fn), so a collective kernel whose MPI
 * call fails records the first failure here, writes zeros and skips the
 * MPI calls of later kernels (a rank that stops calling would leave the
 * others waiting); slapo_dist_kernel_status reports it. */
void slapo__dist_kernel_failed(int rc, const char *call);
bool slapo__dist_kernel_ok(void);

/* The `group` attribute of a collective node. */
int slapo__dist_group_of(const slapo_node *n);

#endif
