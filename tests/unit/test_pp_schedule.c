/* tests/unit/test_pp_schedule.c - the pipeline schedules' action lists
 * (dist/pp_schedule.c) simulated without MPI, every transfer blocking
 * until the neighbour's matching one is its current action (a send waits
 * for the receive; an exchange for the peer's exchange of the same two
 * micro-batches), for p in 1..8 stages and m in 1..16 micro-batches, m < p
 * and m = p included, 1F1B and GPipe: no deadlock, every transfer matched,
 * every forward once and before its backward, data received before it is
 * used, backwards in micro-batch order, and at most p - s micro-batches
 * stashed on stage s under 1F1B (m under GPipe). Then the argument errors,
 * and the balanced split of modules into stages (slapo_pp_balance) against
 * every split of up to 8 modules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "slapo/dist.h"

enum { MAX_P = 8, MAX_M = 16, MAX_A = 6 * MAX_M };

typedef struct stage {
  slapo_pp_action a[MAX_A];
  int n, pc;
  bool fwd[MAX_M], bwd[MAX_M], act[MAX_M], grad[MAX_M];
  int stash, max_stash, last_bwd;
} stage;

static bool is(const slapo_pp_action *x, slapo_pp_kind k, int mb, int mb2) {
  return x->kind == k && x->mb == mb && x->mb2 == mb2;
}

/* Runs stage s's current action if it can; true when it (and a peer's
 * matching transfer) advanced. Receives wait for their senders, which
 * complete both sides. */
static bool try_step(stage *st, int p, int s) {
  stage *me = &st[s];
  if (me->pc == me->n) return false;
  const slapo_pp_action *x = &me->a[me->pc];
  stage *next = s + 1 < p ? &st[s + 1] : NULL, *prev = s > 0 ? &st[s - 1] : NULL;
  const slapo_pp_action *nx = next && next->pc < next->n ? &next->a[next->pc] : NULL;
  const slapo_pp_action *pv = prev && prev->pc < prev->n ? &prev->a[prev->pc] : NULL;
  switch (x->kind) {
  case SLAPO_PP_FWD:
    if (me->fwd[x->mb] || (s > 0 && !me->act[x->mb]))
      fail_msg("stage %d: forward %d run twice or before its activations arrived", s, x->mb);
    me->fwd[x->mb] = true;
    if (++me->stash > me->max_stash) me->max_stash = me->stash;
    break;
  case SLAPO_PP_BWD:
    if (!me->fwd[x->mb] || me->bwd[x->mb] || (s < p - 1 && !me->grad[x->mb]))
      fail_msg("stage %d: backward %d before its forward or gradient, or twice", s, x->mb);
    if (x->mb != me->last_bwd + 1) fail_msg("stage %d: backward %d out of order", s, x->mb);
    me->bwd[x->mb] = true, me->last_bwd = x->mb, me->stash--;
    break;
  case SLAPO_PP_SEND_ACT:
    if (!next || !me->fwd[x->mb]) fail_msg("stage %d: sends activations %d it lacks", s, x->mb);
    if (!nx || !is(nx, SLAPO_PP_RECV_ACT, x->mb, -1)) return false;
    next->act[x->mb] = true, next->pc++;
    break;
  case SLAPO_PP_SEND_GRAD:
    if (!prev || !me->bwd[x->mb]) fail_msg("stage %d: sends gradient %d it lacks", s, x->mb);
    if (!pv || !is(pv, SLAPO_PP_RECV_GRAD, x->mb, -1)) return false;
    prev->grad[x->mb] = true, prev->pc++;
    break;
  case SLAPO_PP_SEND_ACT_RECV_GRAD:
    if (!next || !me->fwd[x->mb]) fail_msg("stage %d: exchanges activations %d it lacks", s, x->mb);
    if (!nx || !is(nx, SLAPO_PP_SEND_GRAD_RECV_ACT, x->mb2, x->mb)) return false;
    if (!next->bwd[x->mb2]) fail_msg("stage %d: sends gradient %d it lacks", s + 1, x->mb2);
    next->act[x->mb] = true, me->grad[x->mb2] = true, next->pc++;
    break;
  case SLAPO_PP_RECV_ACT:
  case SLAPO_PP_RECV_GRAD:
  case SLAPO_PP_SEND_GRAD_RECV_ACT:
    if ((x->kind == SLAPO_PP_RECV_GRAD) ? !next : !prev)
      fail_msg("stage %d: %s from a stage that does not exist", s, slapo_pp_kind_name(x->kind));
    return false; /* completed by the sender's side */
  }
  me->pc++;
  return true;
}

