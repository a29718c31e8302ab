/* train/memory.c - what a training run will need, known before anything is
 * allocated, and what the machine has. The estimate adds the model state
 * (weights, gradients, AdamW's m and v: four f32 copies of the parameters,
 * tied ones once), the planner's activation peaks for the graphs alive at
 * once (the train step with the validation step at each validation, the
 * validation step with the sampling window at the end), and what the
 * process holds already (libraries, the data set). Layer: train. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/train.h"

/* A field of /proc/self/status or /proc/meminfo, in bytes (0 if absent). */
static size_t proc_kb_field(const char *file, const char *key) {
  FILE *f = fopen(file, "r");
  if (!f) return 0;
  char line[256];
  size_t klen = strlen(key), v = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, klen) && line[klen] == ':') {
      v = (size_t)strtoull(line + klen + 1, NULL, 10) * 1024;
      break;
    }
  fclose(f);
  return v;
}

size_t slapo_memory_resident(void) { return proc_kb_field("/proc/self/status", "VmRSS"); }

/* Activation peak of one step of `r`'s model on meta inputs [B, T] i32:
 * n_in 2 (idx, targets: a loss) or 1 (idx: logits). */
static slapo_status step_peak(slapo_runner *r, slapo_step_mode mode, int n_in, int64_t B,
                              int64_t T, size_t *out) {
  int64_t shape[2] = {B, T};
  slapo_tensor *x = NULL;
  SLAPO_TRY(slapo_tensor_new_meta(SLAPO_DTYPE_I32, 2, shape, &x));
  const slapo_tensor *in[2] = {x, x};
  slapo_status s = slapo_runner_estimate(r, n_in, in, mode, out);
  slapo_tensor_free(x);
  return s;
}

slapo_status slapo_memory_estimate_train(slapo_module *model, int64_t batch, int64_t seq,
                                         int64_t sample_ctx, bool optimizer_bf16,
                                         slapo_memory_estimate *out) {
  memset(out, 0, sizeof *out);
  size_t state = (size_t)slapo_module_numel(model) * sizeof(float);
  out->weights = out->grads = state;
  out->optimizer = optimizer_bf16 ? state : 2 * state; /* m and v: 2 or 4 bytes each */
  slapo_runner *r;
  SLAPO_TRY(slapo_runner_new(model, NULL, &r));
  slapo_status s = step_peak(r, SLAPO_STEP_TRAIN, 2, batch, seq, &out->train_activations);
  if (s == SLAPO_OK) s = step_peak(r, SLAPO_STEP_EVAL, 2, batch, seq, &out->eval_activations);
  if (s == SLAPO_OK && sample_ctx > 0)
    s = step_peak(r, SLAPO_STEP_EVAL, 1, 1, sample_ctx, &out->sample_activations);
  slapo_runner_free(r);
  SLAPO_TRY(s);
  size_t during = out->train_activations + out->eval_activations;
  size_t at_end = out->eval_activations + out->sample_activations;
  out->activations = during > at_end ? during : at_end;
  out->resident = slapo_memory_resident();
  out->total = out->weights + out->grads + out->optimizer + out->activations + out->resident;
  return SLAPO_OK;
}

/* "24G", "512M", "1048576" -> bytes; false when unreadable. */
static bool parse_bytes(const char *s, size_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || v < 0) return false;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
  case 'K': mul = 1024.0, end++; break;
  case 'M': mul = 1024.0 * 1024, end++; break;
  case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
  case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return false;
  *out = (size_t)(v * mul);
  return true;
}

/* The cgroup (v2) limit of this process: memory.max of its cgroup, or 0. */
static size_t cgroup_limit(void) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  char line[1024], path[1200] = "";
  if (f) {
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "0::", 3)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
      }
    fclose(f);
  }
  size_t lim = 0;
  for (int k = 0; k < 2 && !lim; k++) {
    FILE *m = fopen(k ? "/sys/fs/cgroup/memory.max" : path, "r");
    if (!m) continue;
    char v[64] = "";
    if (fgets(v, sizeof v, m) && strncmp(v, "max", 3)) lim = (size_t)strtoull(v, NULL, 10);
    fclose(m);
  }
  return lim;
}

slapo_status slapo_memory_available(size_t *bytes, char *source, size_t cap) {
  const char *env = getenv("SLAPO_MEMORY_LIMIT");
  if (env && *env) {
    if (!parse_bytes(env, bytes) || *bytes == 0)
      return slapo_error(SLAPO_INVALID_ARG, "SLAPO_MEMORY_LIMIT=%s: expected a positive number of "
                         "bytes, optionally with K, M, G or T (e.g. 24G)", env);
    snprintf(source, cap, "SLAPO_MEMORY_LIMIT");
    return SLAPO_OK;
  }
  /* What this process holds already is available to it too. */
  size_t avail = proc_kb_field("/proc/meminfo", "MemAvailable") + slapo_memory_resident();
  size_t cg = cgroup_limit();
  if (cg && cg < avail) {
    *bytes = cg;
    snprintf(source, cap, "the cgroup's memory.max");
  } else {
    *bytes = avail;
    snprintf(source, cap, "MemAvailable + this process's resident memory");
  }
  return SLAPO_OK;
}

void slapo_memory_format(const slapo_memory_estimate *e, char *buf, size_t cap) {
  const double M = 1024.0 * 1024;
  snprintf(buf, cap,
           "weights %.1f MiB + gradients %.1f MiB + AdamW state %.1f MiB + activations %.1f MiB "
           "(the larger of train step %.1f + validation %.1f and validation + sampling window "
           "%.1f) + already resident %.1f MiB = %.1f MiB",
           (double)e->weights / M, (double)e->grads / M, (double)e->optimizer / M,
           (double)e->activations / M, (double)e->train_activations / M,
           (double)e->eval_activations / M, (double)e->sample_activations / M,
           (double)e->resident / M, (double)e->total / M);
}
