/* slapo/train.h - training: AdamW, learning-rate schedule, gradient
 * clipping, token data sets (text via a byte tokenizer, llm.c token files),
 * text sampling, training checkpoints, and the training loop.
 * Layer: train (depends on models and everything below). */
#ifndef SLAPO_TRAIN_H
#define SLAPO_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "slapo/tokenizer.h"
#include "slapo/dist.h"
#include "slapo/models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Optimizer                                                                 */
/* ------------------------------------------------------------------------ */

/* AdamW (Loshchilov & Hutter 2019, Algorithm 2; PyTorch torch.optim.AdamW):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr wd p
 * with decoupled weight decay skipped for parameters marked
 * no_weight_decay (biases, LayerNorm and other 1-D parameters); a
 * parameter tagged weight_decay=X (the annotate primitive) uses X. Each
 * parameter storage is visited once (tied weights). */
typedef struct slapo_adamw slapo_adamw;

typedef struct slapo_adamw_config {
  float beta1, beta2, eps, weight_decay; /* 0.9, 0.95, 1e-8, 0.1 */
  /* Keep m and v in bf16 (half the state's memory): each update widens
   * them, computes in f32 exactly as the f32 state does, and stores them
   * back with stochastic rounding (a Philox draw per element, keyed by the
   * parameter's path, the step and the element: deterministic, so a resumed
   * run stays bit-identical). Round-to-nearest would stall v: once v is
   * near g^2, (1 - beta2) (g^2 - v) is below half a bf16 ulp of v. */
  bool state_bf16;
} slapo_adamw_config;

/* Creates the optimizer over every parameter of `model` (materialized;
 * borrowed, must outlive the optimizer). Errors: SLAPO_STATE, NOMEM. */
slapo_status slapo_adamw_new(slapo_module *model, const slapo_adamw_config *cfg,
                             slapo_adamw **out);
void slapo_adamw_free(slapo_adamw *o);
/* One update with learning rate `lr` from the parameters' gradients. */
void slapo_adamw_step(slapo_adamw *o, float lr);
/* The same update with every gradient read as g * grad_scale: bitwise what
 * scaling the gradients first and then calling slapo_adamw_step gives (one
 * float product either way). With slapo_clip_grad_norm(model, 0) (measure
 * only) and slapo_clip_scale, clipping costs one read of the gradients
 * instead of a read plus a read-write pass over them. zero_grads: set every
 * gradient to 0 once read, as slapo_module_zero_grad would before the next
 * step, in the same pass over memory; otherwise the gradients are left as
 * they were (unscaled). */
void slapo_adamw_step_scaled(slapo_adamw *o, float lr, float grad_scale, bool zero_grads);
/* slapo_adamw_new keeping moments only for the parameters for which
 * keep(p, ud) is true (a pipeline stage's own: slapo_pp_adamw_new); the
 * others are *released*: no memory, not updated, not loaded (the rank
 * holding them loads theirs). keep NULL: every parameter. */
slapo_status slapo_adamw_new_select(slapo_module *model, const slapo_adamw_config *cfg,
                                    bool (*keep)(const slapo_parameter *p, void *ud), void *ud,
                                    slapo_adamw **out);
/* Releases the moments of the parameters for which keep(p, ud) is false
 * and gives the others (zeroed) moments where they had none; the step
 * count t still counts every step. keep NULL: every parameter kept.
 * Errors: NOMEM. */
slapo_status slapo_adamw_select(slapo_adamw *o, bool (*keep)(const slapo_parameter *p, void *ud),
                                void *ud);
/* The moments m and v of parameter p (borrowed: shaped like p, f32 or bf16
 * by state_bf16; zeroed ones allocated if p's were released), for moving
 * them between ranks. Errors: SLAPO_NOT_FOUND (p is not one of the
 * optimizer's), NOMEM. */
slapo_status slapo_adamw_moments(slapo_adamw *o, const slapo_parameter *p, slapo_tensor **m,
                                 slapo_tensor **v);
/* Number of steps taken (t). */
int64_t slapo_adamw_steps(const slapo_adamw *o);
/* Saves / loads the state to / from a safetensors file; save is atomic and
 * needs every parameter's moments (SLAPO_STATE naming a released one);
 * load fills the moments that are not released. The
 * file holds `<param>.exp_avg` and `<param>.exp_avg_sq` (f32) per parameter
 * path and the step count t as metadata "step", in the layout of the model's
 * weights file: a 2-D parameter for which `transposed(path)` is true (may be
 * NULL: none) is stored transposed, as the weights file stores it (GPT-2's
 * Conv1D weights: slapo_gpt2_is_conv1d_weight). Errors: SLAPO_IO,
 * SLAPO_NOT_FOUND / SLAPO_SHAPE (state does not fit the model, naming the
 * parameter; load then changes nothing), NOMEM. */
