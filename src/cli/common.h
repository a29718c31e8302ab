/* cli/common.h - what the `slapo` subcommands share: exit codes and
 * messages, number and list parsing, and the model options (--model,
 * --config, --schedule, --disable) every command that takes a model parses
 * into one struct. Layer: cli. */
#ifndef SLAPO_CLI_COMMON_H
#define SLAPO_CLI_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "core/assert.h"
#include "slapo/dist.h"
#include "slapo/train.h"

/* Long-option values (getopt_long's `val`), one list for every command. */
enum {
  OPT_MODEL = 256, OPT_CONFIG, OPT_DATA, OPT_STEPS, OPT_BATCH, OPT_SEQ, OPT_ACCUM, OPT_LR,
  OPT_MIN_LR, OPT_WARMUP, OPT_WD, OPT_CLIP, OPT_DROPOUT, OPT_SEED, OPT_VAL_EVERY,
  OPT_VAL_BATCHES, OPT_METRICS, OPT_SAVE, OPT_SAVE_EVERY, OPT_RESUME, OPT_INIT, OPT_SAMPLE,
  OPT_TEMP, OPT_TOPK, OPT_THREADS, OPT_HELP, OPT_SCHEDULE, OPT_DISABLE, OPT_BISECT,
  OPT_PER_ENTRY, OPT_ATOL, OPT_RTOL, OPT_PLOT, OPT_OUTPUT, OPT_GRAPH, OPT_DOT, OPT_PATTERN,
  OPT_REGEX, OPT_DEPTH, OPT_COMPARE, OPT_TP, OPT_COMM_TIMEOUT, OPT_PRECISION, OPT_OPT_STATE,
  OPT_TOKENIZER, OPT_PP, OPT_PP_SCHEDULE
};

/* "slapo: <status>: <message>" on stderr; returns exit code 1. Under
 * mpirun "slapo: rank R: <status>: <message>", and the whole job is
 * aborted (MPI_Abort): the other ranks may be waiting in a collective. */
int cli_fail(slapo_status s);
/* cli_fail for an error every rank reached alike (ranks that disagree on
 * their arguments): each prints its line and returns 1 without aborting,
 * so every rank's message reaches stderr and MPI ends normally. */
int cli_fail_together(slapo_status s);
/* "slapo: usage: <fmt with arg>" and a --help hint; returns exit code 2. */
int cli_usage_error(const char *cmd, const char *fmt, const char *arg);
/* The usage error for getopt_long's result `o` (':' missing value, '?'
 * unknown option) or for a bad value of option `o`. Returns 2. */
int cli_option_error(const char *cmd, const struct option *opts, int o, char **argv);
/* The arguments of a command that takes none (argv[0] is its name): -1
 * when there are none (run it), 0 after printing `usage` for --help or -h,
 * or the usage error's 2 for anything else. */
int cli_no_options(int argc, char **argv, const char *usage);
/* getopt_long over the long options `opts`, with -h read as --help
 * (OPT_HELP), as users of other CLIs type it. */
int cli_getopt(int argc, char **argv, const struct option *opts);

/* Whole-string numbers, never clamped; false on junk or overflow. */
bool cli_parse_i64(const char *s, int64_t *out);
bool cli_parse_f(const char *s, double *out);
/* "f32" (*bf16 false) or "bf16" (true): --precision, --optimizer-state. */
bool cli_parse_precision(const char *s, bool *bf16);
/* "1f1b" or "gpipe" (--pp-schedule), and back. */
bool cli_parse_pp_schedule(const char *s, slapo_pp_schedule *out);
const char *cli_pp_schedule_arg(slapo_pp_schedule sched);
/* "2,5,7" (positive, no duplicates) into a malloc'd array replacing *out. */
bool cli_parse_list(const char *s, size_t **out, size_t *n);
/* "45s", "3m05s", "1h02m"; "--" when unknown. */
void cli_fmt_duration(double s, char *buf, size_t cap);

/* The model options. After cli_model_finish: family resolved, config set
 * (the family's default when not given), schedule resolved
 * (cli_schedule_resolve: NULL for none). */
typedef struct cli_model_opts {
  const char *model, *config, *schedule;
  const char *precision; /* --precision: "bf16", or NULL for f32           */
  int64_t tp;       /* --tp: tensor-parallel group size (0: 1)          */
  int64_t pp;       /* --pp: pipeline stages (0: 1; train and verify)    */
  double comm_timeout; /* --comm-timeout seconds (0: not given)        */
  size_t *disabled; /* malloc'd */
  size_t n_disabled;
  const slapo_model_family *family;
  char schedule_path[4096];
} cli_model_opts;

