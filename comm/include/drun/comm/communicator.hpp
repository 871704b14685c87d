// drun::comm: the collective runtime a worker started by drun links (drun::comm, libdrun_comm.so).
// torch.distributed's model in C++: init() is init_process_group, a Communicator is a process
// group, newGroup() is new_group, send/recv/isend/irecv and the collectives keep their meaning.
//
//   auto world = drun::comm::init({.backend = drun::comm::Backend::Gloo});  // env://
//   world->allReduce(grad.data(), grad.size(), DType::Float32, ReduceOp::Sum);
//
// Buffers: host memory for Gloo, device memory for NCCL; counts are elements, not bytes. Ranks
// passed to a group's operations are ranks within that group (as in MPI and NCCL).
//
// Errors (all drun::Error): InvalidArgument for misuse (bad rank, size, dtype/op, a
// non-member's or a destroyed communicator's operation), TimeoutError when an operation's
// deadline passes, CommError when a peer fails; a failure names the peer when it is known
// ("rank 2 (host:pid) is gone"). After a TimeoutError or CommError the communicator is broken:
// every later operation fails at once with the first error (restart the job, as torchrun does,
// or, under drun's in-process recovery, reform() the world communicator).
//
// In-process recovery (docs/recovery.md): started by drun with DRUN_WORKER_STORE, init()
// connects to the workers' store (it outlives every rank) and the world communicator belongs to
// a generation (DRUN_GENERATION, or the store's newer recovery/generation). A watcher thread
// follows recovery/generation: when a newer generation begins, every pending and later
// operation fails at once with a CommError naming the lost ranks, and reform() moves the world
// to the new generation in place (same ranks, new transports). Groups belong to their
// generation: after reform() make them again.
// Every operation takes a timeout; kDefaultTimeout means the communicator's (InitOptions).
//
// Signals: with the gloo backend, init sets SIGPIPE to SIG_IGN when it is still at its default
// (Gloo's socket writes would otherwise let a dead peer kill this process); a handler the program
// installed is kept.
//
// Threading: a Communicator may be used from several threads. Collectives run one at a time, in
// the order they are called (the same order must hold on every rank); a blocking call runs on the
// calling thread unless asynchronous operations are still queued, in which case it runs after
// them. Asynchronous collectives run on one background thread per communicator, started on first
// use. Point-to-point operations start at once and may overlap collectives.
// Ownership: init() and newGroup() return shared_ptrs; a group keeps its parent's connections
// alive. Buffers passed to an asynchronous operation must stay valid until its Request is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "drun/comm/types.hpp"

namespace drun::rdzv {
class Store;
}

namespace drun::comm {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

inline constexpr milliseconds kDefaultTimeout{-1};  // "the communicator's timeout"
inline constexpr int kAnySource = -1;               // recv()/irecv() from any rank

struct InitOptions {
  Backend backend = Backend::Gloo;
  // "env://" (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), "tcp://host:port" (rank 0 hosts the
  // store there) or "file:///path" (a file on a file system every rank shares).
  std::string initMethod = "env://";
  int rank = -1;       // -1: from RANK
  int worldSize = -1;  // -1: from WORLD_SIZE
  // Deadline of init and the default of every operation; 0 = DRUN_COMM_TIMEOUT (default 300 s).
  milliseconds timeout{0};
  // Gloo: the interface for worker traffic; empty = DRUN_SOCKET_IFNAME, then GLOO_SOCKET_IFNAME,
  // else the local address that routes to the master.
  std::string socketIfname;
  // init(store, options) only: the store's host, whose route picks Gloo's interface when none
  // is named (as MASTER_ADDR does for env://); empty = the interface of this host's name.
  std::string masterAddr;
  // NCCL: the CUDA device; -1 = LOCAL_RANK (0 when unset).
  int device = -1;
  // Gloo: true: before every collective, the ranks compare what they were asked to do (op,
  // dtype, count, root, reduce op) and fail with InvalidArgument naming the ranks that differ,
  // instead of Gloo aborting the process on mismatched sizes; one small all_gather per
  // collective (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL does the same). false: no check. Unset:
  // DRUN_COMM_CHECK, whose default "sampled" compares the first 16 collectives so, then a hash
  // of all of them every DRUN_COMM_CHECK_INTERVAL (100) collectives, naming the first that
  // differed (it ran: its results are wrong).
  std::optional<bool> checkCollectives;
};

// The result of an asynchronous operation (torch's Work). Copyable handle; thread-safe.
class Request {
 public:
  class State;  // backend-specific
  Request() = default;
  explicit Request(std::shared_ptr<State> state);

  // Blocks until the operation is done or `timeout` (kDefaultTimeout: the operation's own
  // deadline) passed. Throws the operation's error, or TimeoutError naming the operation.
  void wait(milliseconds timeout = kDefaultTimeout);
  // True once done; throws the operation's error if it failed. Never blocks.
  bool test();
  // For a receive: the rank the message came from (valid once done). -1 otherwise.
  int source() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  class Impl;
  explicit Communicator(std::shared_ptr<Impl> impl);
  ~Communicator();  // destroy(): orderly, bounded by the timeout
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;  // in this communicator; -1 for a non-member of a group
  int size() const;
  bool isMember() const;
  Backend backend() const;
  milliseconds timeout() const;
  // This group's ranks in the world communicator (0..size-1 for the world itself).
  const std::vector<int>& worldRanks() const;
  // How this communicator's ranks talk: "shm" (all on this host, shared memory), "tcp" (Gloo),
  // "hierarchical" (shared memory within each host, Gloo across), "nccl"; "" for a non-member.
  // Chosen at init / newGroup by DRUN_COMM_TRANSPORT (shm | tcp | auto, default auto).
  std::string transport() const;
  // The generation this communicator belongs to (0 without in-process recovery); a group's is
  // the world's when the group was made.
  uint64_t generation() const;

