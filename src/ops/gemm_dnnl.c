/* ops/gemm_dnnl.c - the fast path of the batched GEMM (ops/gemm.h): a oneDNN
 * matmul primitive (oneDNN 2.6 C API) whose memory descriptors carry the
 * operands' strides, so transposes and broadcast batch dims cost nothing.
 * Batch dims are simplified first (size-1 dims dropped, contiguous ones
 * merged, a weight shared by every batch entry folded into M) so the common
 * x [B, T, C] @ w [C, N] case becomes one 2-D GEMM. Creating a primitive
 * takes tens of microseconds, so created primitives are kept in the shared
 * primitive cache (ops/dnnl_cache.h) keyed by the simplified problem.
 * Layer: ops. */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "slapo/ops/dnnl_cache.h"
#include "slapo/ops/gemm.h"
#include "ops/internal.h"

/* ---- the simplified problem, which is also the cache key ---- */

/* dnnl's view: src [.., M, K], weights [.., K, N], dst [.., M, N] with the
 * same ndims; a batch dim of size 1 in src or weights broadcasts. Zeroed
 * before filling, so it can be hashed and compared as bytes. */
typedef struct key {
  int nd;
  int has_bias;
  int bf16; /* A and B bf16 (C and bias f32) */
  int nthr; /* OpenMP threads: dnnl fixes its work split at creation */
  int64_t a_dims[SLAPO_MAX_DIMS], a_str[SLAPO_MAX_DIMS];
  int64_t b_dims[SLAPO_MAX_DIMS], b_str[SLAPO_MAX_DIMS];
  int64_t c_dims[SLAPO_MAX_DIMS];
  int64_t c_ld; /* C's row stride: N, or more for one thread's columns */
  int64_t bias_sn;
} key;
_Static_assert(sizeof(key) <= SLAPO__DNNL_KEY_MAX, "the cache's key room");

/* Chooses the free stride of a size-1 matrix dim so that the operand reads
 * as row-major (inner stride 1) or column-major; returns false when neither
 * of the two strides is 1 (or the other is too small to be a leading dim),
 * a layout the fast kernels do not take. rows/cols: logical dims;
 * sr/sc: their strides. */
static bool plain_layout(int64_t rows, int64_t cols, int64_t *sr, int64_t *sc) {
  if (rows == 1) *sr = *sc == 1 ? cols : 1;
  if (cols == 1) *sc = *sr == 1 ? rows : 1;
  return (*sc == 1 && *sr >= cols) || (*sr == 1 && *sc >= rows);
}

/* Stride for a broadcast (size-1) batch dim: past everything inside it, the
 * value a dense layout would have. Never read, but keeps dnnl's
 * descriptors ordinary. */
static int64_t extent(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  int64_t e1 = rows * sr, e2 = cols * sc;
  return e1 > e2 ? e1 : e2;
}

