/* train/adamw.c - AdamW with decoupled weight decay (Loshchilov & Hutter,
 * "Decoupled Weight Decay Regularization", ICLR 2019, Algorithm 2), matching
 * torch.optim.AdamW; state save/load for --resume. Layer: train. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/ops/vmath.h"
#include "slapo/dist.h"
#include "slapo/train.h"

typedef struct slot {
  slapo_parameter *p;
  char *path;
  /* Same shape as p; f32, or bf16 (state_bf16). NULL: released by
   * slapo_adamw_select (another rank's parameter): not updated. */
  slapo_tensor *m, *v;
  uint64_t rng_key;    /* state_bf16: the stochastic rounding's Philox key */
} slot;

struct slapo_adamw {
  slapo_adamw_config cfg;
  int n, cap;
  slot *slots;
  int64_t t;
  slapo_status status;
  bool (*keep)(const slapo_parameter *p, void *ud); /* while creating */
  void *keep_ud;
};

/* Zeroed moments for slot s. */
static slapo_status moments_new(const slapo_adamw *o, slot *s) {
  slapo_dtype dt = o->cfg.state_bf16 ? SLAPO_DTYPE_BF16 : SLAPO_DTYPE_F32;
  const slapo_tensor *w = s->p->value;
  if (slapo_tensor_new(dt, w->ndim, w->shape, &s->m) == SLAPO_OK &&
      slapo_tensor_new(dt, w->ndim, w->shape, &s->v) == SLAPO_OK)
    return SLAPO_OK;
  slapo_tensor_free(s->m);
  s->m = NULL;
  return slapo_error(SLAPO_NOMEM, "adamw: out of memory for the moments of %s", s->path);
}

static void moments_free(slot *s) {
  slapo_tensor_free(s->m);
  slapo_tensor_free(s->v);
  s->m = s->v = NULL;
}

static void add_slot(slapo_parameter *p, const char *path, void *ud) {
  slapo_adamw *o = ud;
  if (o->status != SLAPO_OK) return;
  bool kept = !o->keep || o->keep(p, o->keep_ud);
  if (kept && (slapo_tensor_is_meta(p->value) || !p->grad)) {
    o->status = slapo_error(SLAPO_STATE, "adamw: parameter %s is not materialized", path);
    return;
  }
  if (o->n == o->cap) {
    int cap = o->cap ? 2 * o->cap : 64;
    slot *s = slapo_realloc(o->slots, (size_t)cap * sizeof *s);
    if (!s) {
      o->status = slapo_error(SLAPO_NOMEM, "adamw: out of memory");
      return;
    }
    o->slots = s;
    o->cap = cap;
  }
  slot *s = &o->slots[o->n];
  memset(s, 0, sizeof *s);
  s->p = p;
  s->path = slapo_strdup(path);
  s->rng_key = slapo_rng_key(slapo_hash_str(path), 0x4164616d57ull /* "AdamW" */);
  if (!s->path) {
    o->status = slapo_error(SLAPO_NOMEM, "adamw: out of memory for %s", path);
    return;
  }
  o->n++;
  if (kept) o->status = moments_new(o, s);
}

slapo_status slapo_adamw_new(slapo_module *model, const slapo_adamw_config *cfg,
                             slapo_adamw **out) {
  return slapo_adamw_new_select(model, cfg, NULL, NULL, out);
}

slapo_status slapo_adamw_new_select(slapo_module *model, const slapo_adamw_config *cfg,
                                    bool (*keep)(const slapo_parameter *p, void *ud), void *ud,
                                    slapo_adamw **out) {
  *out = NULL;
  slapo_adamw *o = slapo_calloc(1, sizeof *o);
  if (!o) return slapo_error(SLAPO_NOMEM, "adamw: out of memory");
  o->cfg = *cfg;
  o->keep = keep, o->keep_ud = ud;
  slapo_status s = slapo_module_visit_params(model, add_slot, o);
  o->keep = NULL, o->keep_ud = NULL;
  if (s == SLAPO_OK) s = o->status;
  if (s != SLAPO_OK) {
    slapo_adamw_free(o);
    return s;
  }
  *out = o;
  return SLAPO_OK;
}

