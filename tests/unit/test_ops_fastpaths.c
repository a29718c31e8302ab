/* tests/unit/test_ops_fastpaths.c - the fast kernels written for training
 * speed, against their references on sizes and ranges the op table's small
 * examples do not reach: GELU (tanh form) and its derivative over
 * [-12, 12] (ops/vmath.h's exp-based form), dropout's vectorized Philox on
 * long tensors at unaligned offsets (bitwise), the whole-block paths of
 * the elementwise kernels (blocks of 4096 plus a remainder), and softmax's
 * vectorized rows (lanes plus a tail, causal rows of every length, logits
 * spread wide enough to reach the clamped exp range) and LayerNorm's lane
 * sums (rows of 770: lanes plus a tail), and the GEMM operands copied to a
 * padded row stride first (ops/gemm_dnnl.c). Runs
 * kernels through slapo_eager in reference and fast mode. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "common/check.h"

#include <math.h>
#include <string.h>

#include "slapo/ops/vmath.h"
#include "slapo/exec.h"
#include "slapo/ops.h"


static const slapo_plan_opts k_ref = {.reference = true}, k_fast = {0};

static slapo_tensor *vector(int64_t n) {
  slapo_tensor *t;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 1, &n, &t));
  return t;
}

/* Runs op in both modes; *ref and *fast owned by the caller. */
static void both(const char *op, int n_in, const slapo_tensor *const *in, int n_attrs,
                 const slapo_attr *attrs, const slapo_kernel_env *env, slapo_tensor **ref,
                 slapo_tensor **fast) {
  assert_ok(slapo_eager(op, n_in, in, n_attrs, attrs, env, &k_ref, ref));
  assert_ok(slapo_eager(op, n_in, in, n_attrs, attrs, env, &k_fast, fast));
}

/* slapo__exp_bounded_f, softmax's and cross-entropy's e^(x - max), against
 * exp in double on every 97th float of [-87, 0.5] (~10^7 points, both
 * signs, every binade): within 1 ulp (2^-23) relative everywhere (8.3e-8
 * measured). */
static void test_exp_bounded_f_accuracy(void **state) {
  (void)state;
  double worst = 0;
  float at = 0;
  for (uint32_t b = 0; b < 0x7f800000u; b += 97)
    for (int sign = 0; sign < 2; sign++) {
      uint32_t bits = b | (sign ? 0x80000000u : 0);
      float a;
      memcpy(&a, &bits, sizeof a);
      if (a < -87.0f || a > 0.5f) continue;
      double want = exp((double)a), err = fabs((double)slapo__exp_bounded_f(a) - want) / want;
      if (err > worst) worst = err, at = a;
    }
  print_message("exp_bounded_f: max relative error %.3g at %.9g\n", worst, (double)at);
  if (worst > 1.2e-7) fail_msg("max relative error %.3g at %.9g (> 1 ulp)", worst, (double)at);
}

/* GELU and its derivative, tanh form, on a dense grid of [-12, 12]: the
 * fast kernels' error stays within 4e-7 of max(|ref|, 1) (a few ulp; the
 * old 1 + tanhf(u) form lost every digit for x < -4) and, wherever |ref|
 * >= 1e-3 away from the derivative's root, within 2e-6 relative for GELU
 * and 4e-6 for its derivative (1.2e-6 and 2.7e-6 measured; PyTorch 1.13's
 * float kernels: 5e-5 and 2.4e-4; ops/vmath.h). */
