// makeEtcdRendezvous(options): the c10d rendezvous (round logic, planner, ledger unchanged) on an
// EtcdStore: the store lives in an etcd cluster instead of on one agent's host.
#include <sys/stat.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/network.hpp"
#include "drun/store/store_server.hpp"

namespace drun::rdzv {
namespace {

// The password file: its first line. Like a token file, readable by its owner only.
std::string readPasswordFile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw InvalidArgument("--rdzv-conf etcd_password_file: cannot read '" + path + "'");
  if (info.st_mode & (S_IRWXG | S_IRWXO))
    throw InvalidArgument("--rdzv-conf etcd_password_file: '" + path +
                          "' may be read by its group or others; chmod 600 it");
  std::ifstream in(path);
  std::string password;
  if (!in || !std::getline(in, password) || password.empty() || password.size() > 4096)
    throw InvalidArgument("--rdzv-conf etcd_password_file: '" + path + "' holds no password line");
  return password;
}

// The session every store of this agent shares: a lost one (its lease ended) is replaced by a
// new one (a new lease: the agent comes back as a new client, as over TCP). Each session's lease
// revoke is this process's death notice: a job guard sends it if the agent dies.
class SessionHolder {
 public:
  explicit SessionHolder(EtcdStoreOptions options) : options_(std::move(options)) {}
  ~SessionHolder() { publishDeathNotice(std::nullopt); }
  std::shared_ptr<EtcdSession> current() {
    std::lock_guard lock(mutex_);
    const std::shared_ptr<EtcdSession> before = session_;
    if (!session_)
      session_ = openEtcdSession(options_);
    else if (etcdSessionLost(*session_))
      session_ = replaceLostEtcdSession(options_, *session_);
    if (session_ != before) publishDeathNotice(etcdLeaseRevokeNotice(*session_));
    return session_;
  }
  void setConnectTimeout(milliseconds timeout) {
    std::lock_guard lock(mutex_);
    options_.connectTimeout = timeout;
  }

 private:
  std::mutex mutex_;
  EtcdStoreOptions options_;
  std::shared_ptr<EtcdSession> session_;
};

EtcdStoreOptions etcdStoreOptions(const RendezvousOptions& options) {
  EtcdStoreOptions store;
  store.client.endpoints =
      parseEtcdEndpoints(options.etcdEndpoints.empty() ? bracketedHost(options.endpoint.host)
                                                    : options.etcdEndpoints);
  store.client.callTimeout = options.readTimeout;
  store.client.user = options.etcdUser;
  if (!options.etcdUser.empty()) {
    if (options.etcdPasswordFile.empty())
      throw InvalidArgument("--rdzv-conf etcd_user needs etcd_password_file=PATH");
    store.client.password = readPasswordFile(options.etcdPasswordFile);
  }
  if (!options.etcdCaFile.empty()) {
    struct stat info {};
    if (::stat(options.etcdCaFile.c_str(), &info) != 0)
      throw InvalidArgument("--rdzv-conf etcd_cacert: cannot read '" + options.etcdCaFile + "'");
    store.client.caFile = options.etcdCaFile;
  }
  store.prefix = options.etcdPrefix;
  store.scope = options.runId;
  store.leaseTtl = options.heartbeatTimeout;
  store.jobLeaseTtl = options.etcdHistoryTtl;  // a job whose agents all died: its keys end too
  return store;
}

}  // namespace

std::unique_ptr<LivenessStore> openEtcdStatusStore(const RendezvousOptions& options) {
  EtcdStoreOptions storeOptions = etcdStoreOptions(options);
  storeOptions.scope = "status";
  storeOptions.readOnly = true;  // no lease, no will: reading needs no writable quorum
  storeOptions.connectTimeout = options.readTimeout;
  return std::make_unique<EtcdStore>(openEtcdSession(storeOptions));
}

std::vector<std::string> listEtcdJobs(const RendezvousOptions& options) {
  EtcdStoreOptions storeOptions = etcdStoreOptions(options);
  storeOptions.client.readsFromAnyMember = true;  // as openEtcdStatusStore's reads
  EtcdClient client(storeOptions.client);
  const std::string root = storeOptions.prefix + "kv/rdzv/";  // keys::job(id) = "rdzv/<id>/"
  std::vector<std::string> ids;
  for (const EtcdKeyValue& kv : client.range(root, EtcdClient::prefixEnd(root)).kvs) {
    const std::string rest = kv.key.substr(root.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos || rest.compare(slash, std::string::npos, "/round") != 0) continue;
    const std::string id = rest.substr(0, slash);
    try {
      keys::validateRunId(id);
      ids.push_back(id);
    } catch (const InvalidArgument&) {
      // a key some other program wrote under the prefix: no job
    }
  }
  return ids;
}

std::unique_ptr<Rendezvous> makeEtcdRendezvous(const RendezvousOptions& options) {
  keys::validateRunId(options.runId);
  EtcdStoreOptions storeOptions = etcdStoreOptions(options);
  storeOptions.connectTimeout = std::min<milliseconds>(options.joinTimeout, 60s);
  auto holder = std::make_shared<SessionHolder>(storeOptions);

  C10dStoreAccess access;
  access.store = std::make_unique<EtcdStore>(holder->current());
  // Later sessions (after a lost lease): etcd unreachable for half a heartbeat timeout is gone.
  holder->setConnectTimeout(std::min(options.heartbeatTimeout / 2, options.joinTimeout));
  access.connectWatcher = [holder] { return std::make_unique<EtcdStore>(holder->current()); };
  std::string list;
  for (const std::string& e : storeOptions.client.endpoints) list += (list.empty() ? "" : ",") + e;
  access.endpoint = "etcd " + list;
  if (!options.localAddr.empty()) {
    access.selfAddress = options.localAddr;
  } else {
    // parseEtcdEndpoints wrote each member as HOST:PORT or [V6]:PORT.
    const HostPort first = HostPort::parse(storeOptions.client.endpoints.front(), {"etcd endpoint"});
    access.selfAddress = routeSourceAddress(first.host, first.port);
  }
  spdlog::info("rendezvous '{}': on etcd {} (lease TTL {} ms)", options.runId, list,
               etcdSessionTtl(*holder->current()).count());
  return makeC10dRendezvous(options, std::move(access));
}

}  // namespace drun::rdzv
