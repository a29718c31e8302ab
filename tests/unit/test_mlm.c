/* tests/unit/test_mlm.c - the masked-LM objective: slapo_mlm_mask's
 * proportions (round(15 %) of each sequence chosen, at least one; 80 / 10 /
 * 10), labels, determinism and errors;
 * and slapo_train on the BERT family: masked batches through the registry,
 * validation masks fixed (with a zero learning rate every evaluation gives
 * the same loss), the sample skipped, the checkpoint readable by the
 * family's loader; a batch of one short sequence still has a loss. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/train.h"

static slapo_tensor *i32_2d(int64_t B, int64_t T) {
  int64_t shape[2] = {B, T};
  slapo_tensor *t;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &t), SLAPO_OK);
  return t;
}

/* idx filled with bytes 0..255 in a fixed pattern. */
static void fill_bytes(slapo_tensor *t) {
  int32_t *p = slapo_tensor_data(t);
  for (int64_t i = 0; i < slapo_tensor_numel(t); i++) p[i] = (int32_t)((i * 37 + 11) % 256);
}

static const slapo_mlm_config k_cfg = {0.15, SLAPO_BERT_BYTE_MASK, 256};

static void test_mask_proportions(void **state) {
  (void)state;
  enum { B = 64, T = 256 };
  slapo_tensor *x = i32_2d(B, T), *y = i32_2d(B, T), *orig = i32_2d(B, T);
  fill_bytes(x), fill_bytes(orig);
  assert_int_equal(slapo_mlm_mask(&k_cfg, 1337, false, 3, x, y), SLAPO_OK);
  const int32_t *px = slapo_tensor_data(x), *py = slapo_tensor_data(y), *po = slapo_tensor_data(orig);
  int64_t chosen = 0, masked = 0, same = 0, other = 0, row = 0;
  for (int64_t i = 0; i < B * T; i++) {
    if (i % T == 0) row = 0;
    if (py[i] != SLAPO_IGNORE_INDEX) row++;
    if (i % T == T - 1) assert_int_equal(row, 38); /* round(256 * 0.15) in every sequence */
    if (py[i] == SLAPO_IGNORE_INDEX) {
      assert_int_equal(px[i], po[i]); /* not chosen: untouched */
      continue;
    }
    chosen++;
    assert_int_equal(py[i], po[i]); /* the label is the original id */
    if (px[i] == SLAPO_BERT_BYTE_MASK) masked++;
    else if (px[i] == po[i]) same++;
    else {
      assert_true(px[i] >= 0 && px[i] < 256);
      other++;
    }
  }
  double n = (double)(B * T), c = (double)chosen;
  print_message("chosen %.4f, of those [MASK] %.4f, kept %.4f, random %.4f\n", c / n,
                masked / c, same / c, other / c);
  /* 2432 chosen: the binomial's standard deviations are about 0.008 /
   * 0.006 for their shares. */
  assert_true(c == 64 * 38);
  assert_true(fabs(masked / c - 0.8) < 0.03);
  assert_true(fabs(same / c - 0.1 - 0.1 / 256) < 0.025);
  assert_true(fabs(other / c - 0.1) < 0.025);
  slapo_tensor_free(x), slapo_tensor_free(y), slapo_tensor_free(orig);
}

/* A pure function of (seed, split, step, content): fixed validation masks. */
static void test_mask_deterministic(void **state) {
  (void)state;
  enum { B = 4, T = 64 };
  slapo_tensor *x[4], *y[4];
  struct { uint64_t seed; bool val; int64_t step; } k[4] = {
      {7, true, 2}, {7, true, 2}, {7, true, 3}, {7, false, 2}};
  for (int i = 0; i < 4; i++) {
    x[i] = i32_2d(B, T), y[i] = i32_2d(B, T);
    fill_bytes(x[i]);
    assert_int_equal(slapo_mlm_mask(&k_cfg, k[i].seed, k[i].val, k[i].step, x[i], y[i]), SLAPO_OK);
  }
  size_t nb = (size_t)B * T * sizeof(int32_t);
  assert_memory_equal(slapo_tensor_data(x[0]), slapo_tensor_data(x[1]), nb);
  assert_memory_equal(slapo_tensor_data(y[0]), slapo_tensor_data(y[1]), nb);
  assert_memory_not_equal(slapo_tensor_data(y[0]), slapo_tensor_data(y[2]), nb);
  assert_memory_not_equal(slapo_tensor_data(y[0]), slapo_tensor_data(y[3]), nb);
  for (int i = 0; i < 4; i++) slapo_tensor_free(x[i]), slapo_tensor_free(y[i]);
}

/* Each sequence gets round(T * 0.15) positions, at least one: with a
 * per-position coin, 27 % of 8-position sequences had none, so a batch of
 * one had no loss (printed 0.0000) and AdamW stepped on zero gradients. */
static void test_mask_short_sequences(void **state) {
  (void)state;
  struct { int64_t B, T, k; } cases[] = {{1, 8, 1}, {3, 1, 1}, {2, 3, 1}, {2, 10, 2}, {1, 20, 3}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t B = cases[c].B, T = cases[c].T;
    assert_int_equal(slapo_mlm_num_to_predict(&k_cfg, T), cases[c].k);
    int64_t hits[20] = {0}; /* times each position was chosen */
    for (int64_t step = 0; step < 200; step++) {
      slapo_tensor *x = i32_2d(B, T), *y = i32_2d(B, T);
      fill_bytes(x);
      assert_int_equal(slapo_mlm_mask(&k_cfg, 5, step % 2, step, x, y), SLAPO_OK);
      const int32_t *py = slapo_tensor_data(y);
      for (int64_t b = 0; b < B; b++) {
        int64_t chosen = 0;
        for (int64_t t = 0; t < T; t++)
          if (py[b * T + t] != SLAPO_IGNORE_INDEX) chosen++, hits[t]++;
        assert_int_equal(chosen, cases[c].k);
      }
      slapo_tensor_free(x), slapo_tensor_free(y);
    }
    /* every position gets its turn (the draw is not stuck at one end) */
    for (int64_t t = 0; t < T; t++) assert_true(hits[t] > 0);
  }
  assert_int_equal(slapo_mlm_num_to_predict(&k_cfg, 0), 0);
}

