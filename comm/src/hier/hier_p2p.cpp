#include "hier/hier_p2p.hpp"
#include "hier/hier_p2p_parts.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "drun/common/error.hpp"
#include "gloo/gloo_p2p.hpp"

namespace drun::comm::detail {
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
