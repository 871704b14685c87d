// guarded(): the body of an Asio handler, run so that no exception crosses the handler
// (DESIGN.md: an exception escaping io_context::run() would unwind the agent and end in
// std::terminate). One that escapes the body is reported as an error log line and swallowed.
#pragma once

#include <spdlog/spdlog.h>

#include <exception>

namespace drun::agent::detail {

// Runs body(); what it throws is logged as "internal error in <what>: ..." and swallowed.
template <class Body>
void guarded(const char* what, Body&& body) noexcept {
  try {
    body();
  } catch (const std::exception& e) {
    spdlog::error("internal error in {}: {}", what, e.what());
  } catch (...) {
    spdlog::error("internal error in {}: unknown exception", what);
  }
}

}  // namespace drun::agent::detail
