#include <drun/comm.h>
#include <stdio.h>

int main(void) {
  drun_comm_t* comm;
  if (drun_comm_init_env("gloo", &comm)) return fprintf(stderr, "%s\n", drun_last_error()), 1;
  int v = 1;
  if (drun_all_reduce(comm, &v, 1, DRUN_INT32, DRUN_SUM, 0)) return 1;
  printf("user_c rank %d: %d\n", drun_comm_rank(comm), v);
  drun_comm_destroy(comm);
  return 0;
}
