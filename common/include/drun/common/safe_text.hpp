// Text from an untrusted source (the store, a peer, a worker's error file) made safe to print on
// a terminal: bounded in size, with control characters (escape sequences, carriage returns, C1
// controls, bidirectional overrides) and invalid UTF-8 replaced, so that what another node wrote
// can neither flood a log nor rewrite the user's screen.
//
// Threading: pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace drun::text {

struct SafeTextOptions {
  size_t maxBytes = 4096;  // longer input is cut on a character boundary, saying how much was cut
  bool multiLine = false;  // keep '\n' and '\t' (else each becomes a space)
};

// `in` with every byte that is not printable text replaced by '?' (a '\r' is dropped), cut to
// at most maxBytes plus a short note "... (N more bytes)".
std::string printable(std::string_view in, const SafeTextOptions& options = {});

}  // namespace drun::text