void slapo_adamw_free(slapo_adamw *o) {
  if (!o) return;
  for (int i = 0; i < o->n; i++) {
    slapo_free(o->slots[i].path);
    moments_free(&o->slots[i]);
  }
  slapo_free(o->slots);
  slapo_free(o);
}

int64_t slapo_adamw_steps(const slapo_adamw *o) { return o->t; }

slapo_status slapo_adamw_select(slapo_adamw *o, bool (*keep)(const slapo_parameter *p, void *ud),
                                void *ud) {
  for (int i = 0; i < o->n; i++) {
    slot *s = &o->slots[i];
    if (keep && !keep(s->p, ud)) moments_free(s);
    else if (!s->m) SLAPO_TRY(moments_new(o, s));
  }
  return SLAPO_OK;
}

slapo_status slapo_adamw_moments(slapo_adamw *o, const slapo_parameter *p, slapo_tensor **m,
                                 slapo_tensor **v) {
  for (int i = 0; i < o->n; i++)
    if (o->slots[i].p == p) {
      if (!o->slots[i].m) SLAPO_TRY(moments_new(o, &o->slots[i]));
      *m = o->slots[i].m, *v = o->slots[i].v;
      return SLAPO_OK;
    }
  return slapo_error(SLAPO_NOT_FOUND, "adamw: parameter %s is not one of the optimizer's",
                     p->path ? p->path : "(unnamed)");
}

/* The constants of one parameter's update; gs scales the gradient, zero
 * clears it once read. */
typedef struct adamw_consts {
  float b1, b2, omb1, omb2, c1, c2, eps, lr, wd, gs;
  bool zero;
} adamw_consts;

/* One element, in the reference order of operations, with g = grad * gs:
 *   m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g;
 *   w -= lr ((m / c1) / (sqrt(v / c2) + eps) + wd w). */
