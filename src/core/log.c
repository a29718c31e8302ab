/* core/log.c - the log hook: warnings to stderr by default, debug messages
 * too when SLAPO_DEBUG > 0. Layer: core. The library itself never prints;
 * everything goes here. */
#include <stdio.h>
#include <stdlib.h>

#include "slapo/core.h"

static slapo_log_fn g_fn;
static void *g_ud;

int slapo_debug_level(void) {
  static int level = -1;
  if (level < 0) {
    const char *s = getenv("SLAPO_DEBUG");
    level = s ? atoi(s) : 0;
    if (level < 0) level = 0;
  }
  return level;
}

void slapo_set_log(slapo_log_fn fn, void *ud) {
  g_fn = fn;
  g_ud = ud;
}

void slapo_logf(int level, const char *fmt, ...) {
  if (!g_fn && level > slapo_debug_level()) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g_fn) g_fn(level, buf, g_ud);
  else if (level == SLAPO_LOG_WARN) fprintf(stderr, "slapo: warning: %s\n", buf);
  else fprintf(stderr, "slapo[%d]: %s\n", level, buf);
}