/* Fills k from g; false when the problem is not for dnnl. */
static bool make_key(const slapo__gemm *g, key *k) {
  memset(k, 0, sizeof *k);
  k->bf16 = g->bf16;
  int64_t M = g->M, N = g->N, K = g->K;
  int64_t a_sm = g->a_sm, a_sk = g->a_sk, b_sk = g->b_sk, b_sn = g->b_sn;

  /* Batch dims: drop size-1 ones, then merge an inner dim into the one
   * outside it when every operand is either broadcast along both or laid out
   * contiguously across both (C always is). */
  int nb = 0;
  int64_t bt[SLAPO_MAX_DIMS], as[SLAPO_MAX_DIMS], bs[SLAPO_MAX_DIMS];
  for (int i = 0; i < g->nb; i++) {
    int64_t n = g->batch[i], sa = g->a_bs[i], sb = g->b_bs[i];
    if (n == 1) continue;
    /* Broadcast along both inputs: C repeats one matrix; rare, left to ref. */
    if (sa == 0 && sb == 0) return false;
    if (nb > 0) {
      bool ma = (as[nb - 1] == 0 && sa == 0) || (sa != 0 && as[nb - 1] == sa * n);
      bool mb = (bs[nb - 1] == 0 && sb == 0) || (sb != 0 && bs[nb - 1] == sb * n);
      if (ma && mb) {
        bt[nb - 1] *= n;
        as[nb - 1] = sa;
        bs[nb - 1] = sb;
        continue;
      }
    }
    bt[nb] = n, as[nb] = sa, bs[nb] = sb;
    nb++;
  }
  /* A weight shared by all batch entries and an A whose batch entries follow
   * each other row after row: fold the batch into M (one 2-D GEMM). */
  if (nb == 1 && bs[0] == 0 && (as[0] == a_sm * M || M == 1)) {
    if (M == 1) a_sm = as[0];
    M *= bt[0];
    nb = 0;
  }

  if (!plain_layout(M, K, &a_sm, &a_sk) || !plain_layout(K, N, &b_sk, &b_sn)) return false;

  int nd = nb + 2;
  k->nd = nd;
  k->nthr = omp_get_max_threads();
  int64_t ea = extent(M, K, a_sm, a_sk), eb = extent(K, N, b_sk, b_sn);
  for (int i = nb - 1; i >= 0; i--) {
    k->a_dims[i] = as[i] ? bt[i] : 1;
    k->a_str[i] = as[i] ? as[i] : ea;
    if (k->a_str[i] * k->a_dims[i] > ea) ea = k->a_str[i] * k->a_dims[i];
    k->b_dims[i] = bs[i] ? bt[i] : 1;
    k->b_str[i] = bs[i] ? bs[i] : eb;
    if (k->b_str[i] * k->b_dims[i] > eb) eb = k->b_str[i] * k->b_dims[i];
    k->c_dims[i] = bt[i];
  }
  k->a_dims[nb] = M, k->a_dims[nb + 1] = K;
  k->a_str[nb] = a_sm, k->a_str[nb + 1] = a_sk;
  k->b_dims[nb] = K, k->b_dims[nb + 1] = N;
  k->b_str[nb] = b_sk, k->b_str[nb + 1] = b_sn;
  k->c_dims[nb] = M, k->c_dims[nb + 1] = N;
  k->c_ld = N;
  /* oneDNN 2.6's brgemm matmul reads the bias as dense whatever its
   * descriptor's strides say, so only a dense bias goes to dnnl; the caller
   * adds any other after the GEMM. */
  if (g->bias && (g->bias_sn == 1 || N == 1)) {
    k->has_bias = 1;
    k->bias_sn = 1;
  }
  return true;
}

/* ---- primitives ---- */

enum { MEM_A, MEM_B, MEM_BIAS, MEM_C, N_MEM };

/* bf16 GEMMs (slapo_bf16_gemm_native): after the ISA levels, the
 * implementation oneDNN picks for a bf16 matmul must be a bf16 one (brgemm
 * on avx512_core_bf16 or amx): on a CPU without bf16 dot products oneDNN
 * 2.6 accepts bf16 and runs it in gemm:jit emulation at a third of f32's
 * speed, which slapo never does. g_bf16_ok: 1 until a primitive's creation
 * refuses one, then 0 for the process, with the reason in g_bf16_why. */
static atomic_int g_bf16_ok = 1;
static char g_bf16_why[160];

