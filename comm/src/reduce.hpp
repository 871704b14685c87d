// Element-wise reductions on host memory for every (DType, ReduceOp) pair: Gloo's reduce callback
// and the local steps of reduce_scatter. float16/bfloat16 compute in float and round once per
// step. AVG reduces as SUM; the caller divides once at the end (divideInPlace).
// Pure functions; thread-safe.
#pragma once

#include <cstddef>

#include "drun/comm/types.hpp"

namespace drun::comm::detail {

// out[i] = a[i] op b[i] for n elements; out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Throws InvalidArgument when op does not fit dtype (checkOpFits).
ReduceFn reduceFunction(DType dtype, ReduceOp op);
// buf[i] /= divisor for a floating dtype (AVG's last step).
void divideInPlace(void* buf, size_t n, DType dtype, int divisor);

}  // namespace drun::comm::detail
