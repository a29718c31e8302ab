/* train/accumulate.c - one optimizer step's micro-batches, weighted by their
 * valid (non-ignored) targets so that the accumulated gradient and the loss
 * are those of the whole step's batch: L = sum over every valid token of the
 * step / N, where N counts the step's valid tokens. Micro-batch i holds n_i
 * of them and its graph computes the mean over them (mean_i), so its loss
 * enters with weight n_i / N: sum_i (n_i / N) mean_i = L, and the backward's
 * seed n_i / N makes the gradients add up to dL/dθ. Averaging each
 * micro-batch's mean equally (weight 1 / K) is right only when every n_i is
 * the same. Under data parallelism N counts the valid targets of every
 * data-parallel rank's micro-batches (one all-reduce), so after the
 * gradients' all-reduce (slapo_dp_all_reduce_grads) they are those of the
 * global batch's token mean. Layer: train. */
#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"
#include "train/internal.h"

/* Targets of a micro-batch that are not SLAPO_IGNORE_INDEX. */
static int64_t valid_targets(const slapo_tensor *t) {
  int64_t n = slapo_tensor_numel(t), k = 0;
  if (t->dtype == SLAPO_DTYPE_I64) {
    const int64_t *p = slapo_tensor_data(t);
    for (int64_t i = 0; i < n; i++) k += p[i] != SLAPO_IGNORE_INDEX;
  } else {
    const int32_t *p = slapo_tensor_data(t);
    for (int64_t i = 0; i < n; i++) k += p[i] != SLAPO_IGNORE_INDEX;
  }
  return k;
}

slapo_status slapo__micro_weights(int n_micro, const slapo_tensor *const *inputs, double *w,
                                  int64_t *n_valid) {
  if (n_micro < 1)
    return slapo_error(SLAPO_INVALID_ARG, "train_accumulate: %d micro-batches (need >= 1)",
                       n_micro);
  int64_t total = 0;
  for (int m = 0; m < n_micro; m++) {
    const slapo_tensor *t = inputs[2 * m + 1];
    if (!t || (t->dtype != SLAPO_DTYPE_I32 && t->dtype != SLAPO_DTYPE_I64) ||
        !slapo_tensor_is_contiguous(t))
      return slapo_error(SLAPO_INVALID_ARG, "train_accumulate: micro-batch %d: targets must be "
                         "contiguous i32 or i64", m);
    total += valid_targets(t);
  }
  double global = (double)total; /* over every data-parallel rank */
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_DP, &global, 1));
  /* With no valid target anywhere the loss and every gradient are 0, as
   * cross-entropy's mean over nothing is. */
  for (int m = 0; m < n_micro; m++)
    w[m] = global > 0 ? (double)valid_targets(inputs[2 * m + 1]) / global : 0.0;
  if (n_valid) *n_valid = (int64_t)global;
  return SLAPO_OK;
}

slapo_status slapo_train_accumulate(slapo_runner *r, int n_micro,
                                    const slapo_tensor *const *inputs,
                                    const slapo_kernel_env *envs, double *loss,
                                    int64_t *n_valid) {
  *loss = 0;
  if (n_valid) *n_valid = 0;
  double *w = slapo_calloc(n_micro > 0 ? (size_t)n_micro : 1, sizeof *w);
  if (!w) return slapo_error(SLAPO_NOMEM, "train_accumulate: out of memory");
  slapo_status s = slapo__micro_weights(n_micro, inputs, w, n_valid);
  double sum = 0;
  for (int m = 0; s == SLAPO_OK && m < n_micro; m++) {
    const slapo_tensor *out;
    /* The first micro-batch writes the grads, the last measures them. */
    unsigned grads = (m == 0 ? SLAPO_ACC_WRITE : SLAPO_ACC_ADD) |
                     (m == n_micro - 1 ? SLAPO_ACC_MEASURE : 0);
    s = slapo_step_grads(r, 2, inputs + 2 * m, SLAPO_STEP_TRAIN, &envs[m], (float)w[m], grads,
                         &out);
    if (s == SLAPO_OK) sum += w[m] * (double)*(const float *)slapo_tensor_data(out);
  }
  slapo_free(w);
  SLAPO_TRY(s);
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_DP, &sum, 1));
  *loss = sum;
  return SLAPO_OK;
}

slapo_status slapo_train_update(slapo_runner *r, slapo_module *model, slapo_adamw *opt, float lr,
                                double max_norm, double *norm, double *comm_s) {
  SLAPO_TRY(slapo_dp_all_reduce_grads(model, comm_s));
  double n = slapo_train_grad_norm(r, model);
  if (norm) *norm = n;
  slapo_adamw_step_scaled(opt, lr, slapo_clip_scale(n, max_norm), false);
  return SLAPO_OK;
}
