#include "recovery.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/spdlog.h>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::comm::detail {
namespace {

const std::string kGenerationKey = "recovery/generation";
// A watch is renewed this often (every blocking call has a deadline); stop() interrupts it.
constexpr milliseconds kWatchSlice{10000};
// After the watcher's connection is lost: how long a reconnect tries, and the pause between.
constexpr milliseconds kReconnect{2000};
// Lost ranks are named from at most this many generations back (a message, not a history).
constexpr uint64_t kGenerationsNamed = 8;

// Generation g's transport keys: drun_comm/g<g>/ (docs/recovery.md, keys).
std::string generationPrefix(uint64_t g) { return "drun_comm/g" + std::to_string(g) + "/"; }

std::string recoveryKey(uint64_t g, const std::string& what) {
  return "recovery/" + std::to_string(g) + "/" + what;
}

std::string hostAndPid() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + " pid " + std::to_string(getpid());
}

}  // namespace

WorldRecord parseWorldRecord(const std::string& value) {
  auto bad = [&] {
    return ProtocolError("the workers' store's recovery world record holds '" +
                         text::printable(value, {.maxBytes = 200}) + "', not what drun writes");
  };
  const size_t tab = value.find('\t');
  if (tab == std::string::npos || tab == 0) throw bad();
  WorldRecord record;
  // A grow's: "\t<ranks added>\t<nodes added>" after the node ranks, each at least 1.
  const size_t second = value.find('\t', tab + 1);
  if (second != std::string::npos) {
    const size_t third = value.find('\t', second + 1);
    if (third == std::string::npos || value.find('\t', third + 1) != std::string::npos) throw bad();
    auto count = [&](size_t from, size_t to) {
      int n = 0;
      auto [end, ec] = std::from_chars(value.data() + from, value.data() + to, n);
      if (from == to || ec != std::errc() || end != value.data() + to || n < 1) throw bad();
      return n;
    };
    record.added = count(second + 1, third);
    count(third + 1, value.size());
  }
  std::vector<int>& ranks = record.kept;
  size_t start = 0;
  while (start < tab) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos || comma > tab) comma = tab;
    int r = -1;
    auto [end, ec] = std::from_chars(value.data() + start, value.data() + comma, r);
    if (ec != std::errc() || end != value.data() + comma || r < 0 ||
        std::find(ranks.begin(), ranks.end(), r) != ranks.end())
      throw bad();
    ranks.push_back(r);
    start = comma + 1;
  }
  return record;
}

bool Recovery::growsOnly(rdzv::LivenessStore& store, uint64_t from, uint64_t to) {
  if (to <= from || to - from > rdzv::StoreBatch::kMaxOps / 2) return false;
  rdzv::StoreBatch batch;
  for (uint64_t g = from + 1; g <= to; ++g) {
    batch.tryGet(recoveryKey(g, "world"));
    batch.tryGet(recoveryKey(g, "lost_ranks"));
  }
  store.runBatch(batch);
  for (size_t i = 0; i < batch.size(); i += 2) {
    if (!batch.value(i) || batch.value(i + 1)) return false;  // no world record, or ranks lost
    try {
      if (parseWorldRecord(*batch.value(i)).added == 0) return false;
    } catch (const ProtocolError&) {
      return false;
    }
  }
  return true;
}

bool Recovery::growsOnly(uint64_t from, uint64_t to) {
  try {
    return growsOnly(*store_, from, to);
  } catch (const std::exception& e) {
    spdlog::debug("drun_comm: the world records of generations {}..{} could not be read: {}", from + 1, to, e.what());
    return false;
  }
}

uint64_t parseGeneration(const std::string& text) {
  uint64_t g = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), g);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw ProtocolError("the workers' store's " + kGenerationKey + " holds '" +
                        text::printable(text, {.maxBytes = 64}) + "', not a generation number");
  return g;
}

// The watcher's state, shared with its thread.
struct Recovery::Watch {
  Connect connect;
  int size = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::shared_ptr<rdzv::LivenessStore> conn;     // the watcher's connection (null: to make)
  uint64_t latest = 0;                           // the newest generation seen
  uint64_t followed = 0;                         // the communicator's generation
  Listener listener;
  std::mutex calling;                            // held while the listener runs
  std::shared_ptr<rdzv::LivenessStore> forming;  // the forming connection, if any
  uint64_t formingGeneration = 0;
};

Recovery::Recovery(std::shared_ptr<rdzv::LivenessStore> store, Connect connect, int rank, int size,
                   milliseconds timeout)
    : store_(std::move(store)), connect_(std::move(connect)), rank_(rank), size_(size), timeout_(timeout),
      watch_(std::make_shared<Watch>()) {
  watch_->connect = connect_;
  watch_->size = size;
}

