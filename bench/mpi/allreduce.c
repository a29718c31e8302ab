/* bench/mpi/allreduce.c - plain MPI (no slapo): an in-place f32 sum
 * all-reduce of 4 KB .. 64 MB between the ranks of one node, by
 *   block   MPI_Allreduce (Open MPI's coll/tuned; pick its algorithm with
 *           OMPI_MCA_coll_tuned_use_dynamic_rules=1
 *           OMPI_MCA_coll_tuned_allreduce_algorithm=K)
 *   iar     MPI_Iallreduce + MPI_Test (coll/libnbc; pick its algorithm with
 *           OMPI_MCA_coll_libnbc_iallreduce_algorithm=K)
 *   shm     slapo's shared-memory scheme (src/dist/dist.c): pack into an
 *           MPI-3 shared window, barrier, each rank sums its 1/p slice over
 *           every segment, barrier, copy every slice back
 *   memcpy  a copy of the same bytes (the yardstick)
 * Prints the median ms (the maximum over ranks) and GB/s of the buffer.
 * Not built by CMake (it needs no slapo); the data behind the algorithm
 * choices in docs/PERFORMANCE.md:
 *   mpicc -O2 -o /tmp/allreduce bench/mpi/allreduce.c
 *   mpirun -np 2 --bind-to none /tmp/allreduce block|iar|shm|memcpy */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void wait_test(MPI_Request *r) {
  for (int done = 0; !done;) MPI_Test(r, &done, MPI_STATUS_IGNORE);
}

enum { MAX_BYTES = 64 << 20 };
static MPI_Win win;
static float **seg;
static int rank, np;

static void shm_barrier(void) {
  MPI_Win_sync(win);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_sync(win);
}

static void shm_allreduce(float *b, int n) {
  memcpy(seg[rank], b, sizeof(float) * (size_t)n);
  shm_barrier();
  int lo = (int)((long long)n * rank / np), hi = (int)((long long)n * (rank + 1) / np);
  for (int k = 0; k < np; k++)
    if (k != rank)
      for (int j = lo; j < hi; j++) seg[rank][j] += seg[k][j];
  shm_barrier();
  for (int k = 0; k < np; k++) {
    lo = (int)((long long)n * k / np), hi = (int)((long long)n * (k + 1) / np);
    memcpy(b + lo, seg[k] + lo, sizeof(float) * (size_t)(hi - lo));
  }
  /* the library alternates two buckets instead of this third barrier */
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  const char *mode = argc > 1 ? argv[1] : "block";
  if (!strcmp(mode, "shm")) {
    float *mine;
    MPI_Win_allocate_shared(MAX_BYTES, sizeof(float), MPI_INFO_NULL, MPI_COMM_WORLD, &mine, &win);
    seg = malloc(sizeof *seg * (size_t)np);
    for (int k = 0; k < np; k++) {
      MPI_Aint size;
      int disp;
      MPI_Win_shared_query(win, k, &size, &disp, &seg[k]);
    }
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
  }
  const size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    size_t nb = sizes[si];
    int n = (int)(nb / 4);
    float *b = malloc(nb), *c = malloc(nb);
    for (int i = 0; i < n; i++) b[i] = 1, c[i] = 0;
    int reps = nb <= (1 << 20) ? 50 : nb <= (4 << 20) ? 15 : 7;
    double t[64];
    for (int r = -1; r < reps; r++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      if (!strcmp(mode, "block")) {
        MPI_Allreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else if (!strcmp(mode, "iar")) {
        MPI_Request q;
        MPI_Iallreduce(MPI_IN_PLACE, b, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
        wait_test(&q);
      } else if (!strcmp(mode, "shm")) {
        shm_allreduce(b, n);
      } else {
        memcpy(c, b, nb);
      }
      if (r >= 0) t[r] = now() - t0;
      for (int i = 0; i < n; i++) b[i] = 1;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    double m = t[reps / 2];
    MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%-7s %9zu B %9.3f ms %7.2f GB/s\n", mode, nb, m * 1e3, (double)nb / m / 1e9);
    free(b), free(c);
  }
  if (!strcmp(mode, "shm")) {
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    free(seg);
  }
  MPI_Finalize();
  return 0;
}
