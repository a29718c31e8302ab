/* core/assert.h - SLAPO_ASSERT for the library's own bugs (never user errors:
 * those return a slapo_status). Always on, also in release builds.
 * Layer: core. */
#ifndef SLAPO_CORE_ASSERT_H
#define SLAPO_CORE_ASSERT_H

_Noreturn void slapo__assert_fail(const char *expr, const char *file, int line);

#define SLAPO_ASSERT(cond)                                                     \
  ((cond) ? (void)0 : slapo__assert_fail(#cond, __FILE__, __LINE__))

#define SLAPO_UNUSED(x) ((void)(x))
#define SLAPO_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* A public entry point's required pointer argument: NULL is the caller's
 * error, reported as SLAPO_INVALID_ARG naming the function and argument,
 * never a crash: `SLAPO_NEED(path, "sched_at");` */
#define SLAPO_NEED(ptr, fn)                                                    \
  do {                                                                         \
    if (!(ptr)) return slapo_error(SLAPO_INVALID_ARG, "%s: %s is NULL", fn, #ptr); \
  } while (0)

/* Propagates a non-OK status: `SLAPO_TRY(slapo_foo(...));` */
#define SLAPO_TRY(expr)                                                        \
  do {                                                                         \
    slapo_status slapo__s = (expr);                                            \
    if (slapo__s != SLAPO_OK) return slapo__s;                                 \
  } while (0)

#endif
