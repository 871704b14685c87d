// Helpers of comm's in-process tests (comm_unit*_test.cpp): communicators whose ranks are threads
// of this process over one MemoryStore, and the transport they use.
#pragma once

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "drun/comm/communicator.hpp"
#include "drun/store/memory_store.hpp"
#include "thread_checks.hpp"

namespace drun::test {

// Runs fn(rank, world) on `n` threads, each rank initialised over one shared MemoryStore (`check`:
// InitOptions.checkCollectives, unset for DRUN_COMM_CHECK's default). The
// ranks assert with the T_ macros (Catch2 is not thread-safe: thread_checks.hpp); their failures
// are reported here, then the first exception of any rank is rethrown.
inline void runRanks(int n, const std::function<void(int, drun::comm::Communicator&)>& fn,
                     drun::comm::milliseconds timeout = std::chrono::seconds(20),
                     std::optional<bool> check = false) {
  auto shared = drun::rdzv::MemoryStore::makeShared();
  drun::test::runThreads(n, [&](int r) {
    drun::comm::InitOptions o;
    o.rank = r;
    o.worldSize = n;
    o.timeout = timeout;
    o.socketIfname = "lo";
    o.checkCollectives = check;
    auto world = drun::comm::init(std::make_shared<drun::rdzv::MemoryStore>(shared), o);
    fn(r, *world);
  });
}

// DRUN_COMM_TRANSPORT for the communicators a test makes (in-process ranks share one host, so
// "auto" would pick shared memory for every one).
class TransportScope {
 public:
  explicit TransportScope(const char* transport) { setenv("DRUN_COMM_TRANSPORT", transport, 1); }
  ~TransportScope() { unsetenv("DRUN_COMM_TRANSPORT"); }
};
inline const char* const kUnitTransports[] = {"shm", "tcp"};

}  // namespace drun::test
