// HierP2P's parts (hier_p2p.cpp's engine and hier_p2p_recv.cpp's receive share them): the wire
// format of a remote message's header, the receive's state, and the small request wrappers.
// Internal to the hierarchical backend; see hier_p2p.hpp for the design.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "gloo/gloo_p2p.hpp"
#include "hier/hier_p2p.hpp"

namespace drun::comm::detail {
namespace hierp2p {

// A remote message's header: {payload bytes, kMagic, payload number or kInline}, then (inline)
// the payload.
inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint64_t kMagic = 0x6472756e70327002;  // "drunp2p" 2
inline constexpr uint64_t kInline = ~uint64_t{0};
// Payloads up to this size ride in the header's message: a copy on each side (~5 us at 64 KiB)
// costs less than the second Gloo message (a round trip of notifications, tens of us).
inline constexpr size_t kInlineBytes = 64u << 10;
inline constexpr size_t kFrameBytes = kHeaderBytes + kInlineBytes;  // every header receive's room
// A remote leg waits until a message comes or the communicator ends: a Gloo wait that times out
// breaks the whole context, and an orphan's wait is nobody's operation.
inline constexpr milliseconds kLegTimeout = std::chrono::hours(24 * 365);
// How often a waiter asks the Gloo poller again for the leg it depends on (the poller serves
// one request at a time and turns to whichever was asked for last).
inline constexpr milliseconds kWantAgain{20};

// A separate payload's tag: negative (no user's), numbered per ordered pair of ranks.
inline int payloadTag(uint64_t number) { return static_cast<int>(0x80000000u | (number & 0x7fffffffu)); }

// A receive on the segment, reporting the communicator's rank as its source.
class LocalRecv final : public Request::State {
 public:
  LocalRecv(std::shared_ptr<Request::State> inner, int src) : inner_(std::move(inner)), src_(src) {}
  void wait(milliseconds timeout) override { inner_->wait(timeout); }
  bool test() override { return inner_->test(); }
  int source() const override { return src_; }

 private:
  std::shared_ptr<Request::State> inner_;
  int src_;
};

// A remote send of a separate payload: its header and its payload.
class PairedSend final : public Request::State {
 public:
  PairedSend(std::shared_ptr<Request::State> header, std::shared_ptr<Request::State> payload)
      : header_(std::move(header)), payload_(std::move(payload)) {}
  void wait(milliseconds timeout) override {
    const auto until = Clock::now() + timeout;
    header_->wait(timeout);
    payload_->wait(timeout == kDefaultTimeout ? timeout : std::max(milliseconds(1), Deadline::at(until).remaining()));
  }
  bool test() override { return header_->test() && payload_->test(); }

 private:
  std::shared_ptr<Request::State> header_, payload_;
};

inline GlooP2P& asGloo(const std::shared_ptr<Request::State>& request) { return dynamic_cast<GlooP2P&>(*request); }

}  // namespace hierp2p
using namespace hierp2p;  // the parts below are HierP2P's, which uses these names throughout


struct HierP2P::Header {
  uint64_t length = 0;
  uint64_t number = kInline;
  const char* inlined = nullptr;  // the payload when inline
  bool malformed = false;

  // A header receive's frame (Gloo does not say how many bytes arrived: the header does).
  static Header parse(const std::vector<char>& frame) {
    Header h;
    uint64_t magic = 0;
    std::memcpy(&h.length, frame.data(), 8);
    std::memcpy(&magic, frame.data() + 8, 8);
    std::memcpy(&h.number, frame.data() + 16, 8);
    h.malformed = magic != kMagic || (h.number == kInline ? h.length > kInlineBytes : h.length <= kInlineBytes);
    h.inlined = frame.data() + kHeaderBytes;
    return h;
  }
};

struct HierP2P::Stashed {
  int src = 0;
  Header header;
  std::vector<char> frame;  // header.inlined points into it
};

struct HierP2P::Signal {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t epoch = 0;

  void ring() {
    {
      std::lock_guard lock(mutex);
      ++epoch;
    }
    cv.notify_all();
  }
  uint64_t now() {
    std::lock_guard lock(mutex);
    return epoch;
  }
  void waitChange(uint64_t seen, Clock::time_point until) {
    std::unique_lock lock(mutex);
    cv.wait_until(lock, until, [&] { return epoch != seen; });
  }
};

struct HierP2P::Leg {
  std::shared_ptr<Recv> owner;
  std::shared_ptr<std::vector<char>> frame = std::make_shared<std::vector<char>>(kFrameBytes);
  std::shared_ptr<Request::State> request;
  std::shared_ptr<std::atomic<bool>> finished = std::make_shared<std::atomic<bool>>(false);
};

struct HierP2P::Recv final : Request::State {
  std::shared_ptr<HierP2P> engine;
  char* buf = nullptr;
  size_t bytes = 0;
  int src = 0;  // a rank or kAnySource
  int tag = 0;
  milliseconds timeout{0};
  Deadline deadline{milliseconds(0)};
  // Under engine->mutex_:
  std::shared_ptr<Request::State> localLeg;  // from any: the segment's receive (into buf)
  bool localCancelled = false;
  bool held = false;
  std::shared_ptr<Leg> leg;                   // from any: its posted remote leg
  std::shared_ptr<Request::State> header;     // the Gloo receive of a remote rank's header ...
  std::shared_ptr<std::vector<char>> frame;   // ... into this
  std::shared_ptr<Request::State> payload;    // the Gloo receive of a separate payload
  bool done = false;
  std::exception_ptr error;
  std::atomic<int> from{-1};

  std::string describe() const;
  // mutex_ held: notices a completion of the local leg (testing it drives the segment).
  void poll();
  // Gloo's failure of this operation's receive, saying which operation (and so which rank).
  std::exception_ptr named(std::exception_ptr e) const;
  // mutex_ held: `request` (header or payload) finished, with `e` or not.
  void finished(const std::shared_ptr<Request::State>& request, std::exception_ptr e);
  // mutex_ held: the receive to block on or poll now, and the leg to ask the poller for.
  std::shared_ptr<Request::State> current() const { return payload ? payload : header; }
  std::shared_ptr<Request::State> legToWant() const;
  [[noreturn]] void fail(std::exception_ptr e);

  void wait(milliseconds limit) override;
  bool test() override;
  int source() const override { return from.load(); }
};

}  // namespace drun::comm::detail
