#include "recovery_generations.hpp"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::agent::detail {

namespace keys = rdzv::recovery;
using rdzv::StoreBatch;

std::string encodeLost(const LostWorker& l) {
  return nlohmann::json{{"rank", l.rank},     {"local_rank", l.localRank}, {"node", l.node},
                        {"exit_code", l.exitCode}, {"signal", l.signal},   {"pid", l.pid},
                        {"time_ms", l.timeMs}}
      .dump();
}

LostWorker parseLost(const std::string& value) {
  try {
    const nlohmann::json j = nlohmann::json::parse(value);
    LostWorker l;
    l.rank = j.at("rank").get<int>();
    l.localRank = j.at("local_rank").get<int>();
    l.node = text::printable(j.at("node").get<std::string>(), {.maxBytes = 256});
    l.exitCode = j.at("exit_code").get<int>();
    l.signal = j.at("signal").get<int>();
    l.pid = j.at("pid").get<int64_t>();
    l.timeMs = j.at("time_ms").get<int64_t>();
    return l;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError("a recovery's lost rank is not what drun writes (" + std::string(e.what()) + "): '" +
                        text::printable(value, {.maxBytes = 200}) + "'");
  }
}

uint64_t openGeneration(rdzv::LivenessStore& store, const std::string& prefix, const LostWorker& lost,
                        int restartCount, std::chrono::milliseconds timeout) {
  const std::string me = lost.node + " pid " + std::to_string(::getpid()) + " rank " + std::to_string(lost.rank);
  return openGeneration(store, prefix, std::vector<LostWorker>{lost}, me, restartCount, timeout);
}

uint64_t openGeneration(rdzv::LivenessStore& store, const std::string& prefix, const std::vector<LostWorker>& lost,
                        const std::string& me, int restartCount, std::chrono::milliseconds timeout,
                        const std::optional<rdzv::recovery::World>& world) {
  // A grow loses no rank; any other generation loses at least one.
  const bool grows = world && world->grows();
  if ((lost.empty() && !grows) || lost.size() + 3 > StoreBatch::kMaxOps) throw InvalidArgument("a generation for " +
                                                                                   std::to_string(lost.size()) + " ranks");
  const Deadline deadline(timeout);
  const std::string key = keys::generation(prefix);
  // Claim the first generation after the current one that nobody claimed.
  uint64_t g = keys::parseGeneration(store.tryGet(key)) + 1;
  for (int attempt = 0; store.compareSet(keys::opener(prefix, g), "", me) != me; ++attempt, ++g)
    if (attempt >= 64) throw Error("could not claim a recovery generation after " + std::to_string(g) + " (64 tries)");
  std::vector<std::string> names = {keys::restartCount(prefix, g)};
  std::vector<std::string> values = {std::to_string(restartCount)};
  std::vector<int> ranks;
  for (const LostWorker& l : lost) ranks.push_back(l.rank);
  if (!ranks.empty()) {
    names.push_back(keys::lostRanks(prefix, g));
    values.push_back(keys::encodeRanks(ranks));
  }
  for (const LostWorker& l : lost) {
    names.push_back(keys::lost(prefix, g, l.rank));
    values.push_back(encodeLost(l));
  }
  if (world) {
    names.push_back(keys::world(prefix, g));
    values.push_back(keys::encodeWorld(*world));
  }
  store.multiSet(names, values);
  // Then g-1 -> g; an earlier generation's opener may not have moved it to g-1 yet: wait for it.
  const std::string desired = std::to_string(g);
  for (;;) {
    const std::string expected = g == 1 ? "" : std::to_string(g - 1);
    if (store.compareSet(key, expected, desired) == desired) return g;
    const std::optional<std::string> now = store.tryGet(key);
    if (keys::parseGeneration(now) >= g)
      throw Error(key + " moved past generation " + desired + ", which this agent claimed");
    if (deadline.expired())
      throw TimeoutError("recovery generation " + std::to_string(g - 1) + " was claimed but did not begin within " +
                         std::to_string(timeout.count()) + "ms");
    try {
      store.watch(key, now, deadline.remaining());
    } catch (const TimeoutError&) {
    }
  }
}

Generation readGeneration(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g) {
  Generation out;
  out.number = g;
  StoreBatch batch;
  const size_t ranks = batch.tryGet(keys::lostRanks(prefix, g));
  const size_t count = batch.tryGet(keys::restartCount(prefix, g));
  const size_t world = batch.tryGet(keys::world(prefix, g));
  const size_t opener = batch.tryGet(keys::opener(prefix, g));
  store.runBatch(batch);
  out.opener = text::printable(batch.value(opener).value_or(""), {.maxBytes = 256});
  if (auto w = batch.value(world)) out.world = keys::parseWorld(*w);
  if (auto c = batch.value(count)) {
    try {
      out.restartCount = std::stoi(*c);
    } catch (const std::exception&) {
      throw ProtocolError("recovery/" + std::to_string(g) + "/restart_count holds '" +
                          text::printable(*c, {.maxBytes = 64}) + "'");
    }
  }
  if (!batch.value(ranks)) return out;
  for (int rank : keys::parseRanks(*batch.value(ranks)))
    if (auto value = store.tryGet(keys::lost(prefix, g, rank))) out.lost.push_back(parseLost(*value));
  return out;
}

