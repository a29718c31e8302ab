/* train/loop.c - the training loop: data, any registered model family,
 * AdamW with warmup + cosine schedule, micro-batches weighted by valid
 * tokens, clipping, validation, metrics (JSON lines), checkpoints with
 * resume, and a text sample at the end. Progress goes to a callback: the
 * library never prints. slapo_train reads as its parts: configuration
 * checks, data, model, resume, one step, what a step reports, sampling.
 * The family's objective decides what a batch is (draw_batch): causal LM
 * trains on next tokens, masked LM on corrupted windows (slapo_mlm_mask),
 * and only a causal LM is sampled from.
 * Layer: train. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"
#include "train/internal.h"

#define DEFAULT_CORPUS "/usr/share/games/fortunes"

void slapo_train_config_default(slapo_train_config *c) {
  const slapo_model_family *f = slapo_model_at(0);
  *c = (slapo_train_config){
      .model = f->name,
      .model_config = f->default_config,
      .data = DEFAULT_CORPUS,
      .steps = 300,
      .batch = 4,
      .seq = 0,
      .grad_accum = 1,
      .lr = 1e-3f,
      .min_lr = 1e-4f,
      .warmup = 30,
      .weight_decay = 0.1f,
      .grad_clip = 1.0f,
      .seed = 1337,
      .dropout = -1,
      .val_every = 50,
      .val_batches = 8,
      .sample_tokens = 200,
      .temperature = 0.8f,
      .top_k = 40,
  };
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void say(slapo_train_cb cb, void *ud, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  slapo_train_event e = {0};
  e.message = buf;
  if (cb) cb(&e, ud);
}

static void json_num(FILE *f, const char *key, double v, bool last) {
  if (isfinite(v)) fprintf(f, "\"%s\": %.8g%s", key, v, last ? "" : ", ");
  else fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
}

/* Everything one run holds; freed by trainer_free. */
typedef struct trainer {
  slapo_train_config c; /* with seq resolved */
  slapo_train_cb cb;
  void *ud;
  const slapo_model_family *fam;
  slapo_model_dims dims;
  slapo_dataset *data;
  slapo_tokenizer *tok;  /* --tokenizer's, or NULL (text as bytes, token files) */
  char tok_hash[24];     /* its hash in hex, the checkpoints' slapo_tokenizer */
  int64_t model_vocab;   /* the vocabulary the model is built with (0: the config's) */
  slapo_module *model;
  slapo_runner *runner;
  slapo_pp_stage *stage; /* this rank's pipeline stage, or NULL (no --pp) */
  slapo_adamw *opt;
  slapo_schedule_run sched;
  /* One idx / targets pair per micro-batch: the step's batch is drawn
   * before it runs, so the micro-batches can be weighted by valid tokens. */
  slapo_tensor **xs, **ys;
  const slapo_tensor **micro_in; /* [2 * grad_accum] */
  slapo_kernel_env *envs;        /* [grad_accum] */
  FILE *metrics;
  double t0;
} trainer;

/* The masked-LM recipe of BERT (Devlin et al. 2019 §3.1): 15 % of each
 * sequence's positions (at least one), [MASK] from the family, random replacements from the data's
 * vocabulary (bytes for text). */
static slapo_mlm_config mlm_config(const trainer *t) {
  return (slapo_mlm_config){.mask_prob = 0.15, .mask_token = t->dims.mask_token,
                            .random_vocab = slapo_dataset_vocab(t->data)};
}

/* Batch `step` of a split as the objective wants it: idx and next-token
 * targets (causal LM), or corrupted windows and the original ids at the
 * chosen positions (masked LM). A pure function of (seed, split, step), so
 * validation batches, masks included, are the same at every evaluation. */
static slapo_status draw_batch(const trainer *t, bool val, int64_t step, slapo_tensor *x,
                               slapo_tensor *y) {
  SLAPO_TRY(slapo_dataset_batch(t->data, val, t->c.seed, step, x, y));
  if (t->fam->objective != SLAPO_OBJECTIVE_MASKED_LM) return SLAPO_OK;
  slapo_mlm_config mc = mlm_config(t);
  return slapo_mlm_mask(&mc, t->c.seed, val, step, x, y);
}

/* Number of targets that count (not SLAPO_IGNORE_INDEX) in y [B, T] i32. */
static int64_t count_valid(const slapo_tensor *y) {
  const int32_t *p = slapo_tensor_data(y);
  int64_t k = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(y); i++) k += p[i] != SLAPO_IGNORE_INDEX;
  return k;
}

/* The UTF-8 bytes the counted targets of y [B, T] decode to (0 without a
 * tokenizer). */
static double target_bytes(const trainer *t, const slapo_tensor *y) {
  if (!t->tok) return 0;
  const int32_t *p = slapo_tensor_data(y);
  double k = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(y); i++)
    if (p[i] != SLAPO_IGNORE_INDEX) k += slapo_tokenizer_token_len(t->tok, p[i]);
  return k;
}

/* The mean losses of validation batches first, first + D, ... (k of them,
 * k <= grad_accum) into loss [k]: one EVAL step each, or under pipeline
 * parallelism forward only through the stages (the micro-batch tensors
 * are free between steps), each batch's targets left in t->ys. */
static slapo_status eval_batches(const trainer *t, int64_t first, int64_t D, int k, double *loss) {
  const slapo_train_config *c = &t->c;
  for (int m = 0; m < k; m++) {
    int64_t b = first + m * D;
    SLAPO_TRY(draw_batch(t, true, b, t->xs[m], t->ys[m]));
    t->micro_in[2 * m] = t->xs[m], t->micro_in[2 * m + 1] = t->ys[m];
    t->envs[m] = (slapo_kernel_env){c->seed, (uint64_t)b, false};
    const slapo_tensor *out;
    if (t->stage) continue;
    SLAPO_TRY(slapo_step(t->runner, 2, t->micro_in + 2 * m, SLAPO_STEP_EVAL, &t->envs[m], &out));
    loss[m] = (double)*(const float *)slapo_tensor_data(out);
  }
  return t->stage ? slapo_pp_eval(t->stage, k, t->micro_in, t->envs, loss) : SLAPO_OK;
}

