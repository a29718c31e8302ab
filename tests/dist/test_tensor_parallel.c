/* tests/dist/test_tensor_parallel.c - shard and sync on GPT-2: the Megatron
 * schedule combined with the fused one (schedules/gpt2_tp.sched) verified
 * against the unsharded model with dropout on (also with every block
 * checkpointed, its shard/sync lines alone on the composite attention, and
 * schedules/gpt2_tp_composite.sched: the composite attention traced flat),
 * and every refusal of shard and sync with its message. CTest runs it on
 * one rank (shards of one: the schedule must still verify; errors that
 * need a real split are skipped) and under mpirun -np 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/assert.h"
#include "slapo/apply.h"
#include "slapo/dist.h"
#include "slapo/models.h"


static slapo_status build(void *ud, slapo_module **out) {
  const slapo_model_family *f;
  SLAPO_TRY(slapo_model_find("gpt2", &f));
  return slapo_model_new(f, ud ? ud : "tiny", 0.1, 1337, out);
}

/* Verifies `text` (a .sched file's content) on tiny GPT-2: batch 2 x 16. */
static slapo_status verify_text(const char *text, size_t *first_bad) {
  slapo_sched_log *log;
  SLAPO_TRY(slapo_sched_parse(text, "test.sched", &log));
  int64_t bt[2] = {2, 16};
  slapo_tensor *idx, *tgt;
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &idx), SLAPO_OK);
  assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &tgt), SLAPO_OK);
  for (int i = 0; i < 32; i++) {
    ((int32_t *)slapo_tensor_data(idx))[i] = (i * 37 + 5) % 256;
    ((int32_t *)slapo_tensor_data(tgt))[i] = (i * 91 + 3) % 256;
  }
  const slapo_tensor *in[2] = {idx, tgt};
  slapo_verify_opts o = {.n_in = 2, .in = in, .seed = 7, .step = 3};
  slapo_status s = slapo_verify(build, NULL, log, &o, NULL, NULL, first_bad);
  slapo_tensor_free(idx);
  slapo_tensor_free(tgt);
  slapo_sched_log_free(log);
  return s;
}

/* The file's text with `extra` appended. */
static char *read_sched(const char *name, const char *extra) {
  char path[1024];
  snprintf(path, sizeof path, "%s/../../schedules/%s", getenv("SLAPO_TEST_DATA"), name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[16384];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  strncat(buf, extra, sizeof buf - n - 1);
  return buf;
}

static void expect_ok(const char *text) {
  size_t bad = 0;
  slapo_status s = verify_text(text, &bad);
  if (s != SLAPO_OK) fail_msg("verify: %s: %s", slapo_status_name(s), slapo_last_error());
  assert_int_equal(bad, 0);
}

static void test_megatron_gpt2(void **state) {
  (void)state;
  expect_ok(read_sched("gpt2_tp.sched", ""));
}

/* --precision bf16 on the tensor-parallel schedule: the sharded GEMMs read
 * bf16 casts of their shards; each rank matches the one-process model in
 * all three parts of verify (structure, bf16 against its emulation, and
 * plain f32 within bf16's bound). */
static void test_megatron_gpt2_bf16(void **state) {
  (void)state;
  static char text[20000];
  snprintf(text, sizeof text, ". autocast dtype=bf16\n%s", read_sched("gpt2_tp.sched", ""));
  expect_ok(text);
}

/* Activation checkpointing re-emits the collectives and the dropout masks
 * keyed by global head coordinates: still the unsharded model's numbers. */
static void test_megatron_gpt2_checkpointed(void **state) {
  (void)state;
  expect_ok(read_sched("gpt2_tp.sched", "transformer.h checkpoint ratio=1.0\n"));
}

/* Without FlashAttention (schedules/gpt2_tp_composite.sched): the composite
 * attention traced flat, its dropout a leaf emitted from the flattened
 * graph, drawing by its input's layout (this rank's heads); with every
 * block checkpointed too, the recomputed dropouts keep the forward's shard
 * attributes. */
static void test_megatron_gpt2_flat_composite(void **state) {
  (void)state;
  expect_ok(read_sched("gpt2_tp_composite.sched", ""));
  expect_ok(read_sched("gpt2_tp_composite.sched", "transformer.h checkpoint ratio=1.0\n"));
}

/* The shard and sync lines alone: the composite attention (its dropout on
 * [B, NH/K, T, T] keyed by global head coordinates) and plain Linears, the
 * row-parallel ones becoming SyncedLinear. */
static void test_megatron_gpt2_composite(void **state) {
  (void)state;
  static char text[20000];
  const char *all = read_sched("gpt2_tp.sched", "");
  size_t n = 0;
  for (const char *l = all; *l;) {
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l + 1) : strlen(l);
    if (l[0] != '#' && (strstr(l, " shard ") || strstr(l, " sync "))) {
      memcpy(text + n, l, len < sizeof text - n - 1 ? len : 0);
      n += len < sizeof text - n - 1 ? len : 0;
    }
    l += len;
  }
  text[n] = '\0';
  assert_true(n > 0);
  expect_ok(text);
}