bool openedHere(const Generation& generation, const std::string& host) {
  return generation.opener.starts_with(host + " pid " + std::to_string(::getpid()) + " ");
}

std::map<uint64_t, rdzv::recovery::World> readWorldsAfter(rdzv::LivenessStore& store, const std::string& prefix,
                                                          uint64_t after) {
  const uint64_t current = keys::parseGeneration(store.tryGet(keys::generation(prefix)));
  std::map<uint64_t, rdzv::recovery::World> worlds;
  for (uint64_t first = after + 1; first <= current; first += StoreBatch::kMaxOps) {
    StoreBatch batch;
    const uint64_t last = std::min(current, first + StoreBatch::kMaxOps - 1);
    for (uint64_t g = first; g <= last; ++g) batch.tryGet(keys::world(prefix, g));
    store.runBatch(batch);
    for (uint64_t g = first; g <= last; ++g)
      if (auto w = batch.value(g - first)) worlds.emplace(g, keys::parseWorld(*w));
  }
  return worlds;
}

std::vector<int> newcomerRanks(const std::map<uint64_t, Generation>& generations, uint64_t g) {
  std::vector<int> newcomers;
  for (const auto& [number, began] : generations) {
    if (number > g) break;
    for (const LostWorker& l : began.lost) newcomers.push_back(l.rank);
    if (!began.world) continue;
    // A shrink or a grow: every rank so far (its own lost ones too) in its numbering, where a
    // shrink dropped its lost ranks; a grow's added ranks come after the kept ones.
    std::vector<int> renumbered;
    for (int rank : newcomers)
      if (int now = began.world->renumber(rank); now >= 0) renumbered.push_back(now);
    for (int added = static_cast<int>(began.world->ranks.size()); added < began.world->size(); ++added)
      renumbered.push_back(added);
    newcomers = std::move(renumbered);
  }
  std::sort(newcomers.begin(), newcomers.end());
  newcomers.erase(std::unique(newcomers.begin(), newcomers.end()), newcomers.end());
  return newcomers;
}

std::string fallbackWording(uint64_t g, const std::vector<bool>& joined, const std::vector<int>& newcomers) {
  std::vector<int> missing;
  bool survivorJoined = false;
  for (int r = 0; r < static_cast<int>(joined.size()); ++r) {
    const bool isNewcomer = std::find(newcomers.begin(), newcomers.end(), r) != newcomers.end();
    if (!joined[size_t(r)]) missing.push_back(r);
    else if (!isNewcomer) survivorJoined = true;
  }
  if (!survivorJoined) return "the survivors never joined the recovery";
  if (missing.empty()) return "generation " + std::to_string(g) + " did not form in time";
  std::string list;
  constexpr size_t kNamed = 8;
  for (size_t i = 0; i < missing.size() && i < kNamed; ++i)
    list += (i ? ", " : "") + std::to_string(missing[i]);
  if (missing.size() > kNamed) list += ", ... (" + std::to_string(missing.size()) + " in all)";
  return (missing.size() == 1 ? "rank " : "ranks ") + list + " never joined";
}

std::string fallbackReason(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g, int worldSize,
                           const std::vector<int>& newcomers) {
  std::vector<bool> joined(size_t(std::max(worldSize, 0)), false);
  for (int first = 0; first < worldSize; first += static_cast<int>(StoreBatch::kMaxOps)) {
    StoreBatch batch;
    const int last = std::min(worldSize, first + static_cast<int>(StoreBatch::kMaxOps));
    for (int r = first; r < last; ++r) batch.tryGet(keys::joined(prefix, g, r));
    store.runBatch(batch);
    for (int r = first; r < last; ++r) joined[size_t(r)] = batch.value(static_cast<size_t>(r - first)).has_value();
  }
  return fallbackWording(g, joined, newcomers);
}

std::string decideFallback(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g,
                           const std::string& reason) {
  return store.compareSet(keys::outcome(prefix, g), "", keys::encodeFallback(reason));
}

void refillGenerations(rdzv::LivenessStore& store, const std::string& prefix,
                       const std::map<uint64_t, Generation>& generations, uint64_t current) {
  if (current == 0) return;  // none began: an absent generation is 0
  std::vector<std::string> names;
  std::vector<std::string> values;
  auto put = [&](std::string name, std::string value) {
    names.push_back(std::move(name));
    values.push_back(std::move(value));
  };
  for (const auto& [g, began] : generations) {
    if (g > current) break;
    put(keys::restartCount(prefix, g), std::to_string(began.restartCount));
    std::vector<int> ranks;
    for (const LostWorker& l : began.lost) {
      ranks.push_back(l.rank);
      put(keys::lost(prefix, g, l.rank), encodeLost(l));
    }
    if (!ranks.empty()) put(keys::lostRanks(prefix, g), keys::encodeRanks(ranks));
    if (began.world) put(keys::world(prefix, g), keys::encodeWorld(*began.world));
  }
  put(keys::outcome(prefix, current), std::string(keys::kFormed));
  for (size_t at = 0; at < names.size(); at += StoreBatch::kMaxOps) {
    const size_t end = std::min(names.size(), at + StoreBatch::kMaxOps);
    store.multiSet({names.begin() + at, names.begin() + end}, {values.begin() + at, values.begin() + end});
  }
  store.compareSet(keys::generation(prefix), "", std::to_string(current));
}

}  // namespace drun::agent::detail
