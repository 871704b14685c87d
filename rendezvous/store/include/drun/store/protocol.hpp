// The drun store wire protocol: the one codec that the client (TcpStore), the server
// (StoreServer) and the tests use. Everything that touches bytes on the wire is here.
//
//   connect:  client -> Hello        u32 magic "drun", u16 version, u16 flags (0), u32 lease ms,
//                                    32-byte client nonce, str scope (the run id, or "")
//             server -> HelloReply   u32 magic, u16 server version, u16 HelloStatus, u32 lease ms,
//                                    [Ok: 32-byte server nonce, u8 token required]
//   when a token is required:
//             client -> Auth         32-byte HMAC-SHA256(token, client proof)
//             server -> AuthReply    u8 AuthStatus, 32-byte HMAC-SHA256(token, server proof)
//   The first 12 bytes of Hello and HelloReply are the same in every version, so a server of one
//   version tells a client of another which version it speaks (VersionMismatch).
//   then frames both ways:  header (16 bytes) + body
//             u32 body length, u8 op, u8 status (0 in requests), u16 reserved (0), u64 request id
//   A Batch request's body is whole request frames, one after the other: the server applies
//   them in one step once the whole frame is in, each answered by its own response frame (the
//   Batch itself is not answered). A batch cut off in the middle applies none of its parts, where
//   separate frames cut between two applied the first: a join's will without the count after it.
//
// Integers are little-endian, written byte by byte (never a memcpy of a struct); strings and
// byte values are u32 length + bytes; lists are u32 count + items; enums have explicit values.
// The body layouts of each op are in rendezvous/README.md (the wire table) and in protocol_requests.cpp.
//
// Decoding is incremental and distrustful: decode*() looks at whatever has arrived and answers
// NeedMore (not a whole message yet), Ok (one message decoded; `consumed` bytes used) or Bad
// (not this protocol / over a limit; the connection must be closed). A length is checked
// against the limits and the bytes present before anything is allocated for it.
//
// Threading: pure functions on values; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "drun/store/store.hpp"
#include "drun/store/store_core.hpp"