static bool dnnl_has_bf16(dnnl_cpu_isa_t isa) {
  return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

/* Why bf16 GEMMs cannot run in hardware, checked in this order; cheap, so
 * every bf16 GEMM asks (the caps may change between calls). */
enum bf16_verdict { BF16_NATIVE, BF16_SLAPO_CAPPED, BF16_NO_UNITS, BF16_DNNL_ISA, BF16_REFUSED };

static enum bf16_verdict bf16_verdict(void) {
  if (slapo_isa_active() < SLAPO_ISA_AVX512_BF16)
    return slapo_isa_host() >= SLAPO_ISA_AVX512_BF16 ? BF16_SLAPO_CAPPED : BF16_NO_UNITS;
  if (!dnnl_has_bf16(dnnl_get_effective_cpu_isa())) return BF16_DNNL_ISA;
  return atomic_load(&g_bf16_ok) ? BF16_NATIVE : BF16_REFUSED;
}

static bool bf16_impl_ok(const_dnnl_primitive_desc_t pd) {
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = "";
  if (impl && (strstr(impl, "avx512_core_bf16") || strstr(impl, "amx"))) return true;
  snprintf(g_bf16_why, sizeof g_bf16_why,
           "oneDNN picked '%s' for a bf16 matmul, not a bf16 kernel", impl ? impl : "?");
  atomic_store(&g_bf16_ok, 0);
  return false;
}

/* The cache's create function: the matmul primitive of the key ud. */
static bool entry_create(slapo__dnnl_entry *e, const void *ud) {
  const key *k = ud;
  dnnl_engine_t eng = slapo__dnnl_engine();
  int nd = k->nd;
  dnnl_dims_t ad, as, bd, bs, cd, cs, zd, zs;
  for (int i = 0; i < nd; i++) {
    ad[i] = k->a_dims[i], as[i] = k->a_str[i];
    bd[i] = k->b_dims[i], bs[i] = k->b_str[i];
    cd[i] = k->c_dims[i];
    zd[i] = 1;
  }
  /* C is row-major with row stride c_ld, batch entries dense. */
  cs[nd - 1] = 1;
  cs[nd - 2] = k->c_ld;
  for (int i = nd - 3; i >= 0; i--) cs[i] = cs[i + 1] * cd[i + 1];
  zd[nd - 1] = cd[nd - 1];
  for (int i = 0; i < nd; i++) zs[i] = i == nd - 1 ? k->bias_sn : k->bias_sn * cd[nd - 1];

  dnnl_memory_desc_t amd, bmd, cmd, zmd;
  dnnl_data_type_t ab = k->bf16 ? dnnl_bf16 : dnnl_f32;
  if (dnnl_memory_desc_init_by_strides(&amd, nd, ad, ab, as) != dnnl_success ||
      dnnl_memory_desc_init_by_strides(&bmd, nd, bd, ab, bs) != dnnl_success ||
      dnnl_memory_desc_init_by_strides(&cmd, nd, cd, dnnl_f32, cs) != dnnl_success ||
      (k->has_bias &&
       dnnl_memory_desc_init_by_strides(&zmd, nd, zd, dnnl_f32, zs) != dnnl_success))
    return false;
  dnnl_matmul_desc_t md;
  if (dnnl_matmul_desc_init(&md, &amd, &bmd, k->has_bias ? &zmd : NULL, &cmd) != dnnl_success)
    return false;
  dnnl_primitive_desc_t pd;
  if (dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success) return false;
  if (k->bf16 && !bf16_impl_ok(pd)) {
    dnnl_primitive_desc_destroy(pd);
    return false;
  }
  dnnl_status_t st = dnnl_primitive_create(&e->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  if (st != dnnl_success) {
    e->prim = NULL;
    return false;
  }
  const dnnl_memory_desc_t *mds[N_MEM] = {&amd, &bmd, k->has_bias ? &zmd : NULL, &cmd};
  for (int i = 0; i < N_MEM; i++) {
    if (!mds[i]) continue;
    if (dnnl_memory_create(&e->mem[i], mds[i], eng, DNNL_MEMORY_NONE) != dnnl_success) {
      e->mem[i] = NULL;
      return false;
    }
  }
  return true;
}

/* ---- the cache ---- */

/* Enough for every distinct GEMM of a GPT-2 training step (forward and
 * backward) several times over; the least recently used idle entry goes. */
#define CACHE_CAP 128

/* Static, so LSan sees the primitives as reachable; never freed. */
static slapo__dnnl_entry g_slots[CACHE_CAP];
static slapo__dnnl_cache g_cache = SLAPO__DNNL_CACHE_INIT(g_slots);

int slapo__gemm_dnnl_cache_count(void) { return slapo__dnnl_cache_count(&g_cache); }

/* ---- the fast path ---- */

/* C = bias (or 0) broadcast over rows: the K == 0 case, where there is
 * nothing to multiply. */
static void fill_bias(const slapo__gemm *g, int64_t rows) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t n = 0; n < g->N; n++)
      g->c[r * g->N + n] = g->bias ? g->bias[n * g->bias_sn] : 0.0f;
}

