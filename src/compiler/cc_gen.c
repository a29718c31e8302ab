/* compiler/cc_gen.c - C source for a fused elementwise region: one forward
 * and one backward kernel, each a loop over the output viewed as [R, C].
 *
 * The forward computes every node of the region per element from the
 * inputs and writes only the result. The backward saves nothing from the
 * forward: it recomputes the forward values per element from the inputs,
 * then runs reverse-mode through the region (each op's gradient expression
 * as compiler/cc_ops.c renders it) and writes every input's gradient into one
 * packed buffer at host-given offsets. A ROW input's gradient (a bias) is
 * the sum over rows, a SCALAR's the sum over all elements: the backward is
 * parallel over a fixed number of row blocks (SLAPO__CC_ROW_BLOCKS, set by
 * R alone, never by the thread count), each walking its rows in order and
 * summing its partials into a work area behind the gradients (a ROW
 * input's in float, at the loop's vector width; a SCALAR's in double); the
 * partials are then added in block order, in double. So reruns are
 * byte-identical whatever the thread count. Without a ROW input the
 * elements are viewed as rows of a fixed chunk (SLAPO_CC_CHUNK), so a
 * region of one row is still parallel. Expressions are the ops' float
 * forms (what their fast kernels compute) unless math=ref asks for the
 * reference forms; the fast kernels' helpers the float forms call are
 * pasted in from slapo/ops/vmath.h (slapo__cc_math_src). Dropout draws
 * Philox4x32-10 exactly as slapo_rng_uniform (the key of each random node
 * is computed by the host from the run's seed and the node's stream); the
 * generated source carries its own Philox.
 * Layer: compiler. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compiler/cc_gen.h"

typedef slapo__cc_gen gen;
typedef slapo__cc_sbuf sbuf;

/* ---- a growing string ---- */

void slapo__cc_put(slapo__cc_sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? 2 * b->cap : 4096;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *s = slapo_realloc(b->s, cap);
    if (!s) {
      b->oom = true;
      return;
    }
    b->s = s, b->cap = cap;
  }
}

/* ---- input kinds ---- */

int64_t slapo__cc_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

slapo_status slapo__cc_kinds(int n_in, const slapo_node *const *in, int ndim,
                             const int64_t *shape, slapo__cc_kind *kind, int64_t *C) {
  int64_t N = slapo__cc_numel(ndim, shape);
  *C = 0;
  for (int i = 0; i < n_in; i++) {
    const slapo_node *x = in[i];
    int64_t n = slapo__cc_numel(x->ndim, x->shape);
    /* x's dims without leading 1s must be the output's trailing dims. */
    int k = 0;
    while (k < x->ndim && x->shape[k] == 1) k++;
    bool trailing = x->ndim - k <= ndim;
    for (int d = k; trailing && d < x->ndim; d++)
      trailing = x->shape[d] == shape[ndim - (x->ndim - d)];
    if (n == N && trailing) kind[i] = SLAPO__CC_FULL;
    else if (n == 1) kind[i] = SLAPO__CC_SCALAR;
    else if (trailing && (*C == 0 || *C == n)) kind[i] = SLAPO__CC_ROW, *C = n;
    else {
      char a[96], b[96];
      return slapo_error(SLAPO_UNSUPPORTED, "cc: input %d %s broadcasts to %s in a way cc does "
                         "not generate (same shape, trailing dims, or one value; rows of one "
                         "size)", i, slapo_shape_str(x->ndim, x->shape, a, sizeof a),
                         slapo_shape_str(ndim, shape, b, sizeof b));
    }
  }
  return SLAPO_OK;
}

/* ---- expressions ---- */

/* Copies expr replacing the operand names a, b, y, g, u (whole identifiers;
 * numbers such as 1e-05f or 0x1.9999ap-4f are skipped as a unit) by the
 * given texts. */
static void substitute(sbuf *out, const char *expr, const char *const names[5]) {
  static const char ops[] = "abygu";
  for (const char *p = expr; *p;) {
    if ((*p >= '0' && *p <= '9') || (*p == '.' && p[1] >= '0' && p[1] <= '9')) {
      const char *q = p;
      while ((*q >= '0' && *q <= '9') || *q == '.' || (*q >= 'a' && *q <= 'z') ||
             (*q >= 'A' && *q <= 'Z') || ((*q == '+' || *q == '-') && strchr("eEpP", q[-1])))
        q++;
      slapo__cc_put(out, "%.*s", (int)(q - p), p);
      p = q;
    } else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_') {
      const char *q = p;
      while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' ||
             (*q >= '0' && *q <= '9'))
        q++;
      const char *hit = q - p == 1 ? strchr(ops, *p) : NULL;
      if (hit && names[hit - ops]) slapo__cc_put(out, "%s", names[hit - ops]);
      else slapo__cc_put(out, "%.*s", (int)(q - p), p);
      p = q;
    } else {
      slapo__cc_put(out, "%c", *p++);
    }
  }
}