#define CLI_MODEL_OPTIONS                                                                       \
  {"model", required_argument, 0, OPT_MODEL}, {"config", required_argument, 0, OPT_CONFIG},     \
      {"schedule", required_argument, 0, OPT_SCHEDULE},                                       \
      {"disable", required_argument, 0, OPT_DISABLE}, {"tp", required_argument, 0, OPT_TP},   \
      {"comm-timeout", required_argument, 0, OPT_COMM_TIMEOUT},                               \
      {"precision", required_argument, 0, OPT_PRECISION}
/* The commands that run a pipeline add it to their options. */
#define CLI_PP_OPTIONS                                                                          \
  {"pp", required_argument, 0, OPT_PP}, {"pp-schedule", required_argument, 0, OPT_PP_SCHEDULE}

/* A schedule as --schedule and each side of profile --compare name it:
 * "default" is family f's default schedule (its path written into path, of
 * cap bytes), "" and "none" the unscheduled model (*out NULL), anything
 * else a .sched file's path (*out = name). Returns 0, or the usage error's
 * exit code 2 when f has no default schedule. */
int cli_schedule_resolve(const slapo_model_family *f, const char *name, const char *cmd, char *path,
                         size_t cap, const char **out);
/* Takes option `o` with value `arg` if it is a model option: 1 taken, 0 not
 * a model option, -1 a bad value. */
int cli_model_option(cli_model_opts *m, int o, const char *arg);
/* The values every rank of an MPI job must be given alike, checked before
 * the process groups are formed (cli/agree.c; slapo_dist_agree): each
 * field is a name as the user writes it, a digest of the whole value and a
 * short printable form. Filled only under mpirun (cli_model_start). */
typedef struct cli_fields {
  slapo_dist_field f[SLAPO_DIST_AGREE_MAX];
  char shown[SLAPO_DIST_AGREE_MAX][SLAPO_DIST_FIELD_SHOWN];
  int n;
} cli_fields;
void cli_fields_i64(cli_fields *a, const char *name, int64_t v);
void cli_fields_f64(cli_fields *a, const char *name, double v);
/* A string compared as written; NULL is "(none)". */
void cli_fields_str(cli_fields *a, const char *name, const char *s);
/* A file compared by its whole content (path shown); NULL is "(none)", an
 * unreadable file compares by its error. */
void cli_fields_file(cli_fields *a, const char *name, const char *path);
/* A file compared by path and size (large checkpoints); NULL is "(none)". */
void cli_fields_file_size(cli_fields *a, const char *name, const char *path);
/* A value shown as given with its own digest (data sets). */
void cli_fields_digest(cli_fields *a, const char *name, const char *shown, uint64_t digest);
/* Adds a command's own fields to those of the model options. */
typedef void (*cli_fields_fn)(cli_fields *a, const void *ud);

/* For commands that run the model for speed (train, profile): with
 * --precision bf16 on a CPU without bf16 GEMMs (slapo_bf16_gemm_native),
 * says so on stderr and drops it, so the run is f32 rather than slower. */
void cli_precision_for_speed(cli_model_opts *m, const char *cmd);

/* Resolves the family and defaults; 0 or a usage error's exit code 2. */
int cli_model_resolve(cli_model_opts *m, const char *cmd);
/* Under mpirun first checks that every rank was given the same command,
 * model options and the fields `extra` adds (NULL: none), on the world
 * before anything else communicates: a mismatch ends every rank with
 * "slapo: rank R: invalid_arg: ..." and exit code 1. Then forms the
 * process groups (slapo_dist_init_pp with --tp and --pp; only rank 0
 * keeps stdout).
 * --comm-timeout (slapo_dist_set_timeout) applies from the check on.
 * 0, or 1 when the ranks disagree or the groups cannot be formed. */
int cli_model_start(cli_model_opts *m, const char *cmd, cli_fields_fn extra, const void *ud);
/* cli_model_resolve then cli_model_start without extra fields. */
int cli_model_finish(cli_model_opts *m, const char *cmd);
void cli_model_opts_deinit(cli_model_opts *m);
/* The help lines of the model options, for a command's usage. */
void cli_model_usage(FILE *f, const char *default_config);
/* The help lines of --pp and --pp-schedule (train, verify). */
void cli_pp_usage(FILE *f);

/* The commands: argc/argv start at the command name. */
int cmd_train(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_find(int argc, char **argv);
int cmd_models(int argc, char **argv);
int cmd_primitives(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
/* A tokenizer as --tokenizer names it: "gpt2" (GPT-2's files, from
 * cli_gpt2_tokenizer_dir), or what slapo_tokenizer_open takes. */
slapo_status cli_tokenizer_open(const char *spec, slapo_tokenizer **out);
const char *cli_gpt2_tokenizer_dir(void);
int cmd_profile(int argc, char **argv);
int cmd_help(int argc, char **argv);
void cli_top_usage(FILE *f);

#endif
