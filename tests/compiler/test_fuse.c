/* tests/compiler/test_fuse.c - fuse through the none and cc backends:
 * GPT-2's bias + GELU and bias + dropout + residual regions (against the
 * unfused model, dropout on), every elementwise op through cc against none
 * with broadcast shapes, dropout on rows that are not whole Philox blocks
 * (bitwise against none), byte-identical reruns, the kernel cache (hit, miss
 * on another ISA, shape-generic objects), compiler missing and failing,
 * unsupported ops, the generated source against a golden file, the
 * backward kernel's reductions (bitwise equal for 1, 2 and 3 threads, and
 * against a double sum), gradients passed on as dy, and the
 * preconditions of fuse and decompose with their messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>

#include "../primitives/prim_test.h"
#include "cache_fixture.h"
#include "compiler/internal.h"
#include "slapo/primitives.h"


/* decompose every c_fc, trace every MLP flat, fuse bias + GELU. */
static slapo_sched *bias_gelu_model(const char *compiler) {
  /* compiler may carry backend options: "cc math=ref". */
  slapo_sched *root = pt_sched_new(&k_tiny);
  char text[512];
  snprintf(text, sizeof text,
           "transformer.h.*.mlp.c_fc decompose\n"
           "transformer.h.*.mlp trace flatten=true\n"
           "transformer.h.*.mlp fuse pattern=\"gelu(add(x, b))\" compiler=%s name=FusedBiasGeLU\n",
           compiler);
  pt_apply(root, text);
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
  /* The reference forms (math=ref): another source, within tolerance. */
  slapo_sched *ref = bias_gelu_model("cc math=ref");
  pt_expect_same_as_plain(ref, &k_tiny, PT_B, PT_T, false);
  pt_sched_free(ref);
  pt_sched_free(none);
  pt_sched_free(cc);
}


/* Bias + dropout + residual after both projections of every block, all
 * matches at once; dropout masks must be those of the unfused model. */
static void bias_dropout_residual(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  pt_apply(root, "transformer.h.*.{attn,mlp}.c_proj decompose\n"
                 "transformer.h.* trace flatten=true\n"
                 "transformer.h.* fuse pattern=\"add(x, dropout(add(y, b)))\" compiler=cc "
                 "name=FusedBiasDropRes all=true\n");
  assert_non_null(pt_at(root, "transformer.h.0.FusedBiasDropRes_1"));
  pt_expect_same_as_plain(root, &k_tiny, PT_B, PT_T, false);
  /* Reruns are byte-identical. */
  slapo_tensor *in[2];
  pt_inputs(PT_B, PT_T, k_tiny.vocab_size, in);
  pt_result a, b;
  pt_run(slapo_sched_module(root), in, &a);
  pt_run(slapo_sched_module(root), in, &b);
  pt_expect_bitwise(&a, &b);
  pt_result_free(&a), pt_result_free(&b);
  pt_inputs_free(in);
  pt_sched_free(root);
}

/* ---- every elementwise op: cc against none ---- */

typedef struct one_op {
  const char *name; /* op */
  int kind;         /* 0 unary, 1 binary with a row b [8], 2 binary with a scalar b [] */
  double attr;
  float lo, hi;     /* value range of w and b */
} one_op;

static slapo_node *one_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                               slapo_node *const *in) {
  (void)n_in;
  const one_op *o = self->config;
  slapo_node *w = slapo_weight(ctx, self, "w"), *b = o->kind ? slapo_weight(ctx, self, "b") : NULL, *y;
  const slapo_op *op = slapo_op_find(o->name);
  if (!strcmp(o->name, "add_scalar")) y = slapo_add_scalar(ctx, w, o->attr);
  else if (!strcmp(o->name, "mul_scalar")) y = slapo_mul_scalar(ctx, w, o->attr);
  else if (!strcmp(o->name, "pow")) y = slapo_pow(ctx, w, o->attr);
  else if (!strcmp(o->name, "gelu")) y = slapo_gelu(ctx, w, o->attr != 0);
  else if (!strcmp(o->name, "dropout")) y = slapo_dropout(ctx, w, o->attr);
  else y = slapo_op_apply(ctx, op, o->kind ? 2 : 1, (slapo_node *[]){w, b}, 0, NULL);
  int64_t axes[2] = {0, 1};
  return slapo_sum(ctx, slapo_mul(ctx, y, in[0]), 2, axes, false);
}

