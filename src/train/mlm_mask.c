/* train/mlm_mask.c - masked-LM corruption of a token batch (BERT, Devlin et
 * al. 2019 §3.1 and appendix A.1; the recipe of Hugging Face's
 * DataCollatorForLanguageModeling, with the count of Google's
 * create_pretraining_data.py): each sequence (a row of the last dimension,
 * T positions) gets exactly max(1, round(T * mask_prob)) chosen positions,
 * uniformly placed; a chosen one becomes [MASK] with probability 0.8,
 * a random token with 0.1 and stays itself with 0.1; labels hold the
 * original id at chosen positions and -100 elsewhere. Draws are Philox
 * keyed by the seed with the position, step and split as counter, so a
 * batch's masks are a pure function of (seed, split, step): the trainer's
 * validation batches (steps 0 .. val_batches - 1 of the validation split)
 * are masked the same way at every evaluation. Layer: train. */
#include <math.h>

#include "core/assert.h"
#include "slapo/train.h"

/* 2^32 * p, for comparing with a uniform 32-bit draw. */
static uint64_t threshold(double p) { return (uint64_t)(p * 4294967296.0); }

/* round(T * p), at least 1, as Google's create_pretraining_data.py. A
 * per-position coin (Hugging Face's collator) chooses none in a short
 * sequence often enough (0.85^8 = 27 % at T = 8) that a small batch had no
 * loss and the optimizer stepped on zero gradients; with a fixed validation
 * mask the validation loss stayed 0 for the whole run. */
int64_t slapo_mlm_num_to_predict(const slapo_mlm_config *c, int64_t T) {
  if (T < 1) return 0;
  int64_t k = (int64_t)floor((double)T * c->mask_prob + 0.5);
  return k < 1 ? 1 : k > T ? T : k;
}

/* Corrupts a chosen position *x and sets its label *y; r[1] and r[2] are
 * the position's own uniform draws. */
static void corrupt(const slapo_mlm_config *c, const uint32_t r[4], int32_t *x, int32_t *y) {
  *y = *x;
  if (r[1] < threshold(0.8)) *x = (int32_t)c->mask_token;
  else if (r[1] < threshold(0.9)) /* uniform in [0, random_vocab) by multiply-shift */
    *x = (int32_t)(((uint64_t)r[2] * (uint64_t)c->random_vocab) >> 32);
}

slapo_status slapo_mlm_mask(const slapo_mlm_config *c, uint64_t seed, bool val, int64_t step,
                            slapo_tensor *idx, slapo_tensor *labels) {
  if (!(c->mask_prob > 0 && c->mask_prob <= 1) || c->mask_token < 0 || c->random_vocab < 1 ||
      c->random_vocab > INT32_MAX)
    return slapo_error(SLAPO_INVALID_ARG,
                       "mlm mask: mask_prob %g must be in (0, 1], mask_token "
                       "%lld >= 0 and random_vocab %lld >= 1",
                       c->mask_prob, (long long)c->mask_token, (long long)c->random_vocab);
  if (idx->dtype != SLAPO_DTYPE_I32 || labels->dtype != SLAPO_DTYPE_I32 ||
      !slapo_shape_equal(idx->ndim, idx->shape, labels->ndim, labels->shape) || idx->ndim < 1 ||
      !slapo_tensor_is_contiguous(idx) || !slapo_tensor_is_contiguous(labels))
    return slapo_error(SLAPO_INVALID_ARG, "mlm mask: idx and labels must be contiguous i32 "
                       "tensors of one shape, at least 1-D");
  int32_t *x = slapo_tensor_data(idx), *y = slapo_tensor_data(labels); /* [B, T] */
  int64_t n = slapo_tensor_numel(idx), T = idx->shape[idx->ndim - 1];
  int64_t k = slapo_mlm_num_to_predict(c, T);
  /* A key of its own (not the batch windows' or dropout's). */
  uint32_t key[2] = {(uint32_t)seed ^ 0x6d6c6d31u, (uint32_t)(seed >> 32) ^ 0x4d41534bu};
  int64_t left = 0; /* positions the current sequence still has to choose */
  for (int64_t i = 0; i < n; i++) { /* n is 0 when T is */
    int64_t t = i % T;
    if (t == 0) left = k;
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32) ^ ((uint32_t)val << 31),
                       (uint32_t)step, (uint32_t)((uint64_t)step >> 32)}, r[4];
    slapo_philox4x32_10(ctr, key, r);
    /* Selection sampling (Knuth's Algorithm S): position t of T is chosen
     * with probability left / (T - t), which picks exactly k positions,
     * every k-subset equally likely, in one pass with no buffer. */
    if ((int64_t)(((uint64_t)r[0] * (uint64_t)(T - t)) >> 32) >= left) {
      y[i] = SLAPO_IGNORE_INDEX;
      continue;
    }
    left--;
    corrupt(c, r, &x[i], &y[i]);
  }
  return SLAPO_OK;
}
