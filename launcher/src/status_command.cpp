#include "drun/launcher/status_command.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"
#include "drun/common/version.hpp"
#include "drun/launcher/cli.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/job_history.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/tcp_store.hpp"
#include "drun/store/token_file.hpp"

namespace drun::launch {
namespace {

using nlohmann::json;

std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// One line per job: id, state, round, world, nodes, restarts, last root cause.
std::string jobTable(const json& jobs) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %-11s %6s %6s %6s %9s  %s\n", "RUN ID", "STATE", "ROUND",
                "WORLD", "NODES", "RESTARTS", "LAST ROOT CAUSE");
  out += line;
  for (const json& j : jobs) {
    const json& f = j["last_root_cause"];
    std::string cause = f.is_object() ? "rank " + show(f.value("rank", json(-1))) + " on " +
                                            show(f.value("node", json(""))) + ": " +
                                            show(f.value("status", json("")))
                                      : "-";
    std::string restarts = show(j["restarts"]) + "/" +
                           (j["max_restarts"].is_null() ? std::string("?") : show(j["max_restarts"]));
    std::snprintf(line, sizeof line, "%-24s %-11s %6s %6s %6s %9s  %s\n",
                  show(j["run_id"]).c_str(), show(j["state"]).c_str(), show(j["round"]).c_str(),
                  show(j["world_size"]).c_str(), show(j["node_count"]).c_str(), restarts.c_str(),
                  cause.c_str());
    out += line;
  }
  return out;
}

// A job without a history (DRUN_JOB_HISTORY=0): how it ended, from its `outcome`, or "running".
std::string outcomeState(rdzv::Store& store, const std::string& runId) {
  auto outcome = store.tryGet(rdzv::keys::outcome(runId));
  if (!outcome || rdzv::keys::isOutcomeReset(*outcome)) return "running";
  try {
    return rdzv::keys::parseOutcome(*outcome) ? "failed" : "succeeded";
  } catch (const std::exception&) {
    return "unknown";
  }
}

// Every option in the usage line (CLI11's own says only [OPTIONS]).
constexpr const char* kUsage =
    "Usage: drun status --rdzv-endpoint HOST[:PORT] [--rdzv-backend c10d|etcd] [--rdzv-conf K=V,...]\n"
    "                   [--token-file PATH] [--rdzv-id ID [--history]] [--json] [--timeout DURATION]\n";

class StatusFormatter final : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override { return kUsage; }
};

}  // namespace