static inline void adamw_one(float *w, float *grad, float *m, float *v,
                             const adamw_consts *k) {
  const float g = *grad * k->gs;
  if (k->zero) *grad = 0.0f;
  *m = k->b1 * *m + k->omb1 * g;
  *v = k->b2 * *v + k->omb2 * g * g;
  const float mh = *m / k->c1, vh = *v / k->c2;
  *w -= k->lr * (mh / (sqrtf(vh) + k->eps) + k->wd * *w);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* w, g, m, v [n]: the update above, a vector of elements at a time. Why by
 * hand: the loop is bound by its divisions, its square root and memory, and
 * GCC does not vectorize sqrtf unless built with -fno-math-errno. Each
 * width's mul/add/div/sqrt rounds every lane exactly as the scalar
 * operation, in the same order (no FMA), so every element gets the bits
 * the scalar formula gives at every ISA level (the tail runs that formula).
 * One body per width, spelled by ADAMW_BODY over the width's intrinsics,
 * picked per call like SLAPO__SIMD_PROC (ops/vmath.h). AVX-512 against
 * SSE, 2 threads on an AMD Zen 5: GPT-2 small's 10.8 M parameters 6.5 ->
 * 5.1 ms a step, 124M's 61.8 -> 49.1 ms (medians of 4 alternations). */
#define ADAMW_BODY(V, W, SET1, LOAD, STORE, MUL, ADD, SUB, DIV, SQRT, ZERO)               \
  int64_t j = 0;                                                                            \
  const V b1 = SET1(k->b1), b2 = SET1(k->b2), omb1 = SET1(k->omb1), omb2 = SET1(k->omb2); \
  const V c1 = SET1(k->c1), c2 = SET1(k->c2), eps = SET1(k->eps), lr = SET1(k->lr);       \
  const V wd = SET1(k->wd), gs = SET1(k->gs);                                              \
  for (; j + W <= n; j += W) {                                                              \
    V gj = MUL(LOAD(g + j), gs), wj = LOAD(w + j);                                          \
    if (k->zero) STORE(g + j, ZERO());                                                      \
    V mj = ADD(MUL(b1, LOAD(m + j)), MUL(omb1, gj));                                        \
    V vj = ADD(MUL(b2, LOAD(v + j)), MUL(MUL(omb2, gj), gj));                               \
    STORE(m + j, mj);                                                                       \
    STORE(v + j, vj);                                                                       \
    V mh = DIV(mj, c1), vh = DIV(vj, c2);                                                   \
    V t = ADD(DIV(mh, ADD(SQRT(vh), eps)), MUL(wd, wj));                                    \
    STORE(w + j, SUB(wj, MUL(lr, t)));                                                      \
  }                                                                                         \
  for (; j < n; j++) adamw_one(w + j, g + j, m + j, v + j, k)

#define ADAMW_PARAMS                                                                        \
  (float *restrict w, float *restrict g, float *restrict m, float *restrict v, int64_t n,   \
   const adamw_consts *k)

SLAPO__TARGET_AVX512 static void adamw_span_avx512 ADAMW_PARAMS {
  ADAMW_BODY(__m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_mul_ps,
             _mm512_add_ps, _mm512_sub_ps, _mm512_div_ps, _mm512_sqrt_ps, _mm512_setzero_ps);
}
SLAPO__TARGET_AVX2 static void adamw_span_avx2 ADAMW_PARAMS {
  ADAMW_BODY(__m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_mul_ps,
             _mm256_add_ps, _mm256_sub_ps, _mm256_div_ps, _mm256_sqrt_ps, _mm256_setzero_ps);
}
static void adamw_span_sse ADAMW_PARAMS {
  ADAMW_BODY(__m128, 4, _mm_set1_ps, _mm_loadu_ps, _mm_storeu_ps, _mm_mul_ps, _mm_add_ps,
             _mm_sub_ps, _mm_div_ps, _mm_sqrt_ps, _mm_setzero_ps);
}

/* The variant slapo_isa_active() names (SLAPO_MAX_ISA caps it). */
static void adamw_span ADAMW_PARAMS {
  slapo_isa isa = slapo_isa_active();
  if (isa >= SLAPO_ISA_AVX512) adamw_span_avx512(w, g, m, v, n, k);
  else if (isa == SLAPO_ISA_AVX2) adamw_span_avx2(w, g, m, v, n, k);
  else adamw_span_sse(w, g, m, v, n, k);
}
#else
static void adamw_span(float *restrict w, float *restrict g, float *restrict m,
                       float *restrict v, int64_t n, const adamw_consts *k) {
  for (int64_t j = 0; j < n; j++) adamw_one(w + j, g + j, m + j, v + j, k);
}
#endif

/* x's f32 bits rounded to bf16 stochastically: r (16 random bits) added
 * below the kept bits, then truncated, so x rounds up in magnitude with
 * probability (its distance from the lower bf16) / ulp: unbiased. A NaN is
 * kept a NaN (quieted), as slapo_f32_to_bf16; infinities stay infinite. */
static inline uint16_t bf16_stochastic(float x, uint32_t r) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint32_t q = (u >> 16) | 0x0040u, s = (u + (r & 0xffffu)) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : s);
}

/* The bf16 state's update of w, g [n] with m, v bf16 [n], starting at
 * element `first` of the parameter: widened into f32 blocks, updated by the
 * f32 kernel (the same arithmetic as the f32 state), rounded back
 * stochastically with one Philox block (4 x 32 bits: 16 for m, 16 for v)
 * per 4 elements. first is a multiple of 4. */
