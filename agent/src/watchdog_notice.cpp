// The job guard's death notice (watchdog_notice.hpp): its lines on the watchdog's socket, what
// the watchdog holds, and the request it sends once drun is gone. The watchdog's side makes raw
// system calls only and no allocation: it runs in a process forked from a threaded one.
#include "watchdog_notice.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace drun::agent::detail {
namespace {

constexpr size_t kNoticeMaxAddresses = 8;
constexpr size_t kNoticeMaxExpect = 32;
constexpr int kNoticeAttemptMs = 500;  // per address: connect, send, the reply's first bytes

struct HeldNotice {
  sockaddr_storage addresses[kNoticeMaxAddresses];
  socklen_t addressLengths[kNoticeMaxAddresses];
  size_t addressCount = 0;
  char request[kNoticeMaxRequest];
  size_t requestLength = 0;
  char expect[kNoticeMaxExpect];
  size_t expectLength = 0;
};
HeldNotice gNotice, gNoticeDraft;  // only touched in the forked watchdog

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}
// Decodes `hexLength` hex characters into `out` (at most `capacity` bytes); false when malformed.
bool fromHex(const char* hex, size_t hexLength, void* out, size_t capacity, size_t* length) {
  if (hexLength % 2 != 0 || hexLength / 2 > capacity) return false;
  auto* bytes = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < hexLength; i += 2) {
    const int high = hexDigit(hex[i]), low = hexDigit(hex[i + 1]);
    if (high < 0 || low < 0) return false;
    bytes[i / 2] = static_cast<unsigned char>(high * 16 + low);
  }
  *length = hexLength / 2;
  return true;
}

long monotonicMs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000L + now.tv_nsec / 1000000L;
}

// Waits for `events` on `fd` until `deadlineMs` (monotonic); false at the deadline or an error.
bool waitFd(int fd, short events, long deadlineMs) {
  for (;;) {
    const long left = deadlineMs - monotonicMs();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    return n > 0 && (p.revents & events);
  }
}

// The request to one address: true when the reply starts as expected.
bool sendNoticeTo(const HeldNotice& notice, size_t i) {
  const auto* address = reinterpret_cast<const sockaddr*>(&notice.addresses[i]);
  const int fd = ::socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const long deadline = monotonicMs() + kNoticeAttemptMs;
  bool ok = ::connect(fd, address, notice.addressLengths[i]) == 0 || errno == EINPROGRESS;
  int error = 0;
  socklen_t errorLength = sizeof error;
  ok = ok && waitFd(fd, POLLOUT, deadline) &&
       ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &errorLength) == 0 && error == 0;
  for (size_t sent = 0; ok && sent < notice.requestLength;) {
    const ssize_t n = ::send(fd, notice.request + sent, notice.requestLength - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    else ok = (n < 0 && (errno == EINTR || errno == EAGAIN)) && waitFd(fd, POLLOUT, deadline);
  }
  char reply[kNoticeMaxExpect];
  size_t have = 0;
  while (ok && have < notice.expectLength) {
    const ssize_t n = ::recv(fd, reply + have, notice.expectLength - have, 0);
    if (n > 0) have += static_cast<size_t>(n);
    else ok = (n < 0 && (errno == EINTR || errno == EAGAIN)) && waitFd(fd, POLLIN, deadline);
  }
  ::close(fd);
  return ok && std::memcmp(reply, notice.expect, notice.expectLength) == 0;
}

}  // namespace

// One notice line (after its "n"); a malformed one spoils the draft, which is then not taken.
void takeNoticeLine(const char* line, size_t length) {
  static bool draftSpoiled = false;
  if (length == 0) return;
  const char kind = line[0];
  size_t got = 0;
  if (kind == '-') {
    gNotice.addressCount = gNoticeDraft.addressCount = 0;
    gNotice.requestLength = gNoticeDraft.requestLength = 0;
    draftSpoiled = false;
  } else if (kind == 'a' && gNoticeDraft.addressCount < kNoticeMaxAddresses) {
    const size_t i = gNoticeDraft.addressCount;
    if (fromHex(line + 1, length - 1, &gNoticeDraft.addresses[i], sizeof(sockaddr_storage), &got) &&
        got >= sizeof(sa_family_t)) {
      gNoticeDraft.addressLengths[i] = static_cast<socklen_t>(got);
      gNoticeDraft.addressCount++;
    } else {
      draftSpoiled = true;
    }
  } else if (kind == 'r') {
    draftSpoiled |= !fromHex(line + 1, length - 1, gNoticeDraft.request, kNoticeMaxRequest, &gNoticeDraft.requestLength);
  } else if (kind == 'e') {
    draftSpoiled |= !fromHex(line + 1, length - 1, gNoticeDraft.expect, kNoticeMaxExpect, &gNoticeDraft.expectLength);
  } else if (kind == '!') {
    if (!draftSpoiled) std::memcpy(&gNotice, &gNoticeDraft, sizeof gNotice);
    gNoticeDraft.addressCount = 0;
    gNoticeDraft.requestLength = gNoticeDraft.expectLength = 0;
    draftSpoiled = false;
  }
}

void sendHeldNotice() {
  if (gNotice.requestLength == 0) return;
  for (size_t i = 0; i < gNotice.addressCount; ++i)
    if (sendNoticeTo(gNotice, i)) return;
}

std::string toHex(const void* data, size_t length) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < length; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// The lines that hand `notice` to the watchdog (replacing the one it holds; one send, so that a
// drun killed meanwhile leaves the old notice or the new one, never a part).
std::string noticeLines(const std::optional<DeathNotice>& notice) {
  if (!notice || notice->request.size() > kNoticeMaxRequest || notice->expectReply.size() > kNoticeMaxExpect)
    return "n-\n";
  std::string lines;
  size_t addresses = 0;
  for (const DeathNotice::Address& a : notice->addresses) {
    sockaddr_storage storage{};
    socklen_t length = 0;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    if (::inet_pton(AF_INET, a.ip.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(a.port);
      length = sizeof *v4;
    } else if (::inet_pton(AF_INET6, a.ip.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(a.port);
      length = sizeof *v6;
    } else {
      continue;
    }
    if (addresses++ < kNoticeMaxAddresses) lines += "na" + toHex(&storage, length) + "\n";
  }
  lines += "nr" + toHex(notice->request.data(), notice->request.size()) + "\n";
  lines += "ne" + toHex(notice->expectReply.data(), notice->expectReply.size()) + "\n";
  return lines + "n!\n";
}

}  // namespace drun::agent::detail
