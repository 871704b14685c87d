#include "vacancy_board.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::rdzv {
namespace {

constexpr std::string_view kWithdrawn = "-";

template <typename Int>
Int decimalField(std::string_view text, std::string_view value) {
  Int out{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || out < 0)
    throw ProtocolError("a vacancy holds '" + text::printable(value, {.maxBytes = 200}) +
                        "', not what drun writes");
  return out;
}

std::vector<std::string> offeredIds(const std::optional<Bytes>& blob) {
  std::vector<std::string> out;
  if (!blob) return out;
  size_t start = 0;
  while (start < blob->size()) {
    size_t end = blob->find('\n', start);
    if (end == std::string::npos) end = blob->size();
    std::string line = blob->substr(start, end - start);
    if (keys::isValidNodeId(line) && std::find(out.begin(), out.end(), line) == out.end())
      out.push_back(std::move(line));
    start = end + 1;
  }
  return out;
}

// One offer as read: its value and its taker (absent: open; "-": withdrawn; else the spare).
struct Posted {
  std::string lostId;
  std::optional<VacancyOffer> offer;  // nullopt: malformed (skipped)
  std::optional<Bytes> taker;
};

// Every offer of the round, in the order they were posted.
std::vector<Posted> readOffers(LivenessStore& store, const std::string& runId, uint64_t round,
                               const std::optional<Bytes>& list) {
  std::vector<Posted> out;
  const std::vector<std::string> ids = offeredIds(list);
  constexpr size_t kPerBatch = StoreBatch::kMaxOps / 2;
  for (size_t first = 0; first < ids.size(); first += kPerBatch) {
    StoreBatch batch;
    const size_t last = std::min(ids.size(), first + kPerBatch);
    for (size_t i = first; i < last; ++i) {
      batch.tryGet(keys::vacancy(runId, round, ids[i]));
      batch.tryGet(keys::vacancyTaker(runId, round, ids[i]));
    }
    store.runBatch(batch);
    for (size_t i = first; i < last; ++i) {
      Posted p;
      p.lostId = ids[i];
      const size_t at = 2 * (i - first);
      if (const auto& value = batch.value(at)) try {
          p.offer = parseOffer(*value);
        } catch (const ProtocolError& e) {
          spdlog::warn("rendezvous '{}' round {}: {}", runId, round, e.what());
        }
      p.taker = batch.value(at + 1);
      out.push_back(std::move(p));
    }
  }
  return out;
}

// A taker's value: "<member id>\t<name>".
std::string takerId(const Bytes& taker) { return taker.substr(0, taker.find('\t')); }

struct Member {
  std::string id;
  std::string name;
  int nodeRank = 0;
  int rankOffset = 0;
  int localWorldSize = 1;
  uint64_t numberedIn = 0;  // the generation of the numbering (Vacancy::numberedIn)
};

// The round's members now: the decision's roster, each place a spare took held by that spare,
// then the places grows added (in the order they were offered), each held by its taker.
std::vector<Member> currentMembers(LivenessStore& store, const std::string& runId, uint64_t round) {
  StoreBatch batch;
  const size_t state = batch.tryGet(keys::state(runId, round));
  const size_t list = batch.tryGet(keys::vacancies(runId, round));
  store.runBatch(batch);
  auto decided = batch.value(state) ? keys::parseState(*batch.value(state)) : std::nullopt;
  if (!decided || !decided->ok || decided->roster.empty())
    throw ProtocolError("rendezvous '" + runId + "' round " + std::to_string(round) +
                        ": no decision with a roster to find the lost members in");
  std::vector<Member> members;
  int offset = 0;
  for (const auto& entry : decided->roster) {
    members.push_back({entry.id, entry.name, static_cast<int>(members.size()), offset, entry.localWorldSize});
    offset += entry.localWorldSize;
  }
  // In the order posted: a place is offered only once its holder is a member (a grown member's
  // loss is offered after its grow).
  for (const Posted& p : readOffers(store, runId, round, batch.value(list))) {
    if (!p.offer || !p.taker || *p.taker == kWithdrawn) continue;
    const std::string id = takerId(*p.taker);
    if (!keys::isValidNodeId(id)) continue;
    const std::string name =
        text::printable(p.taker->substr(std::min(p.taker->size(), id.size() + 1)), {.maxBytes = 256});
    if (keys::isGrowPlace(p.lostId)) {
      members.push_back({id, name, p.offer->nodeRank, p.offer->rankOffset, p.offer->localWorldSize,
                         p.offer->generation});
      continue;
    }
    auto held = std::find_if(members.begin(), members.end(), [&](const Member& m) { return m.id == p.lostId; });
    if (held == members.end()) continue;
    held->id = id;
    held->name = name;
  }
  return members;
}

// The running round's world as the workers number it in a generation: its node count, world
// size and each node rank's host ("" for a node a grow added: its name is not recorded).
struct NumberedWorld {
  int nodeCount = 0;
  int worldSize = 0;
  std::vector<std::string> hosts;
};

// One world record applied: the nodes it keeps in their new order, then the ones it adds.
void renumber(NumberedWorld& world, const recovery::World& record) {
  std::vector<std::string> hosts;
  for (int kept : record.nodeRanks)
    hosts.push_back(kept >= 0 && size_t(kept) < world.hosts.size() ? world.hosts[size_t(kept)] : "");
  hosts.resize(size_t(record.nodeCount()));
  world = {record.nodeCount(), record.size(), std::move(hosts)};
}

// `decided` (the round's decision) through the world records (a shrink's, a grow's) of
// generations 1..g in the round's workers' store (recovery_keys.hpp): what the workers of
// generation g are numbered in. Records are untrusted: a malformed one is skipped, with a warning.
NumberedWorld worldIn(LivenessStore& store, const std::string& runId, uint64_t round, uint64_t g,
                      NumberedWorld decided) {
  const std::string prefix = keys::workerStore(runId, round);
  uint64_t last = 0;
  try {
    last = std::min(g, recovery::parseGeneration(store.tryGet(recovery::generation(prefix))));
  } catch (const ProtocolError& e) {
    spdlog::warn("rendezvous '{}' round {}: {}", runId, round, e.what());
  }
  for (uint64_t first = 1; first <= last; first += StoreBatch::kMaxOps) {
    StoreBatch batch;
    const uint64_t end = std::min(last, first + StoreBatch::kMaxOps - 1);
    for (uint64_t at = first; at <= end; ++at) batch.tryGet(recovery::world(prefix, at));
    store.runBatch(batch);
    for (uint64_t at = first; at <= end; ++at) {
      const auto& value = batch.value(size_t(at - first));
      if (value) try {
          renumber(decided, recovery::parseWorld(*value));
        } catch (const ProtocolError& e) {
          spdlog::warn("rendezvous '{}' round {}: {}", runId, round, e.what());
        }
    }
  }
  return decided;
}

}  // namespace

