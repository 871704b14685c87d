// TcpStore::Connection: requests, pipelined batches, reading and writing frames, heartbeats.
#include "tcp_store_connection.hpp"

#include <algorithm>

namespace drun::rdzv {

void TcpStore::Connection::stopHeartbeats() {
  {
    std::lock_guard lock(heartbeatMutex_);
    stopHeartbeat_ = true;
  }
  heartbeatCv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

wire::Response TcpStore::Connection::call(wire::Request& q, milliseconds timeout) {
  std::lock_guard callLock(callMutex_);
  if (broken_) throw NetworkError(brokenText());
  q.id = ++lastId_;
  bool blocking = wire::isBlocking(q.op);
  timeout = clampTimeout(timeout);
  if (blocking) q.timeoutMs = static_cast<uint32_t>(timeout.count());
  std::string frame;
  wire::encodeRequest(q, frame);  // InvalidArgument before anything is sent
  const milliseconds grace = options_.replyGrace > 0ms ? options_.replyGrace : replyGrace(timeout);
  milliseconds budget = blocking ? timeout + grace : clampTimeout(options_.timeout);
  Deadline deadline(budget);
  auto started = Clock::now();
  {
    std::lock_guard writeLock(writeMutex_);
    writeAll(frame, deadline, q);
  }
  wire::Response p = readResponse(q, deadline, budget);
  if (std::exception_ptr failure = failureOf(p, q, timeout, started))
    std::rethrow_exception(failure);
  return p;
}

void TcpStore::Connection::callPipelined(std::vector<wire::Request>& requests, const OnAnswer& onAnswer) {
  std::lock_guard callLock(callMutex_);
  if (broken_) throw NetworkError(brokenText());
  std::vector<std::exception_ptr> unsent(requests.size());
  std::vector<bool> sent(requests.size(), false);
  std::string frames;
  for (size_t i = 0; i < requests.size(); ++i) {
    wire::Request& q = requests[i];
    if (!wire::mayBeBatched(q.op))
      throw InvalidArgument(std::string("a pipelined batch cannot carry ") +
                            std::string(wire::toString(q.op)));
    const size_t before = frames.size();
    try {
      q.id = lastId_ + 1;
      wire::encodeRequest(q, frames);
      ++lastId_;
      sent[i] = true;
    } catch (const InvalidArgument&) {
      frames.resize(before);
      unsent[i] = std::current_exception();
    }
  }
  // Two or more frames go as one Batch frame, which the server applies whole or not at all (a
  // connection cut between two frames applied the first: a join's will without its count).
  // One over the frame limit goes as it is, frame by frame.
  if (std::count(sent.begin(), sent.end(), true) > 1) {
    try {
      std::string batch;
      wire::encodeBatch(frames, lastId_ + 1, batch);
      ++lastId_;
      frames = std::move(batch);
    } catch (const InvalidArgument&) {  // over the frame limit: the frames as they are
    }
  }
  const milliseconds budget = clampTimeout(options_.timeout);
  Deadline deadline(budget);
  const auto started = Clock::now();
  if (!frames.empty()) {
    std::lock_guard writeLock(writeMutex_);
    writeAll(frames, deadline, requests.front());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    wire::Response p;
    if (!sent[i]) {
      onAnswer(i, p, unsent[i]);
      continue;
    }
    p = readResponse(requests[i], deadline, budget);
    onAnswer(i, p, failureOf(p, requests[i], 0ms, started));
  }
}

void TcpStore::Connection::malformed(const wire::Request& q, const std::string& why) {
  markBroken("store at " + endpoint_ + " answered " + std::string(wire::toString(q.op)) + " " +
             keyList(q.keys) + " with " + why);
  throw ProtocolError(brokenText());
}

std::exception_ptr TcpStore::Connection::failureOf(const wire::Response& p, const wire::Request& q,
                             milliseconds timeout, Clock::time_point started) {
  switch (p.status) {
    case wire::Status::Ok:
      return nullptr;
    case wire::Status::Timeout:
      return std::make_exception_ptr(
          TimeoutError(std::string(wire::toString(q.op)) + " timed out after " +
                       std::to_string(timeout.count()) + "ms on " +
                       keyList(p.keys.empty() ? q.keys : p.keys) + " at " + endpoint_));
    case wire::Status::InvalidArgument:
      return std::make_exception_ptr(
          InvalidArgument(std::string(wire::toString(q.op)) + " " + keyList(q.keys) + " at " +
                          endpoint_ + ": " + serverText(p.message)));
    default: {
      auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
      return std::make_exception_ptr(
          Error(std::string(wire::toString(q.op)) + " " + keyList(q.keys) + " at " + endpoint_ +
                " failed after " + std::to_string(waited.count()) +
                "ms: " + serverText(p.message)));
    }
  }
}

void TcpStore::Connection::receive() {
  char* at = in_.prepare(16 * 1024);
  ssize_t n = ::recv(fd_, at, 16 * 1024, 0);
  if (n > 0) {
    in_.commit(static_cast<size_t>(n));
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  std::string why = n == 0 ? "closed by the server" : errnoText(errno);
  markBroken("connection to store at " + endpoint_ + " lost: " + why);
  throw NetworkError(brokenText());
}

void TcpStore::Connection::writeAll(std::string_view data, const Deadline& deadline, const wire::Request& q) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (pollUntil(fd_, POLLOUT, deadline)) continue;
      // Part of a frame is out: the stream can no longer be framed.
      if (done > 0) markBroken("write to store at " + endpoint_ + " stalled mid-frame");
      throw TimeoutError(std::string(wire::toString(q.op)) + " " + keyList(q.keys) +
                         ": could not send to store at " + endpoint_ + " in time");
    }
    markBroken("connection to store at " + endpoint_ + " lost: " + errnoText(errno));
    throw NetworkError(brokenText());
  }
}

