// The fields of the agent's events (docs/observe.md, one table per event): pure
// functions from what the agent knows to JSON, so that the agent's state machine only says
// when an event happens.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "hang_monitor.hpp"

namespace drun::agent::detail {

// The root-cause record: rank, local_rank, node, exit_code, signal, signal_name, status, pid,
// time_ms, detail_source, detail, other_failures, final.
nlohmann::json failureJson(const rdzv::FailureRecord& failure);
// round_formed: round, node_rank, node_count, world_size, ranks [first, last], master_addr,
// master_port, restart_count, max_restarts, hosts (the first 64).
nlohmann::json roundFormedFields(const rdzv::RoundResult& round, int localWorkers, int maxRestarts);
// worker_exited: round, rank, local_rank, pid, code (null when signalled), signal, signal_name,
// after_stop.
nlohmann::json workerExitFields(const WorkerExit& exit, uint64_t round);
// hang_detected: round, rank, local_rank, rule, section, what, stack_how, stack (an excerpt).
nlohmann::json hangFields(const HangReport& hang, int rank, uint64_t round);
// Names in `now` that are not in `before` (a replacement's new nodes, or with the arguments
// swapped, the lost ones).
std::vector<std::string> namesNotIn(const std::vector<std::string>& now,
                                    const std::vector<std::string>& before);

}  // namespace drun::agent::detail
