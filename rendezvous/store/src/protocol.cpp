#include "drun/store/protocol.hpp"


#include <cerrno>
#include <cstring>

#include "drun/common/crypto.hpp"
#include "drun/common/error.hpp"

namespace drun::rdzv::wire {
namespace {

// --- explicit little-endian writing

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void i64(int64_t v) { le(static_cast<uint64_t>(v), 8); }
  void bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void strings(const std::vector<std::string>& list) {
    u32(static_cast<uint32_t>(list.size()));
    for (const auto& s : list) bytes(s);
  }
  size_t size() const { return out_.size(); }
  void patchU32(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) out_[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string& out_;
};

// --- bounds-checked little-endian reading; the first failure sticks and names itself

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return in_.size() - pos_; }
  void fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }

  uint64_t le(int n, const char* what) {
    if (!ok()) return 0;
    if (left() < static_cast<size_t>(n)) {
      fail(std::string("truncated ") + what);
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  uint8_t u8(const char* what) { return static_cast<uint8_t>(le(1, what)); }
  uint16_t u16(const char* what) { return static_cast<uint16_t>(le(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(le(4, what)); }
  uint64_t u64(const char* what) { return le(8, what); }
  int64_t i64(const char* what) { return static_cast<int64_t>(le(8, what)); }
  bool flag(const char* what) {
    uint8_t v = u8(what);
    if (v > 1) fail(std::string(what) + " is " + std::to_string(v) + ", not 0 or 1");
    return v == 1;
  }
  std::string bytes(size_t max, const char* what) {
    uint32_t n = u32(what);
    if (!ok()) return {};
    if (n > max) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes is over the limit of " +
           std::to_string(max));
      return {};
    }
    if (n > left()) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes runs past the frame");
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // A list count, checked against the limit and against the bytes left (each item takes at
  // least `minItemBytes`), before anything is reserved for it.
  uint32_t count(size_t max, size_t minItemBytes, const char* what) {
    uint32_t n = u32(what);
    if (!ok()) return 0;
    if (n > max) {
      fail(std::string(what) + " " + std::to_string(n) + " is over the limit of " +
           std::to_string(max));
      return 0;
    }
    if (static_cast<uint64_t>(n) * minItemBytes > left()) {
      fail(std::string(what) + " " + std::to_string(n) + " runs past the frame");
      return 0;
    }
    return n;
  }
  std::vector<std::string> strings(size_t maxCount, size_t maxEach, const char* what) {
    uint32_t n = count(maxCount, 4, what);
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok(); ++i) out.push_back(bytes(maxEach, what));
    return out;
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

// --- limits on the encoding side: the caller learns about them as InvalidArgument

void checkKey(const std::string& key, const Limits& l) { checkKeyLimit(key, l.store); }
void checkValue(const std::string& key, const Bytes& v, const Limits& l) {
  checkValueLimit(key, v, l.store);
}
void checkCount(size_t n, const Limits& l) { checkKeyCountLimit(n, l.store); }
void checkKeys(const std::vector<std::string>& keys, const Limits& l) {
  checkCount(keys.size(), l);
  for (const auto& k : keys) checkKey(k, l);
}
void expectKeys(const Request& r, size_t n) {
  if (r.keys.size() != n)
    throw InvalidArgument(std::string(toString(r.op)) + " takes " + std::to_string(n) +
                          " key(s), got " + std::to_string(r.keys.size()));
}
void expectValues(const Request& r, size_t n) {
  if (r.values.size() != n)
    throw InvalidArgument(std::string(toString(r.op)) + " takes " + std::to_string(n) +
                          " value(s), got " + std::to_string(r.values.size()));
}

size_t beginFrame(Writer& w, Op op, Status status, uint64_t id) {
  size_t at = w.size();
  w.u32(0);  // body length, patched by endFrame
  w.u8(static_cast<uint8_t>(op));
  w.u8(static_cast<uint8_t>(status));
  w.u16(0);
  w.u64(id);
  return at;
}

void endFrame(Writer& w, std::string& out, size_t at, const Limits& l) {
  size_t body = w.size() - at - kHeaderBytes;
  if (body > l.maxFrameBytes) {
    out.resize(at);
    throw InvalidArgument("message of " + std::to_string(body) +
                          " bytes is over the frame limit of " + std::to_string(l.maxFrameBytes));
  }
  w.patchU32(at, static_cast<uint32_t>(body));
}

// The body of an Ok response, by op.
enum class ReplyShape { Empty, Value, OptionalValue, Number, Flag, Values };

ReplyShape replyShape(Op op) {
  switch (op) {
    case Op::Get:
    case Op::CompareSet:
      return ReplyShape::Value;  // bytes
    case Op::TryGet:
    case Op::Watch:
      return ReplyShape::OptionalValue;  // u8 present, [bytes]
    case Op::Add:
    case Op::NumKeys:
    case Op::DeletePrefix:
      return ReplyShape::Number;  // i64
    case Op::Check:
    case Op::Delete:
      return ReplyShape::Flag;  // u8 0/1
    case Op::MultiGet:
    case Op::ListJobs:
      return ReplyShape::Values;  // u32 n, n x bytes
    default:
      return ReplyShape::Empty;  // Set, Wait, MultiSet, Append, SetWill
  }
}

// Whether the bytes received so far agree with the magic: a foreign peer is rejected as soon as
// its first bytes differ, without waiting for a whole hello.
bool magicSoFar(std::string_view in) {
  for (size_t i = 0; i < std::min<size_t>(in.size(), 4); ++i)
    if (static_cast<unsigned char>(in[i]) != ((kMagic >> (8 * i)) & 0xff)) return false;
  return true;
}

// Hello and HelloReply share one 12-byte layout: magic, u16 version, u16 word (the client's
// flags / the server's status), u32 lease.
struct HelloLayout {
  uint16_t version = 0;
  uint16_t word = 0;
  uint32_t leaseMs = 0;
};

DecodeResult decodeHelloLayout(std::string_view in, const char* peer, const char* wordName,
                               uint16_t maxWord, HelloLayout& h) {
  DecodeResult r;
  if (!magicSoFar(in)) {
    r.status = DecodeStatus::Bad;
    r.error = std::string("not a drun store ") + peer + " (bad magic)";
    return r;
  }
  if (in.size() < kHelloBytes) return r;
  Reader rd(in.substr(0, kHelloBytes));
  rd.u32("magic");
  h.version = rd.u16("version");
  h.word = rd.u16(wordName);
  h.leaseMs = rd.u32("lease");
  if (h.word > maxWord) {
    r.status = DecodeStatus::Bad;
    r.error = std::string("unknown ") + wordName + " " + std::to_string(h.word);
    return r;
  }
  r.status = DecodeStatus::Ok;
  r.consumed = kHelloBytes;
  return r;
}

struct Header {
  uint32_t length = 0;
  uint8_t op = 0;
  uint8_t status = 0;
  uint64_t id = 0;
};

// Reads and checks a frame header; NeedMore until the whole frame is present.
DecodeResult frame(std::string_view in, const Limits& l, Header& h, std::string_view& body) {
  DecodeResult r;
  if (in.size() < kHeaderBytes) return r;
  Reader hr(in.substr(0, kHeaderBytes));
  h.length = hr.u32("frame length");
  h.op = hr.u8("op");
  h.status = hr.u8("status");
  uint16_t reserved = hr.u16("reserved");
  h.id = hr.u64("request id");
  r.status = DecodeStatus::Bad;
  if (h.length > l.maxFrameBytes) {
    r.error = "frame of " + std::to_string(h.length) + " bytes is over the limit of " +
              std::to_string(l.maxFrameBytes);
    return r;
  }
  if (!isValidOp(h.op)) {
    r.error = "unknown op " + std::to_string(h.op);
    return r;
  }
  if (h.status > kMaxStatus) {
    r.error = "unknown status " + std::to_string(h.status);
    return r;
  }
  if (reserved != 0) {
    r.error = "reserved header bits set";
    return r;
  }
  if (in.size() - kHeaderBytes < h.length) {
    r.status = DecodeStatus::NeedMore;
    r.needed = kHeaderBytes + h.length;
    return r;
  }
  body = in.substr(kHeaderBytes, h.length);
  r.status = DecodeStatus::Ok;
  r.consumed = kHeaderBytes + h.length;
  return r;
}

DecodeResult finish(DecodeResult r, const Reader& rd) {
  if (!rd.ok()) {
    r.status = DecodeStatus::Bad;
    r.error = rd.error();
  } else if (rd.left() != 0) {
    r.status = DecodeStatus::Bad;
    r.error = std::to_string(rd.left()) + " unexpected bytes after the body";
  }
  if (r.status == DecodeStatus::Bad) r.consumed = 0;
  return r;
}

}  // namespace

std::string_view toString(Op op) {
  switch (op) {
    case Op::Set: return "set";
    case Op::Get: return "get";
    case Op::TryGet: return "tryGet";
    case Op::Add: return "add";
    case Op::CompareSet: return "compareSet";
    case Op::Wait: return "wait";
    case Op::Check: return "check";
    case Op::Delete: return "delete";
    case Op::NumKeys: return "numKeys";
    case Op::MultiGet: return "multiGet";
    case Op::MultiSet: return "multiSet";
    case Op::Append: return "append";
    case Op::Watch: return "watch";
    case Op::SetWill: return "setWill";
    case Op::Heartbeat: return "heartbeat";
    case Op::DeletePrefix: return "deletePrefix";
    case Op::ListJobs: return "listJobs";
    case Op::Batch: return "batch";
  }
  return "unknown";
}

std::string_view toString(Status status) {
  switch (status) {
    case Status::Ok: return "ok";
    case Status::Timeout: return "timeout";
    case Status::InvalidArgument: return "invalid argument";
    case Status::ProtocolError: return "protocol error";
    case Status::ServerError: return "server error";
  }
  return "unknown";
}

bool isValidOp(uint8_t op) { return op >= 1 && op <= kMaxOp; }
bool expectsResponse(Op op) { return op != Op::Heartbeat && op != Op::Batch; }
bool isBlocking(Op op) {
  return op == Op::Get || op == Op::Wait || op == Op::MultiGet || op == Op::Watch;
}
bool mayBeBatched(Op op) { return isValidOp(static_cast<uint8_t>(op)) && expectsResponse(op) && !isBlocking(op); }

// --- hello

void encodeHello(const Hello& hello, std::string& out) {
  if (hello.scope.size() > kMaxScopeBytes)
    throw InvalidArgument("hello scope of " + std::to_string(hello.scope.size()) +
                          " bytes is over the limit of " + std::to_string(kMaxScopeBytes));
  Writer w(out);
  w.u32(kMagic);
  w.u16(hello.version);
  w.u16(0);
  w.u32(hello.leaseMs);
  if (hello.version != kVersion) return;  // a test playing an old client
  out.append(reinterpret_cast<const char*>(hello.nonce.data()), kNonceBytes);
  w.bytes(hello.scope);
}

void encodeHelloReply(const HelloReply& reply, std::string& out) {
  Writer w(out);
  w.u32(kMagic);
  w.u16(reply.version);
  w.u16(static_cast<uint16_t>(reply.status));
  w.u32(reply.leaseMs);
  if (reply.status != HelloStatus::Ok || reply.version != kVersion) return;
  out.append(reinterpret_cast<const char*>(reply.nonce.data()), kNonceBytes);
  w.u8(reply.tokenRequired ? 1 : 0);
}

void encodeAuth(const Mac& mac, std::string& out) {
  out.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
}

void encodeAuthReply(const AuthReply& reply, std::string& out) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(reply.status));
  out.append(reinterpret_cast<const char*>(reply.mac.data()), kMacBytes);
}

