#include "transport.hpp"

#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <spdlog/spdlog.h>

#include "drun/common/env.hpp"
#include "drun/store/prefix_store.hpp"
#include "hier/hier_backend.hpp"
#include "shm/shm_backend.hpp"

namespace drun::comm::detail {
namespace {

std::string hostKey(int rank) { return "host/" + std::to_string(rank); }

}  // namespace

Transport parseTransport(const std::string& text) {
  if (text == "auto" || text.empty()) return Transport::Auto;
  if (text == "shm") return Transport::Shm;
  if (text == "tcp") return Transport::Tcp;
  throw InvalidArgument("DRUN_COMM_TRANSPORT: expected shm, tcp or auto, got '" + text + "'");
}

std::string hostIdentity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  // The network namespace tells hosts apart (a namespace "host" has its own address); the pid
  // namespace is added because the segment is taken by pid (pidfd_getfd, process_vm_readv).
  auto inode = [](const char* path) {
    struct stat ns{};
    return stat(path, &ns) == 0 ? std::to_string(ns.st_ino) : std::string("?");
  };
  const std::string net = inode("/proc/self/ns/net") + "/" + inode("/proc/self/ns/pid");
  char host[256] = {};
  if (boot.empty()) {  // no boot id: the host name is the next best thing
    gethostname(host, sizeof(host) - 1);
    boot = host;
  }
  return boot + "/" + net;
}

TransportPlan::TransportPlan(BackendConfig base)
    : base_(std::move(base)), transport_(parseTransport(env::getString("DRUN_COMM_TRANSPORT"))) {
  shm_.slotBytes = static_cast<size_t>(env::parseInt(env::getString("DRUN_COMM_SHM_BYTES"),
                                                     "DRUN_COMM_SHM_BYTES", 64 << 10, 1ll << 32));
  shm_.singleCopy = env::getBool("DRUN_COMM_SHM_SINGLE_COPY");
  shm_.unexpectedBytes = static_cast<size_t>(env::parseInt(
      env::getString("DRUN_COMM_SHM_UNEXPECTED_BYTES"), "DRUN_COMM_SHM_UNEXPECTED_BYTES", 0, 1ll << 40));
  shm_.busyWait = env::getDuration("DRUN_COMM_SHM_SPIN");
}

std::shared_ptr<GlooDevice> TransportPlan::device() {
  std::lock_guard lock(mutex_);
  if (!device_) device_ = makeGlooDevice(base_);
  return device_;
}

std::unique_ptr<Backend> TransportPlan::make(std::shared_ptr<rdzv::Store> store, int rank, int size,
                                             milliseconds timeout) {
  if (transport_ == Transport::Tcp) return makeGlooBackend(device(), store, rank, size, timeout);
  // Where every rank runs: the same identity = the same kernel and network namespace.
  store->set(hostKey(rank), hostIdentity());
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(hostKey(r));
  std::vector<rdzv::Bytes> hosts = store->multiGet(keys, timeout);
  const bool oneHost = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h == hosts[0]; });
  ShmOptions shm = shm_;
  // Scatter and all_to_all put n blocks into one half: keep a block at least 512 bytes.
  shm.slotBytes = std::max(shm.slotBytes, static_cast<size_t>(size) * 1024);
  std::vector<std::string> ids(hosts.begin(), hosts.end());
  std::sort(ids.begin(), ids.end());
  const bool allAlone = std::adjacent_find(ids.begin(), ids.end()) == ids.end();
  if (size > 1 && allAlone) return makeGlooBackend(device(), store, rank, size, timeout);  // nothing to share
  if (!oneHost) {
    ids.assign(hosts.begin(), hosts.end());
    auto shared = std::make_shared<rdzv::PrefixStore>("hier/", store);
    return makeHierarchicalBackend(shared, rank, ids, timeout, shm, device());
  }
  try {
    return makeShmBackend(*store, rank, size, timeout, shm);
  } catch (const CommError& e) {
    if (transport_ == Transport::Shm) throw;
    // Every rank saw the same attach results: every rank falls back.
    spdlog::warn("drun_comm: shared memory unusable, using TCP: {}", e.what());
    return makeGlooBackend(device(), store, rank, size, timeout);
  }
}

}  // namespace drun::comm::detail
