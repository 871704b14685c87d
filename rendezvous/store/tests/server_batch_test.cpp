// The store server's Batch frame (protocol.hpp): its parts are applied in one step once the whole
// frame is in, each answered by its own response; a batch cut off anywhere applies none of them.
// A join's will and its count in `present` travel in one StoreBatch: as separate frames, a
// connection cut between the two would apply the will alone and count the node out once too often.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "drun/store/protocol.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "server_test_support.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;
using namespace std::chrono_literals;

namespace {

// A join's shape: the will (it counts the node out of `present` and marks it dead), the count,
// the descriptor.
std::vector<wire::Request> joinParts() {
  wire::Request will = request(wire::Op::SetWill, {}, 1);
  will.will.sets = {{"dead/n0", "1"}};
  will.will.adds = {{"present", -1}};
  wire::Request count = request(wire::Op::Add, {"present"}, 2);
  count.delta = 1;
  wire::Request joined = request(wire::Op::Append, {"joined"}, 3);
  joined.values = {"n0;"};
  return {will, count, joined};
}

std::string framesOf(const std::vector<wire::Request>& parts) {
  std::string frames;
  for (const wire::Request& q : parts) wire::encodeRequest(q, frames);
  return frames;
}

std::string batchOf(const std::vector<wire::Request>& parts, uint64_t id = 9) {
  std::string batch;
  wire::encodeBatch(framesOf(parts), id, batch);
  return batch;
}

// A started server and a client that reads what the tests' raw connections left.
struct ObservedServer {
  static StoreServer& started(StoreServer& s) {
    s.start();
    return s;
  }
  StoreServer server{localOptions()};
  TcpStore observer{clientOptions(started(server).port())};
};

void handshake(RawClient& raw) {
  raw.hello();
  REQUIRE(raw.helloReply().status == wire::HelloStatus::Ok);
}

// Sends `bytes` after the handshake on a connection of its own, closes it, and returns once the
// server has closed its side too (its will, if any, has run). `open` connections stay open.
void sendAndClose(StoreServer& server, const std::string& bytes, uint64_t open) {
  {
    RawClient raw(server.port());
    handshake(raw);
    raw.send(bytes);
  }
  REQUIRE(eventually([&] { return server.stats().connectionsOpen == open; }));
}

}  // namespace

TEST_CASE_METHOD(ObservedServer, "server: a batch frame cut off at any byte applies none of its parts, and whole, all, "
          "each answered", "[server][batch]") {
  const std::string batch = batchOf(joinParts());
  for (size_t cut = 1; cut < batch.size(); ++cut) {
    sendAndClose(server, batch.substr(0, cut), 1);
    INFO("cut after byte " << cut << " of " << batch.size());
    REQUIRE_FALSE(observer.tryGet("present"));
    REQUIRE_FALSE(observer.tryGet("dead/n0"));
    REQUIRE_FALSE(observer.tryGet("joined"));
  }
  CHECK(server.stats().willsRun == 0);
  {
    RawClient raw(server.port());
    handshake(raw);
    raw.send(batch);
    for (uint64_t id : {1, 2, 3}) {  // the parts' answers, in order; none for the batch itself
      auto answer = raw.response();
      REQUIRE(answer);
      CHECK(answer->id == id);
      CHECK(answer->status == wire::Status::Ok);
    }
    CHECK(observer.tryGet("present") == std::optional<Bytes>("1"));
    CHECK(observer.tryGet("joined") == std::optional<Bytes>("n0;"));
  }
  // The close runs the will the batch set: counted in and out once each.
  REQUIRE(eventually([&] { return server.stats().willsRun == 1; }));
  CHECK(observer.tryGet("present") == std::optional<Bytes>("0"));
  CHECK(observer.tryGet("dead/n0") == std::optional<Bytes>("1"));
}

TEST_CASE_METHOD(ObservedServer, "server: the same parts as separate frames, cut between them, run the will without the "
          "count (why a batch is one frame)", "[server][batch]") {
  const std::vector<wire::Request> parts = joinParts();
  sendAndClose(server, framesOf({parts[0]}) + framesOf({parts[1]}).substr(0, 5), 1);
  REQUIRE(eventually([&] { return server.stats().willsRun == 1; }));
  CHECK(observer.tryGet("present") == std::optional<Bytes>("-1"));
}

TEST_CASE_METHOD(ObservedServer, "server: a batch carrying a call that waits, a heartbeat or a batch, or ending inside a "
          "frame, is a protocol error and applies nothing", "[server][batch]") {
  wire::Request set = request(wire::Op::Set, {"k"}, 1);
  set.values = {"v"};
  const std::string setFrame = framesOf({set});
  std::string nested;
  wire::encodeBatch(setFrame, 2, nested);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a get", framesOf({request(wire::Op::Get, {"x"}, 2, 1000)})},
      {"a heartbeat", framesOf({request(wire::Op::Heartbeat, {}, 2)})},
      {"a batch", nested},
      {"a truncated frame", setFrame.substr(0, setFrame.size() - 1)},
  };
  for (const auto& [what, second] : bad) {
    INFO("a set, then " << what);
    std::string batch;
    wire::encodeBatch(setFrame + second, 3, batch);
    RawClient raw(server.port());
    handshake(raw);
    raw.send(batch);
    auto answer = raw.response();
    REQUIRE(answer);
    CHECK(answer->status == wire::Status::ProtocolError);
    CHECK_THAT(answer->message, Catch::Contains("batch"));
    CHECK(raw.closedByServer());
    CHECK_FALSE(observer.tryGet("k"));
  }
}

TEST_CASE("client: TcpStore sends a StoreBatch of two or more calls as one Batch frame",
          "[server][batch]") {
  StoreServer server(localOptions());
  server.start();
  TcpStoreOptions options = clientOptions(server.port());
  options.heartbeatInterval = 60s;  // no heartbeat among the requests counted below
  options.leaseTimeout = 120s;
  TcpStore store(options);
  StoreBatch batch;
  batch.setWill({{{"dead/n0", "1"}}, {{"present", -1}}, {}});
  const size_t count = batch.add("present", 1);
  const size_t read = batch.tryGet("present");
  const uint64_t before = server.stats().requestsServed;
  store.runBatch(batch);
  // The batch frame and its three parts: four requests served (three, sent frame by frame).
  CHECK(server.stats().requestsServed - before == 4);
  CHECK(batch.number(count) == 1);
  CHECK(batch.value(read) == std::optional<Bytes>("1"));
}
