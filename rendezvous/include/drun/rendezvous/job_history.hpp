// The job's history in the store (docs/observe.md): the events every agent
// appends (one JSON object each, schema v1) under rdzv/<id>/events/ (keys.hpp: a ring of the last
// keys::kEventSlots), and the one summary of a job built from them that `drun status`, the
// daemon's /api/jobs and its page all show.
//
// Everything read back is untrusted (another client may have written it): events that are not a
// JSON object with a known schema are skipped, fields of the wrong type are ignored; nothing
// throws for bad content.
// Threading: free functions; the Store calls block with the store's deadlines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "drun/store/store.hpp"

namespace drun::rdzv {

inline constexpr int kEventSchemaVersion = 1;
// An event longer than this (a stack excerpt, a failure's detail) is cut before it is stored.
inline constexpr size_t kMaxEventBytes = 4096;

// Appends `events` to the job's history, in order: takes the next sequence numbers at once and
// stores each event with its "seq" at its slot. Two store calls (add, multiSet) however many;
// throws what the store throws.
void appendJobEvents(Store& store, std::string_view runId, std::vector<nlohmann::json> events);
inline void appendJobEvent(Store& store, std::string_view runId, nlohmann::json event) {
  appendJobEvents(store, runId, {std::move(event)});
}

// The last keys::kEventSlots events of the job, oldest first (those whose slot was overwritten
// or not written yet are missing). `skipped` counts slots that did not parse.
std::vector<nlohmann::json> readJobHistory(Store& store, std::string_view runId,
                                           size_t* skipped = nullptr);

// Whether `event` is an object of this schema with a string "event" (what a reader keeps).
bool isJobEvent(const nlohmann::json& event);

// The job as its history tells it:
//   {"run_id", "state": forming|running|recovering|restarting|succeeded|failed|cancelled, "round",
//    "world_size",
//    "node_count", "nodes": [{"node","node_rank","ranks":[first,last]}], "restarts",
//    "max_restarts", "budget_left", "last_root_cause": {...}|null, "waiting": [node...],
//    "hung": [{"rank","node","section","round"}], "rounds": [{"round","ts_ms","world_size",
//    "nodes","failure","restart","lost","taken_in","recoveries"}], "events": n, "last_ts_ms",
//    "recoveries": the current round's [{"generation","lost_ranks","outcome": recovering|formed|
//    "fallback: <reason>","ms"}], "cancelled": [{"node","name","by","round"}]}; "restarts" counts the
//    in-process recoveries begun too. A job is cancelled when a node's job_cancelled (SIGTERM or
//    SIGINT to its drun or to all its workers) is its first end and no later round formed
//    without that node; a cancelled node's loss (its will) is no "lost" mark.
nlohmann::json summarizeJob(std::string_view runId, const std::vector<nlohmann::json>& events);

// One line per field, for `drun status` without --json.
std::string describeJob(const nlohmann::json& summary);

}  // namespace drun::rdzv
