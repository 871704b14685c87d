// The NCCL backend: device buffers, one non-blocking NCCL communicator per communicator, its
// ncclUniqueId exchanged through the store, every operation enqueued on the backend's stream and
// waited for by polling (the CUDA event and ncclCommGetAsyncError) until its deadline. A failure or
// a passed deadline aborts the communicator (ncclCommAbort), so nothing ever hangs in NCCL, not
// even the destructor.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "../backend.hpp"
#include "drun/common/deadline.hpp"
#include "drun/store/store.hpp"

namespace drun::comm::detail {
namespace {

const std::string kUniqueIdKey = "nccl_unique_id";
constexpr milliseconds kFinalizeTimeout{10000};

void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(std::string("nccl backend: ") + what + ": " + cudaGetErrorString(e));
}

ncclDataType_t ncclType(DType d) {
  switch (d) {
    case DType::Int8: return ncclInt8;
    case DType::UInt8: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
  }
  throw InvalidArgument("nccl: invalid dtype");
}

ncclRedOp_t ncclOp(ReduceOp op, DType d) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Product: return ncclProd;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
    default:
      throw InvalidArgument(std::string("reduce op ") + toString(op) + " on " + toString(d) +
                            ": NCCL has no bitwise reductions (use the gloo backend)");
  }
}

// The NCCL communicator handle, shared by the backend and its requests. NCCL communicators are
// not thread-safe, and one thread may abort while others poll: every use of the handle (enqueue,
// async-error query, abort, finalize/destroy) happens under one (recursive) mutex, and after
// abort() the handle is gone for good, so nothing touches a freed communicator.
class NcclComm {
 public:
  // Runs f(handle) under the lock; CommError once aborted.
  template <class F>
  auto with(const char* what, F&& f) {
    std::lock_guard lock(mutex_);
    if (!comm_) throw CommError(std::string("nccl: ") + what + ": the communicator was aborted");
    return f(comm_);
  }
  ncclComm_t* slot() { return &comm_; }  // init only, before any other thread sees it

  // One poll: true once the work is done (the async state is success and `event`, if any, has
  // completed). Throws CommError on an async error, TimeoutError past the deadline; both abort.
  bool poll(const char* what, const Deadline& deadline, milliseconds timeout, cudaEvent_t event) {
    std::unique_lock lock(mutex_);
    if (!comm_) throw CommError(std::string("nccl: ") + what + ": the communicator was aborted");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      std::string msg = std::string("nccl: ") + what + ": " + ncclGetErrorString(state) + " (" +
                        ncclGetLastError(comm_) + ")";
      abortLocked();
      throw CommError(msg);
    }
    if (state == ncclSuccess) {
      if (!event) return true;
      cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) {
        abortLocked();
        cudaCheck(e, what);
      }
    }
    if (deadline.expired()) {
      abortLocked();
      throw TimeoutError(std::string("nccl: ") + what + " timed out after " + std::to_string(timeout.count()) + "ms");
    }
    return false;
  }

  // Polls (the lock is released between polls, so others may enqueue, poll or abort).
  void await(const char* what, const Deadline& deadline, milliseconds timeout, cudaEvent_t event = nullptr) {
    for (int spins = 0; !poll(what, deadline, timeout, event); ++spins)
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  void abort() {
    std::lock_guard lock(mutex_);
    abortLocked();
  }

  // Orderly end: flush (bounded), then destroy; a failure or the deadline aborts instead.
  void finalize() {
    try {
      with("finalize", [&](ncclComm_t c) { return ncclCommFinalize(c); });
      await("finalize", Deadline(kFinalizeTimeout), kFinalizeTimeout);
    } catch (const Error&) {
      // aborted already
    }
    std::lock_guard lock(mutex_);
    if (comm_) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

 private:
  void abortLocked() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::recursive_mutex mutex_;  // ncclCheck may abort while an enqueue holds it
  ncclComm_t comm_ = nullptr;
};

void ncclCheck(ncclResult_t r, NcclComm& c, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = std::string("nccl: ") + what + ": " + ncclGetErrorString(r);
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) throw InvalidArgument(msg);
  c.abort();
  throw CommError(msg);
}

