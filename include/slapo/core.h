/* slapo/core.h - status codes and messages, allocator and log hooks, arenas,
 * the Philox4x32-10 counter-based RNG and hashing.
 * Layer: core (depends on libc only).
 * Philox: Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as
 * 1, 2, 3", SC'11, with the known-answer vectors of the Random123 library. */
#ifndef SLAPO_CORE_H
#define SLAPO_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* Every error a user can cause is one of these; the readable message of the
 * most recent error on the calling thread is slapo_last_error(). */
#define SLAPO_STATUS_LIST(X)                                                   \
  X(OK, "ok")                                                                  \
  X(NOMEM, "out of memory")                                                    \
  X(INVALID_ARG, "invalid argument")                                           \
  X(SHAPE, "shape mismatch")                                                   \
  X(DTYPE, "dtype mismatch")                                                   \
  X(NOT_FOUND, "not found")                                                    \
  X(NO_MATCH, "no match")                                                      \
  X(UNSUPPORTED, "unsupported")                                                \
  X(PRECOND, "precondition failed")                                            \
  X(STATE, "invalid state")                                                    \
  X(LIMIT, "limit exceeded")                                                   \
  X(COMPILE, "compile error")                                                  \
  X(IO, "i/o error")                                                           \
  X(COMM, "communication error")                                               \
  X(VERIFY, "verification failed")                                             \
  X(PARSE, "parse error")

typedef enum slapo_status {
#define SLAPO__STATUS_ENUM(name, text) SLAPO_##name,
  SLAPO_STATUS_LIST(SLAPO__STATUS_ENUM)
#undef SLAPO__STATUS_ENUM
  SLAPO_STATUS_COUNT
} slapo_status;

/* Short lowercase name of a status ("shape", "not_found"); "unknown" for a
 * value outside the list. Returned string is static. */
const char *slapo_status_name(slapo_status s);

/* One-phrase description of a status ("shape mismatch"). Static string. */
const char *slapo_status_text(slapo_status s);

/* Message of the most recent error set on this thread, "" if none.
 * Borrowed: valid until the next slapo call on this thread that sets one. */
const char *slapo_last_error(void);

/* Sets this thread's error message (printf format) and returns `s`, so a
 * call site is one line: `return slapo_error(SLAPO_SHAPE, "...", ...);`.
 * Messages longer than 1023 bytes are truncated. */
