#include "drun/launcher/trace_command.hpp"

#include <cstdio>
#include <exception>

#include "drun/agent/flight_trace.hpp"

namespace drun::launch {

int runTrace(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0].empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs("usage: drun trace DIR   (the flight records of a job's ranks, flight_record_rank*.json)\n",
               args.size() == 1 && (args[0] == "-h" || args[0] == "--help") ? stdout : stderr);
    return args.size() == 1 && (args[0] == "-h" || args[0] == "--help") ? 0 : 2;
  }
  try {
    auto records = agent::readFlightRecords(args[0]);
    if (records.empty()) {
      std::fprintf(stderr, "drun trace: no flight record (%s*.json) under %s\n", agent::kFlightRecordPrefix, args[0].c_str());
      return 1;
    }
    std::printf("%s\n", agent::describeFlightFindings(records, agent::analyzeFlightRecords(records)).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun trace: %s\n", e.what());
    return 1;
  }
}

}  // namespace drun::launch
