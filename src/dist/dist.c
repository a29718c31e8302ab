/* dist/dist.c - the distributed runtime: MPI start-up by need, the world /
 * tensor-parallel / data-parallel groups (MPI_Comm_split), and host-side
 * collectives. Without a launcher nothing here touches MPI: every group has
 * one rank and collectives are copies. Layer: dist. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/internal.h"

static struct {
  bool inited;   /* groups formed                               */
  bool mpi;      /* MPI started by us                           */
  int tp, pp;    /* the tp and pp the groups were formed with   */
  int size[SLAPO_GROUP_COUNT], rank[SLAPO_GROUP_COUNT];
  MPI_Comm comm[SLAPO_GROUP_COUNT];
} g_dist = {.size = {1, 1, 1, 1}};

/* The communication timeout: set by slapo_dist_set_timeout (kept across
 * finalize), else $SLAPO_COMM_TIMEOUT, else the default. `stalled` holds
 * the message of the first collective that timed out: its request is still
 * pending on a buffer MPI may yet write, and its peers are lost, so every
 * later collective fails at once with it and finalize skips MPI_Finalize. */
static struct {
  double seconds;
  bool set;
  char stalled[512];
} g_timeout = {SLAPO_DIST_TIMEOUT_DEFAULT_S, false, ""};

static slapo_status shm_setup(void);
static void shm_free(bool collective);

/* Launched by mpirun / srun / a PMI launcher? */
static bool launched(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    if (getenv(vars[i])) return true;
  return false;
}

static slapo_status mpi_error(int rc, const char *call) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return slapo_error(SLAPO_STATE, "%s failed: %s", call, msg);
}

#define MPI_TRY(call, name)                      \
  do {                                           \
    int rc_ = (call);                            \
    if (rc_ != MPI_SUCCESS) return mpi_error(rc_, name); \
  } while (0)

/* Open MPI 4.1 algorithm choices, from measurements on 2 local ranks
 * (docs/PERFORMANCE.md, 2026-12-04): the nonblocking all-reduce that every
 * slapo collective but the shared-memory gradient one uses (coll/libnbc)
 * took 1.4-1.7x as long as libnbc's ring from 1 MB to 64 MB by default,
 * and the ring matched the blocking MPI_Allreduce. Applied through Open
 * MPI's environment before MPI_Init, each only where the user set no value
 * of their own, so `mpirun -x OMPI_MCA_...` or an exported one wins. */
static const struct {
  const char *name, *value;
} k_mca_defaults[] = {
    {"OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1"}, /* ring */
};

static slapo_status set_mca_defaults(void) {
  for (size_t i = 0; i < sizeof k_mca_defaults / sizeof *k_mca_defaults; i++)
    if (setenv(k_mca_defaults[i].name, k_mca_defaults[i].value, 0) != 0)
      return slapo_error(SLAPO_NOMEM, "cannot set %s in the environment", k_mca_defaults[i].name);
  return SLAPO_OK;
}

/* $SLAPO_COMM_TIMEOUT, unless slapo_dist_set_timeout chose already. */
static slapo_status timeout_from_env(void) {
  const char *v = getenv("SLAPO_COMM_TIMEOUT");
  if (g_timeout.set || !v || !*v) return SLAPO_OK;
  char *end;
  double s = strtod(v, &end);
  if (*end || !(s > 0) || !isfinite(s))
    return slapo_error(SLAPO_INVALID_ARG, "SLAPO_COMM_TIMEOUT='%s': expected seconds > 0", v);
  g_timeout.seconds = s;
  return SLAPO_OK;
}

static slapo_status start_mpi(void) {
  int started = 0, provided = 0;
  MPI_Initialized(&started);
  if (!started) {
    SLAPO_TRY(set_mca_defaults());
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init_thread");
    g_dist.mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED)
    return slapo_error(SLAPO_STATE, "MPI provides thread level %d; slapo needs "
                       "MPI_THREAD_FUNNELED (OpenMP threads, MPI calls from the main thread)",
                       provided);
  /* Errors come back as codes (turned into slapo statuses) instead of
   * aborting the job from inside the library. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_dist.comm[SLAPO_GROUP_WORLD] = MPI_COMM_WORLD; /* errors name the rank from here on */
  MPI_Comm_rank(MPI_COMM_WORLD, &g_dist.rank[SLAPO_GROUP_WORLD]);
  return SLAPO_OK;
}

