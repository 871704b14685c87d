// The rendezvous' layout in the store: every key name and the format of every value, in one
// place. The c10d rendezvous (c10d_rendezvous.cpp), its tests and the load generator
// (bench/rendezvous_bench.cpp) all build keys and parse values through this header only.
//
// Everything of job <run_id> lives under "rdzv/<run_id>/" (deletePrefix(job(run_id)) removes it):
//
//   rdzv/<id>/round                  decimal: the round new agents should join
//   rdzv/<id>/<r>/joined             append-only: one NodeDescriptor line per joiner, in order
//   rdzv/<id>/<r>/count              counter: arrivals (its add() result = arrival number)
//   rdzv/<id>/<r>/status             while open: a counter bumped by every event a waiting
//                                    joiner must look at (a will, last call disarmed);
//                                    once closed: the RoundState header (small: every joiner's
//                                    watch() returns it)
//   rdzv/<id>/<r>/state              the whole RoundState (header + roster), written by
//                                    compare_set("" -> state): the one decision among
//                                    concurrent closers; read only when status lags behind it
//   rdzv/<id>/<r>/assign/<node>      "<node rank>\t<rank offset>" of each member
//   rdzv/<id>/<r>/hosts              name of each node rank, as a HostList (compact runs)
//   rdzv/<id>/<r>/left               counter: members of the closed round gone (leave or will);
//                                    the one that makes it nodeCount deletes the job's keys
//                                    (unless nodes already wait in round r+1)
//   rdzv/<id>/<r>/lastcall           node id of the joiner that armed the last call (MIN reached)
//   rdzv/<id>/<r>/dead/<node>        "1": the node's will fired (or it gave up) in this round
//   rdzv/<id>/<r>/changes            counter: membership events of this round (deaths, nodes
//                                    waiting to join, members re-joining); watched after close
//   rdzv/<id>/<r>/last_change        text of the latest such event (the callback's reason)
//   rdzv/<id>/<r>/reeval/<status>    compare_set election: who re-evaluates after a death
//   rdzv/<id>/<r>/lost               counter: like `left`, but wills only (deaths, preemption): a
//                                    clean leave is not a loss. Before the close both are equal,
//                                    so lost - leftAtClose counts the members lost since
//   rdzv/<id>/<r>/rejoined           counter: joiners of round r that were members of r-1
//   rdzv/<id>/<r>/waiting            counter: nodes that announced they wait to join r+1
//   rdzv/<id>/<r>/finished           counter: members whose workers all succeeded (exit barrier)
//   rdzv/<id>/<r>/ending             how round r's members leave it, compare_set("" -> it), the
//                                    first writer wins: "finish" (a member's workers all
//                                    succeeded: the round runs to the job's end, a waiting node
//                                    learns the end) or "scale-up" (a member stops its workers
//                                    to take waiting nodes in: every member re-forms, a member
//                                    that finishes later too). Without it the two raced: a
//                                    finished member waited in the barrier for a member that
//                                    waited in the next round for it
//   rdzv/<id>/<r>/failure            the round's root cause (FailureRecord), compare_set("" -> it):
//                                    the first failure reported wins; its `final` says whether the
//                                    job's restart budget is spent
//   rdzv/<id>/outcome                the job's end: "succeeded", or "failed" + the final record
//   rdzv/<id>/refill                 "<round>\t<restarts>": a restarted (empty) store refilled
//                                    by the survivors: the round they re-form and the job's
//                                    restart count, raised to the most any survivor carries
//   rdzv/<id>/present                counter: the job's known nodes still here (members, spares,
//                                    late joiners): +1 at a node's first join (in the batch that
//                                    sets its will), -1 when it leaves or its will runs. The store's host serves until it is 0; the
//                                    node that makes it 0 removes the job's keys; a new start
//                                    that finds an outcome and nobody present resets the job
//   rdzv/<id>/<r>/last_dead          node id of the latest joiner whose will ran in round r (a
//                                    watcher tells a dying spare from a lost member by it)
//   rdzv/<id>/config                 the job's --nnodes and --max-restarts as its first node set
//                                    them (JobConfig):
//                                    compare_set("" -> it); a node started with other values
//                                    fails at once, naming both
//   rdzv/<id>/<r>/recoveries         counter: in-process recoveries opened in round r, each one
//                                    unit of the job's restart budget (a recovery that fell back
//                                    is taken off again: the restart that follows pays with it)
//   rdzv/<id>/<r>/workers/           the workers' store of round r under --recovery in-process
//                                    (DRUN_WORKER_STORE_PREFIX; its keys: recovery_keys.hpp)
//   rdzv/<id>/events/next            counter: events appended to the job's history
//   rdzv/<id>/events/<n % kEventSlots>  the n-th event (0-based), one JSON object with "seq": n;
//                                    a ring: the last kEventSlots events are kept
//
// Job-wide state: the restart count lives in each closed round's state (RoundState::restartCount):
// the closer of round r sets it to r-1's count, plus r-1's recoveries, plus one when r-1 has a
// failure record. Every
// node of a round therefore reads the same TORCHELASTIC_RESTART_COUNT.
//
// Values are text; every value read from the store is untrusted and parsed with a clear error
// (InvalidArgument / ProtocolError), never a crash.
// Threading: pure functions on values; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv::keys {

