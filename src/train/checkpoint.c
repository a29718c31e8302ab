/* train/checkpoint.c - a checkpoint is a pair of files, the weights
 * (x.safetensors) and the optimizer state (x.optim.safetensors), and a save
 * must never lose the last good pair. Each file is written atomically, but
 * two renames are not atomic as a pair: a save that wrote the weights and
 * then failed on the optimizer file (a full disk) used to leave new weights
 * beside old optimizer state, and the previous good pair was gone.
 *
 * The design: both files of a save carry one pair id (metadata slapo_pair:
 * the step and a random 64-bit nonce), and a save goes
 *   1. write x.new.safetensors, then x.new.optim.safetensors (each
 *      atomically and fsync'd); on failure remove both and stop: the
 *      current pair was not touched;
 *   2. move the current complete pair to x.prev.* (weights, then optimizer);
 *   3. move the new pair into place (optimizer, then weights); sync the
 *      directory.
 * At every moment between these renames some pairing of the four names
 * x, x.optim, x.prev, x.prev.optim holds one complete pair with equal ids,
 * so a crash anywhere leaves something to resume from, and --resume picks
 * the first complete one in a fixed order (the pair as named, the two
 * mixed pairings an interrupted rotation leaves, the previous pair) with a
 * note when it is not the pair as named. A random id rather than the step
 * alone tells apart two saves at the same step (a rerun into the same
 * path). The previous pair is deleted before a save writes only when the
 * current pair is complete, so at most two pairs are on disk (the current
 * and the new while writing; the current and the previous after), and a
 * failed save leaves the current pair as named. Rank 0 alone writes and
 * renames; the other ranks take part in the writers' gathers, and rank 0's
 * outcome is broadcast so every rank returns the same error. Layer: train. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "train/internal.h"

static const char *EXT = ".safetensors";

/* `w` with `tag` before the extension (x.safetensors -> x.TAG.safetensors),
 * or appended (ckpt -> ckpt.TAG) without one. False when it does not fit. */
static bool tagged(const char *w, const char *tag, char *out) {
  size_t n = strlen(w), k = strlen(EXT);
  int len = n > k && !strcmp(w + n - k, EXT)
                ? snprintf(out, SLAPO__CKPT_PATH, "%.*s.%s%s", (int)(n - k), w, tag, EXT)
                : snprintf(out, SLAPO__CKPT_PATH, "%s.%s", w, tag);
  return len >= 0 && len < SLAPO__CKPT_PATH;
}

/* The optimizer file beside weights `w`: x.safetensors -> x.optim.safetensors. */
static bool optim_of(const char *w, char *out) {
  size_t n = strlen(w), k = strlen(EXT);
  int len = n > k && !strcmp(w + n - k, EXT)
                ? snprintf(out, SLAPO__CKPT_PATH, "%.*s.optim%s", (int)(n - k), w, EXT)
                : snprintf(out, SLAPO__CKPT_PATH, "%s.optim%s", w, EXT);
  return len >= 0 && len < SLAPO__CKPT_PATH;
}

slapo_status slapo__ckpt_paths_of(const char *weights, slapo__ckpt_paths *p) {
  bool ok = strlen(weights) < sizeof p->w;
  if (ok) snprintf(p->w, sizeof p->w, "%s", weights);
  ok = ok && optim_of(p->w, p->o) && tagged(p->w, "prev", p->prev_w) &&
       optim_of(p->prev_w, p->prev_o) && tagged(p->w, "new", p->new_w) &&
       optim_of(p->new_w, p->new_o);
  if (!ok)
    return slapo_error(SLAPO_INVALID_ARG, "train: checkpoint path %.200s... is too long (the "
                       "limit is %d bytes with the .prev.optim tag)", weights,
                       SLAPO__CKPT_PATH - 32);
  return SLAPO_OK;
}

