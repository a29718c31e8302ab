/* tests/common/stfiles.h - comparing safetensors files in tests. */
#ifndef SLAPO_TESTS_STFILES_H
#define SLAPO_TESTS_STFILES_H

/* Fails the current cmocka test unless files a and b hold the same tensor
 * names and byte-equal tensors, and the same value of metadata key
 * `meta_key` (NULL: metadata not compared). */
void assert_safetensors_files_equal(const char *a, const char *b, const char *meta_key);

#endif
