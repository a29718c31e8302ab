/* ops/matmul.c - "matmul": C [.., M, N] = op(A) @ op(B), A [.., M, K] and
 * B [.., K, N] with NumPy-broadcast batch dims (torch.matmul for ndim >= 2);
 * int attrs trans_a / trans_b (0/1) mean A is stored [.., K, M] / B is
 * stored [.., N, K], so the transpose is a stride swap, never a copy.
 * Kernels: the reference loop and the oneDNN fast path of ops/gemm.h.
 * Backward (derivation in matmul_backward below): dA = dC @ B^T and
 * dB = A^T @ dC, each built as a matmul with trans flags, summed over batch
 * dims the input was broadcast along. Layer: ops. */
#include <stdio.h>

#include "slapo/ops/gemm.h"
#include "ops/internal.h"

/* Reads trans_a / trans_b, which must be 0 or 1. */
static slapo_status trans_attrs(const slapo_node *node, bool *ta, bool *tb) {
  int64_t a = slapo_node_attr_int(node, "trans_a", 0);
  int64_t b = slapo_node_attr_int(node, "trans_b", 0);
  if ((a != 0 && a != 1) || (b != 0 && b != 1))
    return slapo_error(SLAPO_INVALID_ARG, "matmul: trans_a=%lld and trans_b=%lld must be 0 or 1",
                       (long long)a, (long long)b);
  *ta = a, *tb = b;
  return SLAPO_OK;
}

/* " (a is [.., M, K], b is [.., N, K] with trans_b=1)": the rule the inner
 * dims broke, in the caller's terms. */
static const char *layout_hint(bool ta, bool tb) {
  static const char *const hints[2][2] = {
      {"a is [.., M, K], b is [.., K, N]", "a is [.., M, K], b is [.., N, K] with trans_b=1"},
      {"a is [.., K, M] with trans_a=1, b is [.., K, N]",
       "a is [.., K, M] with trans_a=1, b is [.., N, K] with trans_b=1"}};
  return hints[ta][tb];
}

static slapo_status matmul_infer(slapo_node *node) {
  SLAPO_TRY(slapo__want_gemm_operands(node));
  bool ta = false, tb = false;
  SLAPO_TRY(trans_attrs(node, &ta, &tb));
  const slapo_node *a = node->inputs[0], *b = node->inputs[1];
  if (a->ndim < 2 || b->ndim < 2)
    return slapo_error(SLAPO_SHAPE,
                       "matmul: a %s and b %s: both need at least 2 dims ([.., M, K] and "
                       "[.., K, N]); reshape a vector to [1, K] or [K, 1]",
                       slapo__shape_of(a), slapo__shape_of(b));
  int na = a->ndim, nb = b->ndim;
  int64_t M = ta ? a->shape[na - 1] : a->shape[na - 2];
  int64_t Ka = ta ? a->shape[na - 2] : a->shape[na - 1];
  int64_t Kb = tb ? b->shape[nb - 1] : b->shape[nb - 2];
  int64_t N = tb ? b->shape[nb - 2] : b->shape[nb - 1];
  if (Ka != Kb)
    return slapo_error(SLAPO_SHAPE, "matmul: a %s and b %s: inner dims %lld and %lld differ (%s)",
                       slapo__shape_of(a), slapo__shape_of(b), (long long)Ka, (long long)Kb,
                       layout_hint(ta, tb));

  /* Batch dims broadcast NumPy style, aligned from the right. */
  int nba = na - 2, nbb = nb - 2, n = nba > nbb ? nba : nbb;
  int64_t shape[SLAPO_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - nba ? 1 : a->shape[i - (n - nba)];
    int64_t db = i < n - nbb ? 1 : b->shape[i - (n - nbb)];
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      return slapo_error(SLAPO_SHAPE,
                         "matmul: a %s and b %s: batch dims %s and %s do not broadcast "
                         "(%lld vs %lld); each pair must be equal or one of them 1",
                         slapo__shape_of(a), slapo__shape_of(b),
                         slapo_shape_str(nba, a->shape, sa, sizeof sa),
                         slapo_shape_str(nbb, b->shape, sb, sizeof sb), (long long)da,
                         (long long)db);
    }
    shape[i] = da == 1 ? db : da;
  }
  shape[n] = M;
  shape[n + 1] = N;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, n + 2, shape);
}


static void matmul_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  slapo__gemm g;
  slapo__gemm_init(&g, in[0], slapo_node_attr_int(node, "trans_a", 0) != 0, in[1],
                   slapo_node_attr_int(node, "trans_b", 0) != 0, NULL, out);
  slapo__gemm_ref(&g);
}

static void matmul_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)env;
  slapo__gemm_fast(in[0], slapo_node_attr_int(node, "trans_a", 0) != 0, in[1],
                   slapo_node_attr_int(node, "trans_b", 0) != 0, NULL, out);
}