int runStatus(const std::vector<std::string>& args) {
  CLI::App app{"drun status: the jobs on a rendezvous store and what each is doing", "drun status"};
  app.formatter(std::make_shared<StatusFormatter>());
  app.set_version_flag("--version", std::string("drun ") + kVersion, "print the version and exit");
  std::string endpoint, runId, tokenFile = env::getString("DRUN_RDZV_TOKEN_FILE"), timeout = "5s";
  std::string backend = "c10d", conf;
  bool asJson = false, history = false;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                 "the store: HOST[:PORT] (default port 29400); etcd: the members, H1:P1,H2:P2,...")
      ->required();
  app.add_option("--rdzv-backend,--rdzv_backend", backend, "c10d (drun's store) or etcd (etcd-v3)")
      ->capture_default_str();
  app.add_option("--rdzv-conf,--rdzv_conf", conf, "etcd: etcd_user, etcd_password_file, etcd_cacert, etcd_prefix");
  app.add_option("--rdzv-id,--rdzv_id", runId, "one job: its nodes, round, restarts, root cause, "
                                              "waiting nodes, hung ranks (default: every job)");
  app.add_flag("--json", asJson, "one JSON object for machines");
  app.add_flag("--history", history, "with --rdzv-id: the job's events as stored, one JSON line each");
  app.add_option("--token-file", tokenFile, "the store's shared secret (default DRUN_RDZV_TOKEN_FILE)");
  app.add_option("--timeout", timeout, "deadline of the connect and of each store call")->capture_default_str();
  std::vector<std::string> argv(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "drun status: error: %s\n%s", e.what(), kUsage);
    return 2;  // a usage error, as drun's
  }
  rdzv::TcpStoreOptions o;
  rdzv::RendezvousOptions where;  // etcd: the cluster and its settings
  try {
    const auto parsed = rdzv::parseRendezvousBackend(backend);
    if (!parsed || !rdzv::capabilities(*parsed).sharedStore)
      throw UsageError("--rdzv-backend: '" + backend + "' has no status (use c10d or etcd)");
    where.backend = *parsed;
    if (!runId.empty()) rdzv::keys::validateRunId(runId);
    const auto callTimeout = env::parseDuration(timeout, "--timeout");
    if (where.backend == rdzv::RendezvousBackend::Etcd) {
      where.etcdEndpoints = endpoint;
      parseRendezvousConf(conf, where);
      where.readTimeout = callTimeout;
      if (!tokenFile.empty() && env::getString("DRUN_RDZV_TOKEN_FILE") != tokenFile)
        throw UsageError("--token-file is the c10d store's secret; etcd takes --rdzv-conf "
                         "etcd_user=...,etcd_password_file=...");
    } else {
      if (!conf.empty()) throw UsageError("--rdzv-conf is for --rdzv-backend etcd");
      parseEndpoint(endpoint, where);
      o.endpoint = where.endpoint;
      o.connectTimeout = o.timeout = callTimeout;
      o.leaseTimeout = std::max<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(2));
      o.heartbeatInterval = o.leaseTimeout / 3;
      o.scope = runId;
      if (!tokenFile.empty()) o.token = rdzv::readTokenFile(tokenFile, "--token-file");
      o.tokenHint = "--token-file PATH or DRUN_RDZV_TOKEN_FILE";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "drun status: error: %s\n", e.what());
    return 2;
  }
  const bool etcd = where.backend == rdzv::RendezvousBackend::Etcd;
  const std::string named = etcd ? "etcd " + endpoint : where.endpoint.toString();
  try {
    std::unique_ptr<rdzv::Store> store;
    std::vector<std::string> ids;
    std::string shown;  // the store, for messages
    if (etcd) {
      store = rdzv::openEtcdStatusStore(where);
      if (runId.empty()) ids = rdzv::listEtcdJobs(where);
      shown = named;
    } else {
      auto tcp = std::make_unique<rdzv::TcpStore>(o);
      if (runId.empty() && !history) ids = tcp->listJobs();
      shown = tcp->endpoint();
      store = std::move(tcp);
    }
    if (history) {
      if (runId.empty()) throw InvalidArgument("--history needs --rdzv-id");
      for (const json& event : rdzv::readJobHistory(*store, runId))
        std::fputs((event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n").c_str(), stdout);
      return 0;
    }
    if (!runId.empty()) ids = {runId};
    json jobs = json::array();
    for (const std::string& id : ids) {
      json summary = rdzv::summarizeJob(id, rdzv::readJobHistory(*store, id));
      if (summary["events"] == 0) summary["state"] = outcomeState(*store, id);  // no history kept
      if (summary["events"] == 0 && !store->tryGet(rdzv::keys::currentRound(id))) {
        if (!runId.empty()) {
          std::fprintf(stderr, "drun status: no job '%s' on %s\n", id.c_str(), shown.c_str());
          return 1;
        }
        continue;  // keys of something else under rdzv/
      }
      jobs.push_back(std::move(summary));
    }
    std::string out;
    if (asJson)
      out = (runId.empty() ? json{{"endpoint", shown}, {"jobs", jobs}} : jobs[0]).dump(2) + "\n";
    else if (!runId.empty())
      out = rdzv::describeJob(jobs[0]);
    else
      out = jobs.empty() ? "no jobs on " + shown + "\n" : jobTable(jobs);
    std::fputs(out.c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun status: error: %s: %s\n", named.c_str(), e.what());
    return 1;
  }
}

}  // namespace drun::launch
