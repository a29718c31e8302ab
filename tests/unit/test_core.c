/* tests/unit/test_core.c - status messages, arenas, the string map, hashing,
 * the log hook. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/failalloc.h"
#include "slapo/core.h"

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(slapo_status_name(SLAPO_OK), "ok");
  assert_string_equal(slapo_status_name(SLAPO_NOT_FOUND), "not_found");
  assert_string_equal(slapo_status_text(SLAPO_SHAPE), "shape mismatch");
  assert_string_equal(slapo_status_name((slapo_status)999), "unknown");
  assert_int_equal(slapo_error(SLAPO_SHAPE, "matmul: [%d, %d] vs [%d]", 2, 3, 4), SLAPO_SHAPE);
  assert_string_equal(slapo_last_error(), "matmul: [2, 3] vs [4]");
  slapo_error_clear();
  assert_string_equal(slapo_last_error(), "");
}

static void test_arena_growth(void **state) {
  (void)state;
  slapo_arena *a;
  assert_int_equal(slapo_arena_new(64, &a), SLAPO_OK);
  /* Many small allocations spill across blocks; all stay valid and aligned. */
  char *ptrs[1000];
  for (int i = 0; i < 1000; i++) {
    ptrs[i] = slapo_arena_alloc(a, 24, 8);
    assert_non_null(ptrs[i]);
    assert_int_equal((uintptr_t)ptrs[i] % 8, 0);
    memset(ptrs[i], i & 0xff, 24);
  }
  for (int i = 0; i < 1000; i++)
    for (int j = 0; j < 24; j++) assert_int_equal((unsigned char)ptrs[i][j], i & 0xff);
  assert_int_equal(slapo_arena_used(a), 24000);
  /* A request larger than any block gets its own. */
  char *big = slapo_arena_alloc(a, 1 << 20, 64);
  assert_non_null(big);
  assert_int_equal((uintptr_t)big % 64, 0);
  assert_int_equal(big[12345], 0); /* zeroed */
  assert_null(slapo_arena_alloc(a, 8, 3));
  assert_non_null(strstr(slapo_last_error(), "alignment 3"));
  char *s = slapo_arena_printf(a, "h.%d.%s", 3, "mlp");
  assert_string_equal(s, "h.3.mlp");
  assert_string_equal(slapo_arena_strdup(a, "wte"), "wte");
  slapo_arena_reset(a);
  assert_int_equal(slapo_arena_used(a), 0);
  assert_non_null(slapo_arena_alloc(a, 10, 0));
  slapo_arena_free(a);
  slapo_arena_free(NULL);
}

/* The largest block asked of the allocator, through a counting hook. */
static size_t g_largest;
static void *counting_malloc(size_t n, void *ud) {
  (void)ud;
  if (n > g_largest) g_largest = n;
  return malloc(n);
}
static void *plain_realloc(void *p, size_t n, void *ud) { (void)ud; return realloc(p, n); }
static void plain_free(void *p, void *ud) { (void)ud; free(p); }

/* Reset starts the doubling over: a use that spills past the first block,
 * repeated after resets, asks for blocks no larger than the first use did
 * (it had doubled on every use: a schedule file resets its arena per line). */
static void test_arena_reset_restarts_growth(void **state) {
  (void)state;
  slapo_arena *a;
  assert_int_equal(slapo_arena_new(256, &a), SLAPO_OK);
  slapo_allocator counting = {counting_malloc, plain_realloc, plain_free, NULL};
  slapo_set_allocator(&counting);
  size_t first = 0;
  for (int use = 0; use < 40; use++) {
    g_largest = 0;
    for (int i = 0; i < 64; i++) assert_non_null(slapo_arena_alloc(a, 100, 0));
    if (use == 0) first = g_largest;
    assert_true(g_largest <= first);
    slapo_arena_reset(a);
  }
  slapo_set_allocator(NULL);
  assert_true(first > 0);
  slapo_arena_free(a);
}