namespace {

template <size_t N>
void readArray(std::string_view in, std::array<uint8_t, N>& out) {
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(in[i]);
}

}  // namespace

DecodeResult decodeHello(std::string_view in, Hello& out) {
  HelloLayout h;
  DecodeResult r = decodeHelloLayout(in, "client", "hello flags", 0, h);
  out.version = h.version;
  out.leaseMs = h.leaseMs;
  if (r.status != DecodeStatus::Ok || h.version != kVersion) return r;
  // This version's tail: nonce, scope.
  constexpr size_t kFixed = kHelloBytes + kNonceBytes + 4;
  if (in.size() < kFixed) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFixed;
    return r;
  }
  readArray(in.substr(kHelloBytes), out.nonce);
  Reader rd(in.substr(kHelloBytes + kNonceBytes, 4));
  const uint32_t scopeBytes = rd.u32("scope length");
  if (scopeBytes > kMaxScopeBytes) {
    r.status = DecodeStatus::Bad;
    r.consumed = 0;
    r.error = "hello scope of " + std::to_string(scopeBytes) + " bytes is over the limit of " +
              std::to_string(kMaxScopeBytes);
    return r;
  }
  if (in.size() < kFixed + scopeBytes) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFixed + scopeBytes;
    return r;
  }
  out.scope = std::string(in.substr(kFixed, scopeBytes));
  r.consumed = kFixed + scopeBytes;
  return r;
}

