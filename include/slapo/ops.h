/* slapo/ops.h - the op descriptor, the op registry (built-in ops from
 * slapo/ops.def plus run-time registration), and the graph-building API:
 * op calls build nodes, they do not compute (the ggml way).
 * Layer: ops (depends on ir, tensor, core). */
#ifndef SLAPO_OPS_H
#define SLAPO_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "slapo/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Building context                                                          */
/* ------------------------------------------------------------------------ */

/* A graph under construction plus a *sticky* error: the first failing op call
 * records its status and a message naming the op, the module path and the
 * shapes; every later op call returns NULL at once, and the caller checks
 * slapo_ctx_status() once at the end. */
typedef struct slapo_ctx slapo_ctx;

/* Creates a context building into `g` (borrowed; must outlive the ctx).
 * *out owned (slapo_ctx_free). Errors: SLAPO_NOMEM. */
slapo_status slapo_ctx_new(slapo_graph *g, slapo_ctx **out);
void slapo_ctx_free(slapo_ctx *ctx); /* NULL is fine */
slapo_graph *slapo_ctx_graph(const slapo_ctx *ctx);

/* First error recorded (SLAPO_OK if none); its message is in
 * slapo_ctx_message() (borrowed, lives with the ctx). */
slapo_status slapo_ctx_status(const slapo_ctx *ctx);
const char *slapo_ctx_message(const slapo_ctx *ctx);
/* Records an error if none is recorded yet (sticky); also sets the thread's
 * slapo_last_error. Returns the first recorded status. */
slapo_status slapo_ctx_fail(slapo_ctx *ctx, slapo_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Module path stamped on new nodes as their origin (copied), on a stack
 * whose frames nest; the root path is "". Each path keeps its own op counter,
 * stamped as node->op_seq. slapo_ctx_enter_call opens the frame of a module
 * *call* (slapo_call does): it gets the path's next call ordinal (0 for the
 * first call, 1 for a module called a second time in the same forward).
 * slapo_ctx_push_origin opens a frame that only stamps the path (backward,
 * recompute): it belongs to the path's latest call and changes no count.
 * A random op's stream is slapo_rng_stream(path, call ordinal, its index
 * among the random ops drawn in that call), so it depends on nothing else in
 * the graph. Errors (enter/push): SLAPO_NOMEM, recorded on the ctx; a
 * failed enter/push opens no frame, so pop only after one that returned
 * SLAPO_OK (popping more frames than were opened is an internal error). */
slapo_status slapo_ctx_enter_call(slapo_ctx *ctx, const char *path);
slapo_status slapo_ctx_push_origin(slapo_ctx *ctx, const char *path);
void slapo_ctx_pop_origin(slapo_ctx *ctx);
const char *slapo_ctx_origin(const slapo_ctx *ctx);
/* The current frame's call ordinal (see slapo_ctx_enter_call). */
int slapo_ctx_call(const slapo_ctx *ctx);

/* Activation checkpointing (Chen et al. 2016, "Training Deep Nets with
 * Sublinear Memory Cost"): nodes built while a region id > 0 is set are
 * stamped with it (node->recompute); slapo_backward re-emits each region's
 * forward just before the region's backward and differentiates the copies,
 * so the originals' intermediates die during the forward. new_region returns
 * a fresh id (1, 2, …); set_region returns the previous id so calls nest. */
int slapo_ctx_new_region(slapo_ctx *ctx);
int slapo_ctx_set_region(slapo_ctx *ctx, int region);
int slapo_ctx_region(const slapo_ctx *ctx);

/* Shapeless building (pattern graphs): while on, op calls skip shape
 * inference, so placeholders without shapes can stand for any value; nodes
 * keep dtype f32 and ndim 0. Off by default. */