slapo_status slapo__cc_expr_of(gen *G, const slapo_node *n, int which, char *buf, size_t cap) {
  if (!slapo__cc_renders(n->op))
    return slapo_error(SLAPO_UNSUPPORTED, "cc: op '%s' (%%%s) is not elementwise; the cc backend "
                       "generates elementwise regions only", n->target, n->name);
  if (!slapo__cc_expr(n, which, G->fast, buf, cap))
    return slapo_error(SLAPO_UNSUPPORTED, "cc: op '%s' (%%%s) has no cc %s for these attributes",
                       n->target, n->name, which < 0 ? "expression" : "gradient");
  return SLAPO_OK;
}

/* "v<id>" names of n's inputs and itself, for substitution. */
static void names_of(const slapo_node *n, char nm[5][24], const char *g) {
  snprintf(nm[0], 24, "v%d", n->n_inputs > 0 ? n->inputs[0]->id : 0);
  snprintf(nm[1], 24, "v%d", n->n_inputs > 1 ? n->inputs[1]->id : 0);
  snprintf(nm[2], 24, "v%d", n->id);
  snprintf(nm[3], 24, "%s", g);
  snprintf(nm[4], 24, "u%d", n->id);
}

static const char *load_of(const gen *G, int k, char *buf, size_t cap) {
  const char *idx[3] = {"i", "c", "0"};
  snprintf(buf, cap, "in[%d][%s]", k, idx[G->plan->kind[k]]);
  return buf;
}

/* Whether expr names the operand `op` (a, b, y ...) as a whole identifier. */
static bool uses(const char *expr, char op) {
  char one[2] = {op, 0};
  const char *names[5] = {NULL};
  static const char ops[] = "abygu";
  names[strchr(ops, op) - ops] = "\x01";
  sbuf t = {0};
  substitute(&t, expr, names);
  bool hit = t.s && strchr(t.s, '\x01');
  slapo_free(t.s);
  (void)one;
  return hit;
}

/* Which forward values the backward reads: those its gradient expressions
 * name (a, b: the inputs; y: the node's own value) and what they are
 * computed from. An input nobody reads is not kept alive for the backward
 * (a residual add, dropout and a bias add need only dy). */
static slapo_status compute_needs(gen *G) {
  char ebuf[1024];
  for (const slapo_node *n = slapo_graph_last(G->g); n; n = n->prev) {
    if (n->kind != SLAPO_NODE_CALL_OP || n->op == SLAPO_OP_DESC(full) || n == G->row) continue;
    for (int j = 0; j < n->n_inputs; j++) {
      SLAPO_TRY(slapo__cc_expr_of(G, n, j, ebuf, sizeof ebuf));
      if (uses(ebuf, 'a')) G->need[n->inputs[0]->id] = true;
      if (n->n_inputs > 1 && uses(ebuf, 'b')) G->need[n->inputs[1]->id] = true;
      if (uses(ebuf, 'y')) G->need[n->id] = true;
    }
  }
  for (const slapo_node *n = slapo_graph_last(G->g); n; n = n->prev)
    if (G->need[n->id] && n->kind == SLAPO_NODE_CALL_OP && n != G->row) /* a norm's output */
      for (int j = 0; j < n->n_inputs; j++) G->need[n->inputs[j]->id] = true; /* is recomputed */
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next)
    if (n->kind == SLAPO_NODE_PLACEHOLDER) G->plan->bwd_reads[G->ph_of[n->id]] = G->need[n->id];
  return SLAPO_OK;
}

/* Which FULL inputs' gradients are the output gradient itself: a chain of
 * single uses from the input to the output through gradient expressions
 * that are exactly "(g)" (add, sub's first input, a dropout with p = 0).
 * Their backward is dy, with no pass over memory (as the unfused adds). In
 * a row region G->out is the norm's input: such inputs share its gradient,
 * written once (cc_rows.c). */
static slapo_status compute_identities(gen *G) {
  char ebuf[1024];
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next) {
    if (n->kind != SLAPO_NODE_PLACEHOLDER) continue;
    int k = G->ph_of[n->id];
    if (G->plan->kind[k] != SLAPO__CC_FULL ||
        slapo__cc_numel(n->ndim, n->shape) != slapo__cc_numel(G->out->ndim, G->out->shape))
      continue;
    const slapo_node *cur = n;
    bool ok = true;
    while (ok && cur != G->out) {
      const slapo_node *u = cur->n_users == 1 ? cur->users[0] : NULL;
      ok = u && u->kind == SLAPO_NODE_CALL_OP && u->op != SLAPO_OP_DESC(full) &&
           G->rand_of[u->id] < 0;
      int j = -1;
      for (int q = 0; ok && q < u->n_inputs; q++)
        if (u->inputs[q] == cur) j = q;
      if (ok && j >= 0) SLAPO_TRY(slapo__cc_expr_of(G, u, j, ebuf, sizeof ebuf));
      ok = ok && j >= 0 && !strcmp(ebuf, "(g)");
      cur = u;
    }
    G->plan->grad_is_dy[k] = ok;
  }
  return SLAPO_OK;
}

