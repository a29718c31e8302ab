/* bench/bench_find.c - how long `find` takes on a large traced graph: every
 * match of gelu(linear(x, w, b)) in GPT-2 124M's transformer traced with
 * flatten=true (12 matches, one per block), plus the trace itself and a
 * module-regex query. Meta parameters: nothing is allocated or computed but
 * the graphs. Median of ROUNDS runs (env, default 21). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_machine.h"
#include "slapo/models.h"
#include "slapo/pattern.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

#define CHECK(expr)                                                      \
  do {                                                                   \
    if ((expr) != SLAPO_OK) {                                            \
      fprintf(stderr, "bench_find: %s: %s\n", #expr, slapo_last_error()); \
      return 1;                                                          \
    }                                                                    \
  } while (0)

int main(void) {
  bench_print_machine(stdout, "bench_find");
  int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 21;
  if (rounds < 1) rounds = 1;
  slapo_gpt2_config cfg;
  CHECK(slapo_gpt2_config_named("124M", &cfg));
  slapo_module *m, *tr;
  CHECK(slapo_gpt2_new(&cfg, &m));
  CHECK(slapo_module_at(m, "transformer", &tr));
  double t0 = now_ms();
  CHECK(slapo_module_trace(tr, &(slapo_trace_opts){.flatten = true}));
  double t_trace = now_ms() - t0;
  slapo_pattern *p;
  CHECK(slapo_pattern_parse("gelu(linear(x, w, b))", &p));
  double *find = malloc(sizeof *find * (size_t)rounds), *re = malloc(sizeof *re * (size_t)rounds);
  int n = 0, n_re = 0;
  for (int r = 0; r < rounds; r++) {
    slapo_matches ms;
    t0 = now_ms();
    CHECK(slapo_find(tr, p, &ms));
    find[r] = now_ms() - t0;
    n = ms.n;
    slapo_matches_deinit(&ms);
    t0 = now_ms();
    CHECK(slapo_find_regex(tr, "c_.*", &ms));
    re[r] = now_ms() - t0;
    n_re = ms.n;
    slapo_matches_deinit(&ms);
  }
  printf("graph: %d nodes (transformer of GPT-2 124M, flatten=true, traced in %.1f ms)\n",
         slapo_graph_count(slapo_module_graph(tr)), t_trace);
  printf("find gelu(linear(x, w, b)): %d matches, median %.3f ms over %d runs\n", n,
         median(find, rounds), rounds);
  printf("find regex c_.*:            %d matches, median %.3f ms\n", n_re, median(re, rounds));
  free(find), free(re);
  slapo_pattern_free(p);
  slapo_module_free(m);
  return n == cfg.n_layer ? 0 : 1;
}