static void one_free(void *c) { (void)c; }
static const slapo_module_type k_one = {"OneOp", one_forward, NULL, one_free, NULL};

static void fill(slapo_parameter *p, float lo, float hi, int salt) {
  float *d = slapo_tensor_data(p->value);
  for (int64_t i = 0; i < slapo_tensor_numel(p->value); i++)
    d[i] = lo + (hi - lo) * slapo_rng_uniform(9, (uint64_t)salt, 0, (uint64_t)i);
}

static slapo_module *one_model(const one_op *o) {
  slapo_module *m;
  OK(slapo_module_new(&k_one, (void *)o, &m));
  int64_t ws[2] = {4, 8}, bs[1] = {8};
  OK(slapo_module_add_param(m, "w", 2, ws, SLAPO_INIT_ZEROS, 0));
  if (o->kind) OK(slapo_module_add_param(m, "b", o->kind == 1 ? 1 : 0, bs, SLAPO_INIT_ZEROS, 0));
  slapo_tensor *ex;
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, ws, &ex));
  OK(slapo_module_set_example(m, 1, (const slapo_tensor *const *)&ex));
  slapo_tensor_free(ex);
  OK(slapo_module_materialize(m, 1));
  fill(slapo_module_param(m, "w"), o->lo, o->hi, 1);
  if (o->kind) fill(slapo_module_param(m, "b"), o->lo, o->hi, 2);
  return m;
}

/* One training step with the input r of w's shape; the loss and the
 * gradients of w and b (NULL without b). */
static void run_one(slapo_module *m, float *loss, slapo_tensor **gw, slapo_tensor **gb) {
  const slapo_tensor *w = slapo_module_param(m, "w")->value;
  slapo_tensor *r;
  OK(slapo_tensor_new(SLAPO_DTYPE_F32, 2, w->shape, &r));
  float *d = slapo_tensor_data(r);
  for (int64_t i = 0; i < slapo_tensor_numel(r); i++) d[i] = (float)((i * 5) % 7) / 7.0f - 0.4f;
  slapo_runner *run;
  OK(slapo_runner_new(m, NULL, &run));
  slapo_module_zero_grad(m);
  const slapo_tensor *out;
  slapo_kernel_env env = {.seed = 5, .step = 2, .training = true};
  OK(slapo_step(run, 1, (const slapo_tensor *const *)&r, SLAPO_STEP_TRAIN, &env, &out));
  *loss = *(const float *)slapo_tensor_data(out);
  OK(slapo_tensor_contiguous(slapo_module_param(m, "w")->grad, gw));
  *gb = NULL;
  if (slapo_module_param(m, "b")) OK(slapo_tensor_contiguous(slapo_module_param(m, "b")->grad, gb));
  slapo_runner_free(run);
  slapo_tensor_free(r);
}

static void fuse_text(slapo_module *m, const char *compiler, const char *text) {
  slapo_sched *root;
  OK(slapo_sched_create(m, &root));
  OK(slapo_trace(root, NULL));
  slapo_pattern *p = pt_parse(text);
  slapo_status st = slapo_fuse(root, p, compiler, "One", NULL, true);
  if (st != SLAPO_OK) fail_msg("%s: %s", text, slapo_last_error());
  slapo_pattern_free(p);
  slapo_sched_free(root);
}

static void fused_one(slapo_module *m, const char *compiler) {
  const one_op *o = m->config;
  char text[64];
  snprintf(text, sizeof text, "%s(x%s)", o->name, o->kind ? ", y" : "");
  fuse_text(m, compiler, text);
}

