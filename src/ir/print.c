/* ir/print.c - the graph's text form and its Graphviz DOT export.
 * Layer: ir. The library never prints on its own: both write to the FILE*
 * the caller passes.
 *
 * Text form: one node a line in list order, no header, stable (golden tests
 * compare it byte for byte):
 *   %x : f32[2, 3] = placeholder[x]
 *   %transformer_wte_weight : f32[256, 64] = param[transformer.wte.weight]
 *   %matmul : f32[2, 4] = call_op matmul(%x, %w) {transpose_b=1, eps=1e-05, name="s", perm=[0, 2, 1]}  # transformer.h.0.mlp
 *   %mlp : f32[2, 4] = call_module h.0.mlp(%x)
 *   %split : (3) = call_op split(%x) {axis=0}
 *   %getitem : f32[2] = getitem(%split, 1)
 *   output(%a, %b)
 * The type is dtype and shape ("f32[]" for a scalar), or "(n)" for a node
 * with n_results = n > 0. Attributes come in the order given: INT as %lld,
 * FLOAT as %.9g, STR double-quoted with C escapes (\" \\ \n \t \xNN), INTS
 * as [a, b]; the braces are left out when there are none. "  [recompute
 * N]" follows for a node of checkpoint region N, then "  # <origin>" when
 * the node's origin path is not empty.
 *
 * DOT: `digraph G {`, one box per node `"name" [shape=box, label="..."];`
 * labelled name, target (getitem: "getitem[i]") and type, one line apart
 * (the output node: name and target only), then one edge `"in" -> "user";`
 * per use in list and input order, then `}`. */
#include <stdio.h>

#include "ir/internal.h"

/* Writes s with C-style escapes (for text strings and DOT labels alike). */
static void put_escaped(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
      else fputc(*p, f);
    }
  }
}

/* Writes the node's type: "f32[2, 3]" or "(3)". */
static void put_type(FILE *f, const slapo_node *n) {
  if (n->n_results > 0) {
    fprintf(f, "(%d)", n->n_results);
    return;
  }
  char buf[SLAPO_MAX_DIMS * 24 + 4];
  int ndim = n->ndim < 0 || n->ndim > SLAPO_MAX_DIMS ? 0 : n->ndim;
  fprintf(f, "%s%s", slapo_dtype_name(n->dtype), slapo_shape_str(ndim, n->shape, buf, sizeof buf));
}

static void put_args(FILE *f, const slapo_node *n) {
  fputc('(', f);
  for (int i = 0; i < n->n_inputs; i++) {
    const slapo_node *v = n->inputs[i];
    fprintf(f, "%s%%%s", i ? ", " : "", v && v->name ? v->name : "?");
  }
  fputc(')', f);
}

static void put_attrs(FILE *f, const slapo_node *n) {
  if (n->n_attrs <= 0) return;
  fputs(" {", f);
  for (int i = 0; i < n->n_attrs; i++) {
    const slapo_attr *a = &n->attrs[i];
    fprintf(f, "%s%s=", i ? ", " : "", a->key);
    switch (a->kind) {
    case SLAPO_ATTR_INT: fprintf(f, "%lld", (long long)a->i); break;
    case SLAPO_ATTR_FLOAT: fprintf(f, "%.9g", a->f); break;
    case SLAPO_ATTR_STR:
      fputc('"', f);
      put_escaped(f, a->s);
      fputc('"', f);
      break;
    case SLAPO_ATTR_INTS:
      fputc('[', f);
      for (int k = 0; k < a->n; k++) fprintf(f, "%s%lld", k ? ", " : "", (long long)a->ints[k]);
      fputc(']', f);
      break;
    default: fputs("?", f); break;
    }
  }
  fputc('}', f);
}

void slapo_graph_print(const slapo_graph *g, FILE *f) {
  if (!g || !f) return;
  for (const slapo_node *n = g->first; n; n = n->next) {
    if (n->kind != SLAPO_NODE_OUTPUT) {
      fprintf(f, "%%%s : ", n->name);
      put_type(f, n);
      fputs(" = ", f);
    }
    switch (n->kind) {
    case SLAPO_NODE_PLACEHOLDER:
    case SLAPO_NODE_PARAM:
      fprintf(f, "%s[%s]", slapo_node_kind_name(n->kind), n->target);
      break;
    case SLAPO_NODE_TUPLE:
      fputs("tuple", f);
      put_args(f, n);
      break;
    case SLAPO_NODE_CALL_OP:
    case SLAPO_NODE_CALL_MODULE:
      fprintf(f, "%s %s", slapo_node_kind_name(n->kind), n->target);
      put_args(f, n);
      put_attrs(f, n);
      break;
    case SLAPO_NODE_GETITEM: {
      const slapo_node *src = n->n_inputs > 0 ? n->inputs[0] : NULL;
      fprintf(f, "getitem(%%%s, %d)", src && src->name ? src->name : "?", n->item);
      break;
    }
    case SLAPO_NODE_OUTPUT:
      fputs("output", f);
      put_args(f, n);
      break;
    default: fprintf(f, "unknown[%s]", n->target ? n->target : "?"); break;
    }
    if (n->recompute > 0) fprintf(f, "  [recompute %d]", n->recompute);
    if (n->origin && *n->origin) fprintf(f, "  # %s", n->origin);
    fputc('\n', f);
  }
}

void slapo_graph_print_dot(const slapo_graph *g, FILE *f) {
  if (!g || !f) return;
  fputs("digraph G {\n", f);
  for (const slapo_node *n = g->first; n; n = n->next) {
    fprintf(f, "  \"%s\" [shape=box, label=\"", n->name);
    put_escaped(f, n->name);
    fputs("\\n", f);
    put_escaped(f, n->target ? n->target : "?");
    if (n->kind == SLAPO_NODE_GETITEM) fprintf(f, "[%d]", n->item);
    if (n->kind != SLAPO_NODE_OUTPUT) {
      fputs("\\n", f);
      put_type(f, n);
    }
    if (n->recompute > 0) fprintf(f, "\\nrecompute %d", n->recompute);
    fputs("\"];\n", f);
  }
  for (const slapo_node *n = g->first; n; n = n->next)
    for (int i = 0; i < n->n_inputs; i++)
      if (n->inputs[i] && n->inputs[i]->name)
        fprintf(f, "  \"%s\" -> \"%s\";\n", n->inputs[i]->name, n->name);
  fputs("}\n", f);
}
