#include "store_refill.hpp"

#include <spdlog/spdlog.h>

#include "c10d_node.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv {
namespace {

// compare_set rounds before giving up raising C (each lost one means another survivor raised it).
constexpr int kMaxRaises = 64;

}  // namespace

std::string encodeRefill(const Refill& refill) {
  return std::to_string(refill.round) + "\t" + std::to_string(refill.restarts);
}

std::optional<Refill> parseRefill(const std::optional<Bytes>& value) {
  if (!value) return std::nullopt;
  const size_t tab = value->find('\t');
  if (tab == std::string::npos) return std::nullopt;
  try {
    const auto round = keys::parseCounter(value->substr(0, tab));
    const auto restarts = keys::parseCounter(value->substr(tab + 1));
    if (!round || !restarts || *round < 0 || *restarts < 0 || *restarts > INT32_MAX)
      return std::nullopt;
    return Refill{static_cast<uint64_t>(*round), static_cast<int>(*restarts)};
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
}

std::optional<Refill> readRefill(Store& store, const std::string& runId) {
  return parseRefill(store.tryGet(keys::refill(runId)));
}

std::optional<uint64_t> refillStore(Store& store, const std::string& runId, const Refill& carried) {
  const std::string key = keys::refill(runId);
  std::optional<Bytes> current = store.tryGet(key);
  if (!current) {
    // A store that still holds the job (a cut link, not a restart): nothing to refill. Unless
    // another survivor refilled it since the read above (it writes the record before the round):
    // then this node joins that refill.
    if (store.check({keys::currentRound(runId)}) || store.check({keys::outcome(runId)})) {
      current = store.tryGet(key);
      if (!current) return std::nullopt;
    } else if (*(current = store.compareSet(key, "", encodeRefill(carried))) == encodeRefill(carried)) {
      store.compareSet(keys::currentRound(runId), "", std::to_string(carried.round));
      bumpStatus(store, runId, 0);  // a newcomer already waiting in round 0 moves to R
      spdlog::info("rendezvous '{}': the store lost the job (restarted); refilled it: round {}, "
                   "restart count {}", runId, carried.round, carried.restarts);
    }
  }
  for (int raise = 0; raise < kMaxRaises; ++raise) {
    const auto stored = parseRefill(current);
    if (!stored)
      throw ProtocolError("rendezvous '" + runId + "': malformed refill record in the store [" +
                          key + "]");
    // The refilled round closed already: the job runs again; this node comes back as a newcomer.
    if (keys::parseCounter(store.tryGet(keys::currentRound(runId))).value_or(0) >
        static_cast<int64_t>(stored->round))
      return std::nullopt;
    if (stored->restarts >= carried.restarts) return stored->round;
    const std::string raised = encodeRefill({stored->round, carried.restarts});
    current = store.compareSet(key, *current, raised);
    if (*current == raised) return stored->round;
  }
  throw Error("rendezvous '" + runId + "': the refill record kept changing (" +
              std::to_string(kMaxRaises) + " tries)");
}

}  // namespace drun::rdzv