static void test_mask_errors(void **state) {
  (void)state;
  slapo_tensor *x = i32_2d(2, 8), *y = i32_2d(2, 4);
  slapo_mlm_config bad = k_cfg;
  bad.mask_prob = 1.5;
  assert_int_equal(slapo_mlm_mask(&bad, 1, false, 0, x, x), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "mask_prob 1.5"));
  bad.mask_prob = 0; /* at least one position is chosen: 0 would be rewritten */
  assert_int_equal(slapo_mlm_mask(&bad, 1, false, 0, x, x), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "mask_prob 0 must be in (0, 1]"));
  assert_int_equal(slapo_mlm_mask(&k_cfg, 1, false, 0, x, y), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "one shape"));
  slapo_tensor_free(x), slapo_tensor_free(y);
}

/* ---- the trainer on BERT ---- */

typedef struct events {
  int n_val;
  double val[8];
  int n_steps, zero_losses; /* step events, and those whose loss is not > 0 */
  bool skipped, objective_said;
} events;

static void on_event(const slapo_train_event *e, void *ud) {
  events *ev = ud;
  if (e->message) {
    if (strstr(e->message, "sample: skipped: bert trains a masked LM")) ev->skipped = true;
    if (strstr(e->message, "objective: masked LM: 15 % of positions")) ev->objective_said = true;
  }
  if (e->has_val && ev->n_val < 8) ev->val[ev->n_val++] = e->val_loss;
  if (!e->message && e->step > 0) ev->n_steps++, ev->zero_losses += !(e->loss > 0);
  assert_null(e->sample);
}

/* Writes a small text corpus into a new temporary directory: dir gets its
 * path, text the corpus file's. */
static void make_corpus(char dir[27], char text[300]) {
  strcpy(dir, "/tmp/slapo_test_mlm_XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(text, 300, "%s/corpus.txt", dir);
  FILE *f = fopen(text, "w");
  assert_non_null(f);
  for (int i = 0; i < 400; i++)
    fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i);
  fclose(f);
}

static void remove_dir(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_train_bert(void **state) {
  (void)state;
  char dir[27], text[300], ckpt[300];
  make_corpus(dir, text);
  snprintf(ckpt, sizeof ckpt, "%s/bert.safetensors", dir);
  slapo_train_config c;
  slapo_train_config_default(&c);
  c.model = "bert", c.model_config = "tiny", c.data = text;
  c.steps = 4, c.batch = 2, c.seq = 32, c.val_every = 2, c.val_batches = 2, c.threads = 1;
  c.lr = 0, c.min_lr = 0, c.save = ckpt; /* weights never change: losses only see masks */
  events ev = {0};
  slapo_status s = slapo_train(&c, on_event, &ev);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  assert_true(ev.skipped && ev.objective_said);
  assert_int_equal(ev.n_val, 2);
  print_message("val loss %.7f, %.7f (ln 264 = %.7f)\n", ev.val[0], ev.val[1], log(264.0));
  assert_true(ev.val[0] == ev.val[1]); /* same validation masks */
  assert_true(fabs(ev.val[0] - log(264.0)) < 0.2); /* an untrained model: near uniform */
  /* the checkpoint is in the family's layout */
  const slapo_model_family *fam;
  slapo_module *m;
  assert_int_equal(slapo_model_find("bert", &fam), SLAPO_OK);
  assert_int_equal(slapo_model_new(fam, "tiny", -1, 99, &m), SLAPO_OK);
  assert_int_equal(fam->load(m, ckpt), SLAPO_OK);
  slapo_module_free(m);
  remove_dir(dir);
}

/* The new user's run: batch 1 of 8 positions, where a per-position coin
 * chose nothing in 27 % of batches and the fixed validation batch had no
 * chosen position, so every loss and val_loss printed 0. */
static void test_train_bert_short_sequence(void **state) {
  (void)state;
  char dir[27], text[300];
  make_corpus(dir, text);
  slapo_train_config c;
  slapo_train_config_default(&c);
  c.model = "bert", c.model_config = "tiny", c.data = text, c.sample_tokens = 0;
  c.steps = 30, c.batch = 1, c.seq = 8, c.val_every = 10, c.val_batches = 1, c.threads = 1;
  events ev = {0};
  slapo_status s = slapo_train(&c, on_event, &ev);
  if (s != SLAPO_OK) fail_msg("train: %s", slapo_last_error());
  assert_int_equal(ev.n_steps, 30);
  assert_int_equal(ev.zero_losses, 0);
  assert_int_equal(ev.n_val, 3);
  for (int i = 0; i < ev.n_val; i++) assert_true(ev.val[i] > 0);
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mask_proportions),
      cmocka_unit_test(test_mask_deterministic),
      cmocka_unit_test(test_mask_short_sequences),
      cmocka_unit_test(test_mask_errors),
      cmocka_unit_test(test_train_bert),
      cmocka_unit_test(test_train_bert_short_sequence),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
