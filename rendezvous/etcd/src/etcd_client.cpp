// EtcdClient: the gateway's JSON calls, failover between members and auth (etcd_client.hpp).
#include "drun/etcd/etcd_client.hpp"

#include <algorithm>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_call_counts.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/safe_text.hpp"
#include "etcd_http.hpp"
#include "etcd_json.hpp"

namespace drun::rdzv {
namespace {

using etcd::Json;

constexpr uint16_t kDefaultEtcdPort = 2379;
constexpr int64_t kGrpcInvalidArgument = 3;
constexpr int64_t kGrpcPermissionDenied = 7;
constexpr int64_t kGrpcUnavailable = 14;
constexpr int64_t kGrpcUnauthenticated = 16;
constexpr unsigned kHttpServiceUnavailable = 503;  // the gateway's status for UNAVAILABLE

// Printable ASCII without spaces: what a host name or a token may hold.
bool isPlainText(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// One member: "h1", "h1:2379", "[::1]:2379", with an optional http:// or https:// (the scheme is
// etcdctl's spelling; https is chosen by etcd_cacert).
etcd::Endpoint splitEndpoint(const std::string& item) {
  std::string_view text = item;
  for (std::string_view scheme : {"http://", "https://"})
    if (text.starts_with(scheme)) text.remove_prefix(scheme.size());
  return HostPort::parse(text, {"etcd endpoint", kDefaultEtcdPort});
}

std::string compareTarget(EtcdCompare::Target target) {
  switch (target) {
    case EtcdCompare::Target::Value: return "VALUE";
    case EtcdCompare::Target::CreateRevision: return "CREATE";
    case EtcdCompare::Target::ModRevision: return "MOD";
    case EtcdCompare::Target::Version: return "VERSION";
  }
  return "VALUE";
}

// The lease a put with none of its own is bound to (EtcdClientOptions::keyLease).
struct KeyLease {
  int64_t lease = 0;
  std::string prefix;
  int64_t of(const std::string& key, int64_t own) const {
    return own != 0 || lease == 0 || !key.starts_with(prefix) ? own : lease;
  }
};

Json encodeTxn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
               const std::vector<EtcdOp>& failure, const KeyLease& keyLease);

Json encodeOp(const EtcdOp& op, const KeyLease& keyLease) {
  if (op.kind == EtcdOp::Kind::Txn)
    return {{"request_txn", encodeTxn(op.nested->compares, op.nested->success, op.nested->failure, keyLease)}};
  Json request;
  request["key"] = etcd::base64Encode(op.key);
  if (op.kind == EtcdOp::Kind::Put) {
    request["value"] = etcd::base64Encode(op.value);
    if (const int64_t lease = keyLease.of(op.key, op.lease)) request["lease"] = std::to_string(lease);
    return {{"request_put", request}};
  }
  if (!op.rangeEnd.empty()) request["range_end"] = etcd::base64Encode(op.rangeEnd);
  return {{op.kind == EtcdOp::Kind::Range ? "request_range" : "request_delete_range", request}};
}

Json encodeCompare(const EtcdCompare& c) {
  Json out{{"key", etcd::base64Encode(c.key)},
           {"result", c.result == EtcdCompare::Result::Less ? "LESS" : "EQUAL"},
           {"target", compareTarget(c.target)}};
  if (!c.rangeEnd.empty()) out["range_end"] = etcd::base64Encode(c.rangeEnd);
  switch (c.target) {
    case EtcdCompare::Target::Value: out["value"] = etcd::base64Encode(c.value); break;
    case EtcdCompare::Target::CreateRevision: out["create_revision"] = std::to_string(c.number); break;
    case EtcdCompare::Target::ModRevision: out["mod_revision"] = std::to_string(c.number); break;
    case EtcdCompare::Target::Version: out["version"] = std::to_string(c.number); break;
  }
  return out;
}

Json encodeTxn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
               const std::vector<EtcdOp>& failure, const KeyLease& keyLease) {
  Json body = Json::object();
  body["compare"] = Json::array();
  body["success"] = Json::array();
  body["failure"] = Json::array();
  for (const EtcdCompare& c : compares) body["compare"].push_back(encodeCompare(c));
  for (const EtcdOp& op : success) body["success"].push_back(encodeOp(op, keyLease));
  for (const EtcdOp& op : failure) body["failure"].push_back(encodeOp(op, keyLease));
  return body;
}

// A txn reply (`nested`: one inside another's, without a header of its own), checked against
// the branch it names: as many range, delete and txn responses as the branch has such ops.
EtcdTxnResult parseTxn(const Json& parsed, const std::vector<EtcdOp>& success, const std::vector<EtcdOp>& failure,
                       bool nested) {
  EtcdTxnResult out;
  out.succeeded = etcd::boolField(parsed, "succeeded");
  if (!nested) out.revision = etcd::headerRevision(parsed);
  const std::vector<EtcdOp>& branch = out.succeeded ? success : failure;
  std::vector<const EtcdOp*> txns;
  for (const EtcdOp& op : branch)
    if (op.kind == EtcdOp::Kind::Txn) txns.push_back(&op);
  for (const Json& response : etcd::arrayField(parsed, "responses")) {
    if (!response.is_object()) throw ProtocolError("a txn response is not an object");
    if (response.contains("response_range")) {
      out.ranges.push_back(etcd::parseRange(etcd::objectField(response, "response_range")));
    } else if (response.contains("response_delete_range")) {
      out.deletedBy.push_back(etcd::intField(etcd::objectField(response, "response_delete_range"), "deleted"));
    } else if (response.contains("response_txn")) {
      if (out.nested.size() >= txns.size()) throw ProtocolError("more txn responses than txn ops");
      const EtcdNestedTxn& inner = *txns[out.nested.size()]->nested;
      out.nested.push_back(parseTxn(etcd::objectField(response, "response_txn"), inner.success, inner.failure, true));
    }
  }
  auto count = [&](EtcdOp::Kind kind) {
    return static_cast<size_t>(std::count_if(branch.begin(), branch.end(), [&](const EtcdOp& op) { return op.kind == kind; }));
  };
  if (out.ranges.size() != count(EtcdOp::Kind::Range) || out.deletedBy.size() != count(EtcdOp::Kind::DeleteRange) ||
      out.nested.size() != txns.size())
    throw ProtocolError("expected " + std::to_string(count(EtcdOp::Kind::Range)) + " range, " +
                        std::to_string(count(EtcdOp::Kind::DeleteRange)) + " delete and " +
                        std::to_string(txns.size()) + " txn responses, got " + std::to_string(out.ranges.size()) +
                        ", " + std::to_string(out.deletedBy.size()) + " and " + std::to_string(out.nested.size()));
  for (int64_t n : out.deletedBy) out.deleted += n;
  return out;
}

}  // namespace

