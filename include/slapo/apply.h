/* slapo/apply.h - applying schedule files to a model, and verify: proving
 * that a schedule keeps the model's numerics (outputs and gradients), entry
 * by entry, with bisection to the first entry that breaks them.
 * Layer: apply (depends on primitives and everything below). */
#ifndef SLAPO_APPLY_H
#define SLAPO_APPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "slapo/primitives.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Applies the expanded steps of `log` (slapo_sched_expand against `root`)
 * in order: each step's path is resolved when it runs (earlier steps may
 * rebuild nodes), then slapo_primitive_apply. Steps whose 1-based number is
 * in `disabled` are skipped; `upto` > 0 stops after step `upto`. *n_applied
 * (may be NULL) receives the number of steps applied. On error the steps
 * before the failing one stay applied; the message starts with the failing
 * step's file:line. Errors: those of expansion and of the primitives. */
slapo_status slapo_apply_schedule(slapo_sched *root, const slapo_sched_log *log,
                                  const size_t *disabled, size_t n_disabled, size_t upto,
                                  size_t *n_applied);

/* A schedule file applied to a model: what slapo_schedule_file_apply made
 * (all owned; release with slapo_schedule_run_deinit). */
typedef struct slapo_schedule_run {
  slapo_sched_log *log;    /* the parsed file                               */
  slapo_sched *tree;       /* the model's schedule tree, with its log       */
  slapo_sched_steps steps; /* the file's lines expanded into numbered steps */
  size_t applied;          /* steps applied                                 */
} slapo_schedule_run;

/* The schedule a run applies: with precision "bf16" first the root line
 * `. autocast dtype=bf16` (its source shown as "--precision bf16"), then
 * the lines of the `.sched` file `path` (NULL: none). precision NULL or
 * "f32" adds nothing. *out owned (slapo_sched_log_free).
 * Errors: SLAPO_INVALID_ARG (precision not f32 or bf16), those of parsing
 * (file:line:column), SLAPO_NOMEM. */
slapo_status slapo_schedule_load(const char *path, const char *precision, slapo_sched_log **out);

/* Loads the schedule (slapo_schedule_load), creates `model`'s schedule
 * tree, expands the lines into numbered steps and applies them
 * (slapo_apply_schedule), skipping the numbers in `disabled`. Replacement
 * modules named by the file must be registered (slapo_models_init). *out
 * is filled as far as it got, also on error (so the caller can print the
 * steps), and must be deinit'ed. Errors: those of loading, expansion and
 * the primitives (file:line of the failing step). */
slapo_status slapo_schedule_file_apply(slapo_module *model, const char *path,
                                       const char *precision, const size_t *disabled,
                                       size_t n_disabled, slapo_schedule_run *out);
void slapo_schedule_run_deinit(slapo_schedule_run *r); /* NULL is fine */

/* Builds a fresh, materialized, unscheduled model (the same weights every
 * call, e.g. from a fixed seed). *out owned by the caller. */
typedef slapo_status (*slapo_model_builder)(void *ud, slapo_module **out);

typedef struct slapo_verify_opts {
  int n_in;                      /* inputs of a train step (idx, targets) */
  const slapo_tensor *const *in; /* in[0] alone is the eval input         */
  uint64_t seed, step;           /* RNG keys: dropout is on in train mode */
  double atol, rtol;             /* for primitives that change arithmetic */
                                 /* (0, 0 -> 1e-5, 1e-4)                  */
  const size_t *disabled;        /* step numbers to skip                  */
  size_t n_disabled;
  bool per_entry;                /* verify after every step, not only at the end */
  bool bisect;                   /* find the first step that breaks equality */
} slapo_verify_opts;

/* One comparison of the scheduled against the unscheduled model. */
typedef struct slapo_verify_check {
  size_t upto;          /* steps 1..upto applied                          */
  bool bitwise;         /* every applied primitive promises bitwise       */
  bool ok;
  double worst;         /* worst |a - b| / (atol + rtol |b|), or 0/1 bitwise */
  char what[256];       /* where it was: "loss", "logits", a parameter path */
  /* The prefix cannot run on its own (SLAPO_PRECOND while building: one use
   * of a tied weight sharded before the next step shards the other); not
   * a failure unless it is the whole schedule. `what` holds the reason. */
  bool incomplete;
} slapo_verify_check;

/* Called after each comparison (progress); may be NULL. */
typedef void (*slapo_verify_cb)(const slapo_verify_check *c, const slapo_sched_steps *steps,
                                void *ud);

/* Verifies `log` against the model `build` makes: for the checked prefixes
 * (all steps; every prefix with per_entry; a binary search with bisect,
 * assuming a prefix that fails keeps failing as steps are added), builds
 * the reference and the scheduled model, copies the reference's weights
 * into the scheduled one by parameter path, applies the prefix, runs an eval
 * step (logits from in[0]) and a train step (loss and every parameter's
 * gradient, dropout on) on both, and compares: bytes where every applied
 * primitive is bitwise, otherwise |a - b| <= atol + rtol |b| per element.
 * *first_bad receives the first failing step number (0 when all pass).
 * Across ranks (slapo_dist_init): sharded gradients are gathered to full
 * shape, and under data parallelism (D ranks a replica) the scheduled model
 * on rank d trains part d of the batch (dropout step step D + d, weight
 * 1 / D) with gradients and loss summed over the group, against the
 * reference training the D parts as micro-batches: data parallelism must
 * equal gradient accumulation. The verdict is the worst over all ranks.
 * A prefix shorter than the schedule whose model refuses to build with
 * SLAPO_PRECOND is reported incomplete (c->incomplete) and skipped, and so
 * is one that ends inside the tensor-parallel part (from the first `shard`
 * or `sync` step to the last): until every shard has its sync and its
 * partner, the model computes parts of outputs; the part is checked whole.
 * Errors: SLAPO_VERIFY when a check fails (message names the step, its
 * file:line, the worst value and where), and those of building, applying
 * and running. */
slapo_status slapo_verify(slapo_model_builder build, void *ud, const slapo_sched_log *log,
                          const slapo_verify_opts *opts, slapo_verify_cb cb, void *cb_ud,
                          size_t *first_bad);

#ifdef __cplusplus
}
#endif
#endif
