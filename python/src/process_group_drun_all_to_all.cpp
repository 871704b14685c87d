// ProcessGroupDrun's all_to_all forms: equal blocks as one libdrun_comm all_to_all, uneven splits
// as one isend and one irecv per peer; both queued as any collective.
#include <cstring>

#include "process_group_drun.hpp"

namespace drun::torch_backend {

using c10d::OpType;

namespace {

size_t blockCount(const at::Tensor& whole, int parts, const char* call, const char* what) {
  TORCH_CHECK(whole.numel() % parts == 0, "drun backend: ", call, ": the ", what, " tensor's ",
              whole.numel(), " elements do not split into ", parts, " equal blocks");
  return static_cast<size_t>(whole.numel() / parts);
}

// Rows of dim 0 per peer (empty: equal), checked against the tensor.
std::vector<int64_t> rowsPerPeer(std::vector<int64_t> splits, const at::Tensor& t, int size,
                                 const char* what) {
  if (splits.empty()) splits.assign(size, t.size(0) / size);
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "drun backend: all_to_all_single: ", what,
              " splits has ", splits.size(), " sizes, expected ", size);
  int64_t rows = 0;
  for (auto s : splits) rows += s;
  TORCH_CHECK(rows == t.size(0), "drun backend: all_to_all_single: ", what, " splits sum to ",
              rows, ", the tensor has ", t.size(0), " rows");
  return splits;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  auto out = stage(output, "all_to_all_single");
  auto in = stage(input, "all_to_all_single");
  TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type(),
              "drun backend: all_to_all_single: input and output differ in dtype");
  auto dtype = dtypeOf(in.user, "all_to_all_single");
  auto timeout = opTimeout(opts.timeout);
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(out.count() == in.count(),
                "drun backend: all_to_all_single: input and output differ in size");
    size_t block = blockCount(in.user, size_, "all_to_all_single", "input");
    return enqueue(OpType::ALLTOALL_BASE, "all_to_all_single", {output}, timeout,
                   [this, in, out, block, dtype, timeout] {
                     comm_->allToAll(in.data(), out.data(), block, dtype, timeout);
                     out.copyBack();
                   });
  }
  auto outRows = rowsPerPeer(outputSplits, out.user, size_, "output");
  auto inRows = rowsPerPeer(inputSplits, in.user, size_, "input");
  TORCH_CHECK(inRows[rank_] == outRows[rank_], "drun backend: all_to_all_single: this rank "
              "sends itself ", inRows[rank_], " rows but receives ", outRows[rank_]);
  return enqueue(OpType::ALLTOALL_BASE, "all_to_all_single", {output}, timeout,
                 [this, in, out, outRows, inRows, dtype, timeout] {
                   unevenAllToAll(out, in, outRows, inRows, dtype, timeout);
                   out.copyBack();
                 });
}

// One isend and one irecv per peer on a tag of its own, then wait for all of them.
void ProcessGroupDrun::unevenAllToAll(const Staged& out, const Staged& in,
                                      const std::vector<int64_t>& outRows,
                                      const std::vector<int64_t>& inRows, comm::DType dtype,
                                      std::chrono::milliseconds timeout) {
  const int64_t rowElements =
      in.user.dim() > 0 && in.user.size(0) > 0 ? in.user.numel() / in.user.size(0) : 1;
  const size_t elementBytes = in.flat.element_size();
  std::vector<comm::Request> requests;
  int64_t sendRow = 0, recvRow = 0;
  for (int peer = 0; peer < size_; ++peer) {
    auto* src = static_cast<char*>(in.data()) + sendRow * rowElements * elementBytes;
    auto* dst = static_cast<char*>(out.data()) + recvRow * rowElements * elementBytes;
    sendRow += inRows[peer];
    recvRow += outRows[peer];
    if (peer == rank_) {  // this rank's own block: a copy
      std::memcpy(dst, src, inRows[peer] * rowElements * elementBytes);
      continue;
    }
    requests.push_back(
        comm_->irecv(dst, outRows[peer] * rowElements, dtype, peer, kAllToAllTag, timeout));
    requests.push_back(
        comm_->isend(src, inRows[peer] * rowElements, dtype, peer, kAllToAllTag, timeout));
  }
  for (auto& r : requests) r.wait();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "drun backend: all_to_all: empty input list");
  checkList(inputs, inputs[0], size_, "all_to_all", "the input list");
  checkList(outputs, inputs[0], size_, "all_to_all", "the output list (equal blocks only)");
  at::Tensor send = flatFor(inputs[0], size_), recv = flatFor(inputs[0], size_);
  pack(inputs, send);
  auto dtype = dtypeOf(inputs[0], "all_to_all");
  auto block = static_cast<size_t>(inputs[0].numel());
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::ALLTOALL, "all_to_all", outputs, timeout,
                 [this, send, recv, outputs, block, dtype, timeout] {
                   comm_->allToAll(send.data_ptr(), recv.data_ptr(), block, dtype, timeout);
                   unpack(recv, outputs);
                 });
}

}  // namespace drun::torch_backend