/* Autocast (the `autocast` primitive; PyTorch's torch.autocast): how
 * slapo_linear, slapo_matmul and slapo_conv2d build GEMMs and convolutions
 * from here on.
 * - OFF: as given.
 * - BF16: f32 operands are cast with to_bf16 first (one cast per value per
 *   graph: a weight used twice is cast once), the GEMM reads bf16 and
 *   accumulates and writes f32; its backward GEMMs read dy cast to bf16.
 * - BF16_EMULATED: the same rounding points in f32 arithmetic: operands
 *   through round_bf16, the GEMM in f32, its output through
 *   round_bf16_grad (so dy is rounded where the bf16 backward casts it), a
 *   bias added after it (its gradient sums dy unrounded, as in BF16). Runs
 *   on any CPU; verify's reference for a bf16 schedule.
 * The module layer sets it per module call (slapo_call); returns the
 * previous mode, to be restored. */
typedef enum slapo_autocast {
  SLAPO_AUTOCAST_OFF = 0,
  SLAPO_AUTOCAST_BF16 = 1,
  SLAPO_AUTOCAST_BF16_EMULATED = 2,
} slapo_autocast;
slapo_autocast slapo_ctx_set_autocast(slapo_ctx *ctx, slapo_autocast mode);
slapo_autocast slapo_ctx_autocast(const slapo_ctx *ctx);

void slapo_ctx_set_shapeless(slapo_ctx *ctx, bool on);
bool slapo_ctx_shapeless(const slapo_ctx *ctx);

/* While on, random ops take their shard attributes from the caller instead
 * of deriving them from their input's tensor-parallel layout: backward
 * building (slapo_backward sets it, recompute included; the backward rule
 * copies the forward's attributes, and a gradient's layout is not the
 * value's) and builds that only discover shapes and never run (trace's
 * capture of a module's inputs, while a schedule is half applied). Returns
 * the previous setting. */
bool slapo_ctx_set_copy_rng(slapo_ctx *ctx, bool on);
/* The current setting (off for a new ctx). */
bool slapo_ctx_copy_rng(const slapo_ctx *ctx);

/* Tensor-parallel layouts (ops/layout.c, DESIGN.md §3). Sets node->layout:
 * the layout a node gets from its inputs' under its op's rule (op->layout, else the built-in
 * table: elementwise ops keep a slice, reshape/permute/slice/matmul/linear
 * map it where the mapping is exact, a Linear whose weight is split on its
 * input axis gives a partial sum, an Embedding whose table is split gives
 * one; any other op on a sharded input gives UNKNOWN). Called by op
 * building after shape inference; returns an op's refusal (a fused cc region
 * drawing random numbers on a shard). */
slapo_status slapo_layout_infer(slapo_node *node);
/* The layout in words ("replicated", "a partial sum", "unknown", "split on
 * axis 2 (this rank: from 64 of 128)") into buf [cap]; returns buf. */
const char *slapo_layout_str(const slapo_layout *l, char *buf, size_t cap);
/* The elementwise rule alone (for run-time ops that are elementwise
 * regions, e.g. fused cc ops): slices of one axis placed alike stay, a
 * replicated input must broadcast along it; partial sums pass through ops
 * linear in them. Sets node->layout; returns SLAPO_OK. */
slapo_status slapo_layout_elementwise(slapo_node *node);
/* True for a non-replicated layout (split, partial or unknown). */
bool slapo_layout_sharded(const slapo_layout *l);

