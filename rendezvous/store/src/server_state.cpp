#include "server_state.hpp"

namespace drun::rdzv::server {
namespace {

std::string mib(size_t bytes) {
  return bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                 : std::to_string(bytes) + " bytes";
}

StoreBudget storeBudget(const StoreServerOptions& o) {
  StoreBudget b;
  b.maxStoredBytes = o.maxStoredBytes;
  b.maxStoredBytesPerJob = o.maxStoredBytesPerJob;
  b.jobRoot = o.orphanRoot;
  return b;
}

}  // namespace

wire::Response answer(wire::Op op, uint64_t id, wire::Status status) {
  wire::Response r;
  r.op = op;
  r.id = id;
  r.status = status;
  return r;
}

ByteBudget::ByteBudget(size_t total, std::string totalOption, size_t perConnection,
                       std::string perConnectionOption)
    : total_(total),
      perConnection_(perConnection),
      totalOption_(std::move(totalOption)),
      perConnectionOption_(std::move(perConnectionOption)) {}

std::string ByteBudget::overBy(size_t held, size_t more) const {
  if (held + more > perConnection_)
    return std::to_string(held + more) + " bytes on this connection, over the limit " +
           perConnectionOption_ + " of " + mib(perConnection_);
  if (used_ + more > total_)
    return std::to_string(used_ + more) + " bytes on all connections, over the limit " +
           totalOption_ + " of " + mib(total_);
  return "";
}

ServerState::ServerState(const StoreServerOptions& o)
    : options(o),
      core(o.limits, storeBudget(o)),
      input(o.maxInputBytes, "maxInputBytes", o.maxInputBytesPerConnection,
            "maxInputBytesPerConnection"),
      output(o.maxOutputBytes, "maxOutputBytes", o.maxOutputQueueBytes, "maxOutputQueueBytes"),
      calls(o.maxCallBytes, "maxCallBytes", o.maxCallBytesPerConnection,
            "maxCallBytesPerConnection") {
  wireLimits.store = o.limits;
  wireLimits.maxFrameBytes = o.maxFrameBytes;
}

std::string ServerState::refusal(const std::string& address) const {
  if (seats >= options.maxConnections)
    return "at the limit of " + std::to_string(options.maxConnections) + " connections";
  auto it = seatsByAddress.find(address);
  if (it != seatsByAddress.end() && it->second >= options.maxConnectionsPerPeer)
    return "at the limit of " + std::to_string(options.maxConnectionsPerPeer) +
           " connections from one address";
  return "";
}

Seat::Seat(ServerState& state, std::string address) : state_(state), address_(std::move(address)) {
  ++state_.seats;
  ++state_.seatsByAddress[address_];
}

Seat::~Seat() {
  --state_.seats;
  if (auto it = state_.seatsByAddress.find(address_); it != state_.seatsByAddress.end() && --it->second == 0)
    state_.seatsByAddress.erase(it);
}

}  // namespace drun::rdzv::server
