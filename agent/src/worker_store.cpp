#include "worker_store.hpp"

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "drun/store/token_file.hpp"

namespace drun::agent::detail {

WorkerStore::WorkerStore(const AgentConfig& config, rdzv::Rendezvous& rendezvous)
    : rendezvous_(rendezvous), runId_(config.rendezvous.runId), callTimeout_(config.rendezvous.readTimeout) {
  if (auto shared = rendezvous.workerStoreEndpoint()) {
    endpoint_ = *shared;
    return;
  }
  if (auto side = rendezvous.connectSideStore())
    throw Error(std::string("--recovery in-process needs a store the workers can reach: the ") +
                rdzv::toString(config.rendezvous.backend) + " rendezvous has none (use --rdzv-backend c10d)");
  token_ = config.rendezvous.tokenFile.empty()
               ? rdzv::tokenFromEnvironment()
               : rdzv::readTokenFile(config.rendezvous.tokenFile, "--rdzv-conf token_file");
  rdzv::StoreServerOptions options;
  options.listen = {"127.0.0.1", 0};  // the workers of this node only
  options.token = token_;
  server_ = std::make_unique<rdzv::StoreServer>(options);
  server_->start();
  endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
  spdlog::debug("agent: serving the workers' store on {}", endpoint_);
}

WorkerStore::~WorkerStore() {
  if (server_) server_->stop();
}

std::string WorkerStore::prefix(uint64_t round) const {
  auto carried = carried_.find(round);
  return rdzv::keys::workerStore(runId_, carried == carried_.end() ? round : carried->second);
}

void WorkerStore::carryOn(uint64_t round, uint64_t earlier) {
  auto chain = carried_.find(earlier);
  carried_[round] = chain == carried_.end() ? earlier : chain->second;
}

std::unique_ptr<rdzv::LivenessStore> WorkerStore::connect() {
  if (!server_) {
    auto store = rendezvous_.connectSideStore();
    if (!store) throw NetworkError("the rendezvous store cannot be reached for the workers' store");
    return store;
  }
  rdzv::TcpStoreOptions options;
  options.endpoint = {"127.0.0.1", server_->port()};
  options.token = token_;
  options.scope = runId_;
  options.connectTimeout = std::chrono::seconds(5);
  options.timeout = callTimeout_;
  return std::make_unique<rdzv::TcpStore>(options);
}

}  // namespace drun::agent::detail
