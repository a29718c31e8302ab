/* slapo/dist.h - distributed training over MPI (DESIGN.md §8): the process
 * groups (world, tensor parallel, data parallel), collectives as graph ops
 * with gradient rules, and the few host-side collectives the trainer needs
 * (data-parallel gradient all-reduce, gathered checkpoints).
 *
 * One process needs no mpirun: slapo_dist_init starts MPI only when the
 * environment says a launcher started this process (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK or a PMI_SIZE); otherwise every
 * group has one rank, collectives are copies, and MPI is never touched.
 * Layer: dist (depends on exec). */
#ifndef SLAPO_DIST_H
#define SLAPO_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "slapo/exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Process groups, by id (the `group` attribute of collective nodes). */
typedef enum slapo_group {
  SLAPO_GROUP_WORLD = 0, /* every rank                                      */
  SLAPO_GROUP_TP = 1,    /* the ranks sharing one model replica (--tp K)    */
  SLAPO_GROUP_DP = 2,    /* the ranks holding the same shard of the replicas */
  SLAPO_GROUP_PP = 3,    /* the stages of one pipeline (--pp K), in order    */
  /* The first and the last stage of a pipeline, which hold the tied
   * embedding (Megatron-LM's embedding group): size 2 there when K > 1, 1
   * when K = 1, and 0 on a middle stage, which is not in it (rank -1). */
  SLAPO_GROUP_EMBED = 4,
  SLAPO_GROUP_COUNT
} slapo_group;

/* Starts the distributed runtime and forms groups: N = world size, tp
 * divides N (tp 0: tp = N, one tensor-parallel group); ranks r = d * tp + t form TP group d (t = rank in it) and DP
 * group t (d = rank in it), so TP neighbours are adjacent ranks (on one node
 * under mpirun's default by-core mapping). Idempotent with the same tp;
 * after slapo_dist_finalize it may be called again only without MPI.
 * Errors: SLAPO_INVALID_ARG (tp does not divide the world size:
 * names both), SLAPO_STATE (already initialized with another tp; MPI
 * failed to start or lacks MPI_THREAD_FUNNELED), NOMEM. tp < 0 is
 * SLAPO_INVALID_ARG, and so is a $SLAPO_COMM_TIMEOUT that is not seconds.
 * Before MPI_Init it sets Open MPI's algorithm choices slapo measured
 * faster (OMPI_MCA_* variables, docs/PERFORMANCE.md), each only where the
 * environment has no value for it: a user's own setting is kept. With
 * data parallelism on one node it maps a 32 MiB shared-memory window a
 * rank for the gradient all-reduce (slapo_dist_all_reduce_tensors). */
slapo_status slapo_dist_init(int tp);
/* slapo_dist_init with pipeline parallelism: N = pp x dp x tp, ranks
 * r = s * (dp * tp) + d * tp + t hold stage s (the pipeline group of (d,
 * t), where s is the rank), so a pipeline's stages are the furthest apart
 * (across nodes, as Megatron-LM orders them) and tensor-parallel
 * neighbours stay adjacent. pp 0: 1, or the pp already formed (so
 * slapo_dist_init(tp) after slapo_dist_init_pp(tp, pp) is a no-op).
 * Errors: those of slapo_dist_init, SLAPO_INVALID_ARG (pp < 0, tp x pp
 * not dividing the world size: names them; pp > 1 without a launcher),
 * SLAPO_STATE (formed already with another pp). */
slapo_status slapo_dist_init_pp(int tp, int pp);
/* Ends MPI if slapo_dist_init started it (MPI_Finalize, skipped after a
 * collective timed out); groups are back to one rank. Safe to call when
 * not initialized. */
void slapo_dist_finalize(void);
/* True when MPI runs (launched by mpirun). */
bool slapo_dist_active(void);
/* Size of / this process's rank in group g (1 / 0 before init). */
int slapo_dist_size(slapo_group g);
int slapo_dist_rank(slapo_group g);
/* One line describing the layout, e.g. "world 4 = tp 2 x dp 2; rank 3: tp
 * rank 1, dp rank 1", into buf [cap]. */
void slapo_dist_describe(char *buf, size_t cap);