slapo_status slapo_adamw_save(const slapo_adamw *o, const char *path,
                              bool (*transposed)(const char *param_path));
slapo_status slapo_adamw_load(slapo_adamw *o, const char *path,
                              bool (*transposed)(const char *param_path));
/* slapo_adamw_save with `n_meta` (0 to 15) more metadata pairs beside
 * "step" (the training loop's checkpoint pair id, slapo_pair). Keys and
 * values are copied. Errors: those of slapo_adamw_save; SLAPO_INVALID_ARG
 * for a count out of range, a NULL key or value, or the key "step". */
slapo_status slapo_adamw_save_meta(const slapo_adamw *o, const char *path,
                                   bool (*transposed)(const char *param_path), int n_meta,
                                   const char *const *keys, const char *const *values);

/* Data parallelism: sums every parameter's gradient over the data-parallel
 * group (the micro-batches' weights already divide by the global token
 * count), in buckets of about 32 MiB packed in visit order, one
 * MPI_Allreduce each. Without data parallelism it does nothing.
 * `comm_s` (may be NULL) receives the seconds spent. Errors: NOMEM, those
 * of MPI. */
slapo_status slapo_dp_all_reduce_grads(slapo_module *model, double *comm_s);

/* Scales all gradients so their global L2 norm is at most max_norm (PyTorch
 * clip_grad_norm_); returns the norm before clipping. max_norm <= 0: only
 * measures. Under tensor parallelism the norm is over the unsharded
 * model: a sharded parameter's squares are summed over the group, a
 * replicated one counted once. NaN when that all-reduce fails. */
double slapo_clip_grad_norm(slapo_module *model, double max_norm);
/* The global norm from this rank's sums of squares: `replicated` (counted
 * once) and `sharded` (tensor-parallel pieces, summed over the group). NaN
 * when the all-reduce fails. */
double slapo_grad_norm_from_sumsq(double replicated, double sharded);
/* The factor slapo_clip_grad_norm scales the gradients by, for a measured
 * global norm: max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm,
 * else 1 (as torch.nn.utils.clip_grad_norm_). */
float slapo_clip_scale(double norm, double max_norm);

/* Learning rate at `step` (0-based): linear warmup from 0 over `warmup`
 * steps to `max_lr`, then cosine decay to `min_lr` at `total` steps. */
float slapo_lr_at(int64_t step, int64_t warmup, int64_t total, float max_lr, float min_lr);

/* ------------------------------------------------------------------------ */
/* Data                                                                      */
/* ------------------------------------------------------------------------ */

/* A token stream split into training and held-out validation parts. */
typedef struct slapo_dataset slapo_dataset;

/* Loads `path`: an llm.c token file (header of 256 int32 with magic
 * 20240520, version 1 and the token count, then uint16 tokens) or, for any
 * other file, text tokenized as bytes (vocabulary 256). A directory loads
 * every regular file in it whose name has no '.', in name order, as text
 * (the fortunes corpus). The last `val_fraction` of tokens is held out.
 * Errors: SLAPO_IO (unreadable, empty, truncated token file, naming the path
 * and the sizes), NOMEM. *out owned. */
slapo_status slapo_dataset_load(const char *path, double val_fraction, slapo_dataset **out);
void slapo_dataset_free(slapo_dataset *d);
/* The identity of the data slapo_dataset_load(path) would read, without
 * loading it: *digest = XXH3-64 chained over the bytes in 1 MiB chunks (a
 * directory: its text files in name order, as the load reads them), over
 * the whole content; *nbytes their total. One read of the data, a 1 MiB
 * buffer. For ranks checking they train on the same data. Errors: SLAPO_IO
 * (unreadable: names the path), SLAPO_NOMEM, SLAPO_INVALID_ARG (NULL). */
slapo_status slapo_dataset_digest(const char *path, uint64_t *digest, int64_t *nbytes);
/* The bytes slapo_dataset_load would read as text from `path` (a file, or a
 * directory's text files in name order), into *text (owned; NULL when
 * empty) and *len. Errors: SLAPO_IO (naming the path), SLAPO_NOMEM. */