std::vector<std::string> parseEtcdEndpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string item = list.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) {
      out.push_back(splitEndpoint(item).toString());
    }
    start = comma + 1;
  }
  if (out.empty()) throw InvalidArgument("no etcd endpoint in '" + list + "' (want host:port[,host:port...])");
  return out;
}

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw InvalidArgument("etcd client: no endpoint");
  for (const std::string& item : options_.endpoints)
    connections_.push_back(std::make_unique<etcd::EtcdConnection>(
        splitEndpoint(item), options_.caFile, etcd::keepAliveProbesFor(options_.silentPeerTimeout),
        !options_.readsFromAnyMember));
  // Clients start on a random member: N agents spread their load over the cluster (each member
  // serves its clients' JSON gateway; raft proposals go to the leader either way).
  current_ = std::random_device{}() % connections_.size();
}

EtcdClient::~EtcdClient() = default;

void EtcdClient::interrupt(const std::string& why) {
  {
    std::lock_guard lock(reasonMutex_);
    if (interruptReason_.empty()) interruptReason_ = why;
  }
  interrupted_ = true;
  for (auto& connection : connections_) connection->interrupt();
}

NetworkError EtcdClient::interruptedError(const std::string& what) const {
  std::lock_guard lock(reasonMutex_);
  return NetworkError(what + ": interrupted" + (interruptReason_.empty() ? "" : ": " + interruptReason_));
}

