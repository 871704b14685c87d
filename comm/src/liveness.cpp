#include "liveness.hpp"

#include <unistd.h>

#include <vector>

namespace drun::comm::detail {

namespace {
const std::string kGoneCount = "gone_count";
std::string goneKey(int rank) { return "gone/" + std::to_string(rank); }
}  // namespace

Liveness::Liveness(std::shared_ptr<rdzv::LivenessStore> store, int rank, int worldSize)
    : store_(std::move(store)), rank_(rank), worldSize_(worldSize) {}

void Liveness::arm() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  rdzv::LivenessStore::Will will;
  will.sets.emplace_back(goneKey(rank_), std::string(host) + " pid " + std::to_string(getpid()));
  will.adds.emplace_back(kGoneCount, 1);
  try {
    store_->setWill(will);
    armed_ = true;
  } catch (const InvalidArgument&) {
    // This store has no wills: failures are reported without the peer's name.
  }
}

void Liveness::disarm() {
  if (!armed_) return;
  try {
    store_->setWill({});
  } catch (const Error&) {
    // The store is gone already: nothing left to disarm.
  }
  armed_ = false;
}

int Liveness::goneCount() const {
  try {
    auto v = store_->tryGet(kGoneCount);
    return v ? std::stoi(*v) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::string Liveness::describeGone(milliseconds grace) const {
  if (!armed_) return {};
  try {
    if (grace > milliseconds(0)) {
      try {
        store_->watch(kGoneCount, std::nullopt, grace);
      } catch (const TimeoutError&) {
        return {};
      }
    }
    std::vector<std::string> gone;
    for (int r = 0; r < worldSize_; ++r) {
      if (r == rank_) continue;
      if (auto who = store_->tryGet(goneKey(r))) gone.push_back(std::to_string(r) + " (" + *who + ")");
    }
    if (gone.empty()) return {};
    std::string text = gone.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < gone.size(); ++i) text += (i ? ", " : "") + gone[i];
    return text + (gone.size() == 1 ? " is gone" : " are gone");
  } catch (const NetworkError&) {
    if (rank0HostsStore_ && rank_ != 0) return "rank 0 is gone (the store it hosted is unreachable)";
    return "the store is unreachable";
  } catch (const Error&) {
    return {};
  }
}

}  // namespace drun::comm::detail
