/* train/pipeline.c - one optimizer step's micro-batches through this
 * rank's pipeline stage (slapo_pp_train_accumulate): the stage's action
 * list (slapo_pp_actions, the same on every rank) executed in order, with
 * the activations and their gradients moved between neighbouring stages
 * by slapo_dist_pp_exchange (the parameters across stages: pp_params.c).
 * Micro-batches are weighted by valid tokens as in slapo_train_accumulate
 * (accumulate.c), and the backwards run in micro-batch order, so the
 * gradients are bitwise those one process accumulates. Layer: train. */
#include <string.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "train/internal.h"

/* Between two neighbours activations only go up and gradients only come
 * down, so (source, tag 0) and MPI's in-order delivery identify every
 * message. */
enum { TAG = 0 };

typedef struct engine {
  slapo_pp_stage *st;
  int stage, p, k;          /* k slots */
  int *slot_mb;             /* [k]: the micro-batch a slot holds, -1 */
  int last_fwd, last_bwd;   /* the micro-batch whose outputs are readable */
  const slapo_tensor **vals; /* scratch: values to send / buffers */
  slapo_tensor **bufs;
} engine;

static int slot_of(const engine *e, int mb) { return mb % e->k; }

/* Claims mb's slot for its activations; it must be free (the schedule's
 * stash bound, which the slot count covers). */
static slapo_status claim(engine *e, int mb) {
  int s = slot_of(e, mb);
  if (e->slot_mb[s] == mb) return SLAPO_OK;
  if (e->slot_mb[s] >= 0)
    return slapo_error(SLAPO_STATE, "pipeline: stage %d: micro-batch %d's slot %d still holds "
                       "micro-batch %d (%d slots)", e->stage, mb, s, e->slot_mb[s], e->k);
  e->slot_mb[s] = mb;
  return SLAPO_OK;
}

/* The values mb's forward left to send (it must be the last forward). */
static slapo_status sent(engine *e, int mb, int *n) {
  if (e->last_fwd != mb)
    return slapo_error(SLAPO_STATE, "pipeline: stage %d sends micro-batch %d's activations "
                       "after another step ran", e->stage, mb);
  *n = slapo_pp_stage_n_send(e->st);
  for (int i = 0; i < *n; i++) e->vals[i] = slapo_pp_stage_sent(e->st, i);
  return SLAPO_OK;
}

/* The gradients mb's backward left for the previous stage (float values). */
static slapo_status back_grads(engine *e, int mb, int *n) {
  if (e->last_bwd != mb)
    return slapo_error(SLAPO_STATE, "pipeline: stage %d sends micro-batch %d's gradients after "
                       "another step ran", e->stage, mb);
  *n = 0;
  for (int i = 0; i < slapo_pp_stage_n_recv(e->st); i++) {
    const slapo_tensor *g = slapo_pp_stage_recv_grad(e->st, i);
    if (g) e->vals[(*n)++] = g;
  }
  return SLAPO_OK;
}

/* Where mb's activations (act) or output gradients land, in its slot:
 * bufs [*n]. */
static slapo_status landing(engine *e, int mb, bool act, int *n) {
  int s = slot_of(e, mb);
  *n = 0;
  if (act) {
    SLAPO_TRY(claim(e, mb));
    for (int i = 0; i < slapo_pp_stage_n_recv(e->st); i++)
      e->bufs[(*n)++] = slapo_pp_stage_recv_buf(e->st, s, i);
  } else {
    if (e->slot_mb[s] != mb)
      return slapo_error(SLAPO_STATE, "pipeline: stage %d receives micro-batch %d's gradients "
                         "before its forward", e->stage, mb);
    for (int i = 0; i < slapo_pp_stage_n_send(e->st); i++) {
      slapo_tensor *g = slapo_pp_stage_grad_buf(e->st, s, i);
      if (g) e->bufs[(*n)++] = g;
    }
  }
  return SLAPO_OK;
}

/* A transfer action is what it sends plus what it receives; an exchange
 * does both with one neighbour in one call (mb sent, mb2 received). */
