/* slapo/module.h - module types (a vtable), module instances with named
 * parameters and ordered named children, dotted paths, materialization of
 * meta parameters, built-in layers, and slapo_step: build forward + backward
 * for a model and inputs, cache the plan, run it.
 * Layer: module (depends on autograd, exec). */
#ifndef SLAPO_MODULE_H
#define SLAPO_MODULE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "slapo/autograd.h"
#include "slapo/exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct slapo_module slapo_module;

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */
/* ------------------------------------------------------------------------ */

/* How a parameter is initialized when materialized. */
typedef enum slapo_init_kind {
  SLAPO_INIT_ZEROS,
  SLAPO_INIT_ONES,
  SLAPO_INIT_NORMAL, /* N(0, std^2) */
  /* U(-std, std): `std` holds the bound, not a standard deviation (which
   * is bound / sqrt(3)); PyTorch's kaiming_uniform_(a=sqrt(5)) default of
   * Conv2d / Linear is bound 1 / sqrt(fan_in). Element i is
   * std * (2 u - 1), u = slapo_rng_uniform(seed, hash(path), 0, i). */
  SLAPO_INIT_UNIFORM
} slapo_init_kind;

/* A parameter: its value (meta until materialized), its gradient (allocated
 * with the value, zeroed), and key/value tags (annotate). Shared between
 * modules when tied (GPT-2's lm_head.weight is transformer.wte.weight): one
 * storage, one gradient, visited once by the optimizer. Refcounted; owned
 * by the modules that hold it. */
typedef struct slapo_parameter {
  slapo_tensor *value;  /* f32, meta until materialized                  */
  slapo_tensor *grad;   /* same shape; NULL until materialized           */
  char *path;           /* canonical path: where it was first registered */
  slapo_init_kind init;
  float std;            /* NORMAL: std; UNIFORM: the bound               */
  bool no_weight_decay; /* AdamW skips it (biases, norms, 1-D params)    */
  int refcount;
  slapo_map *tags;      /* annotate: key -> owned value string; NULL = none */
  /* Tensor parallelism (the shard primitive): NULL when whole; else value
   * and grad hold this rank's piece of the unsharded tensor. Owned. */
  slapo_shard *shard;
  int shard_group;      /* the process group it is split across (slapo_group) */
  int n_shard_users;    /* paths of the modules that declared the shard: a  */
  char **shard_users;   /*   tied parameter must be sharded at every use     */
} slapo_parameter;

/* Sets tag `key` of p to `value` (copied), replacing an earlier value.
 * The tag "weight_decay" also sets no_weight_decay (value parsed as a
 * number: 0 means no decay). Errors: SLAPO_INVALID_ARG (weight_decay not a
 * number), NOMEM. */
slapo_status slapo_parameter_set_tag(slapo_parameter *p, const char *key, const char *value);
/* Value of tag `key`, or NULL. Borrowed: valid until the tag changes. */
const char *slapo_parameter_tag(const slapo_parameter *p, const char *key);

/* Splits p across a process group: its value becomes rank s->index's piece
 * of the unsharded tensor (s->full must be its shape): a meta value gets the
 * local shape (materialize then gives each element the value the unsharded
 * parameter has there), a materialized one is sliced and its gradient
 * zeroed. `user` is the path of the module declaring it (copied); a
 * parameter already split the same way only records another user (the
 * second use of a tied weight). Errors (p unchanged): SLAPO_STATE (already
 * split another way: names both layouts), SLAPO_SHAPE (s->full is not p's
 * shape), NOMEM. */
slapo_status slapo_parameter_shard(slapo_parameter *p, const slapo_shard *s, int group,
                                   const char *user);
/* The unsharded shape of p (its own shape when whole) into shape
 * [SLAPO_MAX_DIMS]; returns ndim. */
int slapo_parameter_full_shape(const slapo_parameter *p, int64_t *shape);
/* True when p holds one of several pieces of a tensor-parallel shard (its
 * group's ranks hold different values: norms and checkpoints combine them);
 * false for a replicated or unsharded parameter. */
bool slapo_parameter_is_sharded(const slapo_parameter *p);
/* The tensor-parallel layout of p's value (slapo/ir.h): SPLIT along the
 * shard's axis with its parts, this rank's start in each block and the
 * padded unsharded size; REPLICATED when p is not sharded (or in shards of
 * one). Parameter nodes get it when built (slapo_weight). */
slapo_layout slapo_parameter_layout(const slapo_parameter *p);

/* ------------------------------------------------------------------------ */
/* Module types                                                              */
/* ------------------------------------------------------------------------ */

/* Forward function: builds the module's computation on `in` (n_in nodes)
 * with op calls and child calls (slapo_call), and returns its output node
 * (or several values as one slapo_tuple, slapo/ops.h), or NULL after
 * recording an error on ctx. */
typedef slapo_node *(*slapo_forward_fn)(slapo_ctx *ctx, slapo_module *self, int n_in,
                                        slapo_node *const *in);