/* The forward values of every node (the backward: those it needs), one
 * statement each, into G->b. A random node's training value is computed
 * unconditionally and then selected by `training`: under the condition, its
 * multiply would be a conditional floating-point operation, which GCC does
 * not if-convert (it may trap), and the loop would stay scalar. */
slapo_status slapo__cc_emit_values(gen *G, const char *indent, bool bwd) {
  char ebuf[1024], lb[64];
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next) {
    if (G->mask && !G->mask[n->id]) continue;
    bool skip = bwd && !G->need[n->id];
    if (skip && !(n->kind == SLAPO_NODE_CALL_OP && G->rand_of[n->id] >= 0)) continue;
    if (G->as && G->as[n->id]) {
      slapo__cc_put(&G->b, "%sconst float v%d = %s; /* %s */\n", indent, n->id, G->as[n->id],
                    n->target);
      continue;
    }
    if (n->kind == SLAPO_NODE_PLACEHOLDER) {
      slapo__cc_put(&G->b, "%sconst float v%d = %s; /* %s */\n", indent, n->id,
          load_of(G, G->ph_of[n->id], lb, sizeof lb), n->target);
      continue;
    }
    if (n->kind != SLAPO_NODE_CALL_OP) continue;
    if (n->op == SLAPO_OP_DESC(full)) {
      slapo__cc_put(&G->b, "%sconst float v%d = (float)%.17g; /* full */\n", indent, n->id,
          slapo_node_attr_float(n, "value", 0));
      continue;
    }
    SLAPO_TRY(slapo__cc_expr_of(G, n, -1, ebuf, sizeof ebuf));
    char nm[5][24];
    names_of(n, nm, "0");
    const char *names[5] = {nm[0], nm[1], NULL, NULL, nm[4]};
    if (G->rand_of[n->id] >= 0)
      slapo__cc_put(&G->b, "%sconst float u%d = ub%d[c - c0];\n", indent, n->id, n->id);
    if (skip) continue;
    if (G->rand_of[n->id] >= 0) {
      slapo__cc_put(&G->b, "%sconst float d%d = ", indent, n->id);
      substitute(&G->b, ebuf, names);
      slapo__cc_put(&G->b, "; /* %s, training */\n%sconst float v%d = !training ? v%d : d%d;\n",
          n->target, indent, n->id, n->inputs[0]->id, n->id);
      continue;
    }
    slapo__cc_put(&G->b, "%sconst float v%d = ", indent, n->id);
    substitute(&G->b, ebuf, names);
    slapo__cc_put(&G->b, "; /* %s */\n", n->target);
  }
  return SLAPO_OK;
}

/* Reverse mode: adjoints ga<id>, seeded by dy at the output (a random
 * node's gradient selected by `training` as in emit_values). */
slapo_status slapo__cc_emit_adjoints(gen *G, const char *indent) {
  char ebuf[1024];
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next)
    if ((n->kind == SLAPO_NODE_PLACEHOLDER || n->kind == SLAPO_NODE_CALL_OP) &&
        (!G->mask || G->mask[n->id]))
      slapo__cc_put(&G->b, "%sfloat ga%d = %s;\n", indent, n->id,
                    G->seed ? (G->seed[n->id] ? G->seed[n->id] : "0.0f")
                            : n == G->out ? "dy[i]" : "0.0f");
  for (const slapo_node *n = slapo_graph_last(G->g); n; n = n->prev) {
    if (n->kind != SLAPO_NODE_CALL_OP || n->op == SLAPO_OP_DESC(full)) continue;
    if ((G->mask && !G->mask[n->id]) || (G->as && G->as[n->id])) continue;
    for (int j = 0; j < n->n_inputs; j++) {
      const slapo_node *x = n->inputs[j];
      if (x->kind == SLAPO_NODE_CALL_OP && x->op == SLAPO_OP_DESC(full)) continue;
      SLAPO_TRY(slapo__cc_expr_of(G, n, j, ebuf, sizeof ebuf));
      char nm[5][24], g[24];
      snprintf(g, sizeof g, "ga%d", n->id);
      names_of(n, nm, g);
      const char *names[5] = {nm[0], nm[1], nm[2], nm[3], nm[4]};
      if (G->rand_of[n->id] >= 0) {
        slapo__cc_put(&G->b, "%sconst float dg%d_%d = ", indent, n->id, j);
        substitute(&G->b, ebuf, names);
        slapo__cc_put(&G->b, "; /* d %s / d input %d, training */\n%sga%d += !training ? %s : dg%d_%d;\n",
            n->target, j, indent, x->id, g, n->id, j);
        continue;
      }
      slapo__cc_put(&G->b, "%sga%d += ", indent, x->id);
      substitute(&G->b, ebuf, names);
      slapo__cc_put(&G->b, "; /* d %s / d input %d */\n", n->target, j);
    }
  }
  return SLAPO_OK;
}

