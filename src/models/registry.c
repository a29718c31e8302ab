/* models/registry.c - explicit registration of the zoo (DESIGN.md §2:
 * registries are filled by init calls or static tables, never by load-time
 * constructors, which a static library would drop): the model families of
 * families.def, and the replacement modules schedules can name.
 * Layer: models. */
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/models.h"

#define SLAPO_FAMILY(id) extern const slapo_model_family slapo__family_##id;
#include "models/families.def"
#undef SLAPO_FAMILY

static const slapo_model_family *const k_families[] = {
#define SLAPO_FAMILY(id) &slapo__family_##id,
#include "models/families.def"
#undef SLAPO_FAMILY
};

int slapo_model_count(void) { return (int)SLAPO_ARRAY_LEN(k_families); }

const slapo_model_family *slapo_model_at(int i) {
  return i >= 0 && i < slapo_model_count() ? k_families[i] : NULL;
}

slapo_status slapo_model_find(const char *name, const slapo_model_family **out) {
  *out = NULL;
  char known[256] = "";
  for (int i = 0; i < slapo_model_count(); i++) {
    if (name && !strcmp(k_families[i]->name, name)) {
      *out = k_families[i];
      return SLAPO_OK;
    }
    slapo_list_append(known, sizeof known, k_families[i]->name);
  }
  return slapo_error(SLAPO_NOT_FOUND, "unknown model '%s' (known: %s)", name ? name : "(null)",
                     known);
}

slapo_status slapo_model_new(const slapo_model_family *family, const char *config, double dropout,
                             uint64_t seed, slapo_module **out) {
  *out = NULL;
  slapo_module *m;
  SLAPO_TRY(family->create(config, &(slapo_model_opts){.dropout = dropout}, &m));
  slapo_status s = slapo_module_materialize(m, seed);
  if (s != SLAPO_OK) {
    slapo_module_free(m);
    return s;
  }
  *out = m;
  return SLAPO_OK;
}

/* The attention types of the families that have a FlashAttention, as a
 * list into buf [cap]. */
static const char *attention_types(char *buf, size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < slapo_model_count(); i++)
    if (k_families[i]->flash_attention_new)
      slapo_list_append(buf, cap, k_families[i]->attention_type);
  return buf;
}

slapo_status slapo_flash_attention_new(const slapo_module *replaced, slapo_module **out) {
  *out = NULL;
  for (int i = 0; replaced && i < slapo_model_count(); i++) {
    const slapo_model_family *f = k_families[i];
    if (f->flash_attention_new && !strcmp(f->attention_type, replaced->type->name))
      return f->flash_attention_new(replaced, out);
  }
  char types[256];
  return slapo_error(SLAPO_INVALID_ARG,
                     "FlashAttention: can replace the attention of a model family (%s) only, got "
                     "%s; it reuses that module's projections and dropout settings",
                     attention_types(types, sizeof types), replaced ? replaced->type->name : "NULL");
}

slapo_status slapo_models_init(void) {
  SLAPO_TRY(slapo_subgraph_register("FusedLinear",
                                    "Linear calls on one input as one GEMM over the joined "
                                    "weights (horizontal replace)",
                                    slapo_fused_linear_new));
  /* Kept for the registry's lifetime (it holds the pointer). */
  static char summary[320];
  char types[256];
  snprintf(summary, sizeof summary,
           "attention through the fused flash_attention op (replaces a family's attention: %s)",
           attention_types(types, sizeof types));
  return slapo_module_register("FlashAttention", summary, slapo_flash_attention_new);
}
