// makeRendezvous: picks the rendezvous implementation the options ask for.
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/rendezvous/static_rendezvous.hpp"

namespace drun::rdzv {

const char* toString(JobEvent::Kind kind) {
  switch (kind) {
    case JobEvent::Kind::MemberLost: return "member lost";
    case JobEvent::Kind::NodeWaiting: return "node waiting";
    case JobEvent::Kind::Failed: return "failed";
    case JobEvent::Kind::Succeeded: return "succeeded";
    case JobEvent::Kind::StoreLost: return "store lost";
  }
  return "?";
}

std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousOptions& options) {
  if (options.minNodes < 1 || options.maxNodes < options.minNodes)
    throw InvalidArgument("invalid --nnodes " + std::to_string(options.minNodes) + ":" +
                          std::to_string(options.maxNodes));
  if (options.localWorldSize < 1)
    throw InvalidArgument("invalid workers per node: " + std::to_string(options.localWorldSize));
  if (options.maxNodes == 1 && options.endpoint.host.empty())
    return makeSingleNodeRendezvous(options);
  switch (options.backend) {
    case RendezvousBackend::Static: return makeStaticRendezvous(options);
    case RendezvousBackend::C10d: return makeC10dRendezvous(options);
    case RendezvousBackend::Etcd: return makeEtcdRendezvous(options);
  }
  throw InvalidArgument("unknown rendezvous backend " + std::to_string(static_cast<int>(options.backend)));
}

}  // namespace drun::rdzv