std::string encodeOffer(const VacancyOffer& o) {
  return std::to_string(o.generation) + "\t" + std::to_string(o.restartCount) + "\t" + std::to_string(o.nodeRank) +
         "\t" + std::to_string(o.rankOffset) + "\t" + std::to_string(o.localWorldSize) + "\t" +
         std::to_string(o.lostAtClaim) + "\t" + o.node;
}

VacancyOffer parseOffer(std::string_view value) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (int i = 0; i < 6; ++i) {
    const size_t tab = value.find('\t', start);
    if (tab == std::string_view::npos)
      throw ProtocolError("a vacancy holds '" + text::printable(value, {.maxBytes = 200}) + "', not what drun writes");
    fields.push_back(value.substr(start, tab - start));
    start = tab + 1;
  }
  VacancyOffer o;
  o.generation = decimalField<uint64_t>(fields[0], value);
  o.restartCount = decimalField<int>(fields[1], value);
  o.nodeRank = decimalField<int>(fields[2], value);
  o.rankOffset = decimalField<int>(fields[3], value);
  o.localWorldSize = decimalField<int>(fields[4], value);
  o.lostAtClaim = decimalField<int64_t>(fields[5], value);
  o.node = text::printable(value.substr(start), {.maxBytes = 256});
  if (o.generation == 0 || o.localWorldSize < 1)
    throw ProtocolError("a vacancy holds '" + text::printable(value, {.maxBytes = 200}) + "', not what drun writes");
  return o;
}

