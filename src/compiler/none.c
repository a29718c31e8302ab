/* compiler/none.c - the `none` backend: compiles nothing; the fused module
 * re-emits the region's ops one by one. Correct for every region, and the
 * reference every other backend is tested against. Layer: compiler. */
#include "compiler/internal.h"

static slapo_status none_compile(const slapo_graph *region, const char *name,
                                 const slapo_compile_opts *opts, const slapo_op **out) {
  (void)region, (void)name, (void)opts;
  *out = NULL;
  return SLAPO_OK;
}

const slapo_compiler slapo__compiler_none = {
    .name = "none",
    .summary = "no kernel: the fused module re-emits the region's ops (the reference)",
    .compile = none_compile,
};