static void every_elementwise_op(void **state) {
  (void)state;
  static const one_op cases[] = {
      {"add", 1, 0, -1, 1},      {"sub", 1, 0, -1, 1},        {"mul", 1, 0, -1, 1},
      {"div", 1, 0, 0.5f, 2},    {"mul", 2, 0, -1, 1},        {"add", 2, 0, -1, 1},
      {"add_scalar", 0, 0.5, -1, 1}, {"mul_scalar", 0, -1.5, -1, 1}, {"pow", 0, 3, 0.5f, 2},
      {"pow", 0, 2, -1, 1},      {"neg", 0, 0, -1, 1},        {"exp", 0, 0, -1, 1},
      {"log", 0, 0, 0.5f, 2},    {"tanh", 0, 0, -2, 2},       {"sqrt", 0, 0, 0.5f, 2},
      {"rsqrt", 0, 0, 0.5f, 2},  {"relu", 0, 0, -1, 1},       {"sigmoid", 0, 0, -3, 3},
      {"silu", 0, 0, -3, 3},     {"gelu", 0, 1, -3, 3},       {"gelu", 0, 0, -3, 3},
      {"dropout", 0, 0.3, -1, 1},  {"round_bf16", 0, 0, -1, 1},
  };
  int covered = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const one_op *o = &cases[i];
    slapo_module *a = one_model(o), *b = one_model(o);
    fused_one(a, "none");
    fused_one(b, "cc");
    float la, lb;
    slapo_tensor *wa, *ba, *wb, *bb;
    run_one(a, &la, &wa, &ba);
    run_one(b, &lb, &wb, &bb);
    print_message("%-10s kind %d: loss %.7g vs %.7g\n", o->name, o->kind, la, lb);
    assert_true(fabsf(la - lb) <= 1e-5f * (1 + fabsf(la)));
    if (pt_worst(wb, wa, 1e-5, 1e-4) > 1) fail_msg("%s: gradient of w differs", o->name);
    if (ba && pt_worst(bb, ba, 1e-5, 1e-4) > 1) fail_msg("%s: gradient of b differs", o->name);
    slapo_tensor_free(wa), slapo_tensor_free(wb), slapo_tensor_free(ba), slapo_tensor_free(bb);
    slapo_module_free(a), slapo_module_free(b);
    covered++;
  }
  /* Every differentiable elementwise op appears above. */
  for (int i = 0; i < slapo_op_count(); i++) {
    const slapo_op *op = slapo_op_at(i);
    if (!op->elementwise || !op->backward) continue;
    bool found = false;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) found |= !strcmp(cases[k].name, op->name);
    if (!found) fail_msg("elementwise op %s is not tested through cc", op->name);
  }
  assert_true(covered > 20);
}

/* ---- dropout where rows are not whole Philox blocks ---- */

/* sum(dropout(add(w, b), 0.3) * r) for w [R, C] and a bias b [C]. */
static slapo_node *bias_drop_forward(slapo_ctx *ctx, slapo_module *self, int n_in,
                                     slapo_node *const *in) {
  (void)n_in;
  slapo_node *w = slapo_weight(ctx, self, "w"), *b = slapo_weight(ctx, self, "b");
  slapo_node *y = slapo_dropout(ctx, slapo_add(ctx, w, b), 0.3);
  int64_t axes[2] = {0, 1};
  return slapo_sum(ctx, slapo_mul(ctx, y, in[0]), 2, axes, false);
}

static const slapo_module_type k_bias_drop = {"BiasDrop", bias_drop_forward, NULL, one_free, NULL};

static slapo_module *bias_drop_model(int64_t R, int64_t C) {
  slapo_module *m;
  OK(slapo_module_new(&k_bias_drop, NULL, &m));
  int64_t ws[2] = {R, C};
  OK(slapo_module_add_param(m, "w", 2, ws, SLAPO_INIT_ZEROS, 0));
  OK(slapo_module_add_param(m, "b", 1, &ws[1], SLAPO_INIT_ZEROS, 0));
  slapo_tensor *ex;
  OK(slapo_tensor_new_meta(SLAPO_DTYPE_F32, 2, ws, &ex));
  OK(slapo_module_set_example(m, 1, (const slapo_tensor *const *)&ex));
  slapo_tensor_free(ex);
  OK(slapo_module_materialize(m, 1));
  fill(slapo_module_param(m, "w"), -1, 1, 1);
  fill(slapo_module_param(m, "b"), -1, 1, 2);
  return m;
}

/* A row of C % 4 != 0 columns starts inside a Philox block, and so do the
 * later column blocks of a row longer than one (64 columns): the cc kernels
 * draw uniforms from any offset in a block. The masks, so the loss and w's
 * gradient, must be the unfused op's bit for bit; b's gradient is a sum in
 * another order. */
