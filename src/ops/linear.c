/* ops/linear.c - "linear": y [.., out] = x [.., in] @ w [out, in]^T + b [out],
 * PyTorch's nn.functional.linear. Inputs (x, w) or (x, w, b): one op name
 * with or without bias, so a Linear module always appears as "linear".
 * Kernels: the GEMM of ops/gemm.h with w read transposed through its strides
 * and the bias added by the GEMM (oneDNN's bias argument on the fast path).
 * Backward: dx = dy @ w; dw = dy2^T @ x2 with dy2, x2 the [rows, out] /
 * [rows, in] reshapes of dy and x; db = dy summed over the leading axes.
 * Layer: ops. */
#include "slapo/ops/gemm.h"
#include "ops/internal.h"

static slapo_status linear_infer(slapo_node *node) {
  if (node->n_inputs < 2 || node->n_inputs > 3)
    return slapo_error(SLAPO_INVALID_ARG, "linear: expects 2 or 3 inputs (x, w[, b]), got %d",
                       node->n_inputs);
  SLAPO_TRY(slapo__want_gemm_operands(node));
  if (node->n_inputs == 3) SLAPO_TRY(slapo__want_dtype(node, 2, SLAPO_DTYPE_F32));
  const slapo_node *x = node->inputs[0], *w = node->inputs[1];
  if (w->ndim != 2)
    return slapo_error(SLAPO_SHAPE, "linear: w %s must be 2-d [out, in] (x is %s)",
                       slapo__shape_of(w), slapo__shape_of(x));
  if (x->ndim < 1)
    return slapo_error(SLAPO_SHAPE, "linear: x %s must have at least 1 dim [.., in]",
                       slapo__shape_of(x));
  int64_t in = x->shape[x->ndim - 1], out = w->shape[0];
  if (w->shape[1] != in)
    return slapo_error(SLAPO_SHAPE,
                       "linear: x %s and w %s: x's last dim %lld differs from w's in-features "
                       "%lld (w is [out, in])",
                       slapo__shape_of(x), slapo__shape_of(w), (long long)in,
                       (long long)w->shape[1]);
  if (node->n_inputs == 3) {
    const slapo_node *b = node->inputs[2];
    if (b->ndim != 1 || b->shape[0] != out)
      return slapo_error(SLAPO_SHAPE, "linear: b %s does not match w %s: expected [%lld]",
                         slapo__shape_of(b), slapo__shape_of(w), (long long)out);
  }
  int64_t shape[SLAPO_MAX_DIMS];
  for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
  shape[x->ndim - 1] = out;
  return slapo_node_set_meta(node, SLAPO_DTYPE_F32, x->ndim, shape);
}

/* The GEMM of a linear: a 1-d x [in] is a [1, in] matrix (the stack copies
 * below are views of the same storage, never freed). */
static void as_matrices(const slapo_tensor *const *in, slapo_tensor *out, slapo_tensor *xm,
                        slapo_tensor *ym) {
  slapo_tensor x = *in[0], y = *out;
  if (x.ndim == 1) {
    x.ndim = 2, x.shape[1] = x.shape[0], x.strides[1] = x.strides[0];
    x.shape[0] = 1, x.strides[0] = x.shape[1] * x.strides[1];
    y.ndim = 2, y.shape[1] = y.shape[0], y.strides[1] = 1;
    y.shape[0] = 1, y.strides[0] = y.shape[1];
  }
  *xm = x, *ym = y;
}

static void linear_ref(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                       const slapo_kernel_env *env) {
  (void)env;
  slapo_tensor x, y;
  as_matrices(in, out, &x, &y);
  slapo__gemm g;
  slapo__gemm_init(&g, &x, false, in[1], true, node->n_inputs == 3 ? in[2] : NULL, &y);
  slapo__gemm_ref(&g);
}

static void linear_fast(const slapo_node *node, const slapo_tensor *const *in, slapo_tensor *out,
                        const slapo_kernel_env *env) {
  (void)env;
  slapo_tensor x, y;
  as_matrices(in, out, &x, &y);
  slapo__gemm_fast(&x, false, in[1], true, node->n_inputs == 3 ? in[2] : NULL, &y);
}

