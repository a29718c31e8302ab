/* tests/common/stfiles.c - see stfiles.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/stfiles.h"
#include "slapo/tensor.h"

void assert_safetensors_files_equal(const char *a, const char *b, const char *meta_key) {
  slapo_safetensors *fa, *fb;
  assert_int_equal(slapo_safetensors_read(a, &fa), SLAPO_OK);
  assert_int_equal(slapo_safetensors_read(b, &fb), SLAPO_OK);
  assert_int_equal(slapo_safetensors_count(fa), slapo_safetensors_count(fb));
  for (int i = 0; i < slapo_safetensors_count(fa); i++) {
    const char *name = slapo_safetensors_name(fa, i);
    assert_string_equal(name, slapo_safetensors_name(fb, i));
    slapo_tensor *x, *y;
    assert_int_equal(slapo_safetensors_get(fa, name, &x), SLAPO_OK);
    assert_int_equal(slapo_safetensors_get(fb, name, &y), SLAPO_OK);
    if (!slapo_tensor_equal(x, y)) fail_msg("%s vs %s: tensor %s differs", a, b, name);
    slapo_tensor_free(x), slapo_tensor_free(y);
  }
  if (meta_key)
    assert_string_equal(slapo_safetensors_metadata(fa, meta_key),
                        slapo_safetensors_metadata(fb, meta_key));
  slapo_safetensors_free(fa), slapo_safetensors_free(fb);
}