std::string EtcdClient::endpointName() const {
  std::lock_guard lock(mutex_);
  return connections_[current_]->endpoint().toString();
}

std::string EtcdClient::prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

void EtcdClient::authenticate(etcd::EtcdConnection& connection, const Deadline& deadline) {
  const Json body{{"name", options_.user}, {"password", options_.password}};
  countEtcdRequest("/v3/auth/authenticate");
  const etcd::HttpReply reply = connection.post("/v3/auth/authenticate", body.dump(), "", deadline);
  const std::string what = "etcd " + connection.endpoint().toString() + ": /v3/auth/authenticate";
  const Json parsed = etcd::parseObject(reply.body, what);
  if (reply.status != 200)
    throw AuthError(what + ": user '" + options_.user + "' refused: " + etcd::errorMessage(parsed));
  auto it = parsed.find("token");
  if (it == parsed.end() || !it->is_string() || it->get<std::string>().empty() ||
      !isPlainText(it->get<std::string>()))
    throw ProtocolError(what + ": malformed reply (no token)");
  token_ = it->get<std::string>();
}

void EtcdClient::closeConnectionsPeersClosed() {
  for (const auto& connection : connections_)
    if (connection->closeIfPeerClosed())
      spdlog::debug("etcd {}: the member closed the kept connection; closed here too",
                    connection->endpoint().toString());
}

