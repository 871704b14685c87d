#include "drun/common/error.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::rdzv {

std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousOptions& options) {
  if (options.maxNodes == 1 && options.endpointHost.empty())
    return makeSingleNodeRendezvous(options);
  throw InvalidArgument("multi-node rendezvous (backend '" + options.backend +
                        "') is not available yet");
}

}  // namespace drun::rdzv
