// DIR/state.json on disk (drun-rendezvous --state-dir): written whole so that a crash at any
// moment leaves the old file or the new one (a temporary file, fsync, rename over the old one,
// fsync of the directory), read back bounded, and moved aside when it cannot be used.
// Threading: free functions; they block on the disk, so never on the io thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace drun::rdzv::state {

inline constexpr const char* kStateFileName = "state.json";

// Replaces `file` with `text` atomically and durably. Throws drun::Error naming the file and the
// failed step.
void writeStateFile(const std::filesystem::path& file, const std::string& text);

// The file's content; nullopt when there is no such file. Throws InvalidArgument when it is
// larger than maxBytes or not a regular file, drun::Error when it cannot be read (the messages
// do not repeat the file's name).
std::optional<std::string> readStateFile(const std::filesystem::path& file, size_t maxBytes);

// Renames `file` to "<file>.bad-<seconds since the epoch>" and returns that name. Throws
// drun::Error when the rename fails (the message names the new name only).
std::filesystem::path moveAside(const std::filesystem::path& file);

}  // namespace drun::rdzv::state