std::vector<Vacancy> claimLostMembers(LivenessStore& store, const std::string& runId, uint64_t round,
                                      const std::string& me) {
  const std::vector<Member> members = currentMembers(store, runId, round);
  std::vector<Vacancy> claimed;
  int64_t lostAtClaim = 0;  // read with the dead flags: counts every loss claimed here
  constexpr size_t kPerBatch = (StoreBatch::kMaxOps - 1) / 2;
  for (size_t first = 0; first < members.size(); first += kPerBatch) {
    // Per member: its dead flag and the claim on its place (absent: nobody claimed it yet).
    StoreBatch look;
    const size_t last = std::min(members.size(), first + kPerBatch);
    for (size_t i = first; i < last; ++i) {
      look.tryGet(keys::dead(runId, round, members[i].id));
      look.tryGet(keys::vacancyClaim(runId, round, members[i].id));
    }
    const size_t lost = look.tryGet(keys::lost(runId, round));
    store.runBatch(look);
    lostAtClaim = keys::parseCounter(look.value(lost)).value_or(0);
    for (size_t i = first; i < last; ++i) {
      const Member& m = members[i];
      const size_t at = 2 * (i - first);
      if (m.id == me || !look.value(at) || look.value(at + 1)) continue;
      if (store.compareSet(keys::vacancyClaim(runId, round, m.id), "", me) != me) continue;  // another's
      claimed.push_back({round, m.id, m.name, m.nodeRank, m.rankOffset, m.localWorldSize, m.numberedIn});
    }
  }
  for (Vacancy& v : claimed) v.lostAtClaim = lostAtClaim;
  return claimed;
}

void postVacancy(LivenessStore& store, const std::string& runId, const Vacancy& v, uint64_t generation,
                 int restartCount) {
  const VacancyOffer offer{generation, restartCount, v.nodeRank, v.rankOffset, v.localWorldSize, v.lostAtClaim, v.node};
  StoreBatch batch;
  batch.set(keys::vacancy(runId, v.round, v.lostId), encodeOffer(offer));
  batch.append(keys::vacancies(runId, v.round), v.lostId + "\n");
  store.runBatch(batch);
  bumpStatus(store, runId, v.round + 1);  // the spares wait there
}

bool withdrawVacancy(LivenessStore& store, const std::string& runId, const Vacancy& v) {
  const std::string withdrawn(kWithdrawn);
  return store.compareSet(keys::vacancyTaker(runId, v.round, v.lostId), "", withdrawn) == withdrawn;
}

std::optional<Vacancy> claimGrowth(LivenessStore& store, const std::string& runId, uint64_t round,
                                   const std::string& me, int nodeCount, int worldSize, int maxNodes) {
  if (nodeCount >= maxNodes) return std::nullopt;
  StoreBatch look;
  const size_t grows = look.tryGet(keys::grows(runId, round));
  const size_t joined = look.tryGet(keys::joined(runId, round + 1));
  store.runBatch(look);
  const int64_t k = keys::parseCounter(look.value(grows)).value_or(0);
  std::vector<keys::NodeDescriptor> waiting = keys::parseJoined(look.value(joined).value_or(""));
  if (waiting.size() > StoreBatch::kMaxOps - 2) waiting.resize(StoreBatch::kMaxOps - 2);
  const std::string place = keys::growPlace(k);
  // The k-th grow's claim (set: that grow is open, or another survivor's) and who is alive.
  StoreBatch alive;
  const size_t claim = alive.tryGet(keys::vacancyClaim(runId, round, place));
  const size_t lost = alive.tryGet(keys::lost(runId, round));
  for (const auto& n : waiting) alive.tryGet(keys::dead(runId, round + 1, n.id));
  store.runBatch(alive);
  if (alive.value(claim)) return std::nullopt;
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (alive.value(lost + 1 + i)) continue;
    if (store.compareSet(keys::vacancyClaim(runId, round, place), "", me) != me) return std::nullopt;
    const keys::NodeDescriptor& n = waiting[i];
    Vacancy v{round, place, n.displayName(), nodeCount, worldSize, n.localWorldSize};
    v.lostAtClaim = keys::parseCounter(alive.value(lost)).value_or(0);
    return v;
  }
  return std::nullopt;
}

void endGrowth(LivenessStore& store, const std::string& runId, const Vacancy& place) {
  const int64_t k = decimalField<int64_t>(place.lostId.substr(std::min(place.lostId.size(), size_t{5})), place.lostId);
  // compare_set(k -> k + 1): ending the same grow twice moves nothing.
  store.compareSet(keys::grows(runId, place.round), k == 0 ? "" : std::to_string(k), std::to_string(k + 1));
}