/* The op a module computes, as the pattern matcher sees it (relu ~ ReLU,
 * linear ~ Linear): the op's inputs are the module's inputs and parameters
 * in the order `inputs` names them ("$0" the module's input 0, any other
 * string a parameter's local name), with these attributes. */
typedef struct slapo_op_form {
  const struct slapo_op *op;
  int n_inputs;
  const char *inputs[4];
  int n_attrs;
  slapo_attr attrs[4]; /* strings borrowed from the module / static */
} slapo_op_form;

typedef struct slapo_module_type {
  const char *name;        /* PyTorch-style class name: "Linear"          */
  slapo_forward_fn forward;
  /* Extra text for the repr, e.g. "in_features=768, out_features=3072";
   * may be NULL. Writes at most cap bytes. */
  void (*describe)(const slapo_module *self, char *buf, size_t cap);
  /* Frees type-specific config (self->config); NULL: slapo_free. */
  void (*free_config)(void *config);
  /* The module's op form (fills *form, returns true), or NULL / false when
   * it has none. A module with an op form is a default leaf of `trace`:
   * it stays one call_module node, which patterns match through the form. */
  bool (*op_form)(const slapo_module *self, slapo_op_form *form);
} slapo_module_type;

typedef struct slapo_trace_state slapo_trace_state; /* a traced module's graphs (trace.c) */

/* A collective a module's call applies to its first input before the
 * forward or to its output after it (the sync primitive: fwd_pre and
 * bwd_post act on the input, fwd_post on the output). `emit` builds it on
 * x with the sync's arguments (the primitive's function: layers below dist
 * hold it without knowing the collectives) and returns NULL on error,
 * recorded on ctx. */
typedef enum slapo_sync_where { SLAPO_SYNC_INPUT, SLAPO_SYNC_OUTPUT } slapo_sync_where;
typedef struct slapo_module_sync {
  slapo_sync_where where;
  slapo_node *(*emit)(slapo_ctx *ctx, slapo_node *x, const int64_t *args);
  int64_t args[4];
} slapo_module_sync;

/* A module instance. Fields are readable; change them through the API. */
struct slapo_module {
  const slapo_module_type *type;
  char *name;               /* name in the parent ("c_fc", "3"); "" for root */
  slapo_module *parent;     /* borrowed; NULL for the root               */
  int n_children;
  slapo_module **children;  /* ordered; owned                            */
  int n_params;
  char **param_names;       /* local names ("weight")                    */
  slapo_parameter **params; /* one reference each                        */
  void *config;             /* type-specific, owned                      */
  /* Schedule state that slapo_call obeys (primitives set it). */
  bool checkpoint;          /* activations recomputed in backward        */
  bool pp_cut;              /* `cut`: a pipeline stage ends after it     */
  bool autocast_set;        /* the `autocast` primitive: GEMMs inside     */
  slapo_autocast autocast;  /*   build this way (nearest set ancestor wins) */
  slapo_trace_state *trace; /* traced: slapo_call emits its stored graph */
  int n_syncs;              /* applied by slapo_call, in order           */
  slapo_module_sync *syncs; /* owned                                     */
  uint64_t version;         /* root only: bumped by slapo_module_touch   */
  bool bf16_emulated;       /* root only: slapo_module_autocast_emulate  */
  int n_example;            /* root only: example inputs for `trace`     */
  slapo_tensor **example;   /*   (meta tensors, owned)                   */
};

/* Sets m's own autocast (the `autocast` primitive): bf16, or off (f32)
 * below a bf16 ancestor. bf16 is SLAPO_AUTOCAST_BF16, or its f32 emulation
 * when slapo_module_autocast_emulate was called on the tree. Touches m. */
void slapo_module_set_autocast(slapo_module *m, bool bf16);

/* The autocast mode m's GEMMs are built in: the nearest setting among m
 * and its ancestors, SLAPO_AUTOCAST_OFF when none. */
slapo_autocast slapo_module_autocast_of(const slapo_module *m);

/* Turns every bf16 autocast in m's tree (SLAPO_AUTOCAST_BF16), present and
 * to come (the root remembers it for the `autocast` primitive), into its
 * f32 emulation (SLAPO_AUTOCAST_BF16_EMULATED, slapo/ops.h): the same
 * rounding points in f32 arithmetic, on any CPU. verify's reference for a
 * schedule with autocast. Call it before a `trace` captures casts. Returns
 * how many modules changed; touches m when any. */
int slapo_module_autocast_emulate(slapo_module *m);

/* Records that the tree containing m changed (a primitive was applied or
 * weights were replaced): bumps the root's version, so cached steps are
 * rebuilt. */
void slapo_module_touch(slapo_module *m);
/* The root's version counter. */
uint64_t slapo_module_version(const slapo_module *m);

/* Creates a module of `type` with owned `config` (taken even on error).
 * *out owned (slapo_module_free, which frees children). Errors: NOMEM. */
