// The round planner: pure functions from the joiners' descriptors to the round's decision (node
// ranks, rank offsets, the values the closer publishes). No store, no network: unit-tested alone.
#include "drun/rendezvous/round_planner.hpp"

#include <algorithm>
#include <climits>

#include "drun/common/error.hpp"

namespace drun::rdzv {
namespace {

using keys::NodeDescriptor;

// Host order for node ranks: digit runs compare as numbers (node2 < node10), so that ranks
// follow the numbering users see, and the hosts list folds into runs.
bool naturalLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  auto isDigit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (isDigit(a[i]) && isDigit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && isDigit(a[ie])) ++ie;
      while (je < b.size() && isDigit(b[je])) ++je;
      // Compare the numbers without their leading zeros: longer is larger, else digit by digit.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      if (int c = a.substr(is, ie - is).compare(b.substr(js, je - js)); c != 0) return c < 0;
      if (ie - i != je - j) return ie - i < je - j;  // fewer leading zeros first
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}


}  // namespace

RoundPlan planRound(const std::vector<NodeDescriptor>& members) {
  const int n = static_cast<int>(members.size());
  if (n == 0) throw InvalidArgument("a round needs at least one node");
  RoundPlan plan;
  plan.nodeRank.assign(n, -1);
  plan.memberAtRank.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    if (!members[i].requestedRank) continue;
    const int r = *members[i].requestedRank;
    if (r >= n)
      throw InvalidArgument("node rank " + std::to_string(r) + " requested by " +
                            members[i].displayName() + " is out of range: the round has " +
                            std::to_string(n) + " node(s), ranks 0.." + std::to_string(n - 1));
    if (plan.memberAtRank[r] >= 0)
      throw InvalidArgument("node rank " + std::to_string(r) + " claimed by " +
                            members[plan.memberAtRank[r]].displayName() + " and " +
                            members[i].displayName());
    plan.memberAtRank[r] = i;
    plan.nodeRank[i] = r;
  }
  // Members of the previous round get their old rank back when it is free and in range, so that
  // the same nodes returning keep their ranks (prefixes, log paths and data shards stay put).
  for (int i = 0; i < n; ++i) {
    const auto& previous = members[i].previousRank;
    if (plan.nodeRank[i] >= 0 || !members[i].rejoining || !previous || *previous >= n ||
        plan.memberAtRank[*previous] >= 0)
      continue;
    plan.memberAtRank[*previous] = i;
    plan.nodeRank[i] = *previous;
  }
  std::vector<int> unranked;
  for (int i = 0; i < n; ++i)
    if (plan.nodeRank[i] < 0) unranked.push_back(i);
  std::sort(unranked.begin(), unranked.end(), [&](int a, int b) {
    if (members[a].host != members[b].host) return naturalLess(members[a].host, members[b].host);
    return members[a].arrival < members[b].arrival;
  });
  int next = 0;
  for (int i : unranked) {
    while (plan.memberAtRank[next] >= 0) ++next;
    plan.memberAtRank[next] = i;
    plan.nodeRank[i] = next;
  }
  plan.rankOffset.assign(n, 0);
  int64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    const int i = plan.memberAtRank[r];
    plan.rankOffset[i] = static_cast<int>(sum);
    sum += members[i].localWorldSize;
    if (sum > INT_MAX) throw InvalidArgument("world size over " + std::to_string(INT_MAX));
  }
  plan.worldSize = static_cast<int>(sum);
  const auto& master = members[plan.memberAtRank[0]];
  plan.masterAddr = master.addr;
  plan.masterPort = master.masterPort;
  return plan;
}

RoundDecision decideRound(const std::string& runId, uint64_t round,
                          const std::vector<NodeDescriptor>& members, RoundCounters counters) {
  RoundDecision d;
  d.state.changesAtClose = counters.changes;
  d.state.leftAtClose = counters.left;
  d.state.restartCount = counters.restartCount;
  try {
    // Counters only grow from 0: a negative one was written by something other than an agent.
    // Recorded, it would make the decision unreadable to every joiner; refused, it is named.
    if (counters.changes < 0 || counters.left < 0)
      throw InvalidArgument("corrupt counters in the store (never negative): [" +
                            keys::changes(runId, round) + "] = " + std::to_string(counters.changes) +
                            ", [" + keys::left(runId, round) + "] = " + std::to_string(counters.left));
    RoundPlan plan = planRound(members);
    d.state.nodeCount = static_cast<int>(members.size());
    d.state.worldSize = plan.worldSize;
    d.state.masterAddr = plan.masterAddr;
    d.state.masterPort = plan.masterPort;
    d.state.roster.reserve(members.size());
    std::vector<std::string> hosts;
    hosts.reserve(members.size());
    for (int i : plan.memberAtRank) {
      d.state.roster.push_back(
          {members[i].id, members[i].displayName(), members[i].localWorldSize});
      hosts.push_back(d.state.roster.back().name);
    }
    d.state.rosterDigest = keys::rosterDigest(d.state.roster);
    d.keys.reserve(members.size() + 3);
    d.values.reserve(members.size() + 3);
    for (size_t i = 0; i < members.size(); ++i) {
      d.keys.push_back(keys::assign(runId, round, members[i].id));
      d.values.push_back(keys::encodeAssignment({plan.nodeRank[i], plan.rankOffset[i]}));
    }
    d.keys.push_back(keys::hosts(runId, round));
    d.values.push_back(keys::encodeHostList(hosts));
  } catch (const InvalidArgument& e) {
    d.state = {};
    d.state.ok = false;
    d.state.restartCount = counters.restartCount;
    d.state.error = e.what();
  }
  d.decision = keys::encodeState(d.state);
  d.keys.push_back(keys::currentRound(runId));
  d.values.push_back(std::to_string(round + 1));
  d.keys.push_back(keys::status(runId, round));  // last: waiters read the rest after it
  d.values.push_back(keys::encodeState(d.state, /*withRoster=*/false));
  return d;
}


std::vector<NodeDescriptor> pickMembers(std::vector<NodeDescriptor> alive, int maxNodes) {
  std::stable_partition(alive.begin(), alive.end(),
                        [](const NodeDescriptor& n) { return n.rejoining; });
  if (static_cast<int>(alive.size()) > maxNodes) alive.resize(static_cast<size_t>(maxNodes));
  // The plan breaks ties between hosts by arrival: keep arrival order among those taken.
  std::stable_sort(alive.begin(), alive.end(), [](const NodeDescriptor& a, const NodeDescriptor& b) {
    return a.arrival < b.arrival;
  });
  return alive;
}

}  // namespace drun::rdzv