DecodeResult decodeHelloReply(std::string_view in, HelloReply& out) {
  HelloLayout h;
  DecodeResult r =
      decodeHelloLayout(in, "server", "hello status", static_cast<uint16_t>(HelloStatus::Busy), h);
  out.version = h.version;
  out.status = static_cast<HelloStatus>(h.word);
  out.leaseMs = h.leaseMs;
  if (r.status != DecodeStatus::Ok || out.status != HelloStatus::Ok || h.version != kVersion)
    return r;
  constexpr size_t kFull = kHelloBytes + kNonceBytes + 1;
  if (in.size() < kFull) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFull;
    return r;
  }
  readArray(in.substr(kHelloBytes), out.nonce);
  const auto required = static_cast<uint8_t>(in[kHelloBytes + kNonceBytes]);
  if (required > 1) {
    r.status = DecodeStatus::Bad;
    r.consumed = 0;
    r.error = "token-required flag is " + std::to_string(required) + ", not 0 or 1";
    return r;
  }
  out.tokenRequired = required == 1;
  r.consumed = kFull;
  return r;
}

DecodeResult decodeAuth(std::string_view in, Mac& out) {
  DecodeResult r;
  if (in.size() < kMacBytes) {
    r.needed = kMacBytes;
    return r;
  }
  readArray(in, out);
  r.status = DecodeStatus::Ok;
  r.consumed = kMacBytes;
  return r;
}