// Throws InvalidArgument unless the run id is 1..128 chars of [A-Za-z0-9_.:@+-].
void validateRunId(std::string_view runId);
// Node ids are generated by the rendezvous: 1..64 chars of [A-Za-z0-9_-].
bool isValidNodeId(std::string_view id);
// Whether `s` is an IPv4 or IPv6 address or a host name (RFC 1123 labels): what MASTER_ADDR and
// a node's address may be. Everything parsed back from the store is checked like this before use.
bool isHostOrAddress(std::string_view s);

std::string job(std::string_view runId);  // "rdzv/<id>/"
std::string currentRound(std::string_view runId);
std::string round(std::string_view runId, uint64_t round);  // "rdzv/<id>/<r>/"

std::string joined(std::string_view runId, uint64_t round);
std::string count(std::string_view runId, uint64_t round);
std::string status(std::string_view runId, uint64_t round);
std::string state(std::string_view runId, uint64_t round);
std::string lastCall(std::string_view runId, uint64_t round);
std::string dead(std::string_view runId, uint64_t round, std::string_view node);
std::string changes(std::string_view runId, uint64_t round);
std::string lastChange(std::string_view runId, uint64_t round);
std::string reeval(std::string_view runId, uint64_t round, std::string_view statusValue);
std::string assign(std::string_view runId, uint64_t round, std::string_view node);
std::string hosts(std::string_view runId, uint64_t round);
std::string left(std::string_view runId, uint64_t round);
std::string lost(std::string_view runId, uint64_t round);
std::string rejoined(std::string_view runId, uint64_t round);
std::string waiting(std::string_view runId, uint64_t round);
std::string finished(std::string_view runId, uint64_t round);
std::string ending(std::string_view runId, uint64_t round);
std::string failure(std::string_view runId, uint64_t round);
std::string outcome(std::string_view runId);
std::string config(std::string_view runId);
std::string present(std::string_view runId);
std::string refill(std::string_view runId);  // "<round>\t<restarts>": store_refill.hpp
std::string lastDead(std::string_view runId, uint64_t round);
std::string recoveries(std::string_view runId, uint64_t round);
std::string workerStore(std::string_view runId, uint64_t round);  // "rdzv/<id>/<r>/workers/"
// A lost member's place offered to a spare under --recovery in-process (docs/recovery.md "A lost
// node"; values: src/vacancy_board.hpp), keyed by the lost member's node id:
//   <r>/vacancy/<lost id>/claim   compare_set(absent -> survivor's id): who handles the loss
//   <r>/vacancy/<lost id>         the offer: generation, restart count, node rank, rank offset, ...
//   <r>/vacancy/<lost id>/taker   compare_set(absent -> spare's member id | "-" withdrawn)
//   <r>/vacancies                 append-only: one "<lost id>\n" per offer
//   <r>/replaced                  counter: members gone whose place a spare took
//   <r>/dropped                   counter: members gone that the survivors shrank the round
//                                 without (in place): the exit barrier counts them as finished
// A place at the end of the running round, offered to a node waiting in the next one (docs/
// recovery.md "Elastic in place", the grow): the same vacancy keys, keyed "grow-<k>", and
//   <r>/grows                     counter: grow places decided (taken or withdrawn); the k-th
//                                 grow's claim is vacancy/grow-<k>/claim (one grow at a time)
//   <r>/grown                     counter: members the round grew by (the taker adds 1 as it
//                                 takes the place): the exit barrier waits for them too
std::string vacancyClaim(std::string_view runId, uint64_t round, std::string_view lostNode);
std::string vacancy(std::string_view runId, uint64_t round, std::string_view lostNode);
std::string vacancyTaker(std::string_view runId, uint64_t round, std::string_view lostNode);
std::string vacancies(std::string_view runId, uint64_t round);
std::string replaced(std::string_view runId, uint64_t round);
std::string dropped(std::string_view runId, uint64_t round);
std::string grows(std::string_view runId, uint64_t round);
std::string grown(std::string_view runId, uint64_t round);
std::string growPlace(int64_t k);            // "grow-<k>": the k-th grow's place id
bool isGrowPlace(std::string_view placeId);  // a place a grow offered (not a lost member's)
std::string sharedValue(std::string_view runId, std::string_view name);  // "rdzv/<id>/shared/<hex name>"

