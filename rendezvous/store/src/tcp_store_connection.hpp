// TcpStore::Connection: one socket to a StoreServer, its handshake, requests, pipelined batches
// and heartbeats (tcp_store_connection.cpp), and its connecting (tcp_store_connect.cpp). Internal
// to TcpStore (tcp_store.cpp); see tcp_store.hpp for the rules.
// Threading: calls one at a time (callMutex_); the heartbeat thread shares only the writes.
#pragma once

#include "drun/store/tcp_store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/common/resolve.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/common/owned_thread.hpp"

namespace drun::rdzv {
namespace tcp_store_detail {
// How much longer than the server's deadline the client waits for the server's timeout answer
// to a blocking call, so that the answer (not our own deadline) normally ends the call.
inline milliseconds replyGrace(milliseconds timeout) {
  return std::clamp(timeout / 10, milliseconds(500), milliseconds(5000));
}

inline constexpr milliseconds kMaxWireTimeout{0xfffffffeLL};

inline milliseconds clampTimeout(milliseconds t) { return std::clamp(t, milliseconds(0), kMaxWireTimeout); }

// An error text the server sent: it may quote a stored value another client wrote (escape
// sequences, a 4 KiB line): printed as it came, it could rewrite the user's terminal.
inline std::string serverText(const std::string& message) { return text::printable(message); }

inline std::string keyList(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += text::printable(keys[i], {128});  // keys of a Timeout reply come from the server
    if (out.size() > 1024 && i + 1 < keys.size()) {
      out += ", ... (" + std::to_string(keys.size() - i - 1) + " more)";
      break;
    }
  }
  return out + "]";
}

inline std::string errnoText(int err) { return std::strerror(err); }

// Waits for `events` on fd until the deadline; false on timeout.
// After this process was stopped and continued (SIGSTOP/SIGCONT: a debugger, a loaded node,
// the chaos driver), a deadline may have passed while nothing here ran — nor the store server's
// thread, when this process hosts it. poll() then returns a plain timeout (EINTR only at times),
// so the stop is seen by the clock: poll() waits in slices of kStallProbe, and one that returns
// kStallSlack later than asked means this process did not run meanwhile. Such a deadline gets
// kGraceAfterStop more, once, so that the peer can answer before the connection is declared lost.
inline constexpr milliseconds kGraceAfterStop{500};
inline constexpr milliseconds kStallProbe{250};
inline constexpr milliseconds kStallSlack{250};

inline bool pollUntil(int fd, short events, const Deadline& callDeadline) {
  using Clock = std::chrono::steady_clock;
  Deadline deadline = callDeadline;
  bool stopped = false;  // this process (perhaps) did not run for a while during the call
  bool graced = false;
  for (;;) {
    const milliseconds slice = std::min(deadline.remaining(), kStallProbe);
    pollfd p{fd, events, 0};
    const auto before = Clock::now();
    int n = ::poll(&p, 1, static_cast<int>(slice.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw NetworkError(std::string("poll: ") + errnoText(errno));
    if (n < 0 || Clock::now() - before > slice + kStallSlack) stopped = true;
    if (deadline.expired()) {
      if (!stopped || graced) return false;
      graced = true;
      deadline = Deadline(kGraceAfterStop);
    }
  }
}

}  // namespace tcp_store_detail
using namespace tcp_store_detail;  // the connection's helpers, in the three files of TcpStore

class TcpStore::Connection {
 public:
  explicit Connection(const TcpStoreOptions& options)
      : options_(options), endpoint_(options.endpoint.toString()) {
    if (options_.heartbeatInterval.count() > 0 && options_.leaseTimeout.count() > 0 &&
        options_.heartbeatInterval >= options_.leaseTimeout)
      throw InvalidArgument("TcpStore: heartbeatInterval (" +
                            std::to_string(options_.heartbeatInterval.count()) +
                            "ms) must be shorter than leaseTimeout (" +
                            std::to_string(options_.leaseTimeout.count()) + "ms)");
    Deadline deadline(clampTimeout(options_.connectTimeout));
    connectWithRetries(deadline);
    try {
      handshake(deadline);
    } catch (...) {
      ::close(fd_);
      throw;
    }
    if (options_.heartbeatInterval.count() > 0)
      heartbeat_ = spawnThreadWithSignalsBlocked([this] { heartbeatLoop(); });
  }

  ~Connection() {
    stopHeartbeats();
    ::close(fd_);
  }

  const std::string& endpoint() const { return endpoint_; }
  milliseconds lease() const { return lease_; }

  // shutdown(2), not close(2): the fd stays valid for a reader blocked on it in another thread,
  // which wakes up to EOF and reports the connection broken.
  void interrupt() { ::shutdown(fd_, SHUT_RDWR); }

  void stopHeartbeats();

  // Sends the request and returns its (Ok) response; error statuses become exceptions.
  // `timeout` is the blocking call's own timeout (0 for the others).
  wire::Response call(wire::Request& q, milliseconds timeout);

  // Pipelines the requests (none blocking): every frame in one write, then the answers in
  // order, each Ok or its error in `answers[i].second`. A request that does not encode is not
  // sent (its error is its answer). NetworkError / ProtocolError: the connection is lost.
  // `onAnswer(i, response, failure)` is called for each request as its answer comes (in order;
  // for one not sent, with its encoding error), so that what came before a lost connection is
  // known.
  using OnAnswer = std::function<void(size_t, wire::Response&, std::exception_ptr)>;
  void callPipelined(std::vector<wire::Request>& requests, const OnAnswer& onAnswer);

  // The answer to a request whose shape is not that of its op: the peer is not a sound store.
  [[noreturn]] void malformed(const wire::Request& q, const std::string& why);

 private:
  // An error status as the exception the call throws (null for Ok).
  std::exception_ptr failureOf(const wire::Response& p, const wire::Request& q,
                               milliseconds timeout, Clock::time_point started);

  // ---- connecting

  void connectWithRetries(const Deadline& deadline);

  bool tryConnect(const Deadline& deadline, std::string& error);

  void handshake(const Deadline& deadline);

  // Reads one handshake message: `decode` answers NeedMore until it is whole.
  template <class Decode>
  void readHandshake(Decode decode, const Deadline& deadline, const char* what);

  // ---- bytes

  // Reads what is available into in_; throws NetworkError on EOF/error.
  void receive();

  void writeAll(std::string_view data, const Deadline& deadline, const wire::Request& q);

  wire::Response readResponse(const wire::Request& q, const Deadline& deadline,
                              milliseconds budget);

  void markBroken(const std::string& why);

  std::string brokenText();

  // ---- heartbeats

  void heartbeatLoop();

  TcpStoreOptions options_;
  std::string endpoint_;
  int fd_ = -1;
  int lastErrno_ = 0;  // errno of the latest failed connect attempt
  milliseconds lease_{0};
  wire::ReceiveBuffer in_;  // under callMutex_ (or the constructor)
  uint64_t lastId_ = 0;     // under callMutex_
  std::mutex callMutex_;    // one request in flight per connection
  std::mutex writeMutex_;   // frames go out whole: calls and heartbeats
  std::atomic<bool> broken_{false};
  std::mutex brokenMutex_;
  std::string brokenReason_;
  std::thread heartbeat_;
  std::mutex heartbeatMutex_;
  std::condition_variable heartbeatCv_;
  bool stopHeartbeat_ = false;
};

}  // namespace drun::rdzv