slapo_status slapo_text_read(const char *path, char **text, size_t *len);
int64_t slapo_dataset_tokens(const slapo_dataset *d, bool val);
/* Where the validation split of text[0..len) starts: the last
 * val_fraction of its bytes, moved forward to a character's first byte. */
size_t slapo_text_val_cut(const char *text, size_t len, double val_fraction);
/* Text encoded by `tok` (slapo/tokenizer.h): text[0..cut) is the training
 * split and text[cut..len) the validation split, each encoded on its own
 * (so no token spans the cut), special tokens as plain text. The
 * vocabulary is tok's. *out owned. Errors: SLAPO_INVALID_ARG (cut > len),
 * SLAPO_NOMEM. */
slapo_status slapo_dataset_from_text(const char *text, size_t len, size_t cut,
                                     slapo_tokenizer *tok, slapo_dataset **out);
/* The UTF-8 bytes of a split's text (0 for a dataset not made from text
 * by slapo_dataset_from_text): what nats per byte divide by. */
int64_t slapo_dataset_text_bytes(const slapo_dataset *d, bool val);
/* Largest token id + 1 seen in the data. */
int64_t slapo_dataset_vocab(const slapo_dataset *d);
/* True for an llm.c token file: its version 1 holds GPT-2 BPE token ids
 * (llm.c's dev/data scripts), which mean other tokens to another family's
 * tokenizer; false for text read as bytes. */
bool slapo_dataset_gpt2_tokens(const slapo_dataset *d);

/* Fills idx and targets [B, T] i32 (targets = idx shifted by one) with B
 * windows whose start positions are drawn with Philox from (seed, step), so
 * a resumed run sees the same batches. Errors: SLAPO_INVALID_ARG when the
 * split is shorter than T + 1 tokens (naming both). */
slapo_status slapo_dataset_batch(const slapo_dataset *d, bool val, uint64_t seed, int64_t step,
                                 slapo_tensor *idx, slapo_tensor *targets);

/* Masked-LM corruption (BERT): what slapo_mlm_mask draws. */
typedef struct slapo_mlm_config {
  double mask_prob;     /* share of positions chosen, in (0, 1] (0.15, BERT's) */
  int64_t mask_token;   /* [MASK] id, >= 0                                    */
  int64_t random_vocab; /* random replacements are ids in [0, random_vocab):
                           the data's vocabulary (256, bytes, for text)       */
} slapo_mlm_config;

/* Corrupts idx [B, T] i32 in place for masked-LM training and fills labels
 * [B, T] i32 (contiguous, same shape): each sequence (row of T) gets
 * exactly max(1, round(T * mask_prob)) chosen positions, uniformly placed
 * (the count of Google's create_pretraining_data.py: a short sequence
 * always has a loss); a chosen one becomes mask_token (80 %), a random
 * id in [0, random_vocab) (10 %) or stays (10 %), as Devlin et al. 2019
 * and Hugging Face's DataCollatorForLanguageModeling do; labels are the
 * original ids at chosen positions and SLAPO_IGNORE_INDEX elsewhere. Draws
 * are Philox keyed by seed at counter (position, split, step), so masks are
 * a pure function of (seed, val, step, and idx's content): the same batch
 * step masks the same way every time (fixed validation masks). Errors:
 * SLAPO_INVALID_ARG (mask_prob outside (0, 1], mask_token < 0, random_vocab
 * < 1, tensors not contiguous i32 of one shape, at least 1-D). */
slapo_status slapo_mlm_mask(const slapo_mlm_config *c, uint64_t seed, bool val, int64_t step,
                            slapo_tensor *idx, slapo_tensor *labels);
/* Positions slapo_mlm_mask chooses in each sequence of T: max(1, round(T *
 * mask_prob)), at most T; 0 when T < 1. */
int64_t slapo_mlm_num_to_predict(const slapo_mlm_config *c, int64_t T);

/* ------------------------------------------------------------------------ */
/* Sampling                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct slapo_sample_opts {
  int64_t n_ctx;     /* the model's context: the window of tokens it sees  */
  float temperature; /* > 0                                                */
  int top_k;         /* sample from the top_k most likely; <= 0: all       */
  int64_t vocab;     /* sample ids below this only (a vocabulary padded past
                        the tokenizer's, as GPT-2's 50304); <= 0: all      */
  uint64_t seed;     /* Philox key of the draws                            */
  bool no_cache;     /* recompute the whole window for every token (the
                        reference the KV-cache path is checked against)    */
  /* Called after each token with (tokens done, n_new); may be NULL. */
  void (*progress)(int64_t done, int64_t total, void *ud);
  void *ud;
} slapo_sample_opts;

