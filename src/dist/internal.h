/* dist/internal.h - what the dist files share: the communicator of a group
 * and the sticky status of collective kernels. Layer: dist (internal). */
#ifndef SLAPO_DIST_INTERNAL_H
#define SLAPO_DIST_INTERNAL_H

#include <mpi.h>

#include "core/assert.h"
#include "slapo/dist.h"

/* The communicator of group g, or MPI_COMM_NULL without MPI (one rank). */
MPI_Comm slapo__dist_comm(int g);

/* Completes the nonblocking collective `what` (MPI_I..., its name for
 * messages) on group g that returned rc and, when rc is MPI_SUCCESS,
 * request *req: MPI_Test until done, spinning for 1 s and then
 * sleeping between tests (a waiting rank leaves its core free). Errors:
 * SLAPO_STATE (rc or MPI_Test failed; names the call), SLAPO_COMM ("no
 * progress in <what> (<group> group) for N s (peer ranks ...)": pending
 * longer than slapo_dist_timeout(); the request stays pending and every
 * later collective fails with slapo__dist_usable's error). */
slapo_status slapo__dist_wait(int rc, MPI_Request *req, int g, const char *what);
/* SLAPO_OK, or SLAPO_COMM when a collective timed out before (its
 * peers are lost; calling MPI with them again would wait once more). */
slapo_status slapo__dist_usable(void);

/* Kernels cannot fail (slapo_kernel_fn), so a collective kernel whose MPI
 * call fails records the first failure here (s and slapo_last_error()),
 * writes zeros and skips the MPI calls of later kernels (a rank that stops
 * calling would leave the others waiting); slapo_dist_kernel_status
 * reports it. */
void slapo__dist_kernel_failed(slapo_status s);
bool slapo__dist_kernel_ok(void);

/* The `group` attribute of a collective node. */
int slapo__dist_group_of(const slapo_node *n);

#endif
