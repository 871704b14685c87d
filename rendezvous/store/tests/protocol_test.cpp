// The wire codec: round trips of every op, incremental decoding at every byte boundary, limits,
// and garbage that must be refused (Bad) or waited for (NeedMore), never crash. The handshake's
// messages: protocol_hello_test.cpp.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::wire;

namespace {

Request req(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}) {
  Request q;
  q.op = op;
  q.id = 0x0102030405060708ull + static_cast<uint8_t>(op);
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}

// One request of every op, with awkward bytes (NUL, 0xff, empty strings) where they fit.
std::vector<Request> everyRequest() {
  std::vector<Request> all;
  all.push_back(req(Op::Set, {"rdzv/job7/state"}, {std::string("\0\xff value", 8)}));
  all.push_back(req(Op::Get, {"k"}));
  all.back().timeoutMs = 30000;
  all.push_back(req(Op::TryGet, {""}));
  all.push_back(req(Op::Add, {"counter"}));
  all.back().delta = -1234567890123LL;
  all.push_back(req(Op::CompareSet, {"k"}, {"", "desired"}));
  all.push_back(req(Op::Wait, {"a", "b", "c"}));
  all.back().timeoutMs = 1;
  all.push_back(req(Op::Check, {"a", ""}));
  all.push_back(req(Op::Delete, {"gone"}));
  all.push_back(req(Op::NumKeys));
  all.push_back(req(Op::MultiGet, {"x", "y"}));
  all.back().timeoutMs = 0xffffffffu;
  all.push_back(req(Op::MultiSet, {"x", "y"}, {"1", ""}));
  all.push_back(req(Op::Append, {"log"}, {"line\n"}));
  all.push_back(req(Op::Watch, {"w"}));
  all.back().timeoutMs = 5;
  all.back().known = std::string("old");
  all.push_back(req(Op::Watch, {"w"}));  // known = absent
  all.push_back(req(Op::SetWill));
  all.back().will.sets = {{"dead", "1"}, {"why", ""}};
  all.back().will.adds = {{"members", -1}};
  all.back().will.deletes = {"alive/3"};
  all.push_back(req(Op::SetWill));  // an empty will clears it
  all.push_back(req(Op::Heartbeat));
  all.push_back(req(Op::DeletePrefix, {"rdzv/job7/"}));
  all.push_back(req(Op::ListJobs));
  return all;
}

Response resp(Op op, Status status = Status::Ok) {
  Response p;
  p.op = op;
  p.id = 42;
  p.status = status;
  return p;
}

std::vector<Response> everyResponse() {
  std::vector<Response> all;
  for (Op op : {Op::Set, Op::Wait, Op::MultiSet, Op::Append, Op::SetWill}) all.push_back(resp(op));
  for (Op op : {Op::Get, Op::CompareSet}) {
    all.push_back(resp(op));
    all.back().values = {std::string("v\0v", 3)};
  }
  for (Op op : {Op::TryGet, Op::Watch}) {
    all.push_back(resp(op));  // absent
    all.push_back(resp(op));
    all.back().values = {""};  // present and empty: not the same as absent
  }
  for (Op op : {Op::Add, Op::NumKeys, Op::DeletePrefix}) {
    all.push_back(resp(op));
    all.back().number = INT64_MIN;
  }
  for (Op op : {Op::Check, Op::Delete}) {
    all.push_back(resp(op));
    all.back().number = 1;
  }
  all.push_back(resp(Op::MultiGet));
  all.back().values = {"a", "", "c"};
  all.push_back(resp(Op::ListJobs));
  all.back().values = {"job7", "job8"};
  all.push_back(resp(Op::Wait, Status::Timeout));
  all.back().message = "wait timed out after 5ms";
  all.back().keys = {"b", "c"};
  all.push_back(resp(Op::Add, Status::InvalidArgument));
  all.back().message = "not an integer";
  all.push_back(resp(Op::Set, Status::ProtocolError));
  all.back().id = 0;
  all.back().message = "unknown op 200";
  all.push_back(resp(Op::Get, Status::ServerError));
  return all;
}

