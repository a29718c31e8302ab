/* train/loop.c - the training loop: data, GPT-2, AdamW with warmup + cosine
 * schedule, gradient accumulation over micro-batches, clipping, validation,
 * metrics (JSON lines), checkpoints with resume, and a text sample at the
 * end. Progress goes to a callback: the library never prints.
 * Layer: train. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/assert.h"
#include "slapo/train.h"

#define DEFAULT_CORPUS "/usr/share/games/fortunes"

void slapo_train_config_default(slapo_train_config *c) {
  *c = (slapo_train_config){
      .model_config = "small",
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

/* Optimizer state lives beside the model file: x.safetensors -> x.optim.safetensors. */
static void optim_path(const char *model_path, char *out, size_t cap) {
  size_t n = strlen(model_path);
  const char *ext = ".safetensors";
  size_t k = strlen(ext);
  if (n > k && !strcmp(model_path + n - k, ext))
    snprintf(out, cap, "%.*s.optim.safetensors", (int)(n - k), model_path);
  else
    snprintf(out, cap, "%s.optim.safetensors", model_path);
}


static slapo_status eval_loss(slapo_runner *r, const slapo_dataset *d, const slapo_train_config *c,
                              slapo_tensor *x, slapo_tensor *y, double *out) {
  double sum = 0;
  for (int64_t b = 0; b < c->val_batches; b++) {
    SLAPO_TRY(slapo_dataset_batch(d, true, c->seed, b, x, y));
    const slapo_tensor *in[2] = {x, y}, *loss;
    slapo_kernel_env env = {c->seed, (uint64_t)b, false};
    SLAPO_TRY(slapo_step(r, 2, in, SLAPO_STEP_EVAL, &env, &loss));
    sum += *(const float *)slapo_tensor_data(loss);
  }
  *out = sum / (double)(c->val_batches > 0 ? c->val_batches : 1);
  return SLAPO_OK;
}

static void json_num(FILE *f, const char *key, double v, bool last) {
  if (isfinite(v)) fprintf(f, "\"%s\": %.8g%s", key, v, last ? "" : ", ");
  else fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
}

static slapo_status save_checkpoint(slapo_module *model, const slapo_adamw *opt,
                                    const slapo_train_config *c, int64_t step) {
  char st[32], op[4200];
  snprintf(st, sizeof st, "%lld", (long long)step);
  const char *keys[3] = {"slapo_step", "slapo_config", "slapo_seed"};
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
  const char *vals[3] = {st, c->model_config, seed};
  SLAPO_TRY(slapo_gpt2_save(model, c->save, 3, keys, vals));
  optim_path(c->save, op, sizeof op);
  return slapo_adamw_save(opt, op, slapo_gpt2_is_conv1d_weight);
}

