// guarded(): the body of an Asio handler, run so that no exception crosses the handler
// (DESIGN.md: an exception escaping io_context::run() would unwind the agent and end in
// std::terminate). One that escapes the body is reported as an error log line and swallowed.
#pragma once

#include <spdlog/spdlog.h>

#include <exception>

namespace drun::agent::detail {

// Runs body(); returns false when it threw (reported as "drun: internal error in <what>: ...").
template <class Body>
bool guarded(const char* what, Body&& body) noexcept {
  try {
    body();
    return true;
  } catch (const std::exception& e) {
    spdlog::error("drun: internal error in {}: {}", what, e.what());
  } catch (...) {
    spdlog::error("drun: internal error in {}: unknown exception", what);
  }
  return false;
}

}  // namespace drun::agent::detail