/* C += bias over rows, for a strided bias that dnnl did not take. */
static void add_bias(const slapo__gemm *g, int64_t rows) {
  const int64_t N = g->N;
#pragma omp parallel for num_threads(slapo__threads_for(rows * N)) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t n = 0; n < N; n++) g->c[r * N + n] += g->bias[n * g->bias_sn];
}

/* ---- operands copied to a better row stride first ----
 * oneDNN 2.6's f32 brgemm matmul streams plain row-major operands row by
 * row, and two row strides slow it down:
 * - B [K, N] whose row stride is a multiple of 4 KiB (but not a power of
 *   two): its rows map to the same L1 sets and evict each other. On this
 *   CPU class (48 KiB, 12-way L1D), measured with 2 threads, M 256, K 768:
 *   N = ld = 3072 180 -> 420 GF/s once padded, 6144 262 -> 413 (copy not
 *   counted; 380 with it). GPT-2's mlp.c_proj weight in dx = dy @ W and
 *   the [rows, 3072] GELU output in dW = dy^T @ x. Strides of 1024, 2048
 *   and 4096 floats lose only 5-7%, about what the copy costs, so powers
 *   of two are left alone.
 * - A [M, K] with a long odd row (rows not 64-byte aligned): GPT-2's
 *   dlogits [B*T, 50257] in lm_head's dx = dlogits @ wte: 260 -> 325 GF/s
 *   with its rows padded to a multiple of 16 floats (M 256, N 768).
 * Such an operand is first copied with a padded stride into a per-thread
 * scratch buffer: one read and write of it, far less than the 2 M N K flops
 * of the GEMM when the other dims are not small. Only 2-D problems (every
 * linear, and matmuls whose batch folds into M) take this path. */
#define PAD_FLOATS 16 /* 64 bytes */

static bool b_wants_padding(const key *k) {
  if (k->nd != 2 || k->bf16) return false; /* measured for f32 only */
  int64_t K = k->b_dims[0], N = k->b_dims[1], sk = k->b_str[0], sn = k->b_str[1];
  int64_t M = k->a_dims[0];
  return sn == 1 && sk >= N && (sk * (int64_t)sizeof(float)) % 4096 == 0 &&
         (sk & (sk - 1)) != 0 && K >= 64 && N >= 256 && M >= 128;
}

static bool a_wants_padding(const key *k) {
  if (k->nd != 2 || k->bf16) return false;
  int64_t M = k->a_dims[0], K = k->a_dims[1], sm = k->a_str[0], sk = k->a_str[1];
  int64_t N = k->b_dims[1];
  return sk == 1 && sm >= K && sm % PAD_FLOATS != 0 && K >= 4096 && M >= 128 && N >= 256;
}

/* Scratch for padded copies, one per operand and thread (GEMMs run from the
 * executor's thread, the OpenMP team inside dnnl), grown on demand and
 * kept, so steady state allocates nothing. Reachable through TLS until the
 * thread ends. */
typedef struct pad_buf {
  float *data;
  size_t cap;
} pad_buf;
static _Thread_local pad_buf g_pad[2]; /* [0] A, [1] B */

/* Copies x [rows, cols] (row stride ld) into buf with row stride pld;
 * returns the copy or NULL (out of memory: the caller uses x as it is). */
