// TransportPlan: which transport the ranks of a communicator use, decided the same way on every
// rank (DRUN_COMM_TRANSPORT = shm | tcp | auto, default auto):
//   tcp   Gloo's TCP transport for every operation.
//   auto  the ranks exchange their host identity through the store (boot id + network and pid
//         namespace inodes: two ranks share memory when all match); all on one host: shared
//         memory; on several hosts: hierarchical (shared memory within each host, Gloo among
//         one leader per host, Gloo for what is not hierarchical); a segment that cannot be
//         shared (every rank learns it): Gloo.
//   shm   as auto, but a segment that cannot be shared is an error.
// NCCL communicators are not planned here (device memory): NCCL's own groups.
// Threading: make() may be called from any thread (the Gloo device is made once, under a mutex).
// Ownership: shared by every communicator of the world.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

enum class Transport { Auto, Shm, Tcp };
// Throws InvalidArgument naming the text.
Transport parseTransport(const std::string& text);
// "<boot id>/<netns inode>/<pidns inode>" of this process.
std::string hostIdentity();

class TransportPlan {
 public:
  // base: the world's config (interface, master address); transport and shm options from
  // DRUN_COMM_TRANSPORT and DRUN_COMM_SHM_BYTES.
  explicit TransportPlan(BackendConfig base);
  // A backend for `size` ranks in which this one is `rank`, connected through `store` (a
  // prefix reserved for the communicator).
  std::unique_ptr<Backend> make(std::shared_ptr<rdzv::Store> store, int rank, int size, milliseconds timeout);

 private:
  std::shared_ptr<GlooDevice> device();

  BackendConfig base_;
  Transport transport_;
  ShmOptions shm_;
  std::mutex mutex_;
  std::shared_ptr<GlooDevice> device_;
};

}  // namespace drun::comm::detail