/* Appends `n_new` tokens to `tokens` (capacity >= *n + n_new; *n >= 1),
 * sampling from softmax(logits / temperature) restricted to the top_k most
 * likely, with Philox keyed by seed, in eval mode. The model sees the last
 * n_ctx tokens. With a KV cache (unless no_cache, and when the model
 * decodes: slapo_step_decode) each token costs one position's compute; the
 * logits equal the window's up to summation order, so greedy sampling
 * (top_k 1) gives the same tokens. Errors: SLAPO_INVALID_ARG (empty prompt,
 * temperature <= 0, n_ctx < 2), those of the steps. */
slapo_status slapo_sample(slapo_runner *r, const slapo_sample_opts *o, int32_t *tokens,
                          int64_t *n, int64_t n_new);

/* ------------------------------------------------------------------------ */
/* Training loop                                                             */
/* ------------------------------------------------------------------------ */

/* Runs one optimizer step's n_micro micro-batches through the TRAIN step,
 * setting the parameters' grads to the sum of their gradients (the first
 * micro-batch overwrites the grads: no zeroing needed before), each
 * weighted by its share of the step's valid targets: the result is the
 * gradient of the step's token mean, L = (sum of the losses of every target
 * that is not SLAPO_IGNORE_INDEX) / N, whatever the micro-batches' counts.
 * inputs [2 * n_micro]: idx, targets per micro-batch (targets [..] i32 or
 * i64, contiguous; the root's output must be the mean cross-entropy over
 * its valid targets); envs [n_micro]: each micro-batch's kernel env (its
 * dropout step). *loss = L; *n_valid = N (may be NULL). With N = 0 the loss
 * and gradients are 0. Under data parallelism (slapo_dist_init) N and L
 * are over every data-parallel rank's micro-batches (all-reduced), so
 * after slapo_dp_all_reduce_grads the gradients are those of the global
 * batch. Errors: SLAPO_INVALID_ARG (n_micro < 1, targets), those of
 * slapo_step and of the all-reduce. */
slapo_status slapo_train_accumulate(slapo_runner *r, int n_micro,
                                    const slapo_tensor *const *inputs,
                                    const slapo_kernel_env *envs, double *loss,
                                    int64_t *n_valid);

/* slapo_train_accumulate for pipeline parallelism: runs this rank's
 * stage (its index = the rank in SLAPO_GROUP_PP, whose size must be the
 * stage count) through `sched`'s action list for n_micro micro-batches
 * (slapo_pp_actions), moving activations and gradients with the
 * neighbouring stages (slapo_dist_pp_exchange). Same inputs, envs,
 * weighting and gradient flags as slapo_train_accumulate, so the loss
 * (every rank gets it) and the gradients of the stage's parameters are
 * bitwise what one process computes, except those of parameters several
 * stages hold: sum them with slapo_pp_sum_tied_grads. Gradients of the
 * parameters other stages hold are left alone. st needs 1F1B's
 * min(p - s, n_micro) slots or GPipe's n_micro. Errors: SLAPO_INVALID_ARG
 * (the pipeline group does not match the stage, too few slots, targets),
 * those of the stage's runs and of MPI (SLAPO_COMM on a timeout). */
slapo_status slapo_pp_train_accumulate(slapo_pp_stage *st, slapo_pp_schedule sched, int n_micro,
                                       const slapo_tensor *const *inputs,
                                       const slapo_kernel_env *envs, double *loss,
                                       int64_t *n_valid);
/* Forward only through the pipeline (validation): n batches, inputs [2 n]
 * and envs [n] as slapo_pp_train_accumulate's (envs' training false: no
 * dropout), each received from the previous stage, run in slot 0 and sent
 * on, stage s + 1 running batch i while stage s runs i + 1; losses [n]
 * (each batch's mean loss, from the last stage) on every rank of the
 * group: as one process's EVAL step gives them. Errors: SLAPO_INVALID_ARG
 * (n < 1, the group does not match the stage), those of the forwards and
 * of MPI. */
slapo_status slapo_pp_eval(slapo_pp_stage *st, int n, const slapo_tensor *const *inputs,
                           const slapo_kernel_env *envs, double *losses);
