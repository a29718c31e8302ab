/* tests/dist/test_ckpt_dist.c - the checkpoint pair guarantee under tensor
 * parallelism, through the C API: a save whose optimizer file does not fit
 * (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG, a full disk without mounting one)
 * fails on every rank with rank 0's message (no rank left waiting in a
 * collective: CTest's timeout would end a hang), the step-1 pair is left
 * byte for byte, and every rank resumes from it. CTest runs it on one rank
 * and under mpirun -np 2 (schedules/gpt2_tp.sched: TP 2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slapo/dist.h"
#include "slapo/models.h"
#include "slapo/train.h"

static char g_dir[256], g_corpus[512], g_sched[512];

static bool root(void) {
  return slapo_dist_rank(SLAPO_GROUP_WORLD) == 0;
}

static void expect_msg(const char *needle) {
  const char *msg = slapo_last_error();
  if (!strstr(msg, needle))
    fail_msg("rank %d: message '%s' lacks '%s'", slapo_dist_rank(SLAPO_GROUP_WORLD), msg, needle);
}

/* The whole of a file (at most 64 MiB), owned; *n its size. */
static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc(*n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, *n, f), *n);
  fclose(f);
  return buf;
}

typedef struct record {
  char text[8192];
} record;

static void on_event(const slapo_train_event *e, void *ud) {
  record *r = ud;
  if (!e->message) return;
  size_t n = strlen(r->text);
  snprintf(r->text + n, sizeof r->text - n, "%s\n", e->message);
}

static slapo_train_config config(int64_t steps, const char *save, const char *resume) {
  slapo_train_config c;
  slapo_train_config_default(&c);
  c.model_config = "tiny";
  c.schedule = g_sched;
  c.data = g_corpus;
  c.steps = steps;
  c.batch = 2;
  c.seq = 16;
  c.warmup = 1;
  c.val_every = 0;
  c.val_batches = 1;
  c.sample_tokens = 0;
  c.threads = 1;
  c.save = save;
  c.resume = resume;
  return c;
}

static void test_full_disk_under_tp(void **state) {
  (void)state;
  char w[600], o[600];
  snprintf(w, sizeof w, "%s/x.safetensors", g_dir);
  snprintf(o, sizeof o, "%s/x.optim.safetensors", g_dir);
  slapo_train_config c = config(1, w, NULL);
  record r = {{0}};
  slapo_status s = slapo_train(&c, on_event, &r);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  size_t nw, no;
  char *w1 = slurp(w, &nw), *o1 = slurp(o, &no);
  assert_true(no > nw + 65536);

  /* Every rank limited (only rank 0 writes): the weights fit, the
   * optimizer state does not. */
  struct rlimit saved, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, SIG_IGN);
  lim = (struct rlimit){(rlim_t)(nw + 8192), saved.rlim_max};
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  c = config(2, w, w);
  s = slapo_train(&c, NULL, NULL);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
  assert_int_equal(s, SLAPO_IO);
  expect_msg("saving checkpoint");
  expect_msg("writing its optimizer state");
  expect_msg("[EFBIG");
  expect_msg("the previous checkpoint (step 1) is kept as it was");
  assert_int_equal(slapo_dist_barrier(SLAPO_GROUP_WORLD), SLAPO_OK);

  /* The step-1 pair, byte for byte, and every rank resumes from it. */
  size_t nw2, no2;
  char *w2 = slurp(w, &nw2), *o2 = slurp(o, &no2);
  assert_true(nw2 == nw && !memcmp(w1, w2, nw));
  assert_true(no2 == no && !memcmp(o1, o2, no));
  free(w1), free(o1), free(w2), free(o2);
  char want[700];
  snprintf(want, sizeof want, "resume: %s at step 1\n", w);
  c = config(2, NULL, w);
  record rr = {{0}};
  s = slapo_train(&c, on_event, &rr);
  if (s != SLAPO_OK) fail_msg("resume: %s", slapo_last_error());
  if (!strstr(rr.text, want)) fail_msg("no '%s' in:\n%s", want, rr.text);
}

static int setup(void **state) {
  (void)state;
  /* Rank 0 makes the directory and the corpus; the others use its path. */
  if (root()) {
    snprintf(g_dir, sizeof g_dir, "/tmp/slapo_test_ckpt_dist_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
  }
  if (slapo_dist_broadcast(SLAPO_GROUP_WORLD, g_dir, sizeof g_dir, 0) != SLAPO_OK) return -1;
  snprintf(g_corpus, sizeof g_corpus, "%s/corpus.txt", g_dir);
  const char *data = getenv("SLAPO_TEST_DATA");
  snprintf(g_sched, sizeof g_sched, "%s/../../schedules/gpt2_tp.sched", data ? data : "tests/data");
  if (root()) {
    FILE *f = fopen(g_corpus, "w");
    if (!f) return -1;
    for (int i = 0; i < 40; i++)
      fputs("The quick brown fox jumps over the lazy dog. A journey of a thousand miles. ", f);
    if (fclose(f) != 0) return -1;
  }
  return slapo_dist_barrier(SLAPO_GROUP_WORLD) == SLAPO_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (slapo_dist_barrier(SLAPO_GROUP_WORLD) != SLAPO_OK) return -1;
  if (!root()) return 0;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  if (slapo_dist_init(0) != SLAPO_OK) return 1; /* every rank in one TP group */
  if (slapo_models_init() != SLAPO_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_disk_under_tp),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  slapo_dist_finalize();
  return rc;
}