/* Upper layers (module/) attach their own state here. */
void slapo_ctx_set_user(slapo_ctx *ctx, void *user);
void *slapo_ctx_user(const slapo_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* Op descriptor                                                             */
/* ------------------------------------------------------------------------ */

/* What a kernel may read besides its tensors. */
typedef struct slapo_kernel_env {
  uint64_t seed;  /* run seed (random ops)                               */
  uint64_t step;  /* training step, part of the RNG counter (DESIGN §3)  */
  bool training;  /* dropout active                                      */
} slapo_kernel_env;

/* Computes `out` from `in` for `node` (attributes via slapo_node_attr_*).
 * Inputs may be strided unless the op sets `contiguous_inputs`; `out` is
 * contiguous, allocated by the executor with the node's shape and dtype, and
 * never aliases an input. Kernels do not fail: every user error is caught by
 * shape inference at build time. Parallel with OpenMP; deterministic for a
 * given thread count. */
typedef void (*slapo_kernel_fn)(const slapo_node *node, const slapo_tensor *const *in,
                                slapo_tensor *out, const slapo_kernel_env *env);

/* For view ops: fills `out` (shape, strides, offset; storage shared with
 * in[0]) without copying. */
typedef void (*slapo_view_fn)(const slapo_node *node, const slapo_tensor *const *in,
                              slapo_tensor *out);

/* Shape/dtype inference: reads the inputs' metadata and the node's attributes
 * and sets the node's dtype/ndim/shape (slapo_node_set_meta). Returns
 * SLAPO_SHAPE / SLAPO_DTYPE / SLAPO_INVALID_ARG with a message naming the op
 * and the shapes (`matmul: a [2, 3] and b [4, 5]: inner dims 3 and 4
 * differ`); the ctx prefixes the module path. */
typedef slapo_status (*slapo_infer_fn)(slapo_node *node);

/* Backward rule: given the forward node (its inputs and its own value are
 * available as nodes) and `dy` (gradient of the loss w.r.t. the node's
 * value, same shape), builds nodes with `ctx` and stores in dx[i] the
 * gradient for input i, or NULL where input i is not differentiable or
 * `need[i]` is false. Broadcast inputs receive gradients already reduced to
 * their own shape. Returns ctx's status. */
typedef slapo_status (*slapo_backward_fn)(slapo_ctx *ctx, slapo_node *node, slapo_node *dy,
                                          const bool *need, slapo_node **dx);

/* Backward rule of an op whose value packs several results, each read
 * through `unpack` views (a fused region with a norm: compiler/): autograd
 * hands it every result's gradient at once, so one backward kernel can add
 * them where the unfused graph would (a residual-stream gradient inside a
 * norm's backward). dys[k] is the gradient of the views at offset offs[k]
 * (several views of one offset summed in their graph order), k < n, offsets
 * ascending; a result nothing differentiates is absent. Fills dx like
 * slapo_backward_fn. A packed value read other than through unpack views
 * cannot be differentiated (autograd says so). */
typedef slapo_status (*slapo_backward_packed_fn)(slapo_ctx *ctx, slapo_node *node, int n,
                                                 const int64_t *offs, slapo_node *const *dys,
                                                 const bool *need, slapo_node **dx);

/* Builds a small example use of the op for the table-driven tests: declares
 * placeholders with slapo_input (f32 ones are gradient-checked; integer ones
 * are filled in [0, test.int_high)), calls the op and returns its node. */
typedef slapo_node *(*slapo_example_fn)(slapo_ctx *ctx);

/* Test settings (STYLE.md "Ops"). */
typedef struct slapo_op_test {
  slapo_example_fn example; /* NULL: the op is exempt (say why in `exempt`)  */
  float lo, hi;             /* uniform range of f32 inputs (0,0 -> [-1, 1])  */
  int64_t int_high;         /* integer inputs drawn in [0, int_high)         */
  float fd_eps;             /* central-difference step (0 -> 1e-3)           */
  float atol, rtol;         /* gradcheck tolerance (0 -> 1e-2, 1e-2)         */
  float fast_atol;          /* fast vs reference kernel (0 -> 1e-5 relative) */
  const char *exempt;       /* why there is no gradcheck, or NULL            */
  const char *checked_by;   /* backward-only op: the composite it replaces   */
} slapo_op_test;

/* One op: everything about it in one place. */
typedef struct slapo_op {
  const char *name;         /* registry key, e.g. "matmul"                   */
  int n_inputs;             /* exact count, or -1 for variadic (>= 1)        */
  slapo_infer_fn infer;
  slapo_kernel_fn ref;      /* simple reference kernel (required unless view) */
  slapo_kernel_fn fast;     /* optimized kernel, or NULL                     */
  slapo_view_fn view;       /* non-NULL: output is a view of in[0]           */
  slapo_backward_fn backward; /* NULL: not differentiable (error if needed) */
  slapo_backward_packed_fn backward_packed; /* set: the value packs results */
                            /*   (backward unused), differentiated at once   */
  bool contiguous_inputs;   /* executor makes strided inputs contiguous     */
  bool inplace;             /* the kernel also runs with its output over    */
                            /*   input 0 (same dtype and shape; out == in[0] */
                            /*   storage): the planner gives it input 0's    */
                            /*   buffer when this node is its last reader    */
  bool random;              /* draws from Philox (dropout)                   */
  /* Tensor-parallel layout of the result from the inputs' (node->inputs[i]
   * ->layout) and the attributes, into node->layout; NULL: the built-in
   * table of ops/layout.c. May refuse (status + message). */
  slapo_status (*layout)(slapo_node *node);
  bool commutative;         /* two inputs that may be swapped (add, mul): the */
                            /*   pattern matcher tries both orders            */
  bool elementwise;         /* output element i from element i of each      */
                            /*   (broadcast) input: fusable by `cc`; a      */
                            /*   built-in one's math is in slapo/ops/math.h, */
                            /*   which the backends render (compiler/)      */
  /* Checks that need more than this rank's shapes, or NULL: called once
   * per plan by slapo_plan_new (never by slapo_plan_estimate), in graph
   * order, before any kernel runs; an error refuses the plan. It may
   * communicate (a collective's layout agreed across its group): every rank
   * of a group plans the same graphs in the same order. */
  slapo_status (*prepare)(const slapo_node *node);
  /* Floating-point operations of one call, from the node's shapes (a
   * multiply-add counts 2), or NULL for an op whose cost is its memory
   * traffic (elementwise, norms, shape ops): slapo_node_flops. */
  double (*flops)(const slapo_node *node);
  const char *doc;          /* one line: math and source                     */
  slapo_op_test test;
} slapo_op;

/* The built-in descriptors, one per line of slapo/ops.def. Code that builds
 * or recognizes a built-in op names it as SLAPO_OP_DESC(add) (a
 * `const slapo_op *`), so a misspelt op fails to compile and nodes compare
 * by descriptor identity (slapo_node_is_op); names are for schedule files,
 * text patterns and run-time ops (slapo_op_find). */
#define SLAPO_OP(name) extern const slapo_op slapo__op_##name;
#include "slapo/ops.def"
#undef SLAPO_OP
#define SLAPO_OP_DESC(name) (&slapo__op_##name)

/* What a node costs, from its shapes alone (the same on every rank): its
 * op's FLOPs (slapo_op.flops; 0 without), and the bytes it reads and
 * writes (each input and its result once). Not for placeholders, which
 * give 0. For balancing pipeline stages (slapo_pp_auto_cut). */
double slapo_node_flops(const slapo_node *node);
double slapo_node_bytes(const slapo_node *node);

/* Descriptor for `name`, or NULL: the built-in ops of slapo/ops.def, then
 * run-time ops from slapo_op_register. */
const slapo_op *slapo_op_find(const char *name);
/* Registers a run-time op (fused kernels, collectives). `op` is borrowed and
 * must outlive every graph using it. Errors: SLAPO_INVALID_ARG (name taken,
 * missing infer/kernel), SLAPO_NOMEM. Thread-safe. */
slapo_status slapo_op_register(const slapo_op *op);
/* Number of registered ops and the i-th one (built-ins first, in slapo/ops.def
 * order, then run-time ones in registration order). */
int slapo_op_count(void);
const slapo_op *slapo_op_at(int i);

/* One line naming the kernels that run, for benchmarks and logs: slapo's
 * vector level (slapo_isa_active; "(capped; host X)" when SLAPO_MAX_ISA
 * lowered it) and oneDNN's version and effective ISA (which honours
 * ONEDNN_MAX_CPU_ISA), e.g. "slapo kernels avx2 (capped; host avx512),
 * oneDNN 2.6.3 avx2". Written NUL-terminated into buf [cap], truncated to
 * fit. */
void slapo_kernels_describe(char *buf, size_t cap);

/* Whether GEMMs with bf16 operands run on bf16 hardware: slapo's level is
 * avx512_bf16 (slapo_isa_active), oneDNN's effective ISA is
 * avx512_core_bf16 or avx512_core_amx, and oneDNN has not picked a non-bf16
 * implementation for one (checked at each primitive's creation; the first
 * refusal holds for the process). When false, why (if non-NULL) gets the
 * reason in words, NUL-terminated into [cap], and bf16 GEMMs widen their
 * operands to f32 (slapo__gemm_fast): correct, never faster than f32. */
bool slapo_bf16_gemm_native(char *why, size_t cap);

/* ------------------------------------------------------------------------ */
/* Generic node builders                                                     */
/* ------------------------------------------------------------------------ */

/* Graph input `name` with the given dtype and shape. NULL on error. */
slapo_node *slapo_input(slapo_ctx *ctx, const char *name, slapo_dtype dt, int ndim,
                        const int64_t *shape);
/* Parameter read (target = parameter path). NULL on error. */
slapo_node *slapo_param(slapo_ctx *ctx, const char *path, slapo_dtype dt, int ndim,
                        const int64_t *shape);
/* Calls op `name` on inputs with attributes: looks the op up, checks the
 * input count, creates the node, stamps origin and op_seq, runs shape
 * inference. On any failure records a sticky error (naming the op, the
 * origin path and the input shapes) and returns NULL; returns NULL at once
 * when an input is NULL or the ctx already failed. */
slapo_node *slapo_op_call(slapo_ctx *ctx, const char *name, int n_inputs,
                          slapo_node *const *inputs, int n_attrs, const slapo_attr *attrs);
/* slapo_op_call with the descriptor instead of its name: what the library's
 * own builders, passes and the tracer use, so an op is named once, at
 * compile time, and nodes are compared by descriptor identity. `op` NULL
 * records SLAPO_INVALID_ARG. */
slapo_node *slapo_op_apply(slapo_ctx *ctx, const slapo_op *op, int n_inputs,
                           slapo_node *const *inputs, int n_attrs, const slapo_attr *attrs);
/* The RNG stream key ("stream" attribute) slapo_op_call gives the
 * `index`-th random op (0-based; other ops do not count) drawn in the
 * `call`-th call of module path `origin` ("" = root):
 * combine(combine(hash(origin), call), index) >> 1 (shifted so it fits a
 * non-negative int attribute). Assigned once, when the node is first built;
 * backward, recompute and graph edits copy the attribute. A fused op that
 * reproduces a random op of another module (FlashAttention's attention
 * dropout) computes the key that op would have had with this. Pure. */
uint64_t slapo_rng_stream(const char *origin, int call, int index);
/* Marks `n` values as the graph's results (the output node). A tuple among
 * them is refused (SLAPO_INVALID_ARG, as for every op input): pass its
 * items. */
slapo_node *slapo_output(slapo_ctx *ctx, int n, slapo_node *const *values);

/* Several values returned together, for a module forward that returns more
 * than one (attention's output and weights; a horizontal replacement's one
 * value per branch):
 *
 *   return slapo_tuple(ctx, 2, (slapo_node *[]){out, weights});
 *
 * and in the caller
 *
 *   slapo_node *t = slapo_call1(ctx, self, "attn", x);
 *   slapo_node *out = slapo_getitem(ctx, t, 0);
 *
 * slapo_tuple records a tuple node of values [n] (n >= 1; a 1-tuple stays
 * a tuple, as `(x,)` does in Python; tuples do not nest), stamped with the
 * module path it is returned from. slapo_getitem(ctx, t, i) is t's value i
 * itself: no node is added, so the graph below holds plain values only,
 * and a value no caller takes is dead code, removed before the step runs
 * with its gradient work (slapo_step), as a trace's DCE removes it from
 * the stored graph. Every op, slapo_output and slapo_call refuse a tuple
 * where one value is expected, naming it and the module that returned it.
 * Both return NULL on error, recorded on ctx: SLAPO_INVALID_ARG (a NULL
 * value, n < 1, a nested tuple; getitem of a value that is not a tuple, or
 * i outside [0, n)), SLAPO_NOMEM. */
slapo_node *slapo_tuple(slapo_ctx *ctx, int n, slapo_node *const *values);
slapo_node *slapo_getitem(slapo_ctx *ctx, slapo_node *t, int i);
/* The error a builder records for tuple `t` given as input `slot` of
 * `user` (an op name, "output", a module path): the sentence above, naming
 * t, its size and its module. Returns SLAPO_INVALID_ARG with the message
 * set (slapo_last_error). For the layers that build (module calls). */
slapo_status slapo__tuple_misuse(const slapo_node *t, const char *user, int slot);

/* ------------------------------------------------------------------------ */
/* Typed builders (all return NULL on error; see slapo_op_call)              */
/* Shapes use PyTorch order; x [.., C] means any leading dims.               */
/* ------------------------------------------------------------------------ */

/* Elementwise with NumPy broadcasting; f32. */
slapo_node *slapo_add(slapo_ctx *ctx, slapo_node *a, slapo_node *b);
slapo_node *slapo_sub(slapo_ctx *ctx, slapo_node *a, slapo_node *b);
slapo_node *slapo_mul(slapo_ctx *ctx, slapo_node *a, slapo_node *b);
slapo_node *slapo_div(slapo_ctx *ctx, slapo_node *a, slapo_node *b);
slapo_node *slapo_add_scalar(slapo_ctx *ctx, slapo_node *x, double v);
slapo_node *slapo_mul_scalar(slapo_ctx *ctx, slapo_node *x, double v);
slapo_node *slapo_pow(slapo_ctx *ctx, slapo_node *x, double exponent);
slapo_node *slapo_neg(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_exp(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_log(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_tanh(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_sqrt(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_rsqrt(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_relu(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_sigmoid(slapo_ctx *ctx, slapo_node *x);
slapo_node *slapo_silu(slapo_ctx *ctx, slapo_node *x);
/* GELU; tanh=true: the tanh approximation (GPT-2, Hendrycks & Gimpel 2016
 * eq. 2), else the exact erf form. */
slapo_node *slapo_gelu(slapo_ctx *ctx, slapo_node *x, bool tanh);

/* a [.., M, K] @ b [.., K, N] -> [.., M, N] with broadcast batch dims;
 * trans_a / trans_b read a as [.., K, M] / b as [.., N, K]. */
slapo_node *slapo_matmul(slapo_ctx *ctx, slapo_node *a, slapo_node *b, bool trans_a,
                         bool trans_b);
/* x [.., in] @ w[out, in]^T + b [out] -> [.., out]; b may be NULL
 * (PyTorch nn.functional.linear). */
slapo_node *slapo_linear(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b);
/* Both GEMM builders above follow slapo_ctx_autocast. Their operands are
 * two f32 or two bf16 tensors (bias f32); the result is f32. */

/* x f32 -> bf16, round to nearest even (ops/cast.c); gradient dy in f32. */
slapo_node *slapo_to_bf16(slapo_ctx *ctx, slapo_node *x);
/* 2-D convolution (PyTorch nn.functional.conv2d; cross-correlation):
 * x [N, C, H, W], w [O, C/groups, KH, KW] (both f32 or both bf16, f32
 * cast under autocast as the GEMM builders'), b [O] f32 or NULL -> f32
 * [N, O, OH, OW] with OH = floor((H + 2 padding[0] - dilation[0] (KH - 1)
 * - 1) / stride[0]) + 1 (likewise OW). stride, padding, dilation are
 * [h, w] pairs (copied; NULL: 1, 0, 1); dilation 1 is dense. Errors
 * (recorded on ctx): SLAPO_SHAPE (C or O not divisible by groups, w's
 * channels not C/groups, b not [O], dilated kernel larger than the padded
 * input), SLAPO_INVALID_ARG (stride or dilation < 1, padding < 0,
 * groups < 1), SLAPO_DTYPE. */
slapo_node *slapo_conv2d(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b,
                         const int64_t stride[2], const int64_t padding[2],
                         const int64_t dilation[2], int64_t groups);

/* Reductions over `n_axes` axes (negative count from the end). */
slapo_node *slapo_sum(slapo_ctx *ctx, slapo_node *x, int n_axes, const int64_t *axes,
                      bool keepdim);
slapo_node *slapo_mean(slapo_ctx *ctx, slapo_node *x, int n_axes, const int64_t *axes,
                       bool keepdim);
/* Sums x down to `shape` (the inverse of broadcasting). */
slapo_node *slapo_sum_to(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *shape);
/* Broadcasts x to `shape` (materialized). */
slapo_node *slapo_broadcast_to(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *shape);

/* Shape ops. reshape: one dim may be -1; a view when x is contiguous. */
slapo_node *slapo_reshape(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *shape);
slapo_node *slapo_permute(slapo_ctx *ctx, slapo_node *x, int ndim, const int64_t *perm);
slapo_node *slapo_transpose(slapo_ctx *ctx, slapo_node *x, int dim0, int dim1);
slapo_node *slapo_slice(slapo_ctx *ctx, slapo_node *x, int dim, int64_t start, int64_t end);
/* Splits x along `dim` into pieces of `sizes` (sum = x.shape[dim]); writes
 * n node pointers to out. Returns ctx's status. */
slapo_status slapo_split(slapo_ctx *ctx, slapo_node *x, int dim, int n, const int64_t *sizes,
                         slapo_node **out);
slapo_node *slapo_concat(slapo_ctx *ctx, int n, slapo_node *const *xs, int dim);
slapo_node *slapo_contiguous(slapo_ctx *ctx, slapo_node *x);
/* Grouped-query heads made explicit: x [B, NKV, T, HS] -> [B, NKV * g, T,
 * HS], each kv head repeated g times in place (Hugging Face's repeat_kv:
 * head h of the result is head h / g of x). Materialized (a broadcast); the
 * flash_attention op reads grouped heads without it. g == 1 returns x.
 * NULL on error (x not 4-d, g < 1), recorded on ctx. */
slapo_node *slapo_repeat_heads(slapo_ctx *ctx, slapo_node *x, int64_t g);
/* Constant tensors (no inputs). */
slapo_node *slapo_full(slapo_ctx *ctx, int ndim, const int64_t *shape, double value);

/* softmax over the last axis, numerically stable (max subtracted). causal:
 * for x [.., T, S] entry (t, s) with s > t + (S - T) is masked to 0; a fully
 * masked row gives zeros, not NaN. */
slapo_node *slapo_softmax(slapo_ctx *ctx, slapo_node *x, bool causal);
/* LayerNorm over the last axis (Ba, Kiros, Hinton 2016): biased variance,
 * eps inside the sqrt; w, b [C] may be NULL (no affine). */
slapo_node *slapo_layer_norm(slapo_ctx *ctx, slapo_node *x, slapo_node *w, slapo_node *b,
                             double eps);
/* RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w; w may be NULL. */
slapo_node *slapo_rms_norm(slapo_ctx *ctx, slapo_node *x, slapo_node *w, double eps);
/* Rotary position embedding (Su et al. 2021; Hugging Face LLaMA's
 * rotate-half layout) of x [B, NH, T, HS] (HS even) at positions offset ..
 * offset + T - 1 with base theta (LLaMA: 10000); see ops/rotary.c. */
slapo_node *slapo_rotary(slapo_ctx *ctx, slapo_node *x, double theta, int64_t offset);
/* weight [V, C], idx [..] i32/i64 -> [.., C]. */
slapo_node *slapo_embedding(slapo_ctx *ctx, slapo_node *weight, slapo_node *idx);
/* out = base with src rows added at rows idx along dim 0:
 * base [V, C], idx [N] int, src [N, C]. */
slapo_node *slapo_index_add(slapo_ctx *ctx, slapo_node *base, slapo_node *idx,
                            slapo_node *src);
/* Inverted dropout with probability p: each element's keep decision comes
 * from Philox keyed by (seed, slapo_rng_stream of the module call) at counter
 * (step, element index); identity when not training or p == 0. */
slapo_node *slapo_dropout(slapo_ctx *ctx, slapo_node *x, double p);
/* The target value that cross-entropy skips, PyTorch's default: padding and
 * unmasked positions (masked LM) carry it, and trainers weight micro-batches
 * by the targets that are not it. */
#define SLAPO_IGNORE_INDEX (-100)

/* Mean cross-entropy of logits [.., V] against int targets [..]; targets
 * equal to ignore_index are skipped (mean over the rest; 0 if none). Stable
 * for large logits (log-sum-exp with max subtracted). Returns a scalar []. */
slapo_node *slapo_cross_entropy(slapo_ctx *ctx, slapo_node *logits, slapo_node *targets,
                                int64_t ignore_index);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_OPS_H */
