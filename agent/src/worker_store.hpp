// WorkerStore: the store the workers of an in-process recovery share (docs/recovery.md), which
// must outlive any one rank. With a rendezvous store the workers can reach (c10d), it is that
// store, keys under keys::workerStore(run id, round); on one node without a rendezvous store, a
// StoreServer this agent serves for the job on loopback (the same key prefix), with the
// rendezvous' token when there is one.
//
// A round that carries an earlier one on with the same workers (a refilled store: the round
// continues) keeps their prefix: carryOn(round, earlier) makes prefix(round) the one the
// workers were started with.
//
// Threading: endpoint() from any thread; prefix() and carryOn() from the agent thread; connect()
// from any thread (each call a new connection, blocking up to its connect deadline: call it off
// the loop).
// Ownership: owns the server it serves (stopped by the destructor); borrows the rendezvous,
// which must outlive it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "drun/agent/agent_config.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {
class StoreServer;
}

namespace drun::agent::detail {

class WorkerStore {
 public:
  // Throws drun::Error when the rendezvous has a store the workers cannot use (etcd), or the
  // server cannot be started.
  WorkerStore(const AgentConfig& config, rdzv::Rendezvous& rendezvous);
  ~WorkerStore();
  WorkerStore(const WorkerStore&) = delete;
  WorkerStore& operator=(const WorkerStore&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // DRUN_WORKER_STORE
  std::string prefix(uint64_t round) const;                   // DRUN_WORKER_STORE_PREFIX
  // Round `round` runs the workers of round `earlier` (and of whatever round that carried on).
  void carryOn(uint64_t round, uint64_t earlier);
  std::unique_ptr<rdzv::LivenessStore> connect();

 private:
  rdzv::Rendezvous& rendezvous_;
  std::string runId_;
  std::string token_;
  std::chrono::milliseconds callTimeout_;
  std::unique_ptr<rdzv::StoreServer> server_;  // one node: this agent serves the store
  std::string endpoint_;
  std::map<uint64_t, uint64_t> carried_;  // a round -> the round whose workers (and prefix) it runs
};

}  // namespace drun::agent::detail
