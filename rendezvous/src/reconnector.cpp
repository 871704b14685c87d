#include "reconnector.hpp"

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"

namespace drun::rdzv {

std::unique_ptr<LivenessStore> reconnect(const std::function<std::unique_ptr<LivenessStore>()>& connect,
                                 const C10dNode& node, const Deadline& deadline) {
  const std::string lost = "rendezvous '" + node.runId() + "': lost the store at " + node.endpoint;
  if (!connect) throw NetworkError(lost);
  for (int attempt = 1;; ++attempt) {
    try {
      auto store = connect();
      spdlog::info("rendezvous '{}': connected to the store at {} again (attempt {})",
                   node.runId(), node.endpoint, attempt);
      return store;
    } catch (const TimeoutError& e) {
      if (deadline.expired())
        throw TimeoutError(lost + " and could not reach it again within " +
                           ms(node.options.joinTimeout) + ": " + e.what());
      spdlog::debug("{}; attempt {} to connect again: {}", lost, attempt, e.what());
    } catch (const NetworkError& e) {
      throw NetworkError(lost + ", and its host refuses connections (the store is gone): " +
                         e.what());
    }
  }
}

}  // namespace drun::rdzv
