#include "drun/etcd/etcd_call_counts.hpp"

#include <array>
#include <atomic>
#include <charconv>
#include <utility>

namespace drun::rdzv {
namespace {

// One row per counted kind: its gateway path and its field.
struct CountedKind {
  std::string_view name, path;
  uint64_t EtcdCallCounts::*field;
};
constexpr std::array<CountedKind, 11> kCountedKinds{{
    {"range", "/v3/kv/range", &EtcdCallCounts::range},
    {"put", "/v3/kv/put", &EtcdCallCounts::put},
    {"deleterange", "/v3/kv/deleterange", &EtcdCallCounts::deleteRange},
    {"txn", "/v3/kv/txn", &EtcdCallCounts::txn},
    {"txn_failed", "", &EtcdCallCounts::txnFailed},
    {"lease_grant", "/v3/lease/grant", &EtcdCallCounts::leaseGrant},
    {"keepalive", "/v3/lease/keepalive", &EtcdCallCounts::keepAlive},
    {"lease_revoke", "/v3/lease/revoke", &EtcdCallCounts::leaseRevoke},
    {"lease_ttl", "/v3/lease/timetolive", &EtcdCallCounts::leaseTimeToLive},
    {"watch", "/v3/watch", &EtcdCallCounts::watch},
    {"auth", "/v3/auth/authenticate", &EtcdCallCounts::auth},
}};

constexpr size_t kTxnFailed = 4;
static_assert(kCountedKinds[kTxnFailed].name == "txn_failed");

std::array<std::atomic<uint64_t>, kCountedKinds.size()> gCounts{};

}  // namespace

std::string EtcdCallCounts::format() const {
  std::string out;
  for (const CountedKind& kind : kCountedKinds)
    out += (out.empty() ? "" : " ") + std::string(kind.name) + "=" + std::to_string(this->*kind.field);
  return out;
}

EtcdCallCounts EtcdCallCounts::parse(std::string_view text) {
  EtcdCallCounts counts;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view{} : text.substr(space + 1);
    const size_t eq = word.find('=');
    if (eq == std::string_view::npos) continue;
    uint64_t value = 0;
    const std::string_view digits = word.substr(eq + 1);
    if (std::from_chars(digits.data(), digits.data() + digits.size(), value).ec != std::errc{}) continue;
    for (const CountedKind& kind : kCountedKinds)
      if (kind.name == word.substr(0, eq)) counts.*kind.field = value;
  }
  return counts;
}

EtcdCallCounts& EtcdCallCounts::operator+=(const EtcdCallCounts& other) {
  for (const CountedKind& kind : kCountedKinds) this->*kind.field += other.*kind.field;
  return *this;
}

EtcdCallCounts& EtcdCallCounts::operator-=(const EtcdCallCounts& other) {
  for (const CountedKind& kind : kCountedKinds) this->*kind.field -= other.*kind.field;
  return *this;
}

EtcdCallCounts etcdCallCounts() {
  EtcdCallCounts counts;
  for (size_t i = 0; i < kCountedKinds.size(); ++i)
    counts.*kCountedKinds[i].field = gCounts[i].load(std::memory_order_relaxed);
  return counts;
}

void countEtcdRequest(std::string_view path) {
  for (size_t i = 0; i < kCountedKinds.size(); ++i)
    if (!kCountedKinds[i].path.empty() && kCountedKinds[i].path == path) {
      gCounts[i].fetch_add(1, std::memory_order_relaxed);
      return;
    }
}

void countEtcdTxnFailed() { gCounts[kTxnFailed].fetch_add(1, std::memory_order_relaxed); }

}  // namespace drun::rdzv