void requireSame(const Request& a, const Request& b) {
  CHECK(a.op == b.op);
  CHECK(a.id == b.id);
  CHECK(a.keys == b.keys);
  CHECK(a.values == b.values);
  CHECK(a.delta == b.delta);
  CHECK(a.known == b.known);
  CHECK(a.will.sets == b.will.sets);
  CHECK(a.will.adds == b.will.adds);
  CHECK(a.will.deletes == b.will.deletes);
  if (isBlocking(a.op)) CHECK(a.timeoutMs == b.timeoutMs);
}

void requireSame(const Response& a, const Response& b) {
  CHECK(a.op == b.op);
  CHECK(a.id == b.id);
  CHECK(a.status == b.status);
  CHECK(a.values == b.values);
  CHECK(a.number == b.number);
  CHECK(a.message == b.message);
  CHECK(a.keys == b.keys);
}

std::string encoded(const Request& q) {
  std::string out;
  encodeRequest(q, out);
  return out;
}

// A hand-made frame: header fields as given, then the body.
std::string frame(uint32_t length, uint8_t op, uint8_t status, const std::string& body,
                  uint16_t reserved = 0, uint64_t id = 1) {
  std::string f;
  for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>(length >> (8 * i)));
  f.push_back(static_cast<char>(op));
  f.push_back(static_cast<char>(status));
  f.push_back(static_cast<char>(reserved & 0xff));
  f.push_back(static_cast<char>(reserved >> 8));
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>(id >> (8 * i)));
  return f + body;
}

std::string u32le(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

}  // namespace

TEST_CASE("protocol: every request round-trips", "[protocol]") {
  for (const Request& q : everyRequest()) {
    INFO(toString(q.op));
    std::string bytes = encoded(q);
    Request back;
    auto r = decodeRequest(bytes, back);
    REQUIRE(r.status == DecodeStatus::Ok);
    CHECK(r.consumed == bytes.size());
    requireSame(q, back);
  }
}

TEST_CASE("protocol: every response round-trips", "[protocol]") {
  for (const Response& p : everyResponse()) {
    INFO(toString(p.op) << " " << toString(p.status));
    std::string bytes;
    encodeResponse(p, bytes);
    Response back;
    auto r = decodeResponse(bytes, back);
    REQUIRE(r.status == DecodeStatus::Ok);
    CHECK(r.consumed == bytes.size());
    requireSame(p, back);
  }
}

TEST_CASE("protocol: integers are little-endian on the wire", "[protocol]") {
  Request q = req(Op::Add, {"k"});
  q.id = 0x1122334455667788ull;
  q.delta = 0x0102030405060708LL;
  std::string b = encoded(q);
  // header: length 4+1+8 = 13, op 4, status 0, reserved 0, id LE
  CHECK(b.substr(0, 4) == std::string("\x0d\x00\x00\x00", 4));
  CHECK(b[4] == 4);
  CHECK(b.substr(8, 8) == "\x88\x77\x66\x55\x44\x33\x22\x11");
  CHECK(b.substr(16) == std::string("\x01\x00\x00\x00k\x08\x07\x06\x05\x04\x03\x02\x01", 13));
  std::string hello;
  encodeHello(Hello{kVersion, 0x01020304}, hello);
  // Version 3 (version 2's layout): the 12 bytes every version shares, a 32-byte nonce, the
  // scope (empty).
  CHECK(hello == std::string("drun\x03\x00\x00\x00\x04\x03\x02\x01", 12) +
                     std::string(kNonceBytes, '\0') + std::string(4, '\0'));
}