static void test_gelu_tanh_accuracy(void **state) {
  (void)state;
  const int64_t n = 240001; /* not a multiple of the 4096 block */
  slapo_tensor *x = vector(n), *dy = vector(n);
  float *xp = slapo_tensor_data(x), *dp = slapo_tensor_data(dy);
  for (int64_t i = 0; i < n; i++) {
    xp[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
    dp[i] = 1.0f;
  }
  slapo_attr a = slapo_attr_str("approximate", "tanh");
  const slapo_tensor *in[2] = {x, dy};
  const char *ops[2] = {"gelu", "gelu_backward"};
  for (int k = 0; k < 2; k++) {
    slapo_tensor *r, *f;
    both(ops[k], k + 1, in, 1, &a, NULL, &r, &f);
    const float *rp = slapo_tensor_data(r), *fp = slapo_tensor_data(f);
    for (int64_t i = 0; i < n; i++) {
      double err = fabs((double)fp[i] - (double)rp[i]);
      double scale = fabs(rp[i]) > 1 ? fabs(rp[i]) : 1;
      if (err > 4e-7 * scale)
        fail_msg("%s(%g): fast %.9g ref %.9g", ops[k], xp[i], fp[i], rp[i]);
      bool near_root = k == 1 && fabsf(xp[i] + 0.7518f) < 0.05f;
      if (fabs(rp[i]) >= 1e-3 && !near_root && err > (k ? 4e-6 : 2e-6) * fabs(rp[i]))
        fail_msg("%s(%g): fast %.9g ref %.9g (relative)", ops[k], xp[i], fp[i], rp[i]);
    }
    slapo_tensor_free(r);
    slapo_tensor_free(f);
  }
  slapo_tensor_free(x);
  slapo_tensor_free(dy);
}

/* Dropout's fast kernel computes 16 Philox blocks at a time from a chunk
 * grid aligned in index space: long tensors, offsets not a multiple of 4
 * (or of the chunk), and p from tiny to 1 give the reference's bytes. */
static void test_dropout_fast_is_bitwise_reference(void **state) {
  (void)state;
  const int64_t n = 70001;
  slapo_tensor *x = vector(n);
  float *xp = slapo_tensor_data(x);
  for (int64_t i = 0; i < n; i++) xp[i] = 1.0f + (float)(i % 1000) * 1e-3f;
  const double ps[] = {1e-7, 0.1, 0.5, 0.999, 1.0};
  const int64_t offsets[] = {0, 3, 4097, 1 << 20};
  slapo_kernel_env env = {.seed = 42, .step = 0x100000007ull, .training = true};
  const slapo_tensor *in[1] = {x};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    for (size_t j = 0; j < sizeof offsets / sizeof offsets[0]; j++) {
      slapo_attr a[3] = {slapo_attr_float("p", ps[i]), slapo_attr_int("stream", 12345),
                         slapo_attr_int("offset", offsets[j])};
      slapo_tensor *r, *f;
      both("dropout", 1, in, 3, a, &env, &r, &f);
      if (memcmp(slapo_tensor_data(r), slapo_tensor_data(f), slapo_tensor_nbytes(r)))
        fail_msg("dropout p=%g offset=%lld: fast differs from reference", ps[i],
                 (long long)offsets[j]);
      slapo_tensor_free(r);
      slapo_tensor_free(f);
    }
  }
  slapo_tensor_free(x);
}

/* The elementwise kernels' contiguous paths run in blocks of 4096 through
 * per-ISA clones: a size with a remainder, same bytes as the reference for
 * exact operations (add, mul; bias rows [R, C] + [C]). */
static void test_elementwise_blocks(void **state) {
  (void)state;
  const int64_t R = 37, C = 301, n = R * C;
  slapo_tensor *a, *b, *row;
  int64_t s2[2] = {R, C}, s1[1] = {C};
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, s2, &a));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, s2, &b));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 1, s1, &row));
  float *ap = slapo_tensor_data(a), *bp = slapo_tensor_data(b), *rp = slapo_tensor_data(row);
  for (int64_t i = 0; i < n; i++) ap[i] = (float)i * 0.37f - 1.0f, bp[i] = 3.0f - (float)i * 1e-3f;
  for (int64_t i = 0; i < C; i++) rp[i] = (float)i * 0.5f;
  const char *ops[2] = {"add", "mul"};
  for (int k = 0; k < 2; k++) {
    for (int bias = 0; bias < 2; bias++) {
      const slapo_tensor *in[2] = {a, bias ? row : b};
      slapo_tensor *r, *f;
      both(ops[k], 2, in, 0, NULL, NULL, &r, &f);
      assert_memory_equal(slapo_tensor_data(r), slapo_tensor_data(f), slapo_tensor_nbytes(r));
      slapo_tensor_free(r);
      slapo_tensor_free(f);
    }
  }
  slapo_tensor_free(a);
  slapo_tensor_free(b);
  slapo_tensor_free(row);
}

