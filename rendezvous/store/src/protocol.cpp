// The response codec, op names and properties, and the receive buffer (protocol.hpp's top comment
// has the layout). Requests: protocol_requests.cpp; the handshake: protocol_handshake.cpp.
#include "drun/store/protocol.hpp"

#include <cstring>

#include "drun/common/error.hpp"
#include "wire_frames.hpp"

namespace drun::rdzv::wire {
namespace {

using namespace detail;

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
