/* tests/common/schedfix.h - cmocka fixture: a tiny GPT-2 (4 layers) and its
 * schedule tree, for the schedule-layer tests. */
#ifndef SLAPO_TESTS_SCHEDFIX_H
#define SLAPO_TESTS_SCHEDFIX_H

#include "slapo/schedule.h"

typedef struct schedfix {
  slapo_module *model;
  slapo_sched *sch;
} schedfix;

/* cmocka group/test setup and teardown; *state is the schedfix. */
int schedfix_setup(void **state);
int schedfix_teardown(void **state);

#endif
