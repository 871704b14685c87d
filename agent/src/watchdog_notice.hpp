// The death notice (drun/common/death_notice.hpp) on the job guard's side: drun hands it to its
// watchdog as lines on the watchdog's socket ("na<hex>" an address, a sockaddr's bytes;
// "nr<hex>" the request; "ne<hex>" the reply's expected start; "n!" the notice so given replaces
// the one held; "n-" none), and the watchdog sends what it holds once drun is gone.
// Threading: noticeLines anywhere; the watchdog's two calls in the forked watchdog only (raw
// system calls, no allocation: forked from a threaded process).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "drun/common/death_notice.hpp"

namespace drun::agent::detail {

inline constexpr size_t kNoticeMaxRequest = 2048;
inline constexpr size_t kNoticeMaxLine = 2 * kNoticeMaxRequest + 16;  // a request in hex

// The lines that hand `notice` to the watchdog, whole (one send: a drun killed meanwhile leaves
// the old notice or the new one); "n-" for none or one too large to hold.
std::string noticeLines(const std::optional<DeathNotice>& notice);
// The watchdog: one line that started with 'n' (without it); malformed ones spoil the notice
// being given, which is then not taken.
void takeNoticeLine(const char* line, size_t length);
// The watchdog: sends the notice it holds to each address in turn, until one answers as
// expected (at most half a second each).
void sendHeldNotice();

std::string toHex(const void* data, size_t length);

}  // namespace drun::agent::detail
