/* compiler/internal.h - what the compiler layer's files share: the cc
 * backend's analysis of a region (how each input broadcasts), the source
 * generator, the object cache, and the backends' descriptors.
 * Layer: compiler (internal). */
#ifndef SLAPO_COMPILER_INTERNAL_H
#define SLAPO_COMPILER_INTERNAL_H

#include "core/assert.h"
#include "slapo/compiler.h"

#define SLAPO__CC_MAX_IN 16
#define SLAPO__CC_MAX_RAND 8
#define SLAPO__CC_MAX_RES 16 /* results of a row region (packed) */
/* The backward's reductions: at most this many row blocks, each summing
 * its rows' partials into the work area (SLAPO__CC_ROW_BLOCKS * (one double
 * per SCALAR input, then C floats per ROW input)); without a ROW input the
 * elements are viewed as rows of
 * SLAPO__CC_CHUNK. Both fixed: the sums' order does not depend on the
 * thread count. */
#define SLAPO__CC_ROW_BLOCKS 32
#define SLAPO__CC_CHUNK 4096
/* A row region's kernels keep a few rows on the stack (cc_rows.c): rows of
 * at most this many values. */
#define SLAPO__CC_MAX_ROW 16384
#define SLAPO__CC_STR_(...) #__VA_ARGS__
#define SLAPO__CC_STR(...) SLAPO__CC_STR_(__VA_ARGS__)

/* How an input of a fused elementwise region maps onto the output viewed
 * as [R, C]: every element (FULL, same numel), one row repeated (ROW: the
 * output's trailing dims, numel C: a bias), or one value (SCALAR). */
typedef enum slapo__cc_kind { SLAPO__CC_FULL, SLAPO__CC_ROW, SLAPO__CC_SCALAR } slapo__cc_kind;

typedef struct slapo__cc_plan {
  int n_in;
  slapo__cc_kind kind[SLAPO__CC_MAX_IN];
  int n_rand;                        /* random nodes (dropout), graph order */
  uint64_t stream[SLAPO__CC_MAX_RAND];
  bool grad_is_dy[SLAPO__CC_MAX_IN]; /* input k's gradient is the output's,
                                        unchanged (a residual add): the
                                        backward rule passes dy on and the
                                        kernel writes nothing for it (a row
                                        region: the norm input's gradient,
                                        written once after the inputs')   */
  bool bwd_reads[SLAPO__CC_MAX_IN];  /* the backward kernel reads input k's
                                        values (others: only its shape, so
                                        the step need not keep it alive)   */
  /* A region around a LayerNorm, RMSNorm or softmax (compiler/cc_rows.c):
   * its n_res results, each of the op's shape (N values), packed into one
   * value of n_slots N, result k at k N; the row its backward reads (a
   * norm's input, a softmax's output) is at slot x_slot (a result's, or a
   * hidden one after them), or is input x_in (x_slot -1; x_in is the op's
   * input when that is a region input). Its backward takes every result's
   * gradient. */
  bool rows;
  int n_res, n_slots, x_slot, x_in;
  bool rstd_rows; /* an RMSNorm's weight gradient: R row rstds in the work */
} slapo__cc_plan;

/* Kinds of inputs with these shapes against output shape [ndim]: fills
 * kind[] and *C (the ROW inputs' common numel; 0 when none).
 * Errors: SLAPO_UNSUPPORTED naming the input and shapes. */
slapo_status slapo__cc_kinds(int n_in, const slapo_node *const *in, int ndim,
                             const int64_t *shape, slapo__cc_kind *kind, int64_t *C);

/* Whether the cc backend renders op (cc_ops.c): an elementwise op with a
 * form there. */
bool slapo__cc_renders(const slapo_op *op);

/* Writes into buf [cap] a C expression (float) for node's value (which =
 * -1) or for the gradient w.r.t. its input `which`, over a, b (inputs), y
 * (value), g (gradient w.r.t. y) and u (a random op's uniform): the op's
 * float form (fast) or its reference form rounded once (cc_ops.c says how
 * each computes). False when the op has no such form (not rendered, no
 * gradient, an attribute value it does not support) or buf is too small. */
bool slapo__cc_expr(const slapo_node *node, int which, bool fast, char *buf, size_t cap);

/* The fast kernels' scalar float helpers (slapo/ops/vmath.h:
 * slapo__gelu_tanh, slapo__keep, ...) as one line of C that needs
 * <stdint.h> and <string.h>, for a generated source whose expressions call
 * them. Static. */
const char *slapo__cc_math_src(void);

/* Generates the forward and backward kernels' C source for `region`
 * (cc_gen.c): *src owned (slapo_free), plan filled.
 * Errors: SLAPO_UNSUPPORTED (an op without codegen, naming it and "cc"; a
 * random op not of the output's shape; broadcasts cc cannot express),
 * SLAPO_NOMEM. fast: the ops' float forms, else their reference forms
 * throughout (slapo__cc_expr). */
