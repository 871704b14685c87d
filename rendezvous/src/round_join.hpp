// RoundJoin: one node's join of one round of a c10d job, as an explicit state machine.
//
//   Joining --MIN arrived (first round, elastic)----> LastCall --too few alive at its end--> Joining
//   Joining --re-forming, every survivor back, fewer than MIN alive--> Replacing
//   Joining | LastCall | Replacing --decision with this node--> Decided
//   Joining | LastCall | Replacing --decision without it-----> NotTaken   (waits in the next round)
//   Joining | LastCall | Replacing --error decision, join or replace timeout--> Failed (throws)
//   Joining | Replacing --a lost member's place taken in the running round--> Decided
//
// A first round closes at MAX arrivals or at the end of its last call. A re-forming round (the
// previous round closed and its job runs) closes only once every survivor of the previous round
// is back — never on newcomers alone, who would otherwise form a second job beside the running
// one — with every alive joiner up to MAX, members first; short of MIN it waits replace_timeout
// for newcomers to take the lost nodes' places. Every transition is logged at debug with its
// reason and the time spent in the phase before.
//
// A node waiting for the next round while the job runs (a spare, a newcomer) also looks, at
// every wake, at the places of lost members the running round offers under --recovery
// in-process (vacancy_board.hpp) and takes one when it can: its seat is then in the running
// round (docs/recovery.md "A lost node").
//
// Per joiner: one batch of setWill, add(present) (its first join only), append(joined),
// add(count) (+ add(rejoined) for a member of the previous round), then watch(status) until the
// decision; the closer adds O(N) reads
// (round_closer).
//
// Threading: a short-lived object on the rendezvous' agent thread; it blocks (each store call
// with its deadline, the join with the join timeout).
#pragma once

#include <optional>
#include <string>

#include "c10d_node.hpp"
#include "exit_barrier.hpp"
#include "round_closer.hpp"

namespace drun::rdzv {

// The place this node got in a closed round, and what its membership watcher starts from.
struct Seat {
  RoundResult result;
  int64_t changesAtClose = 0;
  int64_t leftAtClose = 0;
  int64_t lostSeen = 0;  // members of the round lost before this node got its seat
  uint64_t rosterDigest = 0;  // the round's members (keys::rosterDigest); 0: not known (a place taken)
  // A spare that took a lost member's place in the running round: its id as that member
  // (result.round is then the running round, not the one it waited in).
  std::optional<std::string> memberId;
  int decidedNodeCount = 0;  // the running round's decision's node count (0: result.nodeCount)
};

// A running round to tell that this node waits to join the next one (empty: tell nobody).
struct Announcement {
  std::optional<uint64_t> round;
  std::string reason;
};

enum class JoinPhase { Joining, LastCall, Replacing, Decided, NotTaken, Failed };
const char* toString(JoinPhase phase);

class RoundJoin {
 public:
  // `forRunningJob`: this node arrived while the job runs (a spare, a late node): it waits as
  // long as the job runs, and says so.
  RoundJoin(LivenessStore& store, const C10dNode& node, ExitBarrier& barrier, uint64_t round,
            bool forRunningJob);

  // Joins; returns this node's seat, or nullopt when the round closed without it. Throws the
  // round's error (an error decision, the join timeout naming who came, no replacement).
  std::optional<Seat> run(Deadline& deadline, const Announcement& announce);

  JoinPhase phase() const { return phase_; }
  // After run() returned nullopt: the round the job moved to (a refilled store), if it did.
  std::optional<uint64_t> movedTo() const { return movedTo_; }

 private:
  enum class Event { LastCallArmed, LastCallDisarmed, ShortOfMin, Closed, ClosedWithoutMe, VacancyTaken, Error };
  struct Rule {
    JoinPhase from;
    Event event;
    JoinPhase to;
  };
  static const Rule kRules[];
  static const char* toString(Event event);
  void on(Event event, const std::string& reason);

  bool closeIfComplete(int64_t arrivals);
  void startLastCall(bool armedByMe);
  bool armLastCall();
  void disarmLastCall();
  std::optional<Seat> seat(const keys::RoundState& state);
  std::optional<Seat> takePlace();
  [[noreturn]] void timedOut();
  void giveUpPlace(const std::string& reason);
  bool jobRunsWithout();
  milliseconds replaceTimeout() const;
  std::string waitingText(int64_t arrivals, const Deadline& deadline) const;

  LivenessStore& store_;
  const C10dNode& node_;
  ExitBarrier& barrier_;
  RoundCloser closer_;
  const uint64_t round_;
  const bool forRunningJob_;
  Reform reform_;
  JoinPhase phase_ = JoinPhase::Joining;
  Clock::time_point phaseSince_ = Clock::now();
  Clock::time_point lastCallAt_ = kNever;  // when this node evaluates the last call
  Clock::time_point replaceBy_ = kNever;   // when the wait for replacements ends
  std::string shortage_;                   // who was lost, for the progress lines
  std::optional<uint64_t> movedTo_;
};

}  // namespace drun::rdzv
