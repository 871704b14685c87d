// Test support for the in-process recovery tests (vacancies and grows): a job of `n` members
// (hostA, hostB, ...) over one MemoryStore with round 0 formed, newcomers that join it, and the
// ways a member is lost.
#pragma once

#include <catch2/catch.hpp>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "c10d_test_support.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv::test {

// `n` members of an n:maxNodes job (maxRestarts 2), round 0 formed.
struct ElasticJob {
  MemoryCluster cluster;
  RendezvousOptions o;
  std::vector<std::unique_ptr<Rendezvous>> members;
  std::vector<RoundResult> rounds;
  std::vector<MemoryStore*> handles;

  ElasticJob(int n, int maxNodes) : o(options(n, maxNodes)) {
    o.maxRestarts = 2;
    handles.resize(size_t(n));
    for (int i = 0; i < n; ++i)
      members.push_back(cluster.agent(withNode(o, std::string("host") + char('A' + i)), &handles[size_t(i)]));
    std::vector<std::future<RoundResult>> joins;
    for (auto& m : members) joins.push_back(startNext(*m));
    for (auto& f : joins) rounds.push_back(getWithin(f));
  }
  // A node with the job's options (a spare, or a node the job may grow by).
  std::unique_ptr<Rendezvous> newcomer(const std::string& host, MemoryStore** handle = nullptr) {
    return cluster.agent(withNode(o, host), handle);
  }
  // Member i dies: its connection closes, its will runs.
  void kill(size_t i) { handles[i]->closeForTest(); }
  // Member i dies, and member `witness` is told (MemberLost).
  void lose(size_t i, size_t witness) {
    FirstChange lost(*members[witness], "member lost");
    kill(i);
    lost.get();
  }
  // Member i dies; `claimer` claims its place, offers it (generation 1) and withdraws it (no spare
  // took it). Returns the place as claimed.
  Vacancy loseAndWithdraw(size_t i, size_t claimer) {
    lose(i, claimer);
    std::vector<Vacancy> claimed = members[claimer]->claimLostMembers();
    REQUIRE(claimed.size() == 1);
    members[claimer]->postVacancy(claimed[0], 1, 1);
    CHECK(members[claimer]->withdrawVacancy(claimed[0]));
    return claimed[0];
  }
  // Blocks until `n` nodes joined round 1 (spares waiting there).
  void awaitWaiting(int64_t n) { awaitArrivals(cluster.store(), "job", 1, n); }
  int64_t counter(const std::string& key) { return keys::parseCounter(cluster.store().tryGet(key)).value_or(0); }
};

// The place a spare or a newcomer took: its node rank and first rank, and the world it joins.
inline void checkPlace(const RoundResult& took, int nodeRank, int rankOffset, int nodeCount, int worldSize) {
  CHECK(took.nodeRank == nodeRank);
  CHECK(took.rankOffset == rankOffset);
  CHECK(took.nodeCount == nodeCount);
  CHECK(took.worldSize == worldSize);
}

}  // namespace drun::rdzv::test