/* Softmax and its backward, fast vs reference, elementwise within 4e-7 of
 * the row's largest output (a few ulp). */
static void test_softmax_rows(void **state) {
  (void)state;
  int64_t shape[3] = {3, 37, 53}; /* rows of 53 = 3 lanes of 16 + 5 */
  slapo_tensor *x, *dy;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 3, shape, &x));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 3, shape, &dy));
  float *xp = slapo_tensor_data(x), *dp = slapo_tensor_data(dy);
  int64_t n = slapo_tensor_numel(x);
  for (int64_t i = 0; i < n; i++) {
    xp[i] = (float)((i * 7919) % 2001 - 1000) * 0.12f; /* [-120, 120] */
    dp[i] = (float)((i * 104729) % 201 - 100) * 0.01f;
  }
  for (int causal = 0; causal < 2; causal++) {
    slapo_attr a = slapo_attr_int("causal", causal);
    const slapo_tensor *in[1] = {x};
    slapo_tensor *r, *f;
    both("softmax", 1, in, 1, &a, NULL, &r, &f);
    const float *rp = slapo_tensor_data(r), *fp = slapo_tensor_data(f);
    for (int64_t i = 0; i < n; i++)
      if (fabsf(fp[i] - rp[i]) > 4e-7f)
        fail_msg("softmax causal=%d [%lld]: fast %.9g ref %.9g", causal, (long long)i, fp[i],
                 rp[i]);
    const slapo_tensor *bin[2] = {r, dy};
    slapo_tensor *br, *bf;
    both("softmax_backward", 2, bin, 0, NULL, NULL, &br, &bf);
    const float *brp = slapo_tensor_data(br), *bfp = slapo_tensor_data(bf);
    for (int64_t i = 0; i < n; i++)
      if (fabsf(bfp[i] - brp[i]) > 4e-7f)
        fail_msg("softmax_backward [%lld]: fast %.9g ref %.9g", (long long)i, bfp[i], brp[i]);
    slapo_tensor_free(r);
    slapo_tensor_free(f);
    slapo_tensor_free(br);
    slapo_tensor_free(bf);
  }
  slapo_tensor_free(x);
  slapo_tensor_free(dy);
}

/* LayerNorm and its input gradient on rows of 770 (mean 1, std 0.6):
 * fast within 2e-6 of max(|ref|, 1) (float sums in a different order). */