static slapo_node *reshape2(slapo_ctx *ctx, slapo_node *t, int64_t rows, int64_t cols) {
  if (t->ndim == 2) return t;
  int64_t s[2] = {rows, cols};
  slapo_attr a = slapo_attr_ints("shape", 2, s);
  return slapo__call1(ctx, SLAPO_OP_DESC(reshape), t, 1, &a);
}

static slapo_status linear_backward(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                    const bool *need, slapo_node **dx) {
  slapo_node *x = node->inputs[0], *w = node->inputs[1];
  int nd = x->ndim;
  int64_t rows = 1;
  for (int i = 0; i < nd - 1; i++) rows *= x->shape[i];
  int64_t in = w->shape[1], out = w->shape[0];
  /* With bf16 operands (autocast) the two backward GEMMs read dy in bf16
   * too, one cast shared by both; the bias gradient sums dy in f32. */
  slapo_node *dg = need[0] || need[1] ? slapo__gemm_grad_operand(ctx, node, dy) : dy;
  if (need[0]) {
    /* dx [.., in] = dy [.., out] @ w [out, in]; matmul broadcasts w over the
     * batch, and a 1-d dy goes through [1, out]. */
    if (nd >= 2) {
      dx[0] = slapo_matmul(ctx, dg, slapo__gemm_recast(ctx, w), false, false);
    } else {
      slapo_node *g =
          slapo_matmul(ctx, reshape2(ctx, dg, 1, out), slapo__gemm_recast(ctx, w), false, false);
      int64_t s[1] = {in};
      slapo_attr a = slapo_attr_ints("shape", 1, s);
      dx[0] = slapo__call1(ctx, SLAPO_OP_DESC(reshape), g, 1, &a);
    }
  }
  if (need[1]) {
    /* dw [out, in] = dy2^T [out, rows] @ x2 [rows, in]. */
    dx[1] = slapo_matmul(ctx, reshape2(ctx, dg, rows, out), reshape2(ctx, x, rows, in), true,
                         false);
  }
  if (node->n_inputs == 3 && need[2]) {
    /* db [out] = dy summed over every leading axis. */
    if (nd == 1) {
      dx[2] = dy;
    } else {
      int64_t axes[SLAPO_MAX_DIMS];
      for (int i = 0; i < nd - 1; i++) axes[i] = i;
      slapo_attr a[2] = {slapo_attr_ints("axes", nd - 1, axes), slapo_attr_int("keepdim", 0)};
      dx[2] = slapo__call1(ctx, SLAPO_OP_DESC(sum), dy, 2, a);
    }
  }
  return slapo_ctx_status(ctx);
}

/* x [2, 3, 4] with w [5, 4] and b [5]: batch dims and the bias. */
static slapo_node *linear_example(slapo_ctx *ctx) {
  slapo_node *x = slapo_input(ctx, "x", SLAPO_DTYPE_F32, 3, (int64_t[]){2, 3, 4});
  slapo_node *w = slapo_input(ctx, "w", SLAPO_DTYPE_F32, 2, (int64_t[]){5, 4});
  slapo_node *b = slapo_input(ctx, "b", SLAPO_DTYPE_F32, 1, (int64_t[]){5});
  return slapo_linear(ctx, x, w, b);
}

SLAPO_OP_DESCRIPTOR(linear) = {
    .name = "linear",
    .flops = slapo__flops_contract_last,
    .n_inputs = -1, /* (x, w) or (x, w, b); the count is checked by infer */
    .infer = linear_infer,
    .ref = linear_ref,
    .fast = linear_fast,
    .backward = linear_backward,
    .contiguous_inputs = false,
    .doc = "x [.., in] @ w [out, in]^T + b [out] -> [.., out], b optional "
           "(torch.nn.functional.linear)",
    .test = {.example = linear_example},
};

slapo_node *slapo_linear(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b) {
  slapo_node *in[3] = {slapo__autocast_operand(ctx, x), slapo__autocast_operand(ctx, w), b};
  if (slapo_ctx_autocast(ctx) != SLAPO_AUTOCAST_BF16_EMULATED)
    return slapo_op_apply(ctx, SLAPO_OP_DESC(linear), b ? 3 : 2, in, 0, NULL);
  /* Emulated: the bias after the rounding point of dy (slapo/ops.h). */
  slapo_node *y = slapo__autocast_result(ctx, slapo_op_apply(ctx, SLAPO_OP_DESC(linear), 2, in,
                                                             0, NULL));
  return b ? slapo_add(ctx, y, b) : y;
}
