// init(): the init methods (env://, tcp://, file://, a caller's store), store hosting on rank 0,
// the workers' store of in-process recovery (DRUN_WORKER_STORE), and the assembly of the world
// communicator.
#include <spdlog/spdlog.h>

#include "communicator_impl.hpp"
#include "drun/common/env.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/log.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/store/tcp_store.hpp"
#include "drun/store/token_file.hpp"
#include "drun/store/file_store.hpp"
#include "store_host.hpp"
#include "transport.hpp"

namespace drun::comm {

namespace {

// Keys of the world in the store, all under kRoot (comm/README.md lists them).
const std::string kRoot = "drun_comm/";
const std::string kWorldMesh = "world/";        // Gloo's full-mesh addresses / NCCL's unique id
const std::string kHostedByRank0 = "hosted_by_rank0";

// The mismatch check (mismatch_check.hpp): InitOptions.checkCollectives, else DRUN_COMM_CHECK
// ("sampled", the default; a true value: every collective; a false one: none), compared every
// DRUN_COMM_CHECK_INTERVAL collectives when sampled.
detail::CheckOptions checkOptions(const InitOptions& o) {
  detail::CheckOptions check;
  check.interval = static_cast<uint64_t>(
      env::parseInt(env::getString("DRUN_COMM_CHECK_INTERVAL"), "DRUN_COMM_CHECK_INTERVAL", 1,
                    static_cast<long long>(detail::MismatchCheck::kMaxInterval)));
  if (o.checkCollectives) {
    check.mode = *o.checkCollectives ? detail::CheckMode::Every : detail::CheckMode::Off;
    return check;
  }
  const std::string mode = env::getString("DRUN_COMM_CHECK");
  if (mode.empty() || mode == "sampled")
    check.mode = detail::CheckMode::Sampled;
  else
    check.mode = env::parseBool(mode, "DRUN_COMM_CHECK (sampled, or a boolean)") ? detail::CheckMode::Every
                                                                                  : detail::CheckMode::Off;
  return check;
}

std::string requiredEnv(const char* name) {
  auto v = env::get(name);
  if (!v || v->empty())
    throw InvalidArgument(std::string("init: ") + name +
                          " is not set (env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; "
                          "start the program with drun)");
  return *v;
}

uint16_t parsePort(const std::string& text, const std::string& what) {
  return static_cast<uint16_t>(env::parseInt(text, what, 1, 65535));
}

struct Resolved {
  int rank;
  int size;
  milliseconds timeout;
};

Resolved resolve(const InitOptions& o) {
  Resolved r;
  r.size = o.worldSize >= 0 ? o.worldSize
                            : static_cast<int>(env::parseInt(requiredEnv("WORLD_SIZE"), "WORLD_SIZE", 1, 1 << 20));
  r.rank = o.rank >= 0 ? o.rank
                       : static_cast<int>(env::parseInt(requiredEnv("RANK"), "RANK", 0, (1 << 20) - 1));
  if (r.size < 1) throw InvalidArgument("init: world size must be >= 1, got " + std::to_string(r.size));
  if (r.rank >= r.size)
    throw InvalidArgument("init: rank " + std::to_string(r.rank) + " is not below the world size " +
                          std::to_string(r.size));
  if (o.timeout < milliseconds(0))
    throw InvalidArgument("init: timeout must be positive, got " + std::to_string(o.timeout.count()) + "ms");
  r.timeout = o.timeout > milliseconds(0) ? o.timeout : env::getDuration("DRUN_COMM_TIMEOUT");
  return r;
}

int resolveDevice(const InitOptions& o) {
  if (o.device >= 0) return o.device;
  auto local = env::get("LOCAL_RANK");
  return local ? static_cast<int>(env::parseInt(*local, "LOCAL_RANK", 0, 1 << 16)) : 0;
}

// Where the world's keys are: a store (drun_comm/ in it; rank 0 may host it), or the workers'
// store of in-process recovery (drun_comm/g<g>/ in it, generation g at least `generation`).
struct WorldStore {
  std::shared_ptr<rdzv::Store> store;
  std::shared_ptr<StoreHost> host;
  std::shared_ptr<detail::Recovery> recovery;
  uint64_t generation = 0;
};

std::shared_ptr<Communicator> makeWorld(WorldStore where, const InitOptions& o, const Resolved& r,
                                        const std::string& masterAddr) {
  detail::BackendConfig config;
  config.rank = r.rank;
  config.size = r.size;
  config.timeout = r.timeout;
  config.socketIfname = o.socketIfname;
  config.masterAddr = masterAddr;
  config.device = o.backend == Backend::Nccl ? resolveDevice(o) : 0;
  Communicator::Impl::Setup setup;
  // The world's transports of one generation, through the store of its keys.
  if (o.backend == Backend::Nccl) {
    setup.connect = [config](std::shared_ptr<rdzv::Store> store, int rank, int size, milliseconds timeout) mutable {
      config.store = std::make_shared<rdzv::PrefixStore>(kWorldMesh, std::move(store));
      config.rank = rank;
      config.size = size;
      config.timeout = timeout;
      return std::shared_ptr<detail::Backend>(detail::makeNcclBackend(config));
    };
  } else {  // shared memory, TCP or both (DRUN_COMM_TRANSPORT)
    setup.plan = std::make_shared<detail::TransportPlan>(config);
    setup.connect = [plan = setup.plan](std::shared_ptr<rdzv::Store> store, int rank, int size, milliseconds timeout) {
      auto mesh = std::make_shared<rdzv::PrefixStore>(kWorldMesh, std::move(store));
      return std::shared_ptr<detail::Backend>(plan->make(mesh, rank, size, timeout));
    };
  }
  std::shared_ptr<rdzv::LivenessStore> worldStore;
  std::shared_ptr<detail::Liveness> liveness;
  int rank = r.rank, size = r.size;  // a replacement's, in a generation a shrink renumbered
  if (where.recovery) {
    auto formed = detail::formNewest(*where.recovery, where.generation, where.generation, setup.connect,
                                     {r.rank, r.size}, r.timeout);
    rank = formed.place.rank;
    size = formed.place.size;
    worldStore = std::move(formed.store);
    liveness = std::move(formed.liveness);
    setup.backend = std::move(formed.backend);
    setup.generation = formed.generation;
    setup.recovery = std::move(where.recovery);
  } else {
    worldStore = std::make_shared<rdzv::PrefixStore>(kRoot, std::move(where.store));
    if (where.host) worldStore->set(kHostedByRank0, "1");
    // Armed before connecting, so that a peer lost during init is named too.
    liveness = std::make_shared<detail::Liveness>(worldStore, r.rank, r.size);
    liveness->arm();
    setup.backend = setup.connect(worldStore, r.rank, r.size, r.timeout);
    // Every rank has connected: if rank 0 hosts the store, its key is there by now.
    liveness->setRank0HostsStore(worldStore->tryGet(kHostedByRank0).has_value());
  }
  setup.kind = o.backend;
  setup.worldStore = worldStore;
  setup.rank = rank;
  setup.size = size;
  for (int i = 0; i < size; ++i) setup.worldRanks.push_back(i);
  setup.timeout = r.timeout;
  setup.liveness = liveness;
  setup.storeHost = std::move(where.host);
  // Fingerprints travel in host memory: the check is Gloo's (NCCL reports its own misuse).
  if (o.backend == Backend::Gloo) setup.check = checkOptions(o);
  spdlog::debug("drun_comm: rank {} of {} connected ({}, {}, generation {})", rank, size,
                toString(o.backend), setup.backend->transport(), setup.generation);
  auto impl = std::make_shared<Communicator::Impl>(std::move(setup));
  if (impl->recovery()) impl->followRecovery();
  return std::make_shared<Communicator>(std::move(impl));
}

// env:// under drun's in-process recovery: the workers' store (DRUN_WORKER_STORE, keys under
// DRUN_WORKER_STORE_PREFIX), which outlives every rank: rank 0 hosts nothing.
std::shared_ptr<Communicator> initOverWorkersStore(const std::string& endpoint, const InitOptions& o,
                                                   const Resolved& r) {
  const HostPort at = HostPort::parse(endpoint, {"DRUN_WORKER_STORE"});
  const std::string prefix = env::getString("DRUN_WORKER_STORE_PREFIX");
  const auto generation = static_cast<uint64_t>(
      env::parseInt(env::getString("DRUN_GENERATION"), "DRUN_GENERATION", 0, 1ll << 62));
  rdzv::TcpStoreOptions so;
  so.token = rdzv::tokenFromEnvironment();
  so.endpoint = at;
  so.timeout = r.timeout;
  auto connect = [so, prefix](milliseconds connectTimeout) mutable -> std::shared_ptr<rdzv::LivenessStore> {
    so.connectTimeout = connectTimeout;
    return std::make_shared<rdzv::PrefixStore>(prefix, std::make_shared<rdzv::TcpStore>(so));
  };
  auto recovery = std::make_shared<detail::Recovery>(connect(r.timeout), connect, r.rank, r.size, r.timeout);
  recovery->start();  // before forming: a generation that begins meanwhile interrupts it
  // Gloo's interface: the route to MASTER_ADDR as without recovery, else to the store's host.
  const std::string masterAddr = env::get("MASTER_ADDR").value_or(at.host);
  return makeWorld({.recovery = std::move(recovery), .generation = generation}, o, r, masterAddr);
}

}  // namespace

std::shared_ptr<Communicator> init(const InitOptions& options) {
  // Before this library starts threads that log (the store server's, the progress watchdog's).
  log::ensureRegistry();
  Resolved r = resolve(options);
  if (options.backend == Backend::Nccl) detail::checkNcclUsable(resolveDevice(options));
  const std::string& m = options.initMethod;
  if (m.rfind("file://", 0) == 0) {
    std::string path = m.substr(7);
    if (path.empty() || path.front() != '/')
      throw InvalidArgument("init: '" + m + "' is not file:///absolute/path");
    return makeWorld({.store = std::make_shared<rdzv::FileStore>(path)}, options, r, "");
  }
  HostPort master;
  if (m == "env://" || m.empty()) {
    if (auto workers = env::get("DRUN_WORKER_STORE"); workers && !workers->empty())
      return initOverWorkersStore(*workers, options, r);
    master.host = requiredEnv("MASTER_ADDR");
    master.port = parsePort(requiredEnv("MASTER_PORT"), "MASTER_PORT");
  } else if (m.rfind("tcp://", 0) == 0) {
    master = HostPort::parse(std::string_view(m).substr(6), {"init: tcp://"});  // host:port, [v6]:port
  } else {
    throw InvalidArgument("init: unknown init method '" + m +
                          "' (expected env://, tcp://host:port or file:///path)");
  }
  // Rank 0 serves the store unless something already does (PyTorch's env:// does the same).
  // DRUN_RDZV_TOKEN_FILE (set by the agent when the job has a token): the store proves it too.
  const std::string token = rdzv::tokenFromEnvironment();
  std::shared_ptr<StoreHost> host = r.rank == 0 ? StoreHost::tryHost(master.port, token) : nullptr;
  rdzv::TcpStoreOptions so;
  so.token = token;
  so.endpoint = master;
  so.connectTimeout = r.timeout;
  so.timeout = r.timeout;
  auto store = std::make_shared<rdzv::TcpStore>(so);
  return makeWorld({.store = std::move(store), .host = std::move(host)}, options, r, master.host);
}

bool ncclBuiltIn() {
#ifdef DRUN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::shared_ptr<Communicator> init(std::shared_ptr<rdzv::Store> store, const InitOptions& options) {
  if (!store) throw InvalidArgument("init: the store is null");
  log::ensureRegistry();  // as above
  Resolved r = resolve(options);
  if (options.backend == Backend::Nccl) detail::checkNcclUsable(resolveDevice(options));
  return makeWorld({.store = std::move(store)}, options, r, options.masterAddr);
}

}  // namespace drun::comm