static const char k_prelude[] =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "\n"
    "/* Vector variants from glibc's libmvec (the declarations <math.h> makes\n"
    " * only under -ffast-math), so the loops below vectorize their calls. */\n"
    "#define SLAPO_CC_SIMD __attribute__((__simd__(\"notinbranch\")))\n"
    "SLAPO_CC_SIMD double exp(double);\n"
    "SLAPO_CC_SIMD double log(double);\n"
    "SLAPO_CC_SIMD double tanh(double);\n"
    "SLAPO_CC_SIMD double erf(double);\n"
    "SLAPO_CC_SIMD double pow(double, double);\n"
    "SLAPO_CC_SIMD float expf(float);\n"
    "SLAPO_CC_SIMD float logf(float);\n"
    "SLAPO_CC_SIMD float tanhf(float);\n"
    "SLAPO_CC_SIMD float erff(float);\n"
    "\n"
    "/* Philox4x32-10 (Salmon et al., SC'11), as slapo's core/philox.c: element\n"
    " * e of a stream is word (e mod 4) of the block with counter (e / 4, step)\n"
    " * under the stream's key, its top 24 bits scaled to [0, 1). u[k] is element\n"
    " * base + k for k < n <= 64; each block is computed once for its four\n"
    " * elements, the blocks side by side so the rounds vectorize. The words are\n"
    " * stored interleaved, w[4 j + q] = word q of block b0 + j, so element e is\n"
    " * w[e - 4 b0] and u[k] = w[k + base mod 4] for any base: one contiguous\n"
    " * load per element, no select by e mod 4. The lanes are 64 bits wide, the\n"
    " * products' width: under AVX-512 GCC makes them twice as fast as 32-bit\n"
    " * lanes widened for each product. */\n"
    "static inline void slapo_cc_uniforms(uint64_t key, uint64_t step, uint64_t base, int n,\n"
    "                                     float *u) {\n"
    "  const uint64_t b0 = base >> 2;\n"
    "  const int nb = (int)(((base + (uint64_t)n + 3) >> 2) - b0);\n"
    "  uint32_t w[4 * 17];\n"
    "#pragma omp simd\n"
    "  for (int j = 0; j < nb; j++) {\n"
    "    const uint64_t blk = b0 + (uint64_t)j, M = 0xffffffffu;\n"
    "    uint64_t c0 = blk & M, c1 = blk >> 32, c2 = step & M, c3 = step >> 32, k0 = key & M,\n"
    "             k1 = key >> 32;\n"
    "    for (int r = 0; r < 10; r++) {\n"
    "      const uint64_t p0 = (uint64_t)0xD2511F53u * (uint32_t)c0,\n"
    "                     p1 = (uint64_t)0xCD9E8D57u * (uint32_t)c2;\n"
    "      const uint64_t n0 = (p1 >> 32) ^ c1 ^ k0, n2 = (p0 >> 32) ^ c3 ^ k1;\n"
    "      c1 = p1 & M, c3 = p0 & M, c0 = n0, c2 = n2;\n"
    "      k0 = (k0 + 0x9E3779B9u) & M, k1 = (k1 + 0xBB67AE85u) & M;\n"
    "    }\n"
    "    w[4 * j] = (uint32_t)c0, w[4 * j + 1] = (uint32_t)c1, w[4 * j + 2] = (uint32_t)c2,\n"
    "    w[4 * j + 3] = (uint32_t)c3;\n"
    "  }\n"
    "  const uint32_t *wb = w + (base & 3);\n"
    "#pragma omp simd\n"
    "  for (int k = 0; k < n; k++) u[k] = (float)(wb[k] >> 8) * (1.0f / 16777216.0f);\n"
    "}\n\n"
    "/* Each block first prefetches its streams PD floats ahead (the rows a\n"
    " * thread walks next): the loops are long for their bytes (GELU's exp and\n"
    " * division), and measured in the model the hardware prefetcher alone left\n"
    " * them waiting on DRAM (bias + GELU backward 10.4 -> 6.0 ms a step). */\n"
    "#if defined(__GNUC__)\n"
    "#define SLAPO_CC_PREFETCH(p, rw) __builtin_prefetch((p), (rw))\n"
    "#else\n"
    "#define SLAPO_CC_PREFETCH(p, rw) ((void)(p))\n"
    "#endif\n"
    "#define PD 2048\n"
    "#define CB 64 /* columns per block */\n"
    "#define RBLK " SLAPO__CC_STR(SLAPO__CC_ROW_BLOCKS) " /* row blocks of the backward's reductions */\n"
    "#define SLAPO_CC_CHUNK " SLAPO__CC_STR(SLAPO__CC_CHUNK) " /* row length without a row input */\n\n";

