// TcpStore: the Store client of StoreServer (drun-rendezvous or the agent's embedded server),
// speaking the wire protocol of protocol.hpp over one TCP connection.
//
// Connecting retries with exponential backoff and jitter until options.connectTimeout (the
// server may start after its clients); NetworkError when the last attempt was refused (the host
// is up, nothing serves the port), TimeoutError when nothing answered. Each call has one deadline: blocking calls (get, wait,
// multiGet, watch) use the timeout they are given, the others options.timeout; the server
// answers a blocking call at its deadline, so a timed-out call leaves the connection usable,
// while a call with no reply at all by its deadline (plus a grace) marks the connection lost
// (NetworkError): a cut link sends no reset, and that is how a client notices it.
// Errors name the server, the keys and the time waited: TimeoutError, NetworkError (connection
// refused/lost; the client does not reconnect by itself, since the server has already run this
// connection's will), ProtocolError (the peer does not speak this protocol), InvalidArgument
// (a key/value over the limits, add on a non-integer value).
//
// Liveness: while connected, a background thread sends a heartbeat every heartbeatInterval,
// also while a call is blocked; the server expires a connection silent for leaseTimeout and then
// runs its will, as it does when the connection closes.
//
// Threading: thread-safe; calls from several threads run one at a time on the connection.
// Ownership: owns the socket and the heartbeat thread; the destructor closes the connection
// (which makes the server run the will).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "drun/common/host_port.hpp"
#include "drun/common/progress.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

using namespace std::chrono_literals;

struct TcpStoreOptions {
  HostPort endpoint{"127.0.0.1", 29400};  // the server to connect to; IPv6 without brackets
  milliseconds connectTimeout = 60s;    // keep retrying the connect this long
  milliseconds timeout = 300s;          // deadline of a call that takes none (set, add, ...)
  milliseconds heartbeatInterval = 1s;  // 0 = send no heartbeats (tests of lease expiry)
  milliseconds leaseTimeout = 5s;       // server drops us after this much silence; 0 = server default
  // How long after a blocking call's own timeout the client still waits for the server's answer
  // before it takes the connection for lost. 0: 10% of the timeout, 0.5-5 s. The membership
  // watcher sets more: a store host paused that long (a GC pause, a loaded node) is not lost.
  milliseconds replyGrace = 0ms;
  ProgressSink onConnectWait;           // a connect still retrying is said here, at this pace
  milliseconds progressInterval = 30s;
  // The store's shared secret ("" = none; token_file.hpp reads it). With one, the client proves
  // it in the hello and the server must prove it back: a store that does not is not used.
  std::string token;
  std::string scope;  // the run id this client works for: a server with per-job tokens needs it
  // How the user gives the token, for the error when the store asks for one and there is none.
  std::string tokenHint = "--rdzv-conf token_file=PATH or DRUN_RDZV_TOKEN_FILE";
};

class TcpStore final : public LivenessStore {
 public:
  // Connects (with retries until connectTimeout) and performs the version handshake.
  // Throws TimeoutError (nothing accepted the connection in time), ProtocolError (not a drun
  // store or another version), InvalidArgument (heartbeatInterval >= leaseTimeout), AuthError
  // (a wrong or missing token, on either side), NetworkError (refused: at its connection limit).
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // options.endpoint as "host:port" ("[v6]:port"), as used in error messages.
  const std::string& endpoint() const;
  // The lease the server granted this connection.
  milliseconds leaseTimeout() const;
  // Stops sending heartbeats (the connection stays open): the server expires it after the lease.
  void stopHeartbeatsForTest();
  void interrupt() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, milliseconds timeout) override;
  std::optional<Bytes> tryGet(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, milliseconds timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;
  std::optional<Bytes> watch(const std::string& key, const std::optional<Bytes>& known,
                             milliseconds timeout) override;
  void setWill(const Will& will) override;
  int64_t deletePrefix(const std::string& prefix) override;
  // Pipelined: every operation in one write, the answers in order (one round trip).
  void runBatch(StoreBatch& batch) override;
  // The run ids of the jobs with keys in the store (drun status). A server older than this op
  // closes the connection (ProtocolError); a client of one job is refused (InvalidArgument).
  std::vector<std::string> listJobs();

 private:
  class Connection;
  std::unique_ptr<Connection> conn_;
};

}  // namespace drun::rdzv
