// declareOptions: drun's options (both spellings, PET_* names, value names, help) and --help's
// footer (cli_parts.hpp).
#include <algorithm>
#include <cctype>

#include <CLI/CLI.hpp>

#include "cli_parts.hpp"
#include "drun/common/env.hpp"
#include "drun/common/version.hpp"

namespace drun::launch::cli {
namespace {

// "--nproc-per-node,--nproc_per_node": torchrun accepts both spellings.
std::string spellings(const std::string& dashed) {
  std::string underscored = dashed;
  for (char& c : underscored)
    if (c == '-') c = '_';
  return underscored == dashed ? "--" + dashed : "--" + dashed + ",--" + underscored;
}

// PET_NPROC_PER_NODE for "nproc-per-node", as torchrun's argparse `env` action.
std::string petName(const std::string& dashed) {
  std::string out = "PET_";
  for (char c : dashed) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

}  // namespace

void declareOptions(CLI::App& app, CliText& t) {
  app.prefix_command();  // PROGRAM and everything after it belong to the workers
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", std::string("drun ") + kVersion, "print the version and exit");
  app.get_formatter()->column_width(44);
  // An option given twice: the last one wins, as with torchrun's argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // Every option: both spellings, a value name, PET_<NAME> from the environment.
  auto opt = [&](const std::string& name, std::string& target, const std::string& valueName,
                 const std::string& help) {
    return app.add_option(spellings(name), target, help)->envname(petName(name))->type_name(valueName);
  };
  auto flag = [&](const std::string& names, const std::string& pet, bool& target, const std::string& help) {
    auto* f = app.add_flag(names, target, help);
    if (!pet.empty()) f->envname(pet);
    return f;
  };

  opt("nproc-per-node", t.nproc, "N|auto|cpu|gpu", "workers on this node (default 1)");
  opt("nnodes", t.nnodes, "N|MIN:MAX", "number of nodes, or an elastic range (default 1)");
  flag(spellings("standalone"), "PET_STANDALONE", t.standalone, "single-node job with a private rendezvous and run id");
  opt("max-restarts", t.maxRestarts, "N", "restarts of the whole job before it fails (default 0)");
  opt("monitor-interval", t.monitorInterval, "SECONDS", "accepted for torchrun compatibility; drun reacts to events");
  opt("role", t.role, "NAME", "worker role name, ROLE_NAME (default 'default')");
  opt("recovery", t.recovery, "restart|in-process",
      "a failed worker: restart the job (default), or replace that worker alone while the others "
      "keep running (docs/recovery.md)");
  opt("shutdown-timeout", t.shutdownTimeout, "DURATION", "SIGTERM to SIGKILL grace when stopping workers (default 30s)");
  opt("log-dir", t.logDir, "DIR", "per-rank files under DIR/<run>/node<N>/attempt_<n>/<local_rank>/ (default none)");
  opt("log-max-bytes", t.logMaxBytes, "BYTES",
      "rotate each file under --log-dir at this size (64K, 256M, 1G): FILE.1 is the newest full "
      "one (default 0: never)");
  opt("log-max-files", t.logMaxFiles, "K", "rotated files kept beside each log file (default 5)");
  app.add_option("-r,--redirects", t.redirects, "streams to log files only, for all or per local rank (default 0)")
      ->envname("PET_REDIRECTS")->type_name("0-3|R:0-3,...");
  app.add_option("-t,--tee", t.tee, "streams copied to log files too, for all or per local rank (default 0)")
      ->envname("PET_TEE")->type_name("0-3|R:0-3,...");
  opt("local-ranks-filter", t.localRanksFilter, "R,R,...", "only these local ranks reach the console (default all)");
  app.add_option(spellings("prefix"), t.prefix,
                 "console line prefix, macros ${rank} ${local_rank} ${role_name} ${hostname}; "
                 "'' = none (default '[${rank}]:' with more than one worker)")
      ->envname("PET_PREFIX")->type_name("TEMPLATE");
  flag("-m,--module", "PET_MODULE", t.module, "run PROGRAM as a Python module (python -m)");
  flag(spellings("no-python"), "PET_NO_PYTHON", t.noPython, "exec PROGRAM as given, even a .py file");
  flag(spellings("run-path"), "PET_RUN_PATH", t.runPath, "rejected: drun starts every worker as its own process");
  opt("start-method", t.startMethod, "spawn|fork|forkserver", "accepted for torchrun compatibility");
  opt("rdzv-backend", t.rdzvBackend, "c10d|etcd|static",
      "rendezvous backend (default c10d; static when --nnodes > 1 comes without --rdzv-endpoint, "
      "as torchrun's default)");
  opt("rdzv-endpoint", t.rdzvEndpoint, "HOST[:PORT]", "the rendezvous store (default port 29400)");
  opt("rdzv-id", t.rdzvId, "ID", "job id shared by every node, TORCHELASTIC_RUN_ID (default none)");
  opt("rdzv-conf", t.rdzvConf, "KEY=VALUE,...", "rendezvous settings: see the keys below");
  opt("node-rank", t.nodeRank, "N", "this node's rank (static: required; c10d: honoured when given)");
  opt("master-addr", t.masterAddr, "HOST", "static backend: MASTER_ADDR (default 127.0.0.1)");
  opt("master-port", t.masterPort, "PORT", "static backend: MASTER_PORT (default 29500)");
  opt("local-addr", t.localAddr, "ADDR", "this node's address as the other nodes reach it (default: the route to the endpoint)");
  flag(spellings("no-slurm"), "", t.noSlurm,
       "ignore SLURM_* (by default an srun step fills --nnodes, --node-rank, --rdzv-endpoint, --rdzv-id)");
  flag("-v,--verbose", "", t.verbose, "debug logging (same as DRUN_LOG_LEVEL=debug)");
  app.add_option(spellings("log-level"), t.logLevel, "drun's own log level (default warn; DRUN_LOG_LEVEL)")
      ->type_name("trace|debug|info|warn|error|off");
  app.add_option(spellings("log-format"), t.logFormat,
                 "drun's own log lines: text (timestamped) or json (one object per line; default "
                 "text; DRUN_LOG_FORMAT)")
      ->type_name("text|json");
  // The user's terminal (docs/output.md "The terminal"): ptys for the workers, stdin to a rank.
  // Hangs (docs/hangs.md): off unless given.
  opt("hang-timeout", t.hangTimeout, "SECONDS|NAME=SECONDS,...|auto[,floor=S,warmup=S]",
      "a rank silent that long (drun.worker heartbeats), or in a section past its timeout, is hung: "
      "its stack is taken and the job restarts; auto: learned, at least floor (30 s) after warmup "
      "(60 s of observations) (default off)");
  opt("hang-idle", t.hangIdle, "SECONDS",
      "zero-code: a rank with no CPU time and no output that long, while another rank finished or "
      "idles too, is hung (default off)");
  t.eventsPath = env::getString("DRUN_EVENTS");
  app.add_option("--events", t.eventsPath,
                 "the job's events, one JSON object per line, appended to PATH; - = stdout, when the "
                 "workers' stdout goes to their log files (--redirects 1) "
                 "(docs/observe.md; default DRUN_EVENTS)")
      ->type_name("PATH|-");
  opt("signals-to-handle", t.signalsToHandle, "SIG,SIG,...",
      "signals forwarded to the workers that end the job like SIGTERM, e.g. SIGUSR1 for SLURM's "
      "preemption notice (default SIGTERM,SIGINT,SIGHUP,SIGQUIT, always handled)");
  opt("tty", t.tty, "auto|always|never", "worker stdout/stderr on pseudo-terminals of their own (default auto: where drun's are terminals)");
  // Placement and filtered logs (torchrun 2.9-2.11's flags; docs/options.md, "Placement").
  opt("numa-binding", t.numaBinding, "node|socket|exclusive|core-complex",
      "bind each local rank's CPUs and memory: its NUMA node, its socket, cores of its own, or one "
      "L3 group (default off)");
  flag(spellings("virtual-local-rank"), "PET_VIRTUAL_LOCAL_RANK", t.virtualLocalRank,
       "every worker sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed to its own device");
  opt("duplicate-stdout-filters", t.duplicateStdoutFilters, "SUBSTRING,...",
      "stdout lines of any rank holding one of these also go to filtered_stdout.log in the attempt's "
      "log directory (default none)");
  opt("duplicate-stderr-filters", t.duplicateStderrFilters, "SUBSTRING,...",
      "the same for stderr: filtered_stderr.log (default none)");
  opt("stdin", t.stdinRank, "RANK|none", "the global rank that reads drun's stdin (default 0); none: every worker reads /dev/null");

  std::string footer =
      "\nUsage: drun [OPTIONS] PROGRAM [ARGS...]   or   drun [OPTIONS] -m MODULE [ARGS...]\n"
      "       drun status --rdzv-endpoint HOST[:PORT] [--rdzv-id ID] [--json]   (the jobs on a store)\n"
      "       drun trace DIR   (the ranks' flight records: who never entered which collective)\n"
      "PROGRAM: any executable; a .py file runs under the Python interpreter.\n\n"
      "--rdzv-conf keys (DURATION: 30, 30s, 500ms, 2m; a bare number is seconds):\n" +
      rendezvousConfHelp() +
      "\nEnvironment:\n"
      "  PET_<OPTION>                      any option above, e.g. PET_NPROC_PER_NODE=4 (the command line wins)\n"
      "  PYTHON_EXEC                       the interpreter for .py programs and -m (as torchrun)\n"
      "  TORCHELASTIC_HEALTH_CHECK_PORT    the agent answers GET /healthz on this port while it runs\n";
  for (const env::VarDoc& v : env::drunVariables()) {
    std::string line = "  " + std::string(v.name);
    line.resize(std::max<size_t>(line.size() + 1, 36), ' ');
    footer += line + std::string(v.doc) +
              (v.defaultValue.empty() ? "" : " (default " + std::string(v.defaultValue) + ")") + "\n";
  }
  app.footer(footer);
}

}  // namespace drun::launch::cli