static const float *padded_copy(pad_buf *buf, const float *x, int64_t rows, int64_t cols,
                                int64_t ld, int64_t pld) {
  size_t need = (size_t)(rows * pld) * sizeof(float);
  if (need > buf->cap) {
    slapo_aligned_free(buf->data);
    buf->data = slapo_aligned_alloc(need);
    buf->cap = buf->data ? need : 0;
    if (!buf->data) return NULL;
  }
  float *dst = buf->data; /* [rows, pld], the last pld - cols of each row unused */
#pragma omp parallel for num_threads(slapo__threads_for(rows * cols)) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * pld, x + r * ld, (size_t)cols * sizeof(float));
  return dst;
}

static int64_t round_up_pad(int64_t n) { return (n + PAD_FLOATS - 1) / PAD_FLOATS * PAD_FLOATS; }

/* The operands of one primitive call. */
typedef struct operands {
  const void *a, *b; /* f32 or bf16 (key.bf16) */
  const float *bias;
  float *c;
} operands;

/* Runs the primitive of k (cached, or created now) on o; false when oneDNN
 * cannot create or execute it. */
static bool run_key(const key *k, const operands *o) {
  dnnl_stream_t stream = slapo__dnnl_stream();
  if (!stream) return false;
  slapo__dnnl_entry local;
  slapo__dnnl_entry *e = slapo__dnnl_acquire(&g_cache, k, sizeof *k, entry_create, k, &local);
  if (!e) return false;
  /* dnnl reads but never writes src, weights and bias. */
  dnnl_memory_set_data_handle(e->mem[MEM_A], (void *)o->a);
  dnnl_memory_set_data_handle(e->mem[MEM_B], (void *)o->b);
  dnnl_memory_set_data_handle(e->mem[MEM_C], o->c);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->mem[MEM_A]},
                             {DNNL_ARG_WEIGHTS, e->mem[MEM_B]},
                             {DNNL_ARG_DST, e->mem[MEM_C]},
                             {DNNL_ARG_BIAS, e->mem[MEM_BIAS]}};
  int nargs = 3;
  if (k->has_bias) {
    dnnl_memory_set_data_handle(e->mem[MEM_BIAS], (void *)o->bias);
    nargs = 4;
  }
  dnnl_status_t st = dnnl_primitive_execute(e->prim, stream, nargs, args);
  if (st == dnnl_success) st = dnnl_stream_wait(stream);
  slapo__dnnl_release(&g_cache, e);
  /* Execution of a created primitive on host memory does not fail short of
   * a bug; should it, the reference recomputes every element. */
  return st == dnnl_success;
}

/* ---- one single-thread primitive per thread ----
 * oneDNN 2.6's brgemm matmul, given T threads, splits C into blocks of
 * rows and columns itself. For the two backward GEMMs of a Linear, giving
 * each thread its own range of C and a primitive made for one thread is
 * faster (2 threads, AMD Zen 5, caches flushed, median GF/s, oneDNN's split
 * -> ours; bench/bench_matmul shows the same side by side):
 * - dx = dy @ W (both row-major): columns. GPT-2 124M at 1024 rows: c_attn
 *   346 -> 398, c_fc 354 -> 420, c_proj 367 -> 426, lm_head 274 -> 373;
 *   GPT-2 `small` shapes (K, N <= 1536) about even.
 * - dW = dy^T @ x (A read transposed): rows when M >= N, else columns
 *   (each thread then transposes only its share of A). `small`: c_attn
 *   371 -> 391, c_fc 367 -> 389, c_proj 388 -> 409; 124M: c_proj 310 -> 391,
 *   lm_head 340 -> 419.
 * - y = x @ W^T (B read transposed: the forward): oneDNN's own split was as
 *   fast or faster on every shape, so it keeps it.
 * A thread's range is at least MIN_SPLIT rows or columns, a multiple of 16
 * (64-byte aligned columns); measured at 2 threads only, so many threads
 * on small problems keep oneDNN's split. Each element of C is computed by
 * one thread, so the result stays a function of the thread count alone. */