static void dropout_unaligned_rows(void **state) {
  (void)state;
  static const int64_t shapes[][2] = {{5, 7}, {3, 70}, {4, 130}, {6, 64}};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    slapo_module *a = bias_drop_model(shapes[k][0], shapes[k][1]);
    slapo_module *b = bias_drop_model(shapes[k][0], shapes[k][1]);
    fuse_text(a, "none", "dropout(add(x, y))");
    fuse_text(b, "cc", "dropout(add(x, y))");
    float la, lb;
    slapo_tensor *wa, *ba, *wb, *bb;
    run_one(a, &la, &wa, &ba);
    run_one(b, &lb, &wb, &bb);
    print_message("[%lld, %lld]: loss %.9g vs %.9g\n", (long long)shapes[k][0],
                  (long long)shapes[k][1], la, lb);
    assert_memory_equal(&la, &lb, sizeof la);
    assert_memory_equal(slapo_tensor_data(wa), slapo_tensor_data(wb),
                        sizeof(float) * (size_t)slapo_tensor_numel(wa));
    if (pt_worst(bb, ba, 1e-5, 1e-4) > 1) fail_msg("gradient of b differs");
    slapo_tensor_free(wa), slapo_tensor_free(wb), slapo_tensor_free(ba), slapo_tensor_free(bb);
    slapo_module_free(a), slapo_module_free(b);
  }
}

/* ---- the cache, the compiler, the source ---- */

static void cache_hits_and_misses(void **state) {
  (void)state;
  slapo_cc_stats s0 = slapo_cc_stats_get();
  slapo_sched *a = bias_gelu_model("cc");
  slapo_cc_stats s1 = slapo_cc_stats_get();
  /* Compiled by the first test already: found in the cache, nothing built. */
  assert_int_equal(s1.compiled, s0.compiled);
  assert_true(s1.cache_hits > s0.cache_hits);
  pt_sched_free(a);
  /* Another ISA cap misses: the baseline, or the host's level when the
   * run is already capped at the baseline (SLAPO_MAX_ISA=baseline). */
  slapo_isa was = slapo_isa_active();
  slapo_isa other = was == SLAPO_ISA_BASELINE ? slapo_isa_host() : SLAPO_ISA_BASELINE;
  if (other != was) {
    slapo_isa_set_max(other);
    a = bias_gelu_model("cc");
    slapo_isa_set_max(was);
    assert_true(slapo_cc_stats_get().compiled > s1.compiled);
    pt_sched_free(a);
  }
}

static void write_script(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(body, f);
  fclose(f);
  chmod(path, 0755);
}

