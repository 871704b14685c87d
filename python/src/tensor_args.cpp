#include "tensor_args.hpp"

#include <c10/util/Exception.h>

#include "drun/comm/communicator.hpp"

namespace drun::torch_backend {

using comm::DType;
using comm::ReduceOp;

DType dtypeOf(const at::Tensor& t, const char* call) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kByte: return DType::UInt8;
    case at::kBool: return DType::UInt8;  // one byte, 0 or 1
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    default:
      TORCH_CHECK(false, "drun backend: ", call, ": dtype ", t.scalar_type(),
                  " is not supported (float32, float64, float16, bfloat16, int8, uint8, int32, "
                  "int64, bool)");
  }
}

ReduceOp reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t, const char* call) {
  const bool isBool = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return isBool ? ReduceOp::BOr : ReduceOp::Sum;
    case c10d::ReduceOp::PRODUCT: return isBool ? ReduceOp::BAnd : ReduceOp::Product;
    case c10d::ReduceOp::MIN: return isBool ? ReduceOp::BAnd : ReduceOp::Min;
    case c10d::ReduceOp::MAX: return isBool ? ReduceOp::BOr : ReduceOp::Max;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(t.scalar_type()), "drun backend: ", call,
                  ": AVG needs a floating tensor, got ", t.scalar_type());
      return ReduceOp::Avg;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(!at::isFloatingType(t.scalar_type()), "drun backend: ", call,
                  ": bitwise reduce ops need an integer or bool tensor, got ", t.scalar_type());
      return op.op_ == c10d::ReduceOp::BAND  ? ReduceOp::BAnd
             : op.op_ == c10d::ReduceOp::BOR ? ReduceOp::BOr
                                             : ReduceOp::BXor;
    default:
      TORCH_CHECK(false, "drun backend: ", call, ": reduce op ", static_cast<int>(op.op_),
                  " (PREMUL_SUM) is not supported");
  }
}

Staged stage(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.defined(), "drun backend: ", call, ": undefined tensor");
  TORCH_CHECK(!t.is_cuda(), "drun backend: ", call,
              ": CUDA tensors are not supported yet (CPU tensors only; use the nccl backend "
              "for GPU tensors)");
  TORCH_CHECK(t.device().is_cpu(), "drun backend: ", call, ": tensors on ", t.device(),
              " are not supported (CPU only)");
  TORCH_CHECK(t.layout() == at::kStrided, "drun backend: ", call, ": ", t.layout(),
              " tensors are not supported (dense tensors only)");
  dtypeOf(t, call);
  return Staged{t, t.is_contiguous() ? t : t.contiguous()};
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "drun backend: ", call, " takes one tensor per rank, got ",
              tensors.size());
  return tensors[0];
}

void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t n,
               const char* call, const char* what) {
  TORCH_CHECK(list.size() == n, "drun backend: ", call, ": ", what, " holds ", list.size(),
              " tensors, expected ", n);
  for (size_t i = 0; i < list.size(); ++i) {
    stage(list[i], call);
    TORCH_CHECK(list[i].scalar_type() == like.scalar_type(), "drun backend: ", call, ": ", what,
                "[", i, "] is ", list[i].scalar_type(), ", expected ", like.scalar_type());
    TORCH_CHECK(list[i].numel() == like.numel(), "drun backend: ", call, ": ", what, "[", i,
                "] has ", list[i].numel(), " elements, expected ", like.numel());
  }
}

at::Tensor flatFor(const at::Tensor& like, size_t n) {
  return at::empty({static_cast<int64_t>(n) * like.numel()}, like.options().memory_format(
                                                                  at::MemoryFormat::Contiguous));
}

void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& list) {
  int64_t offset = 0;
  for (const auto& t : list) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

void pack(const std::vector<at::Tensor>& list, const at::Tensor& flat) {
  int64_t offset = 0;
  for (const auto& t : list) {
    flat.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
    offset += t.numel();
  }
}

std::chrono::milliseconds opTimeout(std::chrono::milliseconds t) {
  return t.count() < 0 ? comm::kDefaultTimeout : t;
}

}  // namespace drun::torch_backend
