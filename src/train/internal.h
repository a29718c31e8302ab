/* train/internal.h - what the training layer's files share and the public
 * API does not show: the checkpoint pair protocol (checkpoint.c) that
 * loop.c saves and resumes through. Layer: train. */
#ifndef SLAPO_TRAIN_INTERNAL_H
#define SLAPO_TRAIN_INTERNAL_H

#include <stdint.h>

#include "slapo/train.h"

/* Micro-batch i's weight w[i] = n_i / N in a step's loss (accumulate.c:
 * n_i its valid targets, N theirs over every micro-batch of every
 * data-parallel rank, one all-reduce); *n_valid (may be NULL) = N.
 * inputs [2 * n_micro] as slapo_train_accumulate's. Errors:
 * SLAPO_INVALID_ARG (n_micro < 1, targets), those of the all-reduce. */
slapo_status slapo__micro_weights(int n_micro, const slapo_tensor *const *inputs, double *w,
                                  int64_t *n_valid);

/* The parameters of a pipeline (pp_params.c): every parameter of the
 * model in visit order (a tied one once), whether this rank's stage holds
 * it, and over the pipeline group its first and last holder (0 for a
 * parameter no stage reads: stage 0's, mine there) and holder count. */
typedef struct slapo__pp_owners {
  int n, cap;
  slapo_parameter **params; /* [n] */
  uint8_t *mine;            /* [n] */
  int *first, *last;        /* [n] */
  int *holders;             /* [n] */
  bool nomem;
} slapo__pp_owners;

/* Fills *o (one all-gather of a byte per parameter over SLAPO_GROUP_PP;
 * every rank of the group calls it). Errors: NOMEM, those of MPI. */
slapo_status slapo__pp_owners_of(const slapo_pp_stage *st, slapo_module *model,
                                 slapo__pp_owners *o);
void slapo__pp_owners_free(slapo__pp_owners *o);

/* Longest checkpoint path slapo handles, with room for the tags it adds. */
enum { SLAPO__CKPT_PATH = 4200 };

/* The files of the checkpoint whose weights file is `w` (x.safetensors):
 * its optimizer state (x.optim.safetensors), the kept previous pair
 * (x.prev.safetensors, x.prev.optim.safetensors) and the pair being written
 * (x.new.safetensors, x.new.optim.safetensors). A weights name without the
 * .safetensors extension gets the tags appended (ckpt.prev, ...). */
typedef struct slapo__ckpt_paths {
  char w[SLAPO__CKPT_PATH], o[SLAPO__CKPT_PATH];
  char prev_w[SLAPO__CKPT_PATH], prev_o[SLAPO__CKPT_PATH];
  char new_w[SLAPO__CKPT_PATH], new_o[SLAPO__CKPT_PATH];
} slapo__ckpt_paths;

/* Fills *p from the weights path. Errors: SLAPO_INVALID_ARG (a name too
 * long; naming it). */
slapo_status slapo__ckpt_paths_of(const char *weights, slapo__ckpt_paths *p);

/* Before the first step: every file a save of `weights` writes or renames
 * can be written (slapo_check_write_target: the directory exists, is a
 * directory and is writable; none of the six names is a directory, device
 * or FIFO), and `weights` is not an optimizer file's name. Errors:
 * SLAPO_INVALID_ARG, SLAPO_IO naming the path. */
slapo_status slapo__ckpt_check_save(const char *weights);

/* Writes one file of the pair: file 0 the weights, 1 the optimizer state,
 * to `path`, with metadata slapo_pair = `pair` (the pair id). Called on
 * every rank (the writers gather shards; rank 0 writes). */
typedef slapo_status (*slapo__ckpt_write_fn)(int file, const char *path, const char *pair,
                                             void *ud);

/* Saves the pair of checkpoint `weights` at `step` so that a complete pair
 * is on disk at every moment: both files are written to the .new names
 * first (each atomically, fsync'd); only when both are complete does rank
 * 0 move the current pair to the .prev names and the new pair into place.
 * A failed write (a full disk: ENOSPC, EFBIG) removes the .new files and
 * leaves the current and previous pairs as they were. Every rank calls it.
 * Errors: what `write` returned, wrapped in a message naming the
 * checkpoint, the file that failed, the cause and the pair that is kept;
 * SLAPO_IO for a rename. */
slapo_status slapo__ckpt_save(const char *weights, int64_t step, slapo__ckpt_write_fn write,
                              void *ud);

/* The pair --resume loads: the first complete one (both files present and
 * of one save: equal slapo_pair ids, or for files without ids, as older
 * versions wrote, equal steps) of (x, x.optim), (x, x.prev.optim),
 * (x.prev, x.optim), (x.prev, x.prev.optim): the pair as named, then what
 * a save interrupted between its renames left, then the kept previous
 * pair. `fallback` is true (and `why` says what is wrong with the pair as
 * named) when it is not the first. */
typedef struct slapo__ckpt_choice {
  char w[SLAPO__CKPT_PATH], o[SLAPO__CKPT_PATH];
  bool fallback;
  char why[SLAPO__CKPT_PATH * 2 + 256];
} slapo__ckpt_choice;

/* Picks the pair to resume from for `weights` (every rank reads the same
 * headers and picks the same). Errors when no pair is complete: that of
 * the pair as named: SLAPO_IO (a file missing or malformed, naming it),
 * SLAPO_INVALID_ARG (weights and optimizer state of different saves,
 * naming both steps). */
slapo_status slapo__ckpt_pick(const char *weights, slapo__ckpt_choice *out);

/* The text at `data` as tokens, for --tokenizer `spec` (slapo_train_config's
 * tokenizer): the validation split is the last val_fraction of the text's
 * bytes (slapo_text_val_cut); "bpe:N" learns its tokenizer on the training
 * split alone. An llm.c token file is loaded as it is, the tokenizer then
 * only decoding its samples. *tok and *out owned; `note` gets a line
 * saying what was done (tokenizer, sizes, time). Errors: SLAPO_INVALID_ARG
 * (bpe:N on a token file, a malformed bpe:N), those of reading, loading,
 * learning and encoding. */
slapo_status slapo__text_dataset(const char *data, const char *spec, double val_fraction,
                                 slapo_tokenizer **tok, slapo_dataset **out, char *note,
                                 size_t cap);

#endif
