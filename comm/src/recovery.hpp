// Recovery: the world communicator's side of drun's in-process recovery (docs/recovery.md), over
// the workers' store (DRUN_WORKER_STORE, its prefix DRUN_WORKER_STORE_PREFIX already applied):
//   - the keys: recovery/generation (absent = 0), recovery/<g>/lost/<rank> (the agent's record
//     of a lost rank), recovery/<g>/joined/<rank>, recovery/<g>/formed, recovery/<g>/outcome,
//     recovery/<g>/world (a shrink or a grow: the ranks of the generation before that g keeps,
//     in order, and the ranks a grow adds after them),
//     and the communicator's own keys of generation g under drun_comm/g<g>/;
//   - a watcher thread on a connection of its own (a store connection runs one call at a time,
//     and a watch blocks): it follows recovery/generation and, for each value past the
//     generation the communicator is at (follow()), describes the lost ranks and calls the
//     listener; a forming connection (formingStore) of an older generation is interrupted at
//     once, so that a rank forming g abandons it as soon as g+1 begins;
//   - the text of a lost rank from its record: JSON an agent wrote, untrusted (a record that is
//     not valid JSON, or holds odd types, is said to be unreadable, never a crash).
// Threading: thread-safe. The listener runs on the watcher thread, never after stop() returned.
// Ownership: owned by the world communicator's Impl; the watcher's state is shared with its
// thread (a thread left past its join bound touches nothing of the owner's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "drun/common/owned_thread.hpp"
#include "drun/store/store.hpp"

namespace drun::comm::detail {

using std::chrono::milliseconds;

class Recovery {
 public:
  // A new connection to the workers' store (prefixed), giving up after `connectTimeout`.
  using Connect = std::function<std::shared_ptr<rdzv::LivenessStore>(milliseconds connectTimeout)>;
  // newest: the generation now; why: "generation 3 began: rank 2 (node1 pid 77, killed by
  // signal 9) was lost"; grow: every generation since the followed one is a grow (no rank lost:
  // nothing to abort, the program moves at its next commit).
  using Listener = std::function<void(uint64_t newest, const std::string& why, bool grow)>;

  // store: the workers' store (prefixed) the communicator uses; connect: more connections to it.
  Recovery(std::shared_ptr<rdzv::LivenessStore> store, Connect connect, int rank, int size,
           milliseconds timeout);
  ~Recovery();
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // recovery/generation now (absent: 0). ProtocolError for a value that is not a generation.
  uint64_t newest();
  // (newest, "generation 3 began: ...") when a generation past `from` began, else (0, "").
  std::pair<uint64_t, std::string> newerThan(uint64_t from);
  // Waits (on the communicator's connection) until a generation past `from` began and returns
  // it as newerThan() does; (0, "") at the deadline.
  std::pair<uint64_t, std::string> waitNewerThan(uint64_t from, milliseconds timeout);
  // drun_comm/g<g>/ on the communicator's connection.
  std::shared_ptr<rdzv::LivenessStore> generationStore(uint64_t g) const;
  // drun_comm/g<g>/ on a new connection, for connecting generation g's transports: its calls
  // fail with NetworkError once a generation past g is seen. endForming() closes it.
  std::shared_ptr<rdzv::LivenessStore> formingStore(uint64_t g, milliseconds connectTimeout);
  void endForming();
  // A rank and size in some generation.
  struct Place {
    int rank = 0;
    int size = 1;
  };
  // `place` (of generation `base`) in generation `g`: each shrink or grow in (base, g] renumbers it
  // (recovery/<g>/world). CommError when a shrink dropped it; ProtocolError for a record that
  // is not what an agent writes.
  Place placeIn(uint64_t base, uint64_t g, Place place);
  // Whether every generation in (from, to] is a grow: a world record that adds ranks, no rank
  // lost (docs/recovery.md "Elastic in place"). False when a record cannot be read.
  bool growsOnly(uint64_t from, uint64_t to);
  static bool growsOnly(rdzv::LivenessStore& store, uint64_t from, uint64_t to);
  // The rank and size the keys below and the watcher's descriptions use from now on.
  void resize(Place place);
  // recovery/<g>/joined/<rank> = "<host> pid <pid>" (g > 0).
  void joined(uint64_t g);
  // add(recovery/<g>/formed, 1); the rank whose add reaches the size sets the outcome "formed"
  // unless one is set already (g > 0).
  void formed(uint64_t g);

  // Starts the watcher (once): from now on each generation past the followed one goes to the
  // listener (set with follow()).
  void start();
  // The communicator is at generation g now; generations past it go to `listener`.
  void follow(uint64_t g, Listener listener);
  // Stops and joins the watcher (bounded); no listener call runs after it returns.
  void stop();

  // "rank 2 (node1 pid 77, killed by signal 9)" from a lost rank's record (JSON).
  static std::string describeLostRank(int rank, const std::string& record);

 private:
  struct Watch;
  static std::string describe(rdzv::LivenessStore& store, int size, uint64_t from, uint64_t to);
  static void watchLoop(const std::shared_ptr<Watch>& w);

  std::shared_ptr<rdzv::LivenessStore> store_;
  Connect connect_;
  int rank_;
  int size_;
  milliseconds timeout_;
  std::shared_ptr<Watch> watch_;
  OwnedThread thread_;
};

// "recovery/generation"'s value as a generation; ProtocolError naming it otherwise.
uint64_t parseGeneration(const std::string& text);

}  // namespace drun::comm::detail

namespace drun::comm::detail {
// recovery/<g>/world: "<ranks>\t<node ranks>", a grow's with "\t<ranks added>\t<nodes added>"
// (the agent's codec): the ranks kept in their new order and the ranks added after them.
// ProtocolError for anything else.
struct WorldRecord {
  std::vector<int> kept;
  int added = 0;
};
WorldRecord parseWorldRecord(const std::string& value);
}  // namespace drun::comm::detail
