#include "drun/comm/types.hpp"

#include <cstring>
#include <string>

#include "drun/common/error.hpp"

namespace drun::comm {

namespace {
constexpr const char* kDTypeNames[] = {"int8",     "uint8",   "int32",   "int64",
                                       "float16",  "bfloat16", "float32", "float64"};
constexpr size_t kDTypeSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
constexpr const char* kOpNames[] = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor"};

bool validDType(DType d) { return static_cast<int>(d) >= 0 && static_cast<int>(d) < kDTypeCount; }
bool validOp(ReduceOp o) { return static_cast<int>(o) >= 0 && static_cast<int>(o) < kReduceOpCount; }

DType checkedDType(DType d) {
  if (!validDType(d))
    throw InvalidArgument("invalid dtype " + std::to_string(static_cast<int>(d)) +
                          " (valid: 0..7, int8 .. float64)");
  return d;
}
}  // namespace

size_t dtypeSize(DType dtype) { return kDTypeSizes[static_cast<int>(checkedDType(dtype))]; }
bool isFloating(DType dtype) { return checkedDType(dtype) >= DType::Float16; }
const char* toString(DType dtype) { return validDType(dtype) ? kDTypeNames[static_cast<int>(dtype)] : "invalid-dtype"; }
const char* toString(ReduceOp op) { return validOp(op) ? kOpNames[static_cast<int>(op)] : "invalid-op"; }
const char* toString(Backend backend) { return backend == Backend::Nccl ? "nccl" : "gloo"; }

Backend parseBackend(const char* name) {
  if (name && std::strcmp(name, "gloo") == 0) return Backend::Gloo;
  if (name && std::strcmp(name, "nccl") == 0) return Backend::Nccl;
  throw InvalidArgument(std::string("unknown backend '") + (name ? name : "(null)") +
                        "' (expected \"gloo\" or \"nccl\")");
}

void checkOpFits(ReduceOp op, DType dtype) {
  checkedDType(dtype);
  if (!validOp(op))
    throw InvalidArgument("invalid reduce op " + std::to_string(static_cast<int>(op)) +
                          " (valid: 0..7, sum .. bxor)");
  bool bitwise = op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
  if (bitwise && isFloating(dtype))
    throw InvalidArgument(std::string("reduce op ") + toString(op) + " does not apply to " +
                          toString(dtype) + " (bitwise ops need an integer type)");
  if (op == ReduceOp::Avg && !isFloating(dtype))
    throw InvalidArgument(std::string("reduce op avg does not apply to ") + toString(dtype) +
                          " (use sum and divide, or a floating type)");
}

float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { ++e; mant <<= 1; } while (!(mant & 0x400));
    bits = sign | ((112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // nan
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal half (or zero): round the scaled value
    float f;
    uint32_t a = absx;
    std::memcpy(&f, &a, 4);
    f *= 16777216.0f;  // 2^24: units of the smallest subnormal
    uint32_t r = static_cast<uint32_t>(f);
    float frac = f - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return static_cast<uint16_t>(sign | h);
}

float bfloat16ToFloat(uint16_t bits) {
  uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t floatToBfloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace drun::comm
