#include "store_host.hpp"

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/store/store_server.hpp"

namespace drun::comm {

StoreHost::StoreHost(std::unique_ptr<rdzv::StoreServer> server) : server_(std::move(server)) {}
StoreHost::~StoreHost() { server_->stop(); }

std::shared_ptr<StoreHost> StoreHost::tryHost(uint16_t port, const std::string& token) {
  rdzv::StoreServerOptions options;
  options.listen.port = port;
  options.token = token;
  try {
    auto server = std::make_unique<rdzv::StoreServer>(options);
    server->start();
    return std::shared_ptr<StoreHost>(new StoreHost(std::move(server)));
  } catch (const NetworkError& e) {
    spdlog::debug("drun_comm: not hosting the store on port {} ({}); connecting as a client", port,
                  e.what());
    return nullptr;
  }
}

}  // namespace drun::comm