DecodeResult decodeAuthReply(std::string_view in, AuthReply& out) {
  DecodeResult r;
  if (in.size() < kAuthReplyBytes) {
    r.needed = kAuthReplyBytes;
    return r;
  }
  const auto status = static_cast<uint8_t>(in[0]);
  if (status > static_cast<uint8_t>(AuthStatus::Refused)) {
    r.status = DecodeStatus::Bad;
    r.error = "unknown auth status " + std::to_string(status);
    return r;
  }
  out.status = static_cast<AuthStatus>(status);
  readArray(in.substr(1), out.mac);
  r.status = DecodeStatus::Ok;
  r.consumed = kAuthReplyBytes;
  return r;
}

namespace {

Mac proof(std::string_view label, std::string_view token, const Nonce& first,
          const Nonce& second, std::string_view scope) {
  std::string message(label);
  message.push_back('\0');
  message.append(reinterpret_cast<const char*>(first.data()), first.size());
  message.append(reinterpret_cast<const char*>(second.data()), second.size());
  message.append(scope);
  return crypto::hmacSha256(token, message);
}

}  // namespace

Mac clientProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope) {
  return proof("drun store v2 client", token, server, client, scope);
}

Mac serverProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope) {
  return proof("drun store v2 server", token, client, server, scope);
}

bool equalMacs(const Mac& a, const Mac& b) { return crypto::equalDigests(a, b); }

Nonce randomNonce() {
  Nonce n;
  crypto::randomBytes(n.data(), n.size());
  return n;
}

// --- requests