slapo_status slapo_module_new(const slapo_module_type *type, void *config, slapo_module **out);
void slapo_module_free(slapo_module *m); /* NULL is fine */

/* Appends `child` (consumed, also on error) under `name`.
 * Errors: SLAPO_INVALID_ARG (name empty, contains '.', or taken), NOMEM. */
slapo_status slapo_module_add_child(slapo_module *m, const char *name, slapo_module *child);
/* Replaces m's child `name` by `child` (consumed, also on error), which takes
 * the old child's name and position (the `replace` primitive's table swap).
 * The old child is detached (parent NULL) and handed to the caller in *old
 * (owned; free it with slapo_module_free), or freed when `old` is NULL;
 * parameters the new child ties from it stay alive through their refcount.
 * Allocates nothing, so replacing back always undoes it.
 * Errors: SLAPO_NOT_FOUND (m has no child `name`; message lists m's
 * children), SLAPO_INVALID_ARG (child NULL); on error m is unchanged. */
slapo_status slapo_module_replace_child(slapo_module *m, const char *name, slapo_module *child,
                                        slapo_module **old);
/* Removes m's child `name` and frees it (undoing an add_child of a failed
 * primitive). Errors: SLAPO_NOT_FOUND (no such child). */
slapo_status slapo_module_remove_child(slapo_module *m, const char *name);
/* A child name "<base>_<k>" that m does not use yet, k = 0, 1, ... (the
 * names subgraph replacement gives new children), into buf [cap]. */
void slapo_module_unique_name(const slapo_module *m, const char *base, char *buf, size_t cap);
/* Declares a new f32 meta parameter `name` [shape] with an init rule.
 * Errors: SLAPO_INVALID_ARG (name taken), NOMEM. */
slapo_status slapo_module_add_param(slapo_module *m, const char *name, int ndim,
                                    const int64_t *shape, slapo_init_kind init, float std);
/* Makes m's parameter `name` refer to `p` (tying; p's refcount + 1),
 * replacing any parameter of that name. Errors: NOMEM. */
slapo_status slapo_module_tie_param(slapo_module *m, const char *name, slapo_parameter *p);

/* Appends a sync to m (copied); slapo_call applies input syncs in order
 * before m's forward and output syncs in order after it, inside m's call
 * (nodes stamped with m's path). A replace carries them to the new module.
 * Errors: SLAPO_LIMIT (8 syncs), SLAPO_INVALID_ARG (emit NULL), NOMEM. */
slapo_status slapo_module_add_sync(slapo_module *m, const slapo_module_sync *sync);

/* Child named `name` (one segment), or NULL. */
slapo_module *slapo_module_child(const slapo_module *m, const char *name);
/* Parameter by local name, or NULL. */
slapo_parameter *slapo_module_param(const slapo_module *m, const char *name);
/* Parameter at dotted `path` below m ("transformer.h.0.attn.c_attn.weight";
 * "weight" is m's own), or NULL when the module or parameter does not
 * exist (no error is recorded). */
slapo_parameter *slapo_module_param_at(const slapo_module *m, const char *path);
/* Module at dotted `path` below m ("transformer.h.3.mlp"; "" is m).
 * Errors: SLAPO_NOT_FOUND naming the deepest existing prefix and its
 * children. */
slapo_status slapo_module_at(const slapo_module *m, const char *path, slapo_module **out);
/* Full dotted path of m from its root ("" for the root). Owned string. */
char *slapo_module_path(const slapo_module *m);

/* Visits every parameter once (tied parameters once, at their first
 * position in tree pre-order), with its full path at that position; `path`
 * is borrowed for the call only (copy it to keep it). */
typedef void (*slapo_param_visit_fn)(slapo_parameter *p, const char *path, void *ud);
slapo_status slapo_module_visit_params(slapo_module *m, slapo_param_visit_fn fn, void *ud);
/* The gradient tensors of every materialized parameter below m, once each,
 * in slapo_module_visit_params order: *out (owned array; the tensors are
 * borrowed from the parameters) of *n. Errors: NOMEM. */
slapo_status slapo_module_grads(slapo_module *m, slapo_tensor ***out, int *n);
/* Number of distinct parameter elements. */
int64_t slapo_module_numel(slapo_module *m);

/* Allocates and initializes every meta parameter below m. Values depend only
 * on (seed, parameter path, element index) via Philox, not on order.
 * Errors: NOMEM. */
slapo_status slapo_module_materialize(slapo_module *m, uint64_t seed);
/* SLAPO_OK when every parameter below m has its values; else SLAPO_STATE
 * naming the first meta one, prefixed by `what` (the caller: "step").
 * Errors also: NOMEM. */
slapo_status slapo_module_check_materialized(slapo_module *m, const char *what);
/* Gives every parameter below m its path (the first path that reaches it,
 * so a tied parameter has one), as materialization does, without
 * allocating values: graphs can then be built and planned on a meta model
 * (slapo_runner_estimate). Errors: NOMEM. */
slapo_status slapo_module_name_params(slapo_module *m);

