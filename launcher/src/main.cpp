// drun: parse the command line into an AgentConfig, pick the rendezvous, run the agent.
#include <signal.h>

#include <cstdio>
#include <spdlog/spdlog.h>
#include <string>
#include <vector>

#include "drun/agent/console_writer.hpp"
#include "drun/agent/elastic_agent.hpp"
#include "drun/common/log.hpp"
#include "drun/launcher/cli.hpp"
#include "drun/launcher/status_command.hpp"
#include "drun/launcher/trace_command.hpp"

int main(int argc, char** argv) {
  // A closed console must not kill drun while workers still run (workers get SIGPIPE's default
  // back: the process layer resets dispositions before exec).
  ::signal(SIGPIPE, SIG_IGN);
  // `drun status ...` reports on a rendezvous' jobs (docs/observe.md); it runs nothing.
  if (argc > 1 && std::string(argv[1]) == "status") {
    try {
      drun::log::init("drun", "");
    } catch (const drun::InvalidArgument& e) {
      std::fprintf(stderr, "drun status: error: %s\n", e.what());
      return 2;
    }
    const int code = drun::launch::runStatus(std::vector<std::string>(argv + 2, argv + argc));
    return code;
  }
  // `drun trace DIR` reads the ranks' flight records (docs/hangs.md); it runs nothing.
  if (argc > 1 && std::string(argv[1]) == "trace") return drun::launch::runTrace(std::vector<std::string>(argv + 2, argv + argc));

  drun::launch::CliResult cli;
  try {
    cli = drun::launch::parseCommandLine(std::vector<std::string>(argv, argv + argc));
    if (cli.printAndExit) {
      std::fputs(cli.printAndExit->c_str(), stdout);
      return 0;
    }
    drun::log::init("drun", cli.logLevel.value_or(""), cli.logFormat.value_or(""));
    for (const std::string& warning : cli.warnings) {
      const std::string line = drun::log::format() == drun::log::Format::Json
                                   ? drun::log::jsonLine("drun", "warning", warning)
                                   : "drun: warning: " + warning + "\n";
      std::fputs(line.c_str(), stderr);
    }
    for (const std::string& note : cli.notes) spdlog::info("{}", note);
  } catch (const drun::InvalidArgument& e) {
    std::fprintf(stderr, "drun: error: %s\n", e.what());
    return 2;
  }

  int code = 1;
  try {
    // Long waits (the store connect, the join) are said through the console, in order with
    // everything else drun and its workers write.
    // Under --log-format json they are JSON lines as the log's.
    cli.config.rendezvous.say = [console = drun::agent::ConsoleWriter::standard(),
                                 json = drun::log::format() == drun::log::Format::Json](const std::string& line) {
      console->write(drun::agent::ConsoleStream::Err,
                     json ? drun::log::jsonLine("drun", "info", line) : "drun: " + line + "\n");
    };
    auto rendezvous = drun::rdzv::makeRendezvous(cli.config.rendezvous);
    drun::agent::ElasticAgent agent(std::move(cli.config), std::move(rendezvous));
    code = agent.run();
  } catch (const drun::InvalidArgument& e) {
    std::fprintf(stderr, "drun: error: %s\n", e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun: error: %s\n", e.what());
    code = 1;
  }
  // The agent is gone (workers reaped, console drained, store connection closed). Returning runs
  // the static destructors: each owner of a helper thread joins it within its bound (the console
  // writer's lanes, the log file writer, the parked membership watchers and lookups) and leaves
  // one still blocked then (owned_thread.hpp), so exiting never hangs on a thread.
  spdlog::default_logger()->flush();
  return code;
}
