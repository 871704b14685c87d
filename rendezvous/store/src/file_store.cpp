#include "drun/store/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "drun/common/deadline.hpp"

namespace drun::rdzv {

namespace {

// One record: u8 op ('S' set, 'D' delete), u32 key length, u32 value length, key, value.
void putRecord(std::string& log, char op, const std::string& key, const Bytes& value = {}) {
  log.push_back(op);
  for (uint32_t n : {static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size())})
    for (int i = 0; i < 4; ++i) log.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  log += key;
  log += value;
}

uint32_t readU32(const std::string& s, size_t at) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return n;
}

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InvalidArgument("file store: cannot open '" + path_ + "': " + std::strerror(errno));
  ::close(fd);
}

template <class F>
auto FileStore::locked(F&& f) {
  std::lock_guard lock(mutex_);
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw NetworkError("file store: cannot open '" + path_ + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also drops the flock
  } closer{fd};
  if (::flock(fd, LOCK_EX) != 0)
    throw NetworkError("file store: cannot lock '" + path_ + "': " + std::strerror(errno));
  std::string content;
  char chunk[65536];
  for (ssize_t n; (n = ::read(fd, chunk, sizeof(chunk))) != 0;) {
    if (n < 0) throw NetworkError("file store: cannot read '" + path_ + "': " + std::strerror(errno));
    content.append(chunk, static_cast<size_t>(n));
  }
  Map map;
  for (size_t at = 0; at < content.size();) {
    if (content.size() - at < 9) throw ProtocolError("file store: '" + path_ + "' is truncated or not a drun file store");
    char op = content[at];
    uint32_t klen = readU32(content, at + 1), vlen = readU32(content, at + 5);
    if (content.size() - at - 9 < static_cast<size_t>(klen) + vlen || (op != 'S' && op != 'D'))
      throw ProtocolError("file store: '" + path_ + "' is corrupt at byte " + std::to_string(at));
    std::string key = content.substr(at + 9, klen);
    if (op == 'S') map[key] = content.substr(at + 9 + klen, vlen);
    else map.erase(key);
    at += 9 + klen + vlen;
  }
  std::string log;
  auto result = f(map, log);
  if (!log.empty() && ::write(fd, log.data(), log.size()) != static_cast<ssize_t>(log.size()))
    throw NetworkError("file store: cannot write '" + path_ + "': " + std::strerror(errno));
  return result;
}

template <class F>
void FileStore::pollUntil(const std::string& what, milliseconds timeout, F&& pred) {
  Deadline deadline(timeout);
  milliseconds pause(1);
  while (!locked([&](Map& m, std::string&) { return pred(m); })) {
    if (deadline.expired())
      throw TimeoutError("file store: " + what + " timed out after " + std::to_string(timeout.count()) +
                         "ms in " + path_);
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min(pause * 2, milliseconds(20));
  }
}

void FileStore::set(const std::string& key, const Bytes& value) {
  locked([&](Map&, std::string& log) { putRecord(log, 'S', key, value); return 0; });
}

Bytes FileStore::get(const std::string& key, milliseconds timeout) {
  return multiGet({key}, timeout).front();
}

std::optional<Bytes> FileStore::tryGet(const std::string& key) {
  return locked([&](Map& m, std::string&) -> std::optional<Bytes> {
    auto it = m.find(key);
    if (it == m.end()) return std::nullopt;
    return it->second;
  });
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return locked([&](Map& m, std::string& log) {
    int64_t value = delta;
    if (auto it = m.find(key); it != m.end()) {
      try {
        value += std::stoll(it->second);
      } catch (const std::exception&) {
        throw InvalidArgument("file store: add on [" + key + "], which holds no integer");
      }
    }
    putRecord(log, 'S', key, std::to_string(value));
    return value;
  });
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  return locked([&](Map& m, std::string& log) {
    auto it = m.find(key);
    if ((it == m.end() && expected.empty()) || (it != m.end() && it->second == expected)) {
      putRecord(log, 'S', key, desired);
      return desired;
    }
    return it == m.end() ? expected : it->second;
  });
}

void FileStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  pollUntil("wait on [" + joinKeys(keys) + "]", timeout, [&](Map& m) {
    for (const auto& k : keys)
      if (!m.count(k)) return false;
    return true;
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return locked([&](Map& m, std::string&) {
    for (const auto& k : keys)
      if (!m.count(k)) return false;
    return true;
  });
}

bool FileStore::deleteKey(const std::string& key) {
  return locked([&](Map& m, std::string& log) {
    if (!m.count(key)) return false;
    putRecord(log, 'D', key);
    return true;
  });
}

int64_t FileStore::numKeys() {
  return locked([](Map& m, std::string&) { return static_cast<int64_t>(m.size()); });
}

std::vector<Bytes> FileStore::multiGet(const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<Bytes> values;
  pollUntil("get of [" + joinKeys(keys) + "]", timeout, [&](Map& m) {
    values.clear();
    for (const auto& k : keys) {
      auto it = m.find(k);
      if (it == m.end()) return false;
      values.push_back(it->second);
    }
    return true;
  });
  return values;
}

void FileStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("file store: multiSet of " + std::to_string(keys.size()) + " keys and " +
                          std::to_string(values.size()) + " values");
  locked([&](Map&, std::string& log) {
    for (size_t i = 0; i < keys.size(); ++i) putRecord(log, 'S', keys[i], values[i]);
    return 0;
  });
}

void FileStore::append(const std::string& key, const Bytes& value) {
  locked([&](Map& m, std::string& log) {
    putRecord(log, 'S', key, m[key] + value);
    return 0;
  });
}

}  // namespace drun::rdzv