#define MIN_SPLIT 128

enum split { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS };

static enum split split_of(const key *k, int64_t *chunk) {
  if (k->nd != 2 || k->nthr < 2 || omp_in_parallel()) return SPLIT_NONE;
  int64_t M = k->c_dims[0], N = k->c_dims[1];
  bool a_trans = k->a_str[1] != 1, b_trans = k->b_str[1] != 1;
  if (b_trans) return SPLIT_NONE;
  enum split s = a_trans && M >= N ? SPLIT_ROWS : SPLIT_COLS;
  int64_t len = s == SPLIT_ROWS ? M : N;
  *chunk = (len + k->nthr - 1) / k->nthr;
  *chunk = (*chunk + 15) / 16 * 16;
  return *chunk >= MIN_SPLIT && len > *chunk ? s : SPLIT_NONE;
}

static int64_t esize(const key *k) { return k->bf16 ? 2 : 4; }

/* Thread t's share of k (and of o): rows or columns [t * chunk, ...) of C,
 * for one thread; false when t has none. */
static bool share_of(const key *k, const operands *o, enum split s, int64_t chunk, int t,
                     key *sub, operands *so) {
  int dim = s == SPLIT_ROWS ? 0 : 1;
  int64_t len = k->c_dims[dim], lo = t * chunk;
  if (lo >= len) return false;
  *sub = *k;
  *so = *o;
  sub->nthr = 1;
  sub->c_dims[dim] = len - lo < chunk ? len - lo : chunk;
  if (s == SPLIT_ROWS) {
    sub->a_dims[0] = sub->c_dims[0];
    so->a = (const char *)o->a + lo * k->a_str[0] * esize(k);
    so->c = o->c + lo * k->c_ld;
  } else {
    sub->b_dims[1] = sub->c_dims[1];
    so->b = (const char *)o->b + lo * k->b_str[1] * esize(k);
    so->c = o->c + lo;
    if (o->bias) so->bias = o->bias + lo;
  }
  return true;
}

static bool run_split(const key *k, const operands *o, enum split s, int64_t chunk) {
  bool ok = true;
#pragma omp parallel num_threads(k->nthr) reduction(&& : ok)
  {
    key sub;
    operands so;
    if (share_of(k, o, s, chunk, omp_get_thread_num(), &sub, &so)) {
      /* dnnl sizes a primitive for the threads it may use: this one. */
      omp_set_num_threads(1);
      ok = run_key(&sub, &so);
    }
  }
  return ok;
}

bool slapo__gemm_dnnl(const slapo__gemm *g) {
  int64_t rows = g->M;
  for (int i = 0; i < g->nb; i++) rows *= g->batch[i];
  if (rows == 0 || g->N == 0) return true;
  if (g->K == 0) {
    fill_bias(g, rows);
    return true;
  }
  if (g->bf16 && bf16_verdict() != BF16_NATIVE) return false;
  key k;
  if (!make_key(g, &k)) return false;
  operands o = {g->a, g->b, k.has_bias ? g->bias : NULL, g->c};
  if (a_wants_padding(&k)) {
    int64_t ld = round_up_pad(k.a_str[0]);
    const float *copy = padded_copy(&g_pad[0], g->a, k.a_dims[0], k.a_dims[1], k.a_str[0], ld);
    if (copy) {
      o.a = copy;
      k.a_str[0] = ld;
    }
  }
  if (b_wants_padding(&k)) {
    int64_t ld = k.b_dims[1] + PAD_FLOATS;
    const float *copy = padded_copy(&g_pad[1], g->b, k.b_dims[0], k.b_dims[1], k.b_str[0], ld);
    if (copy) {
      o.b = copy;
      k.b_str[0] = ld;
    }
  }
  int64_t chunk;
  enum split s = split_of(&k, &chunk);
  if (!(s == SPLIT_NONE ? run_key(&k, &o) : run_split(&k, &o, s, chunk))) return false;
  if (g->bias && !k.has_bias) add_bias(g, rows);
  return true;
}