slapo_status slapo_train(const slapo_train_config *cfg, slapo_train_cb cb, void *ud) {
  slapo_train_config local = *cfg;
  const slapo_train_config *c = &local;
  if (c->steps < 1 || c->batch < 1 || c->seq < 0 || c->grad_accum < 1)
    return slapo_error(SLAPO_INVALID_ARG,
                       "train: steps (%lld), batch (%lld) and grad_accum (%lld) must be >= 1, "
                       "seq (%lld) >= 0",
                       (long long)c->steps, (long long)c->batch, (long long)c->grad_accum,
                       (long long)c->seq);
  if (c->threads > 0) omp_set_num_threads(c->threads);
  slapo_gpt2_config mc;
  SLAPO_TRY(slapo_gpt2_config_named(c->model_config, &mc));
  if (c->dropout >= 0) mc.dropout = c->dropout;
  /* seq 0: the config's context, at most 256 (a CPU-sized default). */
  if (local.seq == 0) local.seq = mc.n_ctx < 256 ? mc.n_ctx : 256;
  if (c->save) {
    /* Fail before training, not after it, when the checkpoint cannot be
     * written: the atomic write needs a writable directory. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->save);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
    else snprintf(dir, sizeof dir, ".");
    if (access(dir, W_OK) != 0)
      return slapo_error(SLAPO_IO, "train: cannot write the checkpoint %s: directory %s: %s",
                         c->save, dir, strerror(errno));
  }
  if (c->seq > mc.n_ctx)
    return slapo_error(SLAPO_INVALID_ARG, "train: --seq %lld exceeds the %s context of %lld",
                       (long long)c->seq, c->model_config, (long long)mc.n_ctx);

  slapo_dataset *data = NULL;
  slapo_module *model = NULL;
  slapo_runner *runner = NULL;
  slapo_adamw *opt = NULL;
  slapo_tensor *x = NULL, *y = NULL;
  /* One idx / targets pair per micro-batch (the step's batch, drawn before
   * it runs so the micro-batches can be weighted by valid tokens). */
  slapo_tensor **xs = slapo_calloc((size_t)c->grad_accum, sizeof *xs);
  slapo_tensor **ys = slapo_calloc((size_t)c->grad_accum, sizeof *ys);
  const slapo_tensor **micro_in = slapo_calloc(2 * (size_t)c->grad_accum, sizeof *micro_in);
  slapo_kernel_env *envs = slapo_calloc((size_t)c->grad_accum, sizeof *envs);
  FILE *metrics = NULL;
  slapo_sched_log *sched_log = NULL;
  slapo_sched *sched = NULL;
  int32_t *text = NULL;
  char *sample = NULL;
  slapo_status s = xs && ys && micro_in && envs ? SLAPO_OK
                                                : slapo_error(SLAPO_NOMEM, "train: out of memory");
  if (s == SLAPO_OK) s = slapo_dataset_load(c->data, 0.1, &data);
  if (s != SLAPO_OK) goto done;
  say(cb, ud, "data: %s: %lld training and %lld validation tokens (vocabulary %lld)", c->data,
      (long long)slapo_dataset_tokens(data, false), (long long)slapo_dataset_tokens(data, true),
      (long long)slapo_dataset_vocab(data));
  /* Both splits must hold one window: the validation split is first read
   * after the last step, and a run should not fail only after training. */
  for (int v = 0; v < 2; v++) {
    if (slapo_dataset_tokens(data, v) < c->seq + 1) {
      s = slapo_error(SLAPO_INVALID_ARG,
                      "train: the %s split of %s has %lld tokens, fewer than --seq + 1 = %lld; "
                      "use more data or a shorter --seq",
                      v ? "validation" : "training", c->data,
                      (long long)slapo_dataset_tokens(data, v), (long long)(c->seq + 1));
      goto done;
    }
  }
  if (slapo_dataset_vocab(data) > mc.vocab_size) {
    s = slapo_error(SLAPO_INVALID_ARG,
                    "train: %s has token ids up to %lld but the %s config's vocabulary is %lld",
                    c->data, (long long)slapo_dataset_vocab(data) - 1, c->model_config,
                    (long long)mc.vocab_size);
    goto done;
  }
  if ((s = slapo_gpt2_new(&mc, &model)) != SLAPO_OK) goto done;
  if ((s = slapo_module_materialize(model, c->seed)) != SLAPO_OK) goto done;
  if (c->init_from && (s = slapo_gpt2_load(model, c->init_from)) != SLAPO_OK) goto done;
  if (c->schedule) {
    size_t applied = 0;
    if ((s = slapo_models_init()) != SLAPO_OK) goto done;
    if ((s = slapo_sched_parse_file(c->schedule, &sched_log)) != SLAPO_OK) goto done;
    if ((s = slapo_sched_create(model, &sched)) != SLAPO_OK) goto done;
    s = slapo_apply_schedule(sched, sched_log, c->disabled, c->n_disabled, 0, &applied);
    if (s != SLAPO_OK) goto done;
    say(cb, ud, "schedule: %s: applied %zu steps (%zu disabled)", c->schedule, applied,
        c->n_disabled);
  }
  say(cb, ud, "model: GPT-2 %s, %d layers, %lld wide, %d heads, context %lld, %.2fM parameters",
      c->model_config, mc.n_layer, (long long)mc.n_embd, mc.n_head, (long long)mc.n_ctx,
      (double)slapo_module_numel(model) / 1e6);
  say(cb, ud, "batch: %lld sequences of %lld tokens x %lld micro-batches = %lld tokens a step",
      (long long)c->batch, (long long)c->seq, (long long)c->grad_accum,
      (long long)(c->batch * c->seq * c->grad_accum));
  if (c->warmup >= c->steps)
    say(cb, ud, "note: --warmup %lld is not shorter than --steps %lld: the learning rate never "
        "reaches its peak", (long long)c->warmup, (long long)c->steps);
  if ((s = slapo_runner_new(model, NULL, &runner)) != SLAPO_OK) goto done;
  slapo_adamw_config ac = {0.9f, 0.95f, 1e-8f, c->weight_decay};
  if ((s = slapo_adamw_new(model, &ac, &opt)) != SLAPO_OK) goto done;
  int64_t start = 0;
  if (c->resume) {
    char op[4200];
    optim_path(c->resume, op, sizeof op);
    if ((s = slapo_gpt2_load(model, c->resume)) != SLAPO_OK) goto done;
    if ((s = slapo_adamw_load(opt, op, slapo_gpt2_is_conv1d_weight)) != SLAPO_OK) goto done;
    start = slapo_adamw_steps(opt);
    if (start >= c->steps) {
      s = slapo_error(SLAPO_INVALID_ARG,
                      "train: %s is at step %lld, which is not before --steps %lld; raise "
                      "--steps to continue",
                      c->resume, (long long)start, (long long)c->steps);
      goto done;
    }
    say(cb, ud, "resume: %s at step %lld", c->resume, (long long)start);
  }
  int64_t shape[2] = {c->batch, c->seq};
  if ((s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &x)) != SLAPO_OK) goto done;
  if ((s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &y)) != SLAPO_OK) goto done;
  for (int64_t m = 0; m < c->grad_accum; m++) {
    if ((s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &xs[m])) != SLAPO_OK) goto done;
    if ((s = slapo_tensor_new(SLAPO_DTYPE_I32, 2, shape, &ys[m])) != SLAPO_OK) goto done;
  }
  if (c->metrics && !(metrics = fopen(c->metrics, c->resume ? "a" : "w"))) {
    s = slapo_error(SLAPO_IO, "train: cannot open metrics file %s: %s", c->metrics,
                    strerror(errno));
    goto done;
  }
  double t0 = now_s();
  slapo_module_zero_grad(model);
  for (int64_t step = start; step < c->steps; step++) {
    double ts = now_s(), step_loss = 0;
    for (int64_t m = 0; m < c->grad_accum; m++) {
      int64_t micro = step * c->grad_accum + m;
      if ((s = slapo_dataset_batch(data, false, c->seed, micro, xs[m], ys[m])) != SLAPO_OK)
        goto done;
      micro_in[2 * m] = xs[m], micro_in[2 * m + 1] = ys[m];
      envs[m] = (slapo_kernel_env){c->seed, (uint64_t)micro, true};
    }
    /* Micro-batches weighted by their valid tokens, so the gradients are
     * already the step's token mean; clipping and the next step's zeroing
     * happen inside AdamW's one pass over memory. */
    s = slapo_train_accumulate(runner, (int)c->grad_accum, micro_in, envs, &step_loss, NULL);
    if (s != SLAPO_OK) goto done;
    double norm = slapo_clip_grad_norm(model, 0);
    float lr = slapo_lr_at(step, c->warmup, c->steps, c->lr, c->min_lr);
    slapo_adamw_step_scaled(opt, lr, slapo_clip_scale(norm, c->grad_clip), true);
    double dt = now_s() - ts;
    slapo_train_event e = {0};
    e.step = step + 1;
    e.steps = c->steps;
    e.loss = step_loss;
    e.lr = lr;
    e.grad_norm = norm;
    e.tokens_per_s = (double)(c->batch * c->seq * c->grad_accum) / dt;
    e.elapsed_s = now_s() - t0;
    e.peak_nbytes = slapo_runner_peak_nbytes(runner);
    bool last = step + 1 == c->steps;
    if ((c->val_every > 0 && (step + 1) % c->val_every == 0) || last) {
      if ((s = eval_loss(runner, data, c, x, y, &e.val_loss)) != SLAPO_OK) goto done;
      e.has_val = true;
    }
    if (metrics) {
      fprintf(metrics, "{\"step\": %lld, ", (long long)e.step);
      json_num(metrics, "loss", e.loss, false);
      json_num(metrics, "lr", e.lr, false);
      json_num(metrics, "grad_norm", e.grad_norm, false);
      if (e.has_val) json_num(metrics, "val_loss", e.val_loss, false);
      json_num(metrics, "tokens_per_s", e.tokens_per_s, true);
      fprintf(metrics, "}\n");
      fflush(metrics);
    }
    if (c->save && ((c->save_every > 0 && (step + 1) % c->save_every == 0) || last)) {
      if ((s = save_checkpoint(model, opt, c, step + 1)) != SLAPO_OK) goto done;
    }
    if (cb) cb(&e, ud);
  }
  if (c->save) say(cb, ud, "saved %s", c->save);
  if (c->sample_tokens > 0) {
    int64_t n = 1, cap = c->sample_tokens + 1;
    text = slapo_malloc((size_t)cap * sizeof *text);
    /* A byte per token, or an id of up to 11 characters plus a space. */
    sample = slapo_malloc((size_t)cap * 12 + 1);
    if (!text || !sample) {
      s = slapo_error(SLAPO_NOMEM, "train: out of memory");
      goto done;
    }
    text[0] = '\n';
    s = slapo_sample(runner, mc.n_ctx, text, &n, c->sample_tokens, c->temperature, c->top_k,
                     c->seed);
    if (s != SLAPO_OK) goto done;
    /* Byte tokens decode to bytes; other vocabularies print ids. */
    size_t k = 0;
    for (int64_t i = 1; i < n; i++) {
      /* A zero byte would end the C string early: show it as a space. */
      if (mc.vocab_size <= 256) sample[k++] = text[i] ? (char)text[i] : ' ';
      else k += (size_t)snprintf(sample + k, 12, "%d ", text[i]);
    }
    sample[k] = '\0';
    slapo_train_event e = {0};
    e.step = c->steps;
    e.steps = c->steps;
    e.sample = sample;
    if (cb) cb(&e, ud);
  }
done:
  if (metrics) fclose(metrics);
  slapo_free(text);
  slapo_free(sample);
  slapo_tensor_free(x);
  slapo_tensor_free(y);
  for (int64_t m = 0; xs && ys && m < c->grad_accum; m++) {
    slapo_tensor_free(xs[m]);
    slapo_tensor_free(ys[m]);
  }
  slapo_free(xs);
  slapo_free(ys);
  slapo_free(micro_in);
  slapo_free(envs);
  slapo_adamw_free(opt);
  slapo_runner_free(runner);
  slapo_sched_free(sched);
  slapo_sched_log_free(sched_log);
  slapo_module_free(model);
  slapo_dataset_free(data);
  return s;
}
