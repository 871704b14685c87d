// The rendezvous store's shared secret, read from a file (--rdzv-conf token_file=PATH,
// DRUN_RDZV_TOKEN_FILE, drun-rendezvous --token-file). The secret never goes on the wire: the
// store's hello is a challenge-response over it (protocol.hpp).
//
// Threading: pure functions; thread-safe.
#pragma once

#include <string>

namespace drun::rdzv {

// Limits of a token: short ones are guessable, long ones are a mistake (a wrong file).
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// The token in `path`, without one trailing newline. Throws InvalidArgument naming `what` and the
// path when the file cannot be read, is not a regular file, can be read or written by its group
// or others (chmod 600 it), or holds fewer than kMinTokenBytes or more than kMaxTokenBytes.
std::string readTokenFile(const std::string& path, const std::string& what);

// DRUN_RDZV_TOKEN_FILE read as a token ("" when unset or empty).
std::string tokenFromEnvironment();

}  // namespace drun::rdzv