/* ---- bf16 operands ---- */

static const char *dnnl_isa_name(dnnl_cpu_isa_t isa);

bool slapo_bf16_gemm_native(char *why, size_t cap) {
  enum bf16_verdict v = bf16_verdict();
  if (!why || !cap) return v == BF16_NATIVE;
  const char *level = slapo_isa_name(slapo_isa_active());
  switch (v) {
  case BF16_NATIVE: snprintf(why, cap, "%s", ""); break;
  case BF16_SLAPO_CAPPED:
    snprintf(why, cap, "SLAPO_MAX_ISA caps slapo at %s, below avx512_bf16", level);
    break;
  case BF16_NO_UNITS:
    snprintf(why, cap,
             "this CPU has no bf16 dot products (no avx512_bf16 or amx_bf16; slapo level %s)",
             level);
    break;
  case BF16_DNNL_ISA:
    snprintf(why, cap, "oneDNN runs at %s (ONEDNN_MAX_CPU_ISA?), below avx512_core_bf16",
             dnnl_isa_name(dnnl_get_effective_cpu_isa()));
    break;
  case BF16_REFUSED: snprintf(why, cap, "%s", g_bf16_why); break;
  }
  return v == BF16_NATIVE;
}

/* The bf16 operand t widened to a new f32 tensor, or NULL (out of memory). */
static slapo_tensor *widen(const slapo_tensor *t) {
  slapo_tensor *w = NULL;
  if (slapo_tensor_to_dtype(t, SLAPO_DTYPE_F32, &w) != SLAPO_OK) {
    slapo_error_clear();
    return NULL;
  }
  return w;
}

void slapo__gemm_fast(const slapo_tensor *a, bool trans_a, const slapo_tensor *b, bool trans_b,
                      const slapo_tensor *bias, slapo_tensor *c) {
  slapo__gemm g;
  slapo__gemm_init(&g, a, trans_a, b, trans_b, bias, c);
  if (slapo__gemm_dnnl(&g)) return;
  if (g.bf16) {
    /* No bf16 GEMM in hardware: the bf16 products are exact in f32, so
     * widening first and running f32 computes what the bf16 kernel would,
     * up to the order of the f32 sums, at f32's speed plus the copies. */
    slapo_tensor *wa = widen(a), *wb = wa ? widen(b) : NULL;
    if (wb) {
      slapo__gemm f;
      slapo__gemm_init(&f, wa, trans_a, wb, trans_b, bias, c);
      if (!slapo__gemm_dnnl(&f)) slapo__gemm_ref(&f);
    }
    slapo_tensor_free(wa);
    slapo_tensor_free(wb);
    if (wb) return;
  }
  slapo__gemm_ref(&g);
}

/* ---- what runs: for benchmarks and the CLI's start-up line ---- */

static const char *dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
  case dnnl_cpu_isa_sse41: return "sse41";
  case dnnl_cpu_isa_avx: return "avx";
  case dnnl_cpu_isa_avx2: return "avx2";
  case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
  case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
  case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
  case dnnl_cpu_isa_avx512_core: return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
  default: return "all";
  }
}

void slapo_kernels_describe(char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  const dnnl_version_t *v = dnnl_version();
  slapo_isa isa = slapo_isa_active(), host = slapo_isa_host();
  char capped[48] = "";
  if (isa != host) snprintf(capped, sizeof capped, " (capped; host %s)", slapo_isa_name(host));
  /* dnnl_get_effective_cpu_isa honours ONEDNN_MAX_CPU_ISA as our level
   * honours SLAPO_MAX_ISA. */
  snprintf(buf, cap, "slapo kernels %s%s, oneDNN %d.%d.%d %s", slapo_isa_name(isa), capped,
           v->major, v->minor, v->patch, dnnl_isa_name(dnnl_get_effective_cpu_isa()));
}
