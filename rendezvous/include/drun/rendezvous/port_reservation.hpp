// PortReservation: a TCP port held while a round forms, so that two jobs on one host never get
// the same MASTER_PORT while they wait for their nodes.
//
// The socket is bound without SO_REUSEADDR and never listens: a port is taken only when nothing
// uses it (not even a connection in TIME_WAIT, which would make a later plain bind fail), and
// while it is held no other socket gets it. Held, it would also refuse the worker's own server, so
// the rendezvous releases it once the round is formed, just before the workers start
// (docs/multinode.md, "MASTER_PORT: held or released"). The port is drawn from outside the
// kernel's ephemeral range: in the window from the release to the worker's bind, no connect() and
// no bind to port 0 anywhere on the host can be handed it, only a program that names that very
// port (scripts/bench/master_port.py measures it).
// Move-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace drun::rdzv {

struct PortRange {
  uint16_t first = 0;
  uint16_t last = 0;  // inclusive
};

// The lowest port MASTER_PORT is drawn from: above the rendezvous ports drun derives under SLURM
// (20000..27999, launcher/slurm_env.hpp), so a job's MASTER_PORT never takes a later step's.
inline constexpr uint16_t kLowestMasterPort = 28000;
// Never drawn: the c10d rendezvous endpoint's default port and the static backend's MASTER_PORT.
inline constexpr uint16_t kWellKnownPorts[] = {29400, 29500};

// The ports reserve() draws from: [kLowestMasterPort, 65535] less the kernel's ephemeral range,
// kWellKnownPorts and the ports the administrator reserved (net.ipv4.ip_local_reserved_ports). Pure; may be empty.
std::vector<PortRange> masterPortRanges(PortRange ephemeral, const std::vector<PortRange>& reserved);

// Parses ip_local_reserved_ports' list ("8080,9000-9010"): the ranges it names. Malformed entries
// are skipped: the list comes from /proc and only steers the choice.
std::vector<PortRange> parsePortList(const std::string& text);

class PortReservation {
 public:
  // Reserves a free port on `host` (an address; "" = any), drawn at random from
  // masterPortRanges(); a port the kernel picks when none of a bounded number of draws is free.
  // Throws NetworkError.
  static PortReservation reserve(const std::string& host = {});
  // A fresh port other than `avoid` (the previous round's: ranks of an old round can never
  // reach the new round's store by it). Throws NetworkError.
  static PortReservation reserveOtherThan(const std::string& host, uint16_t avoid);
  // Exactly `port`, or nullopt when something else holds it now.
  static std::optional<PortReservation> tryReserve(const std::string& host, uint16_t port);
  PortReservation() = default;
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  ~PortReservation();

  uint16_t port() const { return port_; }
  void release();

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace drun::rdzv