/* The validation loss: the mean over every counted target of the
 * val_batches batches (each batch's mean weighted by its count; masked LM
 * batches count different numbers of chosen positions). */
static slapo_status eval_loss(const trainer *t, double *out, double *per_byte) {
  const slapo_train_config *c = &t->c;
  double sum = 0, bytes = 0, loss[64];
  int64_t total = 0;
  /* Data-parallel ranks split the validation batches and sum; the ranks of
   * a pipeline run theirs together, in chunks of at most grad_accum. */
  int64_t D = slapo_dist_size(SLAPO_GROUP_DP), d = slapo_dist_rank(SLAPO_GROUP_DP);
  int64_t chunk = c->grad_accum < 64 ? c->grad_accum : 64;
  for (int64_t b = d; b < c->val_batches; b += chunk * D) {
    int64_t left = (c->val_batches - b + D - 1) / D; /* this rank's batches from b on */
    int k = (int)(left < chunk ? left : chunk);
    SLAPO_TRY(eval_batches(t, b, D, k, loss));
    for (int m = 0; m < k; m++) {
      int64_t n = count_valid(t->ys[m]);
      sum += loss[m] * (double)n;
      total += n;
      bytes += target_bytes(t, t->ys[m]);
    }
  }
  double acc[3] = {sum, (double)total, bytes};
  SLAPO_TRY(slapo_dist_all_reduce_f64(SLAPO_GROUP_DP, acc, 3));
  *out = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  *per_byte = t->tok && acc[2] > 0 ? acc[0] / acc[2] : NAN;
  return SLAPO_OK;
}

/* What write_pair_file needs: the run and the step being saved. */
typedef struct pair_writer {
  const trainer *t;
  int64_t step;
} pair_writer;

/* One file of a checkpoint pair (slapo__ckpt_write_fn): the weights in the
 * family's Hugging Face layout with what check_saved reads, or the
 * optimizer state in the same layout; both carry the pair id. */
static slapo_status write_pair_file(int file, const char *path, const char *pair, void *ud) {
  const pair_writer *pw = ud;
  const trainer *t = pw->t;
  const slapo_train_config *c = &t->c;
  const char *pk[1] = {"slapo_pair"}, *pv[1] = {pair};
  if (file == 1) return slapo_adamw_save_meta(t->opt, path, t->fam->stored_transposed, 1, pk, pv);
  char st[32], seed[32];
  snprintf(st, sizeof st, "%lld", (long long)pw->step);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
  const char *keys[7] = {"slapo_step", "slapo_model", "slapo_config", "slapo_seed",
                         "slapo_pair", "slapo_tokenizer", "slapo_tokenizer_name"};
  const char *vals[7] = {st, t->fam->name, c->model_config, seed, pair, t->tok_hash,
                         c->tokenizer ? c->tokenizer : ""};
  return t->fam->save(t->model, path, t->tok ? 7 : 5, keys, vals);
}

/* The pair protocol (train/checkpoint.c) keeps the last good pair through
 * a save that fails, as on a full disk. Under pipeline parallelism the
 * writer (stage 0) holds the whole model and its moments for the save. */
static slapo_status save_checkpoint(const trainer *t, int64_t step) {
  pair_writer pw = {t, step};
  if (t->stage) SLAPO_TRY(slapo_pp_gather(t->stage, t->model, t->opt));
  slapo_status s = slapo__ckpt_save(t->c.save, step, write_pair_file, &pw);
  if (t->stage && s == SLAPO_OK) s = slapo_pp_release(t->stage, t->model, t->opt);
  return s;
}

static void trainer_free(trainer *t) {
  if (t->metrics) fclose(t->metrics);
  for (int64_t m = 0; t->xs && t->ys && m < t->c.grad_accum; m++) {
    slapo_tensor_free(t->xs[m]);
    slapo_tensor_free(t->ys[m]);
  }
  slapo_free(t->xs);
  slapo_free(t->ys);
  slapo_free(t->micro_in);
  slapo_free(t->envs);
  slapo_adamw_free(t->opt);
  slapo_pp_stage_free(t->stage);
  slapo_runner_free(t->runner);
  slapo_schedule_run_deinit(&t->sched);
  slapo_module_free(t->model);
  slapo_dataset_free(t->data);
  slapo_tokenizer_free(t->tok);
}

static slapo_status check_config(trainer *t) {
  slapo_train_config *c = &t->c;
  if (c->steps < 1 || c->batch < 1 || c->seq < 0 || c->grad_accum < 1 ||
      c->grad_accum > INT32_MAX)
    return slapo_error(SLAPO_INVALID_ARG,
                       "train: steps (%lld), batch (%lld) and grad_accum (%lld) must be >= 1, "
                       "seq (%lld) >= 0",
                       (long long)c->steps, (long long)c->batch, (long long)c->grad_accum,
                       (long long)c->seq);
  SLAPO_TRY(slapo_model_find(c->model, &t->fam));
  SLAPO_TRY(t->fam->dims(c->model_config, &t->dims));
  if (t->fam->objective == SLAPO_OBJECTIVE_MASKED_LM &&
      !(t->dims.mask_token >= 0 && t->dims.mask_token < t->dims.vocab_size))
    return slapo_error(SLAPO_INVALID_ARG, "train: %s %s trains a masked LM but its [MASK] id "
                       "%lld is not in the vocabulary [0, %lld)", t->fam->name, c->model_config,
                       (long long)t->dims.mask_token, (long long)t->dims.vocab_size);
  /* seq 0: the config's context, at most 256 (a CPU-sized default). */
  if (c->seq == 0) c->seq = t->dims.n_ctx < 256 ? t->dims.n_ctx : 256;
  if (c->seq > t->dims.n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "train: --seq %lld exceeds the %s context of %lld",
                       (long long)c->seq, c->model_config, (long long)t->dims.n_ctx);
  /* Fail before training, not after it, when the checkpoint cannot be
   * written (every file a save writes or renames). */
  if (c->save) SLAPO_TRY(slapo__ckpt_check_save(c->save));
  if (c->resume && c->init_from)
    return slapo_error(SLAPO_INVALID_ARG, "train: --resume %s and --init-from %s both set the "
                       "weights; give one (--resume also restores the optimizer and the step)",
                       c->resume, c->init_from);
  if (c->save_every > 0 && !c->save)
    return slapo_error(SLAPO_INVALID_ARG, "train: --save-every %lld needs --save FILE (the "
                       "checkpoint it rewrites)", (long long)c->save_every);
  if (c->plot && !c->metrics)
    return slapo_error(SLAPO_INVALID_ARG, "train: --plot %s needs --metrics FILE (the plot is "
                       "drawn from it)", c->plot);
  if (c->threads > 0) omp_set_num_threads(c->threads);
  return SLAPO_OK;
}

