// How torch's arguments become libdrun_comm's: a tensor's scalar type -> DType, c10d's ReduceOp
// -> drun's (per dtype: bool's SUM is OR, as gloo computes it), and the checks every call makes
// (CPU, dense, one tensor, matching sizes), each failing with a c10::Error (Python RuntimeError)
// that names the call. Pure functions: thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "drun/comm/types.hpp"

namespace drun::torch_backend {

// The tensor a collective works on: the caller's own when it is contiguous, else a contiguous
// copy that copyBack() writes into the caller's tensor after the operation.
struct Staged {
  at::Tensor user;
  at::Tensor flat;
  void copyBack() const {
    if (!flat.is_same(user)) user.copy_(flat);
  }
  void* data() const { return flat.data_ptr(); }
  size_t count() const { return static_cast<size_t>(flat.numel()); }
};

comm::DType dtypeOf(const at::Tensor& t, const char* call);
comm::ReduceOp reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t, const char* call);
// A CPU, dense (strided) tensor of a supported dtype; returns it staged.
Staged stage(const at::Tensor& t, const char* call);
// Exactly one tensor in `tensors` (torch passes lists; this backend has one device per rank).
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* call);
// Every tensor of `list` has `like`'s dtype and element count, and the list has `n` of them.
void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t n,
               const char* call, const char* what);
// A fresh contiguous tensor of n x like.numel() elements of like's dtype.
at::Tensor flatFor(const at::Tensor& like, size_t n);
// Copies block i of `flat` (each like list[i]) into list[i], or list[i] into block i.
void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& list);
void pack(const std::vector<at::Tensor>& list, const at::Tensor& flat);
// Runs one libdrun_comm call; its errors reach Python as RuntimeError naming the call.
template <class F>
void guarded(const char* call, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("drun backend: ") + call + ": " + e.what());
  }
}

// The timeout of one operation: torch's "unset" (-1 ms) is drun's kDefaultTimeout (-1 ms too).
std::chrono::milliseconds opTimeout(std::chrono::milliseconds t);

}  // namespace drun::torch_backend
