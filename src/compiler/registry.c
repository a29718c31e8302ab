/* compiler/registry.c - the table of fusion backends (compilers.def), their
 * options, and where compiled kernels are cached. Layer: compiler. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/internal.h"

static const slapo_compiler *const k_compilers[] = {
#define SLAPO_COMPILER(name) &slapo__compiler_##name,
#include "compiler/compilers.def"
#undef SLAPO_COMPILER
};

#define N_COMPILERS ((int)SLAPO_ARRAY_LEN(k_compilers))

const slapo_compiler *slapo_compiler_find(const char *name) {
  for (int i = 0; i < N_COMPILERS; i++)
    if (!strcmp(k_compilers[i]->name, name)) return k_compilers[i];
  return NULL;
}

int slapo_compiler_count(void) { return N_COMPILERS; }
const slapo_compiler *slapo_compiler_at(int i) {
  return i >= 0 && i < N_COMPILERS ? k_compilers[i] : NULL;
}

void slapo_compiler_cache_dir(char *buf, size_t cap) {
  const char *d = getenv("SLAPO_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (d && d[0]) snprintf(buf, cap, "%s", d);
  else if (x && x[0]) snprintf(buf, cap, "%s/slapo", x);
  else if (h && h[0]) snprintf(buf, cap, "%s/.cache/slapo", h);
  /* Per user, so another user cannot make it first (cc_cache.c refuses one
   * that is not ours). */
  else snprintf(buf, cap, "/tmp/slapo-cache-%u", (unsigned)geteuid());
}