static void compiler_missing_and_failing(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *mlp = pt_at(root, "transformer.h.0.mlp");
  OK(slapo_decompose(pt_at(root, "transformer.h.0.mlp.c_fc")));
  OK(slapo_trace(mlp, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse("relu(add(x, b))"); /* a region nobody compiled */
  slapo_pattern_free(p);
  p = pt_parse("gelu(add(x, b))");
  setenv("SLAPO_CC", "/nonexistent/cc", 1);
  /* A fresh cache so the object is not found. */
  char dir[300];
  snprintf(dir, sizeof dir, "%s/other", g_cache);
  setenv("SLAPO_CACHE_DIR", dir, 1);
  PT_EXPECT_REFUSED(root, slapo_fuse(mlp, p, "cc", "F", NULL, false), SLAPO_COMPILE,
                    "the compiler '/nonexistent/cc' (SLAPO_CC) was not found");
  char fake[300];
  snprintf(fake, sizeof fake, "%s/fakecc", g_cache);
  write_script(fake, "#!/bin/sh\nif [ \"$1\" = --version ]; then echo fakecc 1.0; exit 0; fi\n"
                     "echo 'fakecc: error: no kernels today' >&2; exit 3\n");
  setenv("SLAPO_CC", fake, 1);
  PT_EXPECT_REFUSED(root, slapo_fuse(mlp, p, "cc", "F", NULL, false), SLAPO_COMPILE,
                    "failed (exit 3)", "no kernels today");
  unsetenv("SLAPO_CC");
  setenv("SLAPO_CACHE_DIR", g_cache, 1);
  slapo_pattern_free(p);
  pt_sched_free(root);
}

static void preconditions(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *blk = pt_at(root, "transformer.h.0");
  slapo_pattern *p = pt_parse("dropout(x)");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", NULL, false), SLAPO_PRECOND,
                    "transformer.h.0 is not traced; trace it first");
  OK(slapo_trace(blk, &(slapo_trace_opts){.flatten = true}));
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", NULL, false), SLAPO_INVALID_ARG,
                    "pattern 'dropout(x)' matches 3 times", "all=true");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "gcc", "F", NULL, true), SLAPO_INVALID_ARG,
                    "no compiler 'gcc' (known: auto, none, cc");
  /* cc takes math=fast|ref and nothing else. */
  const char *k_math[1] = {"math"}, *v_bad[1] = {"double"}, *k_bad[1] = {"opt"};
  slapo_compile_opts bad_value = {1, k_math, v_bad}, bad_key = {1, k_bad, v_bad};
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", &bad_value, true), SLAPO_INVALID_ARG,
                    "cc: math=double; expected math=fast");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", &bad_key, true), SLAPO_INVALID_ARG,
                    "cc: unknown option 'opt'", "math=fast|ref");
  slapo_pattern_free(p);
  p = pt_parse("relu(x)");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", NULL, false), SLAPO_NO_MATCH,
                    "matches nothing");
  slapo_pattern_free(p);
  /* The first residual sum escapes to ln_2, which runs before the MLP
   * output the fused region reads: no place for the fused call. */
  p = pt_parse("add(add(x, y), z)");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", NULL, false), SLAPO_STATE,
                    "before the replacement's input", "is computed");
  slapo_pattern_free(p);
  /* GPT-2's attention softmax is causal: cc says so (compiler/cc_rows.c
   * generates softmax over whole rows). */
  p = pt_parse("softmax(x)");
  PT_EXPECT_REFUSED(root, slapo_fuse(blk, p, "cc", "F", NULL, false), SLAPO_UNSUPPORTED,
                    "cc: softmax", "is causal");
  slapo_pattern_free(p);
  PT_EXPECT_REFUSED(root, slapo_decompose(pt_at(root, "transformer.h.1.mlp.act")),
                    SLAPO_INVALID_ARG, "transformer.h.1.mlp.act is a GELU; decompose takes a Linear");
  PT_EXPECT_REFUSED(root, slapo_decompose(pt_at(root, "lm_head")), SLAPO_PRECOND,
                    "lm_head has no bias");
  pt_sched_free(root);
}

/* Processes filling one cache at once: each builds and loads the object;
 * the cache ends with one object, its matching digest, and no temporary
 * files. */
