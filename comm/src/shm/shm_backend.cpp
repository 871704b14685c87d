// The shared-memory backend: every rank of the communicator on one host; collectives through
// ShmCollectives, point to point through ShmP2P, over one ShmSegment per communicator.
#include "shm/shm_backend.hpp"

#include "shm/shm_collectives.hpp"
#include "shm/shm_p2p.hpp"

namespace drun::comm::detail {
namespace {

class ShmBackend final : public Backend {
 public:
  ShmBackend(rdzv::Store& store, int rank, int size, milliseconds timeout, const ShmOptions& options)
      : options_(options),
        segment_(std::make_shared<ShmSegment>(store, rank, size, options, timeout)),
        collectives_(*segment_),
        p2p_(std::make_shared<ShmP2P>(segment_, options.unexpectedBytes)) {}
  ~ShmBackend() override { p2p_->stop("the communicator was destroyed"); }

  void run(const Collective& c) override { collectives_.run(c); }

  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag,
                                        milliseconds timeout) override {
    return p2p_->isend(buf, bytes, dst, tag, timeout);
  }
  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag,
                                        milliseconds timeout) override {
    return p2p_->irecv(buf, bytes, src, tag, timeout);
  }

  bool cancelRecv(Request::State& request) override { return p2p_->cancel(request); }
  void setP2PListener(std::function<void()> listener) override { p2p_->setListener(std::move(listener)); }

  std::unique_ptr<Backend> makeGroup(std::shared_ptr<rdzv::Store> store, int rank, int size,
                                     milliseconds timeout) override {
    return makeShmBackend(*store, rank, size, timeout, options_);
  }

  void abort() override {
    segment_->abort();
    p2p_->stop(kAbortedAfterFailure);
  }

  const char* transport() const override { return "shm"; }

 private:
  ShmOptions options_;
  std::shared_ptr<ShmSegment> segment_;
  ShmCollectives collectives_;
  std::shared_ptr<ShmP2P> p2p_;
};

}  // namespace

std::unique_ptr<Backend> makeShmBackend(rdzv::Store& store, int rank, int size, milliseconds timeout,
                                        const ShmOptions& options) {
  return std::make_unique<ShmBackend>(store, rank, size, timeout, options);
}

}  // namespace drun::comm::detail
