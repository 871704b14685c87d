// What every unit of the c10d rendezvous knows of this node and its job: the options, this
// node's descriptor (as it appears in `joined`) and the store's endpoint for messages; plus the
// small helpers they share. The units (round_closer, round_join, exit_barrier, reconnector) take
// the store connection per call: it is replaced when the node reconnects.
//
// Threading: a value owned by the rendezvous; the units only read it.
#pragma once

#include <string>

#include "drun/common/deadline.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"
#include "job_ledger.hpp"

namespace drun::rdzv {

struct C10dNode {
  RendezvousOptions options;
  keys::NodeDescriptor self;
  std::string descriptorLine;  // encodeDescriptor(self), re-encoded when self changes
  std::string endpoint;        // "host:port" of the store, for messages

  const std::string& runId() const { return options.runId; }
};

// A fresh node id: "<pid hex>-<64 random bits hex>" (keys::isValidNodeId).
std::string newNodeId();

// How many node names a message lists.
inline constexpr size_t kMaxNamesInMessage = 32;

inline constexpr auto kNever = Clock::time_point::max();

inline std::string ms(milliseconds d) { return std::to_string(d.count()) + "ms"; }

// The previous round as a re-forming round sees it: who of its members can still come back.
struct Reform {
  bool active = false;  // the previous round closed: its members re-join this one
  RoundBaseline previous;
};

// Telling the others through the store (a round's `status` wakes its joiners, `changes` its
// membership watchers).
void bumpStatus(Store& store, const std::string& runId, uint64_t round);
void wakeWatchers(Store& store, const std::string& runId, uint64_t round);
void signalChange(Store& store, const std::string& runId, uint64_t round, const std::string& reason);
// The same two calls, added to a batch (store_batch.hpp).
void signalChange(StoreBatch& batch, const std::string& runId, uint64_t round,
                  const std::string& reason);
// Waits on `key` until it differs from `known` or `timeout` passes (no error at the deadline).
void watchQuietly(LivenessStore& store, const std::string& key, const std::optional<Bytes>& known,
                  milliseconds timeout);

}  // namespace drun::rdzv
