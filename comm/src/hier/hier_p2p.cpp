#include "hier/hier_p2p.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "drun/common/error.hpp"
#include "gloo/gloo_p2p.hpp"

namespace drun::comm::detail {
namespace {

// A remote message's header: {payload bytes, kMagic, payload number or kInline}, then (inline)
// the payload.
constexpr size_t kHeaderBytes = 24;
constexpr uint64_t kMagic = 0x6472756e70327002;  // "drunp2p" 2
constexpr uint64_t kInline = ~uint64_t{0};
// Payloads up to this size ride in the header's message: a copy on each side (~5 us at 64 KiB)
// costs less than the second Gloo message (a round trip of notifications, tens of us).
constexpr size_t kInlineBytes = 64u << 10;
constexpr size_t kFrameBytes = kHeaderBytes + kInlineBytes;  // every header receive's room
// A remote leg waits until a message comes or the communicator ends: a Gloo wait that times out
// breaks the whole context, and an orphan's wait is nobody's operation.
constexpr milliseconds kLegTimeout = std::chrono::hours(24 * 365);
// How often a waiter asks the Gloo poller again for the leg it depends on (the poller serves
// one request at a time and turns to whichever was asked for last).
constexpr milliseconds kWantAgain{20};

// A separate payload's tag: negative (no user's), numbered per ordered pair of ranks.
int payloadTag(uint64_t number) { return static_cast<int>(0x80000000u | (number & 0x7fffffffu)); }

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

GlooP2P& asGloo(const std::shared_ptr<Request::State>& request) { return dynamic_cast<GlooP2P&>(*request); }

}  // namespace

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

  std::string describe() const {
    return "recv from " + (src == kAnySource ? std::string("any rank") : "rank " + std::to_string(src)) +
           " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
  }
  // mutex_ held: notices a completion of the local leg (testing it drives the segment).
  void poll() {
    if (done || !localLeg || localCancelled) return;
    bool finished = false;
    std::exception_ptr e;
    try {
      finished = localLeg->test();
    } catch (...) {
      finished = true;
      e = std::current_exception();
    }
    if (!finished) return;
    if (int s = localLeg->source(); s >= 0) from = engine->rankOfLocal_[static_cast<size_t>(s)];
    engine->complete(*this, e);
  }
  // Gloo's failure of this operation's receive, saying which operation (and so which rank).
  std::exception_ptr named(std::exception_ptr e) const {
    try {
      std::rethrow_exception(e);
    } catch (const TimeoutError& t) {
      return std::make_exception_ptr(TimeoutError("hierarchical " + describe() + " timed out after " +
                                                  std::to_string(timeout.count()) + "ms (" + t.what() + ")"));
    } catch (const CommError& c) {
      return std::make_exception_ptr(CommError("hierarchical " + describe() + ": " + c.what()));
    } catch (...) {
      return e;
    }
  }
  // mutex_ held: `request` (header or payload) finished, with `e` or not.
  void finished(const std::shared_ptr<Request::State>& request, std::exception_ptr e) {
    if (done) return;
    if (e) return engine->complete(*this, named(e));
    if (request == header) {
      header.reset();
      return engine->deliver(*this, request->source(), Header::parse(*frame));
    }
    payload.reset();
    engine->complete(*this);
  }
  // mutex_ held: the receive to block on or poll now, and the leg to ask the poller for.
  std::shared_ptr<Request::State> current() const { return payload ? payload : header; }
  std::shared_ptr<Request::State> legToWant() const {
    if (leg) return leg->request;
    auto t = engine->tags_.find(tag);
    return held && t != engine->tags_.end() && t->second.leg ? t->second.leg->request : nullptr;
  }
  [[noreturn]] void fail(std::exception_ptr e) {
    std::lock_guard lock(engine->mutex_);
    engine->complete(*this, e);
    std::rethrow_exception(error);
  }