/* The vocabulary a tokenizer of V ids gives the model: a byte-sized
 * config of a causal LM (vocabulary <= 512) takes V padded to a multiple of
 * 128 (as GPT-2's 50257 is padded to 50304 for speed); a config with a
 * vocabulary of its own keeps it and must hold V. */
static slapo_status tokenizer_vocab(trainer *t, int64_t V) {
  const slapo_train_config *c = &t->c;
  bool masked = t->fam->objective == SLAPO_OBJECTIVE_MASKED_LM;
  if (masked && t->dims.vocab_size <= 512 && V > 256) {
    /* A byte-sized masked LM takes the tokenizer's mask token for [MASK]
     * (a slapo-learned BPE has <|mask|> at 257); its own [PAD] and [MASK]
     * ids past the bytes stay inside the padded vocabulary. */
    int32_t mask = slapo_tokenizer_special_id(t->tok, "<|mask|>");
    if (mask < 0)
      return slapo_error(SLAPO_INVALID_ARG, "train: %s %s trains a masked LM, but --tokenizer %s "
                         "has no <|mask|> token for [MASK] (a BPE learned by slapo, bpe:N or "
                         "'slapo tokenizer train', has it)", t->fam->name, c->model_config,
                         c->tokenizer);
    int64_t need = V > t->dims.vocab_size ? V : t->dims.vocab_size;
    t->model_vocab = (need + 127) / 128 * 128;
    say(t->cb, t->ud, "vocabulary: %s %s takes the tokenizer's %lld ids, padded to %lld; "
        "[MASK] is its <|mask|>, id %d", t->fam->name, c->model_config, (long long)V,
        (long long)t->model_vocab, mask);
    t->dims.vocab_size = t->model_vocab;
    t->dims.mask_token = mask;
    return SLAPO_OK;
  }
  if (t->dims.vocab_size <= 512 && !masked) {
    t->model_vocab = (V + 127) / 128 * 128;
    if (t->model_vocab != t->dims.vocab_size)
      say(t->cb, t->ud, "vocabulary: %s %s takes the tokenizer's %lld ids, padded to %lld",
          t->fam->name, c->model_config, (long long)V, (long long)t->model_vocab);
    t->dims.vocab_size = t->model_vocab;
    return SLAPO_OK;
  }
  if (V > t->dims.vocab_size)
    return slapo_error(SLAPO_INVALID_ARG, "train: --tokenizer %s has %lld ids but %s %s has a "
                       "vocabulary of %lld; use a tokenizer of at most that many, or a "
                       "byte-sized config (tiny, small), which takes the tokenizer's",
                       c->tokenizer, (long long)V, t->fam->name, c->model_config,
                       (long long)t->dims.vocab_size);
  return SLAPO_OK;
}

/* The data through --tokenizer: text encoded by it; a token file read as
 * it is, the tokenizer kept for samples and bytes. */
static slapo_status load_tokenized(trainer *t) {
  const slapo_train_config *c = &t->c;
  char note[512];
  SLAPO_TRY(slapo__text_dataset(c->data, c->tokenizer, 0.1, &t->tok, &t->data, note,
                                 sizeof note));
  say(t->cb, t->ud, "%s", note);
  snprintf(t->tok_hash, sizeof t->tok_hash, "%016llx",
           (unsigned long long)slapo_tokenizer_hash(t->tok));
  return tokenizer_vocab(t, slapo_tokenizer_vocab_size(t->tok));
}

static slapo_status load_data(trainer *t) {
  const slapo_train_config *c = &t->c;
  if (c->tokenizer) SLAPO_TRY(load_tokenized(t));
  else SLAPO_TRY(slapo_dataset_load(c->data, 0.1, &t->data));
  say(t->cb, t->ud, "data: %s: %lld training and %lld validation tokens (vocabulary %lld)",
      c->data, (long long)slapo_dataset_tokens(t->data, false),
      (long long)slapo_dataset_tokens(t->data, true), (long long)slapo_dataset_vocab(t->data));
  /* Both splits must hold one window: the validation split is first read
   * after the last step, and a run should not fail only after training. */
  for (int v = 0; v < 2; v++)
    if (slapo_dataset_tokens(t->data, v) < c->seq + 1)
      return slapo_error(SLAPO_INVALID_ARG,
                         "train: the %s split of %s has %lld tokens, fewer than --seq + 1 = "
                         "%lld; use more data or a shorter --seq",
                         v ? "validation" : "training", c->data,
                         (long long)slapo_dataset_tokens(t->data, v), (long long)(c->seq + 1));
  if (slapo_dataset_vocab(t->data) > t->dims.vocab_size)
    return slapo_error(SLAPO_INVALID_ARG,
                       "train: %s has token ids up to %lld but the %s config's vocabulary is "
                       "%lld",
                       c->data, (long long)slapo_dataset_vocab(t->data) - 1, c->model_config,
                       (long long)t->dims.vocab_size);
  /* Byte-level configs have 256 ids and a few special ones (BERT's 264). */
  if (!t->tok && slapo_dataset_vocab(t->data) <= 256 && t->dims.vocab_size > 512)
    say(t->cb, t->ud, "note: %s holds ids below 256 (text is read as bytes) but %s %s has a "
        "vocabulary of %lld: most of its embeddings never see a token and a sample prints "
        "token ids; give an llm.c token file for its tokenizer, or use a byte-level config "
        "(vocabulary 256; slapo models lists them)", c->data, t->fam->name, c->model_config,
        (long long)t->dims.vocab_size);
  if (slapo_dataset_gpt2_tokens(t->data) && strcmp(t->fam->name, "gpt2"))
    say(t->cb, t->ud, "note: %s is an llm.c token file of GPT-2 token ids; %s reads them as ids "
        "of its own vocabulary, where they stand for other tokens%s", c->data, t->fam->name,
        t->fam->objective == SLAPO_OBJECTIVE_MASKED_LM ? " (and may collide with its special "
                                                         "ids, such as [MASK])" : "");
  if (t->fam->objective == SLAPO_OBJECTIVE_MASKED_LM) {
    slapo_mlm_config mc = mlm_config(t);
    say(t->cb, t->ud, "objective: masked LM: %.0f %% of positions chosen (%lld of each sequence "
        "of %lld, at least 1), of those 80 %% become [MASK] (id %lld), 10 %% a random id below "
        "%lld, 10 %% stay; loss over the chosen ones", 100 * mc.mask_prob,
        (long long)slapo_mlm_num_to_predict(&mc, t->c.seq), (long long)t->c.seq,
        (long long)mc.mask_token, (long long)mc.random_vocab);
  }
  return SLAPO_OK;
}

