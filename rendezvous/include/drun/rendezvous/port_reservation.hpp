// PortReservation: a TCP port picked by the kernel and held while a round forms, so that two
// jobs on one host never get the same MASTER_PORT while they wait for their nodes.
//
// The socket is bound with SO_REUSEADDR and never listens: while it is held, the kernel's port-0
// selection for every other socket on the host skips the port, and a server that sets
// SO_REUSEADDR (torch's TCPStore, libdrun_comm's store) can still bind it — but a program that
// binds without SO_REUSEADDR gets EADDRINUSE. So the rendezvous releases it once the round is
// formed, just before the workers start (README, "MASTER_PORT": the window this leaves, measured
// by scripts/bench/master_port.py, is the worker's start-up; torchrun 1.13 leaves the same one).
// Move-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace drun::rdzv {

class PortReservation {
 public:
  // Reserves a free port on `host` (an address; "" = any). Throws NetworkError.
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
