// Every DRUN_* environment variable drun reads, declared in one place with type, default and doc.
//
// Nothing else in drun calls getenv() for DRUN_* settings: add a variable to kDrunEnvVars in
// env.cpp and read it through the typed accessors here. The accessors validate: a malformed
// value throws InvalidArgument naming the variable. Thread-safe (read-only after start).
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace drun::env {

enum class VarType { String, Int, DurationMs, Bool };

struct VarDoc {
  std::string_view name;
  VarType type;
  std::string_view defaultValue;  // as text; empty = unset
  std::string_view doc;
};

// The registry of DRUN_* variables (docs/options.md lists the same table).
std::span<const VarDoc> drunVariables();

// Raw value of any variable, nullopt when unset. Works for non-DRUN variables too (PET_*, SLURM_*).
std::optional<std::string> get(const char* name);

// Typed reads of registered DRUN_* variables; fall back to the registered default.
std::string getString(std::string_view name);
long long getInt(std::string_view name);
std::chrono::milliseconds getDuration(std::string_view name);
bool getBool(std::string_view name);

// Parse helpers, shared with the CLI: "30", "30s", "500ms", "2m" -> milliseconds; bare numbers are
// seconds (torchrun's convention). Throws InvalidArgument mentioning `what`.
std::chrono::milliseconds parseDuration(std::string_view text, std::string_view what);
long long parseInt(std::string_view text, std::string_view what, long long min, long long max);
bool parseBool(std::string_view text, std::string_view what);

}  // namespace drun::env
