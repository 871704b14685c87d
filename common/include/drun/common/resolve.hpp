// Name resolution with a deadline. getaddrinfo() has none of its own: a DNS server that does not
// answer holds the caller for the resolver's whole timeout and retries (tens of seconds). Here the
// lookup runs on a detached thread and the caller waits at most `timeout`; a lookup given up on
// finishes in the background and frees its result. At most kMaxLookupsInFlight such lookups
// exist at once: beyond that, a lookup fails at once (a dead resolver cannot pile up threads).
//
// Threading: thread-safe. Ownership: the returned list belongs to the caller.
#pragma once

#include <netdb.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace drun::net {

struct AddrInfoFree {
  void operator()(addrinfo* list) const {
    if (list) ::freeaddrinfo(list);
  }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoFree>;

inline constexpr std::chrono::milliseconds kResolveTimeout{5000};
inline constexpr size_t kMaxLookupsInFlight = 16;

struct Resolved {
  AddrInfoList addresses;  // non-null on success
  std::string error;       // on failure: why, naming the host ("" on success)
  bool timedOut = false;   // the resolver did not answer within the deadline
  bool temporary = false;  // worth asking again: no answer in time, or EAI_AGAIN (a DNS server
                           // that failed for now), not a name that does not exist
};

// getaddrinfo(host, service, hints) within `timeout` (at least 1 ms). Never throws for a name
// that does not resolve: see Resolved::error.
Resolved resolve(const std::string& host, const std::string& service, const addrinfo& hints,
                 std::chrono::milliseconds timeout = kResolveTimeout);

}  // namespace drun::net
