// Reconnector: after this node lost the store (fencing already stopped its workers), connects
// again within reconnect_timeout (--rdzv-conf reconnect_timeout, counted from the loss). A store
// that refuses connections may be restarting (an upgrade, a systemd restart of drun-rendezvous,
// the embedded store's host restarting its agent), and one that does not answer may come back
// (a cut link): both are retried until the window ends, with a progress line every
// kReconnectProgress ("rendezvous store at H:P unreachable for 5s; retrying for 25s more (--rdzv-conf
// reconnect_timeout 30s)"). Then
// TimeoutError naming the store and the window. A store that answers but refuses this client
// (token, protocol version) is not retried.
//
// Threading: called on the rendezvous' agent thread; each connect has its own deadline.
#pragma once

#include <functional>
#include <memory>

#include "c10d_node.hpp"

namespace drun::rdzv {

inline constexpr milliseconds kReconnectProgress{5000};

std::unique_ptr<LivenessStore> reconnect(
    const std::function<std::unique_ptr<LivenessStore>()>& connect, const C10dNode& node,
    Clock::time_point lostAt);

}  // namespace drun::rdzv
