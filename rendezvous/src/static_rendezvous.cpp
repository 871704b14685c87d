// The static rendezvous: every field of the round follows from this node's options.
#include "drun/rendezvous/static_rendezvous.hpp"

#include <unistd.h>

#include <climits>

#include "drun/common/error.hpp"

#include "local_job.hpp"

namespace drun::rdzv {
namespace {

class StaticRendezvous final : public LocalJob {
 public:
  explicit StaticRendezvous(const RendezvousOptions& options)
      : LocalJob(options.maxRestarts), options_(options) {
    const int nodes = options.maxNodes;
    if (options.minNodes != options.maxNodes)
      throw InvalidArgument("the static rendezvous needs a fixed --nnodes (got " +
                            std::to_string(options.minNodes) + ":" +
                            std::to_string(options.maxNodes) + "); use --rdzv-backend c10d");
    if (nodes < 1) throw InvalidArgument("--nnodes must be at least 1");
    if (!options.nodeRank)
      throw InvalidArgument("the static rendezvous needs --node-rank (0.." +
                            std::to_string(nodes - 1) + ")");
    if (*options.nodeRank < 0 || *options.nodeRank >= nodes)
      throw InvalidArgument("--node-rank " + std::to_string(*options.nodeRank) +
                            " out of range for --nnodes " + std::to_string(nodes));
    if (options.localWorldSize < 1 ||
        static_cast<long long>(nodes) * options.localWorldSize > INT_MAX)
      throw InvalidArgument("invalid workers per node: " + std::to_string(options.localWorldSize));
  }

  RoundResult next() override {
    const int nodes = options_.maxNodes;
    RoundResult r;
    beginRound(r);
    r.nodeRank = *options_.nodeRank;
    r.nodeCount = nodes;
    r.worldSize = nodes * options_.localWorldSize;
    r.rankOffset = r.nodeRank * options_.localWorldSize;
    r.masterAddr = options_.masterAddr.empty() ? "127.0.0.1" : options_.masterAddr;
    r.masterPort = options_.masterPort.value_or(kDefaultStaticMasterPort);
    // Only this node's own host is known; the others are named by rank.
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    for (int i = 0; i < nodes; ++i)
      r.hosts.push_back(i == r.nodeRank ? std::string(host) : "node" + std::to_string(i));
    return r;
  }

  void leave() override {}

 private:
  RendezvousOptions options_;
};

}  // namespace

std::unique_ptr<Rendezvous> makeStaticRendezvous(const RendezvousOptions& options) {
  return std::make_unique<StaticRendezvous>(options);
}

}  // namespace drun::rdzv
