#include "reduce.hpp"

#include <algorithm>
#include <cstdint>

namespace drun::comm::detail {
namespace {

// How an element type is loaded into its compute type and stored back.
template <class T> struct Native {
  using Compute = T;
  static Compute load(T v) { return v; }
  static T store(Compute v) { return v; }
};
struct Half {
  using Compute = float;
  static float load(uint16_t v) { return halfToFloat(v); }
  static uint16_t store(float v) { return floatToHalf(v); }
};
struct BFloat {
  using Compute = float;
  static float load(uint16_t v) { return bfloat16ToFloat(v); }
  static uint16_t store(float v) { return floatToBfloat16(v); }
};

struct Sum { template <class C> static C apply(C a, C b) { return a + b; } };
struct Prod { template <class C> static C apply(C a, C b) { return a * b; } };
struct Min { template <class C> static C apply(C a, C b) { return std::min(a, b); } };
struct Max { template <class C> static C apply(C a, C b) { return std::max(a, b); } };
struct BAnd { template <class C> static C apply(C a, C b) { return a & b; } };
struct BOr { template <class C> static C apply(C a, C b) { return a | b; } };
struct BXor { template <class C> static C apply(C a, C b) { return a ^ b; } };

template <class Storage, class Conv, class Op>
void reduceLoop(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<Storage*>(out);
  const auto* x = static_cast<const Storage*>(a);
  const auto* y = static_cast<const Storage*>(b);
  // Element i depends on a[i] and b[i] only, so out == a (in place) is fine: let it vectorize.
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i)
    o[i] = Conv::store(static_cast<typename Conv::Compute>(Op::apply(Conv::load(x[i]), Conv::load(y[i]))));
}

template <class Storage, class Conv>
ReduceFn arithmetic(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return reduceLoop<Storage, Conv, Sum>;
    case ReduceOp::Product: return reduceLoop<Storage, Conv, Prod>;
    case ReduceOp::Min: return reduceLoop<Storage, Conv, Min>;
    case ReduceOp::Max: return reduceLoop<Storage, Conv, Max>;
    default: return nullptr;
  }
}

template <class T>
ReduceFn integer(ReduceOp op) {
  switch (op) {
    case ReduceOp::BAnd: return reduceLoop<T, Native<T>, BAnd>;
    case ReduceOp::BOr: return reduceLoop<T, Native<T>, BOr>;
    case ReduceOp::BXor: return reduceLoop<T, Native<T>, BXor>;
    default: return arithmetic<T, Native<T>>(op);
  }
}

template <class Storage, class Conv>
void divideLoop(void* buf, size_t n, int divisor) {
  auto* p = static_cast<Storage*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = Conv::store(Conv::load(p[i]) / divisor);
}

}  // namespace

ReduceFn reduceFunction(DType dtype, ReduceOp op) {
  checkOpFits(op, dtype);
  switch (dtype) {
    case DType::Int8: return integer<int8_t>(op);
    case DType::UInt8: return integer<uint8_t>(op);
    case DType::Int32: return integer<int32_t>(op);
    case DType::Int64: return integer<int64_t>(op);
    case DType::Float16: return arithmetic<uint16_t, Half>(op);
    case DType::BFloat16: return arithmetic<uint16_t, BFloat>(op);
    case DType::Float32: return arithmetic<float, Native<float>>(op);
    case DType::Float64: return arithmetic<double, Native<double>>(op);
  }
  return nullptr;
}

void divideInPlace(void* buf, size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::Float16: return divideLoop<uint16_t, Half>(buf, n, divisor);
    case DType::BFloat16: return divideLoop<uint16_t, BFloat>(buf, n, divisor);
    case DType::Float32: return divideLoop<float, Native<float>>(buf, n, divisor);
    case DType::Float64: return divideLoop<double, Native<double>>(buf, n, divisor);
    default: checkOpFits(ReduceOp::Avg, dtype);  // throws: avg needs a floating type
  }
}

}  // namespace drun::comm::detail
