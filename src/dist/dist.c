/* dist/dist.c - the distributed runtime: MPI start-up by need, the world /
 * tensor-parallel / data-parallel groups (MPI_Comm_split), and host-side
 * collectives. Without a launcher nothing here touches MPI: every group has
 * one rank and collectives are copies. Layer: dist. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/internal.h"

static struct {
  bool inited;   /* groups formed                               */
  bool mpi;      /* MPI started by us                           */
  int tp;        /* the tp the groups were formed with          */
  int size[SLAPO_GROUP_COUNT], rank[SLAPO_GROUP_COUNT];
  MPI_Comm comm[SLAPO_GROUP_COUNT];
} g_dist = {.size = {1, 1, 1}};

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

static slapo_status start_mpi(void) {
  int started = 0, provided = 0;
  MPI_Initialized(&started);
  if (!started) {
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

static slapo_status form_groups(int tp) {
  int world, rank;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world % tp)
    return slapo_error(SLAPO_INVALID_ARG, "--tp %d does not divide the world size %d (mpirun "
                       "-np N needs N = tp x dp)", tp, world);
  g_dist.comm[SLAPO_GROUP_WORLD] = MPI_COMM_WORLD;
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, rank / tp, rank % tp, &g_dist.comm[SLAPO_GROUP_TP]),
          "MPI_Comm_split (tensor-parallel groups)");
  MPI_TRY(MPI_Comm_split(MPI_COMM_WORLD, rank % tp, rank / tp, &g_dist.comm[SLAPO_GROUP_DP]),
          "MPI_Comm_split (data-parallel groups)");
  for (int i = 0; i < SLAPO_GROUP_COUNT; i++) {
    MPI_Comm_set_errhandler(g_dist.comm[i], MPI_ERRORS_RETURN);
    MPI_Comm_size(g_dist.comm[i], &g_dist.size[i]);
    MPI_Comm_rank(g_dist.comm[i], &g_dist.rank[i]);
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_init(int tp) {
  if (tp < 0) return slapo_error(SLAPO_INVALID_ARG, "--tp must be at least 1, got %d", tp);
  if (g_dist.inited) {
    if (tp == g_dist.tp || tp == 0) return SLAPO_OK;
    return slapo_error(SLAPO_STATE, "distributed groups already formed with tp %d (asked: %d)",
                       g_dist.tp, tp);
  }
  SLAPO_TRY(slapo_dist_register_ops());
  if (!launched()) {
    if (tp > 1)
      return slapo_error(SLAPO_INVALID_ARG, "--tp %d needs %d processes; this is one process "
                         "(start it with mpirun -np %d)", tp, tp, tp);
    g_dist.tp = 1;
    g_dist.inited = true;
    return SLAPO_OK;
  }
  SLAPO_TRY(start_mpi());
  if (tp == 0) MPI_Comm_size(MPI_COMM_WORLD, &tp);
  slapo_status s = form_groups(tp);
  if (s != SLAPO_OK) return s;
  g_dist.tp = tp;
  g_dist.inited = true;
  return SLAPO_OK;
}

void slapo_dist_finalize(void) {
  for (int i = SLAPO_GROUP_TP; i < SLAPO_GROUP_COUNT; i++) /* the groups formed */
    if (g_dist.comm[i] && g_dist.comm[i] != MPI_COMM_NULL) MPI_Comm_free(&g_dist.comm[i]);
  if (g_dist.mpi) MPI_Finalize();
  memset(&g_dist, 0, sizeof g_dist);
  for (int i = 0; i < SLAPO_GROUP_COUNT; i++) g_dist.size[i] = 1;
}

bool slapo_dist_active(void) { return g_dist.comm[SLAPO_GROUP_WORLD] != 0; }

int slapo_dist_size(slapo_group g) { return g < SLAPO_GROUP_COUNT ? g_dist.size[g] : 1; }
int slapo_dist_rank(slapo_group g) { return g < SLAPO_GROUP_COUNT ? g_dist.rank[g] : 0; }

void slapo_dist_describe(char *buf, size_t cap) {
  snprintf(buf, cap, "world %d = tp %d x dp %d; rank %d: tp rank %d, dp rank %d",
           g_dist.size[0], g_dist.size[1], g_dist.size[2], g_dist.rank[0], g_dist.rank[1],
           g_dist.rank[2]);
}

_Noreturn void slapo_dist_abort(int code) {
  if (slapo_dist_active()) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

MPI_Comm slapo__dist_comm(int g) {
  return g >= 0 && g < SLAPO_GROUP_COUNT && slapo_dist_active() ? g_dist.comm[g]
                                                                  : MPI_COMM_NULL;
}

/* ---- host-side collectives ---- */

/* MPI counts are int: large buffers go in pieces of at most 1 Gi elements. */
#define CHUNK ((int64_t)1 << 30)

static slapo_status reduce_sum(slapo_group g, void *buf, int64_t n, MPI_Datatype t, size_t el,
                               const char *what) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  for (int64_t i = 0; i < n; i += CHUNK) {
    int k = (int)(n - i < CHUNK ? n - i : CHUNK);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)i * el, k, t, MPI_SUM, c), what);
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_all_reduce_f32(slapo_group g, float *buf, int64_t n) {
  return reduce_sum(g, buf, n, MPI_FLOAT, sizeof(float), "MPI_Allreduce (f32)");
}

