/* tensor/dtype.c - the dtype table (sizes and names, generated from
 * SLAPO_DTYPE_LIST) and conversions between f32 and the 16-bit float
 * formats bf16 (scalar and vector) and IEEE 754 binary16 (f16, scalar),
 * rounding to nearest even.
 * Layer: tensor. Formats: IEEE 754-2008 binary16; bfloat16 is the top half
 * of a binary32. */
#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/core/simd.h"
#include "slapo/tensor.h"

static const struct {
  size_t size;
  const char *name;
  const char *st_name;
} g_dtypes[SLAPO_DTYPE_COUNT] = {
#define ROW(e, n, sz, st) [SLAPO_DTYPE_##e] = {sz, n, st},
    SLAPO_DTYPE_LIST(ROW)
#undef ROW
};

bool slapo_dtype_is_float(slapo_dtype dt) {
  return dt == SLAPO_DTYPE_F32 || dt == SLAPO_DTYPE_F64 || dt == SLAPO_DTYPE_F16 ||
         dt == SLAPO_DTYPE_BF16;
}

size_t slapo_dtype_size(slapo_dtype dt) {
  SLAPO_ASSERT((unsigned)dt < SLAPO_DTYPE_COUNT);
  return g_dtypes[dt].size;
}

const char *slapo_dtype_name(slapo_dtype dt) {
  return (unsigned)dt < SLAPO_DTYPE_COUNT ? g_dtypes[dt].name : "unknown";
}

const char *slapo_dtype_st_name(slapo_dtype dt) {
  return (unsigned)dt < SLAPO_DTYPE_COUNT ? g_dtypes[dt].st_name : "unknown";
}

slapo_status slapo_dtype_from_st_name(const char *name, slapo_dtype *out) {
  for (int i = 0; name && i < SLAPO_DTYPE_COUNT; i++) {
    if (strcmp(name, g_dtypes[i].st_name) == 0) {
      *out = (slapo_dtype)i;
      return SLAPO_OK;
    }
  }
  return slapo_error(SLAPO_DTYPE, "dtype: unknown safetensors dtype '%s'",
                     name ? name : "(null)");
}

static uint32_t f32_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

float slapo_bf16_to_f32(uint16_t v) { return bits_f32((uint32_t)v << 16); }

/* The bf16 of an f32 bit pattern u, shared by the scalar and the vector
 * conversion so they cannot drift apart. Round to nearest even: add 0x7fff
 * plus the lowest kept bit and truncate; a carry out of the mantissa bumps
 * the exponent, up to infinity, as IEEE rounding says. Subnormals round the
 * same way (no flush: AVX512_BF16's VCVTNEPS2BF16 would flush them, one
 * reason slapo converts with integer operations instead). A NaN is kept a
 * NaN, its sign and top payload bits kept and quieted: rounding could carry
 * its payload into infinity. Written as a select, so loops vectorize. */
static inline uint16_t bf16_bits(uint32_t u) {
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t q = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

uint16_t slapo_f32_to_bf16(float v) { return bf16_bits(f32_bits(v)); }

SLAPO__SIMD_PROC(to_bf16_span, (const float *restrict x, uint16_t *restrict y, int64_t n),
                 (x, y, n)) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, sizeof u);
    y[i] = bf16_bits(u);
  }
}

SLAPO__SIMD_PROC(from_bf16_span, (const uint16_t *restrict x, float *restrict y, int64_t n),
                 (x, y, n)) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)x[i] << 16;
    memcpy(y + i, &u, sizeof u);
  }
}

void slapo_f32_to_bf16_n(const float *x, uint16_t *y, int64_t n) {
  if (n > 0) to_bf16_span(x, y, n);
}

void slapo_bf16_to_f32_n(const uint16_t *x, float *y, int64_t n) {
  if (n > 0) from_bf16_span(x, y, n);
}

float slapo_f16_to_f32(uint16_t v) {
  uint32_t sign = (uint32_t)(v & 0x8000u) << 16;
  uint32_t exp = (v >> 10) & 0x1fu, mant = v & 0x3ffu;
  if (exp == 0) {
    /* Zero or subnormal: mant * 2^-24, exact in f32. */
    float m = ldexpf((float)mant, -24);
    return sign ? -m : m;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t slapo_f32_to_f16(float v) {
  uint32_t u = f32_bits(v);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN */
  /* 65520 is halfway between the largest f16 (65504, odd mantissa) and 2^16:
   * it and everything above round to infinity. */
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  uint32_t exp = a >> 23;
  if (exp < 113) {
    /* Below 2^-14: an f16 subnormal, value / 2^-24 rounded to nearest even.
     * A result of 0x400 is the smallest normal, which is the right encoding. */
    int shift = 126 - (int)exp;
    if (shift > 24) return sign; /* < 2^-25 (or an f32 subnormal): rounds to 0 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
  }
  uint32_t h = ((exp - 112u) << 10) | ((a & 0x7fffffu) >> 13), rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry bumps exponent */
  return sign | (uint16_t)h;
}