#define SR_BLOCK 256
static void adamw_span_bf16(float *restrict w, float *restrict g, uint16_t *restrict m,
                            uint16_t *restrict v, int64_t n, const adamw_consts *k,
                            uint64_t key, uint64_t step, int64_t first) {
  float mf[SR_BLOCK], vf[SR_BLOCK];
  const uint32_t k2[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  for (int64_t j = 0; j < n; j += SR_BLOCK) {
    int64_t len = n - j < SR_BLOCK ? n - j : SR_BLOCK;
    slapo_bf16_to_f32_n(m + j, mf, len);
    slapo_bf16_to_f32_n(v + j, vf, len);
    adamw_span(w + j, g + j, mf, vf, len, k);
    for (int64_t i = 0; i < len; i += 4) {
      uint32_t ctr[4], r[4];
      uint64_t block = (uint64_t)(first + j + i) / 4;
      ctr[0] = (uint32_t)block, ctr[1] = (uint32_t)(block >> 32);
      ctr[2] = (uint32_t)step, ctr[3] = (uint32_t)(step >> 32);
      slapo_philox4x32_10(ctr, k2, r);
      for (int64_t e = 0; e < 4 && i + e < len; e++) {
        m[j + i + e] = bf16_stochastic(mf[i + e], r[e]);
        v[j + i + e] = bf16_stochastic(vf[i + e], r[e] >> 16);
      }
    }
  }
}

void slapo_adamw_step(slapo_adamw *o, float lr) { slapo_adamw_step_scaled(o, lr, 1.0f, false); }

/* g * 1.0f is g bitwise, so slapo_adamw_step is this with grad_scale 1. */
void slapo_adamw_step_scaled(slapo_adamw *o, float lr, float grad_scale, bool zero_grads) {
  o->t++;
  const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
  /* Bias corrections in double: 1 - b^t loses precision in float for large t. */
  const float c1 = (float)(1.0 - pow(b1, (double)o->t));
  const float c2 = (float)(1.0 - pow(b2, (double)o->t));
  for (int i = 0; i < o->n; i++) {
    slot *s = &o->slots[i];
    if (!s->m) continue; /* another rank's parameter */
    float *w = slapo_tensor_data(s->p->value); /* [numel] */
    float *g = slapo_tensor_data(s->p->grad);
    void *m = slapo_tensor_data(s->m), *v = slapo_tensor_data(s->v);
    const bool bf16 = s->m->dtype == SLAPO_DTYPE_BF16;
    /* A "weight_decay" tag (annotate) overrides the coefficient for this
     * parameter; otherwise 1-D parameters are not decayed. */
    const char *tag = slapo_parameter_tag(s->p, "weight_decay");
    const float wd = tag ? strtof(tag, NULL) : s->p->no_weight_decay ? 0.0f : o->cfg.weight_decay;
    const int64_t n = slapo_tensor_numel(s->p->value);
    const adamw_consts k = {b1,  b2, 1.0f - b1, 1.0f - b2, c1,
                            c2,  eps, lr,       wd,        grad_scale,
                            zero_grads};
    /* Chunks of 16 K elements (a multiple of 4), split statically. */
    const int64_t chunk = 16384, n_chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n_chunks > 4)
    for (int64_t c = 0; c < n_chunks; c++) {
      int64_t j0 = c * chunk, len = n - j0 < chunk ? n - j0 : chunk;
      if (bf16)
        adamw_span_bf16(w + j0, g + j0, (uint16_t *)m + j0, (uint16_t *)v + j0, len, &k,
                        s->rng_key, (uint64_t)o->t, j0);
      else
        adamw_span(w + j0, g + j0, (float *)m + j0, (float *)v + j0, len, &k);
    }
  }
}

/* *out: a view of t in the file's layout (transposed when the weights file
 * stores this parameter transposed); owned. */
static slapo_status file_view(const slapo_tensor *t, bool transposed, slapo_tensor **out) {
  if (!transposed || t->ndim != 2) return slapo_tensor_view(t, out);
  int perm[2] = {1, 0};
  return slapo_tensor_permute(t, perm, out);
}

/* A moment tensor as the file stores it: gathered when its parameter is
 * sharded (every rank calls this; rank 0 writes), then transposed. */
static slapo_status state_view(const slapo_parameter *p, const slapo_tensor *t, bool transposed,
                               slapo_tensor **out) {
  if (!p->shard || p->shard->count == 1) return file_view(t, transposed, out);
  slapo_tensor *full;
  SLAPO_TRY(slapo_dist_gather_shards((slapo_group)p->shard_group, p->shard, t, &full));
  slapo_status s = file_view(full, transposed, out);
  slapo_tensor_free(full);
  return s;
}

slapo_status slapo_adamw_save(const slapo_adamw *o, const char *path,
                              bool (*transposed)(const char *param_path)) {
  return slapo_adamw_save_meta(o, path, transposed, 0, NULL, NULL);
}