static slapo_status form_groups(int tp, int pp) {
  int world, rank;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % (tp * pp)) {
    if (pp == 1)
      return slapo_error(SLAPO_INVALID_ARG, "--tp %d does not divide the world size %d (mpirun "
                         "-np N needs N = tp x dp)", tp, world);
    return slapo_error(SLAPO_INVALID_ARG, "--pp %d x --tp %d = %d does not divide the world "
                       "size %d (mpirun -np N needs N = pp x dp x tp)", pp, tp, pp * tp, world);
  }
  int block = world / pp; /* dp x tp: the ranks of one stage */
  int s = rank / block, d = (rank % block) / tp, t = rank % tp;
  g_dist.comm[SLAPO_GROUP_WORLD] = MPI_COMM_WORLD;
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, rank / tp, t, &g_dist.comm[SLAPO_GROUP_TP]),
          "MPI_Comm_split (tensor-parallel groups)");
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, s * tp + t, d, &g_dist.comm[SLAPO_GROUP_DP]),
          "MPI_Comm_split (data-parallel groups)");
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, rank % block, s, &g_dist.comm[SLAPO_GROUP_PP]),
          "MPI_Comm_split (pipeline groups)");
  bool end = s == 0 || s == pp - 1;
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, end ? rank % block : MPI_UNDEFINED, s,
                         &g_dist.comm[SLAPO_GROUP_EMBED]),
          "MPI_Comm_split (embedding groups)");
  for (int i = 0; i < SLAPO_GROUP_COUNT; i++) {
    if (g_dist.comm[i] == MPI_COMM_NULL) { /* a middle stage: not in the group */
      g_dist.size[i] = 0, g_dist.rank[i] = -1;
      continue;
    }
    MPI_Comm_set_errhandler(g_dist.comm[i], MPI_ERRORS_RETURN);
    MPI_Comm_size(g_dist.comm[i], &g_dist.size[i]);
    MPI_Comm_rank(g_dist.comm[i], &g_dist.rank[i]);
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_init(int tp) { return slapo_dist_init_pp(tp, 0); }

slapo_status slapo_dist_init_pp(int tp, int pp) {
  if (tp < 0) return slapo_error(SLAPO_INVALID_ARG, "--tp must be at least 1, got %d", tp);
  if (pp < 0) return slapo_error(SLAPO_INVALID_ARG, "--pp must be at least 1, got %d", pp);
  if (g_dist.inited) {
    if ((tp == g_dist.tp || tp == 0) && (pp == g_dist.pp || pp == 0)) return SLAPO_OK;
    return slapo_error(SLAPO_STATE, "distributed groups already formed with tp %d, pp %d "
                       "(asked: tp %d, pp %d)", g_dist.tp, g_dist.pp, tp, pp);
  }
  if (pp == 0) pp = 1;
  SLAPO_TRY(slapo_dist_register_ops());
  SLAPO_TRY(timeout_from_env());
  if (!launched()) {
    int need = (tp > 1 ? tp : 1) * pp;
    if (need > 1)
      return slapo_error(SLAPO_INVALID_ARG, "--tp %d x --pp %d needs %d processes; this is one "
                         "process (start it with mpirun -np %d)", tp > 1 ? tp : 1, pp, need,
                         need);
    g_dist.tp = g_dist.pp = 1;
    g_dist.inited = true;
    return SLAPO_OK;
  }
  SLAPO_TRY(start_mpi());
  if (tp == 0) {
    MPI_Comm_size(MPI_COMM_WORLD, &tp);
    tp /= pp;
    if (tp < 1) tp = 1;
  }
  slapo_status s = form_groups(tp, pp);
  if (s == SLAPO_OK) s = shm_setup();
  if (s != SLAPO_OK) return s;
  g_dist.tp = tp;
  g_dist.pp = pp;
  g_dist.inited = true;
  return SLAPO_OK;
}

void slapo_dist_finalize(void) {
  shm_free(!g_timeout.stalled[0]);
  for (int i = SLAPO_GROUP_TP; i < SLAPO_GROUP_COUNT; i++) /* the groups formed */
    if (g_dist.comm[i] && g_dist.comm[i] != MPI_COMM_NULL) MPI_Comm_free(&g_dist.comm[i]);
  /* MPI_Finalize waits for every rank (a fence): after a timeout, for a
   * peer that may never come. The job then ends as a rank that exits
   * without finalizing does: mpirun stops the others. */
  if (g_dist.mpi && !g_timeout.stalled[0]) MPI_Finalize();
  g_timeout.stalled[0] = '\0';
  memset(&g_dist, 0, sizeof g_dist);
  for (int i = 0; i < SLAPO_GROUP_COUNT; i++) g_dist.size[i] = 1;
}

bool slapo_dist_active(void) { return g_dist.comm[SLAPO_GROUP_WORLD] != 0; }

int slapo_dist_size(slapo_group g) { return g < SLAPO_GROUP_COUNT ? g_dist.size[g] : 1; }
int slapo_dist_rank(slapo_group g) { return g < SLAPO_GROUP_COUNT ? g_dist.rank[g] : 0; }

void slapo_dist_describe(char *buf, size_t cap) {
  if (g_dist.size[SLAPO_GROUP_PP] > 1)
    snprintf(buf, cap, "world %d = pp %d x dp %d x tp %d; rank %d: stage %d, dp rank %d, tp "
             "rank %d", g_dist.size[0], g_dist.size[3], g_dist.size[2], g_dist.size[1],
             g_dist.rank[0], g_dist.rank[3], g_dist.rank[2], g_dist.rank[1]);
  else
    snprintf(buf, cap, "world %d = tp %d x dp %d; rank %d: tp rank %d, dp rank %d",
             g_dist.size[0], g_dist.size[1], g_dist.size[2], g_dist.rank[0], g_dist.rank[1],
             g_dist.rank[2]);
}

_Noreturn void slapo_dist_abort(int code) {
  if (slapo_dist_active()) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

slapo_status slapo_dist_set_timeout(double seconds) {
  if (!(seconds > 0) || !isfinite(seconds))
    return slapo_error(SLAPO_INVALID_ARG, "communication timeout %g s: expected seconds > 0",
                       seconds);
  g_timeout.seconds = seconds;
  g_timeout.set = true;
  return SLAPO_OK;
}

double slapo_dist_timeout(void) { return g_timeout.seconds; }

MPI_Comm slapo__dist_comm(int g) {
  return g >= 0 && g < SLAPO_GROUP_COUNT && slapo_dist_active() ? g_dist.comm[g]
                                                                  : MPI_COMM_NULL;
}

/* ---- waiting with a deadline ---- */

static const char *group_name(int g) {
  return g == SLAPO_GROUP_TP   ? "tensor-parallel"
         : g == SLAPO_GROUP_DP ? "data-parallel"
         : g == SLAPO_GROUP_PP ? "pipeline"
                               : "world";
}

/* ", "-separated world ranks of group g other than this one (the ranks a
 * stalled collective waits on; which of them is lost MPI cannot say). */
static void peer_ranks(int g, char *buf, size_t cap) {
  MPI_Group world, group;
  int n = slapo_dist_size((slapo_group)g), me = slapo_dist_rank((slapo_group)g), used = 0;
  buf[0] = '\0';
  if (MPI_Comm_group(MPI_COMM_WORLD, &world) != MPI_SUCCESS) return;
  if (MPI_Comm_group(g_dist.comm[g], &group) != MPI_SUCCESS) {
    MPI_Group_free(&world);
    return;
  }
  for (int r = 0; r < n && used < (int)cap; r++) {
    int w = r;
    if (r == me || MPI_Group_translate_ranks(group, 1, &r, world, &w) != MPI_SUCCESS) continue;
    if (used > (int)cap - 16) { /* room left for ", ..." only */
      snprintf(buf + used, cap - (size_t)used, ", ...");
      break;
    }
    used += snprintf(buf + used, cap - (size_t)used, "%s%d", used ? ", " : "", w);
  }
  MPI_Group_free(&group);
  MPI_Group_free(&world);
}

static slapo_status stalled(int g, const char *what, double waited_s) {
  char peers[160];
  peer_ranks(g, peers, sizeof peers);
  snprintf(g_timeout.stalled, sizeof g_timeout.stalled,
           "no progress in %s on the %s group for %.0f s (peer ranks %s); a peer is lost, "
           "stopped or far slower (--comm-timeout, SLAPO_COMM_TIMEOUT)",
           what, group_name(g), waited_s, peers);
  return slapo_error(SLAPO_COMM, "%s", g_timeout.stalled);
}

slapo_status slapo__dist_usable(void) {
  if (!g_timeout.stalled[0]) return SLAPO_OK;
  return slapo_error(SLAPO_COMM, "an earlier collective timed out: %s", g_timeout.stalled);
}

/* Spin on MPI_Test for 1 s, as MPI's blocking calls do (Open MPI
 * progresses a nonblocking collective only inside MPI calls, and a rank
 * that sleeps on a loaded machine waits for a time slice to come back:
 * TP 2 of `tiny` ran at 0.29x its old speed with a 2 ms spin, 0.76x with
 * 100 ms; docs/PERFORMANCE.md),
 * then sleep between tests, doubling up to SLEEP_MAX_NS: a rank waiting
 * longer for a slow or lost one leaves its core to others instead of
 * spinning at 100 % until the timeout. */
enum { SPIN_NS = 1000000000, SLEEP_MIN_NS = 20000, SLEEP_MAX_NS = 1000000 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

slapo_status slapo__dist_wait(int rc, MPI_Request *req, int g, const char *what) {
  if (rc != MPI_SUCCESS) return mpi_error(rc, what);
  double t0 = now_s();
  long sleep_ns = SLEEP_MIN_NS;
  for (;;) {
    int done = 0;
    rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_error(rc, what);
    if (done) return SLAPO_OK;
    double waited = now_s() - t0;
    if (waited >= g_timeout.seconds) return stalled(g, what, waited);
    if (waited * 1e9 < SPIN_NS) continue;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    sleep_ns = sleep_ns * 2 > SLEEP_MAX_NS ? SLEEP_MAX_NS : sleep_ns * 2;
  }
}

/* ---- point-to-point between pipeline stages ---- */

static slapo_status p2p_check(const slapo_tensor *t, const char *dir, int k) {
  if (!t || !t->storage || !slapo_tensor_is_contiguous(t))
    return slapo_error(SLAPO_INVALID_ARG, "pp_exchange: %s tensor %d is NULL, meta or strided",
                       dir, k);
  if (slapo_tensor_nbytes(t) > (size_t)INT32_MAX)
    return slapo_error(SLAPO_INVALID_ARG, "pp_exchange: %s tensor %d holds %zu bytes (at most "
                       "2 GiB a message)", dir, k, slapo_tensor_nbytes(t));
  return SLAPO_OK;
}

slapo_status slapo_dist_pp_exchange(int to, int n_send, const slapo_tensor *const *send,
                                    int from, int n_recv, slapo_tensor *const *recv, int tag) {
  int n = slapo_dist_size(SLAPO_GROUP_PP);
  if (to < -1 || to >= n || from < -1 || from >= n)
    return slapo_error(SLAPO_INVALID_ARG, "pp_exchange: ranks %d, %d in a pipeline of %d", to,
                       from, n);
  if (to < 0) n_send = 0;
  if (from < 0) n_recv = 0;
  for (int k = 0; k < n_send; k++) SLAPO_TRY(p2p_check(send[k], "send", k));
  for (int k = 0; k < n_recv; k++) SLAPO_TRY(p2p_check(recv[k], "receive", k));
  MPI_Comm c = slapo__dist_comm(SLAPO_GROUP_PP);
  if (c == MPI_COMM_NULL || n_send + n_recv == 0) return SLAPO_OK;
  SLAPO_TRY(slapo__dist_usable());
  MPI_Request *req = slapo_calloc((size_t)(n_send + n_recv), sizeof *req);
  if (!req) return slapo_error(SLAPO_NOMEM, "pp_exchange: out of memory");
  slapo_status s = SLAPO_OK;
  int posted = 0, recvs = 0;
  /* Receives first: a message that arrives finds its buffer. */
  for (int k = 0; k < n_recv && s == SLAPO_OK; k++) {
    int rc = MPI_Irecv(slapo_tensor_data(recv[k]), (int)slapo_tensor_nbytes(recv[k]), MPI_BYTE,
                       from, tag + k, c, &req[posted]);
    if (rc != MPI_SUCCESS) s = mpi_error(rc, "MPI_Irecv (pipeline)");
    else posted++, recvs++;
  }
  for (int k = 0; k < n_send && s == SLAPO_OK; k++) {
    int rc = MPI_Isend(slapo_tensor_data(send[k]), (int)slapo_tensor_nbytes(send[k]), MPI_BYTE,
                       to, tag + k, c, &req[posted]);
    if (rc != MPI_SUCCESS) s = mpi_error(rc, "MPI_Isend (pipeline)");
    else posted++;
  }
  /* Wait for every posted request, even after a failure: MPI may still
   * write into the buffers of a pending receive. */
  for (int k = 0; k < posted; k++) {
    slapo_status w = slapo__dist_wait(MPI_SUCCESS, &req[k], SLAPO_GROUP_PP,
                                      k < recvs ? "MPI_Irecv (pipeline)" : "MPI_Isend (pipeline)");
    if (w != SLAPO_OK && s == SLAPO_OK) s = w;
    if (w == SLAPO_COMM) break; /* the request stays pending; the runtime is unusable */
  }
  slapo_free(req);
  return s;
}

/* ---- host-side collectives ---- */

/* MPI counts are int: large buffers go in pieces of at most 1 Gi elements. */
#define CHUNK ((int64_t)1 << 30)

static slapo_status reduce_sum(slapo_group g, void *buf, int64_t n, MPI_Datatype t, size_t el,
                               const char *what) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  SLAPO_TRY(slapo__dist_usable());
  for (int64_t i = 0; i < n; i += CHUNK) {
    int k = (int)(n - i < CHUNK ? n - i : CHUNK);
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)i * el, k, t, MPI_SUM, c, &req);
    SLAPO_TRY(slapo__dist_wait(rc, &req, g, what));
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_all_reduce_f32(slapo_group g, float *buf, int64_t n) {
  return reduce_sum(g, buf, n, MPI_FLOAT, sizeof(float), "MPI_Iallreduce (f32 sum)");
}

slapo_status slapo_dist_all_reduce_f64(slapo_group g, double *buf, int64_t n) {
  return reduce_sum(g, buf, n, MPI_DOUBLE, sizeof(double), "MPI_Iallreduce (f64 sum)");
}

enum { BUCKET_FLOATS = 8 << 20 }; /* 32 MiB */

/* All-reduces the packed bucket and copies the sums back. */
static slapo_status flush_bucket(slapo_group g, float *buf, int64_t used,
                                 slapo_tensor *const *ts, int from, int to) {
  if (used == 0) return SLAPO_OK;
  SLAPO_TRY(slapo_dist_all_reduce_f32(g, buf, used));
  for (int64_t at = 0; from < to; from++) {
    int64_t n = slapo_tensor_numel(ts[from]);
    memcpy(slapo_tensor_data(ts[from]), buf + at, sizeof(float) * (size_t)n);
    at += n;
  }
  return SLAPO_OK;
}

/* Through MPI: each bucket packed into a private buffer, all-reduced, and
 * copied back. */
static slapo_status mpi_all_reduce_tensors(slapo_group g, int n, slapo_tensor *const *ts) {
  float *buf = slapo_malloc(sizeof(float) * BUCKET_FLOATS);
  if (!buf) return slapo_error(SLAPO_NOMEM, "all-reduce: out of memory for a 32 MiB bucket");
  slapo_status s = SLAPO_OK;
  int64_t used = 0;
  int first = 0;
  for (int i = 0; i < n && s == SLAPO_OK; i++) {
    int64_t k = slapo_tensor_numel(ts[i]);
    if (used + k > BUCKET_FLOATS) {
      s = flush_bucket(g, buf, used, ts, first, i);
      used = 0, first = i;
    }
    if (s != SLAPO_OK) break;
    if (k > BUCKET_FLOATS) { /* alone, in place */
      s = slapo_dist_all_reduce_f32(g, slapo_tensor_data(ts[i]), k);
      first = i + 1;
      continue;
    }
    memcpy(buf + used, slapo_tensor_data(ts[i]), sizeof(float) * (size_t)k);
    used += k;
  }
  if (s == SLAPO_OK) s = flush_bucket(g, buf, used, ts, first, n);
  slapo_free(buf);
  return s;
}

/* ---- the gradient all-reduce through shared memory ---- */

/* Ranks of one node all-reduce the gradients through an MPI-3 shared
 * window instead of messages: each rank packs a bucket of its gradients
 * straight into its own segment (the copy the MPI path makes into a
 * private buffer anyway), then, after a barrier, sums its 1/p slice of
 * the bucket over every rank's segment in place, and after a second
 * barrier copies each slice back from its owner's segment. Per bucket a
 * rank moves about 1.5 bucket sizes beyond the packing and unpacking, at
 * memory speed with no protocol; Open MPI's all-reduce over shared memory
 * was 12x a memcpy here (docs/PERFORMANCE.md). Each element is summed
 * by one rank in rank order, so every rank gets the same bits. Two
 * buckets per segment alternate, so a rank may pack the next while slower
 * peers still read the last: a rank gets to reuse a bucket only after the
 * peers passed the first barrier of the bucket in between, which they
 * reach only after reading. */
enum { SHM_BUCKET_FLOATS = 4 << 20 }; /* 16 MiB, two a rank */

static struct {
  bool ready;      /* the window exists (the DP group is on one node)   */
  MPI_Comm node;   /* the DP group, as its shared-memory communicator   */
  MPI_Win win;
  float **seg;     /* [p] every rank's segment, mapped here             */
  int p, r, turn;  /* ranks, this rank, the bucket used last            */
} g_shm;

/* Forms the window when every rank of the data-parallel group shares this
 * node (else the MPI path is used). Collective over the group. */
static slapo_status shm_setup(void) {
  MPI_Comm dp = g_dist.comm[SLAPO_GROUP_DP], node;
  if (g_dist.size[SLAPO_GROUP_DP] == 1) return SLAPO_OK;
  MPI_TRY(MPI_Comm_split_type(dp, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type (data-parallel group)");
  int p;
  MPI_Comm_size(node, &p);
  /* The split's pieces are nodes: one of full size means one node for all. */
  if (p != g_dist.size[SLAPO_GROUP_DP]) {
    MPI_Comm_free(&node);
    return SLAPO_OK;
  }
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  float *mine;
  int rc = MPI_Win_allocate_shared((MPI_Aint)(2 * SHM_BUCKET_FLOATS * sizeof(float)),
                                   sizeof(float), MPI_INFO_NULL, node, &mine, &g_shm.win);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&node);
    return mpi_error(rc, "MPI_Win_allocate_shared (gradient buckets)");
  }
  g_shm.seg = slapo_calloc((size_t)p, sizeof *g_shm.seg);
  for (int k = 0; g_shm.seg && k < p; k++) {
    MPI_Aint size;
    int disp;
    MPI_Win_shared_query(g_shm.win, k, &size, &disp, &g_shm.seg[k]);
  }
  if (!g_shm.seg) {
    MPI_Win_free(&g_shm.win);
    MPI_Comm_free(&node);
    return slapo_error(SLAPO_NOMEM, "all-reduce: out of memory for %d segment pointers", p);
  }
  /* A passive-target epoch for the window's lifetime: MPI_Win_sync then
   * orders loads and stores around the barriers (MPI-3 §11.5.4.1). */
  MPI_Win_lock_all(MPI_MODE_NOCHECK, g_shm.win);
  MPI_Comm_rank(node, &g_shm.r);
  g_shm.node = node, g_shm.p = p, g_shm.ready = true;
  return SLAPO_OK;
}

/* collective false: after a timeout, where MPI_Win_free (collective) would
 * wait for the lost peer; the window then goes with the process. */
static void shm_free(bool collective) {
  if (!g_shm.ready) return;
  if (collective) {
    MPI_Win_unlock_all(g_shm.win);
    MPI_Win_free(&g_shm.win);
    MPI_Comm_free(&g_shm.node);
  }
  slapo_free(g_shm.seg);
  memset(&g_shm, 0, sizeof g_shm);
}

/* Every rank's stores to the window are visible to every rank after it. */
static slapo_status shm_barrier(void) {
  MPI_Win_sync(g_shm.win);
  MPI_Request req;
  int rc = MPI_Ibarrier(g_shm.node, &req);
  SLAPO_TRY(slapo__dist_wait(rc, &req, SLAPO_GROUP_DP, "MPI_Ibarrier (shared-memory all-reduce)"));
  MPI_Win_sync(g_shm.win);
  return SLAPO_OK;
}

/* Copies floats [at, at + len) of the tensors ts[0..n) taken end to end
 * into buf (to_buf) or from buf back into them. */
static void stream_copy(int n, slapo_tensor *const *ts, int64_t at, int64_t len, float *buf,
                        bool to_buf) {
  int64_t start = 0; /* of ts[i] in the stream */
  for (int i = 0; i < n && len > 0; i++) {
    int64_t k = slapo_tensor_numel(ts[i]);
    if (at < start + k) {
      int64_t off = at - start, m = k - off < len ? k - off : len;
      float *t = (float *)slapo_tensor_data(ts[i]) + off;
      memcpy(to_buf ? buf : t, to_buf ? t : buf, sizeof(float) * (size_t)m);
      buf += m, at += m, len -= m;
    }
    start += k;
  }
}

/* [lo, hi) of rank k's slice of a bucket of `used` floats. */
static void slice(int64_t used, int k, int64_t *lo, int64_t *hi) {
  *lo = used * k / g_shm.p;
  *hi = used * (k + 1) / g_shm.p;
}

static slapo_status shm_bucket(int n, slapo_tensor *const *ts, int64_t at, int64_t used) {
  g_shm.turn ^= 1;
  size_t base = (size_t)g_shm.turn * SHM_BUCKET_FLOATS;
  stream_copy(n, ts, at, used, g_shm.seg[g_shm.r] + base, true);
  SLAPO_TRY(shm_barrier());
  int64_t lo, hi;
  slice(used, g_shm.r, &lo, &hi);
  float *restrict sum = g_shm.seg[g_shm.r] + base;
  for (int k = 0; k < g_shm.p; k++) {
    if (k == g_shm.r) continue;
    const float *restrict x = g_shm.seg[k] + base;
    for (int64_t j = lo; j < hi; j++) sum[j] += x[j];
  }
  SLAPO_TRY(shm_barrier());
  for (int k = 0; k < g_shm.p; k++) {
    slice(used, k, &lo, &hi);
    stream_copy(n, ts, at + lo, hi - lo, g_shm.seg[k] + base + lo, false);
  }
  return SLAPO_OK;
}

static slapo_status shm_all_reduce_tensors(int n, slapo_tensor *const *ts) {
  SLAPO_TRY(slapo__dist_usable());
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += slapo_tensor_numel(ts[i]);
  for (int64_t at = 0; at < total; at += SHM_BUCKET_FLOATS) {
    int64_t used = total - at < SHM_BUCKET_FLOATS ? total - at : SHM_BUCKET_FLOATS;
    SLAPO_TRY(shm_bucket(n, ts, at, used));
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_all_reduce_tensors(slapo_group g, int n, slapo_tensor *const *ts,
                                           double *seconds) {
  if (seconds) *seconds = 0;
  if (slapo_dist_size(g) == 1) return SLAPO_OK;
  double t0 = MPI_Wtime();
  slapo_status s = g == SLAPO_GROUP_DP && g_shm.ready ? shm_all_reduce_tensors(n, ts)
                                                      : mpi_all_reduce_tensors(g, n, ts);
  if (seconds) *seconds = MPI_Wtime() - t0;
  return s;
}

slapo_status slapo_dist_max_f64(slapo_group g, double *buf, int64_t n) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  if (n > CHUNK) return slapo_error(SLAPO_LIMIT, "max of %lld values: at most 2^30", (long long)n);
  SLAPO_TRY(slapo__dist_usable());
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_MAX, c, &req);
  return slapo__dist_wait(rc, &req, g, "MPI_Iallreduce (f64 max)");
}

slapo_status slapo_dist_gather_shards(slapo_group g, const slapo_shard *s,
                                      const slapo_tensor *local, slapo_tensor **full) {
  *full = NULL;
  int64_t shape[SLAPO_MAX_DIMS];
  slapo_shard_local_shape(s, shape);
  if (local->dtype != SLAPO_DTYPE_F32 || !slapo_shape_equal(local->ndim, local->shape, s->ndim, shape))
    return slapo_error(SLAPO_SHAPE, "gather: the piece does not have the shard's local shape");
  slapo_tensor *c = NULL, *all = NULL;
  const slapo_tensor *src = local;
  slapo_status st = SLAPO_OK;
  if (!slapo_tensor_is_contiguous(local)) st = slapo_tensor_contiguous(local, &c), src = c;
  int64_t n = slapo_tensor_numel(src), np = slapo_dist_size(g), all_n = n * np;
  if (st == SLAPO_OK) st = slapo_tensor_new(SLAPO_DTYPE_F32, 1, &all_n, &all);
  int64_t orig[SLAPO_MAX_DIMS];
  slapo_shard_orig_shape(s, orig); /* padding is dropped */
  if (st == SLAPO_OK) st = slapo_tensor_new(SLAPO_DTYPE_F32, s->ndim, orig, full);
  if (st == SLAPO_OK)
    st = slapo_dist_all_gather_f32(g, slapo_tensor_data(src), slapo_tensor_data(all), n);
  if (st == SLAPO_OK) {
    const float *a = slapo_tensor_data(all);
    for (int r = 0; r < np; r++) slapo_shard_place(s, r, a + r * n, *full);
  } else {
    slapo_tensor_free(*full);
    *full = NULL;
  }
  slapo_tensor_free(all);
  slapo_tensor_free(c);
  return st;
}

slapo_status slapo_dist_all_gather_f32(slapo_group g, const float *in, float *out, int64_t n) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) {
    memmove(out, in, (size_t)n * sizeof *in);
    return SLAPO_OK;
  }
  if (n > CHUNK) return slapo_error(SLAPO_LIMIT, "all_gather of %lld floats: at most 2^30 a "
                                    "rank", (long long)n);
  SLAPO_TRY(slapo__dist_usable());
  MPI_Request req;
  int rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c, &req);
  return slapo__dist_wait(rc, &req, g, "MPI_Iallgather (f32)");
}