/* Whether the run ends with a text sample: asked for, and the objective
 * generates left to right (a masked LM predicts positions it sees both
 * sides of, so there is nothing to sample from). */
static bool samples(const trainer *t) {
  return t->c.sample_tokens > 0 && t->fam->objective == SLAPO_OBJECTIVE_CAUSAL_LM;
}

/* Refuses a run whose estimate does not fit, before anything is allocated
 * (a model too large for the machine would otherwise allocate until the
 * kernel's OOM killer ends the process). */
static slapo_status check_memory(trainer *t) {
  const slapo_train_config *c = &t->c;
  /* A pipeline rank needs its stage's part: checked once the stages are
   * known (pp_check_memory). */
  if (slapo_dist_size(SLAPO_GROUP_PP) > 1) return SLAPO_OK;
  slapo_memory_estimate e;
  SLAPO_TRY(slapo_memory_estimate_train(t->model, c->batch, c->seq,
                                        samples(t) ? t->dims.n_ctx : 0, c->optimizer_state_bf16,
                                        &e));
  size_t avail;
  char source[96], line[512];
  SLAPO_TRY(slapo_memory_available(&avail, source, sizeof source));
  slapo_memory_format(&e, line, sizeof line);
  const double M = 1024.0 * 1024;
  if (e.total > avail)
    return slapo_error(SLAPO_LIMIT, "train: %s %s at batch %lld x seq %lld needs an estimated "
                       "%.1f MiB but %.1f MiB are available (%s): %s; use a smaller config, "
                       "batch or sequence, or checkpoint activations (--schedule)",
                       c->model, c->model_config, (long long)c->batch, (long long)c->seq,
                       (double)e.total / M, (double)avail / M, source, line);
  say(t->cb, t->ud, "memory: %s, of %.1f MiB available", line, (double)avail / M);
  return SLAPO_OK;
}

/* The schedule's lines, one a line, so a run's log says what was applied. */
static void say_schedule(trainer *t) {
  size_t n = slapo_sched_log_count(t->sched.log);
  for (size_t i = 0; i < n; i++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return;
    slapo_sched_entry_print(slapo_sched_log_entry(t->sched.log, i), f);
    fclose(f);
    say(t->cb, t->ud, "  %s", buf);
    free(buf);
  }
}

/* What save_checkpoint's metadata says of a checkpoint to resume (or, with
 * any_config, to start from): the model family it was saved from, and for
 * a resume the config, must be this run's, and *step gets the step its
 * weights were saved at (-1 when the file has no slapo_step: one written by
 * another program, such as Hugging Face's). Only the file's header is read. */
static slapo_status check_saved(const trainer *t, const char *path, bool any_config,
                                int64_t *step) {
  slapo_safetensors *f;
  SLAPO_TRY(slapo_safetensors_read_header(path, &f));
  const char *v = slapo_safetensors_metadata(f, "slapo_step");
  const char *model = slapo_safetensors_metadata(f, "slapo_model");
  const char *config = slapo_safetensors_metadata(f, "slapo_config");
  const char *tok = slapo_safetensors_metadata(f, "slapo_tokenizer");
  const char *tok_name = slapo_safetensors_metadata(f, "slapo_tokenizer_name");
  char *end = NULL;
  long long n = v ? strtoll(v, &end, 10) : -1;
  *step = v ? n : -1;
  slapo_status s = SLAPO_OK;
  if (v && (!v[0] || *end || n < 0))
    s = slapo_error(SLAPO_IO, "train: %s: metadata slapo_step '%s' is not a step count", path, v);
  else if ((model && strcmp(model, t->fam->name)) ||
           (!any_config && config && strcmp(config, t->c.model_config)))
    s = slapo_error(SLAPO_INVALID_ARG, "train: %s was saved from %s %s; this run is %s %s",
                    path, model ? model : t->fam->name, config ? config : t->c.model_config,
                    t->fam->name, t->c.model_config);
  else if (tok && strcmp(tok, t->tok ? t->tok_hash : ""))
    s = slapo_error(SLAPO_INVALID_ARG, "train: %s was trained with tokenizer %s (hash %s); this "
                    "run's is %s%s%s: the token ids would mean other text; give --tokenizer %s",
                    path, tok_name && *tok_name ? tok_name : "?", tok,
                    t->c.tokenizer ? t->c.tokenizer : "none (text as bytes)", t->tok ? " hash " : "",
                    t->tok ? t->tok_hash : "", tok_name && *tok_name ? tok_name : "as before");
  else if (!tok && t->tok && step && *step >= 0)
    s = slapo_error(SLAPO_INVALID_ARG, "train: %s was trained without a tokenizer (text as "
                    "bytes); this run has --tokenizer %s", path, t->c.tokenizer);
  slapo_safetensors_free(f);
  return s;
}