slapo_status slapo_adamw_save_meta(const slapo_adamw *o, const char *path,
                                   bool (*transposed)(const char *param_path), int n_meta,
                                   const char *const *keys, const char *const *values) {
  if (n_meta < 0 || n_meta > 15 || (n_meta && (!keys || !values)))
    return slapo_error(SLAPO_INVALID_ARG, "adamw: %d metadata pairs (0 to 15, with keys and "
                       "values)", n_meta);
  for (int i = 0; i < n_meta; i++)
    if (!keys[i] || !values[i] || !strcmp(keys[i], "step"))
      return slapo_error(SLAPO_INVALID_ARG, "adamw: metadata pair %d is NULL or 'step' (the "
                         "step count is written by the optimizer)", i);
  int n = 2 * o->n;
  const char **names = slapo_calloc((size_t)n + 1, sizeof *names);
  const slapo_tensor **ts = slapo_calloc((size_t)n + 1, sizeof *ts);
  slapo_tensor **views = slapo_calloc((size_t)n + 1, sizeof *views);
  char **owned = slapo_calloc((size_t)n + 1, sizeof *owned);
  slapo_status s = (names && ts && owned && views) ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "adamw: out of memory");
  /* Rank 0 writes, so it needs every moment; the others skip the ones
   * they released (another pipeline stage's). */
  bool writer = slapo_dist_rank(SLAPO_GROUP_WORLD) == 0;
  for (int i = 0; s == SLAPO_OK && writer && i < o->n; i++)
    if (!o->slots[i].m)
      s = slapo_error(SLAPO_STATE, "adamw: the moments of %s are another rank's (slapo_pp_gather "
                      "brings them here before a save)", o->slots[i].path);
  for (int i = 0; s == SLAPO_OK && i < o->n; i++) {
    if (!o->slots[i].m) continue;
    size_t len = strlen(o->slots[i].path) + sizeof ".exp_avg_sq"; /* the longer suffix + NUL */
    owned[2 * i] = slapo_malloc(len);
    owned[2 * i + 1] = slapo_malloc(len);
    if (!owned[2 * i] || !owned[2 * i + 1]) {
      s = slapo_error(SLAPO_NOMEM, "adamw: out of memory");
      break;
    }
    snprintf(owned[2 * i], len, "%s.exp_avg", o->slots[i].path);
    snprintf(owned[2 * i + 1], len, "%s.exp_avg_sq", o->slots[i].path);
    names[2 * i] = owned[2 * i], names[2 * i + 1] = owned[2 * i + 1];
    bool tr = transposed && transposed(o->slots[i].path);
    s = state_view(o->slots[i].p, o->slots[i].m, tr, &views[2 * i]);
    if (s == SLAPO_OK) s = state_view(o->slots[i].p, o->slots[i].v, tr, &views[2 * i + 1]);
    ts[2 * i] = views[2 * i], ts[2 * i + 1] = views[2 * i + 1];
  }
  char step[32];
  snprintf(step, sizeof step, "%lld", (long long)o->t);
  const char *mk[16] = {"step"}, *mv[16] = {step};
  for (int i = 0; i < n_meta; i++) mk[1 + i] = keys[i], mv[1 + i] = values[i];
  if (s == SLAPO_OK && writer) s = slapo_safetensors_write(path, n, names, ts, 1 + n_meta, mk, mv);
  for (int i = 0; owned && i < n; i++) slapo_free(owned[i]);
  for (int i = 0; views && i < n; i++) slapo_tensor_free(views[i]);
  slapo_free(owned);
  slapo_free(views);
  slapo_free(names);
  slapo_free(ts);
  return s;
}

/* Checks that `f` holds f32 or bf16 tensors `name` shaped like `want`
 * (either converts to the optimizer's state dtype on load). */