TEST_CASE("protocol: a message cut at any byte needs more, then decodes", "[protocol]") {
  std::string stream;
  auto requests = everyRequest();
  for (const Request& q : requests) {
    std::string bytes = encoded(q);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      Request partial;
      auto r = decodeRequest(std::string_view(bytes).substr(0, cut), partial);
      INFO(toString(q.op) << " cut at " << cut);
      REQUIRE(r.status == DecodeStatus::NeedMore);
    }
    stream += bytes;
  }
  for (const Response& p : everyResponse()) {
    std::string bytes;
    encodeResponse(p, bytes);
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      Response partial;
      REQUIRE(decodeResponse(std::string_view(bytes).substr(0, cut), partial).status ==
              DecodeStatus::NeedMore);
    }
  }
  // Back to back in one stream, fed through a receive buffer in 7-byte pieces.
  ReceiveBuffer buffer;
  size_t decoded = 0;
  for (size_t at = 0; at < stream.size(); at += 7) {
    size_t n = std::min<size_t>(7, stream.size() - at);
    std::memcpy(buffer.prepare(n), stream.data() + at, n);
    buffer.commit(n);
    for (;;) {
      Request q;
      auto r = decodeRequest(buffer.data(), q);
      if (r.status == DecodeStatus::NeedMore) break;
      REQUIRE(r.status == DecodeStatus::Ok);
      requireSame(requests.at(decoded), q);
      buffer.consume(r.consumed);
      ++decoded;
    }
  }
  CHECK(decoded == requests.size());
  CHECK(buffer.size() == 0);
}

TEST_CASE("protocol: lengths over the limits are refused before the bytes arrive", "[protocol]") {
  Request q;
  // A frame length over the limit: Bad from the header alone.
  auto r = decodeRequest(frame(static_cast<uint32_t>(kLimits.maxFrameBytes + 1), 1, 0, ""), q);
  CHECK(r.status == DecodeStatus::Bad);
  CHECK_THAT(r.error, Catch::Contains("over the limit"));
  CHECK(decodeRequest(frame(0xffffffffu, 1, 0, ""), q).status == DecodeStatus::Bad);
  // A key length over the key limit, inside a frame that is otherwise fine.
  std::string body = u32le(static_cast<uint32_t>(kLimits.store.maxKeyBytes + 1)) + "k";
  CHECK(decodeRequest(frame(static_cast<uint32_t>(body.size()), static_cast<uint8_t>(Op::TryGet), 0, body), q).status ==
        DecodeStatus::Bad);
  // A string length running past the frame.
  body = u32le(100) + "short";
  CHECK(decodeRequest(frame(static_cast<uint32_t>(body.size()), static_cast<uint8_t>(Op::TryGet), 0, body), q).status ==
        DecodeStatus::Bad);
  // A key count over the limit, and one larger than the bytes could hold.
  body = u32le(static_cast<uint32_t>(kLimits.store.maxKeysPerRequest + 1));
  CHECK(decodeRequest(frame(4, static_cast<uint8_t>(Op::Check), 0, body), q).status ==
        DecodeStatus::Bad);
  body = u32le(1000) + std::string(8, '\0');
  CHECK(decodeRequest(frame(static_cast<uint32_t>(body.size()), static_cast<uint8_t>(Op::Check), 0, body), q).status ==
        DecodeStatus::Bad);
  // Responses are checked the same way.
  Response p;
  body = u32le(0xfffffff0u);
  CHECK(decodeResponse(frame(4, static_cast<uint8_t>(Op::Get), 0, body), p).status ==
        DecodeStatus::Bad);
}