static void emit_header(gen *G, const char *name) {
  static const char *kinds[] = {"every element", "a row of C", "one value"};
  /* The fused module's name is not written: equal regions share one object
   * whatever schedules call them. */
  (void)name;
  slapo__cc_put(&G->b, "/* slapo cc kernels: an elementwise region of %d node(s).\n",
      slapo_graph_count(G->g));
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next)
    if (n->kind == SLAPO_NODE_PLACEHOLDER)
      slapo__cc_put(&G->b, " *   input %d (%s): %s%s%s\n", G->ph_of[n->id], n->target,
          kinds[G->plan->kind[G->ph_of[n->id]]],
          G->plan->bwd_reads[G->ph_of[n->id]] ? "" : " (its values are not read by the backward)",
          G->plan->grad_is_dy[G->ph_of[n->id]] ? " (its gradient is dy itself: not written)" : "");
    else if (n->kind == SLAPO_NODE_CALL_OP)
      slapo__cc_put(&G->b, " *   v%d = %s(...)\n", n->id, n->target);
  slapo__cc_put(&G->b, " * The output is viewed as [N / C, C]. Saved for the backward: nothing;\n"
             " * the backward recomputes every value from the inputs, then writes each\n"
             " * input's gradient into `pk` at off[i] (rows summed for a row input, all\n"
             " * elements for a one-value input, in a fixed order). */\n");
}

/* Before a block's column loop: each random node's uniforms for the
 * block's elements r * C + c0 .. r * C + c1 - 1. */
void slapo__cc_emit_uniforms(gen *G, const char *indent) {
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next)
    if (n->kind == SLAPO_NODE_CALL_OP && G->rand_of[n->id] >= 0 && (!G->mask || G->mask[n->id]))
      slapo__cc_put(&G->b, "%sfloat ub%d[CB];\n%sif (training) slapo_cc_uniforms(keys[%d], step, "
                 "(uint64_t)(r * C + c0), (int)(c1 - c0), ub%d);\n",
          indent, n->id, indent, G->rand_of[n->id], n->id);
}

/* Before a block's column loop (elements i0 = r * C + c0 .. + CB - 1):
 * prefetches PD floats ahead of each full stream the loop reads or writes
 * (the forward: full inputs and y; the backward: the full inputs it reads,
 * dy and the full gradients it writes), one per 64-byte line, none past N. */
static void emit_prefetch(gen *G, const char *indent, bool bwd) {
  slapo__cc_put(&G->b,
      "%sif (r * C + c0 + PD + CB <= N)\n"
      "%s  for (int64_t q = r * C + c0 + PD; q < r * C + c0 + PD + CB; q += 16) {\n",
      indent, indent);
  for (int k = 0; k < G->plan->n_in; k++)
    if (G->plan->kind[k] == SLAPO__CC_FULL && (!bwd || G->plan->bwd_reads[k]))
      slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(in[%d] + q, 0);\n", indent, k);
  if (bwd) {
    slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(dy + q, 0);\n", indent);
    for (int k = 0; k < G->plan->n_in; k++)
      if (G->plan->kind[k] == SLAPO__CC_FULL && !G->plan->grad_is_dy[k])
        slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(pk + off[%d] + q, 1);\n", indent, k);
  } else {
    slapo__cc_put(&G->b, "%s    SLAPO_CC_PREFETCH(y + q, 1);\n", indent);
  }
  slapo__cc_put(&G->b, "%s  }\n", indent);
}

static void emit_fwd(gen *G, slapo_status *s) {
  slapo__cc_put(&G->b, "void slapo_cc_fwd(int64_t N, int64_t C, const float *const *in, float *y,\n"
             "                 const uint64_t *keys, uint64_t step, int training) {\n"
             "  (void)keys, (void)step, (void)training;\n"
             "  const int64_t R = N / C, nb = (C + CB - 1) / CB;\n"
             "#pragma omp parallel for schedule(static)\n"
             "  for (int64_t blk = 0; blk < R * nb; blk++) {\n"
             "    const int64_t r = blk / nb, c0 = blk %% nb * CB, c1 = c0 + CB < C ? c0 + CB : C;\n");
  emit_prefetch(G, "    ", false);
  slapo__cc_emit_uniforms(G, "    ");
  slapo__cc_put(&G->b, "#pragma omp simd\n"
             "    for (int64_t c = c0; c < c1; c++) {\n"
             "      const int64_t i = r * C + c;\n"
             "      (void)i;\n");
  if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "      ", false);
  slapo__cc_put(&G->b, "      y[i] = v%d;\n    }\n  }\n}\n\n", G->out->id);
}

