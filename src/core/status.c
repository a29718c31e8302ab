/* core/status.c - status names and the per-thread error message.
 * Layer: core. One message buffer per thread so concurrent callers do not
 * overwrite each other's diagnostics. */
#include <stdio.h>
#include <stdlib.h>

#include "core/assert.h"
#include "slapo/core.h"

static _Thread_local char g_msg[1024];

static const char *const k_names[] = {
#define X(name, text) #name,
    SLAPO_STATUS_LIST(X)
#undef X
};

static const char *const k_texts[] = {
#define X(name, text) text,
    SLAPO_STATUS_LIST(X)
#undef X
};

const char *slapo_status_name(slapo_status s) {
  static _Thread_local char lower[32];
  if ((unsigned)s >= SLAPO_STATUS_COUNT) return "unknown";
  const char *n = k_names[s];
  size_t i = 0;
  for (; n[i] && i + 1 < sizeof lower; i++) lower[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] - 'A' + 'a' : n[i]);
  lower[i] = '\0';
  return lower;
}

const char *slapo_status_text(slapo_status s) {
  if ((unsigned)s >= SLAPO_STATUS_COUNT) return "unknown status";
  return k_texts[s];
}

const char *slapo_last_error(void) { return g_msg; }

void slapo_error_clear(void) { g_msg[0] = '\0'; }

slapo_status slapo_verror(slapo_status s, const char *fmt, va_list ap) {
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  return s;
}

slapo_status slapo_error(slapo_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  slapo_verror(s, fmt, ap);
  va_end(ap);
  return s;
}

void slapo__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "slapo: internal error: %s:%d: assertion failed: %s\n", file, line, expr);
  abort();
}
