#include "round_closer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "drun/common/error.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/rendezvous/round_planner.hpp"
#include "store_refill.hpp"

namespace drun::rdzv {
namespace {

// How often a closer re-reads its snapshot when wills keep running under it.
constexpr int kMaxCloseLooks = 3;

int64_t counter(LivenessStore& store, const std::string& key) {
  return keys::parseCounter(store.tryGet(key)).value_or(0);
}

}  // namespace

std::optional<keys::RoundState> RoundCloser::closedRound(uint64_t round) {
  auto header = store_.tryGet(keys::status(node_.runId(), round));
  auto state = header ? keys::parseState(*header) : std::nullopt;
  if (!state || !state->ok) return std::nullopt;
  return state;
}

Reform RoundCloser::readReform(uint64_t round) {
  Reform reform;
  if (round == 0) return reform;
  auto state = closedRound(round - 1);
  if (!state) return reform;
  reform.active = true;
  reform.previous = {node_.runId(), round - 1, state->nodeCount, state->leftAtClose};
  return reform;
}

bool RoundCloser::everySurvivorBack(uint64_t round, const Reform& reform) {
  return counter(store_, keys::rejoined(node_.runId(), round)) >=
         survivorsOf(store_, reform.previous);
}

bool RoundCloser::tryClose(uint64_t round, int needed, const Reform& reform) {
  const std::string& id = node_.runId();
  const auto t0 = Clock::now();
  if (reform.active && !everySurvivorBack(round, reform)) return false;
  std::vector<keys::NodeDescriptor> nodes;
  int64_t changesAtRead = 0;
  int64_t leftAtRead = 0;
  for (int look = 0; look < kMaxCloseLooks; ++look) {
    leftAtRead = counter(store_, keys::left(id, round));
    changesAtRead = counter(store_, keys::changes(id, round));
    size_t skipped = 0;
    nodes = keys::parseJoined(store_.tryGet(keys::joined(id, round)).value_or(""), &skipped);
    if (skipped)
      spdlog::warn("rendezvous '{}': round {}: ignored {} malformed joiner record(s)", id, round,
                   skipped);
    if (changesAtRead > 0 || leftAtRead > 0) removeDead(round, nodes);
    if (counter(store_, keys::left(id, round)) == leftAtRead) break;
    // Out of looks: a loss in the window is then counted as a member's (a spurious re-form,
    // never a hidden death).
  }
  aliveJoiners_ = static_cast<int>(nodes.size());
  if (static_cast<int>(nodes.size()) < needed) {
    spdlog::debug("rendezvous '{}': round {}: {} alive joiner(s), need {}: not closing", id, round,
                  nodes.size(), needed);
    return false;
  }
  nodes = pickMembers(std::move(nodes), node_.options.maxNodes);
  RoundDecision d = decideRound(id, round, nodes, {changesAtRead, leftAtRead, restartCountFor(round)});
  if (store_.compareSet(keys::state(id, round), "", d.decision) == d.decision) {
    publish(d);
    forgetRound(round);
    spdlog::debug("rendezvous '{}': closed round {} with {} node(s) in {}{}", id, round,
                  nodes.size(), ms(std::chrono::duration_cast<milliseconds>(Clock::now() - t0)),
                  d.state.ok ? "" : ": " + d.state.error);
  }
  return true;
}

void RoundCloser::failRound(uint64_t round, const std::string& message) {
  keys::RoundState failed;
  failed.ok = false;
  failed.error = message;
  const std::string decision = keys::encodeState(failed);
  const Bytes stored = store_.compareSet(keys::state(node_.runId(), round), "", decision);
  if (stored == decision) store_.set(keys::status(node_.runId(), round), decision);
  auto state = keys::parseState(stored);
  throw Error("rendezvous '" + node_.runId() + "': " + (state && !state->ok ? state->error : message));
}

std::string RoundCloser::lostNodes(const Reform& reform) {
  std::string names;
  size_t count = 0;
  const uint64_t previous = reform.previous.round;
  try {
    auto state = keys::parseState(
        store_.get(keys::state(node_.runId(), previous), node_.options.readTimeout));
    for (const auto& member : state ? state->roster : std::vector<keys::RosterEntry>{}) {
      if (!store_.tryGet(keys::dead(node_.runId(), previous, member.id))) continue;
      if (count++ < kMaxNamesInMessage) names += (names.empty() ? "" : ", ") + member.name;
    }
  } catch (const Error& e) {
    return "node(s) (" + std::string(e.what()) + ")";
  }
  if (count > kMaxNamesInMessage)
    names += ", and " + std::to_string(count - kMaxNamesInMessage) + " more";
  return count == 0 ? std::string("node(s)") : "node(s) " + names;
}

void RoundCloser::removeDead(uint64_t round, std::vector<keys::NodeDescriptor>& nodes) {
  std::erase_if(nodes, [&](const keys::NodeDescriptor& n) {
    return store_.tryGet(keys::dead(node_.runId(), round, n.id)).has_value();
  });
}

// The decision's keys in request-sized pieces (a round of 100,000 nodes has more assignments
// than one request may carry), in order: `status` is last, so waiters find the rest after it.
void RoundCloser::publish(const RoundDecision& d) {
  for (size_t first = 0; first < d.keys.size(); first += kKeysPerPublish) {
    const size_t last = std::min(d.keys.size(), first + kKeysPerPublish);
    if (first == 0 && last == d.keys.size()) {
      store_.multiSet(d.keys, d.values);
      return;
    }
    store_.multiSet(std::vector<std::string>(d.keys.begin() + first, d.keys.begin() + last),
                    std::vector<Bytes>(d.values.begin() + first, d.values.begin() + last));
  }
}

// The job's restart count as of round `round`: the previous round's, plus its in-process
// recoveries, plus one when it ended in a failure. Advanced here, by the closer, once per restart.
int RoundCloser::restartCountFor(uint64_t round) {
  // No previous round in the store: a first round, or the one the survivors re-form in a
  // restarted store (store_refill.hpp), which carries the job's count on.
  auto carried = [&] {
    auto refill = readRefill(store_, node_.runId());
    return refill && refill->round == round ? refill->restarts : 0;
  };
  if (round == 0) return carried();
  auto state = closedRound(round - 1);
  if (!state) return carried();
  StoreBatch batch;
  const size_t failure = batch.tryGet(keys::failure(node_.runId(), round - 1));
  const size_t recoveries = batch.tryGet(keys::recoveries(node_.runId(), round - 1));
  store_.runBatch(batch);
  int64_t recovered = 0;
  try {
    recovered = std::max<int64_t>(0, keys::parseCounter(batch.value(recoveries)).value_or(0));
  } catch (const ProtocolError& e) {
    spdlog::warn("rendezvous '{}': {}", node_.runId(), e.what());
  }
  return state->restartCount + static_cast<int>(recovered) + (batch.value(failure) ? 1 : 0);
}

// Once round r is decided nobody reads round r-2 any more (re-forming and the restart count
// look one round back): its keys go, so that a job restarting for days keeps a few rounds in
// the store, not all of them (the soak test's store memory stays flat).
void RoundCloser::forgetRound(uint64_t round) {
  if (round < 2) return;
  try {
    store_.deletePrefix(keys::round(node_.runId(), round - 2));
  } catch (const InvalidArgument& e) {
    spdlog::debug("rendezvous '{}': round {}'s keys stay: {}", node_.runId(), round - 2, e.what());
  }
}

}  // namespace drun::rdzv