void slapo__cc_emit_partials(gen *G, const char *indent) {
  int slot = 0, n_scalar = slapo__cc_count(G->plan, SLAPO__CC_SCALAR);
  for (int k = 0; k < G->plan->n_in; k++) {
    if (G->plan->kind[k] == SLAPO__CC_ROW)
      slapo__cc_put(&G->b, "%sfloat *acc%d = (float *)(work + %d * RBLK) + (int64_t)%d * RBLK * C "
                    "+ t * C;\n%sfor (int64_t c = 0; c < C; c++) acc%d[c] = 0;\n",
                    indent, k, n_scalar, slot++, indent, k);
    if (G->plan->kind[k] == SLAPO__CC_SCALAR) slapo__cc_put(&G->b, "%sdouble s%d = 0;\n", indent, k);
  }
}

void slapo__cc_emit_grads(gen *G, const char *indent) {
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next) {
    if (n->kind != SLAPO_NODE_PLACEHOLDER || (G->mask && !G->mask[n->id])) continue;
    int k = G->ph_of[n->id];
    if (G->plan->kind[k] == SLAPO__CC_FULL && !G->plan->grad_is_dy[k])
      slapo__cc_put(&G->b, "%spk[off[%d] + i] = ga%d;\n", indent, k, n->id);
    if (G->plan->kind[k] == SLAPO__CC_ROW)
      slapo__cc_put(&G->b, "%sacc%d[c] += ga%d;\n", indent, k, n->id);
    if (G->plan->kind[k] == SLAPO__CC_SCALAR)
      slapo__cc_put(&G->b, "%ss%d += ga%d;\n", indent, k, n->id);
  }
}

void slapo__cc_emit_sums(gen *G) {
  int n_row = slapo__cc_count(G->plan, SLAPO__CC_ROW), n_scalar = slapo__cc_count(G->plan, SLAPO__CC_SCALAR);
  int sslot = 0, slot = 0;
  for (int k = 0; k < G->plan->n_in; k++)
    if (G->plan->kind[k] == SLAPO__CC_SCALAR)
      slapo__cc_put(&G->b, "    work[%d * RBLK + t] = s%d;\n", sslot++, k);
  slapo__cc_put(&G->b, "  }\n");
  /* Each column's partials in block order, as one sum per column; blocks of
   * CB columns, so the adds vectorize across columns. */
  if (n_row) {
    slapo__cc_put(&G->b, "#pragma omp parallel for schedule(static)\n"
               "  for (int64_t c0 = 0; c0 < C; c0 += CB) {\n"
               "    const int64_t c1 = c0 + CB < C ? c0 + CB : C;\n");
    for (int k = 0; k < G->plan->n_in; k++)
      if (G->plan->kind[k] == SLAPO__CC_ROW)
        slapo__cc_put(&G->b, "    { double t[CB] = {0};\n"
                   "      for (int64_t b = 0; b < nrb; b++) {\n"
                   "        const float *w = (const float *)(work + %d * RBLK) + (int64_t)%d * RBLK * C + b * C;\n"
                   "#pragma omp simd\n"
                   "        for (int64_t c = c0; c < c1; c++) t[c - c0] += w[c];\n"
                   "      }\n"
                   "      for (int64_t c = c0; c < c1; c++) pk[off[%d] + c] = (float)t[c - c0]; }\n",
            n_scalar, slot++, k);
    slapo__cc_put(&G->b, "  }\n");
  }
  sslot = 0;
  for (int k = 0; k < G->plan->n_in; k++)
    if (G->plan->kind[k] == SLAPO__CC_SCALAR)
      slapo__cc_put(&G->b, "  { double t = 0;\n"
                 "    for (int64_t b = 0; b < nrb; b++) t += work[%d * RBLK + b];\n"
                 "    pk[off[%d]] = (float)t; }\n", sslot++, k);
}

/* The backward: parallel over nrb fixed row blocks (at most RBLK, set by R
 * alone). Block t sums its rows' gradients of a SCALAR input into the
 * double work[sslot(k) * RBLK + t] and of a ROW input into the floats
 * (float *)(work + n_scalar * RBLK) + slot(k) * RBLK * C + t * C + c (float
 * adds keep the per-element loop at the full vector width, where double
 * ones cost GELU's backward ~14%; each partial covers R / RBLK rows), in
 * row order; after the loop the partials are added in block order, in
 * double. Without a
 * ROW input the elements are rows of SLAPO_CC_CHUNK (the last one
 * shorter), whatever C the host passed. */
