/* tests/fuzz/fuzz_sched.c - libFuzzer harness for the `.sched` reader: any
 * input either parses or fails with a status (never a crash, hang or
 * unbounded allocation); what parses prints, re-parses and prints again to
 * the same text (the log's round-trip promise); and its globs expand against
 * the schedule tree of a tiny GPT-2 without crashing. Built by `make fuzz`
 * (clang, -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_text.h"
#include "slapo/models.h"
#include "slapo/schedule.h"

static slapo_sched *g_tree;

static void die(const char *what) {
  fprintf(stderr, "fuzz_sched: %s: %s\n", what, slapo_last_error());
  abort();
}

/* The tree of a 2-layer GPT-2 (meta tensors: nothing allocated). */
static slapo_sched *tree(void) {
  if (g_tree) return g_tree;
  slapo_gpt2_config c = {2, 2, 16, 16, 256, 0.0, 1e-5};
  slapo_module *m;
  if (slapo_gpt2_new(&c, &m) != SLAPO_OK) die("gpt2_new");
  if (slapo_sched_create(m, &g_tree) != SLAPO_OK) die("sched_create");
  return g_tree; /* kept for the process, with its model */
}

static void print_log_to(const void *obj, FILE *f) { slapo_sched_log_print(obj, f); }

static char *print_log(const slapo_sched_log *obj) { return fuzz_capture(print_log_to, obj); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text(data, size);
  if (!text) return 0;
  slapo_sched_log *log = NULL;
  if (slapo_sched_parse(text, "fuzz.sched", &log) == SLAPO_OK) {
    char *once = print_log(log);
    slapo_sched_log *again = NULL;
    if (slapo_sched_parse(once, "printed.sched", &again) != SLAPO_OK) {
      fprintf(stderr, "printed log does not parse:\n%s\n", once);
      die("re-parse");
    }
    char *twice = print_log(again);
    if (strcmp(once, twice) != 0) {
      fprintf(stderr, "print -> parse -> print differs:\n%s\n---\n%s\n", once, twice);
      abort();
    }
    slapo_sched_steps steps = {0};
    (void)slapo_sched_expand(log, tree(), &steps);
    slapo_sched_steps_deinit(&steps);
    free(once);
    free(twice);
    slapo_sched_log_free(again);
  }
  slapo_sched_log_free(log);
  free(text);
  return 0;
}