void encodeRequest(const Request& q, std::string& out, const Limits& l) {
  Writer w(out);
  size_t at = beginFrame(w, q.op, Status::Ok, q.id);
  try {
    switch (q.op) {
      case Op::Set:
      case Op::Append:
        expectKeys(q, 1);
        expectValues(q, 1);
        checkKey(q.keys[0], l);
        checkValue(q.keys[0], q.values[0], l);
        w.bytes(q.keys[0]);
        w.bytes(q.values[0]);
        break;
      case Op::Get:
        expectKeys(q, 1);
        checkKey(q.keys[0], l);
        w.u32(q.timeoutMs);
        w.bytes(q.keys[0]);
        break;
      case Op::TryGet:
      case Op::Delete:
      case Op::DeletePrefix:
        expectKeys(q, 1);
        checkKey(q.keys[0], l);
        w.bytes(q.keys[0]);
        break;
      case Op::Add:
        expectKeys(q, 1);
        checkKey(q.keys[0], l);
        w.bytes(q.keys[0]);
        w.i64(q.delta);
        break;
      case Op::CompareSet:
        expectKeys(q, 1);
        expectValues(q, 2);
        checkKey(q.keys[0], l);
        checkValue(q.keys[0], q.values[0], l);
        checkValue(q.keys[0], q.values[1], l);
        w.bytes(q.keys[0]);
        w.bytes(q.values[0]);
        w.bytes(q.values[1]);
        break;
      case Op::Wait:
      case Op::MultiGet:
        checkKeys(q.keys, l);
        w.u32(q.timeoutMs);
        w.strings(q.keys);
        break;
      case Op::Check:
        checkKeys(q.keys, l);
        w.strings(q.keys);
        break;
      case Op::NumKeys:
      case Op::ListJobs:
      case Op::Heartbeat:
        break;
      case Op::MultiSet:
        expectValues(q, q.keys.size());
        checkKeys(q.keys, l);
        w.u32(static_cast<uint32_t>(q.keys.size()));
        for (size_t i = 0; i < q.keys.size(); ++i) {
          checkValue(q.keys[i], q.values[i], l);
          w.bytes(q.keys[i]);
          w.bytes(q.values[i]);
        }
        break;
      case Op::Watch:
        expectKeys(q, 1);
        checkKey(q.keys[0], l);
        if (q.known) checkValue(q.keys[0], *q.known, l);
        w.u32(q.timeoutMs);
        w.bytes(q.keys[0]);
        w.u8(q.known ? 1 : 0);
        if (q.known) w.bytes(*q.known);
        break;
      case Op::SetWill: {
        const auto& will = q.will;
        checkCount(will.sets.size() + will.adds.size() + will.deletes.size(), l);
        w.u32(static_cast<uint32_t>(will.sets.size()));
        for (const auto& [k, v] : will.sets) {
          checkKey(k, l);
          checkValue(k, v, l);
          w.bytes(k);
          w.bytes(v);
        }
        w.u32(static_cast<uint32_t>(will.adds.size()));
        for (const auto& [k, d] : will.adds) {
          checkKey(k, l);
          w.bytes(k);
          w.i64(d);
        }
        checkKeys(will.deletes, l);
        w.strings(will.deletes);
        break;
      }
      case Op::Batch:  // its parts' frames, as encodeBatch wraps frames already encoded
        checkCount(q.parts.size(), l);
        for (const Request& part : q.parts) {
          if (!mayBeBatched(part.op))
            throw InvalidArgument("a batch cannot carry a " + std::string(toString(part.op)));
          encodeRequest(part, out, l);
        }
        break;
      default:
        throw InvalidArgument("cannot encode unknown op " +
                              std::to_string(static_cast<int>(q.op)));
    }
  } catch (...) {
    out.resize(at);
    throw;
  }
  endFrame(w, out, at, l);
}

void encodeBatch(std::string_view frames, uint64_t id, std::string& out, const Limits& l) {
  Writer w(out);
  size_t at = beginFrame(w, Op::Batch, Status::Ok, id);
  out.append(frames);
  endFrame(w, out, at, l);
}

