#include "shm/shm_p2p.hpp"
#include "shm/shm_copy.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "drun/common/error.hpp"
#include "drun/common/owned_thread.hpp"

namespace drun::comm::detail {

struct ShmP2P::Op final : Request::State {
  std::shared_ptr<ShmP2P> engine;
  bool isSend = false;
  char* buf = nullptr;
  size_t bytes = 0;
  int peer = 0;  // a rank or kAnySource
  int tag = 0;
  milliseconds timeout{0};
  Deadline deadline{milliseconds(0)};
  size_t moved = 0;       // bytes sent / received so far
  bool done = false;      // under engine->mutex_
  std::exception_ptr error;
  std::atomic<int> from{-1};

  std::string describe() const {
    return std::string(isSend ? "send to" : "recv from") + " " +
           (peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(engine->seg_->nameOf(peer))) + " (tag " +
           std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
  }

  void wait(milliseconds limit) override {
    // Drive it ourselves for a moment: a reply usually comes within microseconds.
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::microseconds(200)) {
      {
        std::lock_guard lock(engine->mutex_);
        if (!done) engine->progress();
        if (done) break;
      }
      sched_yield();
    }
    // The progress thread fails the operation at its deadline; the slack covers its sleep.
    const auto until = limit == kDefaultTimeout ? deadline.when() + std::chrono::seconds(1)
                                                : Clock::now() + limit;
    std::unique_lock lock(engine->mutex_);
    if (!engine->cv_.wait_until(lock, until, [&] { return done; }))
      throw TimeoutError("shm: wait for " + describe() + " timed out after " +
                         std::to_string((limit == kDefaultTimeout ? timeout : limit).count()) + "ms");
    if (error) std::rethrow_exception(error);
  }

  bool test() override {
    std::lock_guard lock(engine->mutex_);
    if (!done) engine->progress();
    if (done && error) std::rethrow_exception(error);
    return done;
  }

  int source() const override { return from.load(); }
};

struct ShmP2P::Unexpected {
  int src = 0;
  int tag = 0;
  std::vector<char> data;
  size_t received = 0;
  std::shared_ptr<Op> claimedBy;  // a receive posted while the message was still arriving
};

struct ShmP2P::Inbound {
  std::shared_ptr<Op> op;          // the receive it goes to, or
  std::shared_ptr<Unexpected> kept;  // where it is kept
  size_t total = 0, received = 0;
  bool discard = false;            // too long for its receive: read and dropped
};

ShmP2P::ShmP2P(std::shared_ptr<ShmSegment> segment, size_t maxUnexpectedBytes)
    : seg_(std::move(segment)), sends_(static_cast<size_t>(seg_->size())),
      inbound_(static_cast<size_t>(seg_->size())), maxUnexpectedBytes_(maxUnexpectedBytes) {}

void ShmP2P::forget(const std::shared_ptr<Unexpected>& kept) {
  unexpectedBytes_ -= kept->data.size();
  unexpected_.remove(kept);
}

ShmP2P::~ShmP2P() { stop("the communicator was destroyed"); }

void ShmP2P::stop(const std::string& why) {
  std::thread thread;
  {
    std::lock_guard lock(mutex_);
    if (stopped_.empty()) stopped_ = why;
    stopping_ = true;
    auto error = std::make_exception_ptr(CommError("shm: " + why));
    for (auto& q : sends_) {
      for (auto& op : q) complete(op, error);
      q.clear();
    }
    for (auto& op : recvs_) complete(op, error);
    recvs_.clear();
    for (auto& in : inbound_)
      if (in && in->op) complete(in->op, error);
    for (auto& u : unexpected_)
      if (u->claimedBy) complete(u->claimedBy, error);
    thread = std::move(thread_);
    cv_.notify_all();
  }
  seg_->ring(seg_->rank());
  if (thread.joinable()) {
    if (thread.get_id() == std::this_thread::get_id()) thread.detach();
    else thread.join();
  }
}

void ShmP2P::complete(const std::shared_ptr<Op>& op, std::exception_ptr error) {
  if (op->done) return;
  op->error = error;
  op->done = true;
  cv_.notify_all();
  if (listener_) listener_();
}

bool ShmP2P::cancel(Request::State& request) {
  std::lock_guard lock(mutex_);
  auto at = std::find_if(recvs_.begin(), recvs_.end(), [&](const std::shared_ptr<Op>& r) { return r.get() == &request; });
  if (at == recvs_.end()) return false;
  (*at)->done = true;
  recvs_.erase(at);
  return true;
}

void ShmP2P::setListener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

