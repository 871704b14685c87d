// The EventLog's sinks: --events' file or stdout (`-`), and the job's history in the store.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/job_history.hpp"
#include "event_log.hpp"
#include "event_queue.hpp"

namespace drun::agent::detail {
namespace {

using nlohmann::json;

std::string lineOf(const json& event) {
  return event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

class ConsoleEventSink final : public EventSink {
 public:
  explicit ConsoleEventSink(std::shared_ptr<ConsoleWriter> console) : console_(std::move(console)) {}
  void write(const json& event) override { console_->write(ConsoleStream::Out, lineOf(event)); }
  bool flush(std::chrono::milliseconds) override { return true; }  // drained at exit

 private:
  std::shared_ptr<ConsoleWriter> console_;
};

// A file written on the queue's thread (a stalled disk stalls only it).
class FileEventSink final : public EventSink {
 public:
  explicit FileEventSink(const std::string& path)
      : file_(std::fopen(path.c_str(), "a"), [](std::FILE* f) {
          if (f) std::fclose(f);
        }) {
    if (!file_)
      throw InvalidArgument("--events " + path + ": cannot open it: " + std::strerror(errno));
    queue_ = std::make_unique<EventQueue>([file = file_](const std::vector<std::string>& lines) {
      for (const std::string& line : lines) std::fwrite(line.data(), 1, line.size(), file.get());
      std::fflush(file.get());
    });
  }
  void write(const json& event) override { queue_->push(lineOf(event)); }
  bool flush(std::chrono::milliseconds deadline) override { return queue_->flush(deadline); }

 private:
  std::shared_ptr<std::FILE> file_;
  std::unique_ptr<EventQueue> queue_;
};

class StoreEventSink final : public EventSink {
 public:
  StoreEventSink(std::function<std::unique_ptr<rdzv::LivenessStore>()> connect, std::string runId) {
    struct Writer {
      std::function<std::unique_ptr<rdzv::LivenessStore>()> connect;
      std::string runId;
      std::unique_ptr<rdzv::LivenessStore> store;
    };
    auto writer = std::make_shared<Writer>(Writer{std::move(connect), std::move(runId), nullptr});
    queue_ = std::make_unique<EventQueue>([writer](const std::vector<std::string>& lines) {
      try {
        if (!writer->store) writer->store = writer->connect();
        if (!writer->store) return;
        std::vector<json> events;
        for (const std::string& line : lines) events.push_back(json::parse(line));
        rdzv::appendJobEvents(*writer->store, writer->runId, std::move(events));
      } catch (const std::exception& e) {
        spdlog::debug("agent: the job's history in the store: {}", e.what());
        writer->store.reset();  // connect again for the next event
        throw;
      }
    });
  }
  void write(const json& event) override { queue_->push(event.dump(-1, ' ', false, json::error_handler_t::replace)); }
  bool flush(std::chrono::milliseconds deadline) override { return queue_->flush(deadline); }

 private:
  std::unique_ptr<EventQueue> queue_;
};

}  // namespace

std::unique_ptr<EventSink> makeFileEventSink(const std::string& path,
                                             std::shared_ptr<ConsoleWriter> console) {
  if (path == "-") return std::make_unique<ConsoleEventSink>(std::move(console));
  return std::make_unique<FileEventSink>(path);
}

std::unique_ptr<EventSink> makeStoreEventSink(
    std::function<std::unique_ptr<rdzv::LivenessStore>()> connect, std::string runId) {
  return std::make_unique<StoreEventSink>(std::move(connect), std::move(runId));
}

}  // namespace drun::agent::detail