/* Ends every rank of the job at once (MPI_Abort with `code`; exit(code)
 * without MPI). For the CLI after a rank failed: the other ranks may be
 * waiting in a collective and would otherwise hang. Never returns. */
_Noreturn void slapo_dist_abort(int code);

/* The communication timeout, seconds: a collective (host-side or a graph
 * kernel) still pending after this long fails with SLAPO_COMM "no progress
 * in <call> (<group> group) for N s (peer ranks ...)", so a lost link or a
 * stopped peer ends the job instead of hanging it (PyTorch's and NCCL's
 * collective timeout). Default SLAPO_DIST_TIMEOUT_DEFAULT_S, or
 * $SLAPO_COMM_TIMEOUT (read by slapo_dist_init; a value that is not
 * seconds > 0 makes it fail with SLAPO_INVALID_ARG); a call here wins over
 * both. It bounds the wait for the slowest rank too, so it must exceed the
 * longest time one rank computes between two collectives (a step, a
 * validation pass, a save). After a timeout the runtime is unusable: every
 * later collective fails at once with that message, slapo_dist_finalize
 * skips MPI_Finalize (it would wait for the lost peer), and the caller
 * should end the job with slapo_dist_abort. Errors: SLAPO_INVALID_ARG
 * (seconds not > 0 or not finite). */
#define SLAPO_DIST_TIMEOUT_DEFAULT_S 300.0
slapo_status slapo_dist_set_timeout(double seconds);
/* The timeout in force, seconds. */
double slapo_dist_timeout(void);

/* ------------------------------------------------------------------------ */
/* Host-side collectives (outside graphs; all ranks of g must call them in   */
/* the same order with the same sizes).                                      */
/* ------------------------------------------------------------------------ */

/* buf [n] f32 <- sum over the ranks of g, in place. Errors: SLAPO_STATE
 * (MPI failed; message names the call), SLAPO_COMM (timed out, see
 * slapo_dist_set_timeout; so for every collective below). */
slapo_status slapo_dist_all_reduce_f32(slapo_group g, float *buf, int64_t n);
/* buf [n] f64 <- sum over the ranks of g, in place (token counts, norms). */
slapo_status slapo_dist_all_reduce_f64(slapo_group g, double *buf, int64_t n);
/* Sums each of the n f32 contiguous tensors ts over the ranks of g, in
 * place. When g is the data-parallel group and all its ranks share one
 * node, through a shared-memory window formed by slapo_dist_init (two
 * 16 MiB buckets a rank: each rank sums its slice of a bucket over every
 * rank's copy in place; every rank gets the same bits); otherwise packed
 * into buckets of about 32 MiB (in order: PyTorch DDP's scheme, 25 MiB
 * there) so many small gradients take a few large all-reduces, a tensor
 * larger than a bucket going alone. *seconds (may be NULL) receives the
 * wall time. Errors: NOMEM, those of MPI, SLAPO_COMM (timeout). */
slapo_status slapo_dist_all_reduce_tensors(slapo_group g, int n, slapo_tensor *const *ts,
                                           double *seconds);
/* buf [n] f64 <- the maximum over the ranks of g, in place. */
slapo_status slapo_dist_max_f64(slapo_group g, double *buf, int64_t n);
/* *full (owned, f32, the unsharded shape without padding) <- every rank's piece `local` (f32,
 * the local shape) of a tensor split as s across g, placed by layout: the
 * gathered gradient or weight of a sharded parameter. Errors: SLAPO_SHAPE
 * (local is not the local shape), NOMEM, those of MPI. */
slapo_status slapo_dist_gather_shards(slapo_group g, const slapo_shard *s,
                                      const slapo_tensor *local, slapo_tensor **full);
/* Point-to-point between the stages of a pipeline (SLAPO_GROUP_PP ranks):
 * posts a nonblocking send of each of send [n_send] to rank `to` and a
 * receive of each of recv [n_recv] from rank `from` (-1: none), then
 * completes them all, under the communication timeout. Both directions
 * are posted before either is waited for: two neighbours that each send
 * first (1F1B's steady state) cannot deadlock, whatever Open MPI's eager
 * limit. Message k of a call carries tag tag + k; a receiver's tensors
 * must have the sender's byte counts. Tensors contiguous, at most 2 GiB
 * each. One rank (no MPI): nothing to do. Errors: SLAPO_INVALID_ARG (a
 * rank out of range, a strided or too large tensor), SLAPO_STATE (MPI
 * failed; a size mismatch is MPI_ERR_TRUNCATE), SLAPO_COMM (timeout). */