/* PyTorch-style repr of the tree with parameter counts, to f. Consecutive
 * identical children of a list are folded ("(0-5): 6 x Block"). */
void slapo_module_print(const slapo_module *m, FILE *f);

/* ------------------------------------------------------------------------ */
/* Calling modules inside forward functions                                  */
/* ------------------------------------------------------------------------ */

/* Calls the descendant `name` of self ("c_fc", or "h.3" through a list) on
 * inputs: looks it up at call time (so
 * `replace` only swaps a table entry), stamps its path as the origin of the
 * nodes it emits, and obeys its schedule state. NULL on error (recorded on
 * ctx, naming the path). */
slapo_node *slapo_call(slapo_ctx *ctx, slapo_module *self, const char *name, int n_in,
                       slapo_node *const *in);
/* Shorthand for one input. */
slapo_node *slapo_call1(slapo_ctx *ctx, slapo_module *self, const char *name, slapo_node *x);
/* Node reading self's parameter `name` (one node per parameter per graph,
 * so tied uses accumulate one gradient). NULL on error. */
slapo_node *slapo_weight(slapo_ctx *ctx, slapo_module *self, const char *name);

/* ------------------------------------------------------------------------ */
/* Built-in layers (PyTorch names and semantics)                             */
/* ------------------------------------------------------------------------ */

/* nn.Linear: weight [out, in] N(0, std), bias [out] zeros (optional). */
slapo_status slapo_linear_new(int64_t in_features, int64_t out_features, bool bias, float std,
                              slapo_module **out);
/* nn.LayerNorm over the last dim: weight ones, bias zeros. */
slapo_status slapo_layernorm_new(int64_t dim, double eps, slapo_module **out);
/* RMSNorm over the last dim (LLaMA's LlamaRMSNorm): weight [dim] ones, no
 * bias; y = x / sqrt(mean(x^2) + eps) * weight. Errors: INVALID_ARG (dim <=
 * 0), NOMEM. */
slapo_status slapo_rmsnorm_new(int64_t dim, double eps, slapo_module **out);
/* nn.Embedding: weight [num, dim] N(0, std). */
slapo_status slapo_embedding_new(int64_t num, int64_t dim, float std, slapo_module **out);
slapo_status slapo_dropout_new(double p, slapo_module **out);
/* nn.GELU(approximate="tanh" if tanh else "none"). */
slapo_status slapo_gelu_new(bool tanh, slapo_module **out);
slapo_status slapo_relu_new(slapo_module **out);
/* nn.SiLU: x * sigmoid(x) (LLaMA's act_fn). */
slapo_status slapo_silu_new(slapo_module **out);
/* nn.Conv2d options; NULL in slapo_conv2d_new means
 * SLAPO_CONV2D_OPTS_DEFAULT (stride 1, padding 0, dilation 1, groups 1,
 * bias). Start from the default and change fields: every field is read. */
typedef struct slapo_conv2d_opts {
  int64_t stride[2];   /* [h, w], >= 1                        */
  int64_t padding[2];  /* [h, w] zeros added on both sides, >= 0 */
  int64_t dilation[2]; /* [h, w], 1 = dense                   */
  int64_t groups;      /* divides in and out channels          */
  bool bias;
} slapo_conv2d_opts;
#define SLAPO_CONV2D_OPTS_DEFAULT ((slapo_conv2d_opts){{1, 1}, {0, 0}, {1, 1}, 1, true})
/* nn.Conv2d(in_channels, out_channels, (kh, kw), ...): weight
 * [out, in/groups, kh, kw] and bias [out] (when opts->bias), both
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in/groups * kh * kw
 * (PyTorch's default init, kaiming_uniform_(a=sqrt(5)) for the weight).
 * Computes slapo_conv2d on its one input x [N, in, H, W]. opts is copied;
 * *out owned. Errors: SLAPO_INVALID_ARG (a size < 1, stride or dilation
 * < 1, padding < 0, groups < 1 or not dividing in and out), NOMEM. */
slapo_status slapo_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                              const slapo_conv2d_opts *opts, slapo_module **out);
/* nn.ModuleList: children named "0", "1", … added with add_child. */
slapo_status slapo_modulelist_new(slapo_module **out);

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum slapo_step_mode {
  SLAPO_STEP_TRAIN, /* forward + backward, dropout on; output 0 = loss  */
  SLAPO_STEP_EVAL   /* forward only, dropout off                         */
} slapo_step_mode;

/* A model ready to run: the root module plus the cache of built steps. */
typedef struct slapo_runner slapo_runner;

/* Creates a runner for `root` (borrowed; must outlive the runner). The model
 * must be materialized before the first step. *out owned.
 * Errors: NOMEM. */
slapo_status slapo_runner_new(slapo_module *root, const slapo_plan_opts *opts,
                              slapo_runner **out);
void slapo_runner_free(slapo_runner *r);

/* Bumps the model version: the next step rebuilds its graph (called by every
 * primitive and weight load). */
void slapo_runner_invalidate(slapo_runner *r);