/* Sums the gradient of every parameter of `model` that more than one
 * stage holds, after slapo_pp_train_accumulate: each holder then has the
 * whole gradient (within rounding of one process's, which sums in another
 * order). One the first and the last stage alone hold (GPT-2's tied wte /
 * lm_head) is summed over the embedding group (SLAPO_GROUP_EMBED: the
 * stages between move nothing); another tie over the pipeline group, a
 * stage that does not hold it taking part with a zeroed grad (allocated
 * if it had none) and getting the sum too. Every rank of the group calls
 * it; *n_tied (may be NULL) counts such parameters. Errors: NOMEM, those
 * of MPI. */
slapo_status slapo_pp_sum_tied_grads(const slapo_pp_stage *st, slapo_module *model, int *n_tied);
/* The rest of an optimizer step after slapo_pp_train_accumulate, as
 * slapo_train_update for one process: the tied gradients summed
 * (slapo_pp_sum_tied_grads), the stage's gradients all-reduced over the
 * data-parallel group, the global norm (each parameter's squares counted
 * once, on the first stage holding it, summed over the pipeline), then
 * AdamW at `lr` over the stage's own parameters (slapo_adamw_select
 * releases the moments of the others, as slapo_pp_adamw_new creates it)
 * reading the gradients clipped to max_norm (<= 0: not clipped). A
 * parameter no stage reads is stage 0's, with a zero gradient. Then every
 * holder of a tied parameter must have bitwise the same weights (a digest
 * each, all-gathered). Not under tensor parallelism. *norm, *comm_s (the
 * data-parallel all-reduce's seconds) may be NULL. Errors: SLAPO_VERIFY
 * (tied copies that differ, naming the parameter, the stages and the
 * step), SLAPO_COMM, NOMEM, those of MPI. */
slapo_status slapo_pp_train_update(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt,
                                   float lr, double max_norm, double *norm, double *comm_s);
/* The optimizer of this rank's stage (instead of slapo_adamw_new): AdamW
 * over the parameters the stage holds (slapo_adamw_new_select), no
 * moments for the others (which may be released already). Every rank of
 * the group calls it. Errors: NOMEM, those of MPI. */
slapo_status slapo_pp_adamw_new(const slapo_pp_stage *st, slapo_module *model,
                                const slapo_adamw_config *cfg, slapo_adamw **out);
/* Cuts this rank's memory to its stage: every parameter the stage does
 * not hold becomes a meta tensor (its weights freed) and loses its grad;
 * with opt, the others' moments are
 * released too (slapo_adamw_select). The stage runs on as before; what
 * needs the whole model (a checkpoint, sampling) calls slapo_pp_gather
 * first, and this again after. Every rank of the group calls it. Errors:
 * NOMEM, those of MPI. */
slapo_status slapo_pp_release(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt);
/* The whole model on stage 0 (the pipeline group's rank 0, which writes
 * checkpoints and samples): each parameter it does not hold is made
 * whole there (materialized if released) and its weights, and with opt
 * its AdamW moments, are sent to it by the first stage holding it. The
 * other ranks send and keep what they had. Every rank of the group calls
 * it. Errors: NOMEM, SLAPO_NOT_FOUND (opt is not over model), those of
 * MPI. */
slapo_status slapo_pp_gather(const slapo_pp_stage *st, slapo_module *model, slapo_adamw *opt);

/* `--pp k` without cut lines: splits the blocks of root's longest module
 * list into k contiguous stages whose largest cost is least
 * (slapo_pp_block_costs for inputs shaped like in [n_in], then
 * slapo_pp_balance: the same cuts on every rank) and marks the block
 * ending each stage as the `cut` primitive does. lines [cap] receives the
 * schedule lines that make the same stages ("transformer.h.1 cut\n", one
 * a cut); *share (may be NULL) the largest stage's share of the total
 * cost. Errors: SLAPO_STATE (root is cut already), SLAPO_INVALID_ARG (k
 * outside 1..4096, more stages than blocks: naming the list and its
 * length), SLAPO_NOT_FOUND (no module list), SLAPO_LIMIT (lines too long
 * for cap), those of slapo_pp_block_costs. */
slapo_status slapo_pp_auto_cut(slapo_module *root, int n_in, const slapo_tensor *const *in,
                               int k, char *lines, size_t cap, double *share);