namespace {

// A Batch's body: whole request frames of ops that may be batched, nothing else. "" or why not.
std::string decodeParts(std::string_view body, std::vector<Request>& parts, const Limits& l) {
  while (!body.empty()) {
    if (parts.size() >= l.store.maxKeysPerRequest)
      return "batch of more than " + std::to_string(l.store.maxKeysPerRequest) + " requests";
    Request part;
    const DecodeResult r = decodeRequest(body, part, l);
    if (r.status == DecodeStatus::NeedMore) return "batch ends inside a request frame";
    if (r.status == DecodeStatus::Bad) return "batch part " + std::to_string(parts.size()) + ": " + r.error;
    if (!mayBeBatched(part.op))
      return "batch part " + std::to_string(parts.size()) + " is a " + std::string(toString(part.op)) +
             " (only calls answered at once may be batched)";
    parts.push_back(std::move(part));
    body.remove_prefix(r.consumed);
  }
  return "";
}

}  // namespace

DecodeResult decodeRequest(std::string_view in, Request& q, const Limits& l) {
  Header h;
  std::string_view body;
  DecodeResult r = frame(in, l, h, body);
  if (r.status != DecodeStatus::Ok) return r;
  if (h.status != 0) {
    r.status = DecodeStatus::Bad;
    r.error = "request with a status byte";
    r.consumed = 0;
    return r;
  }
  q = Request{};
  q.op = static_cast<Op>(h.op);
  q.id = h.id;
  if (q.op == Op::Batch) {
    if (std::string why = decodeParts(body, q.parts, l); !why.empty()) {
      r.status = DecodeStatus::Bad;
      r.error = std::move(why);
      r.consumed = 0;
    }
    return r;
  }
  const size_t maxKey = l.store.maxKeyBytes;
  const size_t maxValue = l.store.maxValueBytes;
  const size_t maxKeys = l.store.maxKeysPerRequest;
  Reader rd(body);
  switch (q.op) {
    case Op::Set:
    case Op::Append:
      q.keys.push_back(rd.bytes(maxKey, "key"));
      q.values.push_back(rd.bytes(maxValue, "value"));
      break;
    case Op::Get:
      q.timeoutMs = rd.u32("timeout");
      q.keys.push_back(rd.bytes(maxKey, "key"));
      break;
    case Op::TryGet:
    case Op::Delete:
    case Op::DeletePrefix:
      q.keys.push_back(rd.bytes(maxKey, "key"));
      break;
    case Op::Add:
      q.keys.push_back(rd.bytes(maxKey, "key"));
      q.delta = rd.i64("delta");
      break;
    case Op::CompareSet:
      q.keys.push_back(rd.bytes(maxKey, "key"));
      q.values.push_back(rd.bytes(maxValue, "expected value"));
      q.values.push_back(rd.bytes(maxValue, "desired value"));
      break;
    case Op::Wait:
    case Op::MultiGet:
      q.timeoutMs = rd.u32("timeout");
      q.keys = rd.strings(maxKeys, maxKey, "key");
      break;
    case Op::Check:
      q.keys = rd.strings(maxKeys, maxKey, "key");
      break;
    case Op::NumKeys:
    case Op::ListJobs:
    case Op::Heartbeat:
    case Op::Batch:  // decoded above, part by part
      break;
    case Op::MultiSet: {
      uint32_t n = rd.count(maxKeys, 8, "key count");
      q.keys.reserve(n);
      q.values.reserve(n);
      for (uint32_t i = 0; i < n && rd.ok(); ++i) {
        q.keys.push_back(rd.bytes(maxKey, "key"));
        q.values.push_back(rd.bytes(maxValue, "value"));
      }
      break;
    }
    case Op::Watch:
      q.timeoutMs = rd.u32("timeout");
      q.keys.push_back(rd.bytes(maxKey, "key"));
      if (rd.flag("known flag")) q.known = rd.bytes(maxValue, "known value");
      break;
    case Op::SetWill: {
      uint32_t ns = rd.count(maxKeys, 8, "will set count");
      for (uint32_t i = 0; i < ns && rd.ok(); ++i) {
        std::string k = rd.bytes(maxKey, "key");
        Bytes v = rd.bytes(maxValue, "value");
        q.will.sets.emplace_back(std::move(k), std::move(v));
      }
      uint32_t na = rd.count(maxKeys, 12, "will add count");
      for (uint32_t i = 0; i < na && rd.ok(); ++i) {
        std::string k = rd.bytes(maxKey, "key");
        int64_t d = rd.i64("delta");
        q.will.adds.emplace_back(std::move(k), d);
      }
      q.will.deletes = rd.strings(maxKeys, maxKey, "will delete");
      if (rd.ok() && ns + na + q.will.deletes.size() > maxKeys)
        rd.fail("will of " + std::to_string(ns + na + q.will.deletes.size()) +
                " entries is over the limit of " + std::to_string(maxKeys));
      break;
    }
  }
  return finish(r, rd);
}

