#include "process_group_drun.hpp"

#include <Python.h>

#include <future>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "collective_work.hpp"
#include "flight_recorder.hpp"
#include "drun/common/error.hpp"
#include "drun_work.hpp"
#include "tensor_args.hpp"
#include "torch_store_adapter.hpp"

namespace drun::torch_backend {

using c10d::OpType;

namespace {

// The host of the TCPStore under the PrefixStores torch wraps it in (empty for another store):
// the route to it picks the interface Gloo listens on, as MASTER_ADDR does for drun's env://.
std::string tcpStoreHost(c10::intrusive_ptr<c10d::Store> store) {
  while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) store = prefix->getUnderlyingStore();
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
  return tcp ? tcp->getHost() : std::string();
}

comm::InitOptions initOptions(int rank, int size, std::chrono::milliseconds timeout) {
  comm::InitOptions options;
  options.backend = comm::Backend::Gloo;  // shared memory / Gloo / both, by DRUN_COMM_TRANSPORT
  options.rank = rank;
  options.worldSize = size;
  options.timeout = timeout.count() > 0 ? timeout : std::chrono::milliseconds(0);
  return options;
}

template <class Init>
std::shared_ptr<comm::Communicator> initOrExplain(int rank, int size, Init&& init) {
  try {
    return init();
  } catch (const std::exception& e) {
    throw std::runtime_error("drun backend: init of rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + ": " + e.what());
  }
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupDrun::createWorld(int rank, int size,
                                                                     std::chrono::milliseconds timeout) {
  auto comm = initOrExplain(rank, size, [&] { return comm::init(initOptions(rank, size, timeout)); });
  return c10::make_intrusive<ProcessGroupDrun>(std::move(comm), nullptr, rank, size);
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupDrun::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  comm::InitOptions options = initOptions(rank, size, timeout);
  options.masterAddr = tcpStoreHost(store);
  auto comm = initOrExplain(rank, size, [&] {
    return comm::init(std::make_shared<TorchStoreAdapter>(store), options);
  });
  std::shared_ptr<Heartbeat> heartbeat;
  auto beat = HeartbeatOptions::fromEnv();
  if (beat.enabled() && size > 1) heartbeat = std::make_shared<Heartbeat>(store, rank, size, beat);
  return c10::make_intrusive<ProcessGroupDrun>(std::move(comm), std::move(heartbeat), rank, size);
}

ProcessGroupDrun::ProcessGroupDrun(std::shared_ptr<comm::Communicator> comm,
                                   std::shared_ptr<Heartbeat> heartbeat, int rank, int size)
    : ProcessGroup(rank, size),
      comm_(std::move(comm)),
      heartbeat_(std::move(heartbeat)),
      queue_(std::make_shared<CollectiveQueue>()) {}

ProcessGroupDrun::~ProcessGroupDrun() {
  if (::getpid() != owner_) {
    // A forked child (a DataLoader worker) ending through Python's exit: its copies of the
    // queue, the heartbeat and the communicator have none of their threads, and their
    // condition variables count the rank's waiters, so destroying one waits for ever. Nothing
    // of them is the child's to close: they are left to the process's end.
    new std::shared_ptr<CollectiveQueue>(std::move(queue_));
    new std::shared_ptr<Heartbeat>(std::move(heartbeat_));
    new std::shared_ptr<comm::Communicator>(std::move(comm_));
    return;
  }
  // The queue's thread takes the GIL when it drops the last reference to a tensor Python knows
  // (torch frees its PyObject): joining it while this thread holds the GIL (destroy_process_group)
  // would deadlock.
  PyThreadState* python = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  queue_.reset();      // runs what is queued (each bounded by its timeout), joins the thread
  heartbeat_.reset();  // stops its thread
  try {
    if (!handedOver_) comm_->destroy();  // bounded by the timeout; never throws out of a destructor
  } catch (...) {
  }
  if (python != nullptr) PyEval_RestoreThread(python);
}

uint64_t ProcessGroupDrun::reform(std::chrono::milliseconds timeout) {
  // Through the queue: nothing of the old generation runs beside the reform. A queue that failed
  // its tasks (a callback held it) is usable again: the ranks agree on the order anew.
  queue_->repair();
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  CollectiveQueue::Task task;
  task.call = "reform";
  task.collective = [this, done, timeout] {
    try {
      comm_->reform(timeout);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  };
  task.fail = [done](const std::string& message) {
    done->set_exception(std::make_exception_ptr(std::runtime_error(message)));
  };
  const uint64_t id = queue_->push(std::move(task));
  if (!queue_->runIfNext(id)) future.wait();  // the tasks before it are each bounded
  future.get();
  return comm_->generation();
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupDrun::handOver() {
  if (comm_->rank() == getRank() && comm_->size() == getSize())
    throw std::invalid_argument("drun backend: hand_over: the group's rank and size did not change");
  queue_->stop();  // what this group queued ran; nothing more runs here
  auto successor = c10::make_intrusive<ProcessGroupDrun>(comm_, heartbeat_, comm_->rank(), comm_->size());
  handedOver_ = true;
  return successor;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::enqueue(OpType type, const char* call,
                                                         std::vector<at::Tensor> outputs,
                                                         std::chrono::milliseconds timeout,
                                                         std::function<void()> collective) {
  const uint64_t flight = FlightRecorder::instance().issued(this, comm_->worldRanks(), call, outputs);
  auto work = c10::make_intrusive<CollectiveWork>(rank_, type, call, std::move(outputs));
  CollectiveQueue::Task task;
  task.call = call;
  task.timeout = timeout.count() < 0 ? comm_->timeout() : timeout;
  task.collective = [this, work, call, flight, collective = std::move(collective)] {
    FlightRecorder::instance().started(flight);
    work->run([&] {
      try {
        collective();
      } catch (const c10::Error&) {
        throw;  // torch's checks name the call already
      } catch (const std::exception& e) {
        throw std::runtime_error(failure(call, e));
      }
    });
    FlightRecorder::instance().ended(flight, work->isSuccess());
  };
  task.complete = [work] { work->complete(); };
  task.fail = [work, flight](const std::string& message) {
    work->fail(message);
    FlightRecorder::instance().ended(flight, false);
  };
  const uint64_t id = queue_->push(std::move(task));
  work->setShortcut([queue = std::weak_ptr<CollectiveQueue>(queue_), id] {
    auto alive = queue.lock();  // gone: the group was destroyed, which ran every task
    return alive && alive->runIfNext(id);
  });
  return work;
}

std::function<std::string(const std::exception&)> ProcessGroupDrun::describer(const char* call) {
  // The Work may outlive this group: it keeps the heartbeat, not the group.
  return [heartbeat = heartbeat_, shm = transport() == "shm", call](const std::exception& e) {
    return describeFailure(heartbeat.get(), shm, call, e);
  };
}

std::string ProcessGroupDrun::failure(const char* call, const std::exception& e) const {
  return describeFailure(heartbeat_.get(), transport() == "shm", call, e);
}

std::string ProcessGroupDrun::describeFailure(Heartbeat* heartbeat, bool shm, const char* call,
                                              const std::exception& e) {
  std::string message = std::string("drun backend: ") + call + ": " + e.what();
  // A timeout waited long enough for a silent rank's heartbeat to go stale; another failure (a
  // closed Gloo connection) may come before it did, so explainFailure waits for it (bounded).
  // Shared memory alone names a dead rank itself (pidfds): no wait there.
  if (heartbeat != nullptr) {
    const bool wait = dynamic_cast<const TimeoutError*>(&e) == nullptr && !shm;
    std::string named = heartbeat->explainFailure(wait);
    if (!named.empty()) message += "; " + named;
  }
  return message;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  auto s = stage(single(tensors, "broadcast"), "broadcast");
  auto dtype = dtypeOf(s.user, "broadcast");
  int root = static_cast<int>(opts.rootRank);
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::BROADCAST, "broadcast", tensors, timeout, [this, s, dtype, root, timeout] {
    comm_->broadcast(s.data(), s.count(), dtype, root, timeout);
    s.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  auto s = stage(single(tensors, "all_reduce"), "all_reduce");
  auto op = reduceOpOf(opts.reduceOp, s.user, "all_reduce");
  auto dtype = dtypeOf(s.user, "all_reduce");
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::ALLREDUCE, "all_reduce", tensors, timeout, [this, s, dtype, op, timeout] {
    comm_->allReduce(s.data(), s.count(), dtype, op, timeout);
    s.copyBack();
  });
}

// One queued task: the tensors' all_reduces one after another.
c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<Staged> staged;
  std::vector<comm::ReduceOp> ops;
  for (auto& t : tensors) {
    staged.push_back(stage(t, "all_reduce_coalesced"));
    ops.push_back(reduceOpOf(opts.reduceOp, t, "all_reduce_coalesced"));
  }
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, timeout,
                 [this, staged, ops, timeout] {
                   for (size_t i = 0; i < staged.size(); ++i) {
                     const auto& s = staged[i];
                     comm_->allReduce(s.data(), s.count(), dtypeOf(s.user, "all_reduce"), ops[i],
                                      timeout);
                     s.copyBack();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  auto s = stage(single(tensors, "reduce"), "reduce");
  const bool root = opts.rootRank == rank_;
  // Only the root's tensor receives the result: the others' stay as they were.
  if (!root) s.flat = s.flat.clone(at::MemoryFormat::Contiguous);
  auto op = reduceOpOf(opts.reduceOp, s.user, "reduce");
  auto dtype = dtypeOf(s.user, "reduce");
  int rootRank = static_cast<int>(opts.rootRank);
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::REDUCE, "reduce", tensors, timeout,
                 [this, s, op, dtype, root, rootRank, timeout] {
                   comm_->reduce(s.data(), s.count(), dtype, op, rootRank, timeout);
                   if (root) s.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto in = stage(single(inputs, "all_gather"), "all_gather");
  TORCH_CHECK(outputs.size() == 1, "drun backend: all_gather takes one output list per rank");
  checkList(outputs[0], in.user, size_, "all_gather", "the output list");
  at::Tensor flat = flatFor(in.user, size_);
  auto dtype = dtypeOf(in.user, "all_gather");
  auto timeout = opTimeout(opts.timeout);
  auto list = outputs[0];
  return enqueue(OpType::ALLGATHER, "all_gather", list, timeout,
                 [this, in, flat, list, dtype, timeout] {
                   comm_->allGather(in.data(), flat.data_ptr(), in.count(), dtype, timeout);
                   unpack(flat, list);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  auto in = stage(input, "all_gather_into_tensor");
  auto out = stage(output, "all_gather_into_tensor");
  TORCH_CHECK(out.user.scalar_type() == in.user.scalar_type() &&
                  out.count() == in.count() * static_cast<size_t>(size_),
              "drun backend: all_gather_into_tensor: the output must hold world size x the "
              "input's elements of its dtype");
  auto dtype = dtypeOf(in.user, "all_gather");
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, timeout,
                 [this, in, out, dtype, timeout] {
                   comm_->allGather(in.data(), out.data(), in.count(), dtype, timeout);
                   out.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDrun::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  auto in = stage(single(inputs, "gather"), "gather");
  const bool root = opts.rootRank == rank_;
  at::Tensor flat;
  std::vector<at::Tensor> list;
  if (root) {
    TORCH_CHECK(outputs.size() == 1, "drun backend: gather: the root takes one output list");
    checkList(outputs[0], in.user, size_, "gather", "the root's output list");
    flat = flatFor(in.user, size_);
    list = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                "drun backend: gather: only the root passes an output list");
  }
  auto dtype = dtypeOf(in.user, "gather");
  int rootRank = static_cast<int>(opts.rootRank);
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::GATHER, "gather", list, timeout,
                 [this, in, flat, list, root, dtype, rootRank, timeout] {
                   comm_->gather(in.data(), root ? flat.data_ptr() : nullptr, in.count(), dtype,
                                 rootRank, timeout);
                   if (root) unpack(flat, list);
                 });
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
  auto dtype = dtypeOf(out.user, "scatter");
  int rootRank = static_cast<int>(opts.rootRank);
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::SCATTER, "scatter", outputs, timeout,
                 [this, out, flat, root, dtype, rootRank, timeout] {
                   comm_->scatter(root ? flat.data_ptr() : nullptr, out.data(), out.count(),
                                  dtype, rootRank, timeout);
                   out.copyBack();
                 });
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
  auto dtype = dtypeOf(out.user, "reduce_scatter");
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::REDUCE_SCATTER, "reduce_scatter", outputs, timeout,
                 [this, out, flat, op, dtype, timeout] {
                   comm_->reduceScatter(flat.data_ptr(), out.data(), out.count(), dtype, op,
                                        timeout);
                   out.copyBack();
                 });
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
  auto dtype = dtypeOf(out.user, "reduce_scatter");
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, timeout,
                 [this, in, out, op, dtype, timeout] {
                   comm_->reduceScatter(in.data(), out.data(), out.count(), dtype, op, timeout);
                   out.copyBack();
                 });
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
                                       std::vector<at::Tensor>{s.flat}, nullptr, describer("send"));
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
                                       [s] { s.copyBack(); }, describer("recv"));
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
  auto timeout = opTimeout(opts.timeout);
  return enqueue(OpType::BARRIER, "barrier", {}, timeout,
                 [this, timeout] { comm_->barrier(timeout); });
}

}  // namespace drun::torch_backend
