// The drun processes of a multi-host e2e test, one per host, each with a label ("host 0",
// "spare"): a failing assertion's report shows what every host printed, not only the run the
// assertion is about (INFO(hosts.describe()) before the checks). A host's failure is often
// explained by another host's output.
#pragma once

#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process.hpp"

namespace drun::test {

class HostRuns {
 public:
  HostRuns() = default;
  // Starts one process per RunOptions, labelled "host 0", "host 1", ... in order.
  explicit HostRuns(const std::vector<RunOptions>& options) {
    for (const RunOptions& o : options) start(o);
  }

  // Starts a process labelled `label` ("host <its index>" when empty); returns its index.
  size_t start(const RunOptions& options, std::string label = "") {
    if (label.empty()) label = "host " + std::to_string(hosts_.size());
    hosts_.push_back({std::move(label), std::make_unique<Process>(options)});
    return hosts_.size() - 1;
  }

  Process& operator[](size_t host) { return *hosts_.at(host).process; }
  size_t size() const { return hosts_.size(); }

  // Waits for the host's exit (Process::wait: its deadline); the result is kept for describe().
  RunResult wait(size_t host) {
    Host& h = hosts_.at(host);
    if (!h.result) h.result = h.process->wait();
    return *h.result;
  }
  // SIGKILLs the host's drun and returns its run.
  RunResult kill(size_t host) {
    (*this)[host].signal(SIGKILL);
    return wait(host);
  }
  // Waits for every host, in order.
  std::vector<RunResult> waitAll() {
    std::vector<RunResult> runs;
    for (size_t h = 0; h < hosts_.size(); ++h) runs.push_back(wait(h));
    return runs;
  }

  // Every host's output, labelled: a host waited for, its run (RunResult::describe); another, its
  // output so far. Does not wait.
  std::string describe() {
    std::string all;
    for (Host& h : hosts_) {
      const std::string title = "==== " + h.label + " (pid " + std::to_string(h.process->pid()) + ")";
      if (h.result) {
        all += title + ": " + h.result->describe() + "\n";
        continue;
      }
      std::string out, err;
      h.process->waitForOutput(
          [&](const std::string& o, const std::string& e) {
            out = o;
            err = e;
            return true;
          },
          std::chrono::milliseconds(0));
      all += title + ": running ====\n---- stdout so far ----\n" + out + "\n---- stderr so far ----\n" + err + "\n";
    }
    return all;
  }

 private:
  struct Host {
    std::string label;
    std::unique_ptr<Process> process;
    std::optional<RunResult> result;
  };
  std::vector<Host> hosts_;
};

}  // namespace drun::test
