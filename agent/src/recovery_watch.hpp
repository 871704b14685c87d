// RecoveryWatch: how every agent learns of an in-process recovery (docs/recovery.md), wherever
// it was opened: one owned thread watches the round's recovery/generation and reports each
// generation that begins (with its lost ranks, restart count and world record), each one in
// order, also when several began between two of its looks (a shrink and a grow published back to
// back: every agent renumbers its place through each world record in turn, so none is skipped);
// another watches the newest generation's outcome and reports it ("formed" or a fallback's reason). Each thread has a
// connection of its own to the workers' store (connected on the thread: never on the loop).
//
// Threading: the callbacks run on the watch's threads and must only post (to the loop); none runs
// once stop() returned. stop() and the destructor from the owner's thread: stop() interrupts the
// connections and returns at once; the destructor joins (bounded): destroy it off the loop.
// Ownership: owns its threads and connections; shares with them only what they touch.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "drun/common/owned_thread.hpp"
#include "drun/store/store.hpp"
#include "recovery_generations.hpp"

namespace drun::agent::detail {

class RecoveryWatch {
 public:
  struct Handlers {
    std::function<std::unique_ptr<rdzv::LivenessStore>()> connect;  // a new connection
    std::function<void(const Generation&)> began;
    std::function<void(uint64_t generation, const std::string& outcome)> decided;
    std::function<void(const std::string& what)> failed;  // the store is gone: no more reports
  };
  // `slice`: the longest single watch (a stopped watch notices stop() at once anyway).
  // `after`: the generations up to it are known already and not reported (a node that took a
  // place in generation g knows the world of the generations before g).
  RecoveryWatch(std::string prefix, Handlers handlers, std::chrono::milliseconds slice, uint64_t after = 0);
  ~RecoveryWatch();
  RecoveryWatch(const RecoveryWatch&) = delete;
  RecoveryWatch& operator=(const RecoveryWatch&) = delete;

  void stop();

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  OwnedThread generations_;
  OwnedThread outcomes_;
};

}  // namespace drun::agent::detail