slapo_status slapo_dist_pp_exchange(int to, int n_send, const slapo_tensor *const *send,
                                    int from, int n_recv, slapo_tensor *const *recv, int tag);
/* out [size(g) * n] <- every rank's in [n] in rank order. */
slapo_status slapo_dist_all_gather_f32(slapo_group g, const float *in, float *out, int64_t n);
/* in [n] of root -> buf [n] of every rank (in place). */
slapo_status slapo_dist_broadcast(slapo_group g, void *buf, int64_t nbytes, int root);
/* Waits until every rank of g got here. */
slapo_status slapo_dist_barrier(slapo_group g);
/* out [size(g) * nbytes] <- every rank's record in [nbytes] in rank order
 * (fixed-size byte records: layouts, argument digests). Every rank must
 * pass the same nbytes (at most 2^30). Errors: SLAPO_LIMIT, those of MPI,
 * SLAPO_COMM (timeout). */
slapo_status slapo_dist_all_gather_bytes(slapo_group g, const void *in, void *out,
                                         int64_t nbytes);

/* ------------------------------------------------------------------------ */
/* Ranks agreeing on their arguments (src/dist/agree.c)                      */
/* ------------------------------------------------------------------------ */

/* Starts MPI under a launcher (as slapo_dist_init does) without forming the
 * tensor- and data-parallel groups: the world can then check that its
 * ranks were given the same arguments (slapo_dist_agree) before
 * slapo_dist_init(tp) splits it by them. Without a launcher it does
 * nothing. Idempotent. Reads $SLAPO_COMM_TIMEOUT and sets Open MPI's
 * algorithm choices as slapo_dist_init does. Errors: SLAPO_STATE (MPI
 * failed to start or lacks MPI_THREAD_FUNNELED), SLAPO_INVALID_ARG (a
 * $SLAPO_COMM_TIMEOUT that is not seconds > 0). */
slapo_status slapo_dist_start(void);

/* One value every rank must be given alike: `name` as the user wrote it
 * ("--seq"), a 64-bit digest of the whole value (XXH3; for a file, of its
 * content), and a short printable form for messages. Both strings are cut
 * to SLAPO_DIST_FIELD_NAME / SLAPO_DIST_FIELD_SHOWN - 1 bytes. */
typedef struct slapo_dist_field {
  const char *name;
  uint64_t digest;
  const char *shown;
} slapo_dist_field;
enum { SLAPO_DIST_AGREE_MAX = 64, SLAPO_DIST_FIELD_NAME = 24, SLAPO_DIST_FIELD_SHOWN = 104 };

/* Checks that every rank of the world passed the same fields (names and
 * digests, in order): each rank's fields go into one record of a fixed
 * size (SLAPO_DIST_AGREE_MAX entries, whatever n is), all-gathered over the
 * world, so the check's own collective cannot be mismatched by the
 * arguments it checks; every rank then reaches the same verdict. Run it
 * before any collective whose size depends on the arguments. One process:
 * SLAPO_OK at once. Errors: SLAPO_INVALID_ARG (a field differs: names it,
 * rank 0's value and the first differing rank's, "--seq: rank 0 has 32,
 * rank 1 has 64"; returned on every rank alike, so no rank is left
 * waiting), SLAPO_LIMIT (n > SLAPO_DIST_AGREE_MAX), SLAPO_NOMEM, those of
 * MPI (SLAPO_STATE). */
slapo_status slapo_dist_agree(const slapo_dist_field *fields, int n);

/* ------------------------------------------------------------------------ */
/* Collectives as graph ops (src/dist/collectives.c)                         */
/* ------------------------------------------------------------------------ */

