/* models/registry.c - explicit registration of the zoo's replacement modules
 * (DESIGN.md §2: registries are filled by init calls, never by load-time
 * constructors, which a static library would drop). Layer: models. */
#include "slapo/models.h"

slapo_status slapo_models_init(void) {
  return slapo_module_register("FlashAttention",
                               "GPT-2 attention through the fused flash_attention op "
                               "(replaces GPT2Attention)",
                               slapo_flash_attention_new);
}