// --- responses

void encodeResponse(const Response& p, std::string& out, const Limits& l) {
  Writer w(out);
  if (!expectsResponse(p.op)) throw InvalidArgument(std::string(toString(p.op)) + " requests are never answered");
  size_t at = beginFrame(w, p.op, p.status, p.id);
  try {
    if (p.status != Status::Ok) {
      std::string message = p.message.substr(0, l.maxMessageBytes);
      w.bytes(message);
      checkKeys(p.keys, l);
      w.strings(p.keys);
    } else {
      switch (replyShape(p.op)) {
        case ReplyShape::Empty:
          break;
        case ReplyShape::Value:
          if (p.values.size() != 1) throw InvalidArgument("response takes one value");
          checkValue("(reply)", p.values[0], l);
          w.bytes(p.values[0]);
          break;
        case ReplyShape::OptionalValue:
          if (p.values.size() > 1) throw InvalidArgument("response takes at most one value");
          w.u8(p.values.empty() ? 0 : 1);
          if (!p.values.empty()) w.bytes(p.values[0]);
          break;
        case ReplyShape::Number:
          w.i64(p.number);
          break;
        case ReplyShape::Flag:
          w.u8(p.number != 0 ? 1 : 0);
          break;
        case ReplyShape::Values:
          checkCount(p.values.size(), l);
          w.strings(p.values);
          break;
      }
    }
  } catch (...) {
    out.resize(at);
    throw;
  }
  endFrame(w, out, at, l);
}

DecodeResult decodeResponse(std::string_view in, Response& p, const Limits& l) {
  Header h;
  std::string_view body;
  DecodeResult r = frame(in, l, h, body);
  if (r.status != DecodeStatus::Ok) return r;
  p = Response{};
  p.op = static_cast<Op>(h.op);
  p.id = h.id;
  p.status = static_cast<Status>(h.status);
  const size_t maxValue = l.store.maxValueBytes;
  Reader rd(body);
  if (!expectsResponse(p.op)) {
    rd.fail("a " + std::string(toString(p.op)) + " is never answered");
  } else if (p.status != Status::Ok) {
    p.message = rd.bytes(l.maxMessageBytes, "error message");
    p.keys = rd.strings(l.store.maxKeysPerRequest, l.store.maxKeyBytes, "key");
  } else {
    switch (replyShape(p.op)) {
      case ReplyShape::Empty:
        break;
      case ReplyShape::Value:
        p.values.push_back(rd.bytes(maxValue, "value"));
        break;
      case ReplyShape::OptionalValue:
        if (rd.flag("present flag")) p.values.push_back(rd.bytes(maxValue, "value"));
        break;
      case ReplyShape::Number:
        p.number = rd.i64("number");
        break;
      case ReplyShape::Flag:
        p.number = rd.flag("flag") ? 1 : 0;
        break;
      case ReplyShape::Values:
        p.values = rd.strings(l.store.maxKeysPerRequest, maxValue, "value");
        break;
    }
  }
  return finish(r, rd);
}

// --- receive buffer

char* ReceiveBuffer::prepare(size_t min) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (buffer_.size() - end_ < min) {
    // Move the unread part to the front before growing, so a long-lived connection's buffer
    // stays the size of its largest message.
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (buffer_.size() - end_ < min) buffer_.resize(end_ + min);
  }
  return buffer_.data() + end_;
}

void ReceiveBuffer::consume(size_t n) {
  begin_ += n;
  if (begin_ != end_) return;
  begin_ = end_ = 0;
  // After a large message, give the memory back: thousands of idle connections each keeping the
  // size of their largest frame would add up.
  constexpr size_t kKeepBytes = 256 * 1024;
  if (buffer_.size() > kKeepBytes) std::string().swap(buffer_);
}

}  // namespace drun::rdzv::wire