static void simulate(slapo_pp_schedule sched, int p, int m) {
  static stage st[MAX_P];
  memset(st, 0, sizeof st);
  for (int s = 0; s < p; s++) {
    OK(slapo_pp_actions(sched, p, m, s, st[s].a, MAX_A, &st[s].n));
    st[s].last_bwd = -1;
  }
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; s++) moved |= try_step(st, p, s);
  }
  for (int s = 0; s < p; s++) {
    if (st[s].pc != st[s].n)
      fail_msg("%s p=%d m=%d: deadlock: stage %d waits at action %d (%s %d)",
               sched == SLAPO_PP_1F1B ? "1F1B" : "GPipe", p, m, s, st[s].pc,
               slapo_pp_kind_name(st[s].a[st[s].pc].kind), st[s].a[st[s].pc].mb);
    for (int i = 0; i < m; i++) assert_true(st[s].fwd[i] && st[s].bwd[i]);
    assert_int_equal(st[s].stash, 0);
    int bound = sched == SLAPO_PP_1F1B ? (p - s < m ? p - s : m) : m;
    if (st[s].max_stash > bound)
      fail_msg("p=%d m=%d stage %d: %d micro-batches stashed, bound %d", p, m, s,
               st[s].max_stash, bound);
    /* The slots a stage is built with are exactly what it stashes. */
    if (slapo_pp_slots(sched, p, s, m) != st[s].max_stash)
      fail_msg("p=%d m=%d stage %d: slapo_pp_slots %d, stashed %d", p, m, s,
               slapo_pp_slots(sched, p, s, m), st[s].max_stash);
  }
}

static void every_shape_runs(void **state) {
  (void)state;
  for (int p = 1; p <= MAX_P; p++)
    for (int m = 1; m <= MAX_M; m++) {
      simulate(SLAPO_PP_1F1B, p, m);
      simulate(SLAPO_PP_GPIPE, p, m);
    }
}

/* 1F1B on 4 stages, 8 micro-batches, stage 1: two warm-up forwards, then
 * forward / exchange / backward / exchange, then the drain. */
static void one_f_one_b_order(void **state) {
  (void)state;
  slapo_pp_action a[MAX_A];
  int n;
  OK(slapo_pp_actions(SLAPO_PP_1F1B, 4, 8, 1, a, MAX_A, &n));
  char buf[2048] = "";
  for (int i = 0; i < n; i++) {
    char one[48];
    snprintf(one, sizeof one, "%s%s %d", i ? ", " : "", slapo_pp_kind_name(a[i].kind), a[i].mb);
    strcat(buf, one);
  }
  assert_true(strncmp(buf, "recv_act 0, forward 0, send_act 0, recv_act 1, forward 1, send_act 1, "
                           "recv_act 2, forward 2, send_act_recv_grad 2, backward 0, "
                           "send_grad_recv_act 0", 120) == 0);
  assert_int_equal(a[n - 1].kind, SLAPO_PP_SEND_GRAD);
  assert_int_equal(a[n - 1].mb, 7);
}