static void count_sharded(slapo_parameter *p, const char *path, void *ud) {
  (void)path;
  *(int64_t *)ud += p->shard != NULL;
}

/* Tensor-parallel ranks whose schedule shards nothing each run the whole
 * model: the same work tp times, correct but with nothing gained. */
static slapo_status warn_unsharded(const trainer *t, int tp) {
  if (tp < 2) return SLAPO_OK;
  int64_t sharded = 0;
  SLAPO_TRY(slapo_module_visit_params(t->model, count_sharded, &sharded));
  if (sharded == 0)
    say(t->cb, t->ud, "warning: --tp %d but no parameter is sharded (schedule: %s): each of "
        "the %d tensor-parallel ranks runs the whole model, the same work %d times; give a "
        "schedule that shards (e.g. schedules/%s) or use the ranks for data "
        "parallelism (--tp 1)", tp, t->c.schedule ? t->c.schedule : "none", tp, tp,
        t->fam->tp_schedule ? t->fam->tp_schedule : "a family's *_tp.sched");
  return SLAPO_OK;
}

/* The micro-batches this rank's stage keeps in flight (slapo_pp_slots). */
static int stage_slots(const trainer *t) {
  return slapo_pp_slots(t->c.pp_schedule, slapo_dist_size(SLAPO_GROUP_PP),
                        slapo_dist_rank(SLAPO_GROUP_PP), (int)t->c.grad_accum);
}

/* check_memory for a pipeline rank, before it allocates: its stage's
 * weights, gradients, AdamW state and activation slots, and on stage 0
 * the rest of the model it holds for a moment to save (weights and
 * moments) or sample (weights). */
static slapo_status pp_check_memory(trainer *t, const slapo_tensor *const *in) {
  const slapo_train_config *c = &t->c;
  int s = slapo_dist_rank(SLAPO_GROUP_PP);
  int64_t numel;
  size_t act, avail;
  SLAPO_TRY(slapo_pp_stage_estimate(t->model, 2, in, s, stage_slots(t), &numel, &act));
  const double per = 8.0 + (c->optimizer_state_bf16 ? 4.0 : 8.0); /* w, g; m, v */
  double rest = (double)(slapo_module_numel(t->model) - numel);
  double moment = rest * (c->optimizer_state_bf16 ? 4.0 : 8.0);
  double whole = s != 0 ? 0 : c->save ? rest * 4.0 + moment : samples(t) ? rest * 4.0 : 0;
  double need = (double)numel * per + (double)act + whole + (double)slapo_memory_resident();
  char source[96];
  SLAPO_TRY(slapo_memory_available(&avail, source, sizeof source));
  const double M = 1024.0 * 1024;
  char what[320], rest_of[96] = "";
  if (whole > 0) snprintf(rest_of, sizeof rest_of, " + the rest of the model to save or sample "
                          "%.1f MiB", whole / M);
  snprintf(what, sizeof what, "stage %d: %.2fM parameters x %.0f bytes (weights, gradients, "
           "AdamW) %.1f MiB + activations %.1f MiB (%d slot%s)%s + resident %.1f MiB = %.1f MiB",
           s, (double)numel / 1e6, per, (double)numel * per / M, (double)act / M, stage_slots(t),
           stage_slots(t) > 1 ? "s" : "", rest_of, (double)slapo_memory_resident() / M,
           need / M);
  if (need > (double)avail)
    return slapo_error(SLAPO_LIMIT, "train: --pp %d: %s, but %.1f MiB are available (%s); use "
                       "more stages, a smaller batch or sequence, or checkpoint activations",
                       slapo_dist_size(SLAPO_GROUP_PP), what, (double)avail / M, source);
  say(t->cb, t->ud, "memory: %s, of %.1f MiB available", what, (double)avail / M);
  return SLAPO_OK;
}

/* Under pipeline parallelism (SLAPO_GROUP_PP of p > 1 ranks) the stages:
 * the schedule's cut lines must make p of them, and without any,
 * slapo_pp_auto_cut balances p. Then this rank materializes what its stage
 * reads alone (a file loads that part: --resume, --init-from). The
 * micro-batch tensors give the shapes. */
static slapo_status pp_stages(trainer *t) {
  int p = slapo_dist_size(SLAPO_GROUP_PP);
  const slapo_train_config *c = &t->c;
  const slapo_tensor *in[2] = {t->xs[0], t->ys[0]}; /* the shapes */
  int n = slapo_pp_stage_count(t->model);
  if (n == 1) { /* no cut lines: balanced by cost */
    char lines[4096];
    double share;
    SLAPO_TRY(slapo_pp_auto_cut(t->model, 2, in, p, lines, sizeof lines, &share));
    say(t->cb, t->ud, "pipeline: no cut lines in the schedule; %d stages balanced by cost (the "
        "largest %.0f%% of the forward's), as these lines would make them:\n%.*s", p,
        100 * share, (int)strlen(lines) - 1, lines);
    n = p;
  }
  if (n != p)
    return slapo_error(SLAPO_INVALID_ARG, "train: --pp %d needs %d stages, but the schedule "
                       "(%s) cuts the model into %d; give %d cut lines (e.g. "
                       "'transformer.h.5 cut'; slapo help cut)", p, p,
                       c->schedule ? c->schedule : "none", n, p - 1);
  if (slapo_dist_size(SLAPO_GROUP_TP) > 1)
    return slapo_error(SLAPO_UNSUPPORTED, "train: --pp %d with --tp %d: pipeline and tensor "
                       "parallelism together are not built yet", p,
                       slapo_dist_size(SLAPO_GROUP_TP));
  SLAPO_TRY(pp_check_memory(t, in));
  return slapo_pp_stage_materialize(t->model, 2, in, slapo_dist_rank(SLAPO_GROUP_PP), c->seed);
}

