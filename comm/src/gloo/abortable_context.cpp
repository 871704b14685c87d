#include "gloo/abortable_context.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <mutex>
#include <set>

namespace drun::comm::detail {
namespace {

constexpr const char* kAborted = "the wait was aborted (the communicator failed or a new generation began)";

class AbortableBuffer;

// The live wrapped buffers of one context, and whether it was aborted.
struct BufferRegistry {
  std::mutex mutex;
  bool aborted = false;
  std::set<AbortableBuffer*> live;
};

// A Gloo unbound buffer whose waits end when its context is aborted.
class AbortableBuffer final : public gloo::transport::UnboundBuffer {
 public:
  AbortableBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner, std::shared_ptr<BufferRegistry> registry)
      : UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), registry_(std::move(registry)) {
    std::lock_guard lock(registry_->mutex);
    registry_->live.insert(this);
  }
  ~AbortableBuffer() override {
    std::lock_guard lock(registry_->mutex);
    registry_->live.erase(this);
  }

  // Under the registry's lock (the buffer cannot go away meanwhile).
  void abortLocked() {
    inner_->abortWaitRecv();
    inner_->abortWaitSend();
  }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    throwIfAborted();
    const bool done = inner_->waitRecv(rank, timeout);
    if (!done) throwIfAborted();  // ended by abortWaits(), not by the owner's own abortWaitRecv
    return done;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    throwIfAborted();
    const bool done = inner_->waitSend(rank, timeout);
    if (!done) throwIfAborted();
    return done;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dstRank, uint64_t slot, size_t offset, size_t nbytes) override {
    throwIfAborted();
    inner_->send(dstRank, slot, offset, nbytes);
  }
  void recv(int srcRank, uint64_t slot, size_t offset, size_t nbytes) override {
    throwIfAborted();
    inner_->recv(srcRank, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcRanks, uint64_t slot, size_t offset, size_t nbytes) override {
    throwIfAborted();
    inner_->recv(std::move(srcRanks), slot, offset, nbytes);
  }

 private:
  void throwIfAborted() const {
    std::lock_guard lock(registry_->mutex);
    if (registry_->aborted) throw gloo::IoException(kAborted);
  }

  std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<BufferRegistry> registry_;
};

}  // namespace

// Gloo's transport context seen through one that wraps the unbound buffers it makes; pairs are
// the inner context's.
class AbortableTransportContext final : public gloo::transport::Context {
 public:
  explicit AbortableTransportContext(std::shared_ptr<gloo::transport::Context> inner)
      : Context(inner->rank, inner->size), inner_(std::move(inner)), registry_(std::make_shared<BufferRegistry>()) {
    setTimeout(inner_->getTimeout());
  }

  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override { return inner_->getPair(rank); }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override { return inner_->createPair(rank); }
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<AbortableBuffer>(inner_->createUnboundBuffer(ptr, size), registry_);
  }

  void abortWaits() {
    std::lock_guard lock(registry_->mutex);
    registry_->aborted = true;
    for (AbortableBuffer* b : registry_->live) b->abortLocked();
  }

 private:
  std::shared_ptr<gloo::transport::Context> inner_;
  std::shared_ptr<BufferRegistry> registry_;
};

AbortableGlooContext::AbortableGlooContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}

void AbortableGlooContext::makeAbortable() {
  abortable_ = std::make_shared<AbortableTransportContext>(transportContext_);
  transportContext_ = abortable_;
}

void AbortableGlooContext::abortWaits() {
  if (abortable_) abortable_->abortWaits();
}

}  // namespace drun::comm::detail