/* Runs one step on inputs (e.g. idx [B, T] i32 and targets [B, T] i32): the
 * root forward receives one placeholder per input ("in0", "in1", ...).
 * TRAIN: the root's output must be a scalar loss; gradients are *added* to
 * each parameter's grad (so micro-batches accumulate; zero them with
 * slapo_module_zero_grad). The built step is cached by (model version,
 * input shapes and dtypes, mode); SLAPO_DEBUG_STEP=1 rebuilds every step
 * and checks the rebuilt graph prints the same as the cached one.
 * `out` (may be NULL) receives the root's output value, borrowed until
 * the next step. Integer inputs that reach an embedding's ids or a
 * cross-entropy's targets are checked against the vocabulary first (ids in
 * [0, V), targets too or ignore_index), as PyTorch raises on them.
 * Errors: those of building (ctx message naming op, module path and
 * shapes), SLAPO_INVALID_ARG (train mode without a scalar loss; an id or
 * target outside the vocabulary: input, value, element and reader named;
 * a meta input tensor), SLAPO_STATE (not materialized), NOMEM. */
slapo_status slapo_step(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                        slapo_step_mode mode, const slapo_kernel_env *env,
                        const slapo_tensor **out);
/* The most inputs a step takes (ids, labels, masks ...): more is
 * SLAPO_INVALID_ARG naming both counts. */
#define SLAPO_STEP_MAX_INPUTS 8
/* slapo_step with the gradients weighted: TRAIN adds loss_scale * dloss/dθ
 * to each gradient (the backward's seed is loss_scale instead of 1; EVAL
 * ignores it). Micro-batches of one optimizer step are weighted this way by
 * their share of the step's valid tokens (slapo_train_accumulate), so the
 * accumulated gradient is that of the whole step's token mean. With
 * loss_scale 1 the gradients are bitwise those of slapo_step. Errors: as
 * slapo_step. */
slapo_status slapo_step_scaled(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                               slapo_step_mode mode, const slapo_kernel_env *env,
                               float loss_scale, const slapo_tensor **out);
/* slapo_step_scaled with `grads` (SLAPO_ACC_* flags of slapo/exec.h) saying
 * how TRAIN puts the gradients into the parameters' grads: SLAPO_ACC_ADD
 * adds (as slapo_step_scaled); SLAPO_ACC_WRITE overwrites them, for a
 * step's first micro-batch (no slapo_module_zero_grad before it: the
 * kernels write the gradients straight into the grads where they can, and
 * the grads of parameters the step does not use are zeroed); with
 * SLAPO_ACC_MEASURE the step also records each gradient's sum of squares
 * once it is final, while it is in cache (slapo_runner_grad_sumsq), for a
 * step's last micro-batch. The same values as zero_grad + ADD and a
 * separate pass. Errors: as slapo_step, SLAPO_INVALID_ARG (unknown flags). */
slapo_status slapo_step_grads(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                              slapo_step_mode mode, const slapo_kernel_env *env, float loss_scale,
                              unsigned grads, const slapo_tensor **out);
/* After a TRAIN step with SLAPO_ACC_MEASURE, and as long as no grad was
 * written since: the sums of squares of every parameter's grad, in double,
 * split into those of tensor-parallel shards (*sharded: this rank's pieces,
 * to be summed over the TP group) and the rest (*replicated). Errors:
 * SLAPO_STATE (the last step was not a measured TRAIN step). */
slapo_status slapo_runner_grad_sumsq(const slapo_runner *r, double *replicated, double *sharded);
/* The activation peak (bytes) slapo_step would plan for these inputs and
 * mode, computed without allocating anything: the model may still be meta
 * (its parameters are named, as slapo_module_name_params does) and `in`
 * may be meta tensors (only dtypes and shapes are read). The step is not
 * cached. Errors: those of building and planning, NOMEM. */
slapo_status slapo_runner_estimate(slapo_runner *r, int n_in, const slapo_tensor *const *in,
                                   slapo_step_mode mode, size_t *peak_nbytes);
/* Planned activation peak of the most recent step, in bytes. */
size_t slapo_runner_peak_nbytes(const slapo_runner *r);
/* The plan of the most recent step (timing), borrowed. */
const slapo_plan *slapo_runner_plan(const slapo_runner *r);
/* The graph of the most recent step, borrowed. */
const slapo_graph *slapo_runner_graph(const slapo_runner *r);

/* ------------------------------------------------------------------------ */
/* Pipeline stages (module/pipeline.c)                                       */
/* ------------------------------------------------------------------------ */

