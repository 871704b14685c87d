#include "gloo_abort.hpp"

#include <sys/socket.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include <gloo/context.h>
#include <gloo/transport/tcp/pair.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace drun::torch_backend {

namespace {

// The protected members this needs, reached the way a subclass may (never instantiated).
struct GlooGroupAccess : c10d::ProcessGroupGloo {
  static const std::vector<std::shared_ptr<::gloo::Context>>& contexts(c10d::ProcessGroupGloo& g) {
    return g.*(&GlooGroupAccess::contexts_);
  }
};

struct TcpPairAccess : ::gloo::transport::tcp::Pair {
  static std::mutex& mutex(::gloo::transport::tcp::Pair& p) { return p.*(&TcpPairAccess::m_); }
  static int fd(::gloo::transport::tcp::Pair& p) { return p.*(&TcpPairAccess::fd_); }
};

// The pair's lock is held only briefly by Gloo (its waits release it); a pair whose lock stays
// taken past the bound is shut down without it.
constexpr auto kLockBound = std::chrono::milliseconds(200);

bool shutDown(::gloo::transport::tcp::Pair& pair) {
  std::unique_lock<std::mutex> lock(TcpPairAccess::mutex(pair), std::defer_lock);
  const auto until = std::chrono::steady_clock::now() + kLockBound;
  while (!lock.try_lock() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int fd = TcpPairAccess::fd(pair);
  return fd >= 0 && ::shutdown(fd, SHUT_RDWR) == 0;
}

}  // namespace

int abortGloo(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(group.get());
  if (gloo == nullptr)
    throw std::invalid_argument("abort_gloo: not a gloo process group: " + group->getBackendName());
  int count = 0;
  for (const auto& context : GlooGroupAccess::contexts(*gloo)) {
    if (!context) continue;
    for (int peer = 0; peer < context->size; ++peer) {
      if (peer == context->rank) continue;
      auto& pair = context->getPair(peer);
      auto* tcp = dynamic_cast<::gloo::transport::tcp::Pair*>(pair.get());
      if (tcp != nullptr && shutDown(*tcp)) ++count;
    }
  }
  return count;
}

}  // namespace drun::torch_backend