/* The model: built on meta tensors, scheduled, checked against the memory
 * it will need, then materialized (under pipeline parallelism its stage's
 * part: pp_stages) and initialized from a file. Values do not depend on
 * the order: each is a function of seed, path and index, and replacement
 * modules keep the replaced parameters. */
static slapo_status build_model(trainer *t) {
  const slapo_train_config *c = &t->c;
  SLAPO_TRY(t->fam->create(c->model_config,
                           &(slapo_model_opts){.dropout = c->dropout, .vocab_size = t->model_vocab},
                           &t->model));
  if (c->schedule || c->precision) {
    SLAPO_TRY(slapo_models_init());
    SLAPO_TRY(slapo_schedule_file_apply(t->model, c->schedule, c->precision, c->disabled,
                                        c->n_disabled, &t->sched));
    say(t->cb, t->ud, "schedule: %s%s%s: applied %zu steps (%zu disabled)",
        c->precision ? "--precision bf16" : "", c->precision && c->schedule ? " + " : "",
        c->schedule ? c->schedule : "", t->sched.applied, c->n_disabled);
    say_schedule(t);
  }
  if (slapo_dist_active()) {
    char layout[160];
    slapo_dist_describe(layout, sizeof layout);
    say(t->cb, t->ud, "distributed: %s (rank 0 reports; each data-parallel rank draws its own "
        "micro-batches)", layout);
  }
  int tp = slapo_dist_size(SLAPO_GROUP_TP), dp = slapo_dist_size(SLAPO_GROUP_DP);
  SLAPO_TRY(warn_unsharded(t, tp));
  char per_rank[64] = "";
  if (tp > 1) snprintf(per_rank, sizeof per_rank, " on each of %d tensor-parallel ranks", tp);
  say(t->cb, t->ud, "model: %s %s (%s), %s, %.2fM parameters%s", t->fam->name, c->model_config,
      t->fam->hf_class, t->dims.summary, (double)slapo_module_numel(t->model) / 1e6, per_rank);
  SLAPO_TRY(check_memory(t));
  if (slapo_dist_size(SLAPO_GROUP_PP) > 1) SLAPO_TRY(pp_stages(t));
  else SLAPO_TRY(slapo_module_materialize(t->model, c->seed));
  if (c->init_from) {
    int64_t ignored;
    SLAPO_TRY(check_saved(t, c->init_from, true, &ignored));
    SLAPO_TRY(t->fam->load(t->model, c->init_from));
    say(t->cb, t->ud, "init: weights from %s", c->init_from);
  }
  char ranks[64] = "";
  if (dp > 1) snprintf(ranks, sizeof ranks, " x %d data-parallel ranks", dp);
  say(t->cb, t->ud, "batch: %lld sequences of %lld tokens x %lld micro-batches%s = %lld tokens a "
      "step", (long long)c->batch, (long long)c->seq, (long long)c->grad_accum, ranks,
      (long long)(c->batch * c->seq * c->grad_accum * dp));
  if (c->warmup >= c->steps)
    say(t->cb, t->ud, "note: --warmup %lld is not shorter than --steps %lld: the learning rate "
        "never reaches its peak", (long long)c->warmup, (long long)c->steps);
  return slapo_runner_new(t->model, NULL, &t->runner);
}

/* AdamW: under pipeline parallelism over the stage's own parameters. */
static slapo_status new_optimizer(trainer *t) {
  const slapo_train_config *c = &t->c;
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, c->weight_decay, c->optimizer_state_bf16};
  if (t->stage) return slapo_pp_adamw_new(t->stage, t->model, &ac, &t->opt);
  return slapo_adamw_new(t->model, &ac, &t->opt);
}

/* This rank's stage, with the slots its schedule keeps in flight. */
static slapo_status build_stage(trainer *t) {
  int p = slapo_dist_size(SLAPO_GROUP_PP), s = slapo_dist_rank(SLAPO_GROUP_PP);
  if (p == 1) return SLAPO_OK;
  const slapo_train_config *c = &t->c;
  const slapo_tensor *in[2] = {t->xs[0], t->ys[0]}; /* the shapes */
  int slots = stage_slots(t);
  SLAPO_TRY(slapo_pp_stage_new(t->model, 2, in, s, slots, NULL, &t->stage));
  say(t->cb, t->ud, "pipeline: %d stages, %s over %lld micro-batch%s; stage 0 (this report's "
      "rank) holds %d parameters and sends %d value%s", p, slapo_pp_schedule_name(c->pp_schedule),
      (long long)c->grad_accum, c->grad_accum > 1 ? "es" : "", slapo_pp_stage_n_params(t->stage),
      slapo_pp_stage_n_send(t->stage), slapo_pp_stage_n_send(t->stage) > 1 ? "s" : "");
  return SLAPO_OK;
}

/* Loads the pair --resume names (or its kept previous pair) into the run. */
static slapo_status resume_pair(trainer *t, slapo__ckpt_choice *ch, int64_t *start) {
  const slapo_train_config *c = &t->c;
  SLAPO_TRY(slapo__ckpt_pick(c->resume, ch));
  if (ch->fallback)
    say(t->cb, t->ud, "note: resume: %s; resuming from %s and %s, saved together", ch->why,
        ch->w, ch->o);
  int64_t wstep;
  SLAPO_TRY(check_saved(t, ch->w, false, &wstep));
  SLAPO_TRY(t->fam->load(t->model, ch->w));
  SLAPO_TRY(slapo_adamw_load(t->opt, ch->o, t->fam->stored_transposed));
  *start = slapo_adamw_steps(t->opt);
  /* The pick matched the pair ids (or, in files without ids, these
   * steps); a mismatch here means files edited by hand. */
  if (wstep >= 0 && wstep != *start)
    return slapo_error(SLAPO_INVALID_ARG,
                       "train: %s holds the weights of step %lld but %s the optimizer state of "
                       "step %lld: they come from different saves; resume from a pair saved "
                       "together", ch->w, (long long)wstep, ch->o, (long long)*start);
  if (*start >= c->steps)
    return slapo_error(SLAPO_INVALID_ARG,
                       "train: %s is at step %lld, which is not before --steps %lld; raise "
                       "--steps to continue",
                       ch->w, (long long)*start, (long long)c->steps);
  say(t->cb, t->ud, "resume: %s at step %lld", ch->w, (long long)*start);
  return SLAPO_OK;
}