/* One stage of a model cut by the schedule's `cut` lines, for pipeline
 * parallelism: the step's forward (as slapo_step builds it) split after
 * each cut module's last op, the stage's part copied with its module paths
 * and attributes (dropout masks are the one-process masks) into a joint
 * forward + backward graph of its own, planned once. Values an earlier
 * stage computed and this one (or a later one) reads are received, in the
 * forward's order, which every rank computes alike; what the next stage
 * receives is sent. Its backward takes the gradients of what it sent and
 * gives those of what it received. Micro-batches in flight each have a
 * slot: an activation arena (the plan's own for slot 0) and buffers for
 * what the slot receives. The parameters the stage reads get their
 * gradients accumulated into their grads (the SLAPO_ACC_* flags of
 * slapo_train_accumulate). Method: GPipe (Huang et al. 2019) and 1F1B
 * (Narayanan et al. 2019, PipeDream-Flush) split a step this way. */
typedef struct slapo_pp_stage slapo_pp_stage;

/* 1 + the number of modules under root marked by `cut`. */
int slapo_pp_stage_count(const slapo_module *root);

/* What each block of root's longest module list costs (children named 0
 * .. n-1: GPT-2's transformer.h, LLaMA's model.layers, BERT's
 * bert.encoder.layer), for pipeline stages balanced without cut lines
 * (slapo_pp_auto_cut): the ops of the step's forward for inputs shaped
 * like in [n_in], each costed by a roofline from its shapes alone, the
 * larger of slapo_node_flops / 8 and slapo_node_bytes (8 FLOPs a byte: a
 * CPU core's f32 compute against its memory bandwidth), summed by the
 * block that emitted it; the ops before the first block count to it
 * (embeddings), those after the last to it (final norm, head, loss). The
 * backward is taken to cost in proportion. *list: the list's path;
 * *costs [*n]; both owned (slapo_free). Errors: SLAPO_NOT_FOUND (no
 * module list), SLAPO_INVALID_ARG (a loss that is not a scalar), those of
 * building the step, NOMEM. */
slapo_status slapo_pp_block_costs(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                  char **list, double **costs, int *n);

/* Builds stage `stage` (0-based) of root for a TRAIN step over inputs
 * shaped like in [n_in] (idx, targets), with n_slots micro-batches in
 * flight at most. opts as slapo_runner_new's (debug allocation is off:
 * slots need arenas). Root stays borrowed; *out owned
 * (slapo_pp_stage_free). Errors: SLAPO_PRECOND naming the cut module (it
 * emits no op of its own, its ops are not in sequence, two cuts end at
 * one op, nothing runs after the last cut, a stage that sends no
 * floating-point value), SLAPO_INVALID_ARG (stage out
 * of range, n_slots < 1, a loss that is not a scalar), SLAPO_STATE (a
 * parameter the stage reads is not materialized; the others may be
 * meta), those of building a step, NOMEM. */
slapo_status slapo_pp_stage_new(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                int stage, int n_slots, const slapo_plan_opts *opts,
                                slapo_pp_stage **out);
void slapo_pp_stage_free(slapo_pp_stage *st); /* NULL is fine */
/* Materializes the parameters stage `stage` of root reads (as
 * slapo_module_materialize would: each value a function of seed, path and
 * index) and no other, on a meta model: a pipeline rank allocates its
 * stage alone. Stage 0 also gets the parameters no stage reads (the
 * pipeline's optimizer counts them as stage 0's). Arguments as slapo_pp_stage_new's. Errors: those of
 * building the stage's graph, NOMEM. */
slapo_status slapo_pp_stage_materialize(slapo_module *root, int n_in,
                                        const slapo_tensor *const *in, int stage, uint64_t seed);
/* What stage `stage` of root will need, without allocating (the model may
 * be meta): *param_numel, the elements of the parameters it reads, and
 * *act_nbytes, its planned activation peak times n_slots (one arena a
 * micro-batch in flight; slot 0's is the plan's own). Arguments as
 * slapo_pp_stage_new's. Errors: those of building and planning the
 * stage's graph, NOMEM. */
slapo_status slapo_pp_stage_estimate(slapo_module *root, int n_in, const slapo_tensor *const *in,
                                     int stage, int n_slots, int64_t *param_numel,
                                     size_t *act_nbytes);

int slapo_pp_stage_index(const slapo_pp_stage *st);
int slapo_pp_stage_n_stages(const slapo_pp_stage *st);
bool slapo_pp_stage_is_last(const slapo_pp_stage *st);
/* Values received from the previous stage and sent to the next (0 on the
 * first / last stage), and the parameters the stage reads (borrowed). */
int slapo_pp_stage_n_recv(const slapo_pp_stage *st);
int slapo_pp_stage_n_send(const slapo_pp_stage *st);
int slapo_pp_stage_n_params(const slapo_pp_stage *st);
int slapo_pp_stage_n_slots(const slapo_pp_stage *st); /* as built */
slapo_parameter *slapo_pp_stage_param(const slapo_pp_stage *st, int i);
/* The stage's graph and plan (printing, timing), borrowed. */
const slapo_graph *slapo_pp_stage_graph(const slapo_pp_stage *st);
const slapo_plan *slapo_pp_stage_plan(const slapo_pp_stage *st);

/* Where slot's received value i goes (its dtype and shape), and where the
 * gradient of sent value i goes (f32; NULL for a value that is not
 * floating point: none is sent back). Fill them before the forward /
 * backward of the micro-batch in that slot; borrowed; NULL out of range. */