/* Each reads its group from the `group` int attribute. Gradient rules
 * (Megatron-LM's f and g, Shoeybi et al. 2019):
 *   all_reduce      y = sum_r x_r                 dx = dy (the sum is replicated)
 *   reduce_grad     y = x                         dx = sum_r dy_r
 *   all_gather      y = [x_0; ..; x_{n-1}] dim 0  dx = own block of sum_r dy_r
 *                                                  (attr reduce=0: own block of dy)
 *   reduce_scatter  y = own block of sum_r x_r    dx = all_gather(dy)
 *   scatter         y = own block of x, dim 0     dx = all_gather(dy)
 * all_gather/reduce_scatter/scatter work on dim 0 (contiguous blocks); the
 * builders below move another axis there and back with permutes. */
extern const slapo_op slapo_dist_op_all_reduce;
extern const slapo_op slapo_dist_op_reduce_grad;
extern const slapo_op slapo_dist_op_all_gather;
extern const slapo_op slapo_dist_op_reduce_scatter;
extern const slapo_op slapo_dist_op_scatter;
/* Vocab-parallel cross-entropy (src/dist/vocab_parallel.c), see below. */
extern const slapo_op slapo_dist_op_vocab_parallel_cross_entropy;
extern const slapo_op slapo_dist_op_vocab_parallel_cross_entropy_backward;

/* SLAPO_OK, or SLAPO_STATE naming the first MPI call of a collective
 * kernel that failed since the last call (SLAPO_COMM: it timed out, see
 * slapo_dist_set_timeout) (kernels cannot return errors;
 * the trainer checks this after each step), which it then clears. */
slapo_status slapo_dist_kernel_status(void);

/* Registers the collective ops by name (for text patterns and .sched
 * files); slapo_dist_init calls it. Idempotent. Errors: NOMEM. */
slapo_status slapo_dist_register_ops(void);

/* Builders (NULL on error, recorded on ctx). `axis` may be negative (from
 * the end). Errors: SLAPO_SHAPE (the axis' size is not divisible by the
 * group's size for reduce_scatter / scatter: names both). */
slapo_node *slapo_dist_all_reduce(slapo_ctx *ctx, slapo_node *x, slapo_group g);
slapo_node *slapo_dist_reduce_grad(slapo_ctx *ctx, slapo_node *x, slapo_group g);
/* reduce_grad: true gives the backward a reduce-scatter (the consumers of y
 * are tensor-parallel, each rank holding part of dy); false takes the own
 * block of dy (the consumers are replicated). */
slapo_node *slapo_dist_all_gather(slapo_ctx *ctx, slapo_node *x, int axis, bool reduce_grad,
                                  slapo_group g);
slapo_node *slapo_dist_reduce_scatter(slapo_ctx *ctx, slapo_node *x, int axis, slapo_group g);
slapo_node *slapo_dist_scatter(slapo_ctx *ctx, slapo_node *x, int axis, slapo_group g);

/* Mean cross-entropy over targets != ignore_index of logits whose last
 * axis is split across group g (Megatron-LM's vocab-parallel loss):
 * logits [.., Vl] f32 hold classes [vocab_start, vocab_start + Vl) of the
 * full vocabulary; targets [..] i32/i64 are global ids. The loss uses the
 * global row max and sum of exponentials (two all-reduces of one value per
 * row) and the target logit from the rank that owns it (a third), so every
 * rank gets the unsharded loss; classes >= `vocab_valid` (padding of the
 * vocabulary) are left out. Backward: (softmax - onehot) * dy / count on
 * each rank's own classes, no communication. Returns a scalar [] node.
 * Errors: SLAPO_SHAPE (targets' shape is not logits' without the last
 * axis), SLAPO_DTYPE. */
slapo_node *slapo_dist_vocab_parallel_cross_entropy(slapo_ctx *ctx, slapo_node *logits,
                                                    slapo_node *targets, int64_t vocab_start,
                                                    int64_t vocab_valid, int64_t ignore_index,
                                                    slapo_group g);