TEST_CASE("protocol: malformed frames are Bad", "[protocol]") {
  Request q;
  Response p;
  std::string body = u32le(1) + "k";
  auto tryGet = static_cast<uint8_t>(Op::TryGet);
  CHECK(decodeRequest(frame(5, tryGet, 0, body), q).status == DecodeStatus::Ok);
  CHECK(decodeRequest(frame(5, 0, 0, body), q).status == DecodeStatus::Bad);    // op 0
  CHECK(decodeRequest(frame(5, 200, 0, body), q).status == DecodeStatus::Bad);  // unknown op
  CHECK(decodeRequest(frame(5, tryGet, 1, body), q).status == DecodeStatus::Bad);  // status set
  CHECK(decodeRequest(frame(5, tryGet, 0, body, 1), q).status == DecodeStatus::Bad);  // reserved
  CHECK(decodeRequest(frame(6, tryGet, 0, body + "x"), q).status == DecodeStatus::Bad);  // trailing
  CHECK(decodeRequest(frame(3, tryGet, 0, "abc"), q).status == DecodeStatus::Bad);  // short body
  CHECK(decodeResponse(frame(0, static_cast<uint8_t>(Op::Heartbeat), 0, ""), p).status ==
        DecodeStatus::Bad);  // heartbeats are never answered
  CHECK(decodeResponse(frame(1, static_cast<uint8_t>(Op::Check), 0, "\x02"), p).status ==
        DecodeStatus::Bad);  // a flag must be 0 or 1
  CHECK(decodeResponse(frame(0, static_cast<uint8_t>(Op::Set), 9, ""), p).status ==
        DecodeStatus::Bad);  // unknown status
  // Watch's known flag.
  body = u32le(0) + u32le(1) + "k" + "\x05";
  CHECK(decodeRequest(frame(static_cast<uint32_t>(body.size()), static_cast<uint8_t>(Op::Watch), 0, body), q).status ==
        DecodeStatus::Bad);
}

TEST_CASE("protocol: the encoder refuses what the decoder would", "[protocol]") {
  std::string out = "prefix";
  Request q = req(Op::Set, {std::string(kLimits.store.maxKeyBytes + 1, 'k')}, {"v"});
  CHECK_THROWS_AS(encodeRequest(q, out), drun::InvalidArgument);
  q = req(Op::Set, {"k"}, {Bytes(kLimits.store.maxValueBytes + 1, 'v')});
  CHECK_THROWS_AS(encodeRequest(q, out), drun::InvalidArgument);
  q = req(Op::Check, std::vector<std::string>(kLimits.store.maxKeysPerRequest + 1, "k"));
  CHECK_THROWS_AS(encodeRequest(q, out), drun::InvalidArgument);
  q = req(Op::CompareSet, {"k"}, {"only expected"});
  CHECK_THROWS_AS(encodeRequest(q, out), drun::InvalidArgument);
  // A response over the frame limit (many large values) is refused whole.
  Limits small;
  small.maxFrameBytes = 1000;
  Response p = resp(Op::MultiGet);
  p.values.assign(10, Bytes(200, 'v'));
  CHECK_THROWS_AS(encodeResponse(p, out, small), drun::InvalidArgument);
  CHECK(out == "prefix");  // nothing half-written
}

TEST_CASE("protocol: random and mutated input never crashes the decoder", "[protocol]") {
  std::mt19937_64 rng(1234);
  auto check = [](const std::string& in) {
    Request q;
    auto r = decodeRequest(in, q);
    REQUIRE(r.consumed <= in.size());
    if (r.status == DecodeStatus::Ok) REQUIRE(r.consumed >= kHeaderBytes);
    Response p;
    auto s = decodeResponse(in, p);
    REQUIRE(s.consumed <= in.size());
    Hello h;
    decodeHello(in, h);
  };
  for (int i = 0; i < 20000; ++i) {
    std::string in(rng() % 64, '\0');
    for (auto& c : in) c = static_cast<char>(rng());
    if (i % 2 == 0 && in.size() >= 8) {
      // Plausible headers: small lengths and valid ops, so bodies get parsed too.
      uint32_t len = static_cast<uint32_t>(in.size() > 16 ? in.size() - 16 : 0);
      for (int b = 0; b < 4; ++b) in[b] = static_cast<char>(len >> (8 * b));
      in[4] = static_cast<char>(1 + rng() % kMaxOp);
      in[5] = static_cast<char>(rng() % 2 ? 0 : rng() % 5);
      in[6] = in[7] = 0;
    }
    check(in);
  }
  // Valid frames with one byte changed anywhere.
  for (const Request& q : everyRequest()) {
    std::string bytes = encoded(q);
    for (size_t at = 0; at < bytes.size(); ++at) {
      std::string m = bytes;
      m[at] = static_cast<char>(m[at] ^ (1 + rng() % 255));
      check(m);
    }
  }
}