/* Weights and optimizer state from --resume; *start: the step to go on from.
 * The pair is the first complete one slapo__ckpt_pick finds: the files as
 * named, or, after a save that failed or was cut short, the kept previous
 * pair, with a note. */
static slapo_status resume(trainer *t, int64_t *start) {
  const slapo_train_config *c = &t->c;
  *start = 0;
  if (!c->resume) return SLAPO_OK;
  slapo__ckpt_choice *ch = slapo_malloc(sizeof *ch);
  if (!ch) return slapo_error(SLAPO_NOMEM, "train: out of memory");
  slapo_status s = resume_pair(t, ch, start);
  slapo_free(ch);
  return s;
}

static slapo_status alloc_batches(trainer *t) {
  const slapo_train_config *c = &t->c;
  size_t k = (size_t)c->grad_accum;
  t->xs = slapo_calloc(k, sizeof *t->xs);
  t->ys = slapo_calloc(k, sizeof *t->ys);
  t->micro_in = slapo_calloc(2 * k, sizeof *t->micro_in);
  t->envs = slapo_calloc(k, sizeof *t->envs);
  if (!t->xs || !t->ys || !t->micro_in || !t->envs)
    return slapo_error(SLAPO_NOMEM, "train: out of memory for %zu micro-batches", k);
  int64_t shape[2] = {c->batch, c->seq};
  for (size_t m = 0; m < k; m++) {
    SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &t->xs[m]));
    SLAPO_TRY(slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &t->ys[m]));
  }
  /* Rank 0 alone writes metrics and files. */
  bool writer = slapo_dist_rank(SLAPO_GROUP_WORLD) == 0;
  if (writer && c->metrics && !(t->metrics = fopen(c->metrics, c->resume ? "a" : "w")))
    return slapo_error(SLAPO_IO, "train: cannot open metrics file %s: %s", c->metrics,
                       strerror(errno));
  return SLAPO_OK;
}

/* One optimizer step: the micro-batches (weighted by valid tokens, so the
 * gradients are already the step's token mean; the first writes the grads,
 * the last measures their norm as each is final), then AdamW with the clip
 * factor in its one pass over memory. */
static slapo_status train_step(trainer *t, int64_t step, slapo_train_event *e) {
  const slapo_train_config *c = &t->c;
  double ts = now_s(), loss = 0, comm_s = 0;
  /* Data-parallel rank d of D draws micro-batches (step D + d) K + m, so
   * ranks see disjoint batches and one process (D = 1) is unchanged. */
  int64_t D = slapo_dist_size(SLAPO_GROUP_DP), d = slapo_dist_rank(SLAPO_GROUP_DP);
  for (int64_t m = 0; m < c->grad_accum; m++) {
    int64_t micro = (step * D + d) * c->grad_accum + m;
    SLAPO_TRY(draw_batch(t, false, micro, t->xs[m], t->ys[m]));
    t->micro_in[2 * m] = t->xs[m], t->micro_in[2 * m + 1] = t->ys[m];
    t->envs[m] = (slapo_kernel_env){c->seed, (uint64_t)micro, true};
  }
  float lr = slapo_lr_at(step, c->warmup, c->steps, c->lr, c->min_lr);
  double norm;
  if (t->stage) {
    SLAPO_TRY(slapo_pp_train_accumulate(t->stage, c->pp_schedule, (int)c->grad_accum,
                                        t->micro_in, t->envs, &loss, NULL));
    SLAPO_TRY(slapo_dist_kernel_status());
    SLAPO_TRY(slapo_pp_train_update(t->stage, t->model, t->opt, lr, c->grad_clip, &norm, &comm_s));
  } else {
    SLAPO_TRY(slapo_train_accumulate(t->runner, (int)c->grad_accum, t->micro_in, t->envs, &loss,
                                     NULL));
    SLAPO_TRY(slapo_dist_kernel_status());
    SLAPO_TRY(slapo_train_update(t->runner, t->model, t->opt, lr, c->grad_clip, &norm, &comm_s));
  }
  double dt = now_s() - ts;
  *e = (slapo_train_event){.step = step + 1, .steps = c->steps, .loss = loss, .lr = lr,
                           .grad_norm = norm,
                           .tokens_per_s = (double)(c->batch * c->seq * c->grad_accum * D) / dt,
                           .comm_s = comm_s,
                           .elapsed_s = now_s() - t->t0,
                           .peak_nbytes = t->stage ? slapo_plan_peak_nbytes(
                                                         slapo_pp_stage_plan(t->stage))
                                                   : slapo_runner_peak_nbytes(t->runner)};
  return SLAPO_OK;
}

/* One JSON line, flushed so that a reader (a plot, `tail -f`) sees whole
 * steps; a failed write (a full disk) ends the run rather than leave a
 * metrics file that silently stops. */
static slapo_status write_metrics(FILE *f, const char *path, const slapo_train_event *e) {
  fprintf(f, "{\"step\": %lld, ", (long long)e->step);
  json_num(f, "loss", e->loss, false);
  json_num(f, "lr", e->lr, false);
  json_num(f, "grad_norm", e->grad_norm, false);
  if (e->has_val) json_num(f, "val_loss", e->val_loss, false);
  if (e->has_val && isfinite(e->val_nats_per_byte))
    json_num(f, "val_nats_per_byte", e->val_nats_per_byte, false);
  json_num(f, "tokens_per_s", e->tokens_per_s, true);
  fprintf(f, "}\n");
  if (fflush(f) != 0 || ferror(f))
    return slapo_error(SLAPO_IO, "train: writing the metrics file %s failed at step %lld: %s",
                       path, (long long)e->step, strerror(errno));
  return SLAPO_OK;
}

/* After a step: validation when due, the metrics line, a checkpoint when
 * due, then the callback (and the checkpoint's "saved" line after the
 * step's). */
