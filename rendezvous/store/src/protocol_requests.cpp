// The request codec: every op's request body, Batch frames of requests (protocol.hpp's top
// comment has the layout, the wire table each op's body).
#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"
#include "wire_frames.hpp"

namespace drun::rdzv::wire {
namespace {

using namespace detail;

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

}  // namespace

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
}  // namespace drun::rdzv::wire
