// EtcdClient::watch: one chunked HTTP reply per watch (/v3/watch), resumed on another member
// from the next revision when the one streaming it fails.
#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_call_counts.hpp"
#include "drun/etcd/etcd_client.hpp"
#include "etcd_http.hpp"
#include "etcd_json.hpp"

namespace drun::rdzv {
namespace {

using etcd::Json;

// One line of the stream: {"result":{"header":..,"created":true|"events":[...]}} or
// {"error":{...}}. Returns the events (empty for the created or a progress message);
// `createdAt` gets the created message's revision (the store's when the watch was created).
std::vector<EtcdWatchEvent> parseWatchLine(std::string_view line, const std::string& what, int64_t* createdAt) {
  const Json message = etcd::parseObject(line, what);
  try {
    if (message.contains("error"))
      throw NetworkError(what + ": the stream failed: " + etcd::errorMessage(etcd::objectField(message, "error")));
    const Json& result = etcd::objectField(message, "result");
    if (etcd::boolField(result, "created") && result.contains("header")) *createdAt = etcd::headerRevision(result);
    if (etcd::boolField(result, "canceled"))
      throw Error(what + ": the watch was cancelled by etcd (compacted to revision " +
                  std::to_string(etcd::intField(result, "compact_revision")) + ")");
    std::vector<EtcdWatchEvent> events;
    for (const Json& event : etcd::arrayField(result, "events")) {
      if (!event.is_object()) throw ProtocolError("an event is not an object");
      EtcdWatchEvent out;
      auto type = event.find("type");
      if (type != event.end()) {
        if (!type->is_string() || (*type != "DELETE" && *type != "PUT"))
          throw ProtocolError("an event's type is not PUT or DELETE");
        out.deleted = *type == "DELETE";
      }
      out.kv = etcd::parseKeyValue(etcd::objectField(event, "kv"));
      events.push_back(std::move(out));
    }
    return events;
  } catch (const ProtocolError& e) {
    throw ProtocolError(what + ": malformed reply: " + e.what());
  }
}

}  // namespace

void EtcdClient::watch(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
                       const Deadline& deadline,
                       const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents,
                       bool deletesOnly) {
  watchStream(key, rangeEnd, startRevision, deadline, onEvents, deletesOnly, false);
}

bool EtcdClient::watchFromNow(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
                              const Deadline& deadline,
                              const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents) {
  return watchStream(key, rangeEnd, startRevision, deadline, onEvents, false, startRevision > 0);
}

// fromNow: the first stream opened from now, given up (false) unless it was created at
// startRevision - 1; a stream resumed after a member failed starts from the next revision.
bool EtcdClient::watchStream(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
                             const Deadline& deadline,
                             const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents,
                             bool deletesOnly, bool fromNow) {
  std::lock_guard lock(mutex_);
  int64_t next = startRevision;
  std::string lastError;
  size_t failedInARow = 0;
  int leaderless = 0;  // answers in a row that the member has no leader (HTTP 503)
  for (;;) {
    closeConnectionsPeersClosed();
    etcd::EtcdConnection& connection = *connections_[current_];
    const std::string what = "etcd " + connection.endpoint().toString() + ": /v3/watch";
    if (interrupted_) throw interruptedError(what);
    Json request{{"key", etcd::base64Encode(key)}};
    if (!rangeEnd.empty()) request["range_end"] = etcd::base64Encode(rangeEnd);
    if (next > 0 && !fromNow) request["start_revision"] = std::to_string(next);
    if (deletesOnly) request["filters"] = Json::array({"NOPUT"});
    const Json body{{"create_request", request}};
    bool created = false, movedOn = false, unavailable = false;
    try {
      if (!options_.user.empty() && token_.empty()) authenticate(connection, deadline);
      countEtcdRequest("/v3/watch");
      connection.stream("/v3/watch", body.dump(), token_, deadline,
                        [&](unsigned status, std::string_view line) {
                          if (status != 200) {
                            const Json error = etcd::parseObject(line, what);
                            const std::string text =
                                what + " refused (HTTP " + std::to_string(status) +
                                (status == 503 ? ": unavailable, the member has no leader or no quorum" : "") +
                                "): " + etcd::errorMessage(error);
                            // Unavailable (a member without a leader, or shutting down): the
                            // next member may serve it, as a call goes on to it.
                            if (status == 503) {
                              unavailable = true;
                              throw NetworkError(text);
                            }
                            throw Error(text);
                          }
                          int64_t createdAt = -1;
                          std::vector<EtcdWatchEvent> events = parseWatchLine(line, what, &createdAt);
                          spdlog::trace("etcd {}: {} event(s), watched from revision {}", what, events.size(), next);
                          if (fromNow && !created && createdAt != startRevision - 1) {
                            movedOn = true;  // revisions after the caller's read went by unseen
                            return false;
                          }
                          created = true;
                          if (events.empty()) return true;
                          next = std::max(next, events.back().kv.modRevision + 1);
                          return onEvents(events);
                        });
      return !movedOn;
    } catch (const NetworkError& e) {
      if (interrupted_) throw interruptedError(what);
      // An attempt the deadline cut short says less than the answers before it.
      if (leaderless > 0 && deadline.expired()) throw TimeoutError("etcd watch: deadline passed; last: " + lastError);
      lastError = e.what();
    } catch (const TimeoutError& e) {
      if (leaderless == 0) throw;  // a watch that saw nothing in time
      throw TimeoutError(std::string(e.what()) + "; before it: " + lastError);  // the election's answers
    }
    // This member failed: resume on the next one from `next`.
    if (created) fromNow = false;
    failedInARow = created ? 1 : failedInARow + 1;
    current_ = (current_ + 1) % connections_.size();
    // A member without a leader is up: during an election (a quorum back, a leader lost) every
    // member answers so for about a second, and a watch that gave up then would read as a lost
    // store. Such answers are retried, with growing pauses, until the watch's deadline, as a
    // call's are (EtcdClient::call); members that refuse or drop the stream end it after a pass.
    leaderless = unavailable ? leaderless + 1 : 0;
    if (unavailable) failedInARow = 0;
    if (failedInARow > connections_.size())
      throw NetworkError("etcd: no member serves the watch; last: " + lastError);
    // A pause that would reach the deadline ends the watch now, naming the members' answers (the
    // attempt after it would only time out).
    const milliseconds pause(50 << std::min<int>(leaderless / static_cast<int>(connections_.size()), 3));
    if (deadline.remaining() <= pause) throw TimeoutError("etcd watch: deadline passed; last: " + lastError);
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace drun::rdzv