/* Gradient of a matmul. With A = op(A_s), B = op(B_s) (op = transpose when
 * the flag is set) and C = A @ B:
 *   dA = dC @ B^T,  dB = A^T @ dC.
 * The stored operands get the transposes of those when their flag is set:
 *   !ta: dA_s = dC @ B^T            = matmul(dC, B_s, 0, !tb)
 *    ta: dA_s = dA^T = B @ dC^T     = matmul(B_s, dC, tb, 1)
 *   !tb: dB_s = A^T @ dC            = matmul(A_s, dC, !ta, 0)
 *    tb: dB_s = dB^T = dC^T @ A     = matmul(dC, A_s, 1, ta)
 * Batch dims: each product has C's batch shape; slapo__grad_to sums it down
 * to the input's. A 2-D B used by a batched A (a shared weight) is common
 * enough to get a direct form: with the batch folded into the rows,
 * dB_s = reshape(A_s)^T @ reshape(dC) (or its transpose) is one GEMM with no
 * [.., K, N] intermediate to sum. */
static slapo_status matmul_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  slapo_node *a = node->inputs[0], *b = node->inputs[1];
  bool ta = slapo_node_attr_int(node, "trans_a", 0) != 0;
  bool tb = slapo_node_attr_int(node, "trans_b", 0) != 0;
  /* bf16 operands (autocast): the backward GEMMs read dy in bf16 too. */
  dy = slapo__gemm_grad_operand(ctx, node, dy);
  if (need[0]) b = slapo__gemm_recast(ctx, b);
  if (need[1]) a = slapo__gemm_recast(ctx, a);
  if (need[0]) {
    slapo_node *g = ta ? slapo_matmul(ctx, b, dy, tb, true) : slapo_matmul(ctx, dy, b, false, !tb);
    dx[0] = slapo__grad_to(ctx, g, a);
  }
  if (need[1]) {
    if (b->ndim == 2 && a->ndim > 2 && !ta) {
      int64_t rows = 1;
      for (int i = 0; i < a->ndim - 1; i++) rows *= a->shape[i];
      int64_t a2[2] = {rows, a->shape[a->ndim - 1]}, c2[2] = {rows, dy->shape[dy->ndim - 1]};
      slapo_attr sa = slapo_attr_ints("shape", 2, a2), sc = slapo_attr_ints("shape", 2, c2);
      /* dy has C's batch dims, which equal a's here (b has none). */
      slapo_node *ar = slapo__call1(ctx, SLAPO_OP_DESC(reshape), a, 1, &sa);
      slapo_node *cr = slapo__call1(ctx, SLAPO_OP_DESC(reshape), dy, 1, &sc);
      dx[1] = tb ? slapo_matmul(ctx, cr, ar, true, false) : slapo_matmul(ctx, ar, cr, true, false);
    } else {
      slapo_node *g =
          tb ? slapo_matmul(ctx, dy, a, true, ta) : slapo_matmul(ctx, a, dy, !ta, false);
      dx[1] = slapo__grad_to(ctx, g, b);
    }
  }
  return slapo_ctx_status(ctx);
}

/* a [2, 3, 4] @ b stored [5, 4] with trans_b: a broadcast batch dim and a
 * transposed operand in one small case (other flag combinations are covered
 * by tests/unit/test_ops_matmul.c). */
static slapo_node *matmul_example(slapo_ctx *ctx) {
  slapo_node *a = slapo_input(ctx, "a", SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 2, (int64_t[]){5, 4});
  return slapo_matmul(ctx, a, b, false, true);
}

SLAPO_OP_DESCRIPTOR(matmul) = {
    .name = "matmul",
    .n_inputs = 2,
    .flops = slapo__flops_contract_last,
    .infer = matmul_infer,
    .ref = matmul_ref,
    .fast = matmul_fast,
    .backward = matmul_backward,
    /* Any strides: they go into the GEMM (and oneDNN's descriptors) as is. */
    .contiguous_inputs = false,
    .doc = "a [.., M, K] @ b [.., K, N] -> [.., M, N], batch dims broadcast (torch.matmul); "
           "trans_a/trans_b: a stored [.., K, M] / b stored [.., N, K]",
    .test = {.example = matmul_example},
};

slapo_node *slapo_matmul(slapo_ctx *ctx, slapo_node *a, slapo_node *b, bool trans_a,
                         bool trans_b) {
  /* Only set flags become attributes, so a plain product prints plainly. */
  slapo_attr attrs[2];
  int n = 0;
  if (trans_a) attrs[n++] = slapo_attr_int("trans_a", 1);
  if (trans_b) attrs[n++] = slapo_attr_int("trans_b", 1);
  slapo_node *y = slapo__call2(ctx, SLAPO_OP_DESC(matmul), slapo__autocast_operand(ctx, a),
                               slapo__autocast_operand(ctx, b), n, attrs);
  return slapo__autocast_result(ctx, y);
}