std::string EtcdClient::call(const std::string& path, const std::string& body,
                             const Deadline& deadline, bool idempotent) {
  std::lock_guard lock(mutex_);
  closeConnectionsPeersClosed();
  std::string lastError = "no attempt";
  bool lastWasTimeout = false;
  bool renewedToken = false;
  const auto started = Clock::now();
  // Per member, whether its last answer in this call was UNAVAILABLE (HTTP 503, gRPC code 14:
  // it has no leader, or its leader reaches no quorum): with no member serving, that is a
  // cluster without a quorum, which the error says in words.
  std::vector<bool> unavailable(connections_.size(), false);
  // The call's end: the last member's failure decides the kind (a member silent for its whole
  // attempt: TimeoutError; every member refusing or failing: NetworkError).
  auto giveUp = [&] {
    const auto noLeader = static_cast<size_t>(std::count(unavailable.begin(), unavailable.end(), true));
    std::string text = "etcd " + path + " got no answer within " +
                       std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - started).count()) +
                       "ms from any member";
    if (noLeader > 0)
      text += ": etcd has no quorum (" + std::to_string(noLeader) + " of " + std::to_string(connections_.size()) +
              " member(s) answered that they have no leader" +
              (noLeader < connections_.size() ? ", the others did not answer" : "") +
              "; a majority of the members must be up and reach each other)";
    text += "; last: " + lastError;
    if (lastWasTimeout) throw TimeoutError(text);
    throw NetworkError(text);
  };
  for (int pass = 0;; ++pass) {
    const size_t first = current_;
    for (size_t k = 0; k < connections_.size(); ++k) {
      const size_t i = (first + k) % connections_.size();
      etcd::EtcdConnection& connection = *connections_[i];
      const std::string what = "etcd " + connection.endpoint().toString() + ": " + path;
      if (interrupted_) throw interruptedError(what);
      if (deadline.expired()) giveUp();
      const Deadline attempt = Deadline::at(std::min(deadline.when(), Clock::now() + options_.attemptTimeout));
      bool sent = false;
      try {
        if (!options_.user.empty() && token_.empty()) authenticate(connection, attempt);
        countEtcdRequest(path);
        const etcd::HttpReply reply = connection.post(path, body, token_, attempt, &sent);
        // Each call and its time (DRUN_LOG_LEVEL=trace): what the rendezvous costs on etcd.
        spdlog::trace("etcd {} {}: HTTP {} in {} us", connection.endpoint().toString(), path, reply.status,
                      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count());
        unavailable[i] = false;
        if (reply.status == 200) {
          current_ = i;
          return reply.body;
        }
        const Json error = etcd::parseObject(reply.body, what + " (HTTP " + std::to_string(reply.status) + ")");
        const int64_t code = etcd::intField(error, "code");
        const std::string message = etcd::errorMessage(error);
        if (code == kGrpcUnauthenticated && !options_.user.empty() && !renewedToken) {
          token_.clear();  // expired: once more with a new one
          renewedToken = true;
          --k;
          continue;
        }
        if (code == kGrpcUnavailable || reply.status == kHttpServiceUnavailable) {
          unavailable[i] = true;
          // "no leader" is refused before the call reaches raft (the require-leader check):
          // nothing was applied, so even a write may go to another member.
          const bool refusedUnapplied = message.find("no leader") != std::string::npos;
          if (!idempotent && !refusedUnapplied)
            throw NetworkError(what + ": unavailable, outcome unknown: " + message);
          lastError = what + ": " + message;
          lastWasTimeout = false;
          continue;
        }
        if (code == kGrpcInvalidArgument) throw InvalidArgument(what + ": " + message);
        if (code == kGrpcUnauthenticated || code == kGrpcPermissionDenied)
          throw AuthError(what + ": " + message);
        throw EtcdError(what + " refused (code " + std::to_string(code) + "): " + message, code);
      } catch (const TimeoutError& e) {
        unavailable[i] = false;
        current_ = (i + 1) % connections_.size();  // the next call starts on another member
        // A write sent to a member that then went silent (killed, cut off) has an unknown
        // outcome: the connection's failure, not a wait that ran out, so NetworkError, which the
        // rendezvous answers by joining afresh on a new session (CI: the etcd leader killed
        // while a join's txn was in flight ended the agent with "txn timed out").
        if (sent && !idempotent) throw NetworkError(std::string(e.what()) + " (outcome unknown)");
        lastError = e.what();
        lastWasTimeout = true;
      } catch (const NetworkError& e) {
        unavailable[i] = false;
        current_ = (i + 1) % connections_.size();
        if (interrupted_) throw interruptedError(what);
        if (sent && !idempotent) throw;
        lastError = e.what();
        lastWasTimeout = false;
      }
    }
    if (options_.singlePass) giveUp();
    // Every member failed once: a short pause (a leader election takes about a second). A pause
    // that would reach the deadline ends the call now: the pass after it would start with no
    // time, and its attempt's "timed out" would replace the members' real failure (every member
    // refusing read as TimeoutError, 1 call in ~8 of the etcd failover test once all were killed).
    const milliseconds pause(50 << std::min(pass, 3));
    if (deadline.remaining() <= pause) giveUp();
    std::this_thread::sleep_for(pause);
  }
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  Json body{{"key", etcd::base64Encode(key)}, {"value", etcd::base64Encode(value)}};
  if (const int64_t bound = KeyLease{options_.keyLease, options_.keyLeasePrefix}.of(key, lease))
    body["lease"] = std::to_string(bound);
  const std::string reply = call("/v3/kv/put", body.dump(), Deadline(options_.callTimeout), true);
  return etcd::headerRevision(etcd::parseObject(reply, "etcd /v3/kv/put"));
}

EtcdRange EtcdClient::range(const std::string& key, const std::string& rangeEnd, bool countOnly,
                            bool keysOnly, int64_t revision) {
  Json body{{"key", etcd::base64Encode(key)}};
  if (revision > 0) body["revision"] = std::to_string(revision);
  if (!rangeEnd.empty()) body["range_end"] = etcd::base64Encode(rangeEnd);
  if (countOnly) body["count_only"] = true;
  if (keysOnly) body["keys_only"] = true;
  if (options_.readsFromAnyMember) body["serializable"] = true;
  const std::string reply = call("/v3/kv/range", body.dump(), Deadline(options_.callTimeout), true);
  try {
    return etcd::parseRange(etcd::parseObject(reply, "etcd /v3/kv/range"));
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string("etcd /v3/kv/range: malformed reply: ") + e.what());
  }
}

