#include "drun/common/owned_thread.hpp"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>

using namespace std::chrono_literals;

TEST_CASE("an owned thread runs with every signal blocked, its creator's mask unchanged", "[common]") {
  sigset_t before;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &before);
  std::promise<bool> blocked;
  drun::OwnedThread thread("test", [&] {
    sigset_t mask;
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    blocked.set_value(sigismember(&mask, SIGINT) == 1 && sigismember(&mask, SIGTERM) == 1 &&
                      sigismember(&mask, SIGCHLD) == 1);
  });
  CHECK(blocked.get_future().get());
  CHECK(thread.join(1s));
  sigset_t after;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &after);
  CHECK(sigismember(&after, SIGINT) == sigismember(&before, SIGINT));
  CHECK(sigismember(&after, SIGTERM) == sigismember(&before, SIGTERM));
}

TEST_CASE("join() waits for a body that ends within the bound", "[common]") {
  std::atomic<bool> ran{false};
  drun::OwnedThread thread("test", [&] {
    std::this_thread::sleep_for(50ms);
    ran = true;
  });
  CHECK(thread.join(5s));
  CHECK(ran);
  CHECK_FALSE(thread.joinable());
  CHECK(thread.join(0ms));  // nothing left to join
}

TEST_CASE("join() leaves a body still blocked past the bound, and returns at the bound", "[common]") {
  auto release = std::make_shared<std::promise<void>>();
  auto released = release->get_future().share();
  drun::OwnedThread thread("test", [released] { released.wait(); });
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(thread.join(100ms));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 100ms);
  CHECK(waited < 2s);
  CHECK_FALSE(thread.joinable());  // left: the owner is free to go
  release->set_value();            // the body shares what it waits on: it ends on its own
}

TEST_CASE("an exception escaping a body ends its thread, not the process", "[common]") {
  drun::OwnedThread thread("test", [] { throw std::runtime_error("from the body"); });
  CHECK(thread.join(5s));
}