  void wait(milliseconds limit) override {
    const auto until = limit == kDefaultTimeout ? deadline.when() : Clock::now() + limit;
    for (;;) {
      const uint64_t seen = engine->signal_->now();
      std::shared_ptr<Request::State> blockOn, want;
      {
        std::lock_guard lock(engine->mutex_);
        engine->driveLocked(tag);
        poll();
        if (done) {
          if (error) std::rethrow_exception(error);
          return;
        }
        blockOn = current();
        want = legToWant();
      }
      if (blockOn) {  // a Gloo receive of this operation's own: block in Gloo
        std::exception_ptr e;
        try {
          blockOn->wait(limit == kDefaultTimeout ? kDefaultTimeout
                                                 : std::max(milliseconds(1), Deadline::at(until).remaining()));
        } catch (...) {
          e = std::current_exception();
        }
        std::lock_guard lock(engine->mutex_);
        finished(blockOn, e);
        continue;
      }
      if (Clock::now() >= until)
        fail(std::make_exception_ptr(TimeoutError("hierarchical " + describe() + " timed out after " +
                                                  std::to_string((limit == kDefaultTimeout ? timeout : limit).count()) + "ms")));
      if (want) {
        try {
          want->test();  // the poller serves it next
        } catch (...) {
          // its failure is settled by driveLocked
        }
      }
      engine->signal_->waitChange(seen, std::min(until, Clock::now() + kWantAgain));
    }
  }

  bool test() override {
    std::shared_ptr<Request::State> want;
    {
      std::lock_guard lock(engine->mutex_);
      engine->driveLocked(tag);
      poll();
      for (int phase = 0; phase < 2 && !done; ++phase) {  // the header, then its payload
        auto request = current();
        if (!request) break;
        try {
          if (!request->test()) break;
          finished(request, nullptr);
        } catch (...) {
          finished(request, std::current_exception());
        }
      }
      if (done) {
        if (error) std::rethrow_exception(error);
        return true;
      }
      if (held && deadline.expired()) {
        engine->complete(*this, std::make_exception_ptr(TimeoutError(
                                    "hierarchical " + describe() + " timed out after " + std::to_string(timeout.count()) + "ms")));
        std::rethrow_exception(error);
      }
      want = legToWant();
    }
    if (want) {
      try {
        want->test();
      } catch (...) {
      }
    }
    return false;
  }

  int source() const override { return from.load(); }
};

HierP2P::HierP2P(Backend* local, Backend& full, std::vector<int> localIndex)
    : local_(local), full_(full), localIndex_(std::move(localIndex)), signal_(std::make_shared<Signal>()),
      payloadSeq_(localIndex_.size(), 0) {
  for (size_t r = 0; r < localIndex_.size(); ++r) {
    if (localIndex_[r] < 0) {
      remoteRanks_.push_back(static_cast<int>(r));
    } else {
      rankOfLocal_.resize(std::max(rankOfLocal_.size(), static_cast<size_t>(localIndex_[r]) + 1));
      rankOfLocal_[static_cast<size_t>(localIndex_[r])] = static_cast<int>(r);
    }
  }
  if (local_) local_->setP2PListener([signal = signal_] { signal->ring(); });
}

void HierP2P::complete(Recv& r, std::exception_ptr error) {
  if (r.done) return;
  r.error = error;
  r.done = true;
  signal_->ring();
}

std::shared_ptr<Request::State> HierP2P::isend(const void* buf, size_t bytes, int dst, int tag,
                                               milliseconds timeout) {
  const int local = localIndex_[static_cast<size_t>(dst)];
  uint64_t number = kInline;
  {
    std::lock_guard lock(mutex_);
    if (!stopped_.empty()) throw CommError("hierarchical send: " + stopped_);
    if (local < 0 && bytes > kInlineBytes) number = payloadSeq_[static_cast<size_t>(dst)]++;
  }
  if (local >= 0) return local_->isend(buf, bytes, local, tag, timeout);
  const bool inlined = number == kInline;
  auto frame = std::make_shared<std::vector<char>>(kHeaderBytes + (inlined ? bytes : 0));
  const uint64_t header[3] = {bytes, kMagic, number};
  std::memcpy(frame->data(), header, kHeaderBytes);
  if (inlined && bytes) std::memcpy(frame->data() + kHeaderBytes, buf, bytes);
  auto first = full_.isend(frame->data(), frame->size(), dst, tag, timeout);
  asGloo(first).onFinish([frame] {});  // the frame lives as long as Gloo may read it
  if (inlined) return first;
  return std::make_shared<PairedSend>(first, full_.isend(buf, bytes, dst, payloadTag(number), timeout));
}

