// ProcessGroupDrun: torch.distributed's process group "drun" (c10d::ProcessGroup, torch 1.13)
// over one libdrun_comm Communicator: shared memory between the ranks of a host, Gloo across
// hosts (DRUN_COMM_TRANSPORT picks, as for any drun communicator).
//
// Created by create() from what init_process_group / new_group hand a registered backend: the
// torch Store (bootstrap through TorchStoreAdapter), this rank, the group size and the timeout.
// Each new_group is a process group of its own (torch creates one per group over a PrefixStore).
//
// CPU dense tensors of float32/64, float16, bfloat16, int8, uint8, int32, int64 and bool, any
// strides (non-contiguous ones are staged); reduce ops SUM PRODUCT MIN MAX AVG BAND BOR BXOR.
// Collectives are queued on the group's CollectiveQueue (one thread, issue order) and return a
// CollectiveWork at once (a collective issued from one of its Future callbacks runs at once, and
// no wait outlasts the timeout behind a callback that holds the queue); send/recv start at once on the caller's thread (libdrun_comm runs point
// to point beside collectives, so they never wait behind queued ones: ProcessGroupGloo's choice
// too) and return a DrunWork over the pending request. Errors (TORCH_CHECK / RuntimeError) name the call; drun's failures keep drun's
// message (a dead peer is named). all_to_all_single with uneven splits goes point to point.
// Unsupported calls (PREMUL_SUM,
// CUDA tensors, monitored barrier) raise a RuntimeError that names them.
//
// Threading: any thread may call; collectives keep their call order (one queue), point to point
// runs concurrently with them. The Communicator's collectives are used from the queue's thread only.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "drun/comm/communicator.hpp"
#include "collective_queue.hpp"
#include "heartbeat.hpp"
#include "tensor_args.hpp"

namespace drun::torch_backend {

class ProcessGroupDrun final : public c10d::ProcessGroup {
 public:
  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout);
  // The default group under in-process recovery: libdrun_comm's own env:// init, which uses the
  // workers' store and this process's generation (docs/recovery.md). No heartbeat: the workers'
  // store names a dead rank (its will), and its keys must not follow torch's per-generation
  // store prefix.
  static c10::intrusive_ptr<c10d::ProcessGroup> createWorld(int rank, int size,
                                                            std::chrono::milliseconds timeout);
  // `heartbeat` may be null (a group of one, or DRUN_TORCH_HEARTBEAT_MS=0).
  ProcessGroupDrun(std::shared_ptr<comm::Communicator> comm, std::shared_ptr<Heartbeat> heartbeat,
                   int rank, int size);
  ~ProcessGroupDrun() override;

  const std::string getBackendName() const override { return "drun"; }
  // In-process recovery, the default group only (createWorld): moves its communicator to the
  // newest generation in place (Communicator::reform), after the collectives queued before it
  // (they fail at once: their generation ended). Returns the generation it now belongs to.
  // Throws what reform throws (TimeoutError: the ranks did not all come within `timeout`).
  uint64_t reform(std::chrono::milliseconds timeout);
  // The process is exiting: what is queued runs, the queue's threads end (CollectiveQueue::stop).
  void stopQueue() { queue_->stop(); }
  // After a reform() that renumbered the world (a shrink or a grow in place): torch's groups
  // keep their rank and size, so a new group takes this one's communicator with its new rank
  // and size; this one runs nothing more and leaves the communicator to it.
  c10::intrusive_ptr<c10d::ProcessGroup> handOver();
  // How this group's ranks talk: "shm", "tcp" or "hierarchical".
  std::string transport() const { return comm_->transport(); }
  // The generation of in-process recovery the group's communicator is at (0 without recovery).
  uint64_t generation() const { return comm_->generation(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  // Queues `collective` (it holds the tensors it uses) and returns its Work at once. `timeout`
  // is the operation's (kDefaultTimeout: the communicator's): it also bounds the time the
  // collective may wait behind another's Future callbacks (CollectiveQueue).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* call,
                                         std::vector<at::Tensor> outputs,
                                         std::chrono::milliseconds timeout,
                                         std::function<void()> collective);
  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag,
                                         c10d::OpType type);
  // The RuntimeError message of a failed operation: drun's, then the ranks not heard from.
  std::string failure(const char* call, const std::exception& e) const;
  std::function<std::string(const std::exception&)> describer(const char* call);
  static std::string describeFailure(Heartbeat* heartbeat, bool shm, const char* call,
                                     const std::exception& e);
  // On the queue's thread: rows of dim 0 per peer, already checked.
  void unevenAllToAll(const Staged& out, const Staged& in, const std::vector<int64_t>& outRows,
                      const std::vector<int64_t>& inRows, comm::DType dtype,
                      std::chrono::milliseconds timeout);

  // The tag of uneven all_to_all's messages: far above the tags torch programs use.
  static constexpr int kAllToAllTag = 0x7ffffff0;

  const pid_t owner_ = ::getpid();  // a forked child's copy of this group closes nothing
  bool handedOver_ = false;         // handOver(): the communicator is the successor's
  std::shared_ptr<comm::Communicator> comm_;
  std::shared_ptr<Heartbeat> heartbeat_;
  // Collectives run here; reset first at destruction. Works hold weak references (their shortcut).
  std::shared_ptr<CollectiveQueue> queue_;
};

}  // namespace drun::torch_backend
