// FilteredLines: --duplicate-stdout-filters / --duplicate-stderr-filters for one worker stream.
// Its whole lines (cut at '\n', as torchrun's tail reads them) that hold one of a target's
// substrings are queued, "<prefix><line>\n", to that target's file: the attempt's
// filtered_stdout.log or filtered_stderr.log, which every rank's stream shares. A line longer than
// kMaxLineBytes is judged in pieces of that size.
//
// Threading: the OutputMux's loop. Ownership: shares the files with the other streams; the
// LogFileWriter writes them off the loop.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "log_file_writer.hpp"

namespace drun::agent::detail {

class FilteredLines {
 public:
  static constexpr size_t kMaxLineBytes = 1 << 20;

  // Lines holding one of `substrings` (none empty) go to `file`.
  void addTarget(const std::vector<std::string>& substrings, std::shared_ptr<LogFileWriter::File> file);
  // `other`'s targets too (a worker whose stdout and stderr share one pipe).
  void addTargets(const FilteredLines& other);
  bool active() const { return !targets_.empty(); }

  void consume(std::string_view bytes, std::string_view prefix, LogFileWriter& writer);
  // The stream ended: its last line, which had no '\n', is judged too.
  void finish(std::string_view prefix, LogFileWriter& writer);

 private:
  struct Target {
    std::vector<std::string> substrings;
    std::shared_ptr<LogFileWriter::File> file;
  };
  void judge(std::string_view line, std::string_view prefix, LogFileWriter& writer) const;

  std::vector<Target> targets_;
  std::string partial_;  // the line being assembled
};

}  // namespace drun::agent::detail
