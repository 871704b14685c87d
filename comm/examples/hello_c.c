/* hello_c: the C API. Every rank contributes rank + 1 to an all_reduce and checks the sum.
 * Run: drun --standalone --nproc-per-node 3 build/bin/hello_c */
#include <drun/comm.h>
#include <stdio.h>

int main(void) {
  drun_comm_t* comm = NULL;
  if (drun_comm_init_env("gloo", &comm) != 0) {
    fprintf(stderr, "hello_c: init failed: %s\n", drun_last_error());
    return 1;
  }
  int rank = drun_comm_rank(comm), size = drun_comm_size(comm);
  double value = rank + 1;
  int rc = drun_all_reduce(comm, &value, 1, DRUN_FLOAT64, DRUN_SUM, 10000);
  if (rc != 0) {
    fprintf(stderr, "hello_c: all_reduce failed (%d): %s\n", rc, drun_last_error());
    drun_comm_destroy(comm);
    return 1;
  }
  int expected = size * (size + 1) / 2;
  printf("rank %d of %d: sum %.0f (%s)\n", rank, size, value, value == expected ? "correct" : "WRONG");
  /* A misuse reports a status and a message instead of crashing. */
  rc = drun_send(comm, &value, 1, DRUN_FLOAT64, size + 5, 0, 1000);
  printf("rank %d: send to rank %d -> status %d: %s\n", rank, size + 5, rc, drun_last_error());
  drun_comm_destroy(comm);
  return value == expected && rc == 1 ? 0 : 1;
}
