/* tests/common/schedfix.c - see schedfix.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/schedfix.h"
#include "slapo/models.h"

int schedfix_setup(void **state) {
  static schedfix f;
  slapo_gpt2_config c;
  assert_int_equal(slapo_gpt2_config_named("tiny", &c), SLAPO_OK);
  assert_int_equal(slapo_gpt2_new(&c, &f.model), SLAPO_OK);
  assert_int_equal(slapo_sched_create(f.model, &f.sch), SLAPO_OK);
  *state = &f;
  return 0;
}

int schedfix_teardown(void **state) {
  schedfix *f = *state;
  slapo_sched_free(f->sch);
  slapo_module_free(f->model);
  return 0;
}
