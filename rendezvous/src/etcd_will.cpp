// Will records over etcd: encoding, and applying one exactly once (etcd_session.hpp).
#include <charconv>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "drun/common/error.hpp"
#include "etcd_json.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

std::optional<int64_t> parseInteger(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

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

bool applyWillRecord(EtcdClient& client, const std::string& willKey, const std::string& liveKey,
                     const std::string& kvPrefix) {
  std::mt19937 jitter(std::random_device{}());
  auto inside = [&](const std::string& key) { return key.rfind(kvPrefix, 0) == 0; };
  for (int attempt = 0; attempt < 64; ++attempt) {
    // The record and every key an add touches, at one revision.
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
    std::vector<EtcdOp> reads;
    for (const auto& [key, delta] : will->adds)
      if (inside(key)) reads.push_back(EtcdOp::range(key));
    const EtcdTxnResult current = reads.empty() ? EtcdTxnResult{} : client.txn({}, reads, {}, true);

    std::vector<EtcdCompare> compares{{willKey, EtcdCompare::Target::ModRevision, {}, recordKv.modRevision}};
    std::map<std::string, std::optional<std::string>> finalValues;  // nullopt: deleted
    std::map<std::string, std::optional<std::string>> readValues;
    for (size_t i = 0; i < reads.size(); ++i) {
      const EtcdRange& r = current.ranges[i];
      const bool absent = r.kvs.empty();
      compares.push_back({reads[i].key,
                          absent ? EtcdCompare::Target::CreateRevision : EtcdCompare::Target::ModRevision,
                          {}, absent ? 0 : r.kvs.front().modRevision});
      readValues[reads[i].key] = absent ? std::nullopt : std::optional<std::string>(r.kvs.front().value);
    }
    for (const auto& [key, value] : will->sets)
      if (inside(key)) finalValues[key] = value;
    for (const auto& [key, delta] : will->adds) {
      if (!inside(key)) continue;
      const std::optional<std::string> before =
          finalValues.count(key) ? finalValues[key] : readValues[key];
      const std::optional<int64_t> number = before ? parseInteger(*before) : std::optional<int64_t>(0);
      if (!number) continue;  // holds no integer (a decided round's status): skipped
      finalValues[key] = std::to_string(*number + delta);
    }
    for (const auto& key : will->deletes)
      if (inside(key)) finalValues[key] = std::nullopt;

    std::vector<EtcdOp> writes;
    for (const auto& [key, value] : finalValues)
      writes.push_back(value ? EtcdOp::put(key, *value) : EtcdOp::erase(key));
    writes.push_back(EtcdOp::erase(willKey));
    if (liveKey != willKey) writes.push_back(EtcdOp::erase(liveKey));
    if (client.txn(compares, writes, {}, true).succeeded) return true;
    // A key changed between the read and the write: again, after a short random pause.
    std::this_thread::sleep_for(std::chrono::microseconds(jitter() % (200u << std::min(attempt, 5))));
  }
  throw Error("etcd: the will " + willKey + " could not be applied (its keys kept changing)");
}

}  // namespace drun::rdzv
