#include "log_file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

#include "drun/common/error.hpp"
#include "fd_write.hpp"
#include "log_file_rotation.hpp"

namespace drun::agent::detail {

struct LogFileWriter::File {
  int fd = -1;  // replaced by a rotation, on the writer's thread
  std::string name;
  LogRotation rotation;
  uint64_t size = 0;  // bytes in the current file; the writer's thread only
  bool failed = false;  // guarded by the writer's mutex
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

// `bytes` into `file`, rotating it (rotateLogFile) each time it holds rotation.maxBytes: 0 or the
// errno of the first write or rotation that failed.
int writeRotating(LogFileWriter::File& file, std::string_view bytes) {
  const uint64_t cap = file.rotation.maxBytes;
  while (!bytes.empty()) {
    if (cap && file.size >= cap) {
      if (const int error = rotateLogFile(file.name, file.rotation.maxFiles, file.fd)) return error;
      file.size = 0;
    }
    const size_t n = cap ? static_cast<size_t>(std::min<uint64_t>(bytes.size(), cap - file.size)) : bytes.size();
    if (const int error = writeAll(file.fd, bytes.data(), n)) return error;
    file.size += n;
    bytes.remove_prefix(n);
  }
  return 0;
}

}  // namespace

struct LogFileWriter::State {
  struct Entry {
    std::shared_ptr<File> file;
    std::string bytes;
  };
  struct Waiter {
    const void* owner;
    std::function<void()> resume;
  };
  std::mutex mutex;
  std::condition_variable work;
  std::condition_variable idle;
  std::deque<Entry> queue;
  size_t queuedBytes = 0;  // queued and in flight
  bool writing = false;
  bool stopping = false;
  std::vector<Waiter> waiters;
  std::vector<std::string> failures;

  // The thread: FIFO, one blocking write per entry, no logging.
  static void run(std::shared_ptr<State> self) {
    State& s = *self;
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.work.wait(lock, [&] { return !s.queue.empty() || s.stopping; });
      if (s.queue.empty()) return;
      Entry entry = std::move(s.queue.front());
      s.queue.pop_front();
      s.writing = true;
      const bool skip = entry.file->failed;
      lock.unlock();
      const int error = skip ? 0 : writeRotating(*entry.file, entry.bytes);
      lock.lock();
      s.queuedBytes -= entry.bytes.size();
      if (error) {
        entry.file->failed = true;
        s.failures.push_back(entry.file->name + ": " + std::strerror(error));
      }
      if (s.queuedBytes <= kLowWater && !s.waiters.empty()) {
        auto waiters = std::exchange(s.waiters, {});
        for (auto& w : waiters) w.resume();
      }
      lock.unlock();
      entry = {};  // the last holder of a File closes it: off the loop, without the lock
      lock.lock();
      s.writing = false;
      if (s.queue.empty()) s.idle.notify_all();
    }
  }
};

std::shared_ptr<LogFileWriter> LogFileWriter::standard() {
  static const std::shared_ptr<LogFileWriter> writer = std::make_shared<LogFileWriter>();
  return writer;
}

LogFileWriter::LogFileWriter()
    : state_(std::make_shared<State>()),
      thread_("log file writer", [state = state_] { State::run(state); }) {}

LogFileWriter::~LogFileWriter() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;  // the thread ends once the queue is empty
    state_->waiters.clear();
    state_->work.notify_all();
  }
  thread_.join(kStopBound);
}

std::shared_ptr<LogFileWriter::File> LogFileWriter::open(const std::filesystem::path& path,
                                                         const LogRotation& rotation) {
  auto file = std::make_shared<File>();
  file->name = path.string();
  file->rotation = rotation;
  file->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (file->fd < 0)
    throw Error("cannot create worker log file " + path.string() + ": " + std::strerror(errno));
  return file;
}

void LogFileWriter::write(const std::shared_ptr<File>& file, std::string_view bytes) {
  if (!file || bytes.empty()) return;
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (file->failed) return;
  s.queuedBytes += bytes.size();
  s.queue.push_back({file, std::string(bytes)});
  s.work.notify_one();
}

bool LogFileWriter::congested() const {
  std::lock_guard lock(state_->mutex);
  return state_->queuedBytes >= kHighWater;
}

bool LogFileWriter::whenWritable(const void* owner, std::function<void()> resume) {
  std::lock_guard lock(state_->mutex);
  if (state_->queuedBytes < kHighWater) return false;
  state_->waiters.push_back({owner, std::move(resume)});
  return true;
}

void LogFileWriter::cancel(const void* owner) {
  std::lock_guard lock(state_->mutex);
  std::erase_if(state_->waiters, [&](const State::Waiter& w) { return w.owner == owner; });
}

std::vector<std::string> LogFileWriter::takeFailures() {
  std::lock_guard lock(state_->mutex);
  return std::exchange(state_->failures, {});
}

bool LogFileWriter::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  return state_->idle.wait_for(lock, timeout,
                               [&] { return state_->queue.empty() && !state_->writing; });
}

}  // namespace drun::agent::detail
