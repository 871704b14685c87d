#include "drun/launcher/trace_command.hpp"

#include <cstdio>
#include <exception>

#include "drun/agent/flight_trace.hpp"
#include "drun/common/version.hpp"

namespace drun::launch {
namespace {

constexpr const char* kTraceUsage =
    "usage: drun trace DIR   (the flight records of a job's ranks, flight_record_rank*.json)\n";
// --help, in the shape of drun's and drun status' (their man page is made from it).
constexpr const char* kTraceHelp =
    "drun trace: the ranks' flight records: who never entered which collective\n"
    "Usage: drun trace DIR   (DIR holds the job's flight_record_rank*.json)\n";

}  // namespace

int runTrace(const std::vector<std::string>& args) {
  const std::string only = args.size() == 1 ? args[0] : "";
  if (only == "-h" || only == "--help") {
    std::fputs(kTraceHelp, stdout);
    return 0;
  }
  if (only == "--version") {
    std::printf("drun %s\n", kVersion);
    return 0;
  }
  // No DIR, more than one, or an option drun trace does not have: a usage error, as drun's.
  if (args.size() != 1 || only.empty() || only.front() == '-') {
    if (!only.empty() && only.front() == '-') std::fprintf(stderr, "drun trace: error: unknown option '%s'\n", only.c_str());
    std::fputs(kTraceUsage, stderr);
    return 2;
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
