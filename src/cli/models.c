/* cli/models.c - `slapo models`: every registered family with its configs,
 * their sizes and parameter counts (each built on meta tensors: nothing is
 * allocated, so the 1.5B config costs nothing). Layer: cli. */
#include <string.h>

#include "cli/common.h"

static slapo_status list_family(const slapo_model_family *f) {
  printf("%s (%s)%s%s%s%s%s%s\n", f->name, f->hf_class,
         f->default_schedule ? ", default schedule " : "",
         f->default_schedule ? f->default_schedule : "", f->tp_schedule ? ", tensor parallel " : "",
         f->tp_schedule ? f->tp_schedule : "", f->attention_type ? ", attention " : "",
         f->attention_type ? f->attention_type : "");
  for (const char *const *c = f->configs; *c; c++) {
    slapo_model_dims d;
    slapo_module *m;
    SLAPO_TRY(f->dims(*c, &d));
    SLAPO_TRY(f->create(*c, NULL, &m));
    double n = (double)slapo_module_numel(m);
    slapo_module_free(m);
    printf("  %-8s %9.2fM parameters  %s, vocabulary %lld (%s)%s\n", *c, n / 1e6, d.summary,
           (long long)d.vocab_size, d.tokenizer, f->default_config && !strcmp(*c, f->default_config)
                                                     ? " (default)" : "");
  }
  return SLAPO_OK;
}

int cmd_models(int argc, char **argv) {
  int rc = cli_no_options(argc, argv,
                          "usage: slapo models\n\nLists the model families and "
                          "their configs with parameter counts.\n");
  if (rc >= 0) return rc;
  for (int i = 0; i < slapo_model_count(); i++) {
    slapo_status s = list_family(slapo_model_at(i));
    if (s != SLAPO_OK) return cli_fail(s);
  }
  return 0;
}
