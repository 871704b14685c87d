// The nnodes=1 rendezvous: the round is this node alone; nothing touches the network except the
// MASTER_PORT reservation.
#include <unistd.h>

#include "drun/rendezvous/port_reservation.hpp"
#include "drun/rendezvous/rendezvous.hpp"

#include "local_job.hpp"

namespace drun::rdzv {
namespace {

class SingleNodeRendezvous final : public LocalJob {
 public:
  explicit SingleNodeRendezvous(const RendezvousOptions& options)
      : LocalJob(options.maxRestarts), options_(options) {}

  RoundResult next() override {
    RoundResult r;
    beginRound(r);
    r.nodeRank = 0;
    r.nodeCount = 1;
    r.worldSize = options_.localWorldSize;
    r.rankOffset = 0;
    r.masterAddr = options_.masterAddr.empty() ? "127.0.0.1" : options_.masterAddr;
    if (options_.masterPort) {
      r.masterPort = *options_.masterPort;
    } else {
      // The same port across restarts when it is still free (workers that cache MASTER_PORT
      // keep working), released before the workers start: any program can bind it.
      auto same = port_ ? PortReservation::tryReserve(r.masterAddr, port_) : std::nullopt;
      PortReservation reservation = same ? std::move(*same) : PortReservation::reserve(r.masterAddr);
      port_ = reservation.port();
      r.masterPort = port_;
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    r.hosts = {host};
    return r;
  }

  void leave() override {}

 private:
  RendezvousOptions options_;
  uint16_t port_ = 0;  // the previous round's MASTER_PORT
};

}  // namespace

std::unique_ptr<Rendezvous> makeSingleNodeRendezvous(const RendezvousOptions& options) {
  return std::make_unique<SingleNodeRendezvous>(options);
}

}  // namespace drun::rdzv
