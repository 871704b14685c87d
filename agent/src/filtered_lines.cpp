#include "filtered_lines.hpp"

namespace drun::agent::detail {

void FilteredLines::addTarget(const std::vector<std::string>& substrings,
                              std::shared_ptr<LogFileWriter::File> file) {
  if (!substrings.empty() && file) targets_.push_back({substrings, std::move(file)});
}

void FilteredLines::addTargets(const FilteredLines& other) {
  targets_.insert(targets_.end(), other.targets_.begin(), other.targets_.end());
}

void FilteredLines::consume(std::string_view bytes, std::string_view prefix, LogFileWriter& writer) {
  if (targets_.empty()) return;
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const size_t room = kMaxLineBytes - partial_.size();
    if (newline == std::string_view::npos || newline > room) {
      const size_t take = std::min(bytes.size(), room);
      partial_.append(bytes.substr(0, take));
      bytes.remove_prefix(take);
      if (partial_.size() < kMaxLineBytes) return;
    } else {
      partial_.append(bytes.substr(0, newline));
      bytes.remove_prefix(newline + 1);
    }
    judge(partial_, prefix, writer);  // a whole line, or a piece of a longer one
    partial_.clear();
  }
}

void FilteredLines::finish(std::string_view prefix, LogFileWriter& writer) {
  if (!partial_.empty()) judge(partial_, prefix, writer);
  partial_.clear();
}

void FilteredLines::judge(std::string_view line, std::string_view prefix, LogFileWriter& writer) const {
  for (const Target& target : targets_)
    for (const std::string& substring : target.substrings)
      if (line.find(substring) != std::string_view::npos) {
        std::string out;
        out.reserve(prefix.size() + line.size() + 1);
        out.append(prefix).append(line).push_back('\n');
        writer.write(target.file, out);
        break;
      }
}

}  // namespace drun::agent::detail
