// The invariants over a Cluster's journal (Cluster::violations) and its text for failure
// messages: see interleaving_harness.hpp. Included by it only.
#pragma once

namespace drun::rdzv::test {

inline bool overlaps(const Interval& a, const Interval& b) {
  return a.start < b.end && b.start < a.end;
}

inline bool isMember(const Interval& i, const std::string& node) {
  return std::find(i.result.hosts.begin(), i.result.hosts.end(), node) != i.result.hosts.end();
}

inline std::string describe(const Interval& i, Clock::time_point t0) {
  auto at = [&](Clock::time_point t) {
    if (t == Clock::time_point::max()) return std::string("open");
    return std::to_string(std::chrono::duration_cast<milliseconds>(t - t0).count()) + "ms";
  };
  std::string hosts;
  for (auto& h : i.result.hosts) hosts += (hosts.empty() ? "" : ",") + h;
  return i.node + " round " + std::to_string(i.result.round) + " rank " +
         std::to_string(i.result.nodeRank) + "/" + std::to_string(i.result.nodeCount) + " [" +
         hosts + "] master " + i.result.masterAddr + ":" + std::to_string(i.result.masterPort) +
         " restarts " + std::to_string(i.result.restartCount) + " " + at(i.start) + ".." +
         at(i.end);
}

inline std::vector<std::string> Cluster::violations() {
  std::lock_guard lock(mutex);
  std::vector<std::string> out;
  const auto t0 = created;
  auto isDead = [&](const std::string& name) {
    return std::any_of(deaths.begin(), deaths.end(), [&](auto& d) { return d.first == name; });
  };
  auto ms = [&](Clock::time_point t) {
    return std::to_string(std::chrono::duration_cast<milliseconds>(t - t0).count()) + "ms";
  };
  std::string lost;  // who died or was cut off, for the "stuck" messages
  for (auto& [name, at] : deaths) lost += " " + name + " died at " + ms(at) + ";";
  for (auto& [name, at] : cuts) lost += " " + name + "'s link was cut at " + ms(at) + ";";
  // Every node ends, none stuck.
  for (auto& n : nodes) {
    if (n->phase == Phase::Idle) continue;
    if (n->phase != Phase::Ended)
      out.push_back(n->name() + " never ended (still " +
                    (n->phase == Phase::Joining ? "joining" : "running or finishing") + ")");
    else if (n->ending == Ending::Stuck)
      out.push_back(n->name() + " stuck: " + n->endText + (lost.empty() ? "" : " (" + lost + " )"));
  }
  // A node whose link was cut runs on until it notices (fencing, bounded by the heartbeat
  // timeout): its rounds' overlap with the next is no split brain if it ends within that bound.
  auto fenced = [&](const Interval& i) {
    for (size_t c = 0; c < cuts.size(); ++c)
      if (cuts[c].first == i.node && i.result.round <= cutRoundLimits[c] &&
          i.end <= cuts[c].second + kFenceBound)
        return true;
    return false;
  };
  // (a) At most one round runs workers at a time: never two rank-0 groups of different rounds
  // at once, and no node counted in a round while it runs another.
  for (size_t i = 0; i < intervals.size(); ++i)
    for (size_t j = i + 1; j < intervals.size(); ++j) {
      const Interval& a = intervals[i];
      const Interval& b = intervals[j];
      if (a.result.round == b.result.round || !overlaps(a, b) || fenced(a) || fenced(b)) continue;
      if (a.result.nodeRank == 0 && b.result.nodeRank == 0)
        out.push_back("two rank-0 groups at once (split brain): " + describe(a, t0) + " AND " +
                      describe(b, t0));
      else if (isMember(b, a.node) || isMember(a, b.node))
        out.push_back("a node in two rounds' groups at once: " + describe(a, t0) + " AND " +
                      describe(b, t0));
    }
  // (b) A dead member's survivors stop within kTellBound (a MemberLost or Failed reached them).
  auto gone = deaths;
  gone.insert(gone.end(), cuts.begin(), cuts.end());
  for (auto& [dead, at] : gone)
    for (const Interval& i : intervals) {
      if (i.node == dead || !isMember(i, dead) || i.end <= at) continue;
      if (i.end - std::max(at, i.start) > kTellBound)
        out.push_back("round ran with lost member " + dead + " (gone at " + ms(at) + ") and " +
                      i.node + " was not told: " + describe(i, t0));
    }
  // (c) A succeeded job: every live node succeeded, or learned the job's end with its code 0
  // (JobEnded: a spare, a late node, one cut off in the barrier that came back; the agent then
  // exits 0 as Succeeded).
  const bool succeeded = std::any_of(nodes.begin(), nodes.end(),
                                     [](auto& n) { return n->ending == Ending::Succeeded; });
  if (succeeded)
    for (auto& n : nodes) {
      if (n->phase != Phase::Ended || isDead(n->name()) || n->ending == Ending::Succeeded) continue;
      if (n->ending == Ending::JobEnded && n->exitCode == 0) continue;
      out.push_back("the job succeeded but " + n->name() + " ended " + toString(n->ending) +
                    " (code " + std::to_string(n->exitCode) + "): " + n->endText);
    }
  // (f) Liveness: while at least MIN nodes live, no live node gives up with a rendezvous error
  // (a round that timed out with enough nodes, a "fewer than the minimum" that counted the
  // dead). Killed nodes are not live; a node whose link was cut comes back, so it is.
  int live = 0, minNodes = 0;
  for (auto& n : nodes) {
    if (n->phase == Phase::Idle) continue;
    minNodes = std::max(minNodes, n->options_.minNodes);
    if (!isDead(n->name())) ++live;
  }
  if (live >= minNodes)
    for (auto& n : nodes)
      if (n->phase == Phase::Ended && n->ending == Ending::Error && !isDead(n->name()))
        out.push_back(n->name() + " ended with a rendezvous error while " + std::to_string(live) +
                      " node(s) lived (MIN " + std::to_string(minNodes) + "): " + n->endText);
  // (e) One restart count per round, one root cause per round.
  for (const Interval& a : intervals)
    for (const Interval& b : intervals)
      if (a.result.round == b.result.round && a.result.restartCount != b.result.restartCount &&
          &a < &b)
        out.push_back("two restart counts in one round: " + describe(a, t0) + " AND " +
                      describe(b, t0));
  // (g) Consecutive rounds never share a MASTER_ADDR:PORT: a rank of the old round, fenced off
  // or not yet stopped, must not reach the new round's rank-0 store (a spare cut off while a
  // round closed with it as rank 0 must not join the next with the same port). Only
  // consecutive rounds: drun draws each port at random, and two rounds further apart may meet
  // one by chance.
  for (const Interval& a : intervals)
    for (const Interval& b : intervals)
      if (b.result.round == a.result.round + 1 && a.result.masterAddr == b.result.masterAddr &&
          a.result.masterPort == b.result.masterPort)
        out.push_back("two consecutive rounds share MASTER_ADDR:PORT: " + describe(a, t0) +
                      " AND " + describe(b, t0));
  for (const CauseSeen& a : causes)
    for (const CauseSeen& b : causes)
      if (&a < &b && a.round == b.round &&
          (a.cause.node != b.cause.node || a.cause.rank != b.cause.rank ||
           a.cause.statusCode() != b.cause.statusCode()))
        out.push_back("two root causes in round " + std::to_string(a.round) + ": " + a.node +
                      " has rank " + std::to_string(a.cause.rank) + " on " + a.cause.node + ", " +
                      b.node + " has rank " + std::to_string(b.cause.rank) + " on " + b.cause.node);
  return out;
}

inline std::string Cluster::journalText() {
  std::lock_guard lock(mutex);
  std::ostringstream os;
  os << "journal of job '" << runId << "':\n";
  for (auto& n : notes) os << "  did: " << n << "\n";
  for (auto& i : intervals) os << "  ran: " << describe(i, created) << "\n";
  for (auto& n : nodes) {
    os << "  node " << n->name() << ": " << toString(n->ending) << " (code " << n->exitCode
       << ") " << n->endText << "; events:";
    for (auto& e : n->seenEvents) os << " " << rdzv::toString(e.kind) << "@" << e.round;
    os << "\n";
  }
  return os.str();
}

}  // namespace drun::rdzv::test
