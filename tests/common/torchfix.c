/* tests/common/torchfix.c - see torchfix.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/torchfix.h"

int torchfix_open(const char *file, char *path, size_t cap, slapo_safetensors **out) {
  const char *dir = getenv("SLAPO_TEST_DATA");
  snprintf(path, cap, "%s/%s", dir ? dir : "tests/data", file);
  return slapo_safetensors_read(path, out) == SLAPO_OK ? 0 : -1;
}

slapo_tensor *torchfix_get(const slapo_safetensors *f, const char *name) {
  slapo_tensor *t = NULL;
  if (slapo_safetensors_get(f, name, &t) != SLAPO_OK)
    fail_msg("fixture tensor %s: %s", name, slapo_last_error());
  return t;
}

double torchfix_rel_err(const slapo_tensor *a, const slapo_tensor *b) {
  assert_int_equal(slapo_tensor_numel(a), slapo_tensor_numel(b));
  const float *x = slapo_tensor_data(a), *y = slapo_tensor_data(b);
  double worst = 0, scale = 1e-12;
  for (int64_t i = 0; i < slapo_tensor_numel(a); i++) {
    double d = fabs((double)x[i] - y[i]);
    if (d > worst) worst = d;
    if (fabs(y[i]) > scale) scale = fabs(y[i]);
  }
  return worst / scale;
}