static slapo_status check_state(const slapo_safetensors *f, const char *path, const char *name,
                                const slapo_tensor *want) {
  slapo_tensor *meta;
  SLAPO_TRY(slapo_safetensors_meta(f, name, &meta));
  slapo_status s = SLAPO_OK;
  if ((meta->dtype != SLAPO_DTYPE_F32 && meta->dtype != SLAPO_DTYPE_BF16) ||
      !slapo_shape_equal(meta->ndim, meta->shape, want->ndim, want->shape)) {
    char a[96], b[96];
    s = slapo_error(SLAPO_SHAPE, "adamw: %s: '%s' is %s %s, the model needs f32 or bf16 %s",
                    path, name,
                    slapo_dtype_name(meta->dtype),
                    slapo_shape_str(meta->ndim, meta->shape, a, sizeof a),
                    slapo_shape_str(want->ndim, want->shape, b, sizeof b));
  }
  slapo_tensor_free(meta);
  return s;
}

slapo_status slapo_adamw_load(slapo_adamw *o, const char *path,
                              bool (*transposed)(const char *param_path)) {
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read(path, &f));
  slapo_status s = SLAPO_OK;
  const char *step = slapo_safetensors_metadata(f, "step");
  char *end = NULL;
  long long t = step ? strtoll(step, &end, 10) : 0;
  if (!step || !step[0] || *end || t < 0)
    s = slapo_error(SLAPO_IO, "adamw: %s has no valid 'step' metadata", path);
  /* Two passes: check every tensor first, so a state that does not fit the
   * model changes nothing; then copy. */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; s == SLAPO_OK && i < o->n; i++) {
      /* A released slot's moments are loaded by the rank holding them. */
      for (int k = 0; s == SLAPO_OK && o->slots[i].m && k < 2; k++) {
        char *name = slapo_malloc(strlen(o->slots[i].path) + sizeof ".exp_avg_sq");
        if (!name) {
          s = slapo_error(SLAPO_NOMEM, "adamw: out of memory");
          break;
        }
        sprintf(name, "%s.%s", o->slots[i].path, k ? "exp_avg_sq" : "exp_avg");
        slapo_tensor *dst = NULL, *src = NULL, *want = NULL, *piece = NULL;
        const slapo_parameter *p = o->slots[i].p;
        bool tr = transposed && transposed(o->slots[i].path);
        s = file_view(k ? o->slots[i].v : o->slots[i].m, tr, &dst);
        if (s == SLAPO_OK && pass == 0) {
          /* A sharded parameter's state is stored unsharded: check that. */
          int64_t orig[SLAPO_MAX_DIMS];
          if (p->shard) slapo_shard_orig_shape(p->shard, orig);
          if (p->shard) s = slapo_tensor_new_meta(SLAPO_DTYPE_F32, p->shard->ndim, orig, &want);
          if (s == SLAPO_OK && want && tr) {
            int perm[2] = {1, 0};
            slapo_tensor *w2;
            s = slapo_tensor_permute(want, perm, &w2);
            slapo_tensor_free(want);
            want = w2;
          }
          if (s == SLAPO_OK) s = check_state(f, path, name, want ? want : dst);
        } else if (s == SLAPO_OK) {
          s = slapo_safetensors_get(f, name, &src);
          if (s == SLAPO_OK && src->dtype != o->slots[i].m->dtype) { /* f32 <-> bf16 state */
            slapo_tensor *conv = NULL;
            s = slapo_tensor_to_dtype(src, o->slots[i].m->dtype, &conv);
            slapo_tensor_free(src);
            src = conv;
          }
          if (s == SLAPO_OK && p->shard) { /* back to the parameter's layout, then its piece */
            slapo_tensor *un = NULL;
            s = file_view(src, tr, &un);
            if (s == SLAPO_OK) s = slapo_shard_slice(p->shard, un, &piece);
            slapo_tensor_free(un);
            slapo_tensor_free(dst);
            dst = NULL;
            if (s == SLAPO_OK) s = slapo_tensor_copy(k ? o->slots[i].v : o->slots[i].m, piece);
          } else if (s == SLAPO_OK) {
            s = slapo_tensor_copy(dst, src);
          }
          slapo_tensor_free(src);
        }
        slapo_tensor_free(piece);
        slapo_tensor_free(want);
        slapo_tensor_free(dst);
        slapo_free(name);
      }
    }
  }
  if (s == SLAPO_OK) o->t = t;
  slapo_safetensors_free(f);
  return s;
}
