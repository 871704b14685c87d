// Element types and reduce operations of libdrun_comm, with the checks every backend shares.
//
// Plain values and pure functions: thread-safe. Enum values are stable (the C API in
// drun/comm.h uses the same numbers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace drun::comm {

enum class DType : int {
  Int8 = 0, UInt8 = 1, Int32 = 2, Int64 = 3, Float16 = 4, BFloat16 = 5, Float32 = 6, Float64 = 7,
};
inline constexpr int kDTypeCount = 8;

enum class ReduceOp : int {
  Sum = 0, Product = 1, Min = 2, Max = 3, Avg = 4, BAnd = 5, BOr = 6, BXor = 7,
};
inline constexpr int kReduceOpCount = 8;

enum class Backend : int { Gloo = 0, Nccl = 1 };

size_t dtypeSize(DType dtype);  // bytes per element
bool isFloating(DType dtype);
const char* toString(DType dtype);
const char* toString(ReduceOp op);
const char* toString(Backend backend);
// Parses "gloo" / "nccl"; throws InvalidArgument naming the text.
Backend parseBackend(const char* name);

// Throws InvalidArgument when `op` does not apply to `dtype` (the bitwise ops to floating types,
// AVG to integer types), or when either value is out of range (from the C API).
void checkOpFits(ReduceOp op, DType dtype);

// The DType of a C++ element type, for typed convenience: comm.allReduce(v.data(), v.size(),
// dtypeOf<float>(), ReduceOp::Sum).
template <class T> constexpr DType dtypeOf();
template <> constexpr DType dtypeOf<int8_t>() { return DType::Int8; }
template <> constexpr DType dtypeOf<uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtypeOf<int32_t>() { return DType::Int32; }
template <> constexpr DType dtypeOf<int64_t>() { return DType::Int64; }
template <> constexpr DType dtypeOf<float>() { return DType::Float32; }
template <> constexpr DType dtypeOf<double>() { return DType::Float64; }

// IEEE binary16 and bfloat16 carried as uint16_t bits; conversions round to nearest even.
float halfToFloat(uint16_t bits);
uint16_t floatToHalf(float value);
float bfloat16ToFloat(uint16_t bits);
uint16_t floatToBfloat16(float value);

}  // namespace drun::comm
