// mpi-comm-bench: OpenMPI's MPI_Allreduce (and MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Alltoall) in drun-comm-bench's table, for scripts/bench/comm.sh. Built there with mpicxx
// (libopenmpi-dev), not by CMake: MPI is a reference, not a dependency.
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "bench_table.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int r = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int rc = 0;
  try {
    drun::bench::Args a = drun::bench::parseArgs(argc, argv);
    a.backend = "mpi";
    const bool allReduce = a.op == "all_reduce";
    if (r == 0) drun::bench::printHeader(a, n, "OpenMPI");
    double busbwSum = 0;
    int rows = 0;
    for (size_t bytes = a.minBytes; bytes <= a.maxBytes;
         bytes = std::max(bytes + 1, static_cast<size_t>(bytes * a.factor))) {
      const size_t count = allReduce ? std::max<size_t>(1, bytes / 4) : std::max<size_t>(1, bytes / 4 / n);
      const size_t total = allReduce ? count : count * n;
      std::vector<float> send(total), recv(total);
      const int c = static_cast<int>(count);
      auto runOnce = [&] {
        if (a.op == "all_reduce") MPI_Allreduce(MPI_IN_PLACE, send.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (a.op == "all_gather") MPI_Allgather(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
        else if (a.op == "reduce_scatter") MPI_Reduce_scatter_block(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Alltoall(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
      };
      for (int i = 0; i < a.warmup; ++i) runOnce();
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < a.iters; ++i) runOnce();
      double us = (MPI_Wtime() - t0) * 1e6 / a.iters;
      MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const size_t reported = total * sizeof(float);
      if (r == 0) drun::bench::printRow(a, n, reported, us, 0);
      busbwSum += reported / (us * 1e3) * drun::bench::busFactor(a.op, n);
      ++rows;
    }
    if (r == 0) drun::bench::printFooter(busbwSum, rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi-comm-bench: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
