#include "c10d_node.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::rdzv {

std::string newNodeId() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^
                      uint64_t(Clock::now().time_since_epoch().count()));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%x-%016llx", unsigned(::getpid()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

milliseconds watchSlice(milliseconds heartbeatTimeout) {
  return std::max<milliseconds>(200ms, heartbeatTimeout / 2);
}

void bumpStatus(Store& store, const std::string& runId, uint64_t round) {
  try {
    store.add(keys::status(runId, round), 1);
  } catch (const InvalidArgument&) {
    // The round closed meanwhile: status holds the state now.
  }
}

// `last_change` keeps the text of the latest loss or arrival, which is what the watchers quote.
void wakeWatchers(Store& store, const std::string& runId, uint64_t round) {
  store.add(keys::changes(runId, round), 1);
}

void signalChange(Store& store, const std::string& runId, uint64_t round, const std::string& reason) {
  store.set(keys::lastChange(runId, round), reason);
  store.add(keys::changes(runId, round), 1);
}

void signalChange(StoreBatch& batch, const std::string& runId, uint64_t round,
                  const std::string& reason) {
  batch.set(keys::lastChange(runId, round), reason);
  batch.add(keys::changes(runId, round), 1);
}

void watchQuietly(LivenessStore& store, const std::string& key, const std::optional<Bytes>& known,
                  milliseconds timeout) {
  try {
    store.watch(key, known, timeout);
  } catch (const TimeoutError&) {
  }
}

}  // namespace drun::rdzv
