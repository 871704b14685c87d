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
  explicit SingleNodeRendezvous(const RendezvousOptions& options) : options_(options) {}

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
      // Keep the port of the first round across restarts: the reservation still holds it, and
      // workers that cache MASTER_PORT (or a store left in TIME_WAIT) keep working.
      if (reservation_.port() == 0) reservation_ = PortReservation::reserve(r.masterAddr);
      r.masterPort = reservation_.port();
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    r.hosts = {host};
    return r;
  }

  void leave() override { reservation_.release(); }

 private:
  RendezvousOptions options_;
  PortReservation reservation_;
};

}  // namespace

std::unique_ptr<Rendezvous> makeSingleNodeRendezvous(const RendezvousOptions& options) {
  return std::make_unique<SingleNodeRendezvous>(options);
}

}  // namespace drun::rdzv