static void argument_errors(void **state) {
  (void)state;
  slapo_pp_action a[MAX_A];
  int n = 7;
  expect_status(slapo_pp_actions(SLAPO_PP_1F1B, 0, 4, 0, a, MAX_A, &n), SLAPO_INVALID_ARG,
                "0 stages and 4 micro-batches");
  assert_int_equal(n, 0);
  expect_status(slapo_pp_actions(SLAPO_PP_1F1B, 2, 4, 2, a, MAX_A, &n), SLAPO_INVALID_ARG,
                "stage 2 is outside 0 .. 1");
  expect_status(slapo_pp_actions(SLAPO_PP_GPIPE, 2, 4, 0, a, 10, &n), SLAPO_INVALID_ARG,
                "room for 10 actions given; 4 micro-batches need 24");
  assert_string_equal(slapo_pp_schedule_name(SLAPO_PP_1F1B), "1F1B");
  assert_string_equal(slapo_pp_schedule_name(SLAPO_PP_GPIPE), "GPipe");
  assert_string_equal(slapo_pp_schedule_name((slapo_pp_schedule)7), "?");
}

/* ---- balanced stages ---- */

/* The largest stage of cuts cut[0 .. k-2] over cost [n]. */
static double largest(const double *cost, int n, int k, const int *cut) {
  double worst = 0;
  for (int j = 0, i = 0; j < k; j++) {
    int end = j < k - 1 ? cut[j] : n - 1;
    double sum = 0;
    assert_true(end >= i); /* non-empty, in order */
    for (; i <= end; i++) sum += cost[i];
    worst = sum > worst ? sum : worst;
  }
  return worst;
}

/* The least largest stage over every split, by enumeration. */
static double brute(const double *cost, int n, int k, int *cut, int j, int start) {
  if (j == k - 1) return largest(cost, n, k, cut);
  double b = -1;
  for (int c = start; c <= n - (k - j); c++) {
    cut[j] = c;
    double v = brute(cost, n, k, cut, j + 1, c + 1);
    if (b < 0 || v < b) b = v;
  }
  return b;
}

static void balance_is_optimal(void **state) {
  (void)state;
  uint64_t x = 88172645463325252ull; /* xorshift: fixed costs, varied */
  for (int trial = 0; trial < 300; trial++) {
    int n = 1 + trial % 8, k = 1 + (trial / 8) % n;
    double cost[8];
    for (int i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      cost[i] = (double)(x % 7); /* small integers: many ties */
    }
    int cut[8], again[8], tmp[8];
    double got;
    OK(slapo_pp_balance(cost, n, k, cut, &got));
    assert_true(largest(cost, n, k, cut) == got);
    assert_true(got == brute(cost, n, k, tmp, 0, 0));
    OK(slapo_pp_balance(cost, n, k, again, NULL));
    assert_memory_equal(cut, again, sizeof(int) * (size_t)(k - 1));
  }
  /* GPT-2-like: 12 equal blocks on 4 stages: 3 each. */
  double blocks[12];
  for (int i = 0; i < 12; i++) blocks[i] = 1.0;
  int cut[3];
  OK(slapo_pp_balance(blocks, 12, 4, cut, NULL));
  assert_int_equal(cut[0], 2);
  assert_int_equal(cut[1], 5);
  assert_int_equal(cut[2], 8);
}

static void balance_errors(void **state) {
  (void)state;
  double c[3] = {1, 2, 3}, bad[2] = {1, -1};
  int cut[4];
  expect_status(slapo_pp_balance(c, 3, 4, cut, NULL), SLAPO_INVALID_ARG,
                "4 stages but 3 modules");
  expect_status(slapo_pp_balance(c, 3, 0, cut, NULL), SLAPO_INVALID_ARG, "0 stages");
  expect_status(slapo_pp_balance(bad, 2, 1, cut, NULL), SLAPO_INVALID_ARG, "module 1 has cost -1");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_shape_runs),
      cmocka_unit_test(one_f_one_b_order),
      cmocka_unit_test(argument_errors),
      cmocka_unit_test(balance_is_optimal),
      cmocka_unit_test(balance_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