std::shared_ptr<ShmP2P::Op> ShmP2P::makeOp(bool isSend, void* buf, size_t bytes, int peer, int tag,
                                           milliseconds timeout) {
  auto op = std::make_shared<Op>();
  op->engine = shared_from_this();
  op->isSend = isSend;
  op->buf = static_cast<char*>(buf);
  op->bytes = bytes;
  op->peer = peer;
  op->tag = tag;
  op->timeout = timeout;
  op->deadline = Deadline(timeout);
  return op;
}

std::shared_ptr<Request::State> ShmP2P::isend(const void* buf, size_t bytes, int dst, int tag,
                                              milliseconds timeout) {
  auto op = makeOp(true, const_cast<void*>(buf), bytes, dst, tag, timeout);
  std::lock_guard lock(mutex_);
  if (stopping_) throw CommError("shm: " + stopped_);
  sends_[static_cast<size_t>(dst)].push_back(op);
  progress();
  startLocked();
  return op;
}

std::shared_ptr<Request::State> ShmP2P::irecv(void* buf, size_t bytes, int src, int tag, milliseconds timeout) {
  auto op = makeOp(false, buf, bytes, src, tag, timeout);
  std::lock_guard lock(mutex_);
  if (stopping_) throw CommError("shm: " + stopped_);
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    Unexpected& u = **it;
    if (u.claimedBy || u.tag != tag || (src != kAnySource && u.src != src)) continue;
    op->from = u.src;
    if (u.data.size() > bytes) {
      complete(op, std::make_exception_ptr(CommError(
                       "shm: a message of " + std::to_string(u.data.size()) + " bytes from rank " +
                       std::to_string(seg_->nameOf(u.src)) + " is longer than the receive buffer (" + std::to_string(bytes) + " bytes)")));
      if (u.received == u.data.size()) forget(*it);
      else {  // the rest arrives into nothing
        u.claimedBy = std::make_shared<Op>();
        u.claimedBy->done = true;
      }
      return op;
    }
    if (u.received == u.data.size()) {
      if (!u.data.empty()) copyBytes(buf, u.data.data(), u.data.size());
      op->moved = u.data.size();
      auto kept = *it;  // (forget() erases what `it` points at)
      forget(kept);
      complete(op);
    } else {
      u.claimedBy = op;
      startLocked();
    }
    return op;
  }
  recvs_.push_back(op);
  progress();
  startLocked();
  return op;
}

bool ShmP2P::pushSends(int dst) {
  auto& queue = sends_[static_cast<size_t>(dst)];
  const int me = seg_->rank();
  auto& head = seg_->ringHead(me, dst);
  auto& tail = seg_->ringTail(me, dst);
  bool moved = false;
  while (!queue.empty()) {
    auto op = queue.front();
    uint64_t t = tail.load(std::memory_order_relaxed);
    if (t - head.load(std::memory_order_acquire) >= seg_->cells()) break;  // full
    ShmCell* cell = seg_->cell(me, dst, t);
    const size_t len = std::min(seg_->cellPayload(), op->bytes - op->moved);
    cell->tag = static_cast<uint32_t>(op->tag);
    cell->length = static_cast<uint32_t>(len);
    cell->total = op->bytes;
    cell->offset = op->moved;
    if (len) copyBytes(reinterpret_cast<char*>(cell) + ShmSegment::kCellHeader, op->buf + op->moved, len);
    tail.store(t + 1, std::memory_order_release);
    op->moved += len;
    moved = true;
    if (op->moved == op->bytes) {
      queue.pop_front();
      complete(op);
    }
  }
  if (moved) seg_->ring(dst);
  return moved;
}