/* ---- pipeline schedules (dist/pp_schedule.c; issue 38) ----
 * A pipeline of p stages trains m micro-batches per step. Every rank
 * computes the action list of every stage up front, as data (the same on
 * every rank), and executes its own. Activations go forward (stage s to
 * s + 1), their gradients backward. Two schedules:
 *   1F1B (Narayanan et al., "PipeDream", 2019; Megatron-LM's non-interleaved
 *        schedule): stage s runs min(p - s - 1, m) warm-up forwards, then
 *        alternates one forward and one backward, then drains the
 *        backwards; at most p - s micro-batches' activations are stashed
 *        on stage s at once.
 *   GPipe (Huang et al. 2019): every forward, then every backward; m
 *        stashed. For comparison.
 * Backwards run in micro-batch order 0 .. m-1 on every stage, so gradients
 * accumulate in the order one process's gradient accumulation sums them.
 * In 1F1B's steady state a stage sends an activation to s + 1 while s + 1
 * sends it a gradient: those pairs are one exchange action on both sides
 * (both transfers posted at once, then both completed; with blocking sends
 * in either order they would deadlock), so the lists are deadlock-free
 * even when every transfer blocks until its peer's matching one (tested by
 * a simulation for p in 1..8, m in 1..16). */
typedef enum slapo_pp_kind {
  SLAPO_PP_FWD,                /* forward of micro-batch mb               */
  SLAPO_PP_BWD,                /* backward of micro-batch mb              */
  SLAPO_PP_SEND_ACT,           /* mb's activations to stage + 1           */
  SLAPO_PP_RECV_ACT,           /* mb's activations from stage - 1         */
  SLAPO_PP_SEND_GRAD,          /* mb's input gradient to stage - 1        */
  SLAPO_PP_RECV_GRAD,          /* mb's output gradient from stage + 1     */
  SLAPO_PP_SEND_ACT_RECV_GRAD, /* exchange with stage + 1: send mb's
                                  activations, receive mb2's gradient     */
  SLAPO_PP_SEND_GRAD_RECV_ACT  /* exchange with stage - 1: send mb's
                                  gradient, receive mb2's activations     */
} slapo_pp_kind;

typedef struct slapo_pp_action {
  slapo_pp_kind kind;
  int mb;  /* the micro-batch run or sent                          */
  int mb2; /* an exchange's received micro-batch; -1 otherwise     */
} slapo_pp_action;

typedef enum slapo_pp_schedule { SLAPO_PP_1F1B, SLAPO_PP_GPIPE } slapo_pp_schedule;

/* The most actions one stage's list holds for m micro-batches: 6 m. */
int slapo_pp_max_actions(int m);
/* The micro-batches stage `stage` of p keeps in flight over m under
 * `sched` (the slots slapo_pp_stage_new needs): 1F1B's min(p - stage, m),
 * GPipe's m; at least 1. */
int slapo_pp_slots(slapo_pp_schedule sched, int p, int stage, int m);

/* Stage `stage`'s actions under `sched` for p stages and m micro-batches,
 * in order, into out [cap] (caller-owned); *n their count. Errors:
 * SLAPO_INVALID_ARG naming the value (p < 1, m < 1, stage outside
 * 0 .. p-1, cap below slapo_pp_max_actions(m)). */
slapo_status slapo_pp_actions(slapo_pp_schedule sched, int p, int m, int stage,
                              slapo_pp_action *out, int cap, int *n);
/* A schedule's name as the literature writes it ("1F1B", "GPipe"), static;
 * "?" for a value outside the enum. */
const char *slapo_pp_schedule_name(slapo_pp_schedule sched);
/* A kind's name ("forward", "send_act_recv_grad", ...), static; "?" for a
 * value outside the enum. */
const char *slapo_pp_kind_name(slapo_pp_kind kind);

/* Balanced stages for `--pp k` without cut lines: n modules of cost
 * cost[0 .. n) (in call order; e.g. FLOPs and bytes from the planner, the
 * same on every rank) split into k contiguous non-empty stages minimizing
 * the largest stage's total (the linear partition problem, solved exactly
 * by dynamic programming over prefix sums in double, O(k n^2)). Where
 * splits tie, the last stage starts as early as possible, then the one
 * before it, and so on: the same costs give the same cuts on every rank.
 * cut[j], j < k - 1: the index of stage j's last module; *max_cost (may be
 * NULL): the largest stage's total. Errors: SLAPO_INVALID_ARG naming the
 * value (k < 1; more stages than modules; a cost negative or not finite). */
slapo_status slapo_pp_balance(const double *cost, int n, int k, int *cut, double *max_cost);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_DIST_H */