slapo_status slapo_error(slapo_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
slapo_status slapo_verror(slapo_status s, const char *fmt, va_list ap);

/* Clears this thread's error message. */
void slapo_error_clear(void);

/* Appends `name` to the comma-separated list in buf [cap] ("a, b" becomes
 * "a, b, c"): the "known: ..." part of an error message, built in a loop
 * over a registry. A name that does not fit ends the list with ", ..."
 * (once); buf always stays a string. buf must start as "" and cap be at
 * least 6. */
void slapo_list_append(char *buf, size_t cap, const char *name);

/* ------------------------------------------------------------------------ */
/* Allocator hook                                                            */
/* ------------------------------------------------------------------------ */

/* All library memory goes through these three functions. `ud` is passed
 * back unchanged. realloc(NULL, n) must behave as malloc(n); free(NULL) is a
 * no-op. A failing malloc/realloc returns NULL; the library then returns
 * SLAPO_NOMEM and leaks nothing. */
typedef struct slapo_allocator {
  void *(*malloc)(size_t nbytes, void *ud);
  void *(*realloc)(void *ptr, size_t nbytes, void *ud);
  void (*free)(void *ptr, void *ud);
  void *ud;
} slapo_allocator;

/* Installs `a` (copied) for all threads; NULL restores the libc allocator.
 * Not thread-safe with respect to concurrent allocation: call it while the
 * library is idle (tests inject failures this way). */
void slapo_set_allocator(const slapo_allocator *a);

/* Library allocation entry points. slapo_malloc(0) returns a unique
 * non-NULL pointer or NULL on failure; slapo_calloc checks n*size overflow. */
void *slapo_malloc(size_t nbytes);
void *slapo_calloc(size_t n, size_t size);
void *slapo_realloc(void *ptr, size_t nbytes);
void slapo_free(void *ptr);
/* Owned copy of `s` (NULL on allocation failure or when s is NULL). */
char *slapo_strdup(const char *s);

/* Aligned allocation for tensor data (64-byte alignment for AVX-512). Memory
 * comes from the allocator hook; release with slapo_aligned_free. */
void *slapo_aligned_alloc(size_t nbytes);
void slapo_aligned_free(void *ptr);

/* ------------------------------------------------------------------------ */
/* Log hook                                                                  */
/* ------------------------------------------------------------------------ */

/* Log sink: `level` SLAPO_LOG_WARN (0) warnings, such as tensors of a
 * checkpoint the model did not read; then the debug levels 1 phases,
 * 2 schedule trees, 3 rewrite matches, 4 generated code. `msg` is borrowed
 * for the call only. */
typedef void (*slapo_log_fn)(int level, const char *msg, void *ud);
enum { SLAPO_LOG_WARN = 0 };

/* Installs a sink. The default sink writes warnings to stderr
 * ("slapo: warning: ...") and is otherwise silent unless the environment
 * variable SLAPO_DEBUG is > 0, in which case messages with level <=
 * SLAPO_DEBUG go to stderr too. slapo_set_log(NULL, NULL) restores the
 * default. */
void slapo_set_log(slapo_log_fn fn, void *ud);

/* Current debug level (SLAPO_DEBUG, read once; 0 when unset). */
int slapo_debug_level(void);

/* Emits a message at `level` if the sink accepts it. */
void slapo_logf(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------------ */
/* Arenas                                                                    */
/* ------------------------------------------------------------------------ */

/* A growable region: allocations are freed all at once by slapo_arena_free or
 * slapo_arena_reset. Blocks grow geometrically; an allocation larger than a
 * block gets a block of its own. Not thread-safe. */
typedef struct slapo_arena slapo_arena;

/* Creates an arena whose first block holds `block_nbytes` (0: 4 KiB).
 * Errors: SLAPO_NOMEM. *out is owned by the caller. */
slapo_status slapo_arena_new(size_t block_nbytes, slapo_arena **out);
void slapo_arena_free(slapo_arena *a); /* NULL is fine */
/* Frees every allocation but keeps the first block for reuse. */
void slapo_arena_reset(slapo_arena *a);

/* Returns `nbytes` of zeroed memory aligned to `align` (a power of two <= 4096;
 * 0 means 16), or NULL on allocation failure (the thread's error is set to
 * SLAPO_NOMEM). Borrowed: valid until the arena is freed or reset. */
void *slapo_arena_alloc(slapo_arena *a, size_t nbytes, size_t align);
char *slapo_arena_strdup(slapo_arena *a, const char *s);
char *slapo_arena_printf(slapo_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Total bytes handed out since creation or the last reset. */
size_t slapo_arena_used(const slapo_arena *a);

/* ------------------------------------------------------------------------ */
/* Instruction-set levels of slapo's own vector kernels                      */
/* ------------------------------------------------------------------------ */

/* The levels slapo's vector kernels are compiled for (one variant each,
 * picked per call at run time): baseline x86-64 (SSE2), AVX2 + FMA, and
 * AVX-512 (F, BW, VL, DQ). Every variant computes the same bits.
 * AVX512_BF16 is AVX-512 plus bf16 dot products (the AVX512_BF16 or the
 * AMX-BF16 CPUID bit): slapo's own kernels run their AVX-512 variant there;
 * what it adds is the licence for bf16 GEMMs in oneDNN (ops/gemm_dnnl.c),
 * which without it would be emulated at a fraction of f32's speed. */
typedef enum slapo_isa {
  SLAPO_ISA_BASELINE = 0,
  SLAPO_ISA_AVX2 = 1,
  SLAPO_ISA_AVX512 = 2,
  SLAPO_ISA_AVX512_BF16 = 3,
} slapo_isa;

/* The best level this CPU and OS can run (AVX register state enabled). */
slapo_isa slapo_isa_host(void);
/* The level the kernels use: the host's, lowered to the cap. The cap comes
 * from slapo_isa_set_max, else from the environment variable SLAPO_MAX_ISA
 * (baseline, avx2, avx512 or avx512_bf16, any case; like oneDNN's ONEDNN_MAX_CPU_ISA it
 * never raises the level above the host's). An unreadable SLAPO_MAX_ISA
 * means baseline; slapo_isa_check_env reports it. */
slapo_isa slapo_isa_active(void);
/* Caps the level from now on (tests and benchmarks run each variant this
 * way). Not to be called while kernels run on other threads. */
void slapo_isa_set_max(slapo_isa cap);
/* "baseline", "avx2", "avx512", "avx512_bf16"; "unknown" outside the enum. Static string. */
const char *slapo_isa_name(slapo_isa isa);
/* Parses a level name (case-insensitive). Errors: SLAPO_INVALID_ARG naming
 * the value and the accepted names. */
slapo_status slapo_isa_parse(const char *name, slapo_isa *out);
/* SLAPO_OK when SLAPO_MAX_ISA is unset, empty or a level name; otherwise
 * SLAPO_INVALID_ARG quoting it. */
slapo_status slapo_isa_check_env(void);

/* The CPU's model name ("model name" in /proc/cpuinfo, e.g. "AMD EPYC
 * 7B13"), or "unknown CPU", NUL-terminated into buf [cap]. For benchmarks,
 * which name the machine they ran on. */
void slapo_cpu_model(char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Atomic file writes                                                        */
/* ------------------------------------------------------------------------ */

/* Writes a file's contents to `fp` (the temporary file `tmp_path`, for
 * messages); returns SLAPO_OK or the status to fail with. */
typedef slapo_status (*slapo_write_fn)(FILE *fp, const char *tmp_path, void *ud);

/* Writes `path` atomically: `write` fills a temporary file in the same
 * directory, which is flushed to disk (fsync), renamed over `path`, and the
 * rename synced; on any failure the temporary file is removed and an
 * existing `path` is untouched. The file gets mode 0644. `op` prefixes the
 * messages. Errors: SLAPO_INVALID_ARG (empty path), SLAPO_IO (naming the
 * file and errno's text; also a `path` slapo_check_write_target refuses),
 * SLAPO_NOMEM, or what `write` returned. */
slapo_status slapo_write_atomic(const char *path, const char *op, slapo_write_fn write,
                                void *ud);

/* Whether slapo_write_atomic can write `path`, checked before the work that
 * produces the contents (a training run before its checkpoint): the
 * directory exists, is a directory (not a regular file: `afile/ckpt`) and
 * is writable, and `path`, if it exists, is a regular file or a
 * link to one. A directory, device or FIFO is refused: the rename would
 * replace it (as root, /dev/full became a regular file) instead of writing
 * into it. Errors: SLAPO_INVALID_ARG (empty path), SLAPO_IO (naming the
 * path, what it is, or the directory and errno's text). */
slapo_status slapo_check_write_target(const char *path, const char *op);

/* ------------------------------------------------------------------------ */
/* Philox4x32-10                                                             */
/* ------------------------------------------------------------------------ */

/* One Philox4x32 block with 10 rounds: 128-bit counter `ctr`, 64-bit key
 * `key`, 128 random bits to `out`. Pure function. */
void slapo_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The random stream used by random ops (DESIGN.md §3): element `index` of a
 * stream identified by (`seed`, `stream` = hash of module path and op index)
 * at step `step`. Key = seed; counter = (index/4 low, high, step low, stream
 * mixed with step high). Each call returns one uniform float in [0, 1) built
 * from the top 24 bits of word index%4. Pure function: the same arguments
 * always give the same value, whatever the tiling. */
float slapo_rng_uniform(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index);

/* The same stream, a block at a time, for kernels: slapo_rng_key hashes
 * (seed, stream) once; slapo_rng_uniform4 returns the four uniforms of
 * counter block `block`, i.e. out[j] == slapo_rng_uniform(seed, stream,
 * step, 4 * block + j), bit for bit. Pure functions. */
uint64_t slapo_rng_key(uint64_t seed, uint64_t stream);
void slapo_rng_uniform4(uint64_t key, uint64_t step, uint64_t block, float out[4]);

/* Standard normal N(0, 1) via Box-Muller on a pair of uniforms from the same
 * Philox block; pure function of its arguments like slapo_rng_uniform. */
float slapo_rng_normal(uint64_t seed, uint64_t stream, uint64_t step, uint64_t index);

/* ------------------------------------------------------------------------ */
/* Hashing                                                                   */
/* ------------------------------------------------------------------------ */

/* 64-bit hash of `nbytes` bytes (XXH3-64 with `seed`). */
uint64_t slapo_hash64(const void *data, size_t nbytes, uint64_t seed);
/* 64-bit hash of a NUL-terminated string (seed 0). */
uint64_t slapo_hash_str(const char *s);
/* Combines two hashes (order-sensitive). */
uint64_t slapo_hash_combine(uint64_t h, uint64_t v);

/* ------------------------------------------------------------------------ */
/* String map                                                                */
/* ------------------------------------------------------------------------ */

/* Open-addressing hash map from NUL-terminated string keys to pointers.
 * Keys are copied into the map; values are borrowed (the map never frees
 * them). Iteration order is insertion order. */
typedef struct slapo_map slapo_map;

/* Errors: SLAPO_NOMEM. *out owned (slapo_map_free). */
slapo_status slapo_map_new(slapo_map **out);
void slapo_map_free(slapo_map *m); /* NULL is fine */
/* Inserts or overwrites. Errors: SLAPO_NOMEM (map unchanged). */
slapo_status slapo_map_set(slapo_map *m, const char *key, void *value);
/* Value for key, or NULL when absent (store non-NULL values to tell apart). */
void *slapo_map_get(const slapo_map *m, const char *key);
bool slapo_map_has(const slapo_map *m, const char *key);
/* Removes key if present; returns whether it was. */
bool slapo_map_remove(slapo_map *m, const char *key);
size_t slapo_map_count(const slapo_map *m);
/* The i-th live entry in insertion order, 0 <= i < count. Borrowed key. */
const char *slapo_map_key_at(const slapo_map *m, size_t i);
void *slapo_map_value_at(const slapo_map *m, size_t i);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_CORE_H */