/* What slapo_pp_verify found, over every stage of the pipeline. */
typedef struct slapo_pp_verify_report {
  double loss;       /* the pipelined step's loss                        */
  int n_bitwise;     /* gradients of parameters one stage holds, compared
                        bitwise                                          */
  int n_tied;        /* gradients of parameters several stages hold,
                        compared on each within the tolerance (counted
                        once)                                            */
  double tied_worst; /* their largest |pipelined - one process|          */
} slapo_pp_verify_report;

/* Pipeline parallelism against one process: `pp` (a scheduled model whose
 * cut lines make as many stages as the pipeline group has ranks; this
 * rank runs its stage, slapo_pp_train_accumulate under `sched`, then
 * slapo_pp_sum_tied_grads) and `one` (the same model, weights and
 * schedule, run whole by slapo_train_accumulate: one process ignores cut
 * lines) over the same n_micro micro-batches (inputs, envs as
 * slapo_train_accumulate's). The loss and the gradient of every parameter
 * one stage holds must be bitwise equal; those several stages hold (the
 * tied embedding) within tied_atol (absolute), since the holders' sum
 * meets in another order. Every rank of the group calls it; the verdict
 * is the group's. Needs a world of pipeline ranks alone. Errors:
 * SLAPO_VERIFY (the first difference this stage found, naming stage,
 * parameter, element and both values; or the loss; on the other ranks
 * "another stage's gradients differ"), SLAPO_INVALID_ARG (data- or
 * tensor-parallel ranks, a stage count other than the group's), those of
 * the stages and of MPI. */
slapo_status slapo_pp_verify(slapo_module *pp, slapo_module *one, slapo_pp_schedule sched,
                             int n_micro, const slapo_tensor *const *inputs,
                             const slapo_kernel_env *envs, double tied_atol,
                             slapo_pp_verify_report *out);

/* The global L2 norm of the gradients slapo_train_accumulate just left in
 * the parameters' grads (as slapo_clip_grad_norm(model, 0) measures it,
 * to rounding of the sum's order), from the sums of squares its last
 * micro-batch measured as each gradient was final: no pass over the
 * gradients. Under data parallelism the all-reduce changes the gradients
 * after that, so the norm is measured by slapo_clip_grad_norm instead, as
 * it is when the runner has no measure (grads written since). NaN when the
 * tensor-parallel all-reduce fails. */
double slapo_train_grad_norm(slapo_runner *r, slapo_module *model);

/* The rest of an optimizer step after slapo_train_accumulate: the
 * gradients' all-reduce under data parallelism, their global norm
 * (slapo_train_grad_norm), then AdamW at `lr` reading the gradients clipped
 * to max_norm (<= 0: not clipped), the clip folded into its one pass. The
 * grads are left as they were: the next slapo_train_accumulate overwrites
 * them. *norm: the norm before clipping; *comm_s: the all-reduce's seconds
 * (either may be NULL). Errors: those of the all-reduce. */
slapo_status slapo_train_update(slapo_runner *r, slapo_module *model, slapo_adamw *opt, float lr,
                                double max_norm, double *norm, double *comm_s);

/* What a training run needs, in bytes (slapo_memory_estimate_train). */
typedef struct slapo_memory_estimate {
  size_t weights, grads, optimizer; /* f32 copies of the parameters; AdamW's m, v
                                       (f32, or bf16 with optimizer_bf16)        */
  size_t train_activations;         /* planned peak of the TRAIN step             */
  size_t eval_activations;          /* the validation step [B, T]                 */
  size_t sample_activations;        /* the sampling window [1, n_ctx] (0: none)   */
  size_t activations;               /* what is alive at once: max(train + eval,
                                       eval + sample)                             */
  size_t resident;                  /* the process's resident memory at the call  */
  size_t total;
} slapo_memory_estimate;

/* Estimates what training `model` (meta or materialized, its schedule
 * applied) needs for batch x seq steps, with a sampling window of
 * sample_ctx tokens at the end (0: none), without allocating any of it:
 * activation peaks come from planning the step graphs on meta tensors.
 * Errors: those of building and planning the steps. */
slapo_status slapo_memory_estimate_train(slapo_module *model, int64_t batch, int64_t seq,
                                         int64_t sample_ctx, bool optimizer_bf16,
                                         slapo_memory_estimate *out);
