/* tests/common/expect.h - small assertions and file helpers shared by tests. */
#ifndef SLAPO_TESTS_EXPECT_H
#define SLAPO_TESTS_EXPECT_H

/* Fails the current cmocka test unless slapo_last_error() contains `needle`. */
void assert_last_error_has(const char *needle);

/* Copies file `from` to `to` byte for byte; fails the current test on any
 * I/O error. */
void copy_file_or_fail(const char *from, const char *to);

#endif
