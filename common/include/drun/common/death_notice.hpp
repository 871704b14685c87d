// A request this process leaves to be sent on its behalf once it is gone, SIGKILL included:
// the etcd rendezvous' lease revoke, so that the other agents see this agent gone at once
// rather than when its lease runs out. The rendezvous publishes it (and replaces it with each
// new lease); the job guard (agent/job_guard.hpp) hands it to its watchdog, a process that
// outlives drun, which sends it after drun died. A process alive does not send it: a clean exit
// ends its lease itself.
//
// What the watchdog can send is plain: one TCP request to numeric addresses (tried in order,
// until one answers with `expectReply` at the start of its reply), no TLS, no name lookup.
//
// Threading: thread-safe; the slot is process-wide (one rendezvous, one job guard per drun).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace drun {

struct DeathNotice {
  struct Address {
    std::string ip;  // numeric IPv4 or IPv6
    uint16_t port = 0;
  };
  std::vector<Address> addresses;
  std::string request;      // the bytes sent, whole (an HTTP request with "Connection: close")
  std::string expectReply;  // a reply starting so is an answer; any other: the next address
};

// Sets (or, with nullopt, clears) this process's notice.
void publishDeathNotice(std::optional<DeathNotice> notice);
// `sink` gets the current notice now and every later one, one call at a time, under the slot's
// lock (it must not block); null: none any more (no call runs once this returns).
void onDeathNotice(std::function<void(const std::optional<DeathNotice>&)> sink);

}  // namespace drun