static void emit_bwd(gen *G, slapo_status *s) {
  int n_row = slapo__cc_count(G->plan, SLAPO__CC_ROW), n_scalar = slapo__cc_count(G->plan, SLAPO__CC_SCALAR);
  slapo__cc_put(&G->b, "void slapo_cc_bwd(int64_t N, int64_t C, const float *const *in, const float *dy,\n"
             "                 float *pk, const int64_t *off, double *work, const uint64_t *keys,\n"
             "                 uint64_t step, int training) {\n"
             "  (void)keys, (void)step, (void)training, (void)work;\n");
  if (!n_row) slapo__cc_put(&G->b, "  C = N < SLAPO_CC_CHUNK ? N : SLAPO_CC_CHUNK;\n");
  slapo__cc_put(&G->b, "  const int64_t R = (N + C - 1) / C;\n");
  if (n_row || n_scalar)
    slapo__cc_put(&G->b, "  const int64_t rpb = (R + RBLK - 1) / RBLK, nrb = (R + rpb - 1) / rpb;\n");
  else slapo__cc_put(&G->b, "  const int64_t rpb = 1, nrb = R;\n");
  slapo__cc_put(&G->b, "#pragma omp parallel for schedule(static)\n"
             "  for (int64_t t = 0; t < nrb; t++) {\n"
             "    const int64_t r0 = t * rpb, r1 = r0 + rpb < R ? r0 + rpb : R;\n");
  slapo__cc_emit_partials(G, "    ");
  slapo__cc_put(&G->b, "    for (int64_t r = r0; r < r1; r++) {\n"
             "      const int64_t cn = N - r * C < C ? N - r * C : C;\n"
             "      for (int64_t c0 = 0; c0 < cn; c0 += CB) {\n"
             "        const int64_t c1 = c0 + CB < cn ? c0 + CB : cn;\n");
  emit_prefetch(G, "        ", true);
  slapo__cc_emit_uniforms(G, "        ");
  /* Scalar sums stay sequential (a simd reduction would reorder them). */
  slapo__cc_put(&G->b, "%s        for (int64_t c = c0; c < c1; c++) {\n"
             "          const int64_t i = r * C + c;\n",
      n_scalar ? "" : "#pragma omp simd\n");
  if (*s == SLAPO_OK) *s = slapo__cc_emit_values(G, "          ", true);
  if (*s == SLAPO_OK) *s = slapo__cc_emit_adjoints(G, "          ");
  slapo__cc_emit_grads(G, "          ");
  slapo__cc_put(&G->b, "        }\n      }\n    }\n");
  slapo__cc_emit_sums(G);
  slapo__cc_put(&G->b, "}\n");
}

