/* exec/debugmem.c - the debug allocation mode (opts.debug_alloc or
 * SLAPO_DEBUG_MEM=1): every planned buffer gets its own allocation per run,
 * filled with NaN when allocated (elements a kernel forgets to write) and
 * again right after its last planned reader (a value read after the planner
 * considers it dead), so a lifetime bug shows as NaN instead of as silently
 * reused memory. Blocks stay allocated until the next run, so a late read
 * sees the poison rather than freed memory. Layer: exec. */
#include <stdint.h>
#include <string.h>

#include "exec/internal.h"

/* f32 quiet NaN. Other dtypes get 0xff bytes: NaN for f64/f16/bf16, -1 or
 * the maximum for integers, which index checks then catch. */
#define POISON_F32 UINT32_C(0x7fc00000)

void slapo__debugmem_poison(exec_buf *b) {
  if (!b->storage.data) return;
  if (b->dtype == SLAPO_DTYPE_F32) {
    uint32_t *w = b->storage.data;
    for (size_t i = 0; i < b->nbytes / 4; i++) w[i] = POISON_F32;
  } else {
    memset(b->storage.data, 0xff, b->nbytes);
  }
}

void slapo__debugmem_release_all(slapo_plan *p) {
  if (!p->opts.debug_alloc) return;
  for (int r = 0; r < p->n_bufs; r++) {
    slapo_aligned_free(p->bufs[r].storage.data);
    p->bufs[r].storage.data = NULL;
  }
}

slapo_status slapo__debugmem_acquire(slapo_plan *p, exec_buf *b, const slapo_node *writer) {
  (void)p;
  /* A zero-byte value still gets a valid, distinct pointer. */
  void *data = slapo_aligned_alloc(b->nbytes ? b->nbytes : SLAPO__EXEC_ALIGN);
  if (!data)
    return slapo_error(SLAPO_NOMEM,
                       "plan_run: out of memory for the %zu-byte buffer of node '%s' (debug "
                       "allocation mode)",
                       b->nbytes, writer->name);
  b->storage.data = data;
  slapo__debugmem_poison(b);
  return SLAPO_OK;
}