wire::Response TcpStore::Connection::readResponse(const wire::Request& q, const Deadline& deadline,
                            milliseconds budget) {
  for (;;) {
    wire::Response p;
    auto r = wire::decodeResponse(in_.data(), p);
    if (r.status == wire::DecodeStatus::Bad) {
      markBroken("store at " + endpoint_ + " sent a malformed reply: " + r.error);
      throw ProtocolError(brokenText());
    }
    if (r.status == wire::DecodeStatus::Ok) {
      in_.consume(r.consumed);
      if (p.status == wire::Status::ProtocolError) {
        markBroken("store at " + endpoint_ + " rejected our request: " + serverText(p.message));
        throw ProtocolError(brokenText());
      }
      if (p.id > q.id) {
        // Requests are answered in order: an answer ahead of this one is to a request this
        // client has not sent (yet): the stream is out of step.
        markBroken("store at " + endpoint_ + " answered request " + std::to_string(p.id) +
                   " while request " + std::to_string(q.id) + " was the next one due");
        throw ProtocolError(brokenText());
      }
      if (p.id == q.id) {
        if (p.op != q.op) {
          markBroken("store at " + endpoint_ + " answered request " + std::to_string(q.id) +
                     " with the wrong op");
          throw ProtocolError(brokenText());
        }
        return p;
      }
      continue;  // the late answer to a call that gave up waiting earlier
    }
    if (broken_) throw NetworkError(brokenText());
    if (!pollUntil(fd_, POLLIN, deadline)) {
      // The server answers every call by its deadline (a blocking one with Timeout), so no
      // reply within the budget means the link or the server is gone (a cut cable sends no
      // reset): the connection is lost, not merely slow.
      markBroken(std::string(wire::toString(q.op)) + " on " + keyList(q.keys) +
                 ": no reply from store at " + endpoint_ + " after " +
                 std::to_string(budget.count()) + "ms: connection presumed lost");
      throw NetworkError(brokenText());
    }
    receive();
  }
}

void TcpStore::Connection::markBroken(const std::string& why) {
  std::lock_guard lock(brokenMutex_);
  if (broken_) return;
  brokenReason_ = why;
  broken_ = true;
  ::shutdown(fd_, SHUT_RDWR);  // wakes a call blocked in poll(); the fd is closed later
  spdlog::debug("store client: {}", why);
}

std::string TcpStore::Connection::brokenText() {
  std::lock_guard lock(brokenMutex_);
  return brokenReason_;
}

void TcpStore::Connection::heartbeatLoop() {
  std::string frame;
  wire::Request beat;
  beat.op = wire::Op::Heartbeat;
  wire::encodeRequest(beat, frame);  // id 0: heartbeats are never answered
  std::unique_lock lock(heartbeatMutex_);
  while (!heartbeatCv_.wait_for(lock, options_.heartbeatInterval, [&] { return stopHeartbeat_; })) {
    if (broken_) continue;
    lock.unlock();
    try {
      std::lock_guard writeLock(writeMutex_);
      writeAll(frame, Deadline(options_.heartbeatInterval), beat);
    } catch (const Error& e) {
      spdlog::debug("store client: heartbeat to {} failed: {}", endpoint_, e.what());
    }
    lock.lock();
  }
}

}  // namespace drun::rdzv
