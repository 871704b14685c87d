#include "process_group_drun.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstring>

#include "drun_work.hpp"
#include "tensor_args.hpp"
#include "torch_store_adapter.hpp"

namespace drun::torch_backend {

using c10d::OpType;

namespace {

// Runs one libdrun_comm call; its errors reach Python as RuntimeError naming the call.
template <class F>
void guarded(const char* call, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("drun backend: ") + call + ": " + e.what());
  }
}

size_t blockCount(const at::Tensor& whole, int parts, const char* call, const char* what) {
  TORCH_CHECK(whole.numel() % parts == 0, "drun backend: ", call, ": the ", what, " tensor's ",
              whole.numel(), " elements do not split into ", parts, " equal blocks");
  return static_cast<size_t>(whole.numel() / parts);
}

// The host of the TCPStore under the PrefixStores torch wraps it in (empty for another store):
// the route to it picks the interface Gloo listens on, as MASTER_ADDR does for drun's env://.
std::string tcpStoreHost(c10::intrusive_ptr<c10d::Store> store) {
  while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) store = prefix->getUnderlyingStore();
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  return tcp ? tcp->getHost() : std::string();
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupDrun::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  comm::InitOptions options;
  options.backend = comm::Backend::Gloo;  // shared memory / Gloo / both, by DRUN_COMM_TRANSPORT
  options.rank = rank;
  options.worldSize = size;
  options.timeout = timeout.count() > 0 ? timeout : std::chrono::milliseconds(0);
  options.masterAddr = tcpStoreHost(store);
  std::shared_ptr<comm::Communicator> comm;
  try {
    comm = comm::init(std::make_shared<TorchStoreAdapter>(store), options);
  } catch (const std::exception& e) {
    throw std::runtime_error("drun backend: init of rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + ": " + e.what());
  }
  return c10::make_intrusive<ProcessGroupDrun>(std::move(comm), rank, size);
}

ProcessGroupDrun::ProcessGroupDrun(std::shared_ptr<comm::Communicator> comm, int rank, int size)
    : ProcessGroup(rank, size), comm_(std::move(comm)) {}