Recovery::~Recovery() { stop(); }

uint64_t Recovery::newest() {
  auto v = store_->tryGet(kGenerationKey);
  return v ? parseGeneration(*v) : 0;
}

std::pair<uint64_t, std::string> Recovery::newerThan(uint64_t from) {
  const uint64_t g = newest();
  if (g <= from) return {0, {}};
  return {g, describe(*store_, size_, from, g)};
}

std::pair<uint64_t, std::string> Recovery::waitNewerThan(uint64_t from, milliseconds timeout) {
  const Deadline deadline(timeout);
  auto known = store_->tryGet(kGenerationKey);
  while ((known ? parseGeneration(*known) : 0) <= from) {
    if (deadline.expired()) return {0, {}};
    try {
      known = store_->watch(kGenerationKey, known, deadline.remaining());
    } catch (const TimeoutError&) {
      return {0, {}};
    }
  }
  const uint64_t g = parseGeneration(*known);
  return {g, describe(*store_, size_, from, g)};
}

std::shared_ptr<rdzv::LivenessStore> Recovery::generationStore(uint64_t g) const {
  return std::make_shared<rdzv::PrefixStore>(generationPrefix(g), store_);
}

std::shared_ptr<rdzv::LivenessStore> Recovery::formingStore(uint64_t g, milliseconds connectTimeout) {
  auto conn = connect_(connectTimeout);
  std::lock_guard lock(watch_->mutex);
  watch_->forming = conn;
  watch_->formingGeneration = g;
  if (watch_->latest > g) conn->interrupt();  // superseded already
  return std::make_shared<rdzv::PrefixStore>(generationPrefix(g), conn);
}

void Recovery::endForming() {
  std::shared_ptr<rdzv::LivenessStore> conn;
  {
    std::lock_guard lock(watch_->mutex);
    conn = std::move(watch_->forming);
  }
  // Closed here, outside the lock (the last reference, unless a forming call still holds it).
}

Recovery::Place Recovery::placeIn(uint64_t base, uint64_t g, Place place) {
  for (uint64_t next = base + 1; next <= g; ++next) {
    auto value = store_->tryGet(recoveryKey(next, "world"));
    if (!value) continue;
    const WorldRecord world = parseWorldRecord(*value);
    const std::vector<int>& kept = world.kept;
    auto at = std::find(kept.begin(), kept.end(), place.rank);
    if (at == kept.end())
      throw CommError("generation " + std::to_string(next) + " shrank the world to " + std::to_string(kept.size()) +
                      " ranks without rank " + std::to_string(place.rank));
    place = {static_cast<int>(at - kept.begin()), static_cast<int>(kept.size()) + world.added};
  }
  return place;
}

void Recovery::resize(Place place) {
  std::lock_guard lock(watch_->mutex);
  rank_ = place.rank;
  size_ = place.size;
  watch_->size = place.size;
}

void Recovery::joined(uint64_t g) {
  if (g > 0) store_->set(recoveryKey(g, "joined/" + std::to_string(rank_)), hostAndPid());
}

void Recovery::formed(uint64_t g) {
  if (g == 0) return;
  if (store_->add(recoveryKey(g, "formed"), 1) == size_)
    store_->compareSet(recoveryKey(g, "outcome"), "", "formed");
}

void Recovery::start() {
  if (thread_.joinable()) return;
  auto first = connect_(timeout_);  // the first connection on the caller's thread: errors go to init
  {
    std::lock_guard lock(watch_->mutex);
    watch_->conn = std::move(first);
  }
  thread_ = OwnedThread("drun_comm recovery watcher", [w = watch_] { watchLoop(w); });
}

void Recovery::follow(uint64_t g, Listener listener) {
  uint64_t latest;
  {
    std::lock_guard lock(watch_->mutex);
    watch_->followed = g;
    watch_->listener = listener;
    latest = watch_->latest;
  }
  // A generation that began while this one formed (the watcher saw it before it was followed).
  if (latest > g && listener) listener(latest, describe(*store_, size_, g, latest), growsOnly(g, latest));
}

void Recovery::stop() {
  {
    std::lock_guard lock(watch_->mutex);
    watch_->stopping = true;
    watch_->listener = nullptr;
    if (watch_->conn) watch_->conn->interrupt();
    watch_->cv.notify_all();
  }
  { std::lock_guard calling(watch_->calling); }  // a listener call in progress has returned
  thread_.join(OwnedThread::kDefaultJoinBound);
}

