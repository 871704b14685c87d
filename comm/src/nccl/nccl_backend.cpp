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
#include "drun/rendezvous/store.hpp"

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

// Polls until the communicator has no operation in progress; aborts it on error or at the deadline.
class NcclComm {
 public:
  ncclComm_t comm = nullptr;

  void await(const char* what, const Deadline& deadline, milliseconds timeout, cudaEvent_t event = nullptr) {
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        std::string msg = std::string("nccl: ") + what + ": " + ncclGetErrorString(state) + " (" +
                          ncclGetLastError(comm) + ")";
        abort();
        throw CommError(msg);
      }
      if (state == ncclSuccess) {
        if (!event) return;
        cudaError_t e = cudaEventQuery(event);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) {
          abort();
          cudaCheck(e, what);
        }
      }
      if (deadline.expired()) {
        abort();
        throw TimeoutError(std::string("nccl: ") + what + " timed out after " +
                           std::to_string(timeout.count()) + "ms");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort() {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
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
    if (!comm_->comm) throw CommError("nccl: the communicator was aborted");
    comm_->await("point-to-point", d, timeout_, event_);
    done_ = true;
  }
  bool test() override {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    cudaCheck(e, "point-to-point");
    return done_ = true;
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
    ncclCheck(ncclCommInitRankConfig(&comm_->comm, size_, id, rank_, &cfg), *comm_, "ncclCommInitRankConfig");
    comm_->await("init", Deadline(config.timeout), config.timeout);
  }

  ~NcclBackend() override {
    if (comm_->comm) {
      // Flush what is outstanding (bounded); a failure or the deadline aborts instead.
      try {
        ncclCheck(ncclCommFinalize(comm_->comm), *comm_, "finalize");
        comm_->await("finalize", Deadline(kFinalizeTimeout), kFinalizeTimeout);
      } catch (const Error&) {
        // await() aborted the communicator already
      }
      if (comm_->comm) ncclCommDestroy(comm_->comm);
      comm_->comm = nullptr;
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  void run(const Collective& c) override {
    std::unique_lock enqueue(enqueueMutex_);  // released before the wait
    if (!comm_->comm) throw CommError("nccl: the communicator was aborted");
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    Deadline deadline(c.timeout);
    const ncclDataType_t t = c.kind == OpKind::Barrier ? ncclFloat32 : ncclType(c.dtype);
    const size_t bytes = c.kind == OpKind::Barrier ? 0 : c.count * dtypeSize(c.dtype);
    auto at = [](const void* p, size_t offset) { return static_cast<const char*>(p) + offset; };
    auto atw = [](void* p, size_t offset) { return static_cast<char*>(p) + offset; };
    ncclComm_t comm = comm_->comm;
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
    cudaEvent_t event;
    cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    cudaEventRecord(event, stream_);
    enqueue.unlock();
    try {
      comm_->await(what, deadline, c.timeout, event);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
    cudaEventDestroy(event);
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
    std::lock_guard enqueue(enqueueMutex_);
    if (!comm_->comm) throw CommError("nccl: the communicator was aborted");
    cudaCheck(cudaSetDevice(device_), "cudaSetDevice");
    // Bytes as int8: tags do not exist in NCCL, messages between two ranks arrive in order.
    if (isSend) ncclCheck(ncclSend(buf, bytes, ncclInt8, peer, comm_->comm, stream_), *comm_, "send");
    else ncclCheck(ncclRecv(buf, bytes, ncclInt8, peer, comm_->comm, stream_), *comm_, "recv");
    cudaEvent_t event;
    cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    cudaEventRecord(event, stream_);
    return std::make_shared<NcclRequest>(comm_, event, timeout, isSend ? -1 : peer);
  }

  int rank_, size_, device_;
  std::mutex enqueueMutex_;  // NCCL communicators are not thread-safe: one enqueue at a time
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