/* sync pattern=: the all-reduce of a row-parallel projection whose bias was
 * decomposed lands inside the traced MLP, between the matmul and the bias
 * add that is then fused with the dropout. Without it the dropout would
 * read partial sums (on two ranks): refused, so the check can fail. */
static const char k_mlp_pattern_sync[] =
    "transformer.h.*.mlp.c_fc    shard  weight axis=0\n"
    "transformer.h.*.mlp.c_fc    shard  bias axis=0\n"
    "transformer.h.*.mlp.c_fc    sync   bwd_post all_reduce\n"
    "transformer.h.*.mlp.c_proj  decompose\n"
    "transformer.h.*.mlp.c_proj  shard  weight axis=1\n"
    "transformer.h.*.mlp         trace  flatten=true\n"
    "transformer.h.*.mlp         sync   fwd_post all_reduce pattern=\"matmul(x, w)\"\n"
    "transformer.h.*.mlp         fuse   pattern=\"dropout(add(y, b))\" compiler=cc "
    "name=FusedBiasDropout\n";

static void test_sync_pattern_in_traced_graph(void **state) {
  (void)state;
  expect_ok(k_mlp_pattern_sync);
  if (slapo_dist_size(SLAPO_GROUP_TP) < 2) return;
  static char without[4096];
  snprintf(without, sizeof without, "%s", k_mlp_pattern_sync);
  char *line = strstr(without, "transformer.h.*.mlp         sync");
  char *end = strchr(line, '\n');
  memmove(line, end + 1, strlen(end + 1) + 1);
  /* Without it, the fused bias + dropout reads the matmul's partial sums:
   * the step is refused (it used to run and break the numbers). */
  size_t bad = 0;
  assert_int_equal(verify_text(without, &bad), SLAPO_UNSUPPORTED);
  assert_non_null(strstr(slapo_last_error(), "transformer.h.0.mlp.FusedBiasDropout_0: cc:"));
  assert_non_null(strstr(slapo_last_error(), "is a partial sum across the tensor-parallel"));
}

/* A schedule line applied to tiny GPT-2 on this rank; its status. */
static slapo_status apply_text(const char *text) {
  slapo_module *m;
  assert_int_equal(build(NULL, &m), SLAPO_OK);
  slapo_sched_log *log;
  assert_int_equal(slapo_sched_parse(text, "t.sched", &log), SLAPO_OK);
  slapo_sched *root;
  assert_int_equal(slapo_sched_create(m, &root), SLAPO_OK);
  slapo_status s = slapo_apply_schedule(root, log, NULL, 0, 0, NULL);
  if (s == SLAPO_OK) { /* refusals that come when a step is built */
    slapo_runner *r;
    assert_int_equal(slapo_runner_new(m, NULL, &r), SLAPO_OK);
    int64_t bt[2] = {1, 4};
    slapo_tensor *idx;
    assert_int_equal(slapo_tensor_new(SLAPO_DTYPE_I32, 2, bt, &idx), SLAPO_OK);
    const slapo_tensor *in[1] = {idx};
    slapo_kernel_env env = {1, 0, false};
    s = slapo_step(r, 1, in, SLAPO_STEP_EVAL, &env, NULL);
    slapo_tensor_free(idx);
    slapo_runner_free(r);
  }
  slapo_sched_free(root);
  slapo_sched_log_free(log);
  slapo_module_free(m);
  return s;
}

