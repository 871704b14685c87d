// TcpStore: blocking client of StoreServer over POSIX sockets; every wait is a poll() with the
// call's deadline. See tcp_store.hpp for the rules.
#include "drun/store/tcp_store.hpp"

#include "tcp_store_connection.hpp"

#include "drun/store/store_batch.hpp"

namespace drun::rdzv {

using wire::Op;

// -------------------------------------------------------------------------------------- TcpStore

namespace {

wire::Request request(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}) {
  wire::Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}

}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& options) : conn_(std::make_unique<Connection>(options)) {}
TcpStore::~TcpStore() = default;

const std::string& TcpStore::endpoint() const { return conn_->endpoint(); }
milliseconds TcpStore::leaseTimeout() const { return conn_->lease(); }
void TcpStore::stopHeartbeatsForTest() { conn_->stopHeartbeats(); }
void TcpStore::interrupt() { conn_->interrupt(); }

void TcpStore::set(const std::string& key, const Bytes& value) {
  auto q = request(Op::Set, {key}, {value});
  conn_->call(q, {});
}

Bytes TcpStore::get(const std::string& key, milliseconds timeout) {
  auto q = request(Op::Get, {key});
  auto p = conn_->call(q, timeout);
  if (p.values.size() != 1) conn_->malformed(q, std::to_string(p.values.size()) + " values, not 1");
  return std::move(p.values[0]);
}

std::optional<Bytes> TcpStore::tryGet(const std::string& key) {
  auto q = request(Op::TryGet, {key});
  auto p = conn_->call(q, {});
  if (p.values.empty()) return std::nullopt;
  return std::move(p.values[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto q = request(Op::Add, {key});
  q.delta = delta;
  return conn_->call(q, {}).number;
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  auto q = request(Op::CompareSet, {key}, {expected, desired});
  auto p = conn_->call(q, {});
  if (p.values.size() != 1) conn_->malformed(q, std::to_string(p.values.size()) + " values, not 1");
  return std::move(p.values[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  auto q = request(Op::Wait, keys);
  conn_->call(q, timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto q = request(Op::Check, keys);
  return conn_->call(q, {}).number != 0;
}

bool TcpStore::deleteKey(const std::string& key) {
  auto q = request(Op::Delete, {key});
  return conn_->call(q, {}).number != 0;
}

int64_t TcpStore::numKeys() {
  auto q = request(Op::NumKeys);
  return conn_->call(q, {}).number;
}

std::vector<Bytes> TcpStore::multiGet(const std::vector<std::string>& keys, milliseconds timeout) {
  auto q = request(Op::MultiGet, keys);
  auto p = conn_->call(q, timeout);
  if (p.values.size() != keys.size())
    throw ProtocolError("multiGet at " + endpoint() + ": asked " + std::to_string(keys.size()) +
                        " keys, got " + std::to_string(p.values.size()) + " values");
  return std::move(p.values);
}

void TcpStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  auto q = request(Op::MultiSet, keys, values);
  conn_->call(q, {});
}

void TcpStore::append(const std::string& key, const Bytes& value) {
  auto q = request(Op::Append, {key}, {value});
  conn_->call(q, {});
}

std::optional<Bytes> TcpStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                     milliseconds timeout) {
  auto q = request(Op::Watch, {key});
  q.known = known;
  auto p = conn_->call(q, timeout);
  if (p.values.empty()) return std::nullopt;
  return std::move(p.values[0]);
}

void TcpStore::setWill(const Will& will) {
  auto q = request(Op::SetWill);
  q.will = will;
  conn_->call(q, {});
}

int64_t TcpStore::deletePrefix(const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix must not be empty");
  auto q = request(Op::DeletePrefix, {prefix});
  return conn_->call(q, {}).number;
}

// One round trip for the whole batch (store_batch.hpp). An answer whose shape is not its op's
// (a compareSet without the value now stored, a tryGet with two) means the peer is not a sound
// store: ProtocolError, the connection is dropped.
void TcpStore::runBatch(StoreBatch& batch) {
  using Kind = StoreBatch::Kind;
  batch.clearOutcomes();
  std::vector<wire::Request> requests;
  requests.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const StoreBatch::Op& op = batch.op(i);
    switch (op.kind) {
      case Kind::Set: requests.push_back(request(Op::Set, {op.key}, {op.value})); break;
      case Kind::TryGet: requests.push_back(request(Op::TryGet, {op.key})); break;
      case Kind::Add:
        requests.push_back(request(Op::Add, {op.key}));
        requests.back().delta = op.delta;
        break;
      case Kind::CompareSet:
        requests.push_back(request(Op::CompareSet, {op.key}, {op.value, op.desired}));
        break;
      case Kind::Append: requests.push_back(request(Op::Append, {op.key}, {op.value})); break;
      case Kind::SetWill:
        requests.push_back(request(Op::SetWill));
        requests.back().will = op.will;
        break;
      case Kind::DeleteKey: requests.push_back(request(Op::Delete, {op.key})); break;
      case Kind::DeletePrefix: requests.push_back(request(Op::DeletePrefix, {op.key})); break;
    }
  }
  if (requests.empty()) return;
  conn_->callPipelined(requests, [&](size_t i, wire::Response& p, std::exception_ptr failure) {
    StoreBatch::Outcome& out = batch.outcome(i);
    out.ran = true;
    out.error = failure;
    if (failure) return;
    const Kind kind = batch.op(i).kind;
    if (kind == Kind::TryGet && p.values.size() > 1)
      conn_->malformed(requests[i], std::to_string(p.values.size()) + " values");
    if (kind == Kind::CompareSet && p.values.size() != 1)
      conn_->malformed(requests[i], std::to_string(p.values.size()) + " values, not 1");
    if (!p.values.empty()) out.value = std::move(p.values[0]);
    out.number = kind == Kind::DeleteKey ? (p.number != 0 ? 1 : 0) : p.number;
  });
  batch.rethrowFirstFailure();
}

std::vector<std::string> TcpStore::listJobs() {
  auto q = request(Op::ListJobs);
  return std::move(conn_->call(q, {}).values);
}

}  // namespace drun::rdzv