class NcclRequest final : public Request::State {
 public:
  NcclRequest(std::shared_ptr<NcclComm> comm, cudaEvent_t event, milliseconds timeout, int source)
      : comm_(std::move(comm)), event_(event), timeout_(timeout), deadline_(timeout), source_(source) {}
  ~NcclRequest() override { cudaEventDestroy(event_); }

  void wait(milliseconds timeout) override {
    std::lock_guard lock(mutex_);
    if (done_) return;
    Deadline d = timeout == kDefaultTimeout ? deadline_ : Deadline(std::min(timeout, deadline_.remaining()));
    comm_->await("point-to-point", d, timeout_, event_);
    done_ = true;
  }
  // One poll, never blocking: the async error and the deadline count as in wait().
  bool test() override {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    return done_ = comm_->poll("point-to-point", deadline_, timeout_, event_);
  }
  int source() const override { return source_; }

 private:
  std::mutex mutex_;
  std::shared_ptr<NcclComm> comm_;
  cudaEvent_t event_;
  milliseconds timeout_;
  Deadline deadline_;
  int source_;
  bool done_ = false;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(const BackendConfig& config) : rank_(config.rank), size_(config.size), device_(config.device) {
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaCheck(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    ncclUniqueId id;
    if (rank_ == 0) {
      ncclCheck(ncclGetUniqueId(&id), *comm_, "ncclGetUniqueId");
      config.store->set(kUniqueIdKey, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      std::string bytes = config.store->get(kUniqueIdKey, config.timeout);
      if (bytes.size() != sizeof(id))
        throw ProtocolError("nccl: the store's unique id has " + std::to_string(bytes.size()) +
                            " bytes, expected " + std::to_string(sizeof(id)));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclCheck(ncclCommInitRankConfig(comm_->slot(), size_, id, rank_, &cfg), *comm_, "ncclCommInitRankConfig");
    comm_->await("init", Deadline(config.timeout), config.timeout);
  }

  ~NcclBackend() override {
    comm_->finalize();
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  void run(const Collective& c) override {
    Deadline deadline(c.timeout);
    const char* what = toString(c.kind);
    // Enqueued under the handle's lock (released before the wait): no abort in between.
    cudaEvent_t event = comm_->with(what, [&](ncclComm_t comm) { return enqueue(c, comm); });
    try {
      comm_->await(what, deadline, c.timeout, event);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
    cudaEventDestroy(event);
  }

  cudaEvent_t enqueue(const Collective& c, ncclComm_t comm) {
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    const ncclDataType_t t = c.kind == OpKind::Barrier ? ncclFloat32 : ncclType(c.dtype);
    const size_t bytes = c.kind == OpKind::Barrier ? 0 : c.count * dtypeSize(c.dtype);
    auto at = [](const void* p, size_t offset) { return static_cast<const char*>(p) + offset; };
    auto atw = [](void* p, size_t offset) { return static_cast<char*>(p) + offset; };
    const char* what = toString(c.kind);
    switch (c.kind) {
      case OpKind::Broadcast:
        ncclCheck(ncclBroadcast(c.recv, c.recv, c.count, t, c.root, comm, stream_), *comm_, what);
        break;
      case OpKind::Reduce:
        ncclCheck(ncclReduce(c.recv, c.recv, c.count, t, ncclOp(c.op, c.dtype), c.root, comm, stream_), *comm_, what);
        break;
      case OpKind::AllReduce:
        ncclCheck(ncclAllReduce(c.recv, c.recv, c.count, t, ncclOp(c.op, c.dtype), comm, stream_), *comm_, what);
        break;
      case OpKind::AllGather:
        ncclCheck(ncclAllGather(c.send, c.recv, c.count, t, comm, stream_), *comm_, what);
        break;
      case OpKind::ReduceScatter:
        ncclCheck(ncclReduceScatter(c.send, c.recv, c.count, t, ncclOp(c.op, c.dtype), comm, stream_), *comm_, what);
        break;
      case OpKind::Barrier:
        ncclCheck(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm, stream_), *comm_, what);
        break;
      case OpKind::Scatter:
      case OpKind::Gather:
      case OpKind::AllToAll:
        ncclCheck(ncclGroupStart(), *comm_, what);
        for (int r = 0; r < size_; ++r) {
          size_t off = static_cast<size_t>(r) * bytes;
          if (c.kind == OpKind::AllToAll) {
            ncclCheck(ncclSend(at(c.send, off), c.count, t, r, comm, stream_), *comm_, what);
            ncclCheck(ncclRecv(atw(c.recv, off), c.count, t, r, comm, stream_), *comm_, what);
          } else if (c.kind == OpKind::Scatter && rank_ == c.root) {
            ncclCheck(ncclSend(at(c.send, off), c.count, t, r, comm, stream_), *comm_, what);
          } else if (c.kind == OpKind::Gather && rank_ == c.root) {
            ncclCheck(ncclRecv(atw(c.recv, off), c.count, t, r, comm, stream_), *comm_, what);
          }
        }
        if (c.kind == OpKind::Scatter) ncclCheck(ncclRecv(c.recv, c.count, t, c.root, comm, stream_), *comm_, what);
        if (c.kind == OpKind::Gather) ncclCheck(ncclSend(c.send, c.count, t, c.root, comm, stream_), *comm_, what);
        ncclCheck(ncclGroupEnd(), *comm_, what);
        break;
    }
    return recordEvent();
  }

  cudaEvent_t recordEvent() {
    cudaEvent_t event;
    cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    cudaEventRecord(event, stream_);
    return event;
  }

  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int, milliseconds timeout) override {
    return p2p(true, const_cast<void*>(buf), bytes, dst, timeout);
  }
  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int, milliseconds timeout) override {
    if (src == kAnySource) throw InvalidArgument("recv from any source: NCCL needs the source rank");
    return p2p(false, buf, bytes, src, timeout);
  }

  std::unique_ptr<Backend> makeGroup(std::shared_ptr<rdzv::Store> store, int rank, int size,
                                     milliseconds timeout) override {
    BackendConfig config;
    config.store = std::move(store);
    config.rank = rank;
    config.size = size;
    config.timeout = timeout;
    config.device = device_;
    return std::make_unique<NcclBackend>(config);
  }

  void abort() override { comm_->abort(); }
  const char* transport() const override { return "nccl"; }

 private:
  std::shared_ptr<Request::State> p2p(bool isSend, void* buf, size_t bytes, int peer, milliseconds timeout) {
    cudaEvent_t event = comm_->with(isSend ? "send" : "recv", [&](ncclComm_t comm) {
      cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
      // Bytes as int8: tags do not exist in NCCL, messages between two ranks arrive in order.
      if (isSend) ncclCheck(ncclSend(buf, bytes, ncclInt8, peer, comm, stream_), *comm_, "send");
      else ncclCheck(ncclRecv(buf, bytes, ncclInt8, peer, comm, stream_), *comm_, "recv");
      return recordEvent();
    });
    return std::make_shared<NcclRequest>(comm_, event, timeout, isSend ? -1 : peer);
  }

  int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::shared_ptr<NcclComm> comm_ = std::make_shared<NcclComm>();
};

}  // namespace

void checkNcclUsable(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    throw InvalidArgument(std::string("backend nccl: no CUDA device is present (") +
                          (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + "); use backend gloo");
  if (device < 0 || device >= n)
    throw InvalidArgument("backend nccl: CUDA device " + std::to_string(device) + " does not exist (" +
                          std::to_string(n) + " present; the device is LOCAL_RANK unless set)");
}

std::unique_ptr<Backend> makeNcclBackend(const BackendConfig& config) {
  checkNcclUsable(config.device);
  return std::make_unique<NcclBackend>(config);
}

}  // namespace drun::comm::detail