static void expect_error(const char *text, slapo_status want, const char *const *parts) {
  slapo_status s = apply_text(text);
  if (s != want)
    fail_msg("'%s': got %s (%s), want %s", text, slapo_status_name(s), slapo_last_error(),
             slapo_status_name(want));
  for (; *parts; parts++)
    if (!strstr(slapo_last_error(), *parts))
      fail_msg("'%s': message '%s' lacks '%s'", text, slapo_last_error(), *parts);
}

static void test_tied_parameter_sharded_once(void **state) {
  (void)state;
  expect_error("transformer.wte shard weight axis=0\n", SLAPO_PRECOND,
               (const char *const[]){"lm_head.weight is transformer.wte.weight",
                                     "lm_head shard weight axis=0", NULL});
}

static void test_shard_unknown_parameter(void **state) {
  (void)state;
  expect_error("transformer.h.0.mlp.c_fc shard gamma axis=0\n", SLAPO_NOT_FOUND,
               (const char *const[]){"c_fc", "gamma", "weight, bias", NULL});
  expect_error("transformer.h.0.mlp.c_fc shard weight axis=2\n", SLAPO_INVALID_ARG,
               (const char *const[]){"axis 2", NULL});
  expect_error("transformer.wte shard weight axis=0 parts=2\n", SLAPO_INVALID_ARG,
               (const char *const[]){"Embedding", "parts=1", NULL});
  expect_error("transformer.h.0.mlp.c_fc shard weight axis=1 pad=128\n", SLAPO_INVALID_ARG,
               (const char *const[]){"pad=128 pads axis 0 of a plain split", NULL});
  expect_error("transformer.h.0 trace flatten=true\n"
               "transformer.h.0.mlp.c_fc shard weight axis=0\n",
               SLAPO_STATE, (const char *const[]){"transformer.h.0 is traced already",
                                                  "shard before trace", NULL});
}

static void test_sync_bad_mode_and_op(void **state) {
  (void)state;
  expect_error("transformer.h.0.mlp.c_fc sync fwd_pre all_reduce\n", SLAPO_INVALID_ARG,
               (const char *const[]){"fwd_pre takes all_gather or scatter", NULL});
  expect_error(". sync fwd_post all_reduce\n", SLAPO_INVALID_ARG,
               (const char *const[]){"sync a submodule", NULL});
  expect_error("transformer.h.0.mlp.c_proj decompose\n"
               "transformer.h.0 trace flatten=true\n"
               "transformer.h.0.mlp.c_proj sync fwd_post all_reduce\n",
               SLAPO_STATE, (const char *const[]){"transformer.h.0.mlp.c_proj", "inlined", NULL});
  expect_error("transformer.h.0.mlp trace flatten=true\n"
               "transformer.h.0.mlp sync bwd_post all_reduce pattern=\"matmul(x, w)\"\n",
               SLAPO_INVALID_ARG, (const char *const[]){"use fwd_post", NULL});
  expect_error("transformer.h.0.mlp sync fwd_post all_reduce pattern=\"matmul(x, w)\"\n",
               SLAPO_PRECOND, (const char *const[]){"trace", NULL});
  expect_error("transformer.h.0.mlp.c_fc sync fwd_post all_reduce group=pp\n",
               SLAPO_INVALID_ARG, (const char *const[]){"group=pp: expected tp, dp or world", NULL});
  expect_error("transformer.h.0.mlp.c_fc sync bwd_pre all_reduce\n", SLAPO_INVALID_ARG,
               (const char *const[]){"unknown mode 'bwd_pre'", NULL});
  expect_error("transformer.h.0.mlp.c_fc sync bwd_post all_gather\n", SLAPO_INVALID_ARG,
               (const char *const[]){"bwd_post takes all_reduce", NULL});
  expect_error("transformer.h.0.mlp.c_fc sync fwd_post broadcast\n", SLAPO_INVALID_ARG,
               (const char *const[]){"unknown collective 'broadcast'", NULL});
}

