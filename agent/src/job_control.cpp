#include "job_control.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "drun/agent/failure_summary.hpp"
#include "handler_guard.hpp"

namespace drun::agent::detail {

std::vector<int> catchable(const std::vector<int>& wanted) {
  std::vector<int> out;
  for (int sig : wanted) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) {
      spdlog::debug("agent: {} was ignored when drun started: it stays ignored", signalName(sig));
      continue;
    }
    out.push_back(sig);
  }
  return out;
}

JobControl::JobControl(boost::asio::io_context& io, std::function<void(int)> signalWorkers)
    : stops_(io), signalWorkers_(std::move(signalWorkers)) {
  for (int sig : catchable({SIGTSTP, SIGTTIN, SIGTTOU})) stops_.add(sig);
  wait();
}

void JobControl::wait() {
  stops_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    guarded("job control", [&] { suspend(signal); });
    wait();
  });
}

void JobControl::suspend(int signal) {
  spdlog::debug("agent: {}: stopping the workers and drun", signalName(signal));
  signalWorkers_(SIGSTOP);
  // SIGSTOP cannot be blocked: this thread stops before kill() returns, the others with it, and
  // kill() returns once drun is continued.
  ::kill(::getpid(), SIGSTOP);
  spdlog::debug("agent: continued: continuing the workers");
  signalWorkers_(SIGCONT);
}

}  // namespace drun::agent::detail
