#include "drun/agent/console_writer.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "drun/common/owned_thread.hpp"
#include "fd_write.hpp"

namespace drun::agent {

namespace {

// One write(2) carries at most this much (consecutive entries of one stream are joined).
constexpr size_t kMaxBatchBytes = 256 * 1024;

bool sameFile(int a, int b) {
  if (a == b) return true;
  struct stat sa, sb;
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

struct ConsoleWriter::Lane {
  struct Entry {
    ConsoleStream stream;
    std::string bytes;
  };
  struct Waiter {
    const void* owner;
    std::function<void()> resume;
  };
  enum class Open { No, MidLine, AfterReturn };  // how the last bytes of `openSource` ended

  int fds[2] = {-1, -1};  // by ConsoleStream
  size_t highWater = 0;
  size_t lowWater = 0;

  std::mutex mutex;
  std::condition_variable work;  // the thread waits for entries (or stopping)
  std::condition_variable idle;  // drain() waits for an empty lane (or a dropped one)
  std::deque<Entry> queue;
  size_t queuedBytes = 0;    // in `queue`
  size_t inFlightBytes = 0;  // taken by the thread, in write(2)
  bool dropped = false;
  bool broken = false;  // a write failed: the reader went away
  bool stopping = false;
  std::vector<Waiter> waiters;
  std::vector<Waiter> brokenWaiters;
  // The open line (partial-line rules, see the header), in queue order.
  const LineSource* openSource = nullptr;
  Open open = Open::No;
  std::vector<const LineSource*> interrupted;  // their mid-line was ended by somebody else
  OwnedThread thread;

  bool congestedLocked() const { return !dropped && queuedBytes + inFlightBytes > highWater; }
  bool emptyLocked() const { return queue.empty() && inFlightBytes == 0; }

  void wakeWaitersLocked() {
    auto ready = std::move(waiters);
    waiters.clear();
    for (auto& w : ready) w.resume();
  }

  void dropLocked(bool writeFailed) {
    dropped = true;
    queue.clear();
    queuedBytes = 0;
    wakeWaitersLocked();
    if (writeFailed) {
      broken = true;
      auto ready = std::move(brokenWaiters);
      brokenWaiters.clear();
      for (auto& w : ready) w.resume();
    }
    idle.notify_all();
  }

  // Applies the partial-line rules to `bytes` about to be queued by `source` (nullptr: whole
  // lines from a writer without a name).
  void placeLocked(std::string& bytes, const LineSource* source) {
    if (source) {
      auto it = std::find(interrupted.begin(), interrupted.end(), source);
      if (it != interrupted.end()) {
        interrupted.erase(it);
        // The rest of a line that somebody else ended: a line end now ends nothing, text gets
        // the prefix again.
        if (!bytes.empty() && (bytes.front() == '\n' || bytes.front() == '\r')) bytes.erase(0, 1);
        else if (!bytes.empty()) bytes.insert(0, source->prefix);
      }
    }
    if (bytes.empty()) return;
    if (openSource && openSource != source) {
      bytes.insert(0, 1, '\n');  // end the other source's line: lines never glue together
      if (open == Open::MidLine) interrupted.push_back(openSource);
      openSource = nullptr;
      open = Open::No;
    }
    if (source) {
      openSource = bytes.back() == '\n' ? nullptr : source;
      open = bytes.back() == '\n'   ? Open::No
             : bytes.back() == '\r' ? Open::AfterReturn
                                    : Open::MidLine;
    }
  }

  void queueLocked(ConsoleStream stream, std::string bytes) {
    if (bytes.empty()) return;
    queuedBytes += bytes.size();
    queue.push_back({stream, std::move(bytes)});
    work.notify_one();
  }

  // The lane's thread: FIFO order, one blocking write(2) per batch, nothing else (no logging: an
  // abandoned lane may still be in here while the process runs its static destructors).
  static void run(std::shared_ptr<Lane> self) {
    Lane& l = *self;
    std::unique_lock lock(l.mutex);
    for (;;) {
      l.work.wait(lock, [&] { return !l.queue.empty() || l.stopping; });
      if (l.queue.empty()) return;  // stopping with nothing left
      ConsoleStream stream = l.queue.front().stream;
      std::string batch = std::move(l.queue.front().bytes);
      l.queue.pop_front();
      while (!l.queue.empty() && l.queue.front().stream == stream &&
             batch.size() + l.queue.front().bytes.size() <= kMaxBatchBytes) {
        batch += l.queue.front().bytes;
        l.queue.pop_front();
      }
      l.queuedBytes -= batch.size();
      l.inFlightBytes = batch.size();
      lock.unlock();
      int error = detail::writeAll(l.fds[static_cast<int>(stream)], batch.data(), batch.size());
      lock.lock();
      l.inFlightBytes = 0;
      if (error != 0 && !l.dropped) l.dropLocked(true);  // EPIPE: nobody reads; or worse
      if (!l.congestedLocked() && l.queuedBytes <= l.lowWater) l.wakeWaitersLocked();
      if (l.emptyLocked()) l.idle.notify_all();
    }
  }
};

ConsoleWriter::ConsoleWriter(ConsoleWriterOptions options) : options_(options) {
  // A closed console pipe must cost drun its console, not its life (workers get SIG_DFL back).
  ::signal(SIGPIPE, SIG_IGN);
  auto makeLane = [&] {
    auto lane = std::make_shared<Lane>();
    lane->fds[0] = options_.stdoutFd;
    lane->fds[1] = options_.stderrFd;
    lane->highWater = options_.highWaterBytes;
    lane->lowWater = std::min(options_.lowWaterBytes, options_.highWaterBytes);
    // The thread takes no signal: they are the event loop's (and a write(2) is not interrupted).
    lane->thread = OwnedThread("console writer", [lane] { Lane::run(lane); });
    return lane;
  };
  lanes_[0] = makeLane();
  lanes_[1] = sameFile(options_.stdoutFd, options_.stderrFd) ? lanes_[0] : makeLane();
}

ConsoleWriter::~ConsoleWriter() {
  drain(options_.drainOnDestroy);
  for (int i = 0; i < 2; ++i) {
    if (i == 1 && lanes_[1] == lanes_[0]) break;
    Lane& l = *lanes_[i];
    bool stuck;
    {
      std::lock_guard lock(l.mutex);
      l.stopping = true;
      l.waiters.clear();
      l.brokenWaiters.clear();
      stuck = l.inFlightBytes > 0;  // abandoned by drain() inside a write(2) nobody reads
      l.work.notify_all();
    }
    // Nothing in flight, nothing queued: it returns at once. One abandoned by drain() inside a
    // write(2) nobody reads is left (it holds its Lane; it ends with the write, or the process).
    l.thread.join(stuck ? std::chrono::milliseconds(0) : OwnedThread::kDefaultJoinBound);
  }
}

std::shared_ptr<ConsoleWriter> ConsoleWriter::standard() {
  static const std::shared_ptr<ConsoleWriter> writer = std::make_shared<ConsoleWriter>();
  return writer;
}

ConsoleWriter::Lane& ConsoleWriter::lane(ConsoleStream stream) const {
  return *lanes_[static_cast<int>(stream)];
}

bool ConsoleWriter::write(ConsoleStream stream, std::string bytes, const LineSource* source) {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  if (l.dropped) return false;
  if (bytes.empty()) return true;
  l.placeLocked(bytes, source);
  l.queueLocked(stream, std::move(bytes));
  return true;
}

void ConsoleWriter::endLine(ConsoleStream stream, const LineSource* source) {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  std::erase(l.interrupted, source);
  if (l.openSource != source) return;
  l.openSource = nullptr;
  l.open = Lane::Open::No;
  if (!l.dropped) l.queueLocked(stream, "\n");
}

bool ConsoleWriter::congested(ConsoleStream stream) const {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  return l.congestedLocked();
}

bool ConsoleWriter::whenWritable(ConsoleStream stream, const void* owner,
                                 std::function<void()> resume) {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  if (!l.congestedLocked()) return false;
  l.waiters.push_back({owner, std::move(resume)});
  return true;
}

void ConsoleWriter::lineEndedOutside() {
  for (int i = 0; i < 2; ++i) {
    if (i == 1 && lanes_[1] == lanes_[0]) break;
    Lane& l = *lanes_[i];
    std::lock_guard lock(l.mutex);
    if (l.openSource && l.open == Lane::Open::MidLine) l.interrupted.push_back(l.openSource);
    l.openSource = nullptr;
    l.open = Lane::Open::No;
  }
}

bool ConsoleWriter::whenBroken(ConsoleStream stream, const void* owner,
                               std::function<void()> onBroken) {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  if (l.broken) return false;
  l.brokenWaiters.push_back({owner, std::move(onBroken)});
  return true;
}

void ConsoleWriter::cancel(const void* owner) {
  for (auto& lane : lanes_) {
    std::lock_guard lock(lane->mutex);
    auto ownedBy = [&](const Lane::Waiter& w) { return w.owner == owner; };
    std::erase_if(lane->waiters, ownedBy);
    std::erase_if(lane->brokenWaiters, ownedBy);
  }
}

bool ConsoleWriter::broken(ConsoleStream stream) const {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  return l.broken;
}

int ConsoleWriter::fd(ConsoleStream stream) const {
  return stream == ConsoleStream::Err ? options_.stderrFd : options_.stdoutFd;
}

bool ConsoleWriter::dropped(ConsoleStream stream) const {
  Lane& l = lane(stream);
  std::lock_guard lock(l.mutex);
  return l.dropped;
}

bool ConsoleWriter::flush(std::chrono::milliseconds timeout) { return waitWritten(timeout, false); }

bool ConsoleWriter::drain(std::chrono::milliseconds timeout) { return waitWritten(timeout, true); }

bool ConsoleWriter::waitWritten(std::chrono::milliseconds timeout, bool abandon) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool complete = true;
  for (int i = 0; i < 2; ++i) {
    if (i == 1 && lanes_[1] == lanes_[0]) break;
    Lane& l = *lanes_[i];
    std::unique_lock lock(l.mutex);
    if (l.idle.wait_until(lock, deadline, [&] { return l.dropped || l.emptyLocked(); })) continue;
    complete = false;
    if (abandon) l.dropLocked(false);  // the reader is not reading, and drun does not wait any longer
  }
  return complete;
}

}  // namespace drun::agent