/* A size the group cannot split (256 rows in 3 parts; on two ranks also
 * 3 x 2). */
static void test_not_divisible(void **state) {
  (void)state;
  expect_error("lm_head shard weight axis=0 parts=3\n", SLAPO_SHAPE,
               (const char *const[]){"lm_head.weight", "axis 0", "256", "group size", NULL});
}

/* Collectives that do not fit the shards: refused on any number of ranks
 * (what a shard produces depends on its axis, not on the group size). */
static void test_sync_mismatch(void **state) {
  (void)state;
  expect_error("transformer.h.0.mlp.c_fc shard weight axis=0\n"
               "transformer.h.0.mlp.c_fc sync fwd_post all_reduce\n",
               SLAPO_PRECOND, (const char *const[]){"split along its last axis",
                                                    "all_gather axis=-1", NULL});
  expect_error("transformer.h.0.mlp.c_proj shard weight axis=1\n"
               "transformer.h.0.mlp.c_proj sync fwd_post all_gather axis=-1\n",
               SLAPO_PRECOND, (const char *const[]){"partial sums", "all_reduce", NULL});
  expect_error("transformer.h.0.mlp.c_fc decompose\n"
               "transformer.h.0.mlp.c_fc shard weight axis=0\n"
               "transformer.h.0.mlp.c_fc shard bias axis=0\n"
               "transformer.h.0.mlp.c_proj shard weight axis=1\n"
               "transformer.h.0.mlp trace flatten=true\n"
               "transformer.h.0.mlp sync fwd_post all_reduce pattern=\"matmul(x, w)\"\n",
               SLAPO_PRECOND, (const char *const[]){"matched value is split along its last",
                                                    "all_gather axis=-1", NULL});
  /* Nothing sharded: every rank has the whole output, and all_reduce
   * would double it on two ranks. */
  expect_error("transformer.h.0.mlp.c_proj sync fwd_post all_reduce\n", SLAPO_PRECOND,
               (const char *const[]){"transformer.h.0.mlp.c_proj", "weight is not sharded",
                                     "all_reduce would add", "shard the weight first", NULL});
  expect_error("transformer.wte sync fwd_post all_gather axis=-1\n", SLAPO_PRECOND,
               (const char *const[]){"all_gather would concatenate", NULL});
  expect_error("transformer.h.0.mlp.c_fc sync bwd_post all_reduce\n", SLAPO_PRECOND,
               (const char *const[]){"input's whole gradient", NULL});
  expect_error("transformer.h.0.mlp.c_fc shard weight axis=0\n"
               "transformer.h.0.mlp.c_fc decompose\n",
               SLAPO_STATE, (const char *const[]){"decompose before shard", NULL});
  expect_error("transformer.h.0.mlp.c_fc shard weight axis=0\n"
               "transformer.h.0.mlp.c_fc shard weight axis=1\n",
               SLAPO_STATE, (const char *const[]){"already sharded along axis 0", NULL});
}

int main(void) {
  if (slapo_dist_init(0) != SLAPO_OK) return 1; /* every rank in one TP group */
  if (slapo_models_init() != SLAPO_OK) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_megatron_gpt2),
      cmocka_unit_test(test_megatron_gpt2_checkpointed),
      cmocka_unit_test(test_megatron_gpt2_bf16),
      cmocka_unit_test(test_megatron_gpt2_composite),
      cmocka_unit_test(test_megatron_gpt2_flat_composite),
      cmocka_unit_test(test_sync_pattern_in_traced_graph),
      cmocka_unit_test(test_tied_parameter_sharded_once),
      cmocka_unit_test(test_shard_unknown_parameter),
      cmocka_unit_test(test_sync_bad_mode_and_op),
      cmocka_unit_test(test_not_divisible),
      cmocka_unit_test(test_sync_mismatch),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  slapo_dist_finalize();
  return rc;
}