bool ShmP2P::drain(int src) {
  const int me = seg_->rank();
  auto& head = seg_->ringHead(src, me);
  auto& tail = seg_->ringTail(src, me);
  bool moved = false;
  for (uint64_t h = head.load(std::memory_order_relaxed); h < tail.load(std::memory_order_acquire); ++h) {
    const ShmCell* cell = seg_->cell(src, me, h);
    auto& in = inbound_[static_cast<size_t>(src)];
    if (!in) {  // a message's first cell: match it
      auto match = std::find_if(recvs_.begin(), recvs_.end(), [&](const std::shared_ptr<Op>& r) {
        return static_cast<uint32_t>(r->tag) == cell->tag && (r->peer == kAnySource || r->peer == src);
      });
      // Nobody waits for it and keeping it would pass the bound: it stays in the ring (and the
      // messages behind it, in order) until a receive is posted.
      if (match == recvs_.end() && cell->total > maxUnexpectedBytes_ - std::min(maxUnexpectedBytes_, unexpectedBytes_))
        break;
      in = std::make_shared<Inbound>();
      in->total = cell->total;
      if (match != recvs_.end()) {
        in->op = *match;
        recvs_.erase(match);
        in->op->from = src;
        if (in->total > in->op->bytes) {
          complete(in->op, std::make_exception_ptr(CommError(
                               "shm: a message of " + std::to_string(in->total) + " bytes from rank " +
                               std::to_string(seg_->nameOf(src)) + " is longer than the receive buffer (" +
                               std::to_string(in->op->bytes) + " bytes)")));
          in->discard = true;
        }
      }
      if (!in->op) {
        in->kept = std::make_shared<Unexpected>();
        in->kept->src = src;
        in->kept->tag = static_cast<int>(cell->tag);
        in->kept->data.resize(in->total);
        unexpected_.push_back(in->kept);
        unexpectedBytes_ += in->total;
      }
    }
    const char* payload = reinterpret_cast<const char*>(cell) + ShmSegment::kCellHeader;
    const size_t len = std::min<size_t>(cell->length, in->total - std::min(in->total, cell->offset));
    // (len 0: a zero-length message, whose buffer may be null: memcpy's arguments must not be)
    if (len > 0 && in->op && !in->discard) copyBytes(in->op->buf + cell->offset, payload, len);
    else if (len > 0 && in->kept) copyBytes(in->kept->data.data() + cell->offset, payload, len);
    in->received += len;
    head.store(h + 1, std::memory_order_release);
    moved = true;
    if (in->received >= in->total) {
      if (in->op && !in->discard) {
        in->op->moved = in->total;
        complete(in->op);
      } else if (in->kept) {
        in->kept->received = in->total;
        if (auto claimed = in->kept->claimedBy) {  // posted while it arrived
          if (!claimed->done) {
            if (!in->kept->data.empty()) copyBytes(claimed->buf, in->kept->data.data(), in->kept->data.size());
            claimed->moved = in->total;
            complete(claimed);
          }
          forget(in->kept);
        }
      }
      in.reset();
    }
  }
  if (moved) seg_->ring(src);  // room in its ring
  return moved;
}

bool ShmP2P::progress() {
  if (stopping_) return false;
  bool moved = false;
  for (int r = 0; r < seg_->size(); ++r) {
    if (r == seg_->rank()) continue;
    if (!sends_[static_cast<size_t>(r)].empty()) moved |= pushSends(r);
    moved |= drain(r);
  }
  return moved;
}

bool ShmP2P::pendingLocked() const {
  if (!recvs_.empty()) return true;
  for (const auto& q : sends_)
    if (!q.empty()) return true;
  for (const auto& in : inbound_)
    if (in) return true;
  for (const auto& u : unexpected_)
    if (u->claimedBy && !u->claimedBy->done) return true;
  return false;
}

void ShmP2P::checkFailures() {
  auto check = [&](const std::shared_ptr<Op>& op) {
    if (op->done) return true;
    std::string failure = op->peer == kAnySource ? seg_->anyFailure() : seg_->peerFailure(op->peer);
    if (!failure.empty()) {
      complete(op, std::make_exception_ptr(CommError("shm " + op->describe() + ": " + failure)));
      return true;
    }
    if (op->deadline.expired()) {
      complete(op, std::make_exception_ptr(TimeoutError("shm " + op->describe() + " timed out after " +
                                                        std::to_string(op->timeout.count()) + "ms")));
      return true;
    }
    return false;
  };
  for (auto& q : sends_)
    while (!q.empty() && check(q.front())) q.pop_front();  // a failed send leaves its ring mid-message: the pair is lost
  recvs_.remove_if(check);
  for (auto& u : unexpected_)
    if (u->claimedBy) check(u->claimedBy);
  for (auto& in : inbound_)
    if (in && in->op) check(in->op);
}

void ShmP2P::startLocked() {
  if (!thread_.joinable() && !stopping_) thread_ = spawnThreadWithSignalsBlocked([this] { loop(); });
  seg_->ring(seg_->rank());  // wake it: there is work
}

void ShmP2P::loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!pendingLocked()) {
      cv_.wait_for(lock, milliseconds(50));
      continue;
    }
    const uint32_t seen = seg_->bell();
    bool moved = false;
    try {
      moved = progress();
      checkFailures();
    } catch (...) {
      // progress() only copies memory; nothing may leave this thread regardless
    }
    if (!moved) {
      lock.unlock();
      seg_->sleepOnBell(seen, milliseconds(5));
      lock.lock();
    }
  }
}

}  // namespace drun::comm::detail