slapo_status slapo_dist_broadcast(slapo_group g, void *buf, int64_t nbytes, int root) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  SLAPO_TRY(slapo__dist_usable());
  for (int64_t i = 0; i < nbytes; i += CHUNK) {
    int k = (int)(nbytes - i < CHUNK ? nbytes - i : CHUNK);
    MPI_Request req;
    int rc = MPI_Ibcast((char *)buf + i, k, MPI_BYTE, root, c, &req);
    SLAPO_TRY(slapo__dist_wait(rc, &req, g, "MPI_Ibcast"));
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_barrier(slapo_group g) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL) return SLAPO_OK;
  SLAPO_TRY(slapo__dist_usable());
  MPI_Request req;
  int rc = MPI_Ibarrier(c, &req);
  return slapo__dist_wait(rc, &req, g, "MPI_Ibarrier");
}

slapo_status slapo_dist_all_gather_bytes(slapo_group g, const void *in, void *out,
                                         int64_t nbytes) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) {
    memmove(out, in, (size_t)nbytes);
    return SLAPO_OK;
  }
  if (nbytes > CHUNK)
    return slapo_error(SLAPO_LIMIT, "all_gather of %lld bytes: at most 2^30 a rank",
                       (long long)nbytes);
  SLAPO_TRY(slapo__dist_usable());
  MPI_Request req;
  int rc = MPI_Iallgather(in, (int)nbytes, MPI_BYTE, out, (int)nbytes, MPI_BYTE, c, &req);
  return slapo__dist_wait(rc, &req, g, "MPI_Iallgather (records)");
}

/* MPI on the world alone, for slapo_dist_agree before the groups are
 * formed by arguments the ranks may not share. */
slapo_status slapo_dist_start(void) {
  if (!launched() || slapo_dist_active()) return SLAPO_OK;
  SLAPO_TRY(timeout_from_env());
  SLAPO_TRY(start_mpi());
  MPI_Comm_size(MPI_COMM_WORLD, &g_dist.size[SLAPO_GROUP_WORLD]);
  return SLAPO_OK;
}