static slapo_status transfer(engine *e, const slapo_pp_action *a) {
  slapo_pp_kind k = a->kind;
  int ns = 0, nr = 0, to = -1, from = -1, rmb = a->mb2 >= 0 ? a->mb2 : a->mb;
  if (k == SLAPO_PP_SEND_ACT || k == SLAPO_PP_SEND_ACT_RECV_GRAD) {
    to = e->stage + 1;
    SLAPO_TRY(sent(e, a->mb, &ns));
  } else if (k == SLAPO_PP_SEND_GRAD || k == SLAPO_PP_SEND_GRAD_RECV_ACT) {
    to = e->stage - 1;
    SLAPO_TRY(back_grads(e, a->mb, &ns));
  }
  if (k == SLAPO_PP_RECV_ACT || k == SLAPO_PP_SEND_GRAD_RECV_ACT) {
    from = e->stage - 1;
    SLAPO_TRY(landing(e, rmb, true, &nr));
  } else if (k == SLAPO_PP_RECV_GRAD || k == SLAPO_PP_SEND_ACT_RECV_GRAD) {
    from = e->stage + 1;
    SLAPO_TRY(landing(e, rmb, false, &nr));
  }
  SLAPO_ASSERT(to >= 0 || from >= 0); /* run_actions passes transfers only */
  return slapo_dist_pp_exchange(to, ns, e->vals, from, nr, e->bufs, TAG);
}

static slapo_status run_actions(engine *e, const slapo_pp_action *acts, int n_acts, int n_micro,
                                const slapo_tensor *const *inputs, const slapo_kernel_env *envs,
                                const double *w, double *sum) {
  for (int i = 0; i < n_acts; i++) {
    const slapo_pp_action *a = &acts[i];
    const slapo_tensor *const *in = inputs + 2 * a->mb;
    SLAPO_ASSERT(a->mb >= 0 && a->mb < n_micro);
    if (a->kind == SLAPO_PP_FWD) {
      if (e->stage == 0) SLAPO_TRY(claim(e, a->mb));
      else if (e->slot_mb[slot_of(e, a->mb)] != a->mb)
        return slapo_error(SLAPO_STATE, "pipeline: stage %d runs micro-batch %d's forward "
                           "before receiving it", e->stage, a->mb);
      SLAPO_TRY(slapo_pp_stage_forward(e->st, slot_of(e, a->mb), 2, in, &envs[a->mb]));
      e->last_fwd = a->mb, e->last_bwd = -1;
      const slapo_tensor *l = slapo_pp_stage_loss(e->st);
      if (l) *sum += w[a->mb] * (double)*(const float *)slapo_tensor_data(l);
    } else if (a->kind == SLAPO_PP_BWD) {
      unsigned grads = a->mb == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD;
      SLAPO_TRY(slapo_pp_stage_backward(e->st, slot_of(e, a->mb), 2, in, &envs[a->mb],
                                        (float)w[a->mb], grads));
      e->slot_mb[slot_of(e, a->mb)] = -1;
      e->last_bwd = a->mb, e->last_fwd = -1;
    } else {
      SLAPO_TRY(transfer(e, a));
    }
  }
  return SLAPO_OK;
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* This rank must run st: the pipeline group is the stage count, and the
 * rank's place in it the stage's index. */
static slapo_status check_group(const slapo_pp_stage *st, const char *what) {
  int p = slapo_pp_stage_n_stages(st), s = slapo_pp_stage_index(st);
  int group = slapo_dist_size(SLAPO_GROUP_PP), rank = slapo_dist_rank(SLAPO_GROUP_PP);
  if (group == p && rank == s) return SLAPO_OK;
  return slapo_error(SLAPO_INVALID_ARG, "%s: this rank is stage %d of a pipeline of %d ranks but "
                     "holds stage %d of %d (the schedule's cut lines make %d stages; run with "
                     "--pp %d)", what, rank, group, s, p, p, p);
}

slapo_status slapo_pp_train_accumulate(slapo_pp_stage *st, slapo_pp_schedule sched, int n_micro,
                                       const slapo_tensor *const *inputs,
                                       const slapo_kernel_env *envs, double *loss,
                                       int64_t *n_valid) {
  *loss = 0;
  if (n_valid) *n_valid = 0;
  SLAPO_NEED(st, "pp_train_accumulate");
  engine e = {.st = st, .stage = slapo_pp_stage_index(st), .p = slapo_pp_stage_n_stages(st),
              .k = slapo_pp_stage_n_slots(st), .last_fwd = -1, .last_bwd = -1};
  SLAPO_TRY(check_group(st, "pp_train_accumulate"));
  if (n_micro < 1)
    return slapo_error(SLAPO_INVALID_ARG, "pp_train_accumulate: %d micro-batches", n_micro);
  int need = slapo_pp_slots(sched, e.p, e.stage, n_micro);
  if (e.k < need)
    return slapo_error(SLAPO_INVALID_ARG, "pp_train_accumulate: stage %d was built with %d slots; "
                       "%s over %d micro-batches keeps up to %d in flight", e.stage, e.k,
                       slapo_pp_schedule_name(sched), n_micro, need);
  int cap = slapo_pp_max_actions(n_micro), n_acts = 0;
  int width = max_int(slapo_pp_stage_n_send(st), slapo_pp_stage_n_recv(st)) + 1;
  slapo_pp_action *acts = slapo_calloc((size_t)cap, sizeof *acts);
  double *w = slapo_calloc((size_t)n_micro, sizeof *w);
  e.slot_mb = slapo_calloc((size_t)e.k, sizeof *e.slot_mb);
  e.vals = slapo_calloc((size_t)width, sizeof *e.vals);
  e.bufs = slapo_calloc((size_t)width, sizeof *e.bufs);
  slapo_status s = SLAPO_OK;
  if (!acts || !w || !e.slot_mb || !e.vals || !e.bufs)
    s = slapo_error(SLAPO_NOMEM, "pp_train_accumulate: out of memory");
  for (int i = 0; s == SLAPO_OK && i < e.k; i++) e.slot_mb[i] = -1;
  if (s == SLAPO_OK) s = slapo__micro_weights(n_micro, inputs, w, n_valid);
  if (s == SLAPO_OK) s = slapo_pp_actions(sched, e.p, n_micro, e.stage, acts, cap, &n_acts);
  double sum = 0;
  if (s == SLAPO_OK) s = run_actions(&e, acts, n_acts, n_micro, inputs, envs, w, &sum);
  slapo_free(acts);
  slapo_free(w);
  slapo_free(e.slot_mb);
  slapo_free(e.vals);
  slapo_free(e.bufs);
  SLAPO_TRY(s);
  /* The last stage has the loss; the others add zeros (exact). */
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_PP, &sum, 1));
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_DP, &sum, 1));
  *loss = sum;
  return SLAPO_OK;
}

