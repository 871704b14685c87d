// The in-process recovery's key names and value codecs (recovery_keys.hpp).
#include "drun/rendezvous/recovery_keys.hpp"

#include <algorithm>
#include <charconv>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"

namespace drun::rdzv::recovery {
namespace {

std::string inGeneration(std::string_view prefix, uint64_t g, std::string_view name) {
  return std::string(prefix) + "recovery/" + std::to_string(g) + "/" + std::string(name);
}

template <typename Int>
std::optional<Int> parseDecimal(std::string_view text) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string generation(std::string_view prefix) { return std::string(prefix) + "recovery/generation"; }
std::string opener(std::string_view prefix, uint64_t g) { return inGeneration(prefix, g, "opener"); }
std::string lost(std::string_view prefix, uint64_t g, int rank) {
  return inGeneration(prefix, g, "lost/" + std::to_string(rank));
}
std::string lostRanks(std::string_view prefix, uint64_t g) { return inGeneration(prefix, g, "lost_ranks"); }
std::string restartCount(std::string_view prefix, uint64_t g) {
  return inGeneration(prefix, g, "restart_count");
}
std::string joined(std::string_view prefix, uint64_t g, int rank) {
  return inGeneration(prefix, g, "joined/" + std::to_string(rank));
}
std::string formed(std::string_view prefix, uint64_t g) { return inGeneration(prefix, g, "formed"); }
std::string outcome(std::string_view prefix, uint64_t g) { return inGeneration(prefix, g, "outcome"); }
std::string world(std::string_view prefix, uint64_t g) { return inGeneration(prefix, g, "world"); }

uint64_t parseGeneration(const std::optional<std::string>& value) {
  if (!value) return 0;
  auto g = parseDecimal<uint64_t>(*value);
  if (!g) throw ProtocolError("recovery/generation holds '" + text::printable(*value) + "', not a generation");
  return *g;
}

std::string encodeRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::vector<int> parseRanks(std::string_view value) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    std::string_view item = value.substr(start, comma == std::string_view::npos ? value.npos : comma - start);
    auto rank = parseDecimal<int>(item);
    if (!rank || *rank < 0)
      throw ProtocolError("recovery lost_ranks holds '" + text::printable(value) + "', not a list of ranks");
    out.push_back(*rank);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

namespace {
int indexOf(const std::vector<int>& list, int value) {
  auto at = std::find(list.begin(), list.end(), value);
  return at == list.end() ? -1 : static_cast<int>(at - list.begin());
}
}  // namespace

int World::renumber(int previous) const { return indexOf(ranks, previous); }
int World::renumberNode(int previous) const { return indexOf(nodeRanks, previous); }

std::optional<Place> renumberPlace(Place place, const std::vector<World>& worldsAfter) {
  for (const World& w : worldsAfter) {
    place = {w.renumberNode(place.nodeRank), w.renumber(place.rankOffset)};
    if (place.nodeRank < 0 || place.rankOffset < 0) return std::nullopt;
  }
  return place;
}

std::string encodeWorld(const World& w) {
  std::string out = encodeRanks(w.ranks) + "\t" + encodeRanks(w.nodeRanks);
  if (w.grows()) out += "\t" + std::to_string(w.addedRanks) + "\t" + std::to_string(w.addedNodes);
  return out;
}

World parseWorld(std::string_view value) {
  const size_t tab = value.find('\t');
  auto bad = [&] {
    return ProtocolError("recovery world holds '" + text::printable(value, {.maxBytes = 200}) +
                         "', not what drun writes");
  };
  if (tab == std::string_view::npos) throw bad();
  World w;
  std::string_view nodes = value.substr(tab + 1);
  if (const size_t added = nodes.find('\t'); added != std::string_view::npos) {
    // A grow's counts: "<ranks added>\t<nodes added>", each at least 1.
    const std::string_view counts = nodes.substr(added + 1);
    nodes = nodes.substr(0, added);
    const size_t between = counts.find('\t');
    if (between == std::string_view::npos) throw bad();
    auto addedRanks = parseDecimal<int>(counts.substr(0, between));
    auto addedNodes = parseDecimal<int>(counts.substr(between + 1));
    if (!addedRanks || !addedNodes || *addedRanks < 1 || *addedNodes < 1) throw bad();
    w.addedRanks = *addedRanks;
    w.addedNodes = *addedNodes;
  }
  try {
    w.ranks = parseRanks(value.substr(0, tab));
    w.nodeRanks = parseRanks(nodes);
  } catch (const ProtocolError&) {
    throw bad();
  }
  for (const std::vector<int>* list : {&w.ranks, &w.nodeRanks}) {
    std::vector<int> sorted = *list;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) throw bad();
  }
  return w;
}

std::string encodeFallback(std::string_view reason) { return std::string(kFallbackPrefix) + std::string(reason); }

Outcome parseOutcome(std::string_view value) {
  if (value == kFormed) return {true, ""};
  if (value.starts_with(kFallbackPrefix)) return {false, std::string(value.substr(kFallbackPrefix.size()))};
  throw ProtocolError("recovery outcome holds '" + text::printable(value) + "', neither formed nor a fallback");
}

}  // namespace drun::rdzv::recovery