namespace drun::rdzv::wire {

inline constexpr uint32_t kMagic = 0x6E757264;  // bytes 'd' 'r' 'u' 'n' on the wire
inline constexpr uint16_t kVersion = 3;  // 2: nonces, scope and the token challenge; 3: Batch
inline constexpr size_t kHelloBytes = 12;  // the part of Hello and HelloReply every version shares
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kAuthReplyBytes = 1 + kMacBytes;
inline constexpr size_t kMaxScopeBytes = 128;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
inline constexpr size_t kHeaderBytes = 16;

struct Limits {
  StoreLimits store = kStoreLimits;  // key, value, keys per request
  size_t maxFrameBytes = 64u << 20;  // one frame body
  size_t maxMessageBytes = 4096;     // error text in a response
};
inline constexpr Limits kLimits{};

enum class Op : uint8_t {
  Set = 1,
  Get = 2,           // waits for the key
  TryGet = 3,
  Add = 4,
  CompareSet = 5,
  Wait = 6,
  Check = 7,
  Delete = 8,
  NumKeys = 9,
  MultiGet = 10,     // waits for every key
  MultiSet = 11,
  Append = 12,
  Watch = 13,        // waits for the value to differ from the known one
  SetWill = 14,
  Heartbeat = 15,    // one-way: never answered
  DeletePrefix = 16,
  ListJobs = 17,     // the run ids with keys under rdzv/ (drun status); not for a job's client
  Batch = 18,        // whole request frames applied in one step (mayBeBatched ops); not answered
};
inline constexpr uint8_t kMaxOp = 18;

enum class Status : uint8_t {
  Ok = 0,
  Timeout = 1,          // a blocking call reached its deadline; keys = those still missing
  InvalidArgument = 2,  // the store refused the input (add on a non-integer, value over limit)
  ProtocolError = 3,    // the frame was malformed; the server closes the connection after it
  ServerError = 4,      // anything else (the server is stopping, a bug)
};
inline constexpr uint8_t kMaxStatus = 4;

enum class HelloStatus : uint16_t {
  Ok = 0,
  VersionMismatch = 1,  // the server speaks `version` only; it closes the connection
  Busy = 2,             // the server is at its connection limit (total or for this peer address)
};

enum class AuthStatus : uint8_t {
  Ok = 0,       // the client proved the token; the reply's MAC is the server's proof
  Refused = 1,  // wrong token, or none for this scope; the server closes the connection
};

struct Hello {
  uint16_t version = kVersion;
  uint32_t leaseMs = 0;  // 0 = the server's default lease
  Nonce nonce{};         // the client's challenge: fresh random bytes per connection
  std::string scope;     // the run id the client works for ("" = none); at most kMaxScopeBytes
};

struct HelloReply {
  uint16_t version = kVersion;
  HelloStatus status = HelloStatus::Ok;
  uint32_t leaseMs = 0;        // the lease the server applies to this connection
  Nonce nonce{};               // Ok: the server's challenge
  bool tokenRequired = false;  // Ok: the client must send Auth before any frame
};

struct AuthReply {
  AuthStatus status = AuthStatus::Ok;
  Mac mac{};  // Ok: serverProof(); zeros when refused
};

struct Request {
  Op op = Op::Heartbeat;
  uint64_t id = 0;
  uint32_t timeoutMs = 0;          // Get, Wait, MultiGet, Watch
  std::vector<std::string> keys;   // one key for single-key ops (DeletePrefix: the prefix)
  std::vector<Bytes> values;       // Set/Append: 1; CompareSet: expected, desired; MultiSet: n
  int64_t delta = 0;               // Add
  std::optional<Bytes> known;      // Watch (nullopt = "absent")
  Store::Will will;                // SetWill
  std::vector<Request> parts;      // Batch (decoded): its requests, in order
};

struct Response {
  Op op = Op::Set;
  uint64_t id = 0;
  Status status = Status::Ok;
  std::vector<Bytes> values;      // Get, CompareSet: 1; MultiGet: n; TryGet, Watch: 0 = absent, 1
  int64_t number = 0;             // Add, NumKeys, DeletePrefix; Check, Delete: 0 or 1
  std::string message;            // status != Ok: what went wrong
  std::vector<std::string> keys;  // status == Timeout: the keys still missing
};

enum class DecodeStatus { NeedMore, Ok, Bad };

struct DecodeResult {
  DecodeStatus status = DecodeStatus::NeedMore;
  size_t consumed = 0;  // Ok: bytes of the decoded message
  // NeedMore: the bytes the whole message takes once its header is in (0 = not known yet), so
  // that a reader sizes its reads without decoding the length itself. A claimed length is only a
  // claim: readers grow their buffer with the bytes that arrive, never by this number.
  size_t needed = 0;
  std::string error;    // Bad: why
};

std::string_view toString(Op op);
std::string_view toString(Status status);
bool isValidOp(uint8_t op);
bool expectsResponse(Op op);  // false for Heartbeat and Batch (its parts are answered)
bool isBlocking(Op op);       // Get, Wait, MultiGet, Watch: carry a timeout
bool mayBeBatched(Op op);     // answered at once: not blocking, not Heartbeat, not Batch

// Encoders append one message to `out`. Requests and responses over the limits throw
// InvalidArgument naming the key or size, so no encoder emits a frame a decoder rejects.
void encodeHello(const Hello& hello, std::string& out);  // throws InvalidArgument: scope too long
void encodeHelloReply(const HelloReply& reply, std::string& out);
void encodeAuth(const Mac& mac, std::string& out);
void encodeAuthReply(const AuthReply& reply, std::string& out);
void encodeRequest(const Request& request, std::string& out, const Limits& limits = kLimits);
void encodeResponse(const Response& response, std::string& out, const Limits& limits = kLimits);
// A Batch frame around `frames` (request frames encodeRequest wrote, of mayBeBatched ops).
// Throws InvalidArgument when it is over the frame limit (nothing appended).
void encodeBatch(std::string_view frames, uint64_t id, std::string& out, const Limits& limits = kLimits);

// A hello of another version decodes Ok after its first kHelloBytes (only `version` is set), so
// the server can answer VersionMismatch; a reply that is not Ok is those 12 bytes alone.
DecodeResult decodeHello(std::string_view in, Hello& out);
DecodeResult decodeHelloReply(std::string_view in, HelloReply& out);
DecodeResult decodeAuth(std::string_view in, Mac& out);
DecodeResult decodeAuthReply(std::string_view in, AuthReply& out);

// The challenge-response: each side proves it knows the token by a MAC over both nonces and the
// scope, in a different order and with a different label (a proof cannot be reflected back).
Mac clientProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope);
Mac serverProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope);
bool equalMacs(const Mac& a, const Mac& b);  // CRYPTO_memcmp: time independent of the bytes
Nonce randomNonce();                          // RAND_bytes; throws Error if it fails
DecodeResult decodeRequest(std::string_view in, Request& out, const Limits& limits = kLimits);
DecodeResult decodeResponse(std::string_view in, Response& out, const Limits& limits = kLimits);

// An accumulating receive buffer: append what the socket delivered, decode whole messages off
// the front. Keeps at most one partial message plus what arrived after it.
class ReceiveBuffer {
 public:
  // Space to read into: at least `min` bytes (grows the buffer).
  char* prepare(size_t min);
  void commit(size_t n) { end_ += n; }
  std::string_view data() const { return {buffer_.data() + begin_, end_ - begin_}; }
  void consume(size_t n);
  size_t size() const { return end_ - begin_; }

 private:
  std::string buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace drun::rdzv::wire
