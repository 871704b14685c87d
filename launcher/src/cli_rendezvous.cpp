// The rendezvous settings of the command line (cli_parts.hpp): the SLURM step's fill, then the
// backend, the endpoint, --rdzv-conf and the checks between them.
#include <cstring>
#include <map>

#include "cli_parts.hpp"
#include "drun/common/env.hpp"
#include "drun/launcher/slurm_env.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::launch::cli {

// Each option given neither on the command line nor by PET_* takes the step's value
// (launcher/src/slurm_env.cpp).
std::optional<bool> mergeSlurmStep(CliText& t, const Given& given, CliResult& result) {
  if (t.noSlurm || t.standalone) return std::nullopt;
  const EnvMap env = currentEnvironment();
  if (auto warning = slurmOutsideStepWarning(env)) result.warnings.push_back(*warning);
  auto step = detectSlurmStep(env);
  if (!step) return std::nullopt;
  const std::map<std::string, std::string*> targets = {
      {"nnodes", &t.nnodes}, {"node-rank", &t.nodeRank}, {"rdzv-endpoint", &t.rdzvEndpoint}, {"rdzv-id", &t.rdzvId}};
  SlurmFill fill = slurmFill(*step, given);
  for (const auto& [name, value] : fill.options) *targets.at(name) = value;
  result.notes.push_back(fill.describe(*step));
  return fill.isHost;
}

namespace {

// --recovery: the workers' store of an in-process recovery is the agent's own on one node, the
// rendezvous store (c10d) on several: a backend without a store the workers can reach cannot.
void fillRecovery(const CliText& t, agent::AgentConfig& c) {
  const auto mode = agent::parseRecoveryMode(t.recovery);
  if (!mode) throw UsageError("--recovery: expected restart or in-process, got '" + t.recovery + "'");
  c.recovery.mode = *mode;
  const rdzv::RendezvousOptions& r = c.rendezvous;
  const bool oneNode = r.maxNodes == 1 && r.endpoint.host.empty();
  if (c.recovery.inProcess() && !oneNode && r.backend != rdzv::RendezvousBackend::C10d)
    throw UsageError(std::string("--recovery in-process on more than one node needs --rdzv-backend c10d "
                     "(the workers share its store); --rdzv-backend ") + toString(r.backend) +
                     " has no store the workers can use");
  if (c.recovery.timeout <= std::chrono::milliseconds(0))
    throw UsageError("--rdzv-conf recovery_timeout: must be more than 0");
}

}  // namespace

void fillRendezvous(const CliText& t, const Given& given, std::pair<int, int> nodes,
                    std::optional<bool> slurmIsHost, CliResult& result) {
  const auto [minNodes, maxNodes] = nodes;
  rdzv::RendezvousOptions& r = result.config.rendezvous;
  r.minNodes = minNodes;
  r.maxNodes = maxNodes;
  r.localWorldSize = result.config.nprocPerNode;
  const auto backend = rdzv::parseRendezvousBackend(t.rdzvBackend);
  if (!backend)
    throw UsageError("--rdzv-backend: '" + t.rdzvBackend + "' is not supported (use c10d, etcd or static)");
  r.backend = *backend;
  r.runId = t.rdzvId.empty() ? "none" : t.rdzvId;
  usage([&] { rdzv::keys::validateRunId(r.runId); return 0; });  // it names directories too
  std::string endpoint = t.rdzvEndpoint;
  if (t.standalone && !endpoint.empty()) {
    // torchrun warns and ignores it: --standalone means a private rendezvous on this host.
    result.warnings.push_back("--standalone ignores --rdzv-endpoint " + endpoint +
                              " (a standalone job has its own rendezvous)");
    endpoint.clear();
  }
  if (!endpoint.empty() && r.backend == rdzv::RendezvousBackend::Etcd) {
    // A member list: h1:2379,h2:2379,h3:2379 (each checked by the etcd client at the start).
    r.etcdEndpoints = endpoint;
    std::string first = endpoint.substr(0, endpoint.find(','));
    for (const char* scheme : {"http://", "https://"})  // etcdctl's spelling, as the client takes it
      if (first.starts_with(scheme)) first.erase(0, std::strlen(scheme));
    parseEndpoint(first, r);
  } else if (!endpoint.empty()) {
    parseEndpoint(endpoint, r);
  }
  parseRendezvousConf(t.rdzvConf, r, &result.config.recovery);
  if (!r.isHost) r.isHost = slurmIsHost;  // SLURM hook: the step's first node hosts the store
  // SLURM replaces nothing inside a running step (a requeue starts a new one): survivors that
  // waited for a replacement would wait for nobody.
  if (slurmIsHost && r.replaceTimeout < std::chrono::milliseconds(0))
    r.replaceTimeout = std::chrono::milliseconds(0);
  if (!t.nodeRank.empty()) {
    // A copy: clang 14 (the fuzz build's compiler) cannot capture a structured binding.
    const int lastRank = maxNodes - 1;
    r.nodeRank = static_cast<int>(usage([&] { return env::parseInt(t.nodeRank, "--node-rank", 0, lastRank); }));
  }
  r.masterAddr = t.masterAddr;
  if (!t.masterPort.empty())
    r.masterPort = static_cast<uint16_t>(usage([&] { return env::parseInt(t.masterPort, "--master-port", 1, 65535); }));
  r.localAddr = t.localAddr;
  if (t.standalone) {
    if (maxNodes > 1) throw UsageError("--standalone runs a single node; it conflicts with --nnodes " + t.nnodes);
    if (r.runId == "none") r.runId = randomRunId();
  }
  // torchrun's default backend is static: its classic multi-node line (--nnodes, --node-rank,
  // --master-addr, --master-port, no endpoint) means a static job. drun's default stays c10d
  // whenever there is an endpoint to meet at.
  if (!given("rdzv-backend") && maxNodes > 1 && r.endpoint.host.empty()) r.backend = rdzv::RendezvousBackend::Static;
  if (r.backend == rdzv::RendezvousBackend::C10d && (given("master-addr") || given("master-port")) && maxNodes > 1)
    result.warnings.push_back("--master-addr/--master-port are for the static backend; the c10d "
                              "rendezvous picks MASTER_ADDR/MASTER_PORT itself");
  if (r.backend == rdzv::RendezvousBackend::Etcd && r.etcdEndpoints.empty())
    throw UsageError("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] (the etcd members)");
  const std::string backendName = toString(r.backend);
  const rdzv::BackendCapabilities can = rdzv::capabilities(r.backend);
  if (maxNodes > 1 && can.needsEndpoint && r.endpoint.host.empty())
    throw UsageError("--nnodes " + t.nnodes + " with --rdzv-backend " + backendName +
                     " needs --rdzv-endpoint HOST[:PORT] (the node hosting the rendezvous)");
  if (!can.elastic && minNodes != maxNodes)
    throw UsageError("--rdzv-backend " + backendName + " needs a fixed --nnodes, got " + t.nnodes +
                     (given("nnodes") && !given("rdzv-backend")
                          ? " (an elastic range needs --rdzv-endpoint HOST[:PORT])"
                          : ""));
  fillRecovery(t, result.config);
  if (r.backend == rdzv::RendezvousBackend::Static && maxNodes > 1 && !r.nodeRank)
    throw UsageError("--nnodes " + t.nnodes + " with the static rendezvous needs --node-rank "
                     "(or give --rdzv-endpoint HOST[:PORT] for the c10d rendezvous)");
}

}  // namespace drun::launch::cli
