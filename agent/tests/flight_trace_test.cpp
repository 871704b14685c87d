// Unit tests of flight records (flight_trace.hpp): files as drun's backend writes them are read
// and compared (a rank that never entered a collective, ranks that disagree on one, a rank with
// no record); malformed, truncated or hostile files are errors naming the file.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "drun/agent/flight_trace.hpp"
#include "drun/common/error.hpp"
#include "test_support.hpp"

using namespace drun::agent;
namespace fs = std::filesystem;

namespace {

// A temporary directory that records are written into.
struct RecordDir {
  drun::agent::test::TempDir temp;
  fs::path dir = temp.path();
  fs::path write(const std::string& name, const std::string& text) const {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name) << text;
    return dir / name;
  }
};

std::string entry(int seq, const std::string& op, int count, const std::string& state) {
  return R"({"group": "0-2", "seq": )" + std::to_string(seq) + R"(, "op": ")" + op + R"(", "dtype": "Float", "count": )" +
         std::to_string(count) + R"(, "state": ")" + state + R"(", "queued_ns": 1, "start_ns": 2, "end_ns": 3})";
}

std::string record(int rank, const std::vector<std::string>& entries, int world = 3) {
  std::string out = R"({"version": 1, "rank": )" + std::to_string(rank) + R"(, "world_size": )" + std::to_string(world) +
                    R"(, "pid": 7, "reason": "SIGUSR2", "entries": [)";
  for (size_t i = 0; i < entries.size(); ++i) out += (i ? "," : "") + entries[i];
  return out + "]}\n";
}

}  // namespace

TEST_CASE("flight records: who never entered, where the records disagree, who has none", "[hangs]") {
  RecordDir d;
  d.write("attempt_0/flight_record_rank0.json", record(0, {entry(5, "all_reduce", 4, "completed"), entry(6, "all_reduce", 4, "started")}));
  d.write("attempt_0/flight_record_rank1.json", record(1, {entry(5, "all_reduce", 4, "completed")}));
  d.write("other/flight_record_rank2.json", record(2, {entry(5, "all_reduce", 3, "completed"), entry(6, "barrier", 0, "started")}));
  d.write("attempt_0/0/stderr.log", "not a record\n");
  auto records = readFlightRecords(d.dir);
  REQUIRE(records.size() == 3);
  CHECK(records[1].rank == 1);
  FlightFindings f = analyzeFlightRecords(records);
  REQUIRE(f.neverEntered.size() == 1);
  CHECK(f.neverEntered[0] == "rank 1 never entered all_reduce #6 of group 0-2 (its last: all_reduce #5 of group 0-2, completed)");
  REQUIRE(f.disagree.size() == 2);
  CHECK(f.disagree[0] == "group 0-2 #5: rank 0 all_reduce Float x4, rank 1 all_reduce Float x4, rank 2 all_reduce Float x3");
  CHECK(f.disagree[1] == "group 0-2 #6: rank 0 all_reduce Float x4, rank 2 barrier Float x0");
  CHECK(f.missing.empty());
  const std::string text = describeFlightFindings(records, f);
  CHECK(text.find("3 flight record(s)\nrank 1 never entered all_reduce #6") == 0);

  // Agreeing records, and a rank without one.
  RecordDir agree;
  agree.write("flight_record_rank0.json", record(0, {entry(1, "broadcast", 8, "completed")}, 2));
  auto two = readFlightRecords(agree.dir);
  FlightFindings g = analyzeFlightRecords(two);
  CHECK(g.neverEntered.empty());
  CHECK(g.disagree.empty());
  REQUIRE(g.missing.size() == 1);
  CHECK(g.missing[0] == "no record from rank 1");
  agree.write("flight_record_rank1.json", record(1, {entry(1, "broadcast", 8, "completed")}, 2));
  auto both = readFlightRecords(agree.dir);
  CHECK(analyzeFlightRecords(both).empty());
  CHECK(describeFlightFindings(both, analyzeFlightRecords(both)) ==
        "2 flight record(s); the records agree: every rank entered the same collectives");
}

TEST_CASE("flight records: a malformed, truncated or hostile file is an error naming it", "[hangs]") {
  const std::string good = record(0, {entry(1, "all_reduce", 4, "completed")});
  for (const std::string& bad : {std::string(""), good.substr(0, good.size() / 2), std::string("[1, 2]"),
                                 std::string(R"({"version": 2, "rank": 0, "world_size": 1, "pid": 1, "reason": "x", "entries": []})"),
                                 std::string(R"({"version": 1, "rank": 3, "world_size": 2, "pid": 1, "reason": "x", "entries": []})"),
                                 std::string(R"({"version": 1, "rank": 0, "world_size": 1, "pid": 1, "reason": "x", "entries": {}})"),
                                 std::string(R"({"version": 1, "rank": 0, "world_size": 1, "pid": 1, "reason": "\u0007", "entries": []})"),
                                 std::string(R"({"version": 1, "rank": 0, "world_size": 1, "pid": 1, "reason": "x", "entries": [{"seq": 1}]})"),
                                 std::string(R"({"version": 1, "rank": -1, "world_size": 1, "pid": 1, "reason": "x", "entries": []})"),
                                 std::string(100000, '[') + std::string(100000, ']'), std::string((1 << 20) + 10, ' ')}) {
    RecordDir d;
    const fs::path file = d.write("flight_record_rank0.json", bad);
    INFO(bad.substr(0, 200));
    try {
      readFlightRecords(d.dir);
      FAIL("no error");
    } catch (const drun::Error& e) {
      CHECK(std::string(e.what()).find(file.string()) != std::string::npos);
    }
  }
  RecordDir none;
  CHECK(readFlightRecords(none.dir).empty());
  CHECK_THROWS_AS(readFlightRecords(none.dir / "absent"), drun::Error);
}
