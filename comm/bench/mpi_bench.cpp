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
    if (r == 0) drun::bench::printHeader(a, n, "OpenMPI");
    drun::bench::sweep(a, n, r == 0, [&](size_t count, size_t total) {
      std::vector<float> send(total), recv(total);
      const int c = static_cast<int>(count);
      auto runOnce = [&] {
        if (a.op == "all_reduce") MPI_Allreduce(MPI_IN_PLACE, send.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (a.op == "reduce") MPI_Reduce(r == 0 ? MPI_IN_PLACE : send.data(), send.data(), c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        else if (a.op == "broadcast") MPI_Bcast(send.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD);
        else if (a.op == "all_gather") MPI_Allgather(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
        else if (a.op == "reduce_scatter") MPI_Reduce_scatter_block(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Alltoall(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT, MPI_COMM_WORLD);
      };
      double us = drun::bench::timeIt(a, runOnce, [] { MPI_Barrier(MPI_COMM_WORLD); }, [](double v) {
        MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return v;
      });
      return std::pair{us, 0L};
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi-comm-bench: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