slapo_tensor *slapo_pp_stage_recv_buf(slapo_pp_stage *st, int slot, int i);
slapo_tensor *slapo_pp_stage_grad_buf(slapo_pp_stage *st, int slot, int i);

/* The forward of the micro-batch whose inputs are in [n_in] (each stage
 * reads the ones it needs: idx on the first, targets on the last) in
 * `slot`. Afterwards, until the next forward or backward of the stage,
 * slapo_pp_stage_sent gives the values to send and slapo_pp_stage_loss
 * the loss (last stage). Errors: SLAPO_INVALID_ARG (slot out of range,
 * other inputs than built for, token ids out of range), those of
 * slapo_plan_run_span. */
slapo_status slapo_pp_stage_forward(slapo_pp_stage *st, int slot, int n_in,
                                    const slapo_tensor *const *in, const slapo_kernel_env *env);
/* The backward of the micro-batch in `slot`, after its forward and with
 * its gradients received (grad_buf): the same inputs and env. The loss's
 * gradient is seeded with loss_scale (last stage; slapo_step_scaled);
 * `grads` (SLAPO_ACC_*) says how the parameters' gradients go into their
 * grads. Afterwards slapo_pp_stage_recv_grad gives the gradients to send
 * back. Errors: as slapo_pp_stage_forward. */
slapo_status slapo_pp_stage_backward(slapo_pp_stage *st, int slot, int n_in,
                                     const slapo_tensor *const *in, const slapo_kernel_env *env,
                                     float loss_scale, unsigned grads);
/* After a forward: the loss (last stage, else NULL), sent value i. After a
 * backward: the gradient of received value i (NULL when not floating
 * point). Borrowed, valid until the stage runs again. */
const slapo_tensor *slapo_pp_stage_loss(const slapo_pp_stage *st);
const slapo_tensor *slapo_pp_stage_sent(const slapo_pp_stage *st, int i);
const slapo_tensor *slapo_pp_stage_recv_grad(const slapo_pp_stage *st, int i);

/* ------------------------------------------------------------------------ */
/* Decoding with a KV cache                                                  */
/* ------------------------------------------------------------------------ */

/* The keys and values of every attention module for the positions decoded
 * so far, so generating a token runs the model on that token only instead
 * of recomputing the whole window. */
typedef struct slapo_kv_cache slapo_kv_cache;

/* Errors: NOMEM. *out owned (slapo_kv_cache_free). */
slapo_status slapo_kv_cache_new(slapo_kv_cache **out);
void slapo_kv_cache_free(slapo_kv_cache *c); /* NULL is fine */
/* Positions held (0 for a new cache). */
int64_t slapo_kv_cache_len(const slapo_kv_cache *c);

/* Runs idx [B, T] i32 (the next T tokens, at positions len .. len + T - 1)
 * through the root in eval mode, reading the past keys and values from
 * `cache` and appending this step's; *logits [B, T, V] f32 is borrowed
 * until the next call. The graph is built for each call (its shapes grow
 * with the cache). Modules that support decoding read the past length with
 * slapo_decode_past and exchange keys and values with slapo_decode_kv.
 * Errors: SLAPO_UNSUPPORTED (the model recorded no keys and values: no
 * module of it decodes), those of building and running. */
slapo_status slapo_step_decode(slapo_runner *r, slapo_kv_cache *cache, const slapo_tensor *idx,
                               const slapo_kernel_env *env, const slapo_tensor **logits);

/* For module forwards. While a decoding step is built: the number of cached
 * positions P (the new tokens are at P, P + 1, ...); otherwise -1. */
int64_t slapo_decode_past(slapo_ctx *ctx);
/* For attention forwards while decoding: k, v [B, NH, T, HS] are the new
 * positions' keys and values; *k_all, *v_all [B, NH, P + T, HS] the cached
 * ones followed by them, recorded as this module's present keys and values
 * (keyed by the module path, so each layer has its own). Errors: recorded
 * on ctx (SLAPO_SHAPE when the cache's shapes do not fit, NOMEM); returns
 * the ctx status. */
slapo_status slapo_decode_kv(slapo_ctx *ctx, slapo_node *k, slapo_node *v, slapo_node **k_all,
                             slapo_node **v_all);

/* ------------------------------------------------------------------------ */
/* Tracing (DESIGN.md §3: modules are traced by need)                        */
/* ------------------------------------------------------------------------ */

/* Example inputs of a root module: the shapes `trace` runs the model's
 * forward at to capture a module's graph (GPT-2: ids and labels [2, 8]).
 * Copies the tensors' dtypes and shapes (as meta tensors); n = 0 clears.
 * Errors: SLAPO_INVALID_ARG (m not a root, n outside [0, 8]), NOMEM. */
slapo_status slapo_module_set_example(slapo_module *m, int n, const slapo_tensor *const *in);

