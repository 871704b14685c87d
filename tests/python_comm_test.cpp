// drun.comm, libdrun_comm's collectives for plain Python (ctypes, numpy / bytearray /
// memoryview): tests/python/comm_collectives.py under drun on 1 to 4 ranks over shared memory,
// and on 2 ranks over Gloo's TCP; every collective x dtype x op against numpy's result,
// point to point, groups and the argument checks. SKIPPED without /usr/bin/python3's numpy, and
// in sanitized builds.
#include <catch2/catch.hpp>
#include <set>

#include "process.hpp"
#include "tagged_lines.hpp"
#include "torch_python.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// A sanitized libdrun_comm needs its sanitizer's runtime loaded first, which python is not.
void skipInSanitizedBuild(const std::string& test) {
  if (kSanitizedBuild) skipTest(test + ": a sanitized libdrun_comm cannot be loaded by python");
}

void runComm(int world, const std::string& transport) {
  MarkerScope marker;
  auto program = std::filesystem::path(DRUN_SOURCE_DIR) / "tests" / "python" / "comm_collectives.py";
  auto r = run(drunCommand({"--standalone", "--nproc-per-node", std::to_string(world), kTorchPython,
                            program.string()},
                           {marker.env(), drunPythonPath(), "DRUN_COMM_TRANSPORT=" + transport,
                            "OMP_NUM_THREADS=1"},
                           120s));
  INFO("world " << world << " over " << transport << "\n" << r.describe());
  REQUIRE(r.status() == 0);
  std::set<int> ranks;
  for (const auto& l : tagged(r.out, "PYCOMM")) {
    CHECK(l.fields.at("size") == std::to_string(world));
    CHECK(std::stoi(l.fields.at("checks")) > 100);  // every section ran
    ranks.insert(l.rank());
  }
  CHECK(ranks.size() == static_cast<size_t>(world));
  CHECK(marker.leftovers(5s).empty());
}

}  // namespace

TEST_CASE("python drun.comm: every collective on numpy buffers with 1 to 4 ranks (shared memory)",
          "[torch]") {
  skipInSanitizedBuild("drun.comm");
  skipWithoutPythonModule("drun.comm", "numpy", "python3-numpy");
  for (int world = 1; world <= 4; ++world) runComm(world, "shm");
}

TEST_CASE("python drun.comm: every collective on numpy buffers with 2 ranks over Gloo TCP",
          "[torch]") {
  skipInSanitizedBuild("drun.comm over tcp");
  skipWithoutPythonModule("drun.comm over tcp", "numpy", "python3-numpy");
  runComm(2, "tcp");
}