static void concurrent_cache_fill(void **state) {
  (void)state;
  char dir[300];
  snprintf(dir, sizeof dir, "%s/concurrent", g_cache);
  setenv("SLAPO_CACHE_DIR", dir, 1);
  const char *src = "#include <stdint.h>\n"
                    "void slapo_cc_fwd(void) {}\nvoid slapo_cc_bwd(void) {}\n/* concurrency */\n";
  pid_t kids[4];
  for (int k = 0; k < 4; k++) {
    if ((kids[k] = fork()) == 0) {
      slapo__cc_fwd_fn f;
      slapo__cc_bwd_fn b;
      char key[17];
      _exit(slapo__cc_build(src, &f, &b, key) == SLAPO_OK && f && b ? 0 : 1);
    }
  }
  for (int k = 0; k < 4; k++) {
    int st = 0;
    waitpid(kids[k], &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  char cmd[1024], out[64] = "";
  snprintf(cmd, sizeof cmd,
           "ls '%s' | grep -c '\\.so$'; ls '%s' | grep -c '\\.so\\.xxh3$'; ls '%s' | grep -c tmp",
           dir, dir, dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  pclose(p);
  out[n] = '\0';
  assert_string_equal(out, "1\n1\n0\n");
  /* The object and digest left behind agree (the fillers wrote the same
   * bytes): found, not compiled again. */
  slapo_cc_stats s0 = slapo_cc_stats_get();
  slapo__cc_fwd_fn f;
  slapo__cc_bwd_fn b;
  char key[17];
  OK(slapo__cc_build(src, &f, &b, key));
  assert_int_equal(slapo_cc_stats_get().compiled, s0.compiled);
  assert_int_equal(slapo_cc_stats_get().cache_hits, s0.cache_hits + 1);
  setenv("SLAPO_CACHE_DIR", g_cache, 1);
}

/* fuse_all on flattened blocks: every elementwise region, never across an
 * escaping value; the residual stream's adds are used twice, so the bias
 * and dropout regions stop at them. */
static void fuse_all_blocks(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  pt_apply(root, "transformer.h.*.mlp.c_fc decompose\n"
                 "transformer.h.*.{attn,mlp}.c_proj decompose\n"
                 "transformer.h.* trace flatten=true\n"
                 "transformer.h.* fuse_all compiler=cc\n");
  char *g = pt_capture((pt_print_fn)slapo_graph_print,
                       slapo_module_graph(slapo_sched_module(pt_at(root, "transformer.h.0"))));
  print_message("%s", g);
  assert_non_null(strstr(g, "call_module Fused_0("));
  free(g);
  char *line = pt_last_line(root);
  assert_string_equal(line, "transformer.h.1 fuse_all compiler=cc name=Fused");
  free(line);
  pt_expect_same_as_plain(root, &k_tiny, PT_B, PT_T, false);
  pt_expect_same_as_plain(root, &k_tiny, 3, 5, false);
  pt_expect_replays(root, &k_tiny);
  /* Nothing left to fuse: the one region left, the scale + causal softmax
   * (a region now ends in a softmax), cc refuses, as it did the first time
   * (a region skipped between fused ones: children stay in match order). */
  PT_EXPECT_REFUSED(root, slapo_fuse_all(pt_at(root, "transformer.h.0"), "cc", NULL),
                    SLAPO_UNSUPPORTED, "nothing could be fused");
  pt_sched_free(root);
  /* compiler=auto: every region is elementwise, so cc runs each. */
  root = pt_sched_new(&k_tiny);
  pt_apply(root, "transformer.h.*.mlp.c_fc decompose\n"
                 "transformer.h.* trace flatten=true\n"
                 "transformer.h.* fuse_all compiler=auto\n");
  slapo_module *blk = slapo_sched_module(pt_at(root, "transformer.h.0"));
  char *tree = pt_capture(pt_print_module, blk);
  assert_non_null(strstr(tree, "Fused(compiler=auto, ops=add+gelu, runs=cc)"));
  free(tree);
  pt_expect_same_as_plain(root, &k_tiny, PT_B, PT_T, false);
  pt_sched_free(root);
}

/* A value used outside the match is one more result of the region: the
 * residual sum feeding ln_2 (and the second residual add) comes out of the
 * fused module beside the LayerNorm, as a tuple; the model is unchanged. */
static void escaping_value_is_a_result(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny);
  slapo_sched *blk = pt_at(root, "transformer.h.0");
  OK(slapo_trace(blk, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse("layer_norm(add(x, y), w, b)");
  OK(slapo_fuse(blk, p, "none", "F", NULL, false));
  slapo_pattern_free(p);
  char *g = pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(blk)));
  assert_non_null(strstr(g, "%F_0 : (2) = call_module F_0("));
  assert_non_null(strstr(g, "getitem(%F_0, 1)"));
  free(g);
  pt_expect_same_as_plain(root, &k_tiny, 2, 8, true);
  pt_sched_free(root);
}

/* Pre-LN: the MLP residual of block i feeds block i + 1's ln_1 (the last
 * one ln_f), so a per-block trace sees n_layer of the 2 n_layer chains
 * bias + dropout + residual + LayerNorm. A trace of `transformer` (the
 * blocks' parent) spans them: all 2 n_layer match, each but the last with
 * the residual sum as a second result (read by the next residual add), and
 * fuse (none) keeps the model bitwise. */
static void pre_ln_chains_across_blocks(void **state) {
  (void)state;
  slapo_sched *root = pt_sched_new(&k_tiny4);
  for (int l = 0; l < k_tiny4.n_layer; l++) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%d.attn.c_proj", l);
    OK(slapo_decompose(pt_at(root, path)));
    snprintf(path, sizeof path, "transformer.h.%d.mlp.c_proj", l);
    OK(slapo_decompose(pt_at(root, path)));
  }
  slapo_sched *tr = pt_at(root, "transformer");
  OK(slapo_trace(tr, &(slapo_trace_opts){.flatten = true}));
  slapo_pattern *p = pt_parse("layer_norm(add(x, dropout(add(y, b))), w, c)");
  slapo_matches ms = {0};
  OK(slapo_sched_find(tr, p, &ms));
  assert_int_equal(ms.n, 2 * k_tiny4.n_layer);
  assert_string_equal(ms.items[ms.n - 1].paths[ms.items[ms.n - 1].n_nodes - 1], "ln_f");
  slapo_matches_deinit(&ms);
  OK(slapo_fuse(tr, p, "none", "BiasDropoutResidualLN", NULL, true));
  slapo_pattern_free(p);
  char *g = pt_capture((pt_print_fn)slapo_graph_print, slapo_module_graph(slapo_sched_module(tr)));
  int n = 0, two = 0;
  for (const char *q = g; (q = strstr(q, "= call_module BiasDropoutResidualLN_")); q++) n++;
  for (const char *q = g; (q = strstr(q, " : (2) = call_module BiasDropoutResidualLN_")); q++) two++;
  free(g);
  assert_int_equal(n, 2 * k_tiny4.n_layer);
  /* the last residual sum feeds ln_f alone: one result there */
  assert_int_equal(two, 2 * k_tiny4.n_layer - 1);
  pt_expect_same_as_plain(root, &k_tiny4, 2, 8, true);
  pt_sched_free(root);
}

/* The generated source for bias + GELU (tanh) against a golden file;
 * SLAPO_UPDATE_GOLDEN=1 rewrites it. */
static void golden_source(void **state) {
  (void)state;
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t xs[3] = {2, 8, 128}, bs[1] = {128};
  slapo_node *x = slapo_input(ctx, "x0", SLAPO_DTYPE_F32, 3, xs);
  slapo_node *b = slapo_input(ctx, "x1", SLAPO_DTYPE_F32, 1, bs);
  slapo_node *y = slapo_gelu(ctx, slapo_add(ctx, x, b), true);
  assert_non_null(slapo_output(ctx, 1, &y));
  slapo__cc_plan plan;
  char *src;
  OK(slapo__cc_generate(g, "FusedBiasGeLU", true, &plan, &src));
  assert_int_equal(plan.kind[0], SLAPO__CC_FULL);
  assert_int_equal(plan.kind[1], SLAPO__CC_ROW);
  char path[512];
  snprintf(path, sizeof path, "%s/cc_bias_gelu.c.golden", getenv("SLAPO_TEST_DATA"));
  if (getenv("SLAPO_UPDATE_GOLDEN")) write_script(path, src);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *want = calloc(1, 1 << 16);
  size_t n = fread(want, 1, (1 << 16) - 1, f);
  fclose(f);
  want[n] = '\0';
  assert_string_equal(src, want);
  free(want);
  slapo_free(src);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

/* The backward kernel of `y` over inputs x [R, C] and b (a row [C] or one
 * value []), called directly at 1, 2 and 3 threads: every output byte
 * equal, the gradient of b within 1e-5 of its sum in double. R = 300 rows
 * is not a multiple of the row blocks, so the last block is shorter. */
static void backward_reduction_at(bool row) {
  enum { R = 300, C = 200 };
  slapo_graph *g;
  slapo_ctx *ctx;
  OK(slapo_graph_new(&g));
  OK(slapo_ctx_new(g, &ctx));
  int64_t xs[2] = {R, C}, bs[1] = {C};
  slapo_node *x = slapo_input(ctx, "x0", SLAPO_DTYPE_F32, 2, xs);
  slapo_node *b = slapo_input(ctx, "x1", SLAPO_DTYPE_F32, row ? 1 : 0, bs);
  slapo_node *y = row ? slapo_gelu(ctx, slapo_add(ctx, x, b), true) : slapo_mul(ctx, x, b);
  assert_non_null(slapo_output(ctx, 1, &y));
  slapo__cc_plan plan;
  char *src;
  OK(slapo__cc_generate(g, "Reduce", true, &plan, &src));
  slapo__cc_fwd_fn f;
  slapo__cc_bwd_fn bw;
  char key[17];
  OK(slapo__cc_build(src, &f, &bw, key));
  slapo_free(src);
  int64_t nb = row ? C : 1, nwork = slapo__cc_work_doubles(&plan, row ? C : R * C, R);
  float *xv = malloc(sizeof(float) * R * C), *bv = malloc(sizeof(float) * nb);
  float *dy = malloc(sizeof(float) * R * C);
  for (int64_t i = 0; i < R * C; i++) {
    xv[i] = -3 + 6 * slapo_rng_uniform(3, 1, 0, (uint64_t)i);
    dy[i] = -1 + 2 * slapo_rng_uniform(3, 2, 0, (uint64_t)i);
  }
  for (int64_t c = 0; c < nb; c++) bv[c] = -1 + 2 * slapo_rng_uniform(3, 3, 0, (uint64_t)c);
  const float *in[2] = {xv, bv};
  int64_t off[2] = {0, R * C};
  float *pk[3];
  double *work = malloc(sizeof(double) * (size_t)(nwork ? nwork : 1));
  int saved = omp_get_max_threads();
  for (int k = 0; k < 3; k++) {
    omp_set_num_threads(k + 1);
    pk[k] = malloc(sizeof(float) * (R * C + nb));
    bw(R * C, row ? C : R * C, in, dy, pk[k], off, work, NULL, 0, 1);
  }
  omp_set_num_threads(saved);
  for (int k = 1; k < 3; k++)
    assert_memory_equal(pk[0], pk[k], sizeof(float) * (R * C + nb));
  /* b's gradient against a plain double sum: of x's gradient down column c
   * (the add passes it on), or of dy * x over every element. */
  for (int64_t c = 0; c < nb; c++) {
    double t = 0;
    for (int64_t r = 0; r < R; r++)
      if (row) t += pk[0][r * C + c];
      else
        for (int64_t j = 0; j < C; j++) t += (double)dy[r * C + j] * xv[r * C + j];
    if (fabs(t - pk[0][R * C + c]) > 1e-5 * (1 + fabs(t)))
      fail_msg("%s: gradient of b[%lld] %.9g, double sum %.9g", row ? "row" : "scalar",
               (long long)c, pk[0][R * C + c], t);
  }
  for (int k = 0; k < 3; k++) free(pk[k]);
  free(xv), free(bv), free(dy), free(work);
  slapo_ctx_free(ctx);
  slapo_graph_free(g);
}

static void backward_reductions(void **state) {
  (void)state;
  backward_reduction_at(true);
  backward_reduction_at(false);
}

/* Gradients that are dy itself (a residual add; a bias add's input; a
 * dropout with p = 0) are passed on by the rule, not written; a mask, a
 * product or a broadcast input is not. */
static void gradient_identities(void **state) {
  (void)state;
  for (int drop = 0; drop < 3; drop++) {
    slapo_graph *g;
    slapo_ctx *ctx;
    OK(slapo_graph_new(&g));
    OK(slapo_ctx_new(g, &ctx));
    int64_t xs[2] = {4, 8}, bs[1] = {8};
    slapo_node *x = slapo_input(ctx, "x0", SLAPO_DTYPE_F32, 2, xs);
    slapo_node *y = slapo_input(ctx, "x1", SLAPO_DTYPE_F32, 2, xs);
    slapo_node *b = slapo_input(ctx, "x2", SLAPO_DTYPE_F32, 1, bs);
    slapo_node *t = slapo_add(ctx, y, b);
    if (drop == 1) t = slapo_dropout(ctx, t, 0.0);
    if (drop == 2) t = slapo_dropout(ctx, t, 0.1);
    slapo_node *o = slapo_add(ctx, x, t);
    assert_non_null(slapo_output(ctx, 1, &o));
    slapo__cc_plan plan;
    char *src;
    OK(slapo__cc_generate(g, "Res", true, &plan, &src));
    assert_true(plan.grad_is_dy[0]);
    assert_int_equal(plan.grad_is_dy[1], drop != 2);
    assert_false(plan.grad_is_dy[2]);
    slapo_free(src);
    slapo_ctx_free(ctx);
    slapo_graph_free(g);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bias_gelu_none_and_cc),
      cmocka_unit_test(bias_dropout_residual),
      cmocka_unit_test(every_elementwise_op),
      cmocka_unit_test(dropout_unaligned_rows),
      cmocka_unit_test(cache_hits_and_misses),
      cmocka_unit_test(compiler_missing_and_failing),
      cmocka_unit_test(preconditions),
      cmocka_unit_test(escaping_value_is_a_result),
      cmocka_unit_test(pre_ln_chains_across_blocks),
      cmocka_unit_test(golden_source),
      cmocka_unit_test(backward_reductions),
      cmocka_unit_test(gradient_identities),
      cmocka_unit_test(fuse_all_blocks),
      cmocka_unit_test(concurrent_cache_fill),
  };
  return cmocka_run_group_tests(tests, cache_setup, cache_teardown);
}