// The job's history (docs/observe.md): `add(eventCount, 1) - 1` is an event's
// sequence number n; it is stored at eventSlot(n). Readers take the slots of the last
// kEventSlots numbers and keep those whose "seq" matches (a slot may still hold an older event).
inline constexpr uint64_t kEventSlots = 256;
std::string eventCount(std::string_view runId);             // "rdzv/<id>/events/next"
std::string eventSlot(std::string_view runId, uint64_t n);  // "rdzv/<id>/events/<n % slots>"
// The run id of an event slot key ("rdzv/<id>/events/<k>", k a number), else nullopt.
std::optional<std::string> runIdOfEventSlot(std::string_view key);

// The will a joiner of `round` registers: its dead flag, last_dead and the reason, changes+1,
// status+1 (skipped by the store once status holds the state), left+1, lost+1, status+1 of round+1
// (nodes already waiting there count the survivors of `round`) and present-1 (balancing the +1
// a node's first join sends in the same batch as its first will; a later round's will replaces
// it, so the node is counted out once).
// A member re-forming (`rejoining`) also counts itself gone from round-1 (left of round-1).
// Node ids are chosen by each agent: "<pid hex>-<64 random bits hex>".
Store::Will joinWill(std::string_view runId, uint64_t round, std::string_view node,
                     std::string_view displayName, bool rejoining = false);

// The will of a node counted in `present` that holds no place in a round (it is leaving, or gave
// up waiting): present-1 only, so that a cut while it leaves still counts it out, once.
Store::Will presenceWill(std::string_view runId);

// The will of a member whose workers all succeeded (finish()): its part of the job is done, so
// its death is no loss (no `lost`, no MemberLost: the others are not sent back to re-run), but
// it is gone (`left`: a later re-forming round does not wait for it) and out of `present`.
Store::Will finishedWill(std::string_view runId, uint64_t round, std::string_view node,
                         std::string_view displayName);
// One joiner, as it describes itself in `joined`:
//   "<id>\t<host>\t<addr>\t<local world size>\t<requested node rank or ->\t<master port>\t<m[rank]|->\n"
// (m: the node was a member of the previous round, with the node rank it had there: the closer
// takes members before newcomers, and gives them their old rank back when it is free).
struct NodeDescriptor {
  std::string id;          // unique per agent and job
  std::string host;        // --local-addr or hostname: identity for ordering and messages
  std::string addr;        // address the other nodes reach this node at (MASTER_ADDR if rank 0)
  int localWorldSize = 1;
  std::optional<int> requestedRank;  // --node-rank
  uint16_t masterPort = 0;           // port reserved on this node for MASTER_PORT
  bool rejoining = false;            // a member of the previous round
  std::optional<int> previousRank;   // its node rank there (kept when free: stable log paths, shards)
  uint64_t arrival = 0;              // position in `joined` (set by parseJoined, not encoded)

  // "host" or "host(addr)" when they differ: how messages name the node.
  std::string displayName() const;
};

// Throws InvalidArgument when a field cannot be encoded (tab/newline, empty, out of range).
std::string encodeDescriptor(const NodeDescriptor& node);
// Parses the `joined` value: well-formed lines in order, first occurrence of each id; malformed
// lines (a broken or foreign client) are skipped and counted in `skipped`.
std::vector<NodeDescriptor> parseJoined(std::string_view blob, size_t* skipped = nullptr);

// One node of a closed round, in node-rank order.
struct RosterEntry {
  std::string id;
  std::string name;  // NodeDescriptor::displayName()
  int localWorldSize = 1;
};

