/* core/list.c - the "known: a, b, c" lists of error messages, built one
 * name at a time (slapo_list_append). Layer: core. */
#include <string.h>

#include "slapo/core.h"

void slapo_list_append(char *buf, size_t cap, const char *name) {
  size_t used = strlen(buf), n = strlen(name), sep = used ? 2 : 0;
  if (cap < 6 || (used >= 3 && !strcmp(buf + used - 3, "..."))) return;
  /* Every append leaves room for a later ", ...". */
  if (used + sep + n + 5 < cap) {
    memcpy(buf + used, ", ", sep);
    memcpy(buf + used + sep, name, n + 1);
  } else {
    memcpy(buf + used, used ? ", ..." : "...", used ? 6 : 4);
  }
}
