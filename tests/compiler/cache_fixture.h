/* tests/compiler/cache_fixture.h - a cmocka group setup and teardown for
 * tests that compile cc kernels: a fresh kernel cache of the test's own
 * (SLAPO_CACHE_DIR, removed afterwards), so runs never share objects, and
 * the model families registered. Include after <cmocka.h>. */
#ifndef SLAPO_TESTS_CACHE_FIXTURE_H
#define SLAPO_TESTS_CACHE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "slapo/models.h"

static char g_cache[256];

static int cache_setup(void **state) {
  (void)state;
  snprintf(g_cache, sizeof g_cache, "/tmp/slapo-test-cache-XXXXXX");
  if (!mkdtemp(g_cache)) return -1;
  setenv("SLAPO_CACHE_DIR", g_cache, 1);
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static int cache_teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
  return system(cmd) == 0 ? 0 : -1;
}

#endif