static slapo_status report(trainer *t, slapo_train_event *e) {
  const slapo_train_config *c = &t->c;
  bool last = e->step == c->steps;
  bool val = (c->val_every > 0 && e->step % c->val_every == 0) || last;
  bool save = c->save && ((c->save_every > 0 && e->step % c->save_every == 0) || last);
  if (val) {
    SLAPO_TRY(eval_loss(t, &e->val_loss, &e->val_nats_per_byte));
    e->has_val = true;
  }
  if (t->metrics) SLAPO_TRY(write_metrics(t->metrics, t->c.metrics, e));
  if (save) SLAPO_TRY(save_checkpoint(t, e->step));
  if (t->cb) t->cb(e, t->ud);
  if (save) say(t->cb, t->ud, "saved %s at step %lld", c->save, (long long)e->step);
  return SLAPO_OK;
}

static void sample_progress(int64_t done, int64_t total, void *ud) {
  const trainer *t = ud;
  slapo_train_event e = {.step = t->c.steps, .steps = t->c.steps, .sample_done = done,
                         .sample_total = total};
  if (t->cb) t->cb(&e, t->ud);
}

/* The sample's text: through the tokenizer when there is one (whole
 * characters: an unfinished one at the end is dropped), else a byte a
 * token for byte vocabularies and ids for others. */
static slapo_status sample_decode(const trainer *t, const int32_t *ids, int64_t n, char *out,
                                  size_t cap) {
  size_t k = 0;
  if (t->tok) {
    slapo_bytes b = {0};
    slapo_decode_state st = {0};
    for (int64_t i = 0; i < n; i++) SLAPO_TRY(slapo_tokenizer_decode_next(t->tok, ids[i], &st, &b));
    for (size_t i = 0; i < b.n && k + 1 < cap; i++) out[k++] = b.data[i] ? b.data[i] : ' ';
    slapo_bytes_free(&b);
  } else {
    for (int64_t i = 0; i < n; i++) {
      /* A zero byte would end the C string early: show it as a space. */
      if (t->dims.vocab_size <= 256) out[k++] = ids[i] ? (char)ids[i] : ' ';
      else k += (size_t)snprintf(out + k, 12, "%d ", ids[i]);
    }
  }
  out[k] = '\0';
  return SLAPO_OK;
}

/* The text sample at the end: byte tokens decode to bytes, other
 * vocabularies print ids. */
static slapo_status sample_text(trainer *t) {
  const slapo_train_config *c = &t->c;
  int64_t n = 1, cap = c->sample_tokens + 1;
  int32_t *text = slapo_malloc((size_t)cap * sizeof *text);
  /* A byte per token, an id of up to 11 characters plus a space, or a
   * tokenizer's longest token. */
  size_t per = 12;
  for (int32_t i = 0; t->tok && i < slapo_tokenizer_vocab_size(t->tok); i++)
    if ((size_t)slapo_tokenizer_token_len(t->tok, i) > per) per = (size_t)slapo_tokenizer_token_len(t->tok, i);
  size_t out_cap = (size_t)cap * per + 1;
  char *out = slapo_malloc(out_cap);
  slapo_status s = text && out ? SLAPO_OK : slapo_error(SLAPO_NOMEM, "train: out of memory");
  if (s == SLAPO_OK) {
    int32_t eot = slapo_tokenizer_special_id(t->tok, "<|endoftext|>");
    text[0] = eot >= 0 ? eot : t->dims.eos_token >= 0 ? (int32_t)t->dims.eos_token : '\n';
    slapo_sample_opts so = {.n_ctx = t->dims.n_ctx, .temperature = c->temperature,
                            .top_k = c->top_k, .seed = c->seed, .progress = sample_progress,
                            .vocab = t->tok ? slapo_tokenizer_vocab_size(t->tok) : 0,
                            .ud = t};
    s = slapo_sample(t->runner, &so, text, &n, c->sample_tokens);
  }
  if (s == SLAPO_OK) s = sample_decode(t, text + 1, n - 1, out, out_cap);
  if (s == SLAPO_OK) {
    slapo_train_event e = {.step = c->steps, .steps = c->steps, .sample = out};
    if (t->cb) t->cb(&e, t->ud);
  }
  slapo_free(text);
  slapo_free(out);
  return s;
}

static slapo_status run(trainer *t) {
  SLAPO_TRY(check_config(t));
  SLAPO_TRY(load_data(t));
  SLAPO_TRY(alloc_batches(t));
  SLAPO_TRY(build_model(t));
  SLAPO_TRY(build_stage(t));
  SLAPO_TRY(new_optimizer(t));
  int64_t start;
  SLAPO_TRY(resume(t, &start));
  t->t0 = now_s();
  for (int64_t step = start; step < t->c.steps; step++) {
    slapo_train_event e;
    SLAPO_TRY(train_step(t, step, &e));
    SLAPO_TRY(report(t, &e));
  }
  if (t->c.plot && t->metrics) { /* rank 0 holds the metrics file */
    fflush(t->metrics);
    SLAPO_TRY(slapo_plot_metrics(t->c.metrics, t->c.plot));
    say(t->cb, t->ud, "plot: %s (loss and validation loss by step, from %s)", t->c.plot,
        t->c.metrics);
  }
  if (t->c.sample_tokens > 0 && !samples(t))
    say(t->cb, t->ud, "sample: skipped: %s trains a masked LM, which predicts masked positions "
        "from both sides and generates nothing left to right (--sample 0 silences this)",
        t->fam->name);
  if (!samples(t)) return SLAPO_OK;
  /* Under pipeline parallelism stage 0 samples, from the whole model. */
  if (t->stage) SLAPO_TRY(slapo_pp_gather(t->stage, t->model, NULL));
  return t->stage && slapo_dist_rank(SLAPO_GROUP_PP) != 0 ? SLAPO_OK : sample_text(t);
}

slapo_status slapo_train(const slapo_train_config *cfg, slapo_train_cb cb, void *ud) {
  trainer t = {.c = *cfg, .cb = cb, .ud = ud};
  slapo_status s = run(&t);
  trainer_free(&t);
  return s;
}
