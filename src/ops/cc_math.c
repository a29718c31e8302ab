/* ops/cc_math.c - the float helpers of the fast kernels (ops/vmath.h,
 * SLAPO__VMATH_SRC) as C text, for the `cc` backend to paste into the
 * kernels it generates: an op's float codegen form (slapo_op.cc_expr_fast)
 * calls them, so a fused region computes what the op's fast kernel
 * computes, operation for operation. Layer: ops. */
#include "ops/cc_expr.h"
#include "ops/vmath.h"

#define CC_STR_(...) #__VA_ARGS__
#define CC_STR(...) CC_STR_(__VA_ARGS__)

const char *slapo__cc_math_src(void) { return CC_STR(SLAPO__VMATH_SRC); }
