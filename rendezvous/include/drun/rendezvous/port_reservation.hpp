// PortReservation: a TCP port picked by the kernel and held while a round forms, so that two
// jobs on one host never get the same MASTER_PORT while they wait for their nodes.
//
// The socket is bound without SO_REUSEADDR and never listens: the kernel picks a port that nothing
// uses (not even a connection in TIME_WAIT, which would make a later plain bind fail), and while it
// is held no other socket gets it. Held, it would also refuse the worker's own server, so the
// rendezvous releases it once the round is formed, just before the workers start (README,
// "MASTER_PORT": the window this leaves, measured by scripts/bench/master_port.py, is the worker's
// start-up; torchrun 1.13 leaves the same one). Move-only.
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