slapo_status slapo__ckpt_check_save(const char *weights) {
  const char *tail = ".optim.safetensors";
  size_t n = strlen(weights), k = strlen(tail);
  /* x.optim.safetensors is the optimizer file of a checkpoint x: weights
   * saved there would overwrite that checkpoint's optimizer state. */
  if (n >= k && !strcmp(weights + n - k, tail))
    return slapo_error(SLAPO_INVALID_ARG, "train: --save %s ends in %s, the name of a "
                       "checkpoint's optimizer file; give the weights' name (%.*s.safetensors), "
                       "and the optimizer state is saved beside it",
                       weights, tail, (int)(n - k), weights);
  slapo__ckpt_paths *p = slapo_malloc(sizeof *p);
  if (!p) return slapo_error(SLAPO_NOMEM, "train: out of memory");
  slapo_status s = slapo__ckpt_paths_of(weights, p);
  const char *all[6] = {p->w, p->o, p->prev_w, p->prev_o, p->new_w, p->new_o};
  for (int i = 0; s == SLAPO_OK && i < 6; i++)
    s = slapo_check_write_target(all[i], "train: checkpoint");
  slapo_free(p);
  return s;
}

/* ---- what a file's header says ---- */

/* One file of a pair as its header describes it. */
typedef struct saved {
  bool present;       /* read: the fields below are set */
  int64_t step;       /* -1: no step metadata (a weights file from elsewhere) */
  char pair[64];      /* "" when the file has no slapo_pair */
  slapo_status error; /* why not present */
  char msg[600];
} saved;

/* Reads the header of `path` (an optimizer file when `optim`). */
static void read_saved(const char *path, bool optim, saved *out) {
  *out = (saved){.step = -1};
  slapo_safetensors *f;
  out->error = slapo_safetensors_read_header(path, &f);
  if (out->error != SLAPO_OK) {
    snprintf(out->msg, sizeof out->msg, "%s", slapo_last_error());
    return;
  }
  const char *st = slapo_safetensors_metadata(f, optim ? "step" : "slapo_step");
  const char *pair = slapo_safetensors_metadata(f, "slapo_pair");
  char *end = NULL;
  long long v = st ? strtoll(st, &end, 10) : -1;
  out->step = st && st[0] && !*end && v >= 0 ? v : -1;
  if (pair) snprintf(out->pair, sizeof out->pair, "%s", pair);
  out->present = true;
  slapo_safetensors_free(f);
}

/* Whether weights w and optimizer state o come from one save: the same
 * pair id, or, when neither has one (files of older versions), the same
 * step (a weights file without a step, from another program, pairs with
 * any optimizer file, as before pair ids). */
static bool same_save(const saved *w, const saved *o) {
  if (!w->present || !o->present) return false;
  if (w->pair[0] || o->pair[0]) return !strcmp(w->pair, o->pair);
  return w->step < 0 || w->step == o->step;
}

/* The four files of a checkpoint, read. */
typedef struct pair_state {
  saved w[2], o[2]; /* [0]: as named, [1]: previous */
} pair_state;

/* The pairings in the order they are tried: {weights, optimizer}, 0 the
 * name given, 1 the previous pair. */
static const int ORDER[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};

static void read_state(const slapo__ckpt_paths *p, pair_state *st) {
  read_saved(p->w, false, &st->w[0]);
  read_saved(p->o, true, &st->o[0]);
  read_saved(p->prev_w, false, &st->w[1]);
  read_saved(p->prev_o, true, &st->o[1]);
}

/* Index into ORDER of the first complete pairing; -1 when none is. */
static int first_complete(const pair_state *st) {
  for (int k = 0; k < 4; k++)
    if (same_save(&st->w[ORDER[k][0]], &st->o[ORDER[k][1]])) return k;
  return -1;
}

/* ---- resume ---- */

/* Why the pair as named is not complete, into buf; also the status and
 * message to fail with when nothing else is. */
static slapo_status named_pair_problem(const slapo__ckpt_paths *p, const pair_state *st,
                                       char *buf, size_t cap) {
  const saved *w = &st->w[0], *o = &st->o[0];
  if (!w->present) {
    snprintf(buf, cap, "%s", w->msg);
    return w->error;
  }
  if (!o->present) {
    snprintf(buf, cap, "%s", o->msg);
    return o->error;
  }
  if (w->step != o->step)
    snprintf(buf, cap, "train: %s holds the weights of step %lld but %s the optimizer state of "
             "step %lld: they come from different saves (one interrupted?)", p->w,
             (long long)w->step, p->o, (long long)o->step);
  else
    snprintf(buf, cap, "train: %s and %s both hold step %lld but of different saves (pair ids "
             "%s and %s; one interrupted?)", p->w, p->o, (long long)w->step,
             w->pair[0] ? w->pair : "none", o->pair[0] ? o->pair : "none");
  return SLAPO_INVALID_ARG;
}

