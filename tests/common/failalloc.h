/* tests/common/failalloc.h - an allocator hook that fails on demand and
 * counts live allocations, for allocation-failure sweeps: every public entry
 * point must return SLAPO_NOMEM and leak nothing when any allocation fails. */
#ifndef SLAPO_TESTS_FAILALLOC_H
#define SLAPO_TESTS_FAILALLOC_H

/* Installs the hook: allocation number `fail_at` (0-based, counted from this
 * call) and every later one fail; -1 never fails (counting only). */
void failalloc_install(long fail_at);
/* Restores the libc allocator. Free everything allocated under the hook
 * first: libc cannot free those blocks. */
void failalloc_uninstall(void);
/* Allocations made through the hook and not yet freed. */
long failalloc_live(void);
/* Allocation attempts since install. */
long failalloc_attempts(void);

#endif