// The closer's decision: the value of `state` (with the roster) and, once closed, of `status`
// (header only):
//   "ok\t<nodes>\t<world size>\t<master addr>\t<master port>\t<changes>\t<left>\t<restarts>\t<roster digest>\n"
//   then one "<id>\t<name>\t<local world size>\n" per node rank;  or "error\t<message>".
// The roster digest (16 hex digits) lets every member compare two rounds' members without
// reading either roster: the same digest is the same node ids at the same node ranks.
struct RoundState {
  bool ok = true;
  std::string error;           // !ok: why the round failed (told to every joiner)
  int nodeCount = 0;
  int worldSize = 0;
  std::string masterAddr;
  uint16_t masterPort = 0;
  int64_t changesAtClose = 0;  // `changes` as the closer read it: the watch baseline
  int64_t leftAtClose = 0;     // `left` as the closer read it (wills of joiners not taken)
  int restartCount = 0;        // the job's restarts so far (TORCHELASTIC_RESTART_COUNT)
  std::vector<RosterEntry> roster;  // by node rank (empty in the header-only form)
  uint64_t rosterDigest = 0;        // rosterDigest(roster), in the header-only form too
};
uint64_t rosterDigest(const std::vector<RosterEntry>& roster);
std::string encodeState(const RoundState& state, bool withRoster = true);
// nullopt: not a state (an open round's counter). Throws ProtocolError on a corrupt state
// (fields; with a roster: its size, world size = sum of its local world sizes).
std::optional<RoundState> parseState(std::string_view value);

struct Assignment {
  int nodeRank = 0;
  int rankOffset = 0;
};
std::string encodeAssignment(const Assignment& a);
Assignment parseAssignment(std::string_view value);  // throws ProtocolError

// The hosts list: names in node-rank order, consecutive names that differ only in a counting
// number (node7, node8, ... or gpu-007.x, gpu-008.x) folded into one run, like SLURM's
// node[7-8]: a 4096-node job's list is a few bytes instead of tens of KB per reader. Lines:
//   "=<name>"  or  "~<prefix>\t<first>\t<count>\t<zero-padded width, 0 = none>\t<suffix>"
std::string encodeHostList(const std::vector<std::string>& names);
// Throws ProtocolError when malformed or when it does not hold exactly `expected` names.
std::vector<std::string> parseHostList(std::string_view value, size_t expected);

// The root cause record of `failure` and `outcome`:
//   "<rank>\t<local rank>\t<exit code>\t<signal>\t<pid>\t<time ms>\t<final 0|1>\t<others>\t<node>\t<source>\n<detail>"
// node and source are plain fields (source may be empty: written as "-"); detail is free text up
// to kMaxFailureDetail bytes (longer is cut on encoding).
constexpr size_t kMaxFailureDetail = 8192;
std::string encodeFailure(const FailureRecord& failure);
FailureRecord parseFailure(std::string_view value);  // throws ProtocolError
// `outcome`: "succeeded" or "failed\n" + encodeFailure(final record).
std::string encodeOutcome(const std::optional<FailureRecord>& failure);
// nullopt: succeeded; a record: failed. Throws ProtocolError when corrupt.
std::optional<FailureRecord> parseOutcome(std::string_view value);
// "resetting\t<node>": a new start of the same id claimed the ended job's keys (compare_set on
// `outcome`) and is removing them; the others wait until `outcome` is gone.
std::string encodeOutcomeReset(std::string_view node);
bool isOutcomeReset(std::string_view value);

// What every node of a job must agree on:
// "<min nodes>\t<max nodes>\t<node that set it>\t<max restarts>\n".
struct JobConfig {
  int minNodes = 1;
  int maxNodes = 1;
  std::string setBy;    // display name of the node that wrote it
  int maxRestarts = 0;  // the job's restart budget
  bool sameShape(const JobConfig& other) const {
    return minNodes == other.minNodes && maxNodes == other.maxNodes;
  }
};
std::string encodeJobConfig(const JobConfig& config);
JobConfig parseJobConfig(std::string_view value);  // throws ProtocolError

// `ending`: how a closed round's members leave it (the key scheme above).
enum class RoundEnding { Open, Finish, ScaleUp };
std::string encodeEnding(RoundEnding ending);  // "finish" | "scale-up" (Open: "")
// Absent: Open. Throws ProtocolError for any other value.
RoundEnding parseEnding(const std::optional<std::string>& value);

// Decimal int64 of a counter value; nullopt when absent; throws ProtocolError when not a number.
std::optional<int64_t> parseCounter(const std::optional<std::string>& value);

}  // namespace drun::rdzv::keys