slapo_status slapo__ckpt_pick(const char *weights, slapo__ckpt_choice *out) {
  slapo__ckpt_paths *p = slapo_malloc(sizeof *p);
  pair_state *st = slapo_malloc(sizeof *st);
  slapo_status s = p && st ? slapo__ckpt_paths_of(weights, p)
                           : slapo_error(SLAPO_NOMEM, "train: out of memory");
  if (s == SLAPO_OK) {
    read_state(p, st);
    int k = first_complete(st);
    out->fallback = k > 0;
    out->why[0] = '\0';
    slapo_status problem = k == 0 ? SLAPO_OK : named_pair_problem(p, st, out->why,
                                                                  sizeof out->why);
    if (k < 0) {
      /* A missing or malformed file's own message says it; files of
       * different saves get the way out, and the kept pair is named when
       * there is one that is no help either. */
      char more[SLAPO__CKPT_PATH * 2 + 64] = "";
      if (st->w[1].present || st->o[1].present)
        snprintf(more, sizeof more, " (the previous pair, %s and %s, is incomplete too)",
                 p->prev_w, p->prev_o);
      s = slapo_error(problem, "%s%s%s", out->why,
                      problem == SLAPO_INVALID_ARG ? "; resume from a pair saved together" : "",
                      more);
    } else {
      snprintf(out->w, sizeof out->w, "%s", ORDER[k][0] ? p->prev_w : p->w);
      snprintf(out->o, sizeof out->o, "%s", ORDER[k][1] ? p->prev_o : p->o);
    }
  }
  slapo_free(p);
  slapo_free(st);
  return s;
}

/* ---- save ---- */

/* A 64-bit id no other save shares: the kernel's random bytes, or the
 * clock and the process id where getrandom is unavailable (old kernels,
 * seccomp sandboxes). */
static uint64_t nonce(void) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x) return x;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  static uint64_t counter;
  x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40) ^
      ++counter * 0x9E3779B97F4A7C15u;
  return x;
}