/* Inputs' kinds (from their example shapes), random slots, checks. */
static slapo_status analyse(gen *G) {
  const slapo_node *ins[SLAPO__CC_MAX_IN];
  int n_in = 0, n_out = 0;
  G->out = NULL;
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next) {
    G->ph_of[n->id] = G->rand_of[n->id] = -1;
    if (n->kind == SLAPO_NODE_PLACEHOLDER) {
      if (n_in == SLAPO__CC_MAX_IN)
        return slapo_error(SLAPO_UNSUPPORTED, "cc: at most %d inputs", SLAPO__CC_MAX_IN);
      if (n->dtype != SLAPO_DTYPE_F32)
        return slapo_error(SLAPO_UNSUPPORTED, "cc: input %s is %s; cc fuses f32 values",
                           n->target, slapo_dtype_name(n->dtype));
      G->ph_of[n->id] = n_in;
      ins[n_in++] = n;
    } else if (n->kind == SLAPO_NODE_OUTPUT) {
      G->out = n->inputs[0];
      n_out = n->n_inputs;
    } else if (n->kind == SLAPO_NODE_CALL_OP && n->op && n->op->random &&
               slapo_node_attr_float(n, "p", 1) != 0) { /* p = 0 draws nothing */
      if (G->plan->n_rand == SLAPO__CC_MAX_RAND)
        return slapo_error(SLAPO_UNSUPPORTED,
                           "cc: the region has more than %d random ops (SLAPO__CC_MAX_RAND); "
                           "fuse a smaller region",
                           SLAPO__CC_MAX_RAND);
      G->rand_of[n->id] = G->plan->n_rand;
      G->plan->stream[G->plan->n_rand++] = (uint64_t)slapo_node_attr_int(n, "stream", 0);
    } else if (n->kind != SLAPO_NODE_CALL_OP) {
      return slapo_error(SLAPO_UNSUPPORTED, "cc: a %s node (%%%s) in the region",
                         slapo_node_kind_name(n->kind), n->name);
    }
    if (n->kind != SLAPO_NODE_CALL_OP || n->op == SLAPO_OP_DESC(full) ||
        slapo__cc_renders(n->op))
      continue;
    if (!slapo__cc_row_op(n->op))
      return slapo_error(SLAPO_UNSUPPORTED, "cc: op '%s' (%%%s) is neither elementwise nor a "
                         "row op; the cc backend generates elementwise regions and regions "
                         "around one LayerNorm, RMSNorm or softmax over the last axis",
                         n->target, n->name);
    if (G->row)
      return slapo_error(SLAPO_UNSUPPORTED, "cc: the region holds two row ops (%%%s and %%%s); "
                         "cc generates regions around one: fuse each chain on its own",
                         G->row->name, n->name);
    G->row = n;
  }
  if (!G->out || G->out->kind != SLAPO_NODE_CALL_OP)
    return slapo_error(SLAPO_UNSUPPORTED, "cc: the region's result is not an op");
  /* An elementwise region of several results compiles one op per result
   * (each recomputes its cone: cheaper than a kernel with several outputs);
   * one around a norm packs its results (cc_rows.c). */
  if (n_out != 1 && !G->row)
    return slapo_error(SLAPO_UNSUPPORTED, "cc: an elementwise region with %d results compiles "
                       "one op per result", n_out);
  if (G->row) G->out = G->row->inputs[0];
  const slapo_node *full = G->row ? G->row : G->out;
  G->plan->n_in = n_in;
  int64_t C;
  SLAPO_TRY(slapo__cc_kinds(n_in, ins, full->ndim, full->shape, G->plan->kind, &C));
  int64_t N = slapo__cc_numel(full->ndim, full->shape);
  for (const slapo_node *n = slapo_graph_first(G->g); n; n = n->next)
    if (G->rand_of[n->id] >= 0 && slapo__cc_numel(n->ndim, n->shape) != N)
      return slapo_error(SLAPO_UNSUPPORTED, "cc: random op %%%s is not of the region's output "
                         "shape (its mask is indexed by its own elements)", n->name);
  return SLAPO_OK;
}

slapo_status slapo__cc_generate(const slapo_graph *region, const char *name, bool fast,
                                slapo__cc_plan *plan, char **src) {
  *src = NULL;
  memset(plan, 0, sizeof *plan);
  slapo_graph_renumber((slapo_graph *)region);
  gen G = {.g = region, .plan = plan, .n = slapo_graph_count(region), .fast = fast};
  G.rand_of = slapo_calloc((size_t)G.n + 1, sizeof *G.rand_of);
  G.ph_of = slapo_calloc((size_t)G.n + 1, sizeof *G.ph_of);
  G.need = slapo_calloc((size_t)G.n + 1, sizeof *G.need);
  slapo_status s = G.rand_of && G.ph_of && G.need ? analyse(&G)
                                                  : slapo_error(SLAPO_NOMEM, "cc: oom");
  if (s == SLAPO_OK) s = compute_needs(&G);
  if (s == SLAPO_OK) s = compute_identities(&G);
  sbuf body = {0};
  if (s == SLAPO_OK) {
    /* The kernels first, so the prelude carries the fast kernels' helpers
     * only when an expression calls one. */
    if (G.row) {
      s = slapo__cc_rows_emit(&G);
    } else {
      emit_fwd(&G, &s);
      emit_bwd(&G, &s);
    }
    body = G.b;
    G.b = (sbuf){0};
    emit_header(&G, name);
    slapo__cc_put(&G.b, "%s", k_prelude);
    if (body.s && strstr(body.s, "slapo__"))
      slapo__cc_put(&G.b, "/* The fast kernels' float helpers (slapo's ops/vmath.h), verbatim. */\n%s\n\n",
          slapo__cc_math_src());
    if (G.row)
      slapo__cc_put(&G.b, "/* LayerNorm's fast row routines (slapo's ops/rowmath.h), verbatim. */\n"
                    "%s\n\n", slapo__cc_rows_src());
    slapo__cc_put(&G.b, "%s", body.s ? body.s : "");
    if (s == SLAPO_OK && (G.b.oom || body.oom)) s = slapo_error(SLAPO_NOMEM, "cc: out of memory");
  }
  slapo_free(body.s);
  slapo_free(G.rand_of);
  slapo_free(G.ph_of);
  slapo_free(G.need);
  if (s != SLAPO_OK) {
    slapo_free(G.b.s);
    return s;
  }
  *src = G.b.s;
  return SLAPO_OK;
}
