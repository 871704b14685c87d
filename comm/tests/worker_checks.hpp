// The checks a comm test worker counts, and how it ends (header-only; the workers are single
// threaded): "rank R: FAIL what" for the first 20 failures, then "rank R: ok (N checks)" and exit
// code 0, or "rank R: FAILED F of N checks" and 1.
#pragma once

#include <cstdio>
#include <string>

struct WorkerChecks {
  int rank = 0;
  int failures = 0;
  long checks = 0;

  void check(bool ok, const std::string& what) {
    ++checks;
    if (!ok && ++failures <= 20) std::printf("rank %d: FAIL %s\n", rank, what.c_str());
  }
  int report() const {
    if (failures) {
      std::printf("rank %d: FAILED %d of %ld checks\n", rank, failures, checks);
      return 1;
    }
    std::printf("rank %d: ok (%ld checks)\n", rank, checks);
    return 0;
  }
};