std::optional<TakenPlace> takeVacancy(LivenessStore& store, const C10dNode& node, uint64_t running,
                                      const std::string& memberId) {
  const std::string& id = node.runId();
  const auto list = store.tryGet(keys::vacancies(id, running));
  if (!list) return std::nullopt;
  auto header = store.tryGet(keys::status(id, running));
  auto state = header ? keys::parseState(*header) : std::nullopt;
  if (!state || !state->ok) return std::nullopt;
  const std::string name = node.self.displayName();
  for (const Posted& p : readOffers(store, id, running, list)) {
    if (!p.offer || p.taker || p.offer->localWorldSize != node.options.localWorldSize) continue;
    const VacancyOffer& o = *p.offer;
    // The place is numbered in its generation's world: the decision's, through the shrinks and
    // grows before it (the claimer renumbered it so).
    NumberedWorld decided{state->nodeCount, state->worldSize, {}};
    if (state->nodeCount <= kMaxHostsInResult)
      decided.hosts =
          keys::parseHostList(store.tryGet(keys::hosts(id, running)).value_or(""), size_t(state->nodeCount));
    const NumberedWorld world = worldIn(store, id, running, o.generation, std::move(decided));
    // A grow's place is past the end of the world before it (node rank = the node count then,
    // rank offset = the world size then); a lost member's is within its generation's world.
    const bool grow = keys::isGrowPlace(p.lostId);
    if (!grow && (o.nodeRank >= world.nodeCount || int64_t{o.rankOffset} + o.localWorldSize > world.worldSize))
      continue;
    if (grow && (o.nodeRank >= node.options.maxNodes || int64_t{o.rankOffset} + o.localWorldSize > INT32_MAX))
      continue;
    const std::string taker = memberId + "\t" + name;
    if (store.compareSet(keys::vacancyTaker(id, running, p.lostId), "", taker) != taker) continue;
    // Exactly this node has the place: a member of `running` from here on, one batch (the
    // assignment before the will: a will never names a node without its place), and its
    // registration in the next round given up (the closer must never take that id).
    StoreBatch batch;
    batch.set(keys::assign(id, running, memberId), keys::encodeAssignment({o.nodeRank, o.rankOffset}));
    batch.add(grow ? keys::grown(id, running) : keys::replaced(id, running), 1);
    batch.setWill(keys::joinWill(id, running, memberId, name));
    batch.set(keys::dead(id, running + 1, node.self.id), "1");
    signalChange(batch, id, running + 1,
                 "node " + name + " took node rank " + std::to_string(o.nodeRank) + "'s place in round " +
                     std::to_string(running));
    const size_t changes = batch.tryGet(keys::changes(id, running));
    const size_t lost = batch.tryGet(keys::lost(id, running));
    store.runBatch(batch);
    bumpStatus(store, id, running + 1);
    TakenPlace t;
    t.memberId = memberId;
    RoundResult& r = t.result;
    r.round = running;
    r.nodeRank = o.nodeRank;
    r.nodeCount = grow ? o.nodeRank + 1 : world.nodeCount;
    r.worldSize = grow ? o.rankOffset + o.localWorldSize : world.worldSize;
    r.rankOffset = o.rankOffset;
    r.restartCount = state->restartCount;
    r.masterAddr = state->masterAddr;
    r.masterPort = state->masterPort;
    r.storePrefix = keys::round(id, running);
    r.generation = o.generation;
    r.generationRestartCount = o.restartCount;
    r.grew = grow;
    if (r.nodeCount <= kMaxHostsInResult) {
      r.hosts = world.hosts;
      r.hosts.resize(size_t(r.nodeCount));
      r.hosts[size_t(o.nodeRank)] = name;
    }
    t.decidedNodeCount = state->nodeCount;
    // The losses its generation accounts for are not news to it; one after the place's claim is:
    // its watcher then looks at once (the loss changed the round before the watch began).
    const int64_t lostNow = keys::parseCounter(batch.value(lost)).value_or(0);
    const int64_t lostKnown = std::min(lostNow, o.lostAtClaim);
    t.changesAtTake = lostKnown < lostNow ? 0 : keys::parseCounter(batch.value(changes)).value_or(0);
    t.leftAtClose = state->leftAtClose;
    t.lostSeen = std::max<int64_t>(0, lostKnown - state->leftAtClose);
    spdlog::info("rendezvous '{}': {} takes node rank {} ({}) in the running round {}: generation {}", id, name,
                 o.nodeRank, grow ? "a place the job grows by" : o.node + "'s place", running, o.generation);
    return t;
  }
  return std::nullopt;
}

}  // namespace drun::rdzv
