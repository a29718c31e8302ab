/* dist/pp_schedule.c - pipeline schedules as data: each stage's ordered
 * actions (forward, backward, and the transfers between neighbours) for
 * 1F1B and GPipe. Pure computation, the same on every rank; the engine
 * executes its own stage's list. Layer: dist.
 * 1F1B's order is Megatron-LM's non-interleaved schedule
 * (forward_backward_pipelining_without_interleaving): warm-up forwards,
 * a steady state of one forward and one backward, a cool-down of
 * backwards; its paired sends (send_forward_recv_backward,
 * send_backward_recv_forward) are one exchange action each (slapo/dist.h
 * says why). */
#include "slapo/dist.h"

int slapo_pp_max_actions(int m) { return 6 * (m > 0 ? m : 0); }

int slapo_pp_slots(slapo_pp_schedule sched, int p, int stage, int m) {
  int k = sched == SLAPO_PP_GPIPE || m < p - stage ? m : p - stage;
  return k > 1 ? k : 1;
}

const char *slapo_pp_kind_name(slapo_pp_kind kind) {
  static const char *const names[] = {"forward",   "backward",  "send_act",
                                      "recv_act",  "send_grad", "recv_grad",
                                      "send_act_recv_grad", "send_grad_recv_act"};
  return (unsigned)kind < sizeof names / sizeof *names ? names[kind] : "?";
}

const char *slapo_pp_schedule_name(slapo_pp_schedule sched) {
  return sched == SLAPO_PP_GPIPE ? "GPipe" : sched == SLAPO_PP_1F1B ? "1F1B" : "?";
}

typedef struct list {
  slapo_pp_action *a;
  int n;
} list;

static void put(list *l, slapo_pp_kind kind, int mb, int mb2) {
  l->a[l->n++] = (slapo_pp_action){kind, mb, mb2};
}

static void gpipe(list *l, int p, int m, int s) {
  for (int i = 0; i < m; i++) {
    if (s > 0) put(l, SLAPO_PP_RECV_ACT, i, -1);
    put(l, SLAPO_PP_FWD, i, -1);
    if (s < p - 1) put(l, SLAPO_PP_SEND_ACT, i, -1);
  }
  for (int i = 0; i < m; i++) {
    if (s < p - 1) put(l, SLAPO_PP_RECV_GRAD, i, -1);
    put(l, SLAPO_PP_BWD, i, -1);
    if (s > 0) put(l, SLAPO_PP_SEND_GRAD, i, -1);
  }
}

static void one_f_one_b(list *l, int p, int m, int s) {
  int warmup = p - s - 1 < m ? p - s - 1 : m, steady = m - warmup;
  bool first = s == 0, last = s == p - 1;
  for (int i = 0; i < warmup; i++) {
    if (!first) put(l, SLAPO_PP_RECV_ACT, i, -1);
    put(l, SLAPO_PP_FWD, i, -1);
    if (!last) put(l, SLAPO_PP_SEND_ACT, i, -1);
  }
  if (steady > 0 && !first) put(l, SLAPO_PP_RECV_ACT, warmup, -1);
  for (int i = 0; i < steady; i++) {
    int f = warmup + i, b = i;
    put(l, SLAPO_PP_FWD, f, -1);
    if (!last) put(l, SLAPO_PP_SEND_ACT_RECV_GRAD, f, b);
    put(l, SLAPO_PP_BWD, b, -1);
    if (first) continue;
    if (i == steady - 1) put(l, SLAPO_PP_SEND_GRAD, b, -1);
    else put(l, SLAPO_PP_SEND_GRAD_RECV_ACT, b, f + 1);
  }
  for (int b = steady; b < m; b++) {
    if (!last) put(l, SLAPO_PP_RECV_GRAD, b, -1);
    put(l, SLAPO_PP_BWD, b, -1);
    if (!first) put(l, SLAPO_PP_SEND_GRAD, b, -1);
  }
}

slapo_status slapo_pp_actions(slapo_pp_schedule sched, int p, int m, int stage,
                              slapo_pp_action *out, int cap, int *n) {
  if (n) *n = 0;
  if (p < 1 || m < 1)
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: %d stages and %d micro-batches; both must "
                       "be at least 1", p, m);
  if (stage < 0 || stage >= p)
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: stage %d is outside 0 .. %d", stage, p - 1);
  if (!out || !n || cap < slapo_pp_max_actions(m))
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: room for %d actions given; %d micro-batches "
                       "need %d (slapo_pp_max_actions)", out && n ? cap : 0, m,
                       slapo_pp_max_actions(m));
  if (sched != SLAPO_PP_1F1B && sched != SLAPO_PP_GPIPE)
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: unknown schedule %d", (int)sched);
  list l = {out, 0};
  if (sched == SLAPO_PP_GPIPE) gpipe(&l, p, m, stage);
  else one_f_one_b(&l, p, m, stage);
  *n = l.n;
  return SLAPO_OK;
}

/* ---- balanced stages ---- */

slapo_status slapo_pp_balance(const double *cost, int n, int k, int *cut, double *max_cost) {
  if (k < 1) return slapo_error(SLAPO_INVALID_ARG, "pipeline: %d stages; at least 1", k);
  if (k > n)
    return slapo_error(SLAPO_INVALID_ARG, "pipeline: %d stages but %d modules to cut between; "
                       "each stage needs one at least", k, n);
  for (int i = 0; i < n; i++)
    if (!(cost[i] >= 0) || cost[i] > 1e300)
      return slapo_error(SLAPO_INVALID_ARG, "pipeline: module %d has cost %g; costs must be "
                         "finite and non-negative", i, cost[i]);
  /* pre[i]: cost of modules 0 .. i-1; best[j * (n + 1) + i]: the least
   * largest stage over modules 0 .. i-1 in j + 1 stages; from[...]: where
   * its last stage starts. */
  size_t cells = (size_t)k * (size_t)(n + 1);
  double *pre = slapo_calloc((size_t)n + 1, sizeof *pre), *best = slapo_calloc(cells, sizeof *best);
  int *from = slapo_calloc(cells, sizeof *from);
  if (!pre || !best || !from) {
    slapo_free(pre), slapo_free(best), slapo_free(from);
    return slapo_error(SLAPO_NOMEM, "pipeline: out of memory");
  }
  for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i];
  for (int i = 1; i <= n; i++) best[i] = pre[i];
  for (int j = 1; j < k; j++)
    for (int i = j + 1; i <= n; i++) {
      double b = -1;
      for (int t = j; t < i; t++) { /* the last stage is modules t .. i-1 */
        double last = pre[i] - pre[t], prev = best[(j - 1) * (n + 1) + t];
        double v = last > prev ? last : prev;
        if (b < 0 || v < b) b = v, from[j * (n + 1) + i] = t;
      }
      best[j * (n + 1) + i] = b;
    }
  if (max_cost) *max_cost = best[(k - 1) * (n + 1) + n];
  for (int j = k - 1, i = n; j > 0; j--) {
    int t = from[j * (n + 1) + i];
    cut[j - 1] = t - 1;
    i = t;
  }
  slapo_free(pre), slapo_free(best), slapo_free(from);
  return SLAPO_OK;
}