/* The memory a run may use, in bytes, and where the figure comes from:
 * SLAPO_MEMORY_LIMIT when set (bytes, or with K/M/G/T), else the smaller of
 * the system's MemAvailable (plus what this process holds already) and the
 * process's cgroup memory.max. Errors: SLAPO_INVALID_ARG (bad
 * SLAPO_MEMORY_LIMIT). */
slapo_status slapo_memory_available(size_t *bytes, char *source, size_t cap);
/* One line of the estimate's breakdown in MiB, into buf [cap]. */
void slapo_memory_format(const slapo_memory_estimate *e, char *buf, size_t cap);
/* This process's resident memory now (VmRSS), bytes. */
size_t slapo_memory_resident(void);

/* Draws a metrics file (one JSON object per step with "step", "loss",
 * "tokens_per_s" and sometimes "val_loss", as slapo_train writes it) as a
 * self-contained SVG: loss and validation loss against step on top,
 * tokens/s below; written atomically to svg_path. Each panel's <g> carries
 * data-x-min/max, data-y-min/max and data-box ("x y w h"), the mapping of
 * its polylines' points. Errors: SLAPO_IO (unreadable or unwritable file),
 * SLAPO_PARSE (a line that is not a JSON object with an integer "step",
 * naming file and line), SLAPO_INVALID_ARG (no step with a loss), NOMEM. */
slapo_status slapo_plot_metrics(const char *metrics_path, const char *svg_path);

/* ------------------------------------------------------------------------ */
/* Profiling (`slapo profile`)                                               */
/* ------------------------------------------------------------------------ */

typedef struct slapo_profile_opts {
  int64_t batch, seq; /* token batches [batch, seq] (idx and targets)       */
  int64_t vocab;      /* ids drawn uniformly in [0, vocab)                  */
  int steps;          /* measured steps (>= 1), after one warm-up step      */
  int depth;          /* path levels kept below the root's children (>= 0;
                         a list index joins its list's level): 2 gives
                         transformer.wte, transformer.h.0.attn, lm_head     */
  uint64_t seed;      /* batches and dropout                                */
} slapo_profile_opts;

/* One module row: the step graph's nodes whose origin lies in `path`. */
typedef struct slapo_profile_row {
  char *path;            /* origin truncated to opts.depth; "." the root; owned */
  double fwd_ms, bwd_ms; /* mean per measured step of the nodes' wall time  */
  int n_fwd, n_bwd;      /* nodes in the forward / backward part            */
  /* Activation bytes at the live peak: the planned buffers (the planner's
   * sizes, 64-byte rounded) alive at the node where the step's live bytes
   * peak, that a node of this module wrote. Forward activations saved for
   * the backward, and backward temporaries, both count. */
  size_t act_nbytes;
} slapo_profile_row;

typedef struct slapo_profile {
  int n_rows;
  slapo_profile_row *rows; /* in graph order of each row's first node      */
  int steps;               /* measured steps                               */
  int n_nodes;             /* nodes of the step graph                      */
  double step_ms;          /* mean wall time of a step: slapo_step (forward
                              + backward + gradient accumulation) plus the
                              optimizer                                    */
  double nodes_ms;         /* sum of the rows' fwd_ms + bwd_ms             */
  double grads_ms;         /* mean of putting each gradient into its
                              parameter's grad and measuring it, after the
                              node that computes it (slapo_plan_accumulate_ms) */
  double optimizer_ms;     /* mean of slapo_train_update (gradient norm +
                              AdamW), as slapo_train's step                */
  double other_ms;         /* step_ms - nodes_ms - grads_ms - optimizer_ms:
                              what no timer covers (binding, executor loop) */
  double loss;             /* the last step's loss                         */
  size_t planned_peak_nbytes;  /* the plan's arena (slapo_plan_peak_nbytes) */
  size_t live_peak_nbytes;     /* sum of the rows' act_nbytes               */
  size_t measured_peak_nbytes; /* slapo_plan_measured_peak_nbytes: equals
                                  live_peak_nbytes (the executor counts the
                                  buffers slapo_plan_visit_peak lists)     */
} slapo_profile;

/* Runs 1 + opts.steps TRAIN steps of `model` (materialized, its schedule
 * applied) on random token batches with per-node timing, each followed by
 * an AdamW update (the model's weights change), and aggregates the nodes
 * of the step graph by module. Forward and backward are told apart by
 * graph order: the backward is everything after the "dloss" seed input
 * (recomputation of checkpointed regions included). *out owned
 * (slapo_profile_deinit). Errors: SLAPO_INVALID_ARG (opts), those of the
 * steps and the optimizer. */