typedef struct slapo_trace_opts {
  bool flatten;       /* inline children down to the leaves              */
  const char *leaves; /* "A,B": module type names or paths (relative to
                         the traced module) kept as call_module nodes, on
                         top of the default leaves (types with an op form)
                         and the modules a trace cannot inline; NULL none */
} slapo_trace_opts;

/* Captures m's forward as a graph stored on m (schedule state): the root's
 * forward is built on the example inputs and, when it calls m, m's forward
 * is traced at those input shapes. Children stay call_module nodes (their
 * own schedule state keeps working) unless `flatten`, which inlines every
 * child that is not a leaf. From then on slapo_call emits the stored graph
 * instead of calling the forward: parameters are referred to by path
 * relative to m, op nodes keep their attributes (random ops their stream),
 * call_module nodes are called by name. A call at other input shapes (or a
 * second call of m in one forward) re-traces m at those shapes and replays
 * the graph edits recorded with slapo_module_edit_graph, so baked shapes
 * (GPT-2 attention's B, T, NH) follow. Decoding with a KV cache runs the
 * forward function of a traced module whose trace has no edits (same
 * computation) and refuses one with edits (SLAPO_UNSUPPORTED).
 * Errors (m unchanged): SLAPO_STATE (already traced; inlined into an
 * ancestor's flattened trace: names it), SLAPO_PRECOND (the root has no
 * example inputs; the root's forward never calls m), SLAPO_UNSUPPORTED
 * (a module that cannot be inlined: checkpointed or a list; names its path
 * and the reason), errors of building the forward (prefixed "trace: PATH:"),
 * NOMEM. */
slapo_status slapo_module_trace(slapo_module *m, const slapo_trace_opts *opts);
/* The stored graph at the example shapes, which find and graph edits work
 * on; NULL when m is not traced. Borrowed: valid until the next edit. */
slapo_graph *slapo_module_graph(const slapo_module *m);
/* The options m was traced with (NULL when untraced). Borrowed. */
const slapo_trace_opts *slapo_module_trace_options(const slapo_module *m);
/* When m's forward is inlined into the flattened trace of an ancestor, that
 * ancestor (so m's own schedule state cannot act); else NULL. */
slapo_module *slapo_module_inlined_by(const slapo_module *m);
/* The nearest strict ancestor of m traced with flatten = true, whose graph
 * holds m inlined or as a module call (a leaf such as Linear); else NULL.
 * Changing what m is (replace, decompose) after that trace would leave the
 * stored graph and its recorded edits describing the old m. */
slapo_module *slapo_module_flattened_by(const slapo_module *m);

/* An edit of a traced module's graph (subgraph replace, checkpoint): applied
 * to `g` (the stored graph of m, at some input shapes) and replayed on each
 * re-trace. It must check before it mutates: on error g is unchanged. */
typedef slapo_status (*slapo_graph_edit_fn)(slapo_module *m, slapo_graph *g, void *ud);

/* Applies fn to m's stored graph, lints it, and records (fn, ud) for replay
 * (ud then owned by m, freed with free_ud; on error the caller keeps it).
 * Cached graphs at other shapes are dropped. `what` (copied) names the edit
 * in replay errors. Errors: SLAPO_PRECOND (m not traced), fn's status (graph
 * unchanged), SLAPO_STATE (the edited graph fails lint: the edit is undone
 * by re-tracing), NOMEM. */
slapo_status slapo_module_edit_graph(slapo_module *m, const char *what, slapo_graph_edit_fn fn,
                                     void (*free_ud)(void *), void *ud);

/* The most values a module forward returns as a tuple (slapo_tuple). */
#define SLAPO_MAX_RESULTS 16

/* The dtype and shape of one value. */
typedef struct slapo_value_meta {
  slapo_dtype dtype;
  int ndim;
  int64_t shape[SLAPO_MAX_DIMS];
} slapo_value_meta;

/* The metas of y, a value a forward returned: one value (returns 0; out[0]
 * its meta), or a tuple of k values (returns k; out[0..k) their metas,
 * filled only when k <= SLAPO_MAX_RESULTS, which callers check). */
int slapo_value_metas(const slapo_node *y, slapo_value_meta *out);

/* What `mod`'s forward returns for inputs with the metas of `in` (nodes of
 * any graph; only dtype and shape are read), built on a scratch graph: for
 * graph edits that insert a call of a new module. One value: *n_results = 0
 * and out[0] its meta; a tuple of k values: *n_results = k and out[0..k)
 * (out holds SLAPO_MAX_RESULTS). `path` names mod in errors. Errors: those
 * of building, SLAPO_LIMIT (more than SLAPO_MAX_RESULTS values). */
slapo_status slapo_module_infer(slapo_module *mod, const char *path, int n_in,
                                slapo_node *const *in, slapo_value_meta *out, int *n_results);

/* Sets every parameter gradient below m to zero. */
void slapo_module_zero_grad(slapo_module *m);

#ifdef __cplusplus
}
#endif
#endif /* SLAPO_MODULE_H */
