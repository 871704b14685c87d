// The interface between the Communicator front end (validation, ordering, async queue, errors)
// and a transport backend (Gloo, NCCL). Internal to libdrun_comm.
//
// A Backend instance serves one communicator (the world or one group). run() executes one
// collective to completion or throws by its timeout; the front end calls it from one thread at a
// time. isend/irecv may be called from any thread, also while run() is executing.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drun/comm/communicator.hpp"

namespace drun::rdzv {
class Store;
}
namespace gloo::transport {
class Device;
}

namespace drun::comm {

// What every Request's backend state implements (declared in communicator.hpp).
class Request::State {
 public:
  virtual ~State() = default;
  // timeout: kDefaultTimeout = the operation's own deadline.
  virtual void wait(milliseconds timeout) = 0;
  virtual bool test() = 0;
  virtual int source() const { return -1; }
};

namespace detail {

enum class OpKind { Broadcast, Reduce, AllReduce, Scatter, Gather, AllGather, ReduceScatter,
                    AllToAll, Barrier };
const char* toString(OpKind kind);  // "all_reduce", ... (torch's names)
bool isRooted(OpKind kind);         // broadcast, reduce, scatter, gather
bool isReduction(OpKind kind);      // reduce, all_reduce, reduce_scatter

// One collective call, already validated by the front end. Sizes are in elements; send/recv as
// documented in communicator.hpp (in-place ops use recv only).
struct Collective {
  OpKind kind;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  milliseconds timeout{0};
};

// What a request of an aborted backend fails with (after the operation's own words).
inline constexpr const char* kAbortedAfterFailure = "the communicator was aborted after a failure";

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void run(const Collective& c) = 0;
  virtual std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag,
                                                milliseconds timeout) = 0;
  // src: a rank or kAnySource.
  virtual std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag,
                                                milliseconds timeout) = 0;
  // From whichever of `sources` sends first (Gloo; others throw InvalidArgument).
  virtual std::shared_ptr<Request::State> irecvFromAnyOf(void* buf, size_t bytes, const std::vector<int>& sources,
                                                         int tag, milliseconds timeout);
  // Withdraws a receive of this backend's (shm): true when it had matched no message and now
  // never will (it counts as done), false when it matched one (it completes as usual) or the
  // backend cannot withdraw receives.
  virtual bool cancelRecv(Request::State& request) {
    (void)request;
    return false;
  }
  // Called whenever one of its point-to-point requests completes (shm), on the thread that
  // completes it and under the backend's lock: it may take only a lock that is never held
  // while calling into a backend.
  virtual void setP2PListener(std::function<void()> listener) { (void)listener; }
  // A backend for the group of `size` ranks in which this process is `rank`, connected through
  // `store` (a prefix reserved for the group), sharing this backend's device/transport.
  virtual std::unique_ptr<Backend> makeGroup(std::shared_ptr<rdzv::Store> store, int rank,
                                             int size, milliseconds timeout) = 0;
  // After a failure: release what a pending operation might hold, without waiting for peers.
  // The point-to-point requests it fails say kAbortedAfterFailure.
  virtual void abort() {}
  // "tcp" (Gloo), "shm", "hierarchical", "nccl".
  virtual const char* transport() const = 0;
};

struct BackendConfig {
  std::shared_ptr<rdzv::Store> store;  // prefixed for this communicator
  int rank = 0;
  int size = 1;
  milliseconds timeout{0};
  std::string socketIfname;  // gloo: "" = route to masterAddr
  std::string masterAddr;    // gloo: where the interface is looked for
  int device = 0;            // nccl: the CUDA device
};

using GlooDevice = gloo::transport::Device;
// Gloo's TCP device on the interface BackendConfig names (socketIfname, else the route to
// masterAddr). Throws InvalidArgument for an unusable interface.
std::shared_ptr<GlooDevice> makeGlooDevice(const BackendConfig& config);
// A Gloo full mesh of `size` ranks over `device`, connected through `store`.
std::unique_ptr<Backend> makeGlooBackend(std::shared_ptr<GlooDevice> device, std::shared_ptr<rdzv::Store> store,
                                         int rank, int size, milliseconds timeout);
std::unique_ptr<Backend> makeNcclBackend(const BackendConfig& config);
// Throws InvalidArgument when NCCL was not built in, or `device` is not a present CUDA device.
void checkNcclUsable(int device);

}  // namespace detail
}  // namespace drun::comm
