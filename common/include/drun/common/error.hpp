// drun's error hierarchy, shared by every component.
//
// Public APIs throw these; no exception crosses an Asio handler (handlers catch and convert).
// Messages say who, what and how long: "wait timed out after 30000ms on [rdzv/job7/3/joined]
// at 10.0.0.1:29400". Thread-safe: plain value types.
#pragma once

#include <stdexcept>
#include <string>

namespace drun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A deadline passed before the operation completed.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Connect/read/write failed, or the peer closed the connection. errorCode() is the errno behind
// it where one is known (EADDRINUSE from a bind, ...), 0 otherwise: callers that must tell one
// cause from another ask it, never the message text.
class NetworkError : public Error {
 public:
  explicit NetworkError(const std::string& what, int errorCode = 0) : Error(what), errorCode_(errorCode) {}
  int errorCode() const { return errorCode_; }

 private:
  int errorCode_;
};

// The peer sent bytes that do not follow the wire protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// A peer did not prove the shared secret (a wrong or missing token), or refused ours.
class AuthError : public Error {
 public:
  using Error::Error;
};

// Bad input from the command line, the environment or an API caller.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A collective or point-to-point operation failed (libdrun_comm).
class CommError : public Error {
 public:
  using Error::Error;
};

}  // namespace drun