slapo_status slapo__cc_generate(const slapo_graph *region, const char *name, bool fast,
                                slapo__cc_plan *plan, char **src);

/* The number of inputs of this kind. */
static inline int slapo__cc_count(const slapo__cc_plan *plan, slapo__cc_kind kind) {
  int n = 0;
  for (int k = 0; k < plan->n_in; k++) n += plan->kind[k] == kind;
  return n;
}

/* Doubles of the backward's work area for a region with these kinds, row
 * size C (the ROW inputs' numel) and R rows: the SCALAR inputs' double
 * partials, then the ROW inputs' float partials, rounded up to whole
 * doubles; then, for an RMSNorm region (plan.rstd_rows), R floats of row
 * rstds (its generated backward computes the same offset, cc_rows.c). */
static inline int64_t slapo__cc_work_doubles(const slapo__cc_plan *plan, int64_t C, int64_t R) {
  int64_t partials = (slapo__cc_count(plan, SLAPO__CC_SCALAR) +
                      ((int64_t)slapo__cc_count(plan, SLAPO__CC_ROW) * C + 1) / 2) *
                     SLAPO__CC_ROW_BLOCKS;
  return partials + (plan->rstd_rows ? (R + 1) / 2 : 0);
}

/* The kernels of a compiled source. */
typedef void (*slapo__cc_fwd_fn)(int64_t N, int64_t C, const float *const *in, float *y,
                                 const uint64_t *keys, uint64_t step, int training);
typedef void (*slapo__cc_bwd_fn)(int64_t N, int64_t C, const float *const *in, const float *dy,
                                 float *pk, const int64_t *off, double *work,
                                 const uint64_t *keys, uint64_t step, int training);

/* Compiles `src` for the active ISA into the cache (or finds it there) and
 * loads it (cc_build.c). *key receives the cache key (16 hex digits).
 * Errors: SLAPO_COMPILE (compiler missing or failing: its stderr),
 * SLAPO_IO, SLAPO_NOMEM. */
slapo_status slapo__cc_build(const char *src, slapo__cc_fwd_fn *fwd, slapo__cc_bwd_fn *bwd,
                             char key[17]);

/* The kernel cache's trust rules and loading (cc_cache.c). */

/* Creates the cache `dir` if it is missing (0700, missing parents too) and
 * checks that nobody else can write it: the cache owned by the effective
 * user and not group/other-writable, each directory above it up to $HOME
 * (or /) owned by the user or root and not group/other-writable unless
 * sticky. real [cap] receives the resolved path, to be used from then on.
 * Errors: SLAPO_IO naming the path and the rule broken, or why the cache
 * cannot be created. */
slapo_status slapo__cc_cache_dir(const char *dir, char *real, size_t cap);

/* Opens the cached file `path` without following a symbolic link and
 * checks the descriptor (slapo__cc_cache_check_fd). *fd: the descriptor,
 * owned, or -1 when there is no such file. Errors: SLAPO_IO (a symbolic
 * link, not a regular file, another owner, group/other-writable, other
 * open failures), naming the path. */
slapo_status slapo__cc_cache_open(const char *path, int *fd);

/* Whether open file fd (named path in messages) may be loaded: a regular
 * file owned by the effective user, not writable by group or others.
 * Errors: SLAPO_IO naming the path and the rule broken. */
slapo_status slapo__cc_cache_check_fd(const char *path, int fd);

/* Loads the checked object open as fd through /proc/self/fd/N (never by
 * path again) and remembers it under path; fd is consumed (kept open while
 * the object is loaded, i.e. for the process). *handle: the dlopen handle.
 * Errors: SLAPO_IO (/proc not mounted: the descriptor cannot be named),
 * SLAPO_COMPILE (the loader's message), SLAPO_NOMEM (loaded, but not
 * remembered). Callers serialize. */
slapo_status slapo__cc_cache_load(const char *path, int fd, void **handle);

/* The handle of the object loaded from path by this process, or NULL. */
void *slapo__cc_cache_loaded(const char *path);

/* The digest beside each object (cc_digest.c): path.xxh3. */

/* Whether open object fd (at path) matches its stored digest; *match is
 * false when the digest is missing or differs (the object is to be
 * recompiled). Errors: SLAPO_IO (the digest file untrusted, the object
 * unreadable), SLAPO_NOMEM. */
slapo_status slapo__cc_digest_check(const char *path, int fd, bool *match);

/* Writes path's digest, of the content of open file fd, atomically.
 * Errors: SLAPO_IO, SLAPO_NOMEM. */
slapo_status slapo__cc_digest_write(const char *path, int fd);

#define SLAPO_COMPILER(name) extern const slapo_compiler slapo__compiler_##name;
#include "compiler/compilers.def"
#undef SLAPO_COMPILER

#endif