std::shared_ptr<Request::State> HierP2P::irecv(void* buf, size_t bytes, int src, int tag, milliseconds timeout) {
  if (src != kAnySource) {
    if (int local = localIndex_[static_cast<size_t>(src)]; local >= 0) {
      {
        std::lock_guard lock(mutex_);
        if (!stopped_.empty()) throw CommError("hierarchical recv: " + stopped_);
      }
      return std::make_shared<LocalRecv>(local_->irecv(buf, bytes, local, tag, timeout), src);
    }
  }
  auto r = std::make_shared<Recv>();
  r->engine = shared_from_this();
  r->buf = static_cast<char*>(buf);
  r->bytes = bytes;
  r->src = src;
  r->tag = tag;
  r->timeout = timeout;
  r->deadline = Deadline(timeout);
  std::lock_guard lock(mutex_);
  if (!stopped_.empty()) throw CommError("hierarchical recv: " + stopped_);
  driveLocked(tag);
  TagState& t = tags_[tag];
  // From any rank with peers on this host: listen on the segment at once, in posting order.
  if (src == kAnySource && local_) r->localLeg = local_->irecv(buf, bytes, kAnySource, tag, timeout);
  if (t.leg || !t.held.empty()) {
    r->held = true;
    t.held.push_back(r);
  } else if (!takeStashed(t, *r)) {
    if (src == kAnySource && local_) postLeg(t, r);
    else postHeader(*r);
  }
  return r;
}

void HierP2P::driveLocked(int tag) {
  if (!stopped_.empty()) return;
  auto it = tags_.find(tag);
  if (it == tags_.end()) return;
  TagState& t = it->second;
  if (t.leg && t.leg->finished->load()) settleLeg(t);
  if (!t.leg) dispatchHeld(t);
  if (!t.leg && t.held.empty() && t.stash.empty()) tags_.erase(it);
}

// The remote leg got a header (or failed): its receive takes the message when its local leg
// matched nothing (withdrawn now), else the header is kept for the next receive that matches.
void HierP2P::settleLeg(TagState& t) {
  std::shared_ptr<Leg> leg = std::move(t.leg);
  t.leg.reset();
  std::exception_ptr error;
  int sender = -1;
  try {
    leg->request->test();  // finished: returns, or throws its failure
    sender = leg->request->source();
  } catch (...) {
    error = std::current_exception();
  }
  Recv& owner = *leg->owner;
  owner.leg.reset();
  owner.poll();
  if (!owner.done && (owner.localCancelled || local_->cancelRecv(*owner.localLeg))) {
    owner.localCancelled = true;
    if (error) complete(owner, error);
    else deliver(owner, sender, Header::parse(*leg->frame));
    return;
  }
  if (error) return;  // Gloo failed: its context is broken, the next receives fail there
  auto kept = std::make_shared<Stashed>();
  kept->src = sender;
  kept->frame = std::move(*leg->frame);
  kept->header = Header::parse(kept->frame);
  t.stash.push_back(std::move(kept));
}

void HierP2P::dispatchHeld(TagState& t) {
  while (!t.leg && !t.held.empty()) {
    std::shared_ptr<Recv> r = t.held.front();
    t.held.pop_front();
    r->held = false;
    r->poll();
    if (r->done || takeStashed(t, *r)) continue;
    if (r->src == kAnySource && local_) postLeg(t, r);
    else postHeader(*r);
  }
}