slapo_status slapo_profile_run(slapo_module *model, const slapo_profile_opts *opts,
                               slapo_profile *out);
void slapo_profile_deinit(slapo_profile *p); /* NULL is fine */
/* The row path of a node origin at `depth` into buf [cap]: "" gives ".",
 * "transformer.h.0.attn.c_attn" at depth 2 gives "transformer.h.0.attn". */
void slapo_profile_row_path(const char *origin, int depth, char *buf, size_t cap);

typedef struct slapo_train_config {
  const char *model;        /* model family (slapo_model_find): "gpt2"    */
  const char *model_config; /* "tiny", "small", "124M", …                 */
  const char *data;         /* text file, token file or directory         */
  int64_t steps, batch, seq; /* seq 0: the config's context, at most 256 */
  int64_t grad_accum;       /* micro-batches per step (>= 1)              */
  slapo_pp_schedule pp_schedule; /* under pipeline parallelism (the
                               SLAPO_GROUP_PP group; stages from the
                               schedule's cut lines): 1F1B (default) or
                               GPipe                                      */
  float lr, min_lr;
  int64_t warmup;
  float weight_decay, grad_clip;
  bool optimizer_state_bf16; /* AdamW m and v in bf16 (slapo_adamw_config) */
  uint64_t seed;
  double dropout;           /* < 0: the config's default                  */
  int64_t val_every, val_batches;
  const char *metrics;      /* JSONL path or NULL                         */
  const char *plot;         /* SVG loss plot written at the end, or NULL
                               (needs metrics)                            */
  const char *save;         /* checkpoint path (model .safetensors) or NULL */
  int64_t save_every;       /* 0: only at the end (needs save)            */
  const char *resume;       /* checkpoint to continue from, or NULL       */
  const char *init_from;    /* Hugging Face weights to start from, or NULL */
  int64_t sample_tokens;    /* tokens to sample at the end (0: none; a
                               masked-LM family skips it with a message)  */
  float temperature;
  int top_k;
  int threads;              /* 0: OpenMP default                          */
  const char *schedule;     /* .sched file applied to the model, or NULL  */
  const char *precision;    /* "bf16": a root autocast line first; NULL f32 */
  /* How text becomes tokens: NULL reads text as bytes (as before
   * tokenizers); else "bytes", a tokenizer.json or directory
   * (slapo_tokenizer_open), or "bpe:N": a byte-level BPE of N tokens
   * learned on the training split (slapo_tokenizer_train). Token files
   * (llm.c) are read as they are; a tokenizer then only decodes samples. */
  const char *tokenizer;
  const size_t *disabled;   /* schedule step numbers to skip              */
  size_t n_disabled;
} slapo_train_config;

/* Defaults (shown by `slapo train --help`). */
void slapo_train_config_default(slapo_train_config *c);

/* What the loop reports after each step (for progress output). */
typedef struct slapo_train_event {
  int64_t step;          /* 1-based, after the update          */
  int64_t steps;
  double loss, lr, grad_norm, tokens_per_s, elapsed_s;
  bool has_val;
  double val_loss;
  double val_nats_per_byte; /* with has_val and a tokenizer: the summed loss
                               over the UTF-8 bytes its targets decode to;
                               comparable across tokenizers. NaN without */
  size_t peak_nbytes;    /* planned activation peak            */
  double comm_s;         /* data-parallel gradient all-reduce  */
  const char *sample;    /* final event only: sampled text     */
  int64_t sample_done;   /* sampling progress: tokens drawn of  */
  int64_t sample_total;  /* sample_total (0: not this event)    */
  const char *message;   /* informational line, or NULL        */
} slapo_train_event;

typedef void (*slapo_train_cb)(const slapo_train_event *e, void *ud);

/* Runs training as configured, calling `cb` after every step and once with
 * a message for each phase (and each checkpoint saved). Checked before the
 * first step: the checkpoint path (slapo_check_write_target, for the model
 * and its .optim file), save_every and plot without what they need. On
 * resume, weights and optimizer state saved at different steps are
 * refused. Errors: SLAPO_INVALID_ARG, SLAPO_IO (a metrics line that cannot
 * be written ends the run), and those of the pieces above, with their
 * messages. */
slapo_status slapo_train(const slapo_train_config *c, slapo_train_cb cb, void *ud);

#ifdef __cplusplus
}
#endif
#endif
