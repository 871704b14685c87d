// HierP2P's receive (HierP2P::Recv): its waits and tests drive the engine (hier_p2p.cpp).
#include "hier/hier_p2p_parts.hpp"

namespace drun::comm::detail {
std::string HierP2P::Recv::describe() const {
  return "recv from " + (src == kAnySource ? std::string("any rank") : "rank " + std::to_string(src)) +
         " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
}

void HierP2P::Recv::poll() {
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

std::exception_ptr HierP2P::Recv::named(std::exception_ptr e) const {
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

void HierP2P::Recv::finished(const std::shared_ptr<Request::State>& request, std::exception_ptr e) {
  if (done) return;
  if (e) return engine->complete(*this, named(e));
  if (request == header) {
    header.reset();
    return engine->deliver(*this, request->source(), Header::parse(*frame));
  }
  payload.reset();
  engine->complete(*this);
}

std::shared_ptr<Request::State> HierP2P::Recv::legToWant() const {
  if (leg) return leg->request;
  auto t = engine->tags_.find(tag);
  return held && t != engine->tags_.end() && t->second.leg ? t->second.leg->request : nullptr;
}

void HierP2P::Recv::fail(std::exception_ptr e) {
  std::lock_guard lock(engine->mutex_);
  engine->complete(*this, e);
  std::rethrow_exception(error);
}

void HierP2P::Recv::wait(milliseconds limit) {
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

bool HierP2P::Recv::test() {
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

}  // namespace drun::comm::detail