int64_t EtcdClient::deleteRange(const std::string& key, const std::string& rangeEnd) {
  Json body{{"key", etcd::base64Encode(key)}};
  if (!rangeEnd.empty()) body["range_end"] = etcd::base64Encode(rangeEnd);
  const std::string reply = call("/v3/kv/deleterange", body.dump(), Deadline(options_.callTimeout), true);
  return etcd::intField(etcd::parseObject(reply, "etcd /v3/kv/deleterange"), "deleted");
}

EtcdTxnResult EtcdClient::txn(const std::vector<EtcdCompare>& compares,
                              const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure, bool idempotent) {
  const Json body = encodeTxn(compares, success, failure, {options_.keyLease, options_.keyLeasePrefix});
  const std::string reply = call("/v3/kv/txn", body.dump(), Deadline(options_.callTimeout), idempotent);
  try {
    EtcdTxnResult result = parseTxn(etcd::parseObject(reply, "etcd /v3/kv/txn"), success, failure, false);
    if (!result.succeeded) countEtcdTxnFailed();
    return result;
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string("etcd /v3/kv/txn: malformed reply: ") + e.what());
  }
}

int64_t EtcdClient::leaseGrant(std::chrono::seconds ttl, std::chrono::seconds* grantedTtl) {
  const Json body{{"TTL", std::to_string(ttl.count())}};
  const std::string reply = call("/v3/lease/grant", body.dump(), Deadline(options_.callTimeout), true);
  const Json parsed = etcd::parseObject(reply, "etcd /v3/lease/grant");
  const int64_t id = etcd::intField(parsed, "ID");
  const int64_t granted = etcd::intField(parsed, "TTL");
  if (id == 0 || granted <= 0)
    throw ProtocolError("etcd /v3/lease/grant: malformed reply (no lease id or TTL)");
  if (grantedTtl) *grantedTtl = std::chrono::seconds(granted);
  return id;
}

bool EtcdClient::leaseGrantWithId(int64_t id, std::chrono::seconds ttl) {
  if (id <= 0) throw InvalidArgument("etcd lease grant: the lease id must be positive");
  const Json body{{"TTL", std::to_string(ttl.count())}, {"ID", std::to_string(id)}};
  try {
    const std::string reply = call("/v3/lease/grant", body.dump(), Deadline(options_.callTimeout), true);
    if (etcd::intField(etcd::parseObject(reply, "etcd /v3/lease/grant"), "ID") != id)
      throw ProtocolError("etcd /v3/lease/grant: granted another lease than the one asked for");
    return true;
  } catch (const EtcdError& e) {
    if (std::string(e.what()).find("lease already exists") != std::string::npos) return false;
    throw;
  }
}

int64_t EtcdClient::leaseKeepAlive(int64_t lease, const Deadline& deadline) {
  const Json body{{"ID", std::to_string(lease)}};
  const std::string reply = call("/v3/lease/keepalive", body.dump(), deadline, true);
  // One streamed message: {"result":{...,"TTL":"N"}} (no TTL: the lease is gone).
  const std::string firstLine = reply.substr(0, reply.find('\n'));
  const Json parsed = etcd::parseObject(firstLine, "etcd /v3/lease/keepalive");
  if (parsed.contains("error"))
    throw NetworkError("etcd /v3/lease/keepalive: " + etcd::errorMessage(etcd::objectField(parsed, "error")));
  return etcd::intField(etcd::objectField(parsed, "result"), "TTL");
}

void EtcdClient::leaseRevoke(int64_t lease, const Deadline& deadline) {
  const Json body{{"ID", std::to_string(lease)}};
  try {
    call("/v3/lease/revoke", body.dump(), deadline, true);
  } catch (const EtcdError& e) {
    if (!e.leaseNotFound()) throw;  // else: gone already, as a revoke leaves it
  }
}

int64_t EtcdClient::leaseTimeToLive(int64_t lease) {
  const Json body{{"ID", std::to_string(lease)}};
  const std::string reply = call("/v3/lease/timetolive", body.dump(), Deadline(options_.callTimeout), true);
  return etcd::intField(etcd::parseObject(reply, "etcd /v3/lease/timetolive"), "TTL");
}

}  // namespace drun::rdzv