static void test_map(void **state) {
  (void)state;
  slapo_map *m;
  assert_int_equal(slapo_map_new(&m), SLAPO_OK);
  char keys[500][16];
  for (int i = 0; i < 500; i++) {
    snprintf(keys[i], sizeof keys[i], "h.%d", i);
    assert_int_equal(slapo_map_set(m, keys[i], keys[i]), SLAPO_OK);
  }
  assert_int_equal(slapo_map_count(m), 500);
  for (int i = 0; i < 500; i++) assert_ptr_equal(slapo_map_get(m, keys[i]), keys[i]);
  assert_null(slapo_map_get(m, "h.500"));
  assert_true(slapo_map_remove(m, "h.7"));
  assert_false(slapo_map_remove(m, "h.7"));
  assert_false(slapo_map_has(m, "h.7"));
  assert_int_equal(slapo_map_count(m), 499);
  /* Insertion order survives removal; overwrite keeps position. */
  assert_string_equal(slapo_map_key_at(m, 7), "h.8");
  assert_int_equal(slapo_map_set(m, "h.0", keys[1]), SLAPO_OK);
  assert_string_equal(slapo_map_key_at(m, 0), "h.0");
  assert_ptr_equal(slapo_map_value_at(m, 0), keys[1]);
  slapo_map_free(m);
}

static void test_hash(void **state) {
  (void)state;
  assert_int_equal(slapo_hash_str("transformer.h.0"), slapo_hash64("transformer.h.0", 15, 0));
  assert_int_not_equal(slapo_hash_str("h.0"), slapo_hash_str("h.1"));
  assert_int_not_equal(slapo_hash_combine(1, 2), slapo_hash_combine(2, 1));
}

static int g_log_calls, g_log_level;
static char g_log_msg[64];
static void sink(int level, const char *msg, void *ud) {
  (void)ud;
  g_log_calls++;
  g_log_level = level;
  snprintf(g_log_msg, sizeof g_log_msg, "%s", msg);
}

static void test_log_hook(void **state) {
  (void)state;
  slapo_set_log(sink, NULL);
  slapo_logf(2, "trace %s", "h.0.mlp");
  assert_int_equal(g_log_calls, 1);
  assert_int_equal(g_log_level, 2);
  assert_string_equal(g_log_msg, "trace h.0.mlp");
  slapo_set_log(NULL, NULL);
}

/* Every allocating core entry point returns NOMEM and leaks nothing. */
static void test_nomem_sweep(void **state) {
  (void)state;
  int succeeded = 0;
  for (long k = 0; k < 200 && !succeeded; k++) {
    failalloc_install(k);
    slapo_arena *a = NULL;
    slapo_map *m = NULL;
    slapo_status s = slapo_arena_new(32, &a);
    if (s == SLAPO_OK) s = slapo_map_new(&m);
    for (int i = 0; s == SLAPO_OK && i < 40; i++) {
      char key[16];
      snprintf(key, sizeof key, "k%d", i);
      s = slapo_map_set(m, key, a);
      if (s == SLAPO_OK && !slapo_arena_alloc(a, 100, 16)) s = SLAPO_NOMEM;
    }
    if (s == SLAPO_OK) succeeded = 1;
    else assert_int_equal(s, SLAPO_NOMEM);
    if (m && s != SLAPO_OK) assert_true(slapo_map_count(m) <= 40);
    slapo_map_free(m);
    slapo_arena_free(a);
    assert_int_equal(failalloc_live(), 0);
    failalloc_uninstall();
  }
  assert_true(succeeded);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_names), cmocka_unit_test(test_arena_growth),
      cmocka_unit_test(test_arena_reset_restarts_growth),
      cmocka_unit_test(test_map),          cmocka_unit_test(test_hash),
      cmocka_unit_test(test_log_hook),     cmocka_unit_test(test_nomem_sweep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