  // World only, started with a workers' store (DRUN_WORKER_STORE): moves to the newest
  // generation in place. Closes this generation's transports (shared-memory segments, Gloo
  // connections, their threads), then connects new ones among the same ranks, every rank
  // keeping its number; a generation that is superseded while forming is abandoned for the
  // newest. Afterwards the communicator is usable again and its old groups fail (make them
  // again). A broken communicator whose failure came before the new generation (a dead peer's
  // sockets close before drun's agent opens the generation) waits for it within `timeout`.
  // Throws InvalidArgument on a group, without a workers' store, or when the communicator is
  // not broken and no newer generation began ("no recovery in progress"); TimeoutError when no
  // generation began or the ranks did not all come within `timeout` (it stays broken).
  void reform(milliseconds timeout = kDefaultTimeout);

  // Every rank calls newGroup with the same ranks, in the same order relative to other groups.
  // Members get a usable communicator; the others get one whose operations throw InvalidArgument.
  std::shared_ptr<Communicator> newGroup(const std::vector<int>& ranks,
                                         milliseconds timeout = kDefaultTimeout);

  // Point to point. `tag` tells apart concurrent messages between the same two ranks (>= 0).
  void send(const void* buf, size_t count, DType dtype, int dst, int tag = 0,
            milliseconds timeout = kDefaultTimeout);
  // Returns the source rank (useful with kAnySource).
  int recv(void* buf, size_t count, DType dtype, int src, int tag = 0,
           milliseconds timeout = kDefaultTimeout);
  Request isend(const void* buf, size_t count, DType dtype, int dst, int tag = 0,
                milliseconds timeout = kDefaultTimeout);
  Request irecv(void* buf, size_t count, DType dtype, int src, int tag = 0,
                milliseconds timeout = kDefaultTimeout);

  // Collectives; each has a blocking form and an ...Async form returning a Request.
  // broadcast: buf (count) from root to all. reduce: in place, the result lands on root.
  // allReduce: in place. scatter: root's send holds size*count, every recv count.
  // gather: every send count, root's recv size*count (others may pass nullptr).
  // allGather: send count, recv size*count. reduceScatter: send size*count, recv count (block
  // rank of the reduction). allToAll: send and recv size*count, block i goes to/comes from rank i.
  void broadcast(void* buf, size_t count, DType dtype, int root, milliseconds timeout = kDefaultTimeout);
  void reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root,
              milliseconds timeout = kDefaultTimeout);
  void allReduce(void* buf, size_t count, DType dtype, ReduceOp op,
                 milliseconds timeout = kDefaultTimeout);
  void scatter(const void* send, void* recv, size_t count, DType dtype, int root,
               milliseconds timeout = kDefaultTimeout);
  void gather(const void* send, void* recv, size_t count, DType dtype, int root,
              milliseconds timeout = kDefaultTimeout);
  void allGather(const void* send, void* recv, size_t count, DType dtype,
                 milliseconds timeout = kDefaultTimeout);
  void reduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                     milliseconds timeout = kDefaultTimeout);
  void allToAll(const void* send, void* recv, size_t count, DType dtype,
                milliseconds timeout = kDefaultTimeout);
  void barrier(milliseconds timeout = kDefaultTimeout);

  Request broadcastAsync(void* buf, size_t count, DType dtype, int root,
                         milliseconds timeout = kDefaultTimeout);
  Request reduceAsync(void* buf, size_t count, DType dtype, ReduceOp op, int root,
                      milliseconds timeout = kDefaultTimeout);
  Request allReduceAsync(void* buf, size_t count, DType dtype, ReduceOp op,
                         milliseconds timeout = kDefaultTimeout);
  Request scatterAsync(const void* send, void* recv, size_t count, DType dtype, int root,
                       milliseconds timeout = kDefaultTimeout);
  Request gatherAsync(const void* send, void* recv, size_t count, DType dtype, int root,
                      milliseconds timeout = kDefaultTimeout);
  Request allGatherAsync(const void* send, void* recv, size_t count, DType dtype,
                         milliseconds timeout = kDefaultTimeout);
  Request reduceScatterAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                             milliseconds timeout = kDefaultTimeout);
  Request allToAllAsync(const void* send, void* recv, size_t count, DType dtype,
                        milliseconds timeout = kDefaultTimeout);
  Request barrierAsync(milliseconds timeout = kDefaultTimeout);

  // Orderly shutdown (destroy_process_group): waits for queued operations (bounded by their
  // deadlines), leaves the store, and for the world communicator on the store's host, waits
  // (bounded by the timeout) until every rank has left before the store stops. Idempotent; every
  // later operation throws InvalidArgument.
  void destroy();

 private:
  std::shared_ptr<Impl> impl_;
};

// init_process_group. Throws InvalidArgument (bad options or environment, naming the variable),
// TimeoutError (the others did not arrive within the timeout), NetworkError, or
// InvalidArgument("...NCCL was not built in / no CUDA device...") for an unusable backend.
std::shared_ptr<Communicator> init(const InitOptions& options = {});

// The same over a store the caller made (options.initMethod is ignored; rank and worldSize are
// required). Keys go under "drun_comm/" in that store.
std::shared_ptr<Communicator> init(std::shared_ptr<rdzv::Store> store, const InitOptions& options);

// Whether this build has the NCCL backend.
bool ncclBuiltIn();

}  // namespace drun::comm
