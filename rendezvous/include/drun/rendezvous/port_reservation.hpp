// PortReservation: a TCP port picked by the kernel and held, so that two jobs on one host never
// get the same MASTER_PORT (torchrun 1.13 binds port 0, closes it, and hopes).
//
// The socket is bound with SO_REUSEADDR and never listens: a worker's own server (torch's
// TCPStore, libdrun_comm's store) can still bind and listen on it, while the kernel's port-0
// selection for every other socket on the host skips it. Held until destruction. Move-only.
#pragma once

#include <cstdint>
#include <string>

namespace drun::rdzv {

class PortReservation {
 public:
  // Reserves a free port on `host` (an address; "" = any). Throws NetworkError.
  static PortReservation reserve(const std::string& host = {});
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