/* Makes the renames durable (best effort, as slapo_write_atomic's). */
static void sync_dir_of(const char *path) {
  char dir[SLAPO__CKPT_PATH];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

/* rename(2) with a message naming both paths. */
static slapo_status move(const char *from, const char *to) {
  if (rename(from, to) != 0)
    return slapo_error(SLAPO_IO, "train: checkpoint: cannot rename %s to %s: %s", from, to,
                       strerror(errno));
  return SLAPO_OK;
}

/* What a failed save leaves to resume from, for its message. */
static void kept_pair(const slapo__ckpt_paths *p, const pair_state *st, int k, char *buf,
                      size_t cap) {
  if (k < 0) {
    snprintf(buf, cap, "there was no complete checkpoint before it");
    return;
  }
  /* The optimizer file's step: a weights file from elsewhere has none. */
  const saved *o = &st->o[ORDER[k][1]];
  if (k == 0)
    snprintf(buf, cap, "the previous checkpoint (step %lld) is kept as it was: --resume %s",
             (long long)o->step, p->w);
  else
    snprintf(buf, cap, "the last complete pair (step %lld, %s and %s) is kept: --resume %s "
             "finds it", (long long)o->step, ORDER[k][0] ? p->prev_w : p->w,
             ORDER[k][1] ? p->prev_o : p->o, p->w);
}

/* Step 2 of the protocol: the last complete pairing k moves to the .prev
 * names (weights first, so the pair stays complete between the renames:
 * (x.prev, x.optim) is a pairing --resume tries); what is already there
 * stays. */
static slapo_status rotate(const slapo__ckpt_paths *p, int k) {
  if (k < 0) return SLAPO_OK;
  if (ORDER[k][0] == 0) SLAPO_TRY(move(p->w, p->prev_w));
  if (ORDER[k][1] == 0) SLAPO_TRY(move(p->o, p->prev_o));
  return SLAPO_OK;
}

/* Rank 0's part after the writes: the new pair is complete on disk. */
static slapo_status commit(const slapo__ckpt_paths *p, int k) {
  SLAPO_TRY(rotate(p, k));
  /* Optimizer first: until the weights arrive, (x, x.optim) is no pair
   * and --resume takes the .prev pair. */
  SLAPO_TRY(move(p->new_o, p->o));
  SLAPO_TRY(move(p->new_w, p->w));
  sync_dir_of(p->w);
  return SLAPO_OK;
}

/* The errno behind a failed write, by name, for the causes a full disk
 * gives (the message carries only strerror's text). */
static const char *space_cause(const char *msg) {
  if (strstr(msg, strerror(ENOSPC))) return " [ENOSPC: the file system is full]";
  if (strstr(msg, strerror(EDQUOT))) return " [EDQUOT: the disk quota is used up]";
  if (strstr(msg, strerror(EFBIG))) return " [EFBIG: past the file-size limit, ulimit -f]";
  return "";
}

/* Step 1, on every rank: both files to the .new names. Every rank runs
 * both writers even when rank 0's first write failed: their gathers are
 * collectives the other ranks are already in. On failure rank 0 removes
 * what was written and says which file failed and what is kept. */
static slapo_status write_new(const slapo__ckpt_paths *p, const pair_state *st, int k,
                              int64_t step, slapo__ckpt_write_fn write, void *ud) {
  char pair[64];
  snprintf(pair, sizeof pair, "%lld-%016llx", (long long)step, (unsigned long long)nonce());
  char cause[1200];
  int file = 0;
  slapo_status s = write(0, p->new_w, pair, ud);
  if (s != SLAPO_OK) snprintf(cause, sizeof cause, "%s", slapo_last_error());
  if (s == SLAPO_OK || slapo_dist_size(SLAPO_GROUP_WORLD) > 1) {
    slapo_status s1 = write(1, p->new_o, pair, ud);
    if (s == SLAPO_OK && s1 != SLAPO_OK) {
      s = s1, file = 1;
      snprintf(cause, sizeof cause, "%s", slapo_last_error());
    }
  }
  if (s == SLAPO_OK || slapo_dist_rank(SLAPO_GROUP_WORLD) != 0) return s;
  char kept[SLAPO__CKPT_PATH * 3 + 128];
  (void)unlink(p->new_w);
  (void)unlink(p->new_o);
  kept_pair(p, st, k, kept, sizeof kept);
  return slapo_error(s, "train: saving checkpoint %s at step %lld failed writing its %s (%s): "
                     "%s%s; %s", p->w, (long long)step, file ? "optimizer state" : "weights",
                     file ? p->o : p->w, cause, space_cause(cause), kept);
}

/* Rank 0's outcome (status and message) to every rank, so all of them
 * fail together with the cause rather than the others waiting in their
 * next collective. A rank whose own part (a gather) failed keeps its own
 * error. */
static slapo_status share_outcome(slapo_status own) {
  if (slapo_dist_size(SLAPO_GROUP_WORLD) == 1) return own;
  struct {
    int32_t status;
    char msg[2048];
  } o = {0};
  bool root = slapo_dist_rank(SLAPO_GROUP_WORLD) == 0;
  if (root && own != SLAPO_OK) {
    o.status = (int32_t)own;
    snprintf(o.msg, sizeof o.msg, "%s", slapo_last_error());
  }
  char mine[2048] = "";
  if (own != SLAPO_OK) snprintf(mine, sizeof mine, "%s", slapo_last_error());
  slapo_status b = slapo_dist_broadcast(SLAPO_GROUP_WORLD, &o, sizeof o, 0);
  if (own != SLAPO_OK) return slapo_error(own, "%s", mine);
  if (b != SLAPO_OK) return b;
  return o.status ? slapo_error((slapo_status)o.status, "%s", o.msg) : SLAPO_OK;
}

slapo_status slapo__ckpt_save(const char *weights, int64_t step, slapo__ckpt_write_fn write,
                              void *ud) {
  slapo__ckpt_paths *p = slapo_malloc(sizeof *p);
  pair_state *st = slapo_malloc(sizeof *st);
  slapo_status s = p && st ? slapo__ckpt_paths_of(weights, p)
                           : slapo_error(SLAPO_NOMEM, "train: out of memory");
  bool writer = slapo_dist_rank(SLAPO_GROUP_WORLD) == 0;
  int k = -1;
  if (s == SLAPO_OK && writer) {
    read_state(p, st);
    k = first_complete(st);
    /* The current pair is complete: the previous one is no longer needed
     * while the new one is written, and freeing its space first keeps at
     * most two pairs on disk. */
    if (k == 0) {
      (void)unlink(p->prev_w);
      (void)unlink(p->prev_o);
    }
  }
  if (s == SLAPO_OK) s = write_new(p, st, k, step, write, ud);
  if (s == SLAPO_OK && writer) s = commit(p, k);
  slapo_free(p);
  slapo_free(st);
  return share_outcome(s);
}
