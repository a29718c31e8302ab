/* tests/unit/test_module.c - module trees: children, dotted paths and the
 * NOT_FOUND message, tied parameters visited once, deterministic
 * materialization, the repr, and GPT-2's Hugging Face names. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slapo/models.h"

static slapo_gpt2_config tiny(void) { return (slapo_gpt2_config){2, 4, 32, 16, 256, 0.0, 1e-5}; }

typedef struct names {
  int n;
  char paths[64][96];
} names;

static void collect(slapo_parameter *p, const char *path, void *ud) {
  (void)p;
  names *n = ud;
  if (n->n < 64) snprintf(n->paths[n->n++], 96, "%s", path);
}

static void test_gpt2_names_and_tying(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny();
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  names n = {0};
  assert_int_equal(slapo_module_visit_params(m, collect, &n), SLAPO_OK);
  /* wte, wpe, 12 per block, ln_f.{weight,bias}; lm_head.weight is tied. */
  assert_int_equal(n.n, 2 + 12 * 2 + 2);
  assert_string_equal(n.paths[0], "transformer.wte.weight");
  assert_string_equal(n.paths[1], "transformer.wpe.weight");
  assert_string_equal(n.paths[2], "transformer.h.0.ln_1.weight");
  assert_string_equal(n.paths[4], "transformer.h.0.attn.c_attn.weight");
  assert_string_equal(n.paths[n.n - 1], "transformer.ln_f.bias");
  slapo_module *lm_head, *wte;
  assert_int_equal(slapo_module_at(m, "lm_head", &lm_head), SLAPO_OK);
  assert_int_equal(slapo_module_at(m, "transformer.wte", &wte), SLAPO_OK);
  assert_ptr_equal(slapo_module_param(lm_head, "weight"), slapo_module_param(wte, "weight"));
  /* 2 layers x 12 C^2 + (V + n_ctx) C + 2 x (4 C) LayerNorm... counted exactly: */
  int64_t C = 32, V = 256, blocks = 2 * (12 * C * C + 13 * C);
  assert_int_equal(slapo_module_numel(m), blocks + V * C + 16 * C + 2 * C);
  slapo_module_free(m);
}

static void test_paths(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny();
  slapo_module *m, *x;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  assert_int_equal(slapo_module_at(m, "transformer.h.1.mlp.c_fc", &x), SLAPO_OK);
  assert_string_equal(x->type->name, "Linear");
  char *p = slapo_module_path(x);
  assert_string_equal(p, "transformer.h.1.mlp.c_fc");
  free(p); /* allocated through the default (libc) allocator hook */
  assert_int_equal(slapo_module_at(m, "", &x), SLAPO_OK);
  assert_ptr_equal(x, m);
  assert_int_equal(slapo_module_at(m, "transformer.h.7.mlp", &x), SLAPO_NOT_FOUND);
  assert_null(x);
  const char *msg = slapo_last_error();
  assert_non_null(strstr(msg, "'transformer.h'"));
  assert_non_null(strstr(msg, "no child '7'"));
  assert_non_null(strstr(msg, "0, 1"));
  assert_int_equal(slapo_module_at(m, "transformer.h.0.atn", &x), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "ln_1, attn, ln_2, mlp"));
  slapo_module_free(m);
}

static void test_materialize_deterministic(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny();
  slapo_module *a, *b;
  assert_int_equal(slapo_gpt2_new(&c, &a), SLAPO_OK);
  assert_int_equal(slapo_gpt2_new(&c, &b), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(a, 7), SLAPO_OK);
  assert_int_equal(slapo_module_materialize(b, 7), SLAPO_OK);
  slapo_module *la, *lb;
  assert_int_equal(slapo_module_at(a, "transformer.h.1.attn.c_proj", &la), SLAPO_OK);
  assert_int_equal(slapo_module_at(b, "transformer.h.1.attn.c_proj", &lb), SLAPO_OK);
  slapo_parameter *pa = slapo_module_param(la, "weight"), *pb = slapo_module_param(lb, "weight");
  assert_true(slapo_tensor_equal(pa->value, pb->value));
  /* Residual projections use std 0.02 / sqrt(2 n_layer) = 0.01. */
  const float *w = slapo_tensor_data(pa->value);
  double ss = 0;
  for (int64_t i = 0; i < slapo_tensor_numel(pa->value); i++) ss += (double)w[i] * w[i];
  double std = sqrt(ss / (double)slapo_tensor_numel(pa->value));
  assert_true(std > 0.009 && std < 0.011);
  /* Biases zero, LayerNorm weights one; 1-D parameters skip weight decay. */
  slapo_module *ln;
  assert_int_equal(slapo_module_at(a, "transformer.ln_f", &ln), SLAPO_OK);
  assert_true(((const float *)slapo_tensor_data(slapo_module_param(ln, "weight")->value))[3] == 1.0f);
  assert_true(slapo_module_param(ln, "bias")->no_weight_decay);
  assert_false(pa->no_weight_decay);
  slapo_module_free(a);
  slapo_module_free(b);
}

static void test_print(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny();
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_OK);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  slapo_module_print(m, f);
  fclose(f);
  assert_non_null(strstr(buf, "GPT2LMHeadModel()"));
  assert_non_null(strstr(buf, "(0-1): 2 x"));
  assert_non_null(strstr(buf, "(c_attn): Linear(in_features=32, out_features=96, bias=True)"));
  assert_non_null(strstr(buf, "(act): GELU(approximate='tanh')"));
  free(buf);
  slapo_module_free(m);
}

static void test_errors(void **state) {
  (void)state;
  slapo_gpt2_config c = tiny();
  c.n_head = 5;
  slapo_module *m;
  assert_int_equal(slapo_gpt2_new(&c, &m), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "n_embd 32 is not divisible by n_head 5"));
  assert_int_equal(slapo_gpt2_config_named("gpt5", &c), SLAPO_NOT_FOUND);
  assert_non_null(strstr(slapo_last_error(), "unknown config 'gpt5'"));
  slapo_module *lin;
  assert_int_equal(slapo_linear_new(4, 4, true, 0.02f, &lin), SLAPO_OK);
  slapo_module *child;
  assert_int_equal(slapo_relu_new(&child), SLAPO_OK);
  assert_int_equal(slapo_module_add_child(lin, "weight", child), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "'weight'"));
  slapo_module_free(lin);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt2_names_and_tying),  cmocka_unit_test(test_paths),
      cmocka_unit_test(test_materialize_deterministic), cmocka_unit_test(test_print),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
