// The NCCL backend's entry points in a build without NCCL (DRUN_HAVE_NCCL off).
#include "../backend.hpp"

namespace drun::comm::detail {

void checkNcclUsable(int) {
  throw InvalidArgument("backend nccl: NCCL was not built into this libdrun_comm (nccl.h and "
                        "libnccl were not found at configure time); use backend gloo");
}

std::unique_ptr<Backend> makeNcclBackend(const BackendConfig& config) {
  checkNcclUsable(config.device);
  return nullptr;
}

}  // namespace drun::comm::detail
