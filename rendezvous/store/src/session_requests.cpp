// Session: requests -> StoreCore, the scope of a job's token, wills and blocking calls within the
// connection's budget. See store_session.hpp.
#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"
#include "store_session.hpp"

namespace drun::rdzv::server {
namespace {

constexpr size_t kPerEntryOverhead = 64;  // a will entry's string headers and vector slot
constexpr size_t kPerWillOverhead = 256;

size_t willCost(const Store::Will& will) {
  size_t cost = kPerWillOverhead;
  for (const auto& [k, v] : will.sets) cost += k.size() + v.size() + kPerEntryOverhead;
  for (const auto& [k, d] : will.adds) cost += k.size() + sizeof d + kPerEntryOverhead;
  for (const auto& k : will.deletes) cost += k.size() + kPerEntryOverhead;
  return cost;
}

}  // namespace

void Session::handle(wire::Request q) {
  state_.counters.requests++;
  if (q.op == wire::Op::Heartbeat) return;  // reading it renewed the lease
  if (q.op == wire::Op::Batch) {
    // Its parts, in one step on this thread: none waits (the codec admits none that does), so
    // nothing of another connection, its close and its will included, runs between them. Only
    // this session dropped for output over its budget (a client that does not read its answers)
    // ends a batch part way, as it ends a stream of frames: its will ran, the rest is not applied.
    for (wire::Request& part : q.parts) {
      handle(std::move(part));
      if (phase_ != SessionPhase::Serving) return;
    }
    return;
  }
  wire::Response p = answer(q.op, q.id, wire::Status::Ok);
  if (std::string why = outOfScope(q); !why.empty()) {
    p = answer(q.op, q.id, wire::Status::InvalidArgument);
    p.message = why;
    send(p);
    return;
  }
  try {
    if (!serve(q, p)) return;  // a blocking call: answered later (or at its deadline)
  } catch (const InvalidArgument& e) {
    p = answer(q.op, q.id, wire::Status::InvalidArgument);
    p.message = e.what();
  } catch (const std::exception& e) {
    p = answer(q.op, q.id, wire::Status::ServerError);
    p.message = e.what();
  }
  state_.noteStored();
  send(p);
}

// Applies `q` to the store and fills the answer; false when it is a call that waits.
bool Session::serve(wire::Request& q, wire::Response& p) {
  StoreCore& core = state_.core;
  switch (q.op) {
    case wire::Op::Set:
      core.set(q.keys[0], std::move(q.values[0]));
      break;
    case wire::Op::TryGet:
      if (const Bytes* v = core.find(q.keys[0])) p.values.push_back(*v);
      break;
    case wire::Op::Add:
      p.number = core.add(q.keys[0], q.delta);
      break;
    case wire::Op::CompareSet:
      p.values.push_back(core.compareSet(q.keys[0], q.values[0], std::move(q.values[1])));
      break;
    case wire::Op::Check:
      p.number = core.check(q.keys) ? 1 : 0;
      break;
    case wire::Op::Delete:
      p.number = core.erase(q.keys[0]) ? 1 : 0;
      break;
    case wire::Op::NumKeys:
      p.number = core.numKeys();
      break;
    case wire::Op::MultiSet:
      core.multiSet(q.keys, q.values);
      break;
    case wire::Op::Append:
      core.append(q.keys[0], q.values[0]);
      break;
    case wire::Op::SetWill:
      setWill(std::move(q.will));
      break;
    case wire::Op::DeletePrefix:
      p.number = core.erasePrefix(q.keys[0]);
      break;
    case wire::Op::ListJobs:
      p.values = core.jobIds();
      break;
    case wire::Op::Get:
    case wire::Op::Wait:
    case wire::Op::MultiGet:
    case wire::Op::Watch:
      return !startBlocking(q, p);
    case wire::Op::Heartbeat:
    case wire::Op::Batch:  // handle() takes it apart
      break;
  }
  return true;
}

// A blocking call within maxWaitersPerConnection and the `calls` budget; true when it waits.
bool Session::startBlocking(wire::Request& q, wire::Response& p) {
  const size_t maxWaiters = state_.options.maxWaitersPerConnection;
  if (calls_->size() >= maxWaiters)
    throw InvalidArgument("over " + std::to_string(maxWaiters) +
                          " blocking calls pending on one connection (maxWaitersPerConnection)");
  if (std::string why = state_.calls.overBy(calls_->bytes() + willBytes_, BlockingCalls::costOf(q));
      !why.empty()) {
    state_.counters.overBudget++;
    throw InvalidArgument(std::string(wire::toString(q.op)) + " refused: its keys would make " +
                          why + " (pending calls' keys and the will)");
  }
  return calls_->start(q, p);
}

// The will replaces the previous one, within the `calls` budget.
void Session::setWill(Store::Will will) {
  const size_t cost = will.sets.empty() && will.adds.empty() && will.deletes.empty() ? 0 : willCost(will);
  state_.calls.remove(willBytes_);
  std::string why = state_.calls.overBy(calls_->bytes(), cost);
  if (!why.empty()) {
    state_.calls.add(willBytes_);
    state_.counters.overBudget++;
    throw InvalidArgument("setWill refused: the will would make " + why +
                          " (pending calls' keys and the will)");
  }
  try {
    state_.core.setWill(client_, std::move(will));
  } catch (...) {
    state_.calls.add(willBytes_);
    throw;
  }
  willBytes_ = cost;
  state_.calls.add(willBytes_);
  state_.counters.callBytes = state_.calls.used();
}

// Why request `q` is outside the keys this connection may touch ("" = it is not).
std::string Session::outOfScope(const wire::Request& q) const {
  if (keyPrefix_.empty()) return "";
  const std::string job = "a client of job '" + printableScope() + "'";
  if (q.op == wire::Op::NumKeys) return job + " cannot count the whole store";
  if (q.op == wire::Op::ListJobs) return job + " cannot list the store's jobs";
  auto inside = [&](const std::string& key) { return key.starts_with(keyPrefix_); };
  auto outside = [&](const std::string& key) {
    return job + " may only touch keys under " + keyPrefix_ + ", not " + text::printable(key, {128});
  };
  for (const auto& k : q.keys)
    if (!inside(k)) return outside(k);
  for (const auto& [k, v] : q.will.sets)
    if (!inside(k)) return outside(k);
  for (const auto& [k, d] : q.will.adds)
    if (!inside(k)) return outside(k);
  for (const auto& k : q.will.deletes)
    if (!inside(k)) return outside(k);
  return "";
}

}  // namespace drun::rdzv::server
