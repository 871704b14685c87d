// Will records over etcd: encoding, and applying one exactly once (etcd_session.hpp).
#include <algorithm>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "drun/common/error.hpp"
#include "etcd_json.hpp"
#include "etcd_keyspace.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
using etcd_keys::parseInteger;

std::string encodeWill(const Store::Will& will) {
  std::string out;
  for (const auto& [key, value] : will.sets)
    out += "s " + etcd::base64Encode(key) + " " + etcd::base64Encode(value) + "\n";
  for (const auto& [key, delta] : will.adds)
    out += "a " + etcd::base64Encode(key) + " " + std::to_string(delta) + "\n";
  for (const auto& key : will.deletes) out += "d " + etcd::base64Encode(key) + "\n";
  return out;
}

std::optional<Store::Will> decodeWill(const std::string& record) {
  Store::Will will;
  std::istringstream lines(record);
  std::string line;
  try {
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string kind, key, third, extra;
      fields >> kind >> key >> third >> extra;
      if (!extra.empty() || key.empty()) return std::nullopt;
      const std::string decoded = etcd::base64Decode(key, "will key");
      if (kind == "s") {
        will.sets.emplace_back(decoded, etcd::base64Decode(third, "will value"));
      } else if (kind == "a") {
        auto delta = parseInteger(third);
        if (!delta) return std::nullopt;
        will.adds.emplace_back(decoded, *delta);
      } else if (kind == "d" && third.empty()) {
        will.deletes.push_back(decoded);
      } else {
        return std::nullopt;
      }
    }
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
  return will;
}

namespace {

// What a will does to one Store key, folded over its entries in order (sets, adds, deletes).
struct KeyPlan {
  bool replaced = false;            // set, then adds folded into the value
  std::optional<std::string> value; // replaced: the value; nullopt = deleted
  int64_t delta = 0;                // not replaced: added to what the key holds
};

// The writes of one key's plan; a counter's +-1 is one put of the family's counter.
void writesOf(const std::string& key, const KeyPlan& plan, const std::vector<EtcdKeyValue>& family,
              std::vector<EtcdOp>& writes) {
  using namespace etcd_keys;
  if (plan.replaced) {
    if (plan.value) writes.push_back(EtcdOp::put(key, *plan.value));
    writes.push_back(EtcdOp::erase(plan.value ? generatedStart(key) : key, familyEnd(key)));
  } else if (plan.delta == 1 || plan.delta == -1) {
    writes.push_back(EtcdOp::put(plan.delta == 1 ? incrementKey(key) : decrementKey(key), ""));
  } else if (plan.delta != 0) {
    int64_t base = 0;
    for (const EtcdKeyValue& kv : family)
      if (kv.key == key) base = parseInteger(kv.value).value_or(0);
    writes.push_back(EtcdOp::put(key, std::to_string(base + plan.delta)));
  }
}

}  // namespace

bool applyWillRecord(EtcdClient& client, const std::string& willKey, const std::string& liveKey,
                     const std::string& kvPrefix) {
  using namespace etcd_keys;
  std::mt19937 jitter(std::random_device{}());
  auto inside = [&](const std::string& key) { return key.rfind(kvPrefix, 0) == 0; };
  for (int attempt = 0; attempt < 64; ++attempt) {
    EtcdRange record = client.range(willKey);
    if (record.kvs.empty()) return false;
    const EtcdKeyValue recordKv = record.kvs.front();
    std::optional<Store::Will> will = decodeWill(recordKv.value);
    if (!will) {
      // Not ours to interpret: removed, so that it is not looked at again.
      client.txn({{willKey, EtcdCompare::Target::ModRevision, {}, recordKv.modRevision}},
                 {EtcdOp::erase(willKey), EtcdOp::erase(liveKey)}, {}, true);
      return false;
    }
    std::map<std::string, KeyPlan> plans;
    for (const auto& [key, value] : will->sets)
      if (inside(key)) plans[key] = {true, value, 0};
    // The families an add counts on, at one revision.
    std::vector<std::string> counted;
    for (const auto& [key, delta] : will->adds)
      if (inside(key) && !plans[key].replaced) counted.push_back(key);
    std::sort(counted.begin(), counted.end());
    counted.erase(std::unique(counted.begin(), counted.end()), counted.end());
    std::vector<EtcdOp> reads;
    for (const std::string& key : counted) reads.push_back(EtcdOp::range(key, familyEnd(key)));
    const EtcdTxnResult current = reads.empty() ? EtcdTxnResult{} : client.txn({}, reads, {}, true);
    std::map<std::string, std::vector<EtcdKeyValue>> families;
    for (size_t i = 0; i < counted.size(); ++i) families[counted[i]] = current.ranges[i].kvs;

    for (const auto& [key, delta] : will->adds) {
      if (!inside(key)) continue;
      KeyPlan& plan = plans[key];
      if (plan.replaced) {
        // Added to the value this will sets; a value that is no integer is left as it is.
        if (auto number = plan.value ? parseInteger(*plan.value) : std::optional<int64_t>(0))
          plan.value = std::to_string(*number + delta);
        continue;
      }
      // Holds no integer (a decided round's status): skipped.
      const std::optional<std::string> now = foldFamily(key, families[key]);
      if (now && !parseInteger(*now)) continue;
      plan.delta += delta;
    }
    for (const auto& key : will->deletes)
      if (inside(key)) plans[key] = {true, std::nullopt, 0};

    // The record unchanged, and K of each family counted on as read: a set of it meanwhile
    // (a round decided) or another rewrite makes this transaction read again.
    std::vector<EtcdCompare> compares{{willKey, EtcdCompare::Target::ModRevision, {}, recordKv.modRevision}};
    std::vector<EtcdOp> writes;
    for (const auto& [key, plan] : plans) {
      const auto family = families.find(key);
      const std::vector<EtcdKeyValue> none;
      const std::vector<EtcdKeyValue>& kvs = family == families.end() ? none : family->second;
      if (!plan.replaced && family != families.end()) {
        EtcdCompare unchanged{key, EtcdCompare::Target::CreateRevision, {}, 0};
        for (const EtcdKeyValue& kv : kvs)
          if (kv.key == key) unchanged = {key, EtcdCompare::Target::ModRevision, {}, kv.modRevision};
        compares.push_back(unchanged);
      }
      writesOf(key, plan, kvs, writes);
    }
    writes.push_back(EtcdOp::erase(willKey));
    if (liveKey != willKey) writes.push_back(EtcdOp::erase(liveKey));
    if (client.txn(compares, writes, {}, true).succeeded) return true;
    // A key changed between the read and the write: again, after a short random pause.
    std::this_thread::sleep_for(std::chrono::microseconds(jitter() % (200u << std::min(attempt, 5))));
  }
  throw Error("etcd: the will " + willKey + " could not be applied (its keys kept changing)");
}

}  // namespace drun::rdzv