/* ---- forward only (validation) ---- */

slapo_status slapo_pp_eval(slapo_pp_stage *st, int n, const slapo_tensor *const *inputs,
                           const slapo_kernel_env *envs, double *losses) {
  SLAPO_NEED(st, "pp_eval");
  if (n < 1) return slapo_error(SLAPO_INVALID_ARG, "pp_eval: %d batches", n);
  SLAPO_TRY(check_group(st, "pp_eval"));
  int s = slapo_pp_stage_index(st), p = slapo_pp_stage_n_stages(st);
  int n_recv = slapo_pp_stage_n_recv(st), n_send = slapo_pp_stage_n_send(st);
  slapo_tensor **recv = slapo_calloc((size_t)n_recv + 1, sizeof *recv);
  const slapo_tensor **send = slapo_calloc((size_t)n_send + 1, sizeof *send);
  slapo_status e = recv && send ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "pp_eval: out of memory");
  for (int k = 0; k < n_recv && recv; k++) recv[k] = slapo_pp_stage_recv_buf(st, 0, k);
  /* Each batch through slot 0: receive, forward, send on. Stage s + 1
   * runs batch i while stage s runs batch i + 1 (a forward-only GPipe). */
  for (int i = 0; e == SLAPO_OK && i < n; i++) {
    losses[i] = 0;
    if (s > 0) e = slapo_dist_pp_exchange(-1, 0, NULL, s - 1, n_recv, recv, TAG);
    if (e == SLAPO_OK) e = slapo_pp_stage_forward(st, 0, 2, inputs + 2 * i, &envs[i]);
    for (int k = 0; e == SLAPO_OK && k < n_send; k++) send[k] = slapo_pp_stage_sent(st, k);
    if (e == SLAPO_OK && s + 1 < p) e = slapo_dist_pp_exchange(s + 1, n_send, send, -1, 0, NULL, TAG);
    if (e == SLAPO_OK && s + 1 == p)
      losses[i] = (double)*(const float *)slapo_tensor_data(slapo_pp_stage_loss(st));
  }
  slapo_free(recv);
  slapo_free(send);
  SLAPO_TRY(e);
  /* The last stage's losses to every rank (the others add zeros: exact). */
  return slapo_dist_all_reduce_f64(SLAPO_GROUP_PP, losses, n);
}
