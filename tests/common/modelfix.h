/* tests/common/modelfix.h - checking a model family against its PyTorch
 * fixture (tools/gen_<family>_fixture.py): logits and loss, every parameter
 * gradient, and the losses of a few AdamW steps, with one tolerance
 * argument per check. Shared by tests/models/test_*_torch.c. */
#ifndef SLAPO_TESTS_MODELFIX_H
#define SLAPO_TESTS_MODELFIX_H

#include <stdbool.h>

#include "slapo/train.h"

/* One model and its fixture. The model's forward takes the fixture tensors
 * named in `inputs` (n_in of them; the last is the labels for the loss). */
typedef struct modelfix {
  slapo_module *model;          /* materialized, fixture weights loaded    */
  const slapo_safetensors *fix; /* the fixture                             */
  int n_in;
  const char *inputs[4];        /* {"input_ids", "labels"} for causal LMs  */
  /* Parameters whose fixture gradient is stored transposed ([in, out]:
   * GPT-2's Conv1D weights); NULL: none. */
  bool (*transposed)(const char *path);
} modelfix;

/* Eval logits (forward without the labels) within tol of "logits"'s
 * largest magnitude, and the train loss within tol relative of "loss". */
void modelfix_logits_and_loss(const modelfix *c, double tol);
/* Every gradient within tol of its "grad.<path>"'s largest magnitude;
 * exactly n_params parameters. */
void modelfix_gradients(const modelfix *c, int n_params, double tol);
/* 5 AdamW steps (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
 * >= 2-d parameters, clip 1.0): each loss within tol relative (+1e-5) of
 * "adamw_losses". */
void modelfix_adamw(const modelfix *c, double tol);

#endif