ProcessGroupDrun::~ProcessGroupDrun() {
  try {
    comm_->destroy();  // bounded by the timeout; never throws out of a destructor
  } catch (...) {
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::done(OpType type, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<DrunWork>(rank_, type, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  auto s = stage(single(tensors, "broadcast"), "broadcast");
  guarded("broadcast", [&] {
    comm_->broadcast(s.data(), s.count(), dtypeOf(s.user, "broadcast"),
                     static_cast<int>(opts.rootRank), opTimeout(opts.timeout));
  });
  s.copyBack();
  return done(OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  auto s = stage(single(tensors, "all_reduce"), "all_reduce");
  auto op = reduceOpOf(opts.reduceOp, s.user, "all_reduce");
  guarded("all_reduce", [&] {
    comm_->allReduce(s.data(), s.count(), dtypeOf(s.user, "all_reduce"), op,
                     opTimeout(opts.timeout));
  });
  s.copyBack();
  return done(OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  return done(OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  auto s = stage(single(tensors, "reduce"), "reduce");
  const bool root = opts.rootRank == rank_;
  // Only the root's tensor receives the result: the others' stay as they were.
  if (!root) s.flat = s.flat.clone(at::MemoryFormat::Contiguous);
  auto op = reduceOpOf(opts.reduceOp, s.user, "reduce");
  guarded("reduce", [&] {
    comm_->reduce(s.data(), s.count(), dtypeOf(s.user, "reduce"), op,
                  static_cast<int>(opts.rootRank), opTimeout(opts.timeout));
  });
  if (root) s.copyBack();
  return done(OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto in = stage(single(inputs, "all_gather"), "all_gather");
  TORCH_CHECK(outputs.size() == 1, "drun backend: all_gather takes one output list per rank");
  checkList(outputs[0], in.user, size_, "all_gather", "the output list");
  at::Tensor flat = flatFor(in.user, size_);
  guarded("all_gather", [&] {
    comm_->allGather(in.data(), flat.data_ptr(), in.count(), dtypeOf(in.user, "all_gather"),
                     opTimeout(opts.timeout));
  });
  unpack(flat, outputs[0]);
  return done(OpType::ALLGATHER, outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  auto in = stage(input, "all_gather_into_tensor");
  auto out = stage(output, "all_gather_into_tensor");
  TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type() &&
                  out.count() == in.count() * static_cast<size_t>(size_),
              "drun backend: all_gather_into_tensor: the output must hold world size x the "
              "input's elements of its dtype");
  guarded("all_gather_into_tensor", [&] {
    comm_->allGather(in.data(), out.data(), in.count(), dtypeOf(in.user, "all_gather"),
                     opTimeout(opts.timeout));
  });
  out.copyBack();
  return done(OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  auto in = stage(single(inputs, "gather"), "gather");
  const bool root = opts.rootRank == rank_;
  at::Tensor flat;
  if (root) {
    TORCH_CHECK(outputs.size() == 1, "drun backend: gather: the root takes one output list");
    checkList(outputs[0], in.user, size_, "gather", "the root's output list");
    flat = flatFor(in.user, size_);
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                "drun backend: gather: only the root passes an output list");
  }
  guarded("gather", [&] {
    comm_->gather(in.data(), root ? flat.data_ptr() : nullptr, in.count(),
                  dtypeOf(in.user, "gather"), static_cast<int>(opts.rootRank),
                  opTimeout(opts.timeout));
  });
  if (root) unpack(flat, outputs[0]);
  return done(OpType::GATHER, root ? outputs[0] : std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  auto out = stage(single(outputs, "scatter"), "scatter");
  const bool root = opts.rootRank == rank_;
  at::Tensor flat;
  if (root) {
    TORCH_CHECK(inputs.size() == 1, "drun backend: scatter: the root takes one input list");
    checkList(inputs[0], out.user, size_, "scatter", "the root's input list");
    flat = flatFor(out.user, size_);
    pack(inputs[0], flat);
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(),
                "drun backend: scatter: only the root passes an input list");
  }
  guarded("scatter", [&] {
    comm_->scatter(root ? flat.data_ptr() : nullptr, out.data(), out.count(),
                   dtypeOf(out.user, "scatter"), static_cast<int>(opts.rootRank),
                   opTimeout(opts.timeout));
  });
  out.copyBack();
  return done(OpType::SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  auto out = stage(single(outputs, "reduce_scatter"), "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "drun backend: reduce_scatter takes one input list per rank");
  checkList(inputs[0], out.user, size_, "reduce_scatter", "the input list");
  at::Tensor flat = flatFor(out.user, size_);
  pack(inputs[0], flat);
  auto op = reduceOpOf(opts.reduceOp, out.user, "reduce_scatter");
  guarded("reduce_scatter", [&] {
    comm_->reduceScatter(flat.data_ptr(), out.data(), out.count(),
                         dtypeOf(out.user, "reduce_scatter"), op, opTimeout(opts.timeout));
  });
  out.copyBack();
  return done(OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto out = stage(output, "reduce_scatter_tensor");
  auto in = stage(input, "reduce_scatter_tensor");
  TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type() &&
                  in.count() == out.count() * static_cast<size_t>(size_),
              "drun backend: reduce_scatter_tensor: the input must hold world size x the "
              "output's elements of its dtype");
  auto op = reduceOpOf(opts.reduceOp, out.user, "reduce_scatter_tensor");
  guarded("reduce_scatter_tensor", [&] {
    comm_->reduceScatter(in.data(), out.data(), out.count(), dtypeOf(out.user, "reduce_scatter"),
                         op, opTimeout(opts.timeout));
  });
  out.copyBack();
  return done(OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  auto out = stage(output, "all_to_all_single");
  auto in = stage(input, "all_to_all_single");
  TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type(),
              "drun backend: all_to_all_single: input and output differ in dtype");
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(out.count() == in.count(),
                "drun backend: all_to_all_single: input and output differ in size");
    size_t block = blockCount(in.user, size_, "all_to_all_single", "input");
    guarded("all_to_all_single", [&] {
      comm_->allToAll(in.data(), out.data(), block, dtypeOf(in.user, "all_to_all"),
                      opTimeout(opts.timeout));
    });
  } else {
    unevenAllToAll(out, in, outputSplits, inputSplits, opts);
  }
  out.copyBack();
  return done(OpType::ALLTOALL_BASE, {output});
}

// Uneven splits (rows of dim 0 per peer): one isend and one irecv per peer on a tag of its own,
// then wait for all of them.
void ProcessGroupDrun::unevenAllToAll(const Staged& out, const Staged& in,
                                      const std::vector<int64_t>& outputSplits,
                                      const std::vector<int64_t>& inputSplits,
                                      const c10d::AllToAllOptions& opts) {
  auto offsets = [&](std::vector<int64_t> splits, const at::Tensor& t, const char* what) {
    if (splits.empty()) splits.assign(size_, t.size(0) / size_);
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, "drun backend: all_to_all_single: ",
                what, " splits has ", splits.size(), " sizes, expected ", size_);
    int64_t rows = 0;
    for (auto s : splits) rows += s;
    TORCH_CHECK(rows == t.size(0), "drun backend: all_to_all_single: ", what, " splits sum to ",
                rows, ", the tensor has ", t.size(0), " rows");
    return splits;
  };
  auto outRows = offsets(outputSplits, out.user, "output");
  auto inRows = offsets(inputSplits, in.user, "input");
  const int64_t rowElements = in.user.dim() > 0 && in.user.size(0) > 0 ? in.user.numel() / in.user.size(0) : 1;
  const size_t elementBytes = in.flat.element_size();
  const auto dtype = dtypeOf(in.user, "all_to_all_single");
  std::vector<comm::Request> requests;
  guarded("all_to_all_single", [&] {
    int64_t sendRow = 0, recvRow = 0;
    for (int peer = 0; peer < size_; ++peer) {
      auto* src = static_cast<char*>(in.data()) + sendRow * rowElements * elementBytes;
      auto* dst = static_cast<char*>(out.data()) + recvRow * rowElements * elementBytes;
      sendRow += inRows[peer];
      recvRow += outRows[peer];
      if (peer == rank_) {  // this rank's own block: a copy
        TORCH_CHECK(inRows[peer] == outRows[peer], "drun backend: all_to_all_single: this rank "
                    "sends itself ", inRows[peer], " rows but receives ", outRows[peer]);
        std::memcpy(dst, src, inRows[peer] * rowElements * elementBytes);
        continue;
      }
      requests.push_back(comm_->irecv(dst, outRows[peer] * rowElements, dtype, peer,
                                      kAllToAllTag, opTimeout(opts.timeout)));
      requests.push_back(comm_->isend(src, inRows[peer] * rowElements, dtype, peer,
                                      kAllToAllTag, opTimeout(opts.timeout)));
    }
    for (auto& r : requests) r.wait();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(!inputs.empty(), "drun backend: all_to_all: empty input list");
  checkList(inputs, inputs[0], size_, "all_to_all", "the input list");
  checkList(outputs, inputs[0], size_, "all_to_all", "the output list (equal blocks only)");
  at::Tensor send = flatFor(inputs[0], size_), recv = flatFor(inputs[0], size_);
  pack(inputs, send);
  guarded("all_to_all", [&] {
    comm_->allToAll(send.data_ptr(), recv.data_ptr(), static_cast<size_t>(inputs[0].numel()),
                    dtypeOf(inputs[0], "all_to_all"), opTimeout(opts.timeout));
  });
  unpack(recv, outputs);
  return done(OpType::ALLTOALL, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::send(std::vector<at::Tensor>& tensors, int dst,
                                                      int tag) {
  auto s = stage(single(tensors, "send"), "send");
  comm::Request request;
  guarded("send", [&] {
    request = comm_->isend(s.data(), s.count(), dtypeOf(s.user, "send"), dst, tag);
  });
  // The staged tensor lives in the Work until the send is done.
  return c10::make_intrusive<DrunWork>(rank_, OpType::SEND, std::move(request),
                                       std::vector<at::Tensor>{s.flat}, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::receive(std::vector<at::Tensor>& tensors,
                                                         int src, int tag, OpType type) {
  auto s = stage(single(tensors, "recv"), "recv");
  comm::Request request;
  guarded("recv", [&] {
    request = comm_->irecv(s.data(), s.count(), dtypeOf(s.user, "recv"), src, tag);
  });
  return c10::make_intrusive<DrunWork>(rank_, type, std::move(request),
                                       std::vector<at::Tensor>{s.user, s.flat},
                                       [s] { s.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::recv(std::vector<at::Tensor>& tensors, int src,
                                                      int tag) {
  return receive(tensors, src, tag, OpType::RECV);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int tag) {
  return receive(tensors, comm::kAnySource, tag, OpType::RECVANYSOURCE);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::barrier(const c10d::BarrierOptions& opts) {
  guarded("barrier", [&] { comm_->barrier(opTimeout(opts.timeout)); });
  return done(OpType::BARRIER, {});
}

}  // namespace drun::torch_backend