std::string Recovery::describeLostRank(int rank, const std::string& record) {
  std::string who = "rank " + std::to_string(rank);
  auto j = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return who + " (its record is not readable)";
  std::vector<std::string> parts;
  auto text = [&](const char* key) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end()) return std::nullopt;
    if (it->is_string()) return text::printable(it->get<std::string>(), {.maxBytes = 128});
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    return std::nullopt;
  };
  std::string place;
  if (auto node = text("node")) place = *node;
  if (auto pid = text("pid")) place += (place.empty() ? "pid " : " pid ") + *pid;
  if (!place.empty()) parts.push_back(place);
  if (auto sig = text("signal"); sig && *sig != "0") parts.push_back("killed by signal " + *sig);
  else if (auto code = text("exit_code")) parts.push_back("exit code " + *code);
  if (parts.empty()) return who;
  std::string out = who + " (";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out + ")";
}

// "generation 3 began: rank 2 (node1 pid 77, killed by signal 9) was lost", naming the ranks
// lost in the generations after `from` up to `to` (one pipelined batch per kMaxOps keys).
std::string Recovery::describe(rdzv::LivenessStore& store, int size, uint64_t from, uint64_t to) {
  std::vector<std::string> lost;
  try {
    std::vector<std::pair<int, std::string>> keys;
    for (uint64_t g = std::max(from, to > kGenerationsNamed ? to - kGenerationsNamed : 0) + 1; g <= to; ++g)
      for (int r = 0; r < size; ++r) keys.emplace_back(r, recoveryKey(g, "lost/" + std::to_string(r)));
    for (size_t at = 0; at < keys.size(); at += rdzv::StoreBatch::kMaxOps) {
      rdzv::StoreBatch batch;
      const size_t end = std::min(keys.size(), at + rdzv::StoreBatch::kMaxOps);
      for (size_t i = at; i < end; ++i) batch.tryGet(keys[i].second);
      store.runBatch(batch);
      for (size_t i = at; i < end; ++i)
        if (auto& v = batch.value(i - at)) lost.push_back(describeLostRank(keys[i].first, *v));
    }
  } catch (const std::exception& e) {
    spdlog::debug("drun_comm: the lost ranks of generation {} could not be read: {}", to, e.what());
  }
  std::string text = "generation " + std::to_string(to) + " began";
  if (lost.empty()) return text + " (no lost rank recorded)";
  text += ": ";
  for (size_t i = 0; i < lost.size(); ++i) text += (i ? ", " : "") + lost[i];
  return text + (lost.size() == 1 ? " was lost" : " were lost");
}

void Recovery::watchLoop(const std::shared_ptr<Watch>& w) {
  std::optional<rdzv::Bytes> known;
  bool haveKnown = false;
  // A value of the key: past the latest, it interrupts an older forming and goes to the listener.
  auto seen = [&](rdzv::LivenessStore& conn, const std::optional<rdzv::Bytes>& value) {
    if (!value) return;
    uint64_t g;
    try {
      g = parseGeneration(*value);
    } catch (const Error& e) {
      spdlog::debug("drun_comm: recovery watcher: {}", e.what());
      return;
    }
    uint64_t from;
    int size;
    {
      std::lock_guard lock(w->mutex);
      size = w->size;
      if (g <= w->latest) return;
      w->latest = g;
      if (w->forming && w->formingGeneration < g) w->forming->interrupt();
      if (g <= w->followed || !w->listener) return;
      from = w->followed;
    }
    const std::string why = describe(conn, size, from, g);
    bool grow = false;
    try {
      grow = growsOnly(conn, from, g);
    } catch (const std::exception& e) {
      spdlog::debug("drun_comm: recovery watcher: the world records could not be read: {}", e.what());
    }
    std::lock_guard calling(w->calling);
    Listener listener;
    {
      std::lock_guard lock(w->mutex);
      if (w->stopping) return;
      listener = w->listener;
    }
    if (listener) listener(g, why, grow);
  };
  for (;;) {
    std::shared_ptr<rdzv::LivenessStore> conn;
    {
      std::lock_guard lock(w->mutex);
      if (w->stopping) return;
      conn = w->conn;
    }
    try {
      if (!conn) {
        conn = w->connect(kReconnect);
        std::lock_guard lock(w->mutex);
        if (w->stopping) return;
        w->conn = conn;
      }
      if (!haveKnown) {
        known = conn->tryGet(kGenerationKey);
        haveKnown = true;
        seen(*conn, known);
      }
      known = conn->watch(kGenerationKey, known, kWatchSlice);
      seen(*conn, known);
    } catch (const TimeoutError&) {
      // the watch's deadline: renew it
    } catch (const std::exception& e) {
      std::unique_lock lock(w->mutex);
      if (w->stopping) return;
      spdlog::debug("drun_comm: recovery watcher: the workers' store connection failed ({}); reconnecting",
                    e.what());
      w->conn.reset();
      haveKnown = false;
      w->cv.wait_for(lock, kReconnect, [&] { return w->stopping; });
    }
  }
}

}  // namespace drun::comm::detail