slapo_status slapo_dist_all_reduce_f64(slapo_group g, double *buf, int64_t n) {
  return reduce_sum(g, buf, n, MPI_DOUBLE, sizeof(double), "MPI_Allreduce (f64)");
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

slapo_status slapo_dist_all_reduce_tensors(slapo_group g, int n, slapo_tensor *const *ts,
                                           double *seconds) {
  if (seconds) *seconds = 0;
  if (slapo_dist_size(g) == 1) return SLAPO_OK;
  double t0 = MPI_Wtime();
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
  if (seconds) *seconds = MPI_Wtime() - t0;
  return s;
}

slapo_status slapo_dist_max_f64(slapo_group g, double *buf, int64_t n) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  if (n > CHUNK) return slapo_error(SLAPO_LIMIT, "max of %lld values: at most 2^30", (long long)n);
  MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_MAX, c), "MPI_Allreduce (max)");
  return SLAPO_OK;
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
  MPI_TRY(MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c), "MPI_Allgather");
  return SLAPO_OK;
}

slapo_status slapo_dist_broadcast(slapo_group g, void *buf, int64_t nbytes, int root) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL || slapo_dist_size(g) == 1) return SLAPO_OK;
  for (int64_t i = 0; i < nbytes; i += CHUNK) {
    int k = (int)(nbytes - i < CHUNK ? nbytes - i : CHUNK);
    MPI_TRY(MPI_Bcast((char *)buf + i, k, MPI_BYTE, root, c), "MPI_Bcast");
  }
  return SLAPO_OK;
}

slapo_status slapo_dist_barrier(slapo_group g) {
  MPI_Comm c = slapo__dist_comm(g);
  if (c == MPI_COMM_NULL) return SLAPO_OK;
  MPI_TRY(MPI_Barrier(c), "MPI_Barrier");
  return SLAPO_OK;
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
  MPI_TRY(MPI_Allgather(in, (int)nbytes, MPI_BYTE, out, (int)nbytes, MPI_BYTE, c),
          "MPI_Allgather (records)");
  return SLAPO_OK;
}

/* MPI on the world alone, for slapo_dist_agree before the groups are
 * formed by arguments the ranks may not share. */
slapo_status slapo_dist_start(void) {
  if (!launched() || slapo_dist_active()) return SLAPO_OK;
  SLAPO_TRY(start_mpi());
  MPI_Comm_size(MPI_COMM_WORLD, &g_dist.size[SLAPO_GROUP_WORLD]);
  return SLAPO_OK;
}