TEST_CASE("protocol: receive buffer keeps partial messages across reads", "[protocol]") {
  ReceiveBuffer b;
  std::memcpy(b.prepare(3), "abc", 3);
  b.commit(3);
  b.consume(1);
  CHECK(b.data() == "bc");
  char* at = b.prepare(100000);  // grows, keeping "bc" at the front
  std::memcpy(at, "d", 1);
  b.commit(1);
  CHECK(b.data() == "bcd");
  b.consume(3);
  CHECK(b.size() == 0);
}

TEST_CASE("protocol: a batch carries whole request frames, decoded in order, and waiting, "
          "unanswered and truncated parts are Bad", "[protocol]") {
  std::string frames;
  std::vector<Request> parts;
  for (const Request& q : everyRequest())
    if (mayBeBatched(q.op)) {
      encodeRequest(q, frames);
      parts.push_back(q);
    }
  REQUIRE(parts.size() >= 8);
  std::string batch;
  encodeBatch(frames, 77, batch);
  Request back;
  auto r = decodeRequest(batch, back);
  REQUIRE(r.status == DecodeStatus::Ok);
  CHECK(r.consumed == batch.size());
  CHECK(back.op == Op::Batch);
  CHECK(back.id == 77);
  REQUIRE(back.parts.size() == parts.size());
  for (size_t i = 0; i < parts.size(); ++i) requireSame(parts[i], back.parts[i]);
  // encodeRequest of the decoded batch writes the same bytes (the codec agrees with itself).
  const Request decoded = back;
  std::string again;
  encodeRequest(decoded, again);
  CHECK(again == batch);
  // A batch cut at any byte needs more, like any frame.
  for (size_t cut = 0; cut < batch.size(); ++cut)
    REQUIRE(decodeRequest(std::string_view(batch).substr(0, cut), back).status == DecodeStatus::NeedMore);
  for (Op op : {Op::Get, Op::Wait, Op::MultiGet, Op::Watch, Op::Heartbeat}) {
    INFO(toString(op));
    Request q;
    q.op = op;
    q.keys = {"k"};
    std::string one, wrapped;
    encodeRequest(q, one);
    encodeBatch(one, 1, wrapped);
    auto bad = decodeRequest(wrapped, back);
    CHECK(bad.status == DecodeStatus::Bad);
    CHECK_THAT(bad.error, Catch::Contains("batch part 0"));
  }
  std::string nested;
  encodeBatch(batch, 78, nested);
  CHECK(decodeRequest(nested, back).status == DecodeStatus::Bad);
  std::string truncated;
  encodeBatch(std::string_view(frames).substr(0, frames.size() - 1), 79, truncated);
  CHECK_THAT(decodeRequest(truncated, back).error, Catch::Contains("ends inside"));
  Request carriesABatch;
  carriesABatch.op = Op::Batch;
  carriesABatch.parts = {decoded};
  std::string refused;
  CHECK_THROWS_AS(encodeRequest(carriesABatch, refused), drun::InvalidArgument);
  CHECK(refused.empty());
  Response none;
  none.op = Op::Batch;
  CHECK_THROWS_AS(encodeResponse(none, refused), drun::InvalidArgument);
  CHECK(decodeResponse(frame(0, static_cast<uint8_t>(Op::Batch), 0, ""), none).status == DecodeStatus::Bad);
}
