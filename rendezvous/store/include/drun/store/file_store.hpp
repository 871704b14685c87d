// FileStore: the Store contract over one file on a file system every rank shares (file:// init,
// torch's FileStore). Each call takes an exclusive flock, replays the file's log of sets and
// deletes, appends its own records and unlocks; blocking calls poll (1 ms growing to 20 ms) until
// their deadline. A plain Store, not a LivenessStore: a process cannot act on a file after it
// died (no wills), so failures are reported without the lost peer's name. The file is not removed: use a fresh path per job.
// Threading: thread-safe (one mutex per object, flock between processes).
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "drun/store/store.hpp"

namespace drun::rdzv {

using std::chrono::milliseconds;

class FileStore final : public Store {
 public:
  // Creates the file when missing; throws InvalidArgument naming the path when it cannot.
  explicit FileStore(std::string path);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, milliseconds timeout) override;
  std::optional<Bytes> tryGet(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected,
                         const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, milliseconds timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;

 private:
  using Map = std::map<std::string, Bytes>;
  // Runs f(map, log) under the file lock; records f appends to `log` are written to the file.
  template <class F> auto locked(F&& f);
  // Polls pred(map) under the lock until it holds or the deadline; throws TimeoutError.
  template <class F> void pollUntil(const std::string& what, milliseconds timeout, F&& pred);

  std::string path_;
  std::mutex mutex_;
};

}  // namespace drun::rdzv