bool HierP2P::takeStashed(TagState& t, Recv& r) {
  auto it = std::find_if(t.stash.begin(), t.stash.end(),
                         [&](const std::shared_ptr<Stashed>& s) { return r.src == kAnySource || r.src == s->src; });
  if (it == t.stash.end()) return false;
  if (r.localLeg && !r.localCancelled) {
    if (!local_->cancelRecv(*r.localLeg)) return true;  // it matched a local message: that one is its
    r.localCancelled = true;
  }
  std::shared_ptr<Stashed> kept = *it;
  t.stash.erase(it);
  deliver(r, kept->src, kept->header);  // (copies an inline payload out of kept->frame)
  return true;
}

void HierP2P::deliver(Recv& r, int src, const Header& h) {
  r.from = src;
  const std::string about = "hierarchical " + r.describe() + ": ";
  if (h.malformed)
    return complete(r, std::make_exception_ptr(CommError(about + "rank " + std::to_string(src) + " sent a malformed message")));
  const milliseconds left = std::max(r.deadline.remaining(), milliseconds(1));
  if (h.length > r.bytes) {
    if (h.number != kInline) {  // take the payload into nothing: the sender's send completes
      auto sink = std::make_shared<std::vector<char>>(h.length);
      try {
        auto drop = full_.irecv(sink->data(), sink->size(), src, payloadTag(h.number), left);
        asGloo(drop).onFinish([sink] {});
        drop->test();  // the poller finishes it
      } catch (...) {
      }
    }
    return complete(r, std::make_exception_ptr(CommError(
                           about + "a message of " + std::to_string(h.length) + " bytes from rank " + std::to_string(src) +
                           " is longer than the receive buffer (" + std::to_string(r.bytes) + " bytes)")));
  }
  if (h.number == kInline) {
    if (h.length) std::memcpy(r.buf, h.inlined, h.length);
    return complete(r);
  }
  try {
    r.payload = full_.irecv(r.buf, h.length, src, payloadTag(h.number), left);
  } catch (...) {
    complete(r, std::current_exception());
  }
}

void HierP2P::postHeader(Recv& r) {
  try {
    r.frame = std::make_shared<std::vector<char>>(kFrameBytes);
    r.header = full_.irecv(r.frame->data(), r.frame->size(), r.src, r.tag, std::max(r.deadline.remaining(), milliseconds(1)));
    asGloo(r.header).onFinish([frame = r.frame] {});  // Gloo may write it as long as it lives
  } catch (...) {
    r.header.reset();
    complete(r, std::current_exception());
  }
}

void HierP2P::postLeg(TagState& t, const std::shared_ptr<Recv>& r) {
  auto leg = std::make_shared<Leg>();
  leg->owner = r;
  try {
    leg->request = full_.irecvFromAnyOf(leg->frame->data(), leg->frame->size(), remoteRanks_, r->tag, kLegTimeout);
    asGloo(leg->request).onFinish([finished = leg->finished, signal = signal_, frame = leg->frame] {
      finished->store(true);
      signal->ring();
    });
    leg->request->test();  // to the poller, which completes it
  } catch (...) {
    if (local_->cancelRecv(*r->localLeg)) {
      r->localCancelled = true;
      complete(*r, std::current_exception());
    }
    return;
  }
  r->leg = leg;
  t.leg = leg;
}

void HierP2P::stop(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (stopped_.empty()) stopped_ = why;
  auto error = std::make_exception_ptr(CommError("hierarchical point to point: " + why));
  for (auto& [tag, t] : tags_) {
    for (auto& r : t.held) complete(*r, error);
    if (t.leg) {
      complete(*t.leg->owner, error);
      t.leg->owner->leg.reset();  // (they point at each other)
    }
  }
  tags_.clear();  // a posted leg stays with the Gloo poller (its frame with it) until Gloo stops
}

}  // namespace drun::comm::detail