static void test_layer_norm_rows(void **state) {
  (void)state;
  int64_t xs[2] = {33, 770}, cs[1] = {770};
  slapo_tensor *x, *w, *b, *dy;
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, xs, &x));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, xs, &dy));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 1, cs, &w));
  assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 1, cs, &b));
  float *xp = slapo_tensor_data(x), *dp = slapo_tensor_data(dy);
  float *wp = slapo_tensor_data(w), *bp = slapo_tensor_data(b);
  for (int64_t i = 0; i < 33 * 770; i++) {
    xp[i] = 1.0f + (float)((i * 7919) % 1001 - 500) * 2e-3f;
    dp[i] = (float)((i * 104729) % 201 - 100) * 0.01f;
  }
  for (int64_t c = 0; c < 770; c++) wp[c] = 1.0f + (float)(c % 13) * 0.05f, bp[c] = 0.01f * c;
  slapo_attr eps = slapo_attr_float("eps", 1e-5);
  const slapo_tensor *fin[3] = {x, w, b}, *bin[3] = {x, w, dy};
  const char *ops[2] = {"layer_norm", "layer_norm_backward"};
  for (int k = 0; k < 2; k++) {
    slapo_tensor *r, *f;
    both(ops[k], 3, k ? bin : fin, 1, &eps, NULL, &r, &f);
    const float *rp = slapo_tensor_data(r), *fp = slapo_tensor_data(f);
    for (int64_t i = 0; i < 33 * 770; i++) {
      float scale = fabsf(rp[i]) > 1 ? fabsf(rp[i]) : 1;
      if (fabsf(fp[i] - rp[i]) > 2e-6f * scale)
        fail_msg("%s [%lld]: fast %.9g ref %.9g", ops[k], (long long)i, fp[i], rp[i]);
    }
    slapo_tensor_free(r);
    slapo_tensor_free(f);
  }
  slapo_tensor_free(x);
  slapo_tensor_free(w);
  slapo_tensor_free(b);
  slapo_tensor_free(dy);
}

/* The GEMM fast path's padded copies (twice each, so the second call
 * reuses the scratch and the cached primitive), within 1e-5 of max |ref|
 * (float sums): a [192, 80] @ b [80, 3072] (b's rows 12 KiB apart) and
 * a [160, 4100] @ b [4100, 300] (a's long rows not 64-byte aligned). */
static void test_gemm_padded_operands(void **state) {
  (void)state;
  const int64_t dims[2][3] = {{192, 80, 3072}, {160, 4100, 300}}; /* M, K, N */
  for (int c = 0; c < 2; c++) {
    int64_t M = dims[c][0], K = dims[c][1], N = dims[c][2];
    int64_t as[2] = {M, K}, bs[2] = {K, N};
    slapo_tensor *a, *b;
    assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, as, &a));
    assert_ok(slapo_tensor_new(SLAPO_DTYPE_F32, 2, bs, &b));
    float *ap = slapo_tensor_data(a), *bp = slapo_tensor_data(b);
    for (int64_t i = 0; i < M * K; i++) ap[i] = (float)((i * 7919) % 201 - 100) * 0.01f;
    for (int64_t i = 0; i < K * N; i++) bp[i] = (float)((i * 104729) % 199 - 99) * 0.01f;
    const slapo_tensor *in[2] = {a, b};
    for (int k = 0; k < 2; k++) {
      slapo_tensor *r, *f;
      both("matmul", 2, in, 0, NULL, NULL, &r, &f);
      const float *rp = slapo_tensor_data(r), *fp = slapo_tensor_data(f);
      float max_ref = 0, max_err = 0;
      for (int64_t i = 0; i < M * N; i++) {
        max_ref = fabsf(rp[i]) > max_ref ? fabsf(rp[i]) : max_ref;
        max_err = fabsf(fp[i] - rp[i]) > max_err ? fabsf(fp[i] - rp[i]) : max_err;
      }
      if (max_err > 1e-5f * max_ref)
        fail_msg("[%lld, %lld] @ [%lld, %lld]: max error %g, max |ref| %g", (long long)M,
                 (long long)K, (long long)K, (long long)N, max_err, max_ref);
      slapo_tensor_free(r);
      slapo_tensor_free(f);
    }
    slapo_tensor_free(a);
    slapo_tensor_free(b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exp_bounded_f_accuracy),
      cmocka_unit_test(test_gelu_tanh_accuracy),
      cmocka_unit_test(test_dropout_fast_is_bitwise_reference),
      cmocka_unit_test(test_elementwise_blocks),
      cmocka_unit_test(test_softmax_rows),
      cmocka_unit_test(test_layer_norm_rows),
      cmocka_unit_test(test_gemm_padded_operands),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
