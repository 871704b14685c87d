#include "drun/common/resolve.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "drun/common/parked_threads.hpp"

namespace drun::net {
namespace {

std::atomic<size_t> lookupsInFlight{0};

// Shared by the caller and the lookup thread; whoever is last frees it.
struct Lookup {
  std::string host, service;
  addrinfo hints{};
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  bool abandoned = false;  // the caller gave up: the thread frees the result
  int status = 0;
  addrinfo* result = nullptr;
};

void runLookup(const std::shared_ptr<Lookup>& lookup) {
  addrinfo* result = nullptr;
  const char* service = lookup->service.empty() ? nullptr : lookup->service.c_str();
  int status = ::getaddrinfo(lookup->host.c_str(), service, &lookup->hints, &result);
  {
    std::lock_guard lock(lookup->mutex);
    lookup->finished = true;
    lookup->status = status;
    if (lookup->abandoned) {
      if (status == 0) ::freeaddrinfo(result);
    } else {
      lookup->result = status == 0 ? result : nullptr;
    }
  }
  lookup->done.notify_all();
  lookupsInFlight--;
}

}  // namespace

Resolved resolve(const std::string& host, const std::string& service, const addrinfo& hints,
                 std::chrono::milliseconds timeout) {
  Resolved out;
  const std::string who = "cannot resolve '" + host + "'";
  if (lookupsInFlight.fetch_add(1) >= kMaxLookupsInFlight) {
    lookupsInFlight--;
    out.error = who + ": " + std::to_string(kMaxLookupsInFlight) +
                " lookups are already waiting for the resolver (it does not answer)";
    out.timedOut = out.temporary = true;
    return out;
  }
  auto lookup = std::make_shared<Lookup>();
  lookup->host = host;
  lookup->service = service;
  lookup->hints = hints;
  lookup->hints.ai_next = nullptr;
  // The lookup's thread: joined here once it answered, parked (parked_threads.hpp) when it did
  // not answer in time; getaddrinfo has no deadline of its own.
  OwnedThread thread;
  try {
    thread = OwnedThread("resolver lookup", [lookup] { runLookup(lookup); });
  } catch (const std::system_error& e) {
    lookupsInFlight--;
    out.error = who + ": no thread for the lookup: " + e.what();
    return out;
  }
  std::unique_lock lock(lookup->mutex);
  const auto deadline = std::chrono::steady_clock::now() + std::max(timeout, std::chrono::milliseconds(1));
  if (!lookup->done.wait_until(lock, deadline, [&] { return lookup->finished; })) {
    lookup->abandoned = true;
    lock.unlock();
    parkUntilExit(std::move(thread));
    out.timedOut = out.temporary = true;
    out.error = who + ": the resolver did not answer within " + std::to_string(timeout.count()) +
                "ms (check /etc/resolv.conf and the DNS server)";
    return out;
  }
  lock.unlock();
  thread.join(OwnedThread::kDefaultJoinBound);  // it has answered: it ends at once
  if (lookup->status != 0) {
    out.error = who + ": " + ::gai_strerror(lookup->status);
    out.temporary = lookup->status == EAI_AGAIN;
    return out;
  }
  out.addresses.reset(lookup->result);
  lookup->result = nullptr;
  return out;
}

}  // namespace drun::net
