// StoreHost: the store server rank 0 runs when nothing else serves MASTER_ADDR:MASTER_PORT
// (env:// and tcp://), as torch's TCPStore(is_master=True) does.
//
// Packaging: this is the only unit of libdrun_comm that touches the Asio server; it is compiled
// into its own object and links drun_store_server, while the rest of the library (and users'
// code) sees only the client-side drun_store. The server must be in the process at run time
// (rank 0 serves the job), so it is linked in rather than dlopen'ed: nothing to locate or install
// beside libdrun_comm.so, and the library's exported symbols are only drun::comm's (see
// comm/CMakeLists.txt), so the server's Asio code cannot clash with a user's Asio.
// Threading: the server runs on its own io thread; the destructor stops and joins it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace drun::rdzv {
class StoreServer;
}

namespace drun::comm {

class StoreHost {
 public:
  // Serves on port (all interfaces). Returns null when the port is already served by someone
  // else (drun's agent, another store): the caller then connects as a client like every rank.
  // With a token, every client must prove it (rdzv::StoreServerOptions::token).
  static std::shared_ptr<StoreHost> tryHost(uint16_t port, const std::string& token = "");
  ~StoreHost();

 private:
  explicit StoreHost(std::unique_ptr<rdzv::StoreServer> server);
  std::unique_ptr<rdzv::StoreServer> server_;
};

}  // namespace drun::comm
