/* tests/common/torchfix.h - reading the PyTorch fixtures the committed
 * tools/gen_*_fixture.py scripts write into tests/data, and the error
 * measure the model and op tests compare them with. */
#ifndef SLAPO_TESTS_TORCHFIX_H
#define SLAPO_TESTS_TORCHFIX_H

#include <stddef.h>

#include "slapo/tensor.h"

/* Reads $SLAPO_TEST_DATA/<file> (tests/data when unset) into *out and its
 * path into path [cap]. Returns 0, or -1 (a cmocka setup failure). */
int torchfix_open(const char *file, char *path, size_t cap, slapo_safetensors **out);
/* The fixture tensor `name` (owned by the caller); fails the test when it
 * is missing. */
slapo_tensor *torchfix_get(const slapo_safetensors *f, const char *name);
/* Max |a - b| over max |b| for same-shape contiguous f32 tensors. */
double torchfix_rel_err(const slapo_tensor *a, const slapo_tensor *b);

#endif
