#include "reconnector.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/progress.hpp"

namespace drun::rdzv {
namespace {

constexpr milliseconds kMinAttemptSpacing{500};

}  // namespace

std::unique_ptr<LivenessStore> reconnect(
    const std::function<std::unique_ptr<LivenessStore>()>& connect, const C10dNode& node,
    Clock::time_point lostAt) {
  const std::string lost = "rendezvous '" + node.runId() + "': lost the store at " + node.endpoint;
  if (!connect) throw NetworkError(lost);
  const milliseconds window = node.options.reconnectTimeout;
  const auto until = lostAt + window;
  auto since = [&] { return std::chrono::duration_cast<milliseconds>(Clock::now() - lostAt); };
  ProgressPacer progress(kReconnectProgress, kReconnectProgress);
  for (int attempt = 1;; ++attempt) {
    const auto tried = Clock::now();
    try {
      auto store = connect();
      spdlog::info("rendezvous '{}': connected to the store at {} again after {} (attempt {})",
                   node.runId(), node.endpoint, humanDuration(since()), attempt);
      return store;
    } catch (const TimeoutError& e) {  // nothing answered: a cut link, a host rebooting
      spdlog::debug("{}; attempt {} to connect again: {}", lost, attempt, e.what());
      if (Clock::now() >= until)
        throw TimeoutError(lost + " and could not reach it again within " + humanDuration(window) +
                           " (--rdzv-conf reconnect_timeout): " + e.what());
    } catch (const NetworkError& e) {  // refused: nothing serves the port (yet)
      spdlog::debug("{}; attempt {} to connect again: {}", lost, attempt, e.what());
      if (Clock::now() >= until)
        throw NetworkError(lost + ", and nothing served it again within " + humanDuration(window) +
                           " (--rdzv-conf reconnect_timeout): " + e.what());
    }
    // A refusal that came at once (a connection limit) is not retried in a busy loop.
    std::this_thread::sleep_until(std::min(until, tried + kMinAttemptSpacing));
    if (progress.due()) {
      const std::string line = "rendezvous store at " + node.endpoint + " unreachable for " +
                               humanDuration(std::chrono::duration_cast<std::chrono::seconds>(since())) +
                               "; retrying for " +
                               humanDuration(std::chrono::duration_cast<milliseconds>(
                                   std::max(until - Clock::now(), Clock::duration::zero()))) +
                               " more (--rdzv-conf reconnect_timeout " + humanDuration(window) + ")";
      spdlog::info("rendezvous '{}': {}", node.runId(), line);
      if (node.options.say) node.options.say(line);
    }
  }
}

}  // namespace drun::rdzv
